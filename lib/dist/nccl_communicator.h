// NcclCommunicator: collectives over NCCL on GPU buffers. Defined in CUDA
// builds only (cuda/nccl_communicator.cc); code that must build either way
// makes one through make_gpu_communicator (gpu_communicator.h).
//
// It rides on a host communicator (MPI, or local for a world of one), which
// supplies rank and size, broadcasts rank 0's ncclUniqueId, carries the f64
// helpers (host doubles: norm partials, metrics) and ends the job on abort().
// Buffers passed to the collectives are device pointers.
//
// Streams: collectives run on a communication stream of their own. Each op
// first makes that stream wait for the work queued so far on the compute
// stream (an event), so it reads the gradients backward has just produced
// while later kernels keep running, then queues everything it does there and
// records its completion event after the last of it. Work::wait() blocks the
// host until that event has fired (polling with short sleeps), so buffers are
// safe to reuse when it returns, as the Communicator contract says;
// Work::order_device_after() instead makes the compute stream wait for the
// event and returns at once (more reductions in flight without the host
// blocking; a later wait() still checks the timeout). An op not finished
// within the timeout (or one NCCL reports failed) aborts the NCCL
// communicator and the job with a diagnostic.
//
// Numerics (communicator.h): with Sum16::kFp32 (the default, as on MPI)
// bf16/f16 sums are widened to fp32 staging buffers on the GPU
// (MemCategory::kComm), summed in fp32 by NCCL and rounded back once; the
// casts run on the communication stream, so the staging kept by
// keep_staging() serves every op in flight (they run one after the other
// there). With Sum16::kNative NCCL sums in place in the 16-bit dtype (no
// staging, no casts, half the bytes), every partial sum rounded to 16 bits in
// the order its algorithm takes, which is not MPI's rank order. Byte counters
// follow the same ring model.
//
// send_recv is ncclSend and ncclRecv in one ncclGroupStart/End on the
// communication stream, ordered after the compute stream like a collective;
// all_to_all likewise, one ncclSend and one ncclRecv per rank (this one's own
// block included) in one group.
// split() splits the host communicator and builds a new NcclCommunicator on
// that sub-communicator, which it owns (and its Works keep alive).
#pragma once

#include <memory>
#include <string>

#include "lib/dist/communicator.h"

namespace fd::dist {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over every rank of `host`: creates the NCCL communicator on
  // the process's GPU (init_cuda_device must have run). `host` must outlive this.
  explicit NcclCommunicator(Communicator& host);
  ~NcclCommunicator() override;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string_view backend() const override { return "nccl"; }

  // split() is collective over this communicator's ranks (and its host's).
  FD_COMMUNICATOR_OVERRIDES;

  // Sum16::kFp32: allocates the largest sum's fp32 staging on the GPU once.
  void keep_staging(Collective c, int64_t count, DType dtype) override;

  // Host doubles go over the host communicator.
  void all_gather_f64(const double* send, double* recv, int64_t send_count) override;

  struct State;

 private:
  // Over `host`, which it owns (split()).
  explicit NcclCommunicator(std::shared_ptr<Communicator> host);
  void begin();

  Communicator& host_;
  std::shared_ptr<State> state_;
};

// The NCCL version this binary runs with ("2.28.3").
std::string nccl_version();

}  // namespace fd::dist
