#include "lib/ckpt/hf_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "lib/base/atomic_file.h"
#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/ckpt/finite.h"
#include "lib/tensor/safetensors.h"

namespace fd::ckpt {

namespace fs = std::filesystem;

// One safetensors file of the model: its parsed header and an open
// descriptor for pread, both held for the life of the HfWeights.
struct HfWeights::Shard {
  explicit Shard(const std::string& p) : path(p), file(SafetensorsFile::open(p)) {
    fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) usage_error("{}: cannot open for reading: {}", p, std::strerror(errno));
  }
  ~Shard() {
    if (fd >= 0) ::close(fd);
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  std::string path;
  SafetensorsFile file;
  int fd = -1;
};

namespace {

bool supported(const std::string& dtype, DType* out) {
  if (dtype == "F32")
    *out = DType::kF32;
  else if (dtype == "BF16")
    *out = DType::kBF16;
  else if (dtype == "F16")
    *out = DType::kF16;
  else
    return false;
  return true;
}

// The index's weight_map: tensor name -> shard file name.
std::map<std::string, std::string> read_index(const std::string& path) {
  // A regular file of configuration size, nested no deeper than an index is
  // ({"weight_map": {name: file}}): anything else is refused by name.
  const nlohmann::json j = read_json_file(path, "the model's weights index", kMaxConfigFileBytes,
                                          /*max_depth=*/8);
  auto bad = [&](const char* what) {
    usage_error(
        "{}: {}; expected {{\"metadata\": {{...}}, \"weight_map\": {{tensor: shard file}}}}", path,
        what);
  };
  if (!j.is_object()) bad("not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) bad("no \"weight_map\" object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string())
      usage_error("{}: weight_map entry for \"{}\" is not a file name", path, name);
    // A plain file name inside the model directory: no "../", no absolute path, no subdirectory.
    std::string f = file.get<std::string>();
    if (f.empty() || fs::path(f).filename().string() != f || f == "." || f == ".." ||
        f.find('/') != std::string::npos || f.find('\0') != std::string::npos)
      usage_error(
          "{}: weight_map entry for \"{}\" names \"{}\", not a file in the model directory; "
          "the index is corrupt",
          path, name, f);
    out[name] = f;
  }
  return out;
}

void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path,
               const std::string& name) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      runtime_error(
          "{}: cannot read tensor \"{}\" ({} bytes at offset {}): {}; was the file changed or "
          "removed?",
          path, name, bytes, offset, n < 0 ? std::strerror(errno) : "end of file");
    p += n;
    bytes -= uint64_t(n);
    offset += uint64_t(n);
  }
}

// The position of a dtype in the safetensors library's Dtype enum, whose
// derived order its writer sorts by (descending): BOOL, U8, I8, F8_E5M2,
// F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64.
int safetensors_dtype_rank(const std::string& dtype) {
  static const std::map<std::string, int> kRank = {
      {"BOOL", 0}, {"U8", 1},   {"I8", 2},   {"F8_E5M2", 3}, {"F8_E4M3", 4},
      {"I16", 5},  {"U16", 6},  {"F16", 7},  {"BF16", 8},    {"I32", 9},
      {"U32", 10}, {"F32", 11}, {"F64", 12}, {"I64", 13},    {"U64", 14}};
  auto it = kRank.find(dtype);
  return it == kRank.end() ? -1 : it->second;
}

}  // namespace

