#include "lib/tensor/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "lib/base/atomic_file.h"
#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/base/input_file.h"

namespace fd {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors bytes are little-endian and are copied as-is");

// Larger headers are refused, as the reference implementation does (100 MB):
// a corrupt length must not make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A header nests 3 deep ({name: {"shape": [...]}}); deeper is no safetensors
// file, and is refused before parsing (no recursion over a hostile tree).
constexpr int kMaxHeaderDepth = 8;

// The header's JSON. nlohmann::json keeps the last of duplicate keys without
// a word; a header naming a tensor twice is refused instead (which copy a
// reader takes would decide the model).
nlohmann::json parse_header(const std::string& path, const std::string& text) {
  if (json_nesting_depth(text, kMaxHeaderDepth) > kMaxHeaderDepth)
    usage_error(
        "{}: header nests deeper than {} levels; the file is corrupt or not a "
        "safetensors file",
        path, kMaxHeaderDepth);
  std::set<std::string> names;
  std::string duplicate;
  const nlohmann::json::parser_callback_t note_names =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
            !names.insert(parsed.get<std::string>()).second)
          duplicate = parsed.get<std::string>();
        return true;
      };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, note_names);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    usage_error("{}: header is not valid JSON ({}); the file is corrupt or not a safetensors file",
                path, what);
  }
  if (!duplicate.empty())
    usage_error(
        "{}: the header names tensor \"{}\" twice; the file is corrupt (which copy is "
        "meant cannot be known): re-export or re-download it",
        path, duplicate);
  return header;
}

}  // namespace

// Element size of every dtype the format defines (0: unknown).
size_t safetensors_element_size(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

namespace {

size_t element_size(const std::string& dtype) { return safetensors_element_size(dtype); }

bool to_dtype(const std::string& name, DType* out) {
  if (name == "F32")
    *out = DType::kF32;
  else if (name == "BF16")
    *out = DType::kBF16;
  else if (name == "F16")
    *out = DType::kF16;
  else if (name == "I32")
    *out = DType::kI32;
  else
    return false;
  return true;
}

const char* file_dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

std::string shape_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", d[i]);
  return s + "]";
}

// Parses one tensor entry of the header, validating its fields against the
// size of the data section.
SafetensorsFile::Entry parse_entry(const std::string& path, const std::string& name,
                                   const nlohmann::json& j, uint64_t data_bytes) {
  auto bad = [&](const std::string& what) {
    usage_error("{}: tensor \"{}\": {}; the file is corrupt or not a safetensors file", path, name,
                what);
  };
  if (!j.is_object()) bad("header entry is not a JSON object");
  SafetensorsFile::Entry e;
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) bad("missing or non-string \"dtype\"");
  e.dtype = dt->get<std::string>();
  size_t elem = element_size(e.dtype);
  if (elem == 0) bad(fmt::format("unknown dtype \"{}\"", e.dtype));

  auto sh = j.find("shape");
  if (sh == j.end() || !sh->is_array()) bad("missing or non-array \"shape\"");
  if (sh->size() > size_t(Shape::kMaxDims))
    bad(fmt::format("{} dimensions, more than the {} fdtrain supports", sh->size(),
                    Shape::kMaxDims));
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) bad("\"shape\" holds a value that is not a non-negative integer");
    uint64_t v = d.get<uint64_t>();
    if (v > uint64_t(std::numeric_limits<int64_t>::max())) bad("\"shape\" dimension too large");
    e.shape.push_back(int64_t(v));
    if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v / elem) overflow = true;
    numel *= v;
  }

  auto off = j.find("data_offsets");
  if (off == j.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    bad("\"data_offsets\" must be two non-negative integers [begin, end]");
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end) bad(fmt::format("data_offsets [{}, {}] end before begin", e.begin, e.end));
  if (e.end > data_bytes)
    bad(fmt::format("data_offsets [{}, {}] run past the data section of {} bytes", e.begin, e.end,
                    data_bytes));
  if (overflow || numel * elem != e.end - e.begin)
    bad(fmt::format("shape {} x {} ({} bytes each) does not match data_offsets [{}, {}] ({} bytes)",
                    shape_str(e.shape), e.dtype, elem, e.begin, e.end, e.end - e.begin));
  return e;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) usage_error("{}: no such file; check the path", path);
  // A FIFO would block the open, a device read without end: refused by what they are.
  if (!std::filesystem::is_regular_file(status))
    usage_error("{}: is {}, not a regular file; expected a .safetensors file", path,
                describe_file_type(path));
  uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) usage_error("{}: cannot read its size: {}", path, ec.message());

  std::ifstream in(path, std::ios::binary);
  if (!in) usage_error("{}: cannot open for reading: {}", path, std::strerror(errno));
  if (file_size < 8)
    usage_error("{}: {} bytes, too short to be a safetensors file (8-byte header length first)",
                path, file_size);
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), 8)) usage_error("{}: cannot read the header", path);
  if (n > file_size - 8)
    usage_error(
        "{}: header length {} runs past the end of the file ({} bytes); the file is "
        "truncated or not a safetensors file",
        path, n, file_size);
  if (n > kMaxHeaderBytes)
    usage_error("{}: header length {} exceeds the {}-byte limit; not a safetensors file", path, n,
                kMaxHeaderBytes);
  std::string text(n, '\0');
  if (!in.read(text.data(), std::streamsize(n))) usage_error("{}: cannot read the header", path);

  const nlohmann::json header = parse_header(path, text);
  if (!header.is_object())
    usage_error("{}: header is not a JSON object; not a safetensors file", path);

  SafetensorsFile f;
  f.path_ = path;
  f.data_start_ = 8 + n;
  uint64_t data_bytes = file_size - f.data_start_;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        usage_error("{}: \"__metadata__\" is not a JSON object of strings", path);
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          usage_error("{}: \"__metadata__\" value for \"{}\" is not a string", path, mk);
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    f.entries_[key] = parse_entry(path, key, value, data_bytes);
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, e] : f.entries_)
    if (e.end > e.begin) by_offset.emplace_back(&name, &e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [pn, pe] = by_offset[i - 1];
    const auto& [cn, ce] = by_offset[i];
    if (ce->begin < pe->end)
      usage_error("{}: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap; the file is corrupt",
                  path, *pn, pe->begin, pe->end, *cn, ce->begin, ce->end);
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) usage_error("{}: no tensor named \"{}\"", path_, name);
  return it->second;
}

