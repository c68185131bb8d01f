#include "lib/ckpt/export.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "lib/base/atomic_file.h"
#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/base/strings.h"
#include "lib/ckpt/h5.h"
#include "lib/ckpt/lora_base.h"
#include "lib/ckpt/peft.h"
#include "lib/ckpt/slices.h"
#include "lib/ckpt/weights_file.h"
#include "lib/tensor/safetensors.h"

namespace fd::ckpt {

namespace fs = std::filesystem;
using h5::H5Id;

namespace {

constexpr const char* kCorruptHint = "resume from an earlier checkpoint";
constexpr int64_t kReadBlock = int64_t(1) << 22;  // elements per read while verifying

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool same_layout(const std::vector<ParamLayout>& a, const std::vector<ParamLayout>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].segment != b[i].segment || a[i].offset != b[i].offset ||
        a[i].shape != b[i].shape || a[i].decay != b[i].decay || a[i].slice_dim != b[i].slice_dim ||
        a[i].slice_offset != b[i].slice_offset || a[i].slice_global != b[i].slice_global ||
        a[i].slice_blocks != b[i].slice_blocks)
      return false;
  return true;
}

// The manifest's entry for tp rank `tp`'s segment `name`, or nullptr.
const ManifestSegment* manifest_segment(const Manifest& mf, const std::string& name, int tp) {
  for (const ManifestSegment& s : mf.segments)
    if (s.name == name && s.tp == tp) return &s;
  return nullptr;
}

void check_against_manifest(const Checkpoint& c, size_t i) {
  const ShardMeta& m = c.shards[i].meta();
  const Manifest& mf = c.manifest;
  const std::string& path = c.shards[i].path();
  std::string manifest = (fs::path(c.dir) / "manifest.json").string();
  auto differ = [&](const char* what, const std::string& shard, const std::string& man) {
    usage_error("{}: {} is {} but the manifest {} says {}; the checkpoint is inconsistent; {}",
                path, what, shard, manifest, man, kCorruptHint);
  };
  if (m.rank != int(i)) differ("rank", std::to_string(m.rank), std::to_string(i));
  if (m.step != mf.step) differ("step", std::to_string(m.step), std::to_string(mf.step));
  if (m.world_size != mf.world_size)
    differ("world_size", std::to_string(m.world_size), std::to_string(mf.world_size));
  if (m.zero_stage != mf.zero_stage)
    differ("zero_stage", std::to_string(m.zero_stage), std::to_string(mf.zero_stage));
  if (m.precision != mf.precision) differ("precision", m.precision, mf.precision);
  if (m.format_version != mf.format_version)
    differ("format_version", std::to_string(m.format_version), std::to_string(mf.format_version));
  const ShardMeta& first = c.shards[0].meta();
  if (m.tensor.size != first.tensor.size || m.tensor.replicas != first.tensor.replicas)
    usage_error(
        "{}: it is of {} tp rank(s) x {} replica(s), but {} of {} x {}; the checkpoint is "
        "inconsistent; {}",
        path, m.tensor.size, m.tensor.replicas, c.shards[0].path(), first.tensor.size,
        first.tensor.replicas, kCorruptHint);
  // Within a tp rank every shard has one layout (its slices); tp ranks differ.
  const size_t same_tp = size_t(m.tensor.rank);  // the shard of rank tp: replica 0, stage 0
  if (i != same_tp && !same_layout(m.layout, c.shards[same_tp].meta().layout))
    usage_error(
        "{}: its parameter layout differs from that of {} (the same tp rank {}); the "
        "checkpoint is inconsistent; {}",
        path, c.shards[same_tp].path(), m.tensor.rank, kCorruptHint);
  for (const ShardReader::RangeInfo& r : c.shards[i].ranges()) {
    const ManifestSegment* seg = manifest_segment(mf, r.segment, m.tensor.rank);
    if (!seg)
      usage_error(
          "{}: segment '{}'{} is not in the manifest {}; the checkpoint is inconsistent; {}", path,
          r.segment, m.tensor.size > 1 ? fmt::format(" of tp rank {}", m.tensor.rank) : "",
          manifest, kCorruptHint);
    if (seg->numel != r.segment_numel)
      differ(("segment_numel of '" + r.segment + "'").c_str(), std::to_string(r.segment_numel),
             std::to_string(seg->numel));
  }
}

