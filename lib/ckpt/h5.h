// Thin RAII layer over the HDF5 C API, private to lib/ckpt.
//
// Every hid_t lives in an H5Id that closes it with the right H5*close call.
// HDF5's own error printing is switched off (quiet()); a failed call is turned
// into one fd::Error by the caller, with the file name, what was being done
// and the innermost messages of HDF5's error stack (last_error()).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fd::ckpt::h5 {

// Owns one HDF5 identifier of any kind (file, group, dataset, attribute,
// dataspace, datatype, property list); closes it with H5Oclose/H5Sclose/...
// as its type requires.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Closes now; returns false if HDF5 reported an error (e.g. a failed flush).
  bool close();
  void reset() { (void)close(); }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Turns off HDF5's automatic printing of error stacks and its library
// shutdown at exit (idempotent; call it before any other HDF5 function).
void quiet();
// The HDF5 error stack of the calling thread, innermost message first,
// joined by "; " (empty if none), and clears it.
std::string last_error();
// Saves the current error stack for last_error() and returns false. Call it
// right after a failed HDF5 call, before any H5Id is closed: every API call,
// H5*close included, clears the stack.
bool fail();
// True if the current error stack mentions a failed checksum (Fletcher32 or
// metadata checksum).
bool error_is_checksum(const std::string& stack);

// Attribute helpers on any object (file, group, dataset). Writers return
// false on an HDF5 failure; readers return nullopt when the attribute is
// absent or of an incompatible type.
bool has_attr(hid_t obj, const char* name);
bool write_attr_i64(hid_t obj, const char* name, int64_t value);
bool write_attr_f64(hid_t obj, const char* name, double value);
bool write_attr_str(hid_t obj, const char* name, const std::string& value);
std::optional<int64_t> read_attr_i64(hid_t obj, const char* name);
std::optional<double> read_attr_f64(hid_t obj, const char* name);
std::optional<std::string> read_attr_str(hid_t obj, const char* name);

// The elements per chunk of a 1-D dataset of `n` elements (as create_dataset_1d and
// write_dataset make it): at most 1 Mi, in equal chunks; 0 when n is 0.
int64_t chunk_elements_1d(int64_t n);

// A chunked dataset with the Fletcher32 checksum filter of `dims`
// (row-major) holding `data` of HDF5 memory type `mem_type`, stored as
// `file_type`. Empty datasets are stored contiguous (nothing to checksum).
bool write_dataset(hid_t parent, const char* name, hid_t file_type, hid_t mem_type,
                   const std::vector<hsize_t>& dims, const void* data);
// The same layout for a 1-D dataset of `n` elements, created empty, to be
// filled piece by piece with write_1d; `chunk` receives its chunk length (0
// when n is 0). Writing whole chunks in order keeps HDF5 from reading any
// back. An invalid id on failure.
H5Id create_dataset_1d(hid_t parent, const char* name, hid_t file_type, hsize_t n, hsize_t* chunk);

// Bulk state (format version 2): a 1-D chunked dataset without HDF5's filter, checksummed by us
// instead: dataset `name` of `n` elements of `elem_bytes` each (little-endian file types, whose
// bytes in memory are the file's), and beside it `name`_crc32c, one CRC-32C (Castagnoli,
// hardware) per chunk over the chunk's bytes, with the chunk length as its attribute `chunk`.
// A checksum per chunk keeps a partial read (a resharded resume) verifiable; computing it from
// memory costs ~0.1 s per GiB where Fletcher32 in the filter pipeline costs seconds.
//   write_checksummed_1d: the whole dataset from `data` at once.
//   ChecksummedWriter: created empty, filled a whole chunk at a time in order (the last one
//   shorter), then finish() writes the checksums.
bool write_checksummed_1d(hid_t parent, const char* name, hid_t file_type, hid_t mem_type,
                          int64_t n, int elem_bytes, const void* data);
class ChecksummedWriter {
 public:
  ChecksummedWriter(hid_t parent, const char* name, hid_t file_type, hid_t mem_type, int64_t n,
                    int elem_bytes);
  bool valid() const { return ds_.valid(); }
  int64_t chunk() const { return chunk_; }
  // The next `count` elements (a whole chunk, or the rest).
  bool write(int64_t count, const void* data);
  bool finish();

 private:
  hid_t parent_, mem_type_;
  std::string name_;
  int elem_bytes_;
  int64_t n_ = 0, chunk_ = 0, written_ = 0;
  H5Id ds_;
  std::vector<uint32_t> crcs_;
};
// The same dataset with its bytes written after the file is closed (ckpt::write_regions), so
// that they go to the disk in large aligned writes past the page cache: `name` made contiguous,
// its space allocated at once (4 KiB aligned in a file whose alignment asks it: shards) and never
// filled by HDF5; `name`_crc32c written now from `data` (the same logical chunks a reader
// checks), and the bytes still to write returned: `data` must stay unchanged until they are.
// nullopt on an HDF5 failure (last_error()).
struct Region {
  int64_t offset = 0;          // in the file
  const char* data = nullptr;  // `bytes` bytes
  int64_t bytes = 0;
  uint32_t crc32c = 0;  // of those bytes
};
std::optional<Region> create_deferred_1d(hid_t parent, const char* name, hid_t file_type, int64_t n,
                                         int elem_bytes, const void* data);
// Whether `name`_crc32c exists beside dataset `name` in `parent`.
bool has_chunk_checksums(hid_t parent, const std::string& name);
// Reads elements [offset, offset + count) of checksummed dataset `name` (`n` elements of
// `elem_bytes`) into `out` as `mem_type`, reading each chunk it touches whole and checking its
// CRC-32C. Returns 1 on success, 0 on an HDF5 failure (last_error()), -1 on a checksum mismatch
// (or checksums missing or malformed).
int read_checksummed_1d(hid_t parent, const std::string& name, hid_t mem_type, int elem_bytes,
                        int64_t offset, int64_t count, void* out);
// Writes elements [offset, offset + count) of 1-D dataset `ds` from `data` (of `mem_type`).
bool write_1d(hid_t ds, hid_t mem_type, int64_t offset, int64_t count, const void* data);
// A 1-D dataset of variable-length UTF-8 strings.
bool write_string_dataset(hid_t parent, const char* name, const std::vector<std::string>& values);
// Reads a 1-D dataset of strings (fixed or variable length); nullopt on failure
// or when it holds more than 2^24 strings.
std::optional<std::vector<std::string>> read_string_dataset(hid_t parent, const char* name);

// Dimensions of dataset `ds` (empty optional on failure).
std::optional<std::vector<hsize_t>> dataset_dims(hid_t ds);

// Reads elements [offset, offset + count) of 1-D dataset `ds` as `mem_type`
// into `out`. Returns false on failure (see last_error()).
bool read_1d(hid_t ds, hid_t mem_type, int64_t offset, int64_t count, void* out);

}  // namespace fd::ckpt::h5
