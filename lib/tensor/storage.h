// Storage: one allocation of bytes on a device, reported to the memory
// accountant under a category.
//
// A Storage can release its bytes and re-acquire them later at the same size
// (ZeRO-3 frees gathered parameters between uses); tensors viewing it stay
// valid objects but must not be read while it is released. Contents after
// acquire() are unspecified. CPU memory comes from a caching allocator, so a
// training step that allocates the same sizes every step reaches a steady
// state with no calls to the system allocator.
//
// A meta Storage (Device::meta()) holds no bytes but is accounted exactly as a
// CPU one: the constructor, release(), acquire() and the destructor add and
// subtract `bytes` under its category at the same moments; data() throws.
#pragma once

#include <cstddef>

#include "lib/tensor/device.h"
#include "lib/tensor/memory.h"

namespace fd {

class Storage {
 public:
  // Allocates `bytes` (contents unspecified) on `device`. GPU memory comes
  // from kernels/' caching allocator; out of memory is an fd::Error. A GPU in
  // a build without CUDA is an fd::Error too.
  Storage(size_t bytes, MemCategory category, Device device = Device::cpu());
  // A Storage of `bytes` that starts released: nothing is allocated or
  // accounted until acquire() (ZeRO-3 parameter buffers that are only ever
  // gathered into).
  struct Released {};
  Storage(size_t bytes, MemCategory category, Device device, Released);
  // Page-locked host memory (a CPU Storage the GPU copies to and from
  // asynchronously; CUDA builds with a device initialised, an fd::Error
  // otherwise): ZeRO-Offload's transfer buffers (lib/tensor/host_link.h).
  struct Pinned {};
  Storage(size_t bytes, MemCategory category, Pinned);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const;  // requires resident() and a device with bytes (not meta)
  size_t bytes() const { return bytes_; }
  bool resident() const { return resident_ || bytes_ == 0; }
  MemCategory category() const { return category_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

  // Frees the bytes (no-op if already released).
  void release();
  // Re-allocates the bytes after release() (no-op if resident).
  void acquire();
  // Exchanges the bytes (allocation, size, residency) with `other`, which must
  // have the same category and device, neither pinned. Each object keeps its
  // identity, so the tensors viewing this one view `other`'s bytes from now
  // on: how a buffer is resized under its views (FlatParamGroup::pad_for).
  // The accountant is unchanged (one category, the same bytes held).
  void swap_bytes(Storage& other);

 private:
  void* data_ = nullptr;  // null on meta
  bool resident_ = false;
  bool pinned_ = false;
  size_t bytes_;
  MemCategory category_;
  Device device_;
};

// The CPU caching allocator behind Storage: 64-byte aligned blocks, freed
// blocks kept for reuse by size. Exposed for tests and benchmarks.
namespace cpu_allocator {
void* allocate(size_t bytes);
void deallocate(void* p, size_t bytes);
// Number of times the system allocator was called (monotonic).
size_t system_allocations();
// Returns all cached blocks to the system.
void empty_cache();
// Bytes taken from the system and not given back (live blocks and cached ones), and their
// highest value over the process's life.
size_t reserved_bytes();
size_t peak_reserved_bytes();

// The same bookkeeping without memory, for tensors on the counting device (Device::meta(),
// `fdtrain estimate`): what reserved_bytes() would be had they been CPU tensors, through the
// same sequence of allocations, frees and empty_cache() calls. reset() starts a simulated
// process (nothing reserved, no peak).
namespace simulated {
void allocate(size_t bytes);
void deallocate(size_t bytes);
void empty_cache();
void reset();
size_t reserved_bytes();
size_t peak_reserved_bytes();
}  // namespace simulated
}  // namespace cpu_allocator

}  // namespace fd