HfWeights HfWeights::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    usage_error("{}: no such directory; give a Hugging Face model directory (holding {} or {})",
                dir, kHfWeightsFile, kHfIndexFile);
  HfWeights w;
  w.dir_ = dir;
  fs::path index = fs::path(dir) / kHfIndexFile;
  fs::path single = fs::path(dir) / kHfWeightsFile;
  if (fs::exists(index, ec)) {
    std::map<std::string, std::string> map = read_index(index.string());
    if (map.empty())
      usage_error("{}: the weight_map lists no tensors; re-download the model", index.string());
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [name, file] : map) {
      if (shard_of_file.count(file)) continue;
      fs::path p = fs::path(dir) / file;
      if (!fs::exists(p, ec))
        usage_error(
            "{}: tensor \"{}\" is in shard {}, which is missing from {}; download the missing "
            "shard (or the whole model) again",
            index.string(), name, file, dir);
      shard_of_file[file] = 0;
    }
    for (auto& [file, i] : shard_of_file) {  // std::map: file-name order
      i = w.shards_.size();
      w.shards_.push_back(std::make_unique<Shard>((fs::path(dir) / file).string()));
    }
    for (const auto& [name, file] : map) {
      const Shard& s = *w.shards_[shard_of_file[file]];
      if (!s.file.contains(name))
        usage_error(
            "{}: tensor \"{}\" is listed in {} but absent from that shard; the index and the "
            "shards are inconsistent: download the model again",
            s.path, name, kHfIndexFile);
      w.where_[name] = shard_of_file[file];
    }
    for (const auto& s : w.shards_)
      for (const std::string& name : s->file.names()) {
        auto it = map.find(name);
        if (it == map.end() || (fs::path(dir) / it->second).string() != s->path)
          usage_error(
              "{}: holds tensor \"{}\", which {} {}; the index and the shards are "
              "inconsistent: download the model again",
              s->path, name, kHfIndexFile,
              it == map.end() ? "does not list" : "places in " + it->second);
      }
  } else if (fs::exists(single, ec)) {
    w.shards_.push_back(std::make_unique<Shard>(single.string()));
    for (const std::string& name : w.shards_[0]->file.names()) w.where_[name] = 0;
  } else {
    usage_error(
        "{}: holds neither {} nor {}; give the directory a Hugging Face model was downloaded "
        "or saved to",
        dir, kHfWeightsFile, kHfIndexFile);
  }
  return w;
}

HfWeights::HfWeights(HfWeights&&) noexcept = default;
HfWeights& HfWeights::operator=(HfWeights&&) noexcept = default;
HfWeights::~HfWeights() = default;

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

TensorInfo HfWeights::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) usage_error("{}: the model has no tensor \"{}\"", dir_, name);
  const Shard& s = *shards_[it->second];
  const SafetensorsFile::Entry& e = s.file.entry(name);
  TensorInfo info;
  if (!supported(e.dtype, &info.dtype))
    usage_error(
        "{}: tensor \"{}\" has dtype {}; only F32, BF16 and F16 are supported: convert the "
        "model (e.g. to BF16) first",
        s.path, name, e.dtype);
  info.shape = Shape(std::span<const int64_t>(e.shape));
  return info;
}

RawTensorInfo HfWeights::raw_info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) usage_error("{}: the model has no tensor \"{}\"", dir_, name);
  const SafetensorsFile::Entry& e = shards_[it->second]->file.entry(name);
  return RawTensorInfo{e.dtype, e.shape, e.end - e.begin};
}

std::vector<uint8_t> HfWeights::read_raw(const std::string& name, uint64_t max_bytes) const {
  const RawTensorInfo i = raw_info(name);
  const Shard& s = *shards_[where_.at(name)];
  if (i.nbytes > max_bytes)
    usage_error(
        "{}: tensor \"{}\" holds {} bytes, more than the {} such a tensor can hold; the "
        "file is corrupt",
        s.path, name, i.nbytes, max_bytes);
  // The entry's range was checked against the data section at open().
  std::vector<uint8_t> out(i.nbytes);
  if (i.nbytes > 0)
    pread_all(s.fd, out.data(), i.nbytes, s.file.data_start() + s.file.entry(name).begin, s.path,
              name);
  return out;
}

std::map<std::string, size_t> HfWeights::placement() const { return where_; }

