#include "lib/ckpt/weights_file.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/ckpt/finite.h"
#include "lib/ckpt/h5.h"
#include "lib/tensor/safetensors.h"

namespace fd::ckpt {

namespace fs = std::filesystem;
using h5::H5Id;

// A source of named tensors under the file's own names.
class WeightsFile::Source {
 public:
  virtual ~Source() = default;
  virtual std::vector<std::string> names() const = 0;
  virtual std::vector<int64_t> shape(const std::string& name) const = 0;
  virtual Tensor load(const std::string& name) const = 0;
  virtual std::map<std::string, std::string> metadata() const = 0;
};

namespace {

class SafetensorsSource : public WeightsFile::Source {
 public:
  explicit SafetensorsSource(const std::string& path) : f_(SafetensorsFile::open(path)) {}
  std::vector<std::string> names() const override { return f_.names(); }
  std::vector<int64_t> shape(const std::string& name) const override {
    return f_.entry(name).shape;
  }
  Tensor load(const std::string& name) const override { return f_.load(name); }
  std::map<std::string, std::string> metadata() const override { return f_.metadata(); }

 private:
  SafetensorsFile f_;
};

class H5Source : public WeightsFile::Source {
 public:
  explicit H5Source(const std::string& path) : path_(path) {
    h5::quiet();
    file_ = H5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file_)
      usage_error("cannot open {} ({}): the file is truncated or corrupt", path, h5::last_error());
    hsize_t idx = 0;
    H5Literate(
        file_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx,
        [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
          static_cast<std::vector<std::string>*>(data)->push_back(name);
          return 0;
        },
        &names_);
    for (const std::string& n : names_) {
      H5O_info_t info;
      if (H5Oget_info_by_name(file_.get(), n.c_str(), &info, H5P_DEFAULT) < 0 ||
          info.type != H5O_TYPE_DATASET)
        usage_error(
            "{}: '{}' is not a dataset; a weights file holds one dataset per parameter "
            "at its root (docs/FORMAT.md)",
            path, n);
    }
  }
  std::vector<std::string> names() const override { return names_; }
  std::map<std::string, std::string> metadata() const override {
    std::vector<std::string> attrs;
    hsize_t idx = 0;
    H5Aiterate2(
        file_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx,
        [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
          static_cast<std::vector<std::string>*>(data)->push_back(name);
          return 0;
        },
        &attrs);
    std::map<std::string, std::string> out;
    for (const std::string& a : attrs)
      if (std::optional<std::string> v = h5::read_attr_str(file_.get(), a.c_str())) out[a] = *v;
    h5::last_error();  // a non-string attribute is skipped, not an error
    return out;
  }
  std::vector<int64_t> shape(const std::string& name) const override {
    H5Id ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT));
    auto dims = ds ? h5::dataset_dims(ds.get()) : std::nullopt;
    if (!dims) usage_error("{}: cannot read dataset '{}': the file is corrupt", path_, name);
    return std::vector<int64_t>(dims->begin(), dims->end());
  }
  Tensor load(const std::string& name) const override {
    std::vector<int64_t> dims = shape(name);
    H5Id ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT));
    H5Id type(H5Dget_type(ds.get()));
    std::string declared = h5::read_attr_str(ds.get(), "dtype").value_or("f32");
    DType dt = DType::kF32;
    hid_t mem = H5T_NATIVE_FLOAT;
    if (declared == "bf16" || declared == "f16") {
      dt = declared == "bf16" ? DType::kBF16 : DType::kF16;
      mem = H5T_NATIVE_UINT16;
      if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 2)
        usage_error("{}: dataset '{}' says dtype {} but is not uint16", path_, name, declared);
    } else if (H5Tget_class(type.get()) != H5T_FLOAT) {
      usage_error("{}: dataset '{}' is not a floating-point dataset", path_, name);
    }
    Tensor t = Tensor::empty(Shape(std::span<const int64_t>(dims)), dt, MemCategory::kOther,
                             Device::cpu());
    if (t.numel() > 0 && H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) < 0) {
      std::string stack = h5::last_error();
      usage_error("{}: {} reading dataset '{}': the file is corrupt", path_,
                  h5::error_is_checksum(stack) ? "checksum mismatch" : "failure (" + stack + ")",
                  name);
    }
    return t;
  }

 private:
  std::string path_;
  H5Id file_;
  std::vector<std::string> names_;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<WeightsFile::Source> open_source(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) usage_error("{} does not exist; check the path", path);
  // Before anything opens it: a FIFO would block the signature check, a device never end.
  if (!fs::is_regular_file(path, ec))
    usage_error("{}: is {}, not a regular file; give a weights file (.safetensors, .h5)", path,
                describe_file_type(path));
  h5::quiet();
  if (H5Fis_hdf5(path.c_str()) > 0) return std::make_unique<H5Source>(path);
  h5::last_error();
  if (ends_with(path, ".h5") || ends_with(path, ".hdf5"))
    usage_error("{} is not an HDF5 file (no HDF5 signature): the file is corrupt", path);
  return std::make_unique<SafetensorsSource>(path);
}

}  // namespace