// The tp ranks' layouts must be slices of one set of whole tensors: the same parameters in
// the same order and segments, each tiled exactly by the tp ranks' slices. Fills
// c.whole_layout.
void check_tensor_parallel(Checkpoint& c) {
  const int T = c.meta().tensor.size;
  c.tp_shards.assign(size_t(T), {});
  for (size_t i = 0; i < c.shards.size(); ++i)
    c.tp_shards[size_t(c.shards[i].meta().tensor.rank)].push_back(i);
  const std::string manifest = (fs::path(c.dir) / "manifest.json").string();
  for (const ManifestSegment& s : c.manifest.segments)
    if (s.tp >= T)
      usage_error(
          "{}: segment '{}' of tp rank {}, but the shards are of {} tp rank(s); the checkpoint "
          "is inconsistent; {}",
          manifest, s.name, s.tp, T, kCorruptHint);
  for (int t = 0; t < T; ++t) {
    // world_size = T x replicas x stages (checked per shard) and rank % T = tp rank: each
    // tp rank has shards; a manifest of fewer files is refused before this.
    if (c.tp_shards[size_t(t)].empty())
      usage_error(
          "checkpoint {}: no shard holds tp rank {} of {}; the checkpoint is "
          "incomplete; {}",
          c.dir, t, T, kCorruptHint);
    const std::vector<ParamLayout>& a = c.layout(0);
    const std::vector<ParamLayout>& b = c.layout(t);
    const std::string& path = c.shards[c.tp_shards[size_t(t)].front()].path();
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i)
      same = a[i].name == b[i].name && a[i].segment == b[i].segment && a[i].decay == b[i].decay;
    if (!same)
      usage_error(
          "{}: tp rank {}'s parameters (names, segments) differ from tp rank 0's in {}; the "
          "checkpoint is inconsistent; {}",
          path, t, c.shards[0].path(), kCorruptHint);
  }
  c.whole_layout.clear();
  for (size_t i = 0; i < c.layout(0).size(); ++i) {
    const std::vector<const ParamLayout*> rows = c.rows(i);
    const std::string problem = tiling_problem(rows);
    if (!problem.empty())
      usage_error(
          "checkpoint {}: parameter '{}' is not split consistently over the tp ranks: {}; the "
          "checkpoint is inconsistent; {}",
          c.dir, rows.front()->name, problem, kCorruptHint);
    ParamLayout w = *rows.front();
    w.shape = global_shape(w);
    w.slice_dim = -1;
    w.slice_offset = w.slice_global = 0;
    w.slice_blocks = 1;
    c.whole_layout.push_back(std::move(w));
  }
}

// One piece of a segment to read: [begin, end) from shard `shard`.
struct Piece {
  size_t shard;
  int64_t begin, end;
};

// A segment of one tp rank (every segment is of tp rank 0 without tensor parallelism).
using TpSegment = std::pair<int, std::string>;

