#include "lib/ckpt/h5.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>

#include "lib/base/check.h"
#include "lib/base/crc32c.h"

namespace fd::ckpt::h5 {

namespace {

// Elements per chunk of a checksummed dataset: 1 Mi elements (4 MiB of fp32),
// large enough that the per-chunk overhead and Fletcher32 cost vanish, small
// enough that a partial read touches little more than it needs.
constexpr hsize_t kChunkElems = hsize_t(1) << 20;

// The most strings read_string_dataset() reads (a layout's names: a few thousand).
constexpr size_t kMaxStrings = size_t(1) << 24;

H5Id vlen_string_type() {
  H5Id t(H5Tcopy(H5T_C_S1));
  if (!t || H5Tset_size(t.get(), H5T_VARIABLE) < 0 || H5Tset_cset(t.get(), H5T_CSET_UTF8) < 0)
    return H5Id();
  return t;
}

H5Id open_attr(hid_t obj, const char* name) {
  if (!has_attr(obj, name)) return H5Id();
  return H5Id(H5Aopen(obj, name, H5P_DEFAULT));
}

// True if attribute `a` has a scalar (or single-element) dataspace.
bool single_element(hid_t a) {
  H5Id space(H5Aget_space(a));
  return space && H5Sget_simple_extent_npoints(space.get()) == 1;
}

// The error stack captured by fail(): closing the failed call's H5Ids (any
// API call) clears HDF5's own stack before the caller can report it.
thread_local std::string saved_error;

std::string walk_stack() {
  std::vector<std::string> messages;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* out = static_cast<std::vector<std::string>*>(data);
        std::string desc = e->desc ? e->desc : "";
        if (!desc.empty() && std::find(out->begin(), out->end(), desc) == out->end())
          out->push_back(desc);
        return 0;
      },
      &messages);
  H5Eclear2(H5E_DEFAULT);
  std::string s;
  for (size_t i = 0; i < messages.size() && i < 4; ++i) s += (i ? "; " : "") + messages[i];
  return s;
}

}  // namespace

bool fail() {
  saved_error = walk_stack();
  return false;
}

bool H5Id::close() {
  if (id_ < 0) return true;
  hid_t id = std::exchange(id_, H5I_INVALID_HID);
  herr_t rc = -1;
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      rc = H5Fclose(id);
      break;
    case H5I_GROUP:
      rc = H5Gclose(id);
      break;
    case H5I_DATASET:
      rc = H5Dclose(id);
      break;
    case H5I_ATTR:
      rc = H5Aclose(id);
      break;
    case H5I_DATASPACE:
      rc = H5Sclose(id);
      break;
    case H5I_DATATYPE:
      rc = H5Tclose(id);
      break;
    case H5I_GENPROP_LST:
      rc = H5Pclose(id);
      break;
    default:
      rc = H5Idec_ref(id);
      break;
  }
  return rc >= 0;
}

void quiet() {
  static std::once_flag once;
  std::call_once(once, [] {
    // No library shutdown at exit: it closes files still open, and HDF5 1.10
    // crashes closing one whose earlier close failed (a shard write that hit
    // a full disk: the error was reported, then the process died of SIGSEGV
    // in H5F__close_cb). Every file of ours is closed by its H5Id anyway.
    // Must come before any other HDF5 call; harmless (an error) if it does not.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    // HDF5 keeps freed blocks on free lists of its own, without bound by default: a shard
    // written or read would stay resident for the rest of the run. 1 MiB per kind at most.
    H5set_free_list_limits(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20);
  });
}

std::string last_error() {
  std::string s = walk_stack();
  if (s.empty()) s = saved_error;
  saved_error.clear();
  return s;
}