std::vector<std::string> HfWeights::file_order() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::vector<std::pair<uint64_t, std::string>> in_file;
    for (const auto& [name, shard] : where_)
      if (shard == i) in_file.emplace_back(shards_[i]->file.entry(name).begin, name);
    std::sort(in_file.begin(), in_file.end());  // (empty tensors by name among equal offsets)
    for (auto& [begin, name] : in_file) out.push_back(std::move(name));
  }
  return out;
}

std::map<std::string, std::string> HfWeights::metadata() const {
  return shards_.empty() ? std::map<std::string, std::string>{} : shards_[0]->file.metadata();
}

void HfWeights::read(const std::string& name, const Tensor& out) const {
  TensorInfo i = info(name);
  read_bytes(name, 0, i.shape, out);
}

void HfWeights::read_rows(const std::string& name, int64_t row0, int64_t rows,
                          const Tensor& out) const {
  TensorInfo i = info(name);
  if (i.shape.ndim() != 2)
    usage_error("{}: read_rows of tensor \"{}\": it has shape {}, not 2-D", dir_, name,
                i.shape.str());
  if (row0 < 0 || rows < 0 || row0 > i.shape[0] || rows > i.shape[0] - row0)
    usage_error("{}: read_rows of tensor \"{}\": {} rows from row {} are outside its {} rows", dir_,
                name, rows, row0, i.shape[0]);  // (row0 + rows may overflow)
  uint64_t offset = uint64_t(row0) * uint64_t(i.shape[1]) * dtype_size(i.dtype);
  read_bytes(name, offset, Shape{rows, i.shape[1]}, out);
}

void HfWeights::read_range(const std::string& name, int64_t begin, int64_t count,
                           const Tensor& out) const {
  TensorInfo i = info(name);
  if (begin < 0 || count < 0 || begin > i.shape.numel() || count > i.shape.numel() - begin)
    usage_error("{}: read_range of tensor \"{}\": {} elements from element {} are outside its {}",
                dir_, name, count, begin, i.shape.numel());  // (begin + count may overflow)
  read_bytes(name, uint64_t(begin) * dtype_size(i.dtype), Shape{count}, out);
}

void HfWeights::read_bytes(const std::string& name, uint64_t offset, const Shape& shape,
                           const Tensor& out) const {
  TensorInfo i = info(name);
  if (!out.defined()) usage_error("{}: reading tensor \"{}\" into an undefined tensor", dir_, name);
  if (!(out.shape() == shape))
    usage_error("{}: tensor \"{}\": reading {} elements of shape {} into a tensor of shape {}",
                dir_, name, shape.numel(), shape.str(), out.shape().str());
  const Shard& s = *shards_[where_.at(name)];
  uint64_t at = s.file.data_start() + s.file.entry(name).begin + offset;
  uint64_t bytes = uint64_t(shape.numel()) * dtype_size(i.dtype);
  if (bytes == 0) return;
  const int64_t first = int64_t(offset / dtype_size(i.dtype));
  if (out.dtype() == i.dtype && out.device().is_cpu()) {
    pread_all(s.fd, out.raw(), bytes, at, s.path, name);
    check_finite(out, s.path, name, first, i.shape.numel());
    return;
  }
  Tensor tmp = Tensor::empty(shape, i.dtype, MemCategory::kOther, Device::cpu());
  pread_all(s.fd, tmp.raw(), bytes, at, s.path, name);
  check_finite(tmp, s.path, name, first, i.shape.numel());
  out.copy_from(tmp);
}

void write_hf_weights(const std::string& dir,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, int64_t max_shard_bytes) {
  std::vector<std::pair<std::string, TensorBytes>> bytes;
  bytes.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    FD_CHECK(t.defined() && t.device().is_cpu(), "tensor {} must be a defined CPU tensor", name);
    bytes.emplace_back(name, tensor_bytes(t));
  }
  write_hf_tensors(dir, bytes, metadata, max_shard_bytes, /*safetensors_order=*/false);
}

