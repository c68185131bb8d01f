#include "lib/engine/dataset.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/data/token_file.h"

namespace fd::engine {

std::unique_ptr<data::TokenDataset> open_dataset(const config::Recipe& r) {
  data::DatasetOptions o;
  o.train_files = r.data.train;
  o.val_files = r.data.val;
  o.format = r.data.format == config::DataFormat::kTokens ? data::TokenFormat::kLlmc
                                                          : data::TokenFormat::kText;
  o.val_fraction = r.data.val_fraction;
  o.seq_len = r.data.seq_len;
  o.vocab_size = r.model.vocab_size;
  try {
    return std::make_unique<data::TokenDataset>(o);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUsage) throw;
    // Find the file at fault to point at its line in the recipe.
    auto locate = [&](const std::vector<std::string>& files, const char* key) -> std::string {
      for (size_t i = 0; i < files.size(); ++i) {
        try {
          data::TokenFile::open(files[i], o.format, o.vocab_size);
        } catch (const Error&) {
          return fmt::format("{}: {}[{}]: ", r.where(fmt::format("{}[{}]", key, i)), key, i);
        }
      }
      return "";
    };
    std::string where = locate(o.train_files, "data.train");
    if (where.empty()) where = locate(o.val_files, "data.val");
    if (where.empty()) where = fmt::format("{}: ", r.where("data"));
    throw Error(ErrorKind::kUsage, where + e.what());
  }
}

}  // namespace fd::engine
