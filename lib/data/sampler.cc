#include "lib/data/sampler.h"

#include "lib/base/check.h"
#include "lib/base/rng.h"

namespace fd::data {
namespace {

// Stream constants keep train and validation draws independent of each other
// and of every other user of the seed (initialisation, dropout).
constexpr uint64_t kTrainStream = 0x7472'6169'6e00'0001ULL;  // "train"
constexpr uint64_t kValStream = 0x7661'6c00'0000'0002ULL;    // "val"

int64_t draw_start(uint64_t h, const TokenStream& split, int seq_len) {
  FD_CHECK(seq_len > 0 && split.size() >= int64_t(seq_len) + 1, "split of {} tokens for seq_len {}",
           split.size(), seq_len);
  // Starts 0 .. N - seq_len - 1 inclusive: the target of the last position
  // is then token N - 1.
  return int64_t(uniform_below(h, uint64_t(split.size() - seq_len)));
}

void fill(const TokenStream& split, int64_t start, int seq_len, int32_t* tokens, int32_t* targets) {
  split.copy(start, seq_len, tokens);
  split.copy(start + 1, seq_len, targets);
}

}  // namespace

int64_t Sampler::train_start(int64_t step, int64_t global_index, int seq_len) const {
  uint64_t h = hash_words(hash_words(seed_, kTrainStream), uint64_t(step), uint64_t(global_index));
  return draw_start(h, dataset_.train(), seq_len);
}

int64_t Sampler::val_start(int64_t batch_index, int64_t global_index, int seq_len) const {
  uint64_t h =
      hash_words(hash_words(seed_, kValStream), uint64_t(batch_index), uint64_t(global_index));
  return draw_start(h, dataset_.val(), seq_len);
}

void Sampler::sample_train(int64_t step, int micro_index, int rank, int world_size, int batch,
                           int seq_len, int32_t* tokens, int32_t* targets) const {
  FD_CHECK(0 <= rank && rank < world_size && batch > 0 && micro_index >= 0,
           "rank {} of {}, batch {}, micro-batch {}", rank, world_size, batch, micro_index);
  // Micro-batch m of every rank before micro-batch m + 1 of any: with the
  // global batch fixed, any (world, accumulation, micro) split of a step
  // covers global indices 0 .. G - 1 exactly once.
  const int64_t first = (int64_t(micro_index) * world_size + rank) * batch;
  for (int b = 0; b < batch; ++b) {
    int64_t start = train_start(step, first + b, seq_len);
    size_t row = size_t(b) * size_t(seq_len);
    fill(dataset_.train(), start, seq_len, tokens + row, targets + row);
  }
}

void Sampler::sample_val(int64_t batch_index, int rank, int world_size, int batch, int seq_len,
                         int32_t* tokens, int32_t* targets) const {
  FD_CHECK(dataset_.has_val(), "sample_val without a validation split");
  FD_CHECK(0 <= rank && rank < world_size && batch > 0, "rank {} of {}, batch {}", rank, world_size,
           batch);
  for (int b = 0; b < batch; ++b) {
    int64_t global = int64_t(rank) * batch + b;
    int64_t start = val_start(batch_index, global, seq_len);
    size_t row = size_t(b) * size_t(seq_len);
    fill(dataset_.val(), start, seq_len, tokens + row, targets + row);
  }
}

}  // namespace fd::data
