// Fault injection for multi-rank tests: FDTRAIN_FAULT makes one rank die,
// stall or throw at one training step, so that tests can check that the job
// ends (non-zero, with a diagnostic) instead of hanging.
//
//   FDTRAIN_FAULT=kill:rank=1:step=5    raise(SIGKILL) on rank 1 at step 5
//   FDTRAIN_FAULT=stall:rank=1:step=5   raise(SIGSTOP): the peers time out
//   FDTRAIN_FAULT=throw:rank=0:step=3   throw fd::Error(kRuntime, "injected fault ...")
//   FDTRAIN_FAULT=ckptkill:rank=1:step=10:point=2
//                                       SIGKILL rank 1 while writing the checkpoint after step 10
//                                       at point 1 (before its shard), 2 (after its shard),
//                                       3 (rank 0: manifest written, directory not renamed) or
//                                       4 (rank 0: renamed, `latest` not yet updated)
//   FDTRAIN_FAULT=ckptslow:rank=1:step=10:ms=2000
//                                       rank 1 writes the checkpoint after step 10 2000 ms late
//                                       (a slow disk: an asynchronous save still in flight)
//   FDTRAIN_FAULT=ckptfail:rank=1:step=10
//                                       rank 1's shard of the checkpoint after step 10 fails to
//                                       write (as on an I/O error), after the file is created
//   FDTRAIN_FAULT=inf:rank=0:step=3     rank 0's gradients are non-finite at step 3 (the
//                                       trainer seeds its backward with inf): the step is skipped
//
// Steps are 0-based (the first step is step 0).
//
// rank= and step= may come in either order; both are required. Unset or
// empty means no fault.
#pragma once

#include <cstdint>
#include <string_view>

namespace fd::dist {

struct FaultSpec {
  enum Kind { kNone, kKill, kStall, kThrow, kInf, kCkptKill, kCkptSlow, kCkptFail } kind = kNone;
  int rank = -1;
  int64_t step = -1;
  int point = 0;   // kCkptKill: where in the checkpoint write
  int64_t ms = 0;  // kCkptSlow: the delay
};

// Parses a FDTRAIN_FAULT value; throws a usage fd::Error naming FDTRAIN_FAULT
// and the expected form when it is malformed. "" gives kNone.
FaultSpec parse_fault(std::string_view text);
// parse_fault(getenv("FDTRAIN_FAULT")), kNone when unset.
FaultSpec fault_from_env();
// True when `spec` is of `kind` and names this rank and step.
bool fault_fires(const FaultSpec& spec, FaultSpec::Kind kind, int rank, int64_t step);

// Fires a kill, stall or throw `spec` if it names this rank and step (see the top of this file).
void inject_fault(const FaultSpec& spec, int rank, int64_t step);

}  // namespace fd::dist