Shape SafetensorsFile::shape(const std::string& name) const { return Shape(entry(name).shape); }

DType SafetensorsFile::dtype(const std::string& name) const {
  const Entry& e = entry(name);
  DType t;
  if (!to_dtype(e.dtype, &t))
    usage_error(
        "{}: tensor \"{}\" has dtype {}, which fdtrain cannot load (F32, BF16, F16, I32); "
        "convert the file",
        path_, name, e.dtype);
  return t;
}

Tensor SafetensorsFile::load(const std::string& name, MemCategory category) const {
  const Entry& e = entry(name);
  Tensor t =
      Tensor::empty(Shape(e.shape), dtype(name), category, Device::cpu());  // read on the host
  if (t.nbytes() == 0) return t;
  std::ifstream in(path_, std::ios::binary);
  in.seekg(std::streamoff(data_start_ + e.begin));
  if (!in || !in.read(static_cast<char*>(t.raw()), std::streamsize(t.nbytes())))
    runtime_error(
        "{}: cannot read tensor \"{}\" ({} bytes at offset {}); was the file changed or "
        "removed?",
        path_, name, t.nbytes(), data_start_ + e.begin);
  return t;
}

TensorBytes tensor_bytes(const Tensor& t) {
  FD_CHECK(t.defined() && t.device().is_cpu(), "tensor_bytes: a defined CPU tensor is needed");
  TensorBytes b;
  b.dtype = file_dtype_name(t.dtype());
  for (int i = 0; i < t.shape().ndim(); ++i) b.shape.push_back(t.shape()[i]);
  b.data = t.raw();
  b.nbytes = t.nbytes();
  return b;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, TensorBytes>> bytes;
  bytes.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    FD_CHECK(t.defined() && t.device().is_cpu(), "tensor {} must be a defined CPU tensor", name);
    bytes.emplace_back(name, tensor_bytes(t));
  }
  write_safetensors(path, bytes, metadata);
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorBytes>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") usage_error("{}: \"__metadata__\" is not a tensor name", path);
    if (header.contains(name)) usage_error("{}: tensor name \"{}\" given twice", path, name);
    // What a reader checks (parse_entry), checked before anything is written.
    const size_t elem = element_size(t.dtype);
    if (elem == 0) usage_error("{}: tensor \"{}\": unknown dtype \"{}\"", path, name, t.dtype);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) usage_error("{}: tensor \"{}\": negative dimension {}", path, name, d);
      if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / uint64_t(d) / elem)
        usage_error("{}: tensor \"{}\": shape {} overflows", path, name, shape_str(t.shape));
      numel *= uint64_t(d);
    }
    if (numel * elem != t.nbytes || (t.nbytes > 0 && t.data == nullptr))
      usage_error("{}: tensor \"{}\": shape {} x {} is {} bytes, but {} bytes were given", path,
                  name, shape_str(t.shape), t.dtype, numel * elem, t.nbytes);
    header[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // 8-byte aligned data, as the reference does

  // A fresh temporary name (never a file of the user's called path.tmp), renamed into place.
  std::filesystem::path tmp_path;
  const int fd = make_temp_file_beside(path, &tmp_path);
  const std::string tmp = tmp_path.string();
  std::FILE* out = ::fdopen(fd, "wb");
  if (out == nullptr) {
    ::close(fd);
    std::remove(tmp.c_str());
    runtime_error("{}: cannot open for writing: {}", tmp, std::strerror(errno));
  }
  const uint64_t n = text.size();
  bool ok = std::fwrite(&n, 8, 1, out) == 1 && std::fwrite(text.data(), 1, n, out) == n;
  for (const auto& [name, t] : tensors)
    ok = ok && (t.nbytes == 0 || std::fwrite(t.data, 1, t.nbytes, out) == t.nbytes);
  const int err = errno;
  ok = std::fclose(out) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    runtime_error("{}: write failed (disk full?): {}", tmp, std::strerror(err ? err : errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    runtime_error("{}: cannot rename {} into place: {}", path, tmp, std::strerror(e));
  }
}

}  // namespace fd