bool error_is_checksum(const std::string& stack) {
  std::string lower = stack;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  return lower.find("checksum") != std::string::npos ||
         lower.find("fletcher") != std::string::npos || lower.find("filter") != std::string::npos;
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

bool write_attr_i64(hid_t obj, const char* name, int64_t value) {
  H5Id space(H5Screate(H5S_SCALAR));
  H5Id a(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  return (a && H5Awrite(a.get(), H5T_NATIVE_INT64, &value) >= 0 && a.close()) || fail();
}

bool write_attr_f64(hid_t obj, const char* name, double value) {
  H5Id space(H5Screate(H5S_SCALAR));
  H5Id a(H5Acreate2(obj, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  return (a && H5Awrite(a.get(), H5T_NATIVE_DOUBLE, &value) >= 0 && a.close()) || fail();
}

bool write_attr_str(hid_t obj, const char* name, const std::string& value) {
  H5Id type = vlen_string_type();
  H5Id space(H5Screate(H5S_SCALAR));
  if (!type || !space) return fail();
  H5Id a(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = value.c_str();
  return (a && H5Awrite(a.get(), type.get(), &p) >= 0 && a.close()) || fail();
}

std::optional<int64_t> read_attr_i64(hid_t obj, const char* name) {
  H5Id a = open_attr(obj, name);
  if (!a || !single_element(a.get())) return std::nullopt;
  H5Id type(H5Aget_type(a.get()));
  if (!type || H5Tget_class(type.get()) != H5T_INTEGER) return std::nullopt;
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return std::nullopt;
  return v;
}

std::optional<double> read_attr_f64(hid_t obj, const char* name) {
  H5Id a = open_attr(obj, name);
  if (!a || !single_element(a.get())) return std::nullopt;
  H5Id type(H5Aget_type(a.get()));
  if (!type) return std::nullopt;
  H5T_class_t c = H5Tget_class(type.get());
  if (c != H5T_FLOAT && c != H5T_INTEGER) return std::nullopt;
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) return std::nullopt;
  return v;
}

std::optional<std::string> read_attr_str(hid_t obj, const char* name) {
  H5Id a = open_attr(obj, name);
  if (!a || !single_element(a.get())) return std::nullopt;
  H5Id type(H5Aget_type(a.get()));
  if (!type || H5Tget_class(type.get()) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem = vlen_string_type();
    char* p = nullptr;
    if (H5Aread(a.get(), mem.get(), &p) < 0) return std::nullopt;
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t size = H5Tget_size(type.get());
  std::string buf(size + 1, '\0');
  if (H5Aread(a.get(), type.get(), buf.data()) < 0) return std::nullopt;
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

namespace {
// Elements [offset, offset + count) of 1-D dataset `ds`, read into or written from `buf`.
bool transfer_1d(hid_t ds, hid_t mem_type, int64_t offset, int64_t count, void* buf, bool write) {
  if (count == 0) return true;
  H5Id fspace(H5Dget_space(ds));
  hsize_t start = hsize_t(offset), n = hsize_t(count);
  H5Id mspace(H5Screate_simple(1, &n, nullptr));
  if (!fspace || !mspace ||
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr) < 0)
    return fail();
  const herr_t rc = write ? H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, buf)
                          : H5Dread(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, buf);
  return rc >= 0 || fail();
}

// Dataset creation properties for `dims`: chunks span whole trailing
// dimensions and as many leading rows as fit, checksummed (Fletcher32).
// `chunk_rows` receives the rows per chunk (0 for an empty dataset).
}  // namespace

int64_t chunk_elements_1d(int64_t n) {
  if (n <= 0) return 0;
  const hsize_t max_rows = std::min<hsize_t>(kChunkElems, hsize_t(n));
  const hsize_t n_chunks = (hsize_t(n) + max_rows - 1) / max_rows;
  return int64_t((hsize_t(n) + n_chunks - 1) / n_chunks);
}

namespace {

H5Id chunked_dcpl(const std::vector<hsize_t>& dims, hsize_t* chunk_rows, bool fletcher = true) {
  hsize_t numel = 1;
  for (hsize_t d : dims) numel *= d;
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  *chunk_rows = 0;
  if (!dcpl || numel == 0) return dcpl;
  std::vector<hsize_t> chunk = dims;
  hsize_t rest = numel / dims[0];
  // At most kChunkElems per chunk, in equal chunks: HDF5 allocates whole
  // chunks, so a ragged last chunk would waste up to a chunk of disk.
  const hsize_t max_rows =
      std::clamp<hsize_t>(kChunkElems / std::max<hsize_t>(rest, 1), 1, dims[0]);
  const hsize_t n_chunks = (dims[0] + max_rows - 1) / max_rows;
  chunk[0] = std::max<hsize_t>(1, (dims[0] + n_chunks - 1) / n_chunks);
  if (H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data()) < 0 ||
      (fletcher && H5Pset_fletcher32(dcpl.get()) < 0))
    return H5Id();
  *chunk_rows = chunk[0];
  return dcpl;
}
}  // namespace

bool write_dataset(hid_t parent, const char* name, hid_t file_type, hid_t mem_type,
                   const std::vector<hsize_t>& dims, const void* data) {
  hsize_t numel = 1;
  for (hsize_t d : dims) numel *= d;
  hsize_t rows = 0;
  H5Id space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  H5Id dcpl = chunked_dcpl(dims, &rows);
  if (!space || !dcpl) return fail();
  H5Id ds(H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!ds) return fail();
  if (numel > 0 && H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    return fail();
  return ds.close() || fail();
}

H5Id create_dataset_1d(hid_t parent, const char* name, hid_t file_type, hsize_t n, hsize_t* chunk) {
  H5Id space(H5Screate_simple(1, &n, nullptr));
  H5Id dcpl = chunked_dcpl({n}, chunk);
  if (!space || !dcpl) return H5Id();
  return H5Id(
      H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
}

bool write_1d(hid_t ds, hid_t mem_type, int64_t offset, int64_t count, const void* data) {
  return transfer_1d(ds, mem_type, offset, count, const_cast<void*>(data), true);
}

namespace {
std::string checksums_name(const std::string& name) { return name + "_crc32c"; }

// `name`_crc32c: the chunks' CRC-32C and the chunk length.
bool write_checksums(hid_t parent, const std::string& name, const std::vector<uint32_t>& crcs,
                     int64_t chunk) {
  const std::string crc_name = checksums_name(name);
  if (!write_dataset(parent, crc_name.c_str(), H5T_STD_U32LE, H5T_NATIVE_UINT32,
                     {hsize_t(crcs.size())}, crcs.data()))
    return false;
  H5Id crc(H5Dopen2(parent, crc_name.c_str(), H5P_DEFAULT));
  return crc && write_attr_i64(crc.get(), "chunk", chunk);
}
}  // namespace

ChecksummedWriter::ChecksummedWriter(hid_t parent, const char* name, hid_t file_type,
                                     hid_t mem_type, int64_t n, int elem_bytes)
    : parent_(parent), mem_type_(mem_type), name_(name), elem_bytes_(elem_bytes), n_(n) {
  hsize_t hn = hsize_t(n), rows = 0;
  H5Id space(H5Screate_simple(1, &hn, nullptr));
  H5Id dcpl = chunked_dcpl({hn}, &rows, /*fletcher=*/false);
  if (!space || !dcpl) return;
  ds_ =
      H5Id(H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  chunk_ = int64_t(rows);
}

bool ChecksummedWriter::write(int64_t count, const void* data) {
  FD_CHECK(count == std::min(chunk_, n_ - written_), "{}: a piece of {} elements at {} of {}",
           name_, count, written_, n_);
  if (count > 0 && !write_1d(ds_.get(), mem_type_, written_, count, data)) return false;
  crcs_.push_back(crc32c(data, size_t(count) * size_t(elem_bytes_)));
  written_ += count;
  return true;
}

bool ChecksummedWriter::finish() {
  FD_CHECK(written_ == n_, "{}: {} of {} elements written", name_, written_, n_);
  if (!ds_.close()) return fail();
  return write_checksums(parent_, name_, crcs_, chunk_);
}

bool write_checksummed_1d(hid_t parent, const char* name, hid_t file_type, hid_t mem_type,
                          int64_t n, int elem_bytes, const void* data) {
  ChecksummedWriter w(parent, name, file_type, mem_type, n, elem_bytes);
  if (!w.valid()) return fail();
  const char* p = static_cast<const char*>(data);
  for (int64_t done = 0; done < n;) {
    const int64_t take = std::min(w.chunk(), n - done);
    if (!w.write(take, p + size_t(done) * size_t(elem_bytes))) return false;
    done += take;
  }
  return w.finish();
}

std::optional<Region> create_deferred_1d(hid_t parent, const char* name, hid_t file_type, int64_t n,
                                         int elem_bytes, const void* data) {
  static_assert(std::endian::native == std::endian::little,
                "the bytes in memory are the file's little-endian ones");
  FD_CHECK(n > 0 && H5Tget_size(file_type) == size_t(elem_bytes), "{}: {} elements of {} bytes",
           name, n, elem_bytes);
  hsize_t hn = hsize_t(n);
  H5Id space(H5Screate_simple(1, &hn, nullptr));
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (!space || !dcpl || H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS) < 0 ||
      H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0 ||
      H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0) {
    fail();
    return std::nullopt;
  }
  H5Id ds(H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!ds) {
    fail();
    return std::nullopt;
  }
  const haddr_t at = H5Dget_offset(ds.get());
  if (at == HADDR_UNDEF) {
    fail();
    return std::nullopt;
  }
  const int64_t chunk = chunk_elements_1d(n);
  const char* p = static_cast<const char*>(data);
  std::vector<uint32_t> crcs;
  Region region{int64_t(at), p, n * elem_bytes, 0};
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t bytes = std::min(chunk, n - begin) * elem_bytes;
    crcs.push_back(crc32c(p + begin * elem_bytes, size_t(bytes)));
    region.crc32c =
        begin == 0 ? crcs.back() : crc32c_combine(region.crc32c, crcs.back(), uint64_t(bytes));
  }
  if (!ds.close() || !write_checksums(parent, name, crcs, chunk)) {
    fail();
    return std::nullopt;
  }
  return region;
}

bool has_chunk_checksums(hid_t parent, const std::string& name) {
  return H5Lexists(parent, checksums_name(name).c_str(), H5P_DEFAULT) > 0;
}

int read_checksummed_1d(hid_t parent, const std::string& name, hid_t mem_type, int elem_bytes,
                        int64_t offset, int64_t count, void* out) {
  H5Id ds(H5Dopen2(parent, name.c_str(), H5P_DEFAULT));
  H5Id crc(H5Dopen2(parent, checksums_name(name).c_str(), H5P_DEFAULT));
  if (!ds || !crc) return 0;
  const std::optional<std::vector<hsize_t>> dims = dataset_dims(ds.get());
  const std::optional<std::vector<hsize_t>> crc_dims = dataset_dims(crc.get());
  const std::optional<int64_t> chunk = read_attr_i64(crc.get(), "chunk");
  if (!dims || dims->size() != 1 || !crc_dims || crc_dims->size() != 1 || !chunk) return -1;
  const int64_t n = int64_t((*dims)[0]);
  // The writer's chunking and nothing else: a damaged or hostile `chunk` is refused here, which
  // also bounds the buffer below (at most 2^20 elements).
  if (n < 0 || *chunk != chunk_elements_1d(n)) return -1;
  const int64_t chunks = n == 0 ? 0 : (n - 1) / *chunk + 1;
  if (int64_t((*crc_dims)[0]) != chunks || offset < 0 || count < 0 || count > n ||
      offset > n - count)
    return -1;
  if (count == 0) return 1;
  const int64_t first = offset / *chunk, last = (offset + count - 1) / *chunk;
  std::vector<uint32_t> want(size_t(last - first + 1));
  if (!read_1d(crc.get(), H5T_NATIVE_UINT32, first, int64_t(want.size()), want.data())) return 0;
  std::vector<char> buf(size_t(*chunk) * size_t(elem_bytes));
  char* dst = static_cast<char*>(out);
  for (int64_t c = first; c <= last; ++c) {
    const int64_t begin = c * *chunk, len = std::min(*chunk, n - begin);
    if (!read_1d(ds.get(), mem_type, begin, len, buf.data())) return 0;
    if (crc32c(buf.data(), size_t(len) * size_t(elem_bytes)) != want[size_t(c - first)]) return -1;
    const int64_t from = std::max(offset, begin), to = std::min(offset + count, begin + len);
    std::memcpy(dst + size_t(from - offset) * size_t(elem_bytes),
                buf.data() + size_t(from - begin) * size_t(elem_bytes),
                size_t(to - from) * size_t(elem_bytes));
  }
  return 1;
}

bool write_string_dataset(hid_t parent, const char* name, const std::vector<std::string>& values) {
  H5Id type = vlen_string_type();
  hsize_t n = values.size();
  H5Id space(H5Screate_simple(1, &n, nullptr));
  if (!type || !space) return fail();
  H5Id ds(H5Dcreate2(parent, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds) return fail();
  std::vector<const char*> ptrs;
  for (const std::string& v : values) ptrs.push_back(v.c_str());
  if (n > 0 && H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
    return fail();
  return ds.close() || fail();
}

std::optional<std::vector<std::string>> read_string_dataset(hid_t parent, const char* name) {
  if (H5Lexists(parent, name, H5P_DEFAULT) <= 0) return std::nullopt;
  H5Id ds(H5Dopen2(parent, name, H5P_DEFAULT));
  if (!ds) return std::nullopt;
  auto dims = dataset_dims(ds.get());
  H5Id type(H5Dget_type(ds.get()));
  if (!dims || dims->size() != 1 || !type || H5Tget_class(type.get()) != H5T_STRING)
    return std::nullopt;
  size_t n = (*dims)[0];
  if (n > kMaxStrings) return std::nullopt;  // a hostile size must not become an allocation
  std::vector<std::string> out(n);
  if (n == 0) return out;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem = vlen_string_type();
    std::vector<char*> ptrs(n, nullptr);
    if (H5Dread(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0) {
      fail();
      return std::nullopt;
    }
    for (size_t i = 0; i < n; ++i) {
      out[i] = ptrs[i] ? ptrs[i] : "";
      H5free_memory(ptrs[i]);
    }
    return out;
  }
  size_t size = H5Tget_size(type.get());
  std::vector<char> buf(n * size);
  if (H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
    fail();
    return std::nullopt;
  }
  for (size_t i = 0; i < n; ++i) {
    const char* p = buf.data() + i * size;
    out[i] = std::string(p, strnlen(p, size));
  }
  return out;
}

std::optional<std::vector<hsize_t>> dataset_dims(hid_t ds) {
  H5Id space(H5Dget_space(ds));
  if (!space) return std::nullopt;
  int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) return std::nullopt;
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  if (nd > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
    return std::nullopt;
  return dims;
}

bool read_1d(hid_t ds, hid_t mem_type, int64_t offset, int64_t count, void* out) {
  return transfer_1d(ds, mem_type, offset, count, out, false);
}

}  // namespace fd::ckpt::h5