// For every segment of every tp rank, the pieces that cover it, each element taken from the
// first (lowest-offset) range of that tp rank's shards that holds it. Throws if a parameter
// element is held by no shard.
std::map<TpSegment, std::vector<Piece>> plan_reads(const Checkpoint& c) {
  std::map<TpSegment, std::vector<Piece>> plan;
  for (const ManifestSegment& seg : c.manifest.segments) {
    std::vector<Piece> ranges;
    for (size_t s : c.tp_shards[size_t(seg.tp)])
      if (const ShardReader::RangeInfo* r = c.shards[s].find_range(seg.name))
        ranges.push_back({s, r->offset, r->offset + r->count});
    std::sort(ranges.begin(), ranges.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    std::vector<std::pair<int64_t, int64_t>> gaps;
    int64_t pos = 0;
    std::vector<Piece>& pieces = plan[{seg.tp, seg.name}];
    for (const Piece& r : ranges) {
      if (r.begin > pos) gaps.push_back({pos, r.begin});
      if (r.end > pos) pieces.push_back({r.shard, std::max(pos, r.begin), r.end});
      pos = std::max(pos, r.end);
    }
    if (pos < seg.numel) gaps.push_back({pos, seg.numel});
    const std::string of_tp =
        c.tensor_size() > 1 ? fmt::format(" of tp rank {}", seg.tp) : std::string();
    for (const ParamLayout& p : c.layout(seg.tp)) {
      if (p.segment != seg.name) continue;
      int64_t b = p.offset, e = p.offset + numel_of(p.shape);  // no overflow: ShardReader checks
      if (e > seg.numel)
        usage_error(
            "checkpoint {}: parameter '{}' [{}, {}) lies beyond segment '{}'{} of {} elements in "
            "the manifest; the checkpoint is inconsistent; {}",
            c.dir, p.name, b, e, seg.name, of_tp, seg.numel, kCorruptHint);
      for (auto [gb, ge] : gaps)
        if (gb < e && b < ge)
          usage_error(
              "checkpoint {}: elements [{}, {}) of segment '{}'{} (parameter '{}') are in "
              "no shard; the checkpoint is incomplete; {}",
              c.dir, gb, ge, seg.name, of_tp, p.name, kCorruptHint);
    }
  }
  for (int t = 0; t < c.tensor_size(); ++t)
    for (const ParamLayout& p : c.layout(t))
      if (!plan.count({t, p.segment}))
        usage_error(
            "checkpoint {}: parameter '{}' lies in segment '{}'{}, which the manifest does "
            "not list; the checkpoint is inconsistent; {}",
            c.dir, p.name, p.segment,
            c.tensor_size() > 1 ? fmt::format(" of tp rank {}", t) : std::string(), kCorruptHint);
  return plan;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void write_h5_export(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  h5::quiet();
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  auto fail = [&](const std::string& what) {
    runtime_error("cannot write {}: {} failed ({}); check free space and permissions", path, what,
                  h5::last_error());
  };
  if (!file) fail("creating the file");
  for (const auto& [k, v] : metadata)
    if (!h5::write_attr_str(file.get(), k.c_str(), v)) fail("writing attribute " + k);
  for (const auto& [name, t] : tensors) {
    std::vector<hsize_t> dims;
    for (int i = 0; i < t.shape().ndim(); ++i) dims.push_back(hsize_t(t.shape()[i]));
    bool f32 = t.dtype() == DType::kF32;
    bool ok = h5::write_dataset(file.get(), name.c_str(), f32 ? H5T_IEEE_F32LE : H5T_STD_U16LE,
                                f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16, dims, t.raw());
    if (ok && !f32) {
      H5Id ds(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
      ok = ds && h5::write_attr_str(ds.get(), "dtype", std::string(dtype_name(t.dtype())));
    }
    if (!ok) fail("writing dataset " + name);
  }
  if (!file.close()) fail("closing the file");
}

// Writes `tensors` to `out` (.safetensors or .h5) via out.tmp and rename.
void write_weights_file(const std::string& out,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& meta) {
  std::error_code ec;
  fs::path final_path(out);
  if (!final_path.parent_path().empty()) fs::create_directories(final_path.parent_path(), ec);
  if (ends_with(out, ".safetensors")) {
    write_safetensors(out, tensors, meta);  // writes out.tmp and renames
  } else {
    // A fresh temporary name (never a file of the user's called out.tmp), renamed into place.
    fs::path tmp_path;
    ::close(make_temp_file_beside(out, &tmp_path));
    const std::string tmp = tmp_path.string();
    try {
      write_h5_export(tmp, tensors, meta);
    } catch (...) {
      fs::remove(tmp, ec);
      throw;
    }
    fs::rename(tmp, out, ec);
    if (ec) {
      const std::string why = ec.message();
      fs::remove(tmp, ec);
      runtime_error("cannot rename {} to {}: {}", tmp, out, why);
    }
  }
}

// The checkpoint's LoRA parameters (fp32 masters converted to `dtype`).
std::vector<std::pair<std::string, Tensor>> lora_tensors(const Checkpoint& c, DType dtype) {
  std::vector<std::pair<std::string, Tensor>> lora;
  for (auto& [name, t] : consolidate_ordered(c, dtype))
    if (is_lora_name(name)) lora.emplace_back(name, t);
  if (lora.empty())
    usage_error(
        "{}: the checkpoint holds no LoRA parameters (names with .lora_A. or .lora_B.), though "
        "its recipe has a lora section; the checkpoint is inconsistent",
        c.dir);
  return lora;
}

void check_export_dtype(DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    usage_error("--dtype must be fp32 or bf16, got {}", dtype_name(dtype));
}

}  // namespace

bool is_lora_checkpoint(const Checkpoint& c) {
  const std::vector<ParamLayout>& layout = c.meta().layout;
  return std::any_of(layout.begin(), layout.end(),
                     [](const ParamLayout& p) { return is_lora_name(p.name); });
}

void check_export_file(const std::string& out, DType dtype, bool overwrite) {
  check_export_dtype(dtype);
  if (!ends_with(out, ".safetensors") && !ends_with(out, ".h5"))
    usage_error("--out {}: the file name must end in .safetensors or .h5", out);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_regular_file(out, ec))
    usage_error(
        "--out {}: it is {}, not a regular file, and an export replaces only a file; "
        "nothing was changed: choose another --out",
        out, describe_file_type(out));
  if (fs::exists(out, ec) && !overwrite)
    usage_error("{} already exists; pass --overwrite to replace it, or choose another --out", out);
}

void check_export_dir(const std::string& dir, DType dtype, bool overwrite) {
  check_export_dtype(dtype);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec))
    usage_error(
        "--lora-adapter {}: it exists and is not a directory; choose another --lora-adapter", dir);
  if (fs::is_empty(dir, ec)) return;
  if (!overwrite)
    usage_error(
        "{} already exists; pass --overwrite to replace it, or choose another --lora-adapter", dir);
  // --overwrite replaces a previous adapter (its whole directory), never anything else.
  if (!fs::exists(fs::path(dir) / "adapter_config.json", ec))
    usage_error(
        "--lora-adapter {}: --overwrite replaces only a PEFT adapter directory (one with "
        "adapter_config.json), and this one has none; nothing was changed: choose another "
        "--lora-adapter",
        dir);
}

