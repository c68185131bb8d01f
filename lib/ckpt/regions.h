// Writing a shard's bulk bytes at the disk's speed (issue 41): the state datasets of a shard are
// made by HDF5 with their space allocated and left unwritten (h5::create_deferred_1d); once the
// file is closed, write_regions puts their bytes in place with large aligned writes past the
// page cache (O_DIRECT through AsyncFile, several in flight), and returns the file's digest
// without reading the bulk back: the regions' CRC-32C (computed from memory) combined with a
// read of everything else (HDF5's metadata and small datasets: kilobytes). The digest trusts the
// kernel to have put the bytes it accepted where asked, as one read back through the page cache
// did before (it never saw the disk either); a reader checks every chunk it reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/ckpt/h5.h"
#include "lib/ckpt/manifest.h"

namespace fd::ckpt {

// Writes every region's bytes at its offset into the file at `path` (HDF5 closed it; it
// extends over the regions, which must not overlap), each region's 4 KiB-aligned body with
// O_DIRECT where the file system allows it and its tail (under 4 KiB) buffered; syncs the file
// to its device; returns its size and CRC-32C. Throws fd::Error (runtime) naming the shard and
// the cause (a full disk: "no space left on the device holding ...").
FileDigest write_regions(const std::string& path, std::vector<h5::Region> regions);

// Throws fd::Error (runtime): the shard at `path` could not be written because its disk is full
// (`what` failed), with the space left and what to do.
[[noreturn]] void shard_disk_full(const std::string& path, const std::string& what);

// The buffers write_regions holds while it writes regions of at most `largest` bytes (the
// estimate's save buffers): a few aligned bounce buffers, each at most 2 MiB.
int64_t region_buffer_bytes(int64_t largest);

}  // namespace fd::ckpt
