// The ring model's bytes per rank per optimizer step: the oracle the traffic
// a step counts (Communicator::bytes_sent) is held to, P padded parameters
// of e bytes, N ranks, a micro-batches:
//   stages 0-2: (a + 1) * P * (N-1)/N * e  (a reduce-scatter per micro-batch, one all-gather)
//   stage 3:    3 * a * P * (N-1)/N * e    (per micro-batch: gather for forward, again for
//                                           backward, reduce-scatter)
#pragma once

#include <cstdint>

namespace fd::engine {

inline int64_t comm_bytes_per_step(int stage, int world, int accumulation, int64_t P,
                                   int element_bytes = 4) {
  const int64_t pass = (P / world) * (world - 1) * element_bytes;
  const int64_t passes = stage == 3 ? 3 * int64_t(accumulation) : int64_t(accumulation) + 1;
  return passes * pass;
}

}  // namespace fd::engine
