// CountingCommunicator: rank `rank` of a simulated world of `size` ranks, for
// running a rank's setup and training step in one process on the meta device
// (lib/tensor/device.h) to measure its memory and traffic.
//
// It moves no data: every collective completes when it is issued (the Work is
// already complete) and leaves the buffers as they are, so pass meta tensors'
// Tensor::comm_data() (nullptr) or host memory whose contents do not matter.
// The f64 helpers (all_gather_f64, all_reduce_f64) see every rank holding this
// rank's values, so the engine's control flow (norms, loss averages) runs.
//
// What it counts is what MpiCommunicator counts at the same world size:
//   - bytes_sent() and control_bytes(): the ring model (communicator.h), per
//     collective, from the same counts and dtypes;
//   - at size > 1, the staging MpiCommunicator allocates for 16-bit sums
//     (MemCategory::kComm, sum16_staging_bytes() in the sum16() mode: fp32
//     copies, or every rank's 16-bit contribution): what keep_staging() asks
//     to keep is held from that call on, as MPI holds it; a sum that does not
//     fit it stages a buffer of its own, which here is allocated and freed
//     (on meta) when the collective is issued, so the accountant's kComm peak
//     includes it on top of what is held at that moment. (MPI holds such a
//     buffer while the collective runs, one collective at a time, while the
//     compute thread goes on; that overlap is not modelled, which is why
//     ZeroEngine keeps its staging.) At size 1 the trainer uses
//     LocalCommunicator, which stages nothing, and so does this.
//   - send_recv: the bytes this rank sends, exactly (no staging on MPI);
//   - all_to_all: (n-1)/n of the send buffer, no staging (MPI moves 16-bit
//     blocks as raw bits).
// Not counted: MpiCommunicator's copy-out buffer for a reduce-scatter whose
// send and recv overlap (ZeroEngine never issues one).
//
// Sub-communicators: split() gives the counting communicator of this rank's
// group of the plan (its place and size there, which the plan tells without
// the other ranks), with the same staging setting and counters of its own:
// what MpiCommunicator's split would count for this rank.
#pragma once

#include <memory>

#include "lib/dist/communicator.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {

class CountingCommunicator final : public Communicator {
 public:
  // 0 <= rank < size. `staging` false leaves the MPI staging out (the
  // estimate tells it apart from the engine's own buffers that way).
  CountingCommunicator(int rank, int size, bool staging = true);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "counting"; }

  // send_recv checks like the other backends, counts the bytes sent, moves
  // nothing; abort prints the message (prefixed with the simulated rank) and
  // exits, as the local backend does.
  FD_COMMUNICATOR_OVERRIDES;

  // As MpiCommunicator (with staging): holds the kept staging from now on.
  void keep_staging(Collective c, int64_t count, DType dtype) override;

  // recv gets this rank's values in every rank's slot; counted as control traffic.
  void all_gather_f64(const double* send, double* recv, int64_t send_count) override;

 private:
  // Account the staging of a 16-bit sum of kind `c` in the sum16() mode
  // (kComm, on meta), freed at once; nothing when it fits the kept staging.
  void stage(Collective c, int64_t count, DType dtype) const;

  int rank_;
  int size_;
  bool staging_asked_;
  bool staging_;  // size > 1 and staging asked for
  Tensor kept_;   // keep_staging()'s (meta)
};

}  // namespace fd::dist