void write_hf_tensors(const std::string& dir,
                      const std::vector<std::pair<std::string, TensorBytes>>& tensors,
                      const std::map<std::string, std::string>& metadata, int64_t max_shard_bytes,
                      bool safetensors_order, const std::map<std::string, size_t>* placement) {
  if (max_shard_bytes <= 0)
    usage_error("{}: max_shard_bytes is {}; it must be positive", dir, max_shard_bytes);
  std::set<std::string> seen;
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    if (!seen.insert(name).second) usage_error("{}: tensor name \"{}\" given twice", dir, name);
    total += t.nbytes;
  }

  using Group = std::vector<std::pair<std::string, TensorBytes>>;
  std::vector<Group> groups(1);
  if (placement != nullptr) {  // the shards the caller names (a directory's own, to rewrite it)
    size_t n = 0;
    for (const auto& nt : tensors) {
      auto it = placement->find(nt.first);
      if (it == placement->end())
        usage_error("{}: tensor \"{}\" has no shard in the placement given", dir, nt.first);
      n = std::max(n, it->second + 1);
    }
    groups.assign(n == 0 ? 1 : n, Group());
    for (const auto& nt : tensors) groups[placement->at(nt.first)].push_back(nt);
    for (size_t g = 0; g < groups.size(); ++g)
      if (groups[g].empty() && groups.size() > 1)
        usage_error("{}: the placement given leaves shard {} of {} empty", dir, g + 1,
                    groups.size());
  } else {
    // Split as transformers' split_torch_state_dict_into_shards does: in order,
    // a new shard when the next tensor would overflow the current one.
    uint64_t in_group = 0;
    for (const auto& nt : tensors) {
      if (!groups.back().empty() && in_group + nt.second.nbytes > uint64_t(max_shard_bytes)) {
        groups.emplace_back();
        in_group = 0;
      }
      groups.back().push_back(nt);
      in_group += nt.second.nbytes;
    }
  }
  if (safetensors_order)
    for (Group& g : groups)
      std::stable_sort(g.begin(), g.end(), [](const auto& a, const auto& b) {
        const int ra = safetensors_dtype_rank(a.second.dtype);
        const int rb = safetensors_dtype_rank(b.second.dtype);
        return ra != rb ? ra > rb : a.first < b.first;
      });

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) runtime_error("{}: cannot create the directory: {}", dir, ec.message());
  std::set<std::string> written;
  if (groups.size() == 1) {
    write_safetensors((fs::path(dir) / kHfWeightsFile).string(), groups[0], metadata);
    written.insert(kHfWeightsFile);
  } else {
    nlohmann::json map = nlohmann::json::object();
    for (size_t g = 0; g < groups.size(); ++g) {
      std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", g + 1, groups.size());
      write_safetensors((fs::path(dir) / file).string(), groups[g], metadata);
      for (const auto& nt : groups[g]) map[nt.first] = file;
      written.insert(file);
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    std::string path = (fs::path(dir) / kHfIndexFile).string();
    const std::string failed =
        write_file_atomically(path, index.dump(2) + "\n", path + ".tmp");  // fsync'ed
    if (!failed.empty())
      runtime_error("{}; free space or fix permissions, then export again", failed);
    written.insert(kHfIndexFile);
  }

  // Weight files of an earlier write that this one did not replace.
  static const std::regex kShard(R"(^model-\d{5}-of-\d{5}\.safetensors$)");
  std::vector<std::string> stale;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string f = entry.path().filename().string();
    bool weights = f == kHfWeightsFile || f == kHfIndexFile || std::regex_match(f, kShard);
    if (weights && !written.count(f)) stale.push_back(f);
  }
  for (const std::string& f : stale)
    if (!fs::remove(fs::path(dir) / f, ec) && ec)
      runtime_error("{}: cannot remove the stale weight file {}: {}", dir, f, ec.message());
}

}  // namespace fd::ckpt
