// Fuzz target: the checkpoint-shard reader (lib/ckpt/shard, h5) and the
// whole-checkpoint checks on top of it (lib/ckpt/export: open_checkpoint,
// inspect, consolidate).
//
// The input is a recipe for a shard that is well-formed HDF5 but says
// hostile things (missing or mistyped attributes, out-of-range numbers,
// layouts that do not fit, datasets of the wrong size, type or rank, huge
// unallocated datasets). The bytes are decoded by write_described_shard()
// and the shard is written with HDF5 itself, so the checks in our reader are
// what gets exercised, past the checksums that stop raw mutations.
//
// Damaged files (raw bytes) never reach HDF5 through a checkpoint: the
// manifest's size and CRC-32 of every shard are checked first
// (verify_shard_files; tests/ckpt/shard_digest_test.cc). To fuzz HDF5 itself
// through our reader anyway, set FDFUZZ_HDF5=1: an input that starts with the
// HDF5 signature "\x89HDF\r\n\x1a\n" is then written as rank_00000.h5 as it is.
// HDF5 1.10.8 does not survive that (tests/fuzz/hdf5/, bench/RELIABILITY.md).
// Then: ShardReader::open, read() of every range and field (bounded), and, as
// `fdtrain ckpt inspect/export` would, a one-shard checkpoint directory with
// a manifest (in the second form, itself partly decoded from the input)
// opened, inspected and consolidated. Everything must end in fd::Error or
// succeed.
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "lib/ckpt/export.h"
#include "lib/ckpt/h5.h"
#include "lib/ckpt/manifest.h"
#include "lib/ckpt/shard.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace h5 = fd::ckpt::h5;
using h5::H5Id;