// ---------------------------------------------------------------------------

Checkpoint open_checkpoint(const std::string& path) {
  Checkpoint c;
  c.dir = resolve_step_dir(path);
  c.manifest = read_manifest(c.dir);
  if (c.manifest.format_version < kOldestFormatVersion ||
      c.manifest.format_version > kFormatVersion)
    usage_error(
        "{}: checkpoint format version {}, but this fdtrain reads format versions {} to {}; "
        "use the fdtrain that wrote it",
        (fs::path(c.dir) / "manifest.json").string(), c.manifest.format_version,
        kOldestFormatVersion, kFormatVersion);
  verify_shard_files(c.dir, c.manifest);  // before HDF5 parses any of them
  for (const std::string& f : c.manifest.files)
    c.shards.push_back(ShardReader::open((fs::path(c.dir) / f).string()));
  for (size_t i = 0; i < c.shards.size(); ++i) check_against_manifest(c, i);
  check_tensor_parallel(c);
  plan_reads(c);  // throws if some parameter is held by no shard
  return c;
}

std::vector<const ParamLayout*> Checkpoint::rows(size_t i) const {
  std::vector<const ParamLayout*> out;
  for (int t = 0; t < tensor_size(); ++t) out.push_back(&layout(t)[i]);
  return out;
}

std::vector<std::pair<std::string, Tensor>> consolidate_ordered(const Checkpoint& c, DType dtype) {
  std::map<TpSegment, std::vector<Piece>> plan = plan_reads(c);
  const std::vector<ParamLayout>& whole = c.whole_layout;
  std::vector<Tensor> full;
  for (const ParamLayout& p : whole)
    full.push_back(Tensor::zeros(Shape(std::span<const int64_t>(p.shape)), DType::kF32,
                                 MemCategory::kOther, Device::cpu()));
  for (const auto& [key, pieces] : plan) {
    const auto& [tp, segment] = key;
    const std::vector<ParamLayout>& layout = c.layout(tp);
    for (const Piece& piece : pieces) {
      Tensor buf = Tensor::empty(Shape{piece.end - piece.begin}, DType::kF32, MemCategory::kOther,
                                 Device::cpu());
      c.shards[piece.shard].read(segment, "master", piece.begin, piece.end - piece.begin, buf);
      for (size_t i = 0; i < layout.size(); ++i) {
        const ParamLayout& p = layout[i];
        if (p.segment != segment) continue;
        if (tp > 0 && p.whole()) continue;  // whole parameters: tp rank 0's
        int64_t b = std::max(p.offset, piece.begin);
        int64_t e = std::min(p.offset + numel_of(p.shape), piece.end);
        if (b >= e) continue;
        // The slice's elements in place in the whole tensor (one run when whole).
        for_each_global_run(p, b - p.offset, e - b, [&](int64_t g, int64_t l, int64_t n) {
          std::memcpy(full[i].f32() + g, buf.f32() + (p.offset + l - piece.begin),
                      size_t(n) * sizeof(float));
        });
      }
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < whole.size(); ++i)
    out.emplace_back(whole[i].name,
                     dtype == DType::kF32 ? full[i] : full[i].to(dtype, MemCategory::kOther));
  return out;
}

std::map<std::string, Tensor> consolidate(const std::string& step_dir, DType dtype) {
  Checkpoint c = open_checkpoint(step_dir);
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : consolidate_ordered(c, dtype)) out.emplace(name, t);
  return out;
}

