#include "lib/ckpt/shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "lib/base/async_file.h"
#include "lib/base/error.h"
#include "lib/base/strings.h"
#include "lib/ckpt/h5.h"
#include "lib/ckpt/regions.h"

namespace fd::ckpt {

namespace fs = std::filesystem;
using h5::H5Id;

namespace {

constexpr const char* kFields[] = {"master", "exp_avg", "exp_avg_sq", "params"};

// The most values a /layout dataset may hold (GPT-2 XL has under 600 parameter tensors).
constexpr hsize_t kMaxLayoutValues = hsize_t(1) << 24;

// Objects of this size or more start on kIoAlign boundaries in a shard (shard_fapl), and state
// datasets this large are written past HDF5 (h5::create_deferred_1d, write_regions).
constexpr int64_t kAlignedBytes = int64_t(64) << 10;

// What to tell the user when a shard cannot be used.
constexpr const char* kCorruptHint = "resume from an earlier checkpoint";

std::string params_dtype_name(DType t) { return std::string(dtype_name(t)); }

// The file access properties of every shard: the HDF5 1.8 object format,
// whose object headers and B-trees carry their own checksums (so corrupt
// metadata is detected as well as corrupt data) and which every HDF5 >= 1.8
// reader (h5dump, h5py) understands; objects of 64 KiB or more (the state's
// datasets) start on 4 KiB boundaries: page-aligned, large sequential writes and
// reads.
H5Id shard_fapl() {
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  H5Pset_alignment(fapl.get(), hsize_t(kAlignedBytes), hsize_t(kIoAlign));
  return fapl;
}

[[noreturn]] void write_failed(const std::string& path, const std::string& what) {
  std::string stack = h5::last_error();
  std::error_code ec;
  fs::path dir = fs::absolute(fs::path(path), ec).parent_path();
  fs::space_info space = fs::space(dir, ec);
  bool full = stack.find("No space left") != std::string::npos ||
              (!ec && space.available < (uint64_t(1) << 20));
  if (full) shard_disk_full(path, what);
  runtime_error(
      "cannot write checkpoint shard {}: {} failed ({}); check that {} exists and is "
      "writable",
      path, what, stack.empty() ? "no detail from HDF5" : stack, dir.string());
}

void check_range_tensor(const SegmentRange& r, const Tensor& t, const char* field, bool f32) {
  FD_CHECK(t.defined(), "segment {}: {} is undefined", r.segment, field);
  FD_CHECK(t.device().is_cpu(), "segment {}: {} must be a CPU tensor", r.segment, field);
  FD_CHECK(t.numel() == r.count, "segment {}: {} has {} elements, range count {}", r.segment, field,
           t.numel(), r.count);
  FD_CHECK(!f32 || t.dtype() == DType::kF32, "segment {}: {} must be f32, got {}", r.segment, field,
           dtype_name(t.dtype()));
}

// Writes a 1-D tensor as a checksummed dataset: f32 as float32, bf16/f16 as
// uint16 with a `dtype` attribute naming the 16-bit format. A tensor of kAlignedBytes or more
// is left for write_regions: its region is added to `regions`.
bool write_tensor_dataset(hid_t group, const char* name, const Tensor& t,
                          std::vector<h5::Region>& regions) {
  const int64_t n = t.numel();
  const bool f32 = t.dtype() == DType::kF32;
  FD_CHECK(f32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16, "unsupported dtype {}",
           dtype_name(t.dtype()));
  const int elem = f32 ? 4 : 2;
  const hid_t file_type = f32 ? H5T_IEEE_F32LE : H5T_STD_U16LE;
  if (n * elem >= kAlignedBytes) {
    std::optional<h5::Region> r = h5::create_deferred_1d(group, name, file_type, n, elem, t.raw());
    if (!r) return false;
    regions.push_back(*r);
  } else if (!h5::write_checksummed_1d(group, name, file_type,
                                       f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16, n, elem,
                                       t.raw())) {
    return false;
  }
  if (f32) return true;
  H5Id ds(H5Dopen2(group, name, H5P_DEFAULT));
  return ds && h5::write_attr_str(ds.get(), "dtype", params_dtype_name(t.dtype()));
}

// Writes a range's streamed state (SegmentRange::stream) as the datasets
// write_tensor_dataset would make (master, exp_avg, exp_avg_sq, and params
// when stream_params is set), through one HDF5 chunk of staging per dataset:
// the state is never whole in memory.
bool write_streamed_state(hid_t group, const SegmentRange& r) {
  const int n_fields = r.stream_params ? 4 : 3;
  static constexpr const char* kNames[4] = {"master", "exp_avg", "exp_avg_sq", "params"};
  if (r.stream_params)
    FD_CHECK(*r.stream_params == DType::kBF16 || *r.stream_params == DType::kF16,
             "streamed params of dtype {}", dtype_name(*r.stream_params));
  const size_t elem[4] = {4, 4, 4, 2};
  std::vector<std::unique_ptr<h5::ChecksummedWriter>> ds;
  for (int f = 0; f < n_fields; ++f) {
    ds.push_back(std::make_unique<h5::ChecksummedWriter>(
        group, kNames[f], f < 3 ? H5T_IEEE_F32LE : H5T_STD_U16LE,
        f < 3 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16, r.count, int(elem[f])));
    if (!ds.back()->valid()) return h5::fail();
  }
  const int64_t chunk = ds[0]->chunk();
  std::vector<char> stage[4];
  for (int f = 0; f < n_fields; ++f) stage[f].resize(size_t(chunk) * elem[f]);
  int64_t staged = 0, expect = 0;
  bool ok = true;
  auto flush = [&] {
    for (int f = 0; f < n_fields && ok; ++f) ok = ds[size_t(f)]->write(staged, stage[f].data());
    staged = 0;
  };
  r.stream([&](int64_t offset, const Tensor& master, const Tensor& m, const Tensor& v,
               const Tensor& params) {
    FD_CHECK(offset == expect, "segment {}: state piece at {}, expected {}", r.segment, offset,
             expect);
    const Tensor* t[4] = {&master, &m, &v, &params};
    const int64_t n = master.numel();
    for (int f = 0; f < n_fields; ++f) {
      const DType want = f < 3 ? DType::kF32 : *r.stream_params;
      FD_CHECK(
          t[f]->defined() && t[f]->numel() == n && t[f]->dtype() == want && t[f]->device().is_cpu(),
          "segment {}: state pieces must be CPU tensors of one length", r.segment);
    }
    for (int64_t done = 0; done < n;) {
      const int64_t take = std::min(n - done, chunk - staged);
      for (int f = 0; f < n_fields; ++f)
        std::memcpy(stage[f].data() + size_t(staged) * elem[f],
                    static_cast<const char*>(t[f]->raw()) + size_t(done) * elem[f],
                    size_t(take) * elem[f]);
      staged += take;
      done += take;
      if (staged == chunk) flush();
    }
    expect += n;
  });
  FD_CHECK(expect == r.count, "segment {}: {} state elements streamed of {}", r.segment, expect,
           r.count);
  if (staged > 0) flush();
  for (int f = 0; f < n_fields && ok; ++f) ok = ds[size_t(f)]->finish();
  if (ok && r.stream_params) {
    H5Id params(H5Dopen2(group, "params", H5P_DEFAULT));
    ok = params && h5::write_attr_str(params.get(), "dtype", params_dtype_name(*r.stream_params));
  }
  return ok;
}

// Reads a whole numeric dataset of `n` rows x `width` into `out`.
template <typename T>
bool read_numeric(hid_t parent, const char* name, hid_t mem_type, std::vector<hsize_t> want,
                  std::vector<T>* out) {
  if (H5Lexists(parent, name, H5P_DEFAULT) <= 0) return false;
  H5Id ds(H5Dopen2(parent, name, H5P_DEFAULT));
  if (!ds) return false;
  auto dims = h5::dataset_dims(ds.get());
  if (!dims || dims->size() != want.size()) return false;
  size_t numel = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != hsize_t(-1) && (*dims)[i] != want[i]) return false;
    // A layout is a few thousand values; a hostile size must not become an allocation.
    if ((*dims)[i] > kMaxLayoutValues || numel * (*dims)[i] > kMaxLayoutValues) return false;
    numel *= (*dims)[i];
  }
  out->assign(numel, T{});
  return numel == 0 ||
         H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) >= 0 || h5::fail();
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing

FileDigest write_shard(const std::string& path, const ShardMeta& meta,
                       const std::vector<SegmentRange>& ranges) {
  h5::quiet();
  std::set<std::string> seen;
  for (const SegmentRange& r : ranges) {
    FD_CHECK(seen.insert(r.segment).second, "two ranges of segment {}", r.segment);
    FD_CHECK(r.offset >= 0 && r.count >= 0 && r.offset + r.count <= r.segment_numel,
             "segment {}: range [{}, {}) outside [0, {})", r.segment, r.offset, r.offset + r.count,
             r.segment_numel);
    if (!r.stream) {
      check_range_tensor(r, r.master, "master", true);
      check_range_tensor(r, r.exp_avg, "exp_avg", true);
      check_range_tensor(r, r.exp_avg_sq, "exp_avg_sq", true);
    }
    if (r.params.defined()) check_range_tensor(r, r.params, "params", false);
  }

  H5Id fapl = shard_fapl();
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!file) write_failed(path, "creating the file");
  hid_t root = file.get();

  // Root attributes.
  bool ok = h5::write_attr_i64(root, "format_version", meta.format_version) &&
            h5::write_attr_i64(root, "step", meta.step) &&
            h5::write_attr_i64(root, "world_size", meta.world_size) &&
            h5::write_attr_i64(root, "rank", meta.rank) &&
            h5::write_attr_i64(root, "zero_stage", meta.zero_stage) &&
            h5::write_attr_str(root, "precision", meta.precision) &&
            h5::write_attr_i64(root, "optimizer_step", meta.optimizer_step) &&
            h5::write_attr_i64(root, "seed", meta.seed) &&
            h5::write_attr_i64(root, "skipped_steps", meta.skipped_steps) &&
            h5::write_attr_str(root, "fdtrain_version", meta.fdtrain_version) &&
            h5::write_attr_str(root, "recipe", meta.recipe_yaml) &&
            (meta.base_sha256.empty() || h5::write_attr_str(root, "base_sha256", meta.base_sha256));
  if (ok && meta.pipeline.stages > 1) {
    const ShardMeta::Pipeline& pl = meta.pipeline;
    ok =
        h5::write_attr_i64(root, "pipeline_stages", pl.stages) &&
        h5::write_attr_i64(root, "pipeline_replicas", pl.replicas) &&
        h5::write_attr_i64(root, "pipeline_stage", pl.stage) &&
        h5::write_attr_i64(root, "pipeline_replica", pl.replica) &&
        h5::write_attr_str(root, "pipeline_blocks", fmt::format("{}", fmt::join(pl.blocks, ","))) &&
        h5::write_attr_str(root, "pipeline_schedule", pl.schedule);
  }
  if (ok && meta.tensor.size > 1) {
    ok = h5::write_attr_i64(root, "tensor_size", meta.tensor.size) &&
         h5::write_attr_i64(root, "tensor_rank", meta.tensor.rank) &&
         h5::write_attr_i64(root, "tensor_replicas", meta.tensor.replicas);
  }
  if (ok && meta.loss_scaler) {
    const LossScalerState& s = *meta.loss_scaler;
    ok = h5::write_attr_f64(root, "loss_scale", s.scale) &&
         h5::write_attr_i64(root, "loss_scale_iter", s.iter) &&
         h5::write_attr_i64(root, "loss_scale_last_overflow_iter", s.last_overflow_iter) &&
         h5::write_attr_i64(root, "loss_scale_hysteresis_left", s.hysteresis_left);
  }
  if (!ok) write_failed(path, "writing the root attributes");

  // /layout: parallel datasets, one row per parameter.
  {
    H5Id g(H5Gcreate2(root, "layout", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!g) write_failed(path, "creating /layout");
    size_t n = meta.layout.size();
    size_t width = 1;
    for (const ParamLayout& p : meta.layout) width = std::max(width, p.shape.size());
    std::vector<std::string> names, segments;
    std::vector<int64_t> offsets, shapes(n * width, 0);
    std::vector<int32_t> ndims, slice_dims, slice_blocks;
    std::vector<int64_t> slice_offsets, slice_globals;
    std::vector<uint8_t> decay;
    for (size_t i = 0; i < n; ++i) {
      const ParamLayout& p = meta.layout[i];
      FD_CHECK(meta.tensor.size > 1 || p.whole(),
               "parameter {} is sliced in a shard without "
               "tensor parallelism",
               p.name);
      slice_dims.push_back(p.slice_dim);
      slice_offsets.push_back(p.slice_offset);
      slice_globals.push_back(p.slice_global);
      slice_blocks.push_back(p.slice_blocks);
      names.push_back(p.name);
      segments.push_back(p.segment);
      offsets.push_back(p.offset);
      ndims.push_back(int32_t(p.shape.size()));
      std::copy(p.shape.begin(), p.shape.end(), shapes.begin() + i * width);
      decay.push_back(p.decay ? 1 : 0);
    }
    hsize_t hn = n;
    ok = h5::write_string_dataset(g.get(), "name", names) &&
         h5::write_string_dataset(g.get(), "segment", segments) &&
         h5::write_dataset(g.get(), "offset", H5T_STD_I64LE, H5T_NATIVE_INT64, {hn},
                           offsets.data()) &&
         h5::write_dataset(g.get(), "ndim", H5T_STD_I32LE, H5T_NATIVE_INT32, {hn}, ndims.data()) &&
         h5::write_dataset(g.get(), "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, {hn, width},
                           shapes.data()) &&
         h5::write_dataset(g.get(), "decay", H5T_STD_U8LE, H5T_NATIVE_UINT8, {hn}, decay.data());
    // The slices only where there are any: a shard without tensor parallelism is as before.
    if (ok && meta.tensor.size > 1)
      ok = h5::write_dataset(g.get(), "slice_dim", H5T_STD_I32LE, H5T_NATIVE_INT32, {hn},
                             slice_dims.data()) &&
           h5::write_dataset(g.get(), "slice_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, {hn},
                             slice_offsets.data()) &&
           h5::write_dataset(g.get(), "slice_global", H5T_STD_I64LE, H5T_NATIVE_INT64, {hn},
                             slice_globals.data()) &&
           h5::write_dataset(g.get(), "slice_blocks", H5T_STD_I32LE, H5T_NATIVE_INT32, {hn},
                             slice_blocks.data());
    if (!ok) write_failed(path, "writing /layout");
  }

  // /segments/<name>, in the order given (creation order is tracked so that
  // readers list them in that order rather than by name).
  std::vector<h5::Region> regions;  // the state's bytes, written once HDF5 is done
  {
    H5Id gcpl(H5Pcreate(H5P_GROUP_CREATE));
    H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Id segs(H5Gcreate2(root, "segments", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
    if (!segs) write_failed(path, "creating /segments");
    for (const SegmentRange& r : ranges) {
      std::string where = "writing /segments/" + r.segment;
      H5Id g(H5Gcreate2(segs.get(), r.segment.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      if (!g) write_failed(path, where);
      ok = h5::write_attr_i64(g.get(), "segment_numel", r.segment_numel) &&
           h5::write_attr_i64(g.get(), "offset", r.offset) &&
           h5::write_attr_i64(g.get(), "count", r.count) &&
           (r.stream ? write_streamed_state(g.get(), r)
                     : write_tensor_dataset(g.get(), "master", r.master, regions) &&
                           write_tensor_dataset(g.get(), "exp_avg", r.exp_avg, regions) &&
                           write_tensor_dataset(g.get(), "exp_avg_sq", r.exp_avg_sq, regions)) &&
           (!r.params.defined() || write_tensor_dataset(g.get(), "params", r.params, regions));
      if (!ok) write_failed(path, where);
    }
  }

  if (H5Fflush(root, H5F_SCOPE_GLOBAL) < 0) write_failed(path, "flushing the file");
  if (!file.close()) write_failed(path, "closing the file");
  H5garbage_collect();  // what the free lists still hold goes back to the allocator
  return write_regions(path, std::move(regions));  // and the whole file synced
}

// Through HDF5 (a streamed range, or a dataset under kAlignedBytes) about two chunks of the
// dataset being written (its chunk and hyperslab buffers; measured); past it, write_regions's
// bounce buffers.
int64_t write_buffer_bytes(int64_t count, bool streamed, int params_bytes) {
  const int64_t chunk = h5::chunk_elements_1d(count);
  const int64_t hdf5 = 2 * chunk * int64_t(sizeof(float));
  if (streamed) return hdf5 + chunk * (3 * int64_t(sizeof(float)) + params_bytes);
  const int64_t bytes = count * int64_t(sizeof(float));
  return bytes >= kAlignedBytes ? region_buffer_bytes(bytes) : hdf5;
}

// ---------------------------------------------------------------------------
// Reading

struct ShardReader::Impl {
  std::string path;
  H5Id file;
  ShardMeta meta;
  std::vector<RangeInfo> ranges;
  std::map<std::string, size_t> by_segment;
  std::set<std::string> has_params;  // segments with a stored params dataset
};

ShardReader::ShardReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardReader::ShardReader(ShardReader&&) noexcept = default;
ShardReader& ShardReader::operator=(ShardReader&&) noexcept = default;
ShardReader::~ShardReader() = default;

const std::string& ShardReader::path() const { return impl_->path; }
const ShardMeta& ShardReader::meta() const { return impl_->meta; }
const std::vector<ShardReader::RangeInfo>& ShardReader::ranges() const { return impl_->ranges; }
const ShardReader::RangeInfo* ShardReader::find_range(const std::string& segment) const {
  auto it = impl_->by_segment.find(segment);
  return it == impl_->by_segment.end() ? nullptr : &impl_->ranges[it->second];
}

ShardReader ShardReader::open(const std::string& path) {
  h5::quiet();
  std::error_code ec;
  if (!fs::exists(path, ec))
    usage_error(
        "checkpoint shard {} does not exist; check the path, or resume from another "
        "checkpoint",
        path);
  if (!fs::is_regular_file(path, ec))
    usage_error("checkpoint shard {} is not a regular file", path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    h5::last_error();
    usage_error(
        "{} is not an HDF5 file (no HDF5 signature): it is not an fdtrain checkpoint "
        "shard, or it is corrupt; {}",
        path, kCorruptHint);
  }

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!impl->file) {
    std::string stack = h5::last_error();
    usage_error(
        "cannot open checkpoint shard {} ({}): the file is truncated or corrupt (was "
        "its write interrupted?); {}",
        path, stack, kCorruptHint);
  }
  hid_t root = impl->file.get();
  ShardMeta& m = impl->meta;

  auto missing = [&](const std::string& what) -> void {
    std::string stack = h5::last_error();
    if (h5::error_is_checksum(stack))
      usage_error("{}: checksum mismatch reading {}: the file is corrupt; {}", path, what,
                  kCorruptHint);
    usage_error(
        "{}: {} is missing or malformed: the file is not a complete fdtrain checkpoint "
        "shard (format version {}); {}",
        path, what, kFormatVersion, kCorruptHint);
  };
  auto req_i64 = [&](hid_t obj, const char* name, const std::string& where) {
    std::optional<int64_t> v = h5::read_attr_i64(obj, name);
    if (!v) missing(fmt::format("integer attribute '{}' of {}", name, where));
    return *v;
  };
  auto req_str = [&](hid_t obj, const char* name) {
    std::optional<std::string> v = h5::read_attr_str(obj, name);
    if (!v) missing(fmt::format("string attribute '{}' of /", name));
    return *v;
  };

  // The version first: everything else may differ in another version.
  std::optional<int64_t> version = h5::read_attr_i64(root, "format_version");
  if (!version) missing("integer attribute 'format_version' of /");
  if (*version < kOldestFormatVersion || *version > kFormatVersion) {
    std::string writer = h5::read_attr_str(root, "fdtrain_version").value_or("unknown");
    usage_error(
        "{}: checkpoint format version {} (written by {}), but this fdtrain reads "
        "format versions {} to {}; use the fdtrain that wrote it (e.g. `fdtrain ckpt export` "
        "and start from the export with model.init_from)",
        path, *version, writer, kOldestFormatVersion, kFormatVersion);
  }
  m.format_version = int(*version);
  auto bad = [&](const std::string& what) {
    usage_error("{}: {}: the file is corrupt or not an fdtrain checkpoint shard; {}", path, what,
                kCorruptHint);
  };
  // An int attribute: refused rather than truncated when it does not fit.
  auto req_int = [&](const char* name) {
    int64_t v = req_i64(root, name, "/");
    if (v < INT32_MIN || v > INT32_MAX)
      bad(fmt::format("attribute '{}' = {} is out of range", name, v));
    return int(v);
  };
  m.step = req_i64(root, "step", "/");
  m.world_size = req_int("world_size");
  m.rank = req_int("rank");
  m.zero_stage = req_int("zero_stage");
  m.precision = req_str(root, "precision");
  m.optimizer_step = req_i64(root, "optimizer_step", "/");
  m.seed = req_i64(root, "seed", "/");
  m.skipped_steps = req_i64(root, "skipped_steps", "/");
  m.fdtrain_version = req_str(root, "fdtrain_version");
  m.recipe_yaml = req_str(root, "recipe");
  m.base_sha256 = h5::read_attr_str(root, "base_sha256").value_or("");
  if (h5::has_attr(root, "pipeline_stages")) {
    ShardMeta::Pipeline& pl = m.pipeline;
    pl.stages = req_int("pipeline_stages");
    pl.replicas = req_int("pipeline_replicas");
    pl.stage = req_int("pipeline_stage");
    pl.replica = req_int("pipeline_replica");
    pl.schedule = req_str(root, "pipeline_schedule");
    const std::string blocks = req_str(root, "pipeline_blocks");
    int total = 0;
    for (const std::string& b : split(blocks, ',')) {
      char* end = nullptr;
      const long n = std::strtol(b.c_str(), &end, 10);
      if (b.empty() || *end != '\0' || n < 1 || n > INT32_MAX)
        bad(fmt::format("attribute 'pipeline_blocks' = '{}' is not a list of block counts",
                        blocks));
      pl.blocks.push_back(int(n));
      total += int(n);
    }
    // With tensor parallelism each (stage, replica) is tensor_size ranks (checked below).
    const int64_t tp_ranks =
        h5::has_attr(root, "tensor_size") ? std::max(1, req_int("tensor_size")) : 1;
    if (pl.stages < 2 || pl.replicas < 1 ||
        int64_t(pl.stages) * pl.replicas * tp_ranks != m.world_size || pl.stage < 0 ||
        pl.stage >= pl.stages || pl.replica < 0 || pl.replica >= pl.replicas ||
        int(pl.blocks.size()) != pl.stages || total < pl.stages)
      bad(
          fmt::format("pipeline attributes ({} stages x {} replicas{}, stage {}, replica {}, "
                      "blocks '{}') do not fit world size {}",
                      pl.stages, pl.replicas,
                      tp_ranks > 1 ? fmt::format(" x {} tp ranks", tp_ranks) : std::string(),
                      pl.stage, pl.replica, blocks, m.world_size));
  }
  if (h5::has_attr(root, "tensor_size")) {
    ShardMeta::TensorLayout& tl = m.tensor;
    tl.size = req_int("tensor_size");
    tl.rank = req_int("tensor_rank");
    tl.replicas = req_int("tensor_replicas");
    if (tl.size < 2 || tl.replicas < 1 || tl.rank < 0 || tl.rank >= tl.size ||
        int64_t(tl.size) * tl.replicas * m.pipeline.stages != m.world_size)
      bad(
          fmt::format("tensor-parallel attributes ({} tp ranks x {} replicas x {} pipeline "
                      "stages, tp rank {}) do not fit world size {}",
                      tl.size, tl.replicas, m.pipeline.stages, tl.rank, m.world_size));
  }
  if (h5::has_attr(root, "loss_scale")) {
    std::optional<double> scale = h5::read_attr_f64(root, "loss_scale");
    if (!scale) missing("attribute 'loss_scale' of /");
    m.loss_scaler = LossScalerState{*scale, req_i64(root, "loss_scale_iter", "/"),
                                    req_i64(root, "loss_scale_last_overflow_iter", "/"),
                                    req_int("loss_scale_hysteresis_left")};
  }
  if (m.precision != "fp32" && m.precision != "bf16" && m.precision != "fp16")
    bad(fmt::format("precision '{}' is not fp32, bf16 or fp16", m.precision));
  if (m.world_size < 1 || m.rank < 0 || m.rank >= m.world_size)
    bad(fmt::format("rank {} of world size {}", m.rank, m.world_size));
  if (m.zero_stage < 0 || m.zero_stage > 3) bad(fmt::format("ZeRO stage {}", m.zero_stage));
  if (m.step < 0) bad(fmt::format("step {}", m.step));
  // World rank = (stage x replicas + replica) x tp size + tp rank.
  if (m.tensor.size > 1 && m.rank % m.tensor.size != m.tensor.rank)
    bad(
        fmt::format("tensor_rank {} is not the tp rank of rank {} ({} tp ranks: rank modulo {} "
                    "= {})",
                    m.tensor.rank, m.rank, m.tensor.size, m.tensor.size, m.rank % m.tensor.size));

  // /layout
  if (H5Lexists(root, "layout", H5P_DEFAULT) <= 0) missing("group /layout");
  {
    H5Id g(H5Gopen2(root, "layout", H5P_DEFAULT));
    if (!g) missing("group /layout");
    auto names = h5::read_string_dataset(g.get(), "name");
    if (!names) missing("dataset /layout/name");
    auto segments = h5::read_string_dataset(g.get(), "segment");
    hsize_t n = names->size();
    if (!segments || segments->size() != n) missing("dataset /layout/segment");
    std::vector<int64_t> offsets, shapes;
    std::vector<int32_t> ndims;
    std::vector<uint8_t> decay;
    if (!read_numeric(g.get(), "offset", H5T_NATIVE_INT64, {n}, &offsets))
      missing("dataset /layout/offset");
    if (!read_numeric(g.get(), "ndim", H5T_NATIVE_INT32, {n}, &ndims))
      missing("dataset /layout/ndim");
    if (!read_numeric(g.get(), "decay", H5T_NATIVE_UINT8, {n}, &decay))
      missing("dataset /layout/decay");
    if (!read_numeric(g.get(), "shape", H5T_NATIVE_INT64, {n, hsize_t(-1)}, &shapes))
      missing("dataset /layout/shape");
    // Tensor-parallel shards have the slices; others have none (every row whole).
    std::vector<int32_t> slice_dims(n, -1), slice_blocks(n, 1);
    std::vector<int64_t> slice_offsets(n, 0), slice_globals(n, 0);
    if (m.tensor.size > 1) {
      if (!read_numeric(g.get(), "slice_dim", H5T_NATIVE_INT32, {n}, &slice_dims))
        missing("dataset /layout/slice_dim");
      if (!read_numeric(g.get(), "slice_offset", H5T_NATIVE_INT64, {n}, &slice_offsets))
        missing("dataset /layout/slice_offset");
      if (!read_numeric(g.get(), "slice_global", H5T_NATIVE_INT64, {n}, &slice_globals))
        missing("dataset /layout/slice_global");
      if (!read_numeric(g.get(), "slice_blocks", H5T_NATIVE_INT32, {n}, &slice_blocks))
        missing("dataset /layout/slice_blocks");
    } else if (H5Lexists(g.get(), "slice_dim", H5P_DEFAULT) > 0) {
      bad("/layout has slice columns but the root has no tensor_size attribute");
    }
    size_t width = n ? shapes.size() / n : 0;
    for (size_t i = 0; i < n; ++i) {
      if (ndims[i] < 0 || size_t(ndims[i]) > width || offsets[i] < 0)
        bad(fmt::format("layout row {} ('{}') is invalid", i, (*names)[i]));
      ParamLayout p{
          (*names)[i], (*segments)[i], offsets[i],
          std::vector<int64_t>(shapes.begin() + i * width, shapes.begin() + i * width + ndims[i]),
          decay[i] != 0};
      // Its elements [offset, offset + numel) must be addressable (no int64 overflow).
      int64_t numel = 1;
      for (int64_t d : p.shape) {
        if (d < 0) bad(fmt::format("parameter '{}' has a negative dimension", p.name));
        if (d != 0 && numel > INT64_MAX / d)
          bad(fmt::format("parameter '{}' has more than 2^63 elements", p.name));
        numel *= d;
      }
      if (numel > INT64_MAX - p.offset)
        bad(fmt::format("parameter '{}' lies beyond element 2^63 of its segment", p.name));
      p.slice_dim = slice_dims[i];
      p.slice_offset = slice_offsets[i];
      p.slice_global = slice_globals[i];
      p.slice_blocks = slice_blocks[i];
      if (!p.whole()) {
        const int64_t along = p.slice_dim < ndims[i] ? p.shape[size_t(p.slice_dim)] : 0;
        const bool fits = p.slice_dim < ndims[i] && p.slice_blocks >= 1 &&
                          along % p.slice_blocks == 0 && p.slice_offset >= 0 &&
                          p.slice_global >= 0 &&
                          p.slice_offset <= p.slice_global - along / p.slice_blocks &&
                          p.slice_global <= INT64_MAX / p.slice_blocks;
        // The whole tensor's elements must be addressable too.
        int64_t whole = 1;
        bool small = fits;
        for (size_t d = 0; small && d < p.shape.size(); ++d) {
          const int64_t len = int(d) == p.slice_dim ? p.slice_global * p.slice_blocks : p.shape[d];
          small = len == 0 || whole <= INT64_MAX / len;
          whole *= small ? len : 1;
        }
        if (!fits || !small)
          bad(fmt::format(
              "layout row {} ('{}'): slice [{}, +{}) of {} along dimension {} in {} "
              "blocks does not fit its shape",
              i, p.name, p.slice_offset, along, p.slice_global, p.slice_dim, p.slice_blocks));
      } else if (p.slice_dim != -1) {
        bad(fmt::format("layout row {} ('{}'): slice_dim {}", i, p.name, p.slice_dim));
      }
      m.layout.push_back(std::move(p));
    }
  }

  // /segments
  if (H5Lexists(root, "segments", H5P_DEFAULT) <= 0) missing("group /segments");
  H5Id segs(H5Gopen2(root, "segments", H5P_DEFAULT));
  if (!segs) missing("group /segments");
  std::vector<std::string> seg_names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate(segs.get(), H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, collect, &seg_names) < 0) {
    h5::last_error();  // not tracked (e.g. written by another tool): name order
    seg_names.clear();
    idx = 0;
    if (H5Literate(segs.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &seg_names) < 0)
      missing("group /segments");
  }
  for (const std::string& name : seg_names) {
    std::string where = "/segments/" + name;
    H5Id g(H5Gopen2(segs.get(), name.c_str(), H5P_DEFAULT));
    if (!g) missing("group " + where);
    RangeInfo r{name, req_i64(g.get(), "segment_numel", where), req_i64(g.get(), "offset", where),
                req_i64(g.get(), "count", where), DType::kF32};
    if (r.offset < 0 || r.count < 0 || r.segment_numel < 0 ||
        r.count > r.segment_numel - r.offset)  // offset + count <= segment_numel, without overflow
      bad(fmt::format("{}: range at offset {} of {} elements does not lie within segment_numel {}",
                      where, r.offset, r.count, r.segment_numel));
    for (const char* field : kFields) {
      std::string dsname = where + "/" + field;
      if (H5Lexists(g.get(), field, H5P_DEFAULT) <= 0) {
        if (std::string(field) == "params") continue;  // optional: equals master
        missing("dataset " + dsname);
      }
      H5Id ds(H5Dopen2(g.get(), field, H5P_DEFAULT));
      if (!ds) missing("dataset " + dsname);
      auto dims = h5::dataset_dims(ds.get());
      if (!dims || dims->size() != 1 || int64_t((*dims)[0]) != r.count)
        bad(fmt::format("dataset {} does not hold count = {} elements", dsname, r.count));
      H5Id type(H5Dget_type(ds.get()));
      H5T_class_t cls = type ? H5Tget_class(type.get()) : H5T_NO_CLASS;
      size_t size = type ? H5Tget_size(type.get()) : 0;
      DType dt = DType::kF32;
      std::string declared = h5::read_attr_str(ds.get(), "dtype").value_or("f32");
      if (declared == "bf16" || declared == "f16") {
        dt = declared == "bf16" ? DType::kBF16 : DType::kF16;
        if (cls != H5T_INTEGER || size != 2)
          bad(fmt::format("dataset {} says dtype {} but is not stored as uint16", dsname,
                          declared));
      } else if (declared != "f32" || cls != H5T_FLOAT || size != 4) {
        bad(fmt::format("dataset {} is not float32", dsname));
      }
      if (std::string(field) == "params") {
        r.params_dtype = dt;
        impl->has_params.insert(name);
      } else if (dt != DType::kF32) {
        bad(fmt::format("dataset {} must be float32", dsname));
      }
    }
    impl->by_segment[name] = impl->ranges.size();
    impl->ranges.push_back(r);
  }

  // The layout must fit the segments this file holds.
  for (const ParamLayout& p : m.layout) {
    const RangeInfo* r = nullptr;
    auto it = impl->by_segment.find(p.segment);
    if (it != impl->by_segment.end()) r = &impl->ranges[it->second];
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;  // no overflow: checked with the layout
    if (r && p.offset + numel > r->segment_numel)
      bad(fmt::format("layout places '{}' at [{}, {}) beyond segment '{}' of {} elements", p.name,
                      p.offset, p.offset + numel, p.segment, r->segment_numel));
  }
  return ShardReader(std::move(impl));
}

void ShardReader::read(const std::string& segment, const std::string& field, int64_t global_offset,
                       int64_t count, const Tensor& out) const {
  FD_CHECK(std::find(std::begin(kFields), std::end(kFields), field) != std::end(kFields),
           "unknown checkpoint field '{}'", field);
  // `out` may be on the GPU (resuming a device: cuda run): it is then filled
  // through a host buffer below.
  FD_CHECK(out.defined() && out.numel() == count, "read of {} elements into a tensor of {}", count,
           out.defined() ? out.numel() : 0);
  const RangeInfo* r = find_range(segment);
  if (!r)
    usage_error(
        "{} holds no range of segment '{}' (it holds {} segment ranges); the checkpoint "
        "does not match this model",
        impl_->path, segment, impl_->ranges.size());
  if (global_offset < r->offset || count < 0 || global_offset + count > r->offset + r->count)
    usage_error("{}: elements [{}, {}) of segment '{}' are not in this file's range [{}, {})",
                impl_->path, global_offset, global_offset + count, segment, r->offset,
                r->offset + r->count);
  if (count == 0) return;

  std::string stored = field;
  DType stored_dtype = DType::kF32;
  if (field == "params") {
    if (impl_->has_params.count(segment))
      stored_dtype = r->params_dtype;
    else
      stored = "master";
  }
  std::string dsname = "/segments/" + segment + "/" + stored;
  H5Id ds(H5Dopen2(impl_->file.get(), dsname.c_str(), H5P_DEFAULT));
  bool ok = ds.valid();
  if (ok) {
    // Read into `out` directly, or into a host buffer of the stored dtype
    // (a conversion, or a GPU tensor) that is then copied over.
    const bool direct = out.dtype() == stored_dtype && out.device().is_cpu();
    Tensor target =
        direct ? out
               : Tensor::empty(Shape{count}, stored_dtype, MemCategory::kOther, Device::cpu());
    hid_t mem = stored_dtype == DType::kF32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16;
    // Format version 2: our CRC-32C per chunk (h5::write_checksummed_1d); version 1: HDF5's
    // Fletcher32 filter, checked by HDF5 as it reads.
    const std::string group = "/segments/" + segment;
    H5Id g(H5Gopen2(impl_->file.get(), group.c_str(), H5P_DEFAULT));
    if (g && h5::has_chunk_checksums(g.get(), stored)) {
      const int rc = h5::read_checksummed_1d(g.get(), stored, mem, int(dtype_size(stored_dtype)),
                                             global_offset - r->offset, count, target.raw());
      if (rc < 0)
        usage_error("{}: checksum mismatch in segment '{}', dataset {}: the file is corrupt; {}",
                    impl_->path, segment, dsname, kCorruptHint);
      ok = rc > 0;
    } else if (impl_->meta.format_version >= 2) {
      usage_error("{}: segment '{}', dataset {} has no checksums: the file is corrupt; {}",
                  impl_->path, segment, dsname, kCorruptHint);
    } else {
      ok = h5::read_1d(ds.get(), mem, global_offset - r->offset, count, target.raw());
    }
    if (ok && !direct) out.copy_from(target);
  }
  if (!ok) {
    std::string stack = h5::last_error();
    if (h5::error_is_checksum(stack))
      usage_error("{}: checksum mismatch in segment '{}', dataset {}: the file is corrupt; {}",
                  impl_->path, segment, dsname, kCorruptHint);
    usage_error(
        "{}: cannot read segment '{}', dataset {} ({}): the file is truncated or "
        "corrupt; {}",
        impl_->path, segment, dsname, stack, kCorruptHint);
  }
}

}  // namespace fd::ckpt
