#include "lib/engine/rank_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "lib/base/build_id.h"
#include "lib/base/error.h"
#include "lib/base/host_name.h"
#include "lib/base/sha256.h"
#include "lib/base/version.h"
#include "lib/config/load.h"

namespace fd::engine {

namespace {

// One rank's identity, as raw bytes (gathered as i32 words: the communicator moves raw bits).
struct Header {
  char host[64] = {};
  char version[16] = {};
  char build[48] = {};  // hex of the build ID (20 bytes: 40 characters)
  uint8_t recipe[32] = {};
  int32_t fields = 0;
  int32_t pad = 0;
};
static_assert(sizeof(Header) % 4 == 0);

void put(char* dst, size_t size, const std::string& s) {
  std::memcpy(dst, s.data(), std::min(size - 1, s.size()));
}
std::string get(const char* src, size_t size) { return std::string(src, strnlen(src, size)); }

// A 64-bit digest of one field: its path, value and block items.
uint64_t field_digest(const config::RecipeField& f) {
  Sha256 sha;
  const std::string text =
      f.path + '\0' + f.value + '\0' + fmt::format("{}", fmt::join(f.items, "\n"));
  sha.update(text.data(), text.size());
  const std::array<uint8_t, 32> d = sha.digest();
  uint64_t out = 0;
  std::memcpy(&out, d.data(), sizeof out);
  return out;
}

}  // namespace

void check_ranks_agree(dist::Communicator& world, const config::Recipe& recipe) {
  const int n = world.size();
  if (n <= 1) return;
  const std::vector<config::RecipeField> fields = config::recipe_fields(recipe);
  Header mine;
  put(mine.host, sizeof mine.host, host_name());
  put(mine.version, sizeof mine.version, version());
  put(mine.build, sizeof mine.build, build_id());
  const std::string yaml = config::to_yaml(recipe);
  Sha256 sha;
  sha.update(yaml.data(), yaml.size());
  const std::array<uint8_t, 32> digest = sha.digest();
  std::memcpy(mine.recipe, digest.data(), digest.size());
  mine.fields = int32_t(fields.size());
  constexpr int64_t kWords = sizeof(Header) / 4;
  std::vector<Header> all(static_cast<size_t>(n));
  world.all_gather(&mine, all.data(), kWords, DType::kI32);

  const Header& zero = all[0];
  auto where = [&](int r) {
    return fmt::format("rank {} (host {})", r, get(all[size_t(r)].host, 64));
  };
  for (int r = 1; r < n; ++r) {
    const Header& h = all[size_t(r)];
    const std::string v = get(h.version, 16), v0 = get(zero.version, 16);
    const std::string b = get(h.build, 48), b0 = get(zero.build, 48);
    if (v != v0 || b != b0)
      usage_error(
          "{} runs fdtrain {} (build {}) but {} runs fdtrain {} (build {}): every rank must run "
          "the same fdtrain build; install the same binary on every host (or one on a shared "
          "filesystem) and start again",
          where(r), v, b.empty() ? "without a build ID" : b, where(0), v0,
          b0.empty() ? "without a build ID" : b0);
  }
  bool same = true;
  for (int r = 1; r < n; ++r)
    same = same && std::memcmp(all[size_t(r)].recipe, zero.recipe, sizeof zero.recipe) == 0;
  if (same) return;
  // Which fields differ: per-field digests, when every rank has as many fields (else the recipes
  // differ in their optional sections).
  int first = 1;
  while (std::memcmp(all[size_t(first)].recipe, zero.recipe, sizeof zero.recipe) == 0) ++first;
  bool counts_agree = true;
  for (int r = 1; r < n; ++r) counts_agree = counts_agree && all[size_t(r)].fields == zero.fields;
  std::string what;
  if (counts_agree) {
    std::vector<uint64_t> digests;
    for (const config::RecipeField& f : fields) digests.push_back(field_digest(f));
    std::vector<uint64_t> gathered(size_t(n) * digests.size());
    world.all_gather(digests.data(), gathered.data(), int64_t(digests.size()) * 2, DType::kI32);
    std::vector<std::string> differ;
    for (size_t i = 0; i < fields.size(); ++i)
      if (gathered[size_t(first) * fields.size() + i] != gathered[i])
        differ.push_back(fields[i].path);
    // rank 0's values of the first few, as every rank prints the message rank 0 prints.
    std::vector<std::string> shown;
    for (size_t i = 0; i < fields.size() && shown.size() < 4; ++i)
      if (std::find(differ.begin(), differ.end(), fields[i].path) != differ.end())
        shown.push_back(fmt::format("{} ({} on rank {})", fields[i].path,
                                    fields[i].block
                                        ? fmt::format("[{}]", fmt::join(fields[i].items, ", "))
                                        : fields[i].value,
                                    world.rank()));
    what = fmt::format("{} field(s) differ: {}{}", differ.size(), fmt::join(shown, ", "),
                       differ.size() > shown.size() ? ", ..." : "");
  } else {
    what = fmt::format("its recipe has {} fields, rank 0's {} (other sections)",
                       all[size_t(first)].fields, zero.fields);
  }
  usage_error(
      "{} resolved another recipe than {}: {}; every rank must read the same recipe and "
      "overrides: put the recipe (and its includes and data) on a filesystem every host "
      "shares, or the same copy on each, and start again",
      where(first), where(0), what);
}

}  // namespace fd::engine
