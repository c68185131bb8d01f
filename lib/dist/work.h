// Work: the handle of one collective in flight (c10d's Work, trimmed).
//
// A communicator's *_async call returns a Work at once; the collective runs in
// the background (on the MPI backend, on the communicator's communication
// thread). The buffers passed to the call must stay valid and untouched until
// wait() has returned.
#pragma once

#include <memory>

namespace fd::dist {

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective has completed on this rank; rethrows its
  // failure. Past the communicator's timeout the whole job is aborted
  // (Communicator::abort) instead of returning. Calling it again is a no-op.
  virtual void wait() = 0;
  // True once the result is in the caller's buffers (never blocks).
  virtual bool is_completed() = 0;
  // Orders the device work queued from now on (the compute stream) after the
  // collective, blocking the host only where the backend cannot do better.
  // NCCL: the compute stream waits for the op's completion event; the host
  // goes on at once. Host backends (local, MPI, counting): wait(). After it,
  // device work may read the results and the caller may free or reuse the
  // buffers (their memory goes to device work ordered after the op); the host
  // itself must still wait() before it reads them, and wait() is also where a
  // device-ordered op's failure or timeout is reported, so call it later.
  virtual void order_device_after() { wait(); }
};
using WorkPtr = std::shared_ptr<Work>;

// A Work that was complete when it was made (synchronous backends, empty ops).
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

}  // namespace fd::dist