std::string inspect_checkpoint(const std::string& path) {
  Checkpoint c = open_checkpoint(path);
  const ShardMeta& m = c.meta();
  std::string s;
  auto out = std::back_inserter(s);
  fmt::format_to(out, "checkpoint {}\n", c.dir);
  fmt::format_to(out,
                 "  step {}, world size {}, ZeRO stage {}, precision {}, format version {}, "
                 "written by {}\n",
                 m.step, m.world_size, m.zero_stage, m.precision, m.format_version,
                 m.fdtrain_version);
  fmt::format_to(out, "  optimizer step {}, seed {}, skipped steps {}", m.optimizer_step, m.seed,
                 m.skipped_steps);
  if (m.loss_scaler) fmt::format_to(out, ", loss scale {}", m.loss_scaler->scale);
  s += "\n";
  if (m.pipeline.stages > 1 && m.tensor.size > 1)
    fmt::format_to(out,
                   "  pipeline: {} stages x {} data-parallel replicas x {} tp ranks (rank = "
                   "(stage x {} + replica) x {} + tp rank), {} schedule, transformer blocks per "
                   "stage [{}]\n",
                   m.pipeline.stages, m.pipeline.replicas, m.tensor.size, m.pipeline.replicas,
                   m.tensor.size, m.pipeline.schedule, fmt::join(m.pipeline.blocks, ", "));
  else if (m.pipeline.stages > 1)
    fmt::format_to(out,
                   "  pipeline: {} stages x {} data-parallel replicas (rank = stage x {} + "
                   "replica), {} schedule, transformer blocks per stage [{}]\n",
                   m.pipeline.stages, m.pipeline.replicas, m.pipeline.replicas, m.pipeline.schedule,
                   fmt::join(m.pipeline.blocks, ", "));
  if (m.tensor.size > 1)
    fmt::format_to(
        out,
        "  tensor parallel: {} ranks x {} replicas{} (rank = {} x {} + tp rank), "
        "each tp rank's segments a flat space of its own\n",
        m.tensor.size, m.tensor.replicas,
        m.pipeline.stages > 1 ? fmt::format(" x {} stages", m.pipeline.stages) : std::string(),
        m.pipeline.stages > 1 ? "(stage x replicas + replica)" : "replica", m.tensor.size);
  int64_t params = 0;
  for (const ParamLayout& p : c.whole_layout) params += numel_of(p.shape);
  size_t segments = 0;
  for (const ManifestSegment& seg : c.manifest.segments) segments += seg.tp == 0;
  fmt::format_to(out, "  model: {} parameter tensors, {} elements, in {} segments\n",
                 c.whole_layout.size(), params, segments);

  int64_t datasets = 0;
  uint64_t bytes_read = 0;
  for (const ShardReader& shard : c.shards) {
    std::error_code ec;
    uintmax_t size = fs::file_size(shard.path(), ec);
    const ShardMeta::Pipeline& pl = shard.meta().pipeline;
    const ShardMeta::TensorLayout& tl = shard.meta().tensor;
    fmt::format_to(out, "  {}  rank {}{}{}  {}\n", fs::path(shard.path()).filename().string(),
                   shard.meta().rank,
                   pl.stages > 1 ? fmt::format(" (stage {}, replica {})", pl.stage, pl.replica)
                                 : std::string(),
                   tl.size > 1 ? fmt::format(" (tp rank {}, replica {})", tl.rank,
                                             (shard.meta().rank / tl.size) % tl.replicas)
                               : std::string(),
                   format_bytes(double(ec ? 0 : size)));
    for (const ShardReader::RangeInfo& r : shard.ranges()) {
      fmt::format_to(out, "    {:<8} [{}, {}) of {}:", r.segment, r.offset, r.offset + r.count,
                     r.segment_numel);
      for (const char* field : {"master", "exp_avg", "exp_avg_sq", "params"}) {
        DType dt = std::string(field) == "params" ? r.params_dtype : DType::kF32;
        fmt::format_to(out, " {} {}[{}]", field, dtype_name(dt), r.count);
        // Read everything: the chunks' CRC-32C (format version 2; Fletcher32 in version 1) is
        // verified chunk by chunk on read.
        for (int64_t b = 0; b < r.count; b += kReadBlock) {
          int64_t n = std::min(kReadBlock, r.count - b);
          Tensor buf = Tensor::empty(Shape{n}, dt, MemCategory::kOther, Device::cpu());
          shard.read(r.segment, field, r.offset + b, n, buf);
          bytes_read += buf.nbytes();
        }
        ++datasets;
      }
      s += "\n";
    }
  }
  fmt::format_to(out, "checksums ok ({} datasets in {} shards, {} read)\n", datasets,
                 c.shards.size(), format_bytes(double(bytes_read)));
  return s;
}