// Consumes the input front to back; past the end everything reads as 0.
class Bytes {
 public:
  explicit Bytes(std::string_view s) : s_(s) {}
  uint8_t u8() { return pos_ < s_.size() ? uint8_t(s_[pos_++]) : 0; }
  int64_t i64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(u8()) << (8 * i);
    return int64_t(v);
  }
  // A number that is usually interesting: small values, boundaries, or raw.
  int64_t number() {
    static constexpr int64_t kTable[] = {0,  1,       2,         3,          4,         -1,
                                         16, 1 << 20, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN,
                                         int64_t(1) << 40, int64_t(1) << 62};
    uint8_t sel = u8();
    if (sel < 128) return sel % 40;
    if (sel < 240) return kTable[sel % std::size(kTable)];
    return i64();
  }
  std::string str(std::initializer_list<const char*> choices) {
    uint8_t sel = u8();
    if (sel < 200) return *(choices.begin() + sel % choices.size());
    size_t n = u8() % 24;
    std::string out;
    for (size_t i = 0; i < n; ++i) out += char(u8());
    return out;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

// Writes an integer attribute the way the input says: absent, as a string,
// as a float, as a 2-element array, or as the int64 it should be.
void int_attr(Bytes& in, hid_t obj, const char* name) {
  uint8_t how = in.u8() % 16;
  int64_t v = in.number();
  if (how == 0) return;
  if (how == 1) {
    h5::write_attr_str(obj, name, std::to_string(v));
  } else if (how == 2) {
    h5::write_attr_f64(obj, name, double(v) + 0.5);
  } else if (how == 3) {
    hsize_t two = 2;
    H5Id space(H5Screate_simple(1, &two, nullptr));
    H5Id a(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
    int64_t vals[2] = {v, v};
    if (a) H5Awrite(a.get(), H5T_NATIVE_INT64, vals);
  } else {
    h5::write_attr_i64(obj, name, v);
  }
}

void str_attr(Bytes& in, hid_t obj, const char* name,
              std::initializer_list<const char*> choices) {
  uint8_t how = in.u8() % 16;
  if (how == 0) return;
  if (how == 1) {
    h5::write_attr_i64(obj, name, 7);
  } else {
    h5::write_attr_str(obj, name, in.str(choices));
  }
}

// A 1-D (or, rarely, 2-D) numeric dataset of `n` elements of `file_type`
// filled from the input, or a huge one with no data written (HDF5 then reads
// the fill value: nothing in the file bounds its size).
void dataset(Bytes& in, hid_t parent, const char* name, hid_t file_type, hid_t mem_type,
             size_t elem, int64_t n) {
  uint8_t how = in.u8() % 16;
  if (how == 0) return;  // absent
  if (how == 1) {        // huge, unallocated
    hsize_t dims = hsize_t(1) << (30 + in.u8() % 20), chunk = 1024;
    H5Id space(H5Screate_simple(1, &dims, nullptr));
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_chunk(dcpl.get(), 1, &chunk);
    H5Id ds(H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    return;
  }
  if (how == 2) file_type = H5T_STD_I32LE, mem_type = H5T_NATIVE_INT32, elem = 4;  // wrong type
  if (how == 3) n += int64_t(in.u8() % 3) - 1;                                     // wrong size
  n = std::clamp<int64_t>(n, 0, 4096);
  std::vector<hsize_t> dims = {hsize_t(n)};
  if (how == 4) dims = {hsize_t(n), 1};  // wrong rank
  std::vector<uint8_t> data(size_t(n) * elem);
  for (size_t i = 0; i < data.size(); ++i) data[i] = (i < 64 || in.u8() % 4 == 0) ? in.u8() : 0;
  h5::write_dataset(parent, name, file_type, mem_type, dims, data.data());
}

// Writes the shard the input describes; returns the manifest segments it
// decodes (segment names and sizes, possibly disagreeing with the shard).
std::vector<fd::ckpt::ManifestSegment> write_described_shard(Bytes& in, const std::string& path) {
  std::vector<fd::ckpt::ManifestSegment> manifest_segments;
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!file) return manifest_segments;
  hid_t root = file.get();
  if (in.u8() % 8 != 0) {
    h5::write_attr_i64(root, "format_version", in.u8() % 16 ? fd::ckpt::kFormatVersion : in.number());
  }
  for (const char* a : {"step", "world_size", "rank", "zero_stage", "optimizer_step", "seed",
                        "skipped_steps"})
    int_attr(in, root, a);
  str_attr(in, root, "precision", {"fp32", "bf16", "fp16", "fp8"});
  str_attr(in, root, "fdtrain_version", {"fdtrain 0.1.0"});
  str_attr(in, root, "recipe", {"steps: 1\n", "", "model: {n_layer: 1}\n", "[unclosed"});
  if (in.u8() % 4 == 0) str_attr(in, root, "base_sha256", {"", "00"});
  if (in.u8() % 4 == 0) {
    h5::write_attr_f64(root, "loss_scale", double(in.number()));
    for (const char* a : {"loss_scale_iter", "loss_scale_last_overflow_iter",
                          "loss_scale_hysteresis_left"})
      int_attr(in, root, a);
  }

  const char* kSegments[] = {"embed", "h.0", "h.1", "final"};
  if (in.u8() % 8 != 0) {
    H5Id g(H5Gcreate2(root, "layout", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    int64_t n = in.u8() % 6;
    size_t width = in.u8() % 4;
    std::vector<std::string> names, segments;
    for (int64_t i = 0; i < n + (in.u8() % 8 == 0); ++i)
      names.push_back(in.str({"wte.weight", "wpe.weight", "h.0.ln_1.weight", "ln_f.bias"}));
    for (int64_t i = 0; i < n + (in.u8() % 8 == 0); ++i)
      segments.push_back(in.str({"embed", "h.0", "h.1", "final"}));
    if (in.u8() % 8 != 0) h5::write_string_dataset(g.get(), "name", names);
    if (in.u8() % 8 != 0) h5::write_string_dataset(g.get(), "segment", segments);
    dataset(in, g.get(), "offset", H5T_STD_I64LE, H5T_NATIVE_INT64, 8, n);
    dataset(in, g.get(), "ndim", H5T_STD_I32LE, H5T_NATIVE_INT32, 4, n);
    dataset(in, g.get(), "decay", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, n);
    if (in.u8() % 8 != 0) {
      std::vector<int64_t> shapes(size_t(n) * std::max<size_t>(width, 1));
      for (int64_t& v : shapes) v = in.number();
      h5::write_dataset(g.get(), "shape", H5T_STD_I64LE, H5T_NATIVE_INT64,
                        {hsize_t(n), std::max<hsize_t>(width, 1)}, shapes.data());
    }
  }
  if (in.u8() % 8 != 0) {
    H5Id gcpl(H5Pcreate(H5P_GROUP_CREATE));
    H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    H5Id segs(H5Gcreate2(root, "segments", H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
    int nseg = in.u8() % 4;
    for (int s = 0; s < nseg; ++s) {
      std::string name = in.str({"embed", "h.0", "h.1", "final"});
      H5Id g(H5Gcreate2(segs.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      if (!g) continue;
      int64_t numel = in.number(), offset = in.number(), count = in.number();
      bool good = in.u8() % 2;  // well-typed attributes with these values
      for (auto [attr, v] : {std::pair{"segment_numel", numel}, {"offset", offset}, {"count", count}})
        good ? (void)h5::write_attr_i64(g.get(), attr, v) : int_attr(in, g.get(), attr);
      for (const char* field : {"master", "exp_avg", "exp_avg_sq"})
        dataset(in, g.get(), field, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, count);
      uint8_t params = in.u8() % 4;
      if (params == 1) {
        dataset(in, g.get(), "params", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, count);
      } else if (params >= 2) {
        dataset(in, g.get(), "params", H5T_STD_U16LE, H5T_NATIVE_UINT16, 2, count);
        H5Id ds(H5Dopen2(g.get(), "params", H5P_DEFAULT));
        if (ds) str_attr(in, ds.get(), "dtype", {"bf16", "f16", "f32", "i8"});
      }
      manifest_segments.push_back({name, in.u8() % 4 ? numel : in.number()});
    }
  }
  for (int extra = in.u8() % 4; extra > 0; --extra)  // segments only the manifest lists
    manifest_segments.push_back({kSegments[in.u8() % 4], in.number()});
  return manifest_segments;
}

constexpr int64_t kMaxRead = 1 << 16;  // elements; a loader reads what its model needs

void read_all(const fd::ckpt::ShardReader& shard) {
  (void)shard.meta();
  for (const fd::ckpt::ShardReader::RangeInfo& r : shard.ranges()) {
    for (const char* field : {"master", "exp_avg", "exp_avg_sq", "params"}) {
      fd::fuzz::expect_clean([&] {
        int64_t n = std::min(r.count, kMaxRead);
        fd::Tensor out = fd::Tensor::empty(fd::Shape{n}, fd::DType::kF32, fd::MemCategory::kOther);
        shard.read(r.segment, field, r.offset, n, out);
        if (std::string(field) == "params" && r.params_dtype != fd::DType::kF32) {
          fd::Tensor raw = fd::Tensor::empty(fd::Shape{n}, r.params_dtype, fd::MemCategory::kOther);
          shard.read(r.segment, field, r.offset, n, raw);
        }
      });
    }
  }
}

// The one-shard checkpoint directory around the shard, as ckpt inspect/export read it.
void check_directory(const std::string& dir, const fd::ckpt::ShardReader& shard,
                     std::vector<fd::ckpt::ManifestSegment> segments, bool from_ranges) {
  const fd::ckpt::ShardMeta& m = shard.meta();
  fd::ckpt::Manifest mf;
  mf.step = m.step;
  mf.world_size = 1;
  mf.zero_stage = m.zero_stage;
  mf.precision = m.precision;
  mf.files = {fd::ckpt::shard_file_name(0)};
  if (from_ranges)
    for (const auto& r : shard.ranges()) segments.push_back({r.segment, r.segment_numel});
  mf.segments = segments;
  mf.digests = {fd::ckpt::file_digest(shard.path())};  // as the trainer records them
  fd::fuzz::expect_clean([&] {
    fd::ckpt::write_manifest(dir, mf);
    fd::ckpt::Checkpoint c = fd::ckpt::open_checkpoint(dir);
    int64_t total = 0;
    for (const auto& r : shard.ranges()) total += std::min<int64_t>(r.count, kMaxRead * 16);
    for (const auto& p : c.meta().layout) {
      int64_t numel = 1;
      for (int64_t d : p.shape) numel = d != 0 && numel > (kMaxRead * 16) / d ? kMaxRead * 16 : numel * d;
      total += numel;
    }
    if (total >= kMaxRead * 16) return;  // valid as far as the checks go, just large
    (void)fd::ckpt::inspect_checkpoint(dir);
    (void)fd::ckpt::consolidate_ordered(c, fd::DType::kF32);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const std::string dir = fd::fuzz::scratch_dir() + "/step";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  const std::string path = dir + "/" + fd::ckpt::shard_file_name(0);
  std::string_view in = fd::fuzz::as_view(data, size);

  constexpr std::string_view kSignature("\x89HDF\r\n\x1a\n", 8);
  std::vector<fd::ckpt::ManifestSegment> segments;
  static const bool fuzz_hdf5 = std::getenv("FDFUZZ_HDF5") != nullptr;
  bool raw = fuzz_hdf5 && in.substr(0, 8) == kSignature;
  if (raw) {
    fd::fuzz::write_file(path, in);
  } else {
    Bytes bytes(in);
    h5::quiet();
    segments = write_described_shard(bytes, path);
    h5::last_error();
  }
  fd::fuzz::expect_clean([&] {
    fd::ckpt::ShardReader shard = fd::ckpt::ShardReader::open(path);
    read_all(shard);
    if (shard.meta().world_size == 1) check_directory(dir, shard, segments, raw);
  });
  // Every HDF5 handle our code opened is closed again, whatever happened.
  if (ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0) {
    std::fprintf(stderr, "shard_fuzz: %zd HDF5 objects still open after the input\n", open);
    std::abort();
  }
  return 0;
}
