// Fuzz target: the token-file reader (lib/data: TokenFile, TokenDataset).
//
// Input: the bytes of a data file, written to a scratch file named *.bin (so
// that format detection may pick either format) and opened in every format
// with a few vocabulary sizes. Checked: open() and TokenDataset either
// succeed or throw fd::Error; a file that opens can be read end to end, and
// every token it yields is below the vocabulary size (open()'s promise).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/data/token_dataset.h"
#include "lib/data/token_file.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void check_tokens(const fd::data::TokenFile& f, int64_t vocab) {
  std::vector<int32_t> buf(4096);
  for (int64_t begin = 0; begin < f.size(); begin += int64_t(buf.size())) {
    int64_t n = std::min<int64_t>(int64_t(buf.size()), f.size() - begin);
    f.copy(begin, n, buf.data());
    for (int64_t i = 0; i < n; ++i) {
      if (buf[size_t(i)] < 0 || buf[size_t(i)] >= vocab) {
        std::fprintf(stderr, "token_file_fuzz: token %d at %lld not in [0, %lld)\n",
                     buf[size_t(i)], static_cast<long long>(begin + i),
                     static_cast<long long>(vocab));
        std::abort();
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fd::data::TokenFormat;
  const std::string path = fd::fuzz::scratch_dir() + "/tokens.bin";
  fd::fuzz::write_file(path, fd::fuzz::as_view(data, size));
  for (TokenFormat format : {TokenFormat::kAuto, TokenFormat::kLlmc, TokenFormat::kText}) {
    for (int64_t vocab : {int64_t(50257), int64_t(256), int64_t(97)}) {
      fd::fuzz::expect_clean([&] {
        fd::data::TokenFile f = fd::data::TokenFile::open(path, format, vocab);
        check_tokens(f, vocab);
      });
    }
  }
  fd::fuzz::expect_clean([&] {
    fd::data::DatasetOptions o;
    o.train_files = {path};
    o.val_fraction = 0.1;
    o.seq_len = 8;
    o.vocab_size = 50304;
    fd::data::TokenDataset ds(o);
    // Each split holds at least seq_len + 1 tokens (the constructor's promise).
    std::vector<int32_t> seq(size_t(o.seq_len + 1));
    ds.train().copy(ds.train().size() - int64_t(seq.size()), int64_t(seq.size()), seq.data());
    if (ds.has_val()) ds.val().copy(0, int64_t(seq.size()), seq.data());
    (void)ds.summary();
  });
  return 0;
}