WeightsFile WeightsFile::open(const std::string& path) {
  WeightsFile w;
  w.path_ = path;
  w.source_ = open_source(path);
  static const std::regex kMaskBuffer(R"(^h\.\d+\.attn\.(bias|masked_bias)$)");
  for (const std::string& raw : w.source_->names()) {
    std::string name = raw.rfind("transformer.", 0) == 0 ? raw.substr(12) : raw;
    if (std::regex_match(name, kMaskBuffer)) continue;
    if (name == "lm_head.weight") {
      w.lm_head_ = LmHead{raw, w.source_->shape(raw)};
      continue;
    }
    w.stored_[name] = raw;
    w.shapes_[name] = w.source_->shape(raw);
  }
  return w;
}

WeightsFile::WeightsFile(WeightsFile&&) noexcept = default;
WeightsFile& WeightsFile::operator=(WeightsFile&&) noexcept = default;
WeightsFile::~WeightsFile() = default;

const std::string& WeightsFile::stored_name(const std::string& name) const {
  auto it = stored_.find(name);
  if (it == stored_.end()) usage_error("{} has no tensor '{}'", path_, name);
  return it->second;
}

Tensor WeightsFile::load(const std::string& name) const {
  Tensor t = source_->load(stored_name(name));
  check_finite(t, path_, stored_name(name));
  return t;
}

std::map<std::string, std::string> WeightsFile::metadata() const { return source_->metadata(); }

Tensor WeightsFile::load_lm_head() const {
  if (!lm_head_) usage_error("{} has no lm_head.weight", path_);
  Tensor t = source_->load(lm_head_->stored_name);
  check_finite(t, path_, lm_head_->stored_name);
  return t;
}

ImpliedDims implied_dims(const std::map<std::string, std::vector<int64_t>>& shapes) {
  ImpliedDims d;
  static const std::regex kBlock(R"(^h\.(\d+)\..*)");
  std::smatch m;
  for (const auto& [name, shape] : shapes) {
    if (std::regex_match(name, m, kBlock))
      d.n_layer = std::max<int64_t>(d.n_layer, std::stoll(m[1].str()) + 1);
    if (name == "wte.weight" && shape.size() == 2) {
      d.vocab_size = shape[0];
      d.d_model = shape[1];
    }
    if (name == "wpe.weight" && shape.size() == 2) d.max_seq_len = shape[0];
  }
  if (d.n_layer < 0 && (d.d_model >= 0)) d.n_layer = 0;
  return d;
}

std::string dims_hint(const ImpliedDims& file, const ImpliedDims& model) {
  std::vector<std::string> have, set;
  auto one = [&](const char* key, int64_t f, int64_t m) {
    if (f < 0) return;
    have.push_back(fmt::format("{} {}", key, f));
    if (m >= 0 && f != m) set.push_back(fmt::format("model.{} to {}", key, f));
  };
  one("n_layer", file.n_layer, model.n_layer);
  one("d_model", file.d_model, model.d_model);
  one("vocab_size", file.vocab_size, model.vocab_size);
  one("max_seq_len", file.max_seq_len, model.max_seq_len);
  if (have.empty()) return "";
  std::string s = "; the file holds a model with " + fmt::format("{}", fmt::join(have, ", "));
  if (!set.empty())
    s += fmt::format(": set {} to load it", fmt::join(set, " and "));
  else
    s += ": check model.n_head and the file";
  return s;
}

}  // namespace fd::ckpt