std::string export_checkpoint(const Checkpoint& c, const std::string& out, DType dtype,
                              bool overwrite, std::optional<int64_t> n_head) {
  check_export_file(out, dtype, overwrite);
  const ShardMeta& m = c.meta();
  if (is_lora_checkpoint(c))
    usage_error(
        "{}: the checkpoint is from a LoRA run and holds only the adapters; export them with "
        "--lora-adapter DIR (PEFT format), or the merged model with --merge-lora --out FILE",
        c.dir);
  std::vector<std::pair<std::string, Tensor>> tensors = consolidate_ordered(c, dtype);

  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamLayout& p : c.whole_layout) shapes[p.name] = p.shape;
  ImpliedDims dims = implied_dims(shapes);
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"step", std::to_string(m.step)},
      {"source", c.dir},
      {"precision", m.precision},
      {"dtype", dtype == DType::kF32 ? "fp32" : "bf16"},
      {"fdtrain_version", m.fdtrain_version},
      {"n_layer", std::to_string(dims.n_layer)},
      {"d_model", std::to_string(dims.d_model)},
      {"vocab_size", std::to_string(dims.vocab_size)},
      {"max_seq_len", std::to_string(dims.max_seq_len)},
  };
  if (n_head) meta["n_head"] = std::to_string(*n_head);

  write_weights_file(out, tensors, meta);
  int64_t n = 0;
  for (const auto& t : tensors) n += t.second.numel();
  return fmt::format("exported {} tensors ({} parameters, {}) of {} (step {}) to {}",
                     tensors.size(), n, dtype == DType::kF32 ? "fp32" : "bf16", c.dir, m.step, out);
}

std::string export_lora_adapter(const Checkpoint& c, const std::string& dir, DType dtype,
                                bool overwrite, const LoraSpec& spec) {
  check_export_dir(dir, dtype, overwrite);
  std::vector<std::pair<std::string, Tensor>> lora = lora_tensors(c, dtype);
  write_peft_adapter(dir, spec, lora, overwrite);
  int64_t n = 0;
  for (const auto& t : lora) n += t.second.numel();
  return fmt::format(
      "exported the LoRA adapter (r {}, alpha {}, {} tensors, {} parameters, {}) of {} (step {}) "
      "to {} (PEFT format)",
      spec.r, spec.alpha, lora.size(), n, dtype == DType::kF32 ? "fp32" : "bf16", c.dir,
      c.meta().step, dir);
}

std::string export_merged_lora(const Checkpoint& c, const std::string& out, DType dtype,
                               bool overwrite, const LoraSpec& spec, const ModelDims& mo,
                               const std::vector<std::string>& order) {
  check_export_file(out, dtype, overwrite);
  const ShardMeta& m = c.meta();
  // The base must be the very file the adapters were trained on.
  find_lora_base(c.dir, spec.base, m.base_sha256);
  std::vector<std::pair<std::string, Tensor>> lora = lora_tensors(c, DType::kF32);

  // The base, read as a weights file, checked against the run's model.
  WeightsFile w = WeightsFile::open(spec.base);
  ImpliedDims want{mo.n_layer, mo.d_model, mo.vocab_size, mo.max_seq_len};
  ImpliedDims have = implied_dims(w.shapes());
  if (have.n_layer != want.n_layer || have.d_model != want.d_model ||
      have.vocab_size != want.vocab_size || have.max_seq_len != want.max_seq_len)
    usage_error("{}: the base model (model.init_from of {}'s recipe) does not fit its model{}",
                spec.base, c.dir, dims_hint(have, want));
  std::vector<std::pair<std::string, Tensor>> base;
  for (const auto& [name, shape] : w.shapes()) base.emplace_back(name, w.load(name));
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position.emplace(order[i], i);
  auto key = [&](const std::string& name) {
    auto it = position.find(name);
    return std::pair(it == position.end() ? order.size() : it->second, name);
  };
  std::stable_sort(base.begin(), base.end(),
                   [&](const auto& a, const auto& b) { return key(a.first) < key(b.first); });

  std::vector<std::pair<std::string, Tensor>> merged = merge_lora(
      base, lora, double(float(spec.alpha) / float(spec.r)));  // as training's fp32 forward
  for (auto& [name, t] : merged)
    if (t.dtype() != dtype) t = t.to(dtype, MemCategory::kOther);

  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"step", std::to_string(m.step)},
      {"source", c.dir},
      {"base", spec.base},
      {"lora",
       fmt::format("r={} alpha={} targets={} layers={}", spec.r, spec.alpha,
                   fmt::join(spec.targets, ","),
                   spec.layers.empty() ? "all" : fmt::format("{}", fmt::join(spec.layers, ",")))},
      {"precision", m.precision},
      {"dtype", dtype == DType::kF32 ? "fp32" : "bf16"},
      {"fdtrain_version", m.fdtrain_version},
      {"n_layer", std::to_string(mo.n_layer)},
      {"n_head", std::to_string(mo.n_head)},
      {"d_model", std::to_string(mo.d_model)},
      {"vocab_size", std::to_string(mo.vocab_size)},
      {"max_seq_len", std::to_string(mo.max_seq_len)},
  };
  write_weights_file(out, merged, meta);
  int64_t n = 0;
  for (const auto& t : merged) n += t.second.numel();
  return fmt::format(
      "exported {} tensors ({} parameters, {}) of {} merged with the LoRA adapter of {} (step {}, "
      "r {}, alpha {}) to {}",
      merged.size(), n, dtype == DType::kF32 ? "fp32" : "bf16", spec.base, c.dir, m.step, spec.r,
      spec.alpha, out);
}

std::string diff_checkpoints(const std::string& a, const std::string& b, double* total_relative) {
  Checkpoint ca = open_checkpoint(a), cb = open_checkpoint(b);
  auto ta = consolidate_ordered(ca, DType::kF32), tb = consolidate_ordered(cb, DType::kF32);
  if (ta.size() != tb.size())
    usage_error("{} and {} hold different models ({} vs {} parameters)", ca.dir, cb.dir, ta.size(),
                tb.size());
  std::string out;
  double num = 0, den = 0;
  for (size_t i = 0; i < ta.size(); ++i) {
    if (ta[i].first != tb[i].first || ta[i].second.shape() != tb[i].second.shape())
      usage_error("{} and {} hold different models ({} {} vs {} {})", ca.dir, cb.dir, ta[i].first,
                  ta[i].second.shape().str(), tb[i].first, tb[i].second.shape().str());
    std::vector<float> va = ta[i].second.to_vector(), vb = tb[i].second.to_vector();
    double n = 0, d = 0, mx = 0;
    for (size_t j = 0; j < va.size(); ++j) {
      double diff = double(va[j]) - double(vb[j]);
      n += diff * diff;
      d += double(vb[j]) * double(vb[j]);
      mx = std::max(mx, std::fabs(diff));
    }
    num += n;
    den += d;
    out += fmt::format("{:<28} rel {:.3e}  max|diff| {:.3e}\n", ta[i].first,
                       d > 0 ? std::sqrt(n / d) : std::sqrt(n), mx);
  }
  const double total = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (total_relative) *total_relative = total;
  out += fmt::format("relative_difference {:.6e}\n", total);
  return out;
}

}  // namespace fd::ckpt
