// HostLink: asynchronous copies between a device's tensors and host buffers,
// ordered per slot. ZeRO-Offload's host tier (optim::AdamW) rides on it:
// each gradient shard goes down as soon as its reduction completes, while
// backward goes on, and each parameter shard goes back up as soon as the CPU
// has updated it, while the CPU updates the next one and, under stage 3,
// while the next forward already runs on the shards that arrived.
//
// A slot is a sequence of copies; its copies complete in order. The host side
// learns that they are done with wait() (it blocks), the device side with
// order() (work queued on the device afterwards runs after them; the caller
// does not block). Three kinds:
//   - a GPU (CUDA builds): a transfer stream, one event per slot, host
//     buffers in page-locked memory (Storage::Pinned);
//   - the counting device (Device::meta(), fdtrain estimate): buffers are
//     accounted, copies do nothing;
//   - a worker thread over CPU tensors (make_thread_link): the same ordering
//     contract with a delay before each copy, so the tests on this machine
//     catch a host read before wait() or a device read before order().
#pragma once

#include <chrono>
#include <memory>

#include "lib/tensor/tensor.h"

namespace fd {

class HostLink {
 public:
  virtual ~HostLink() = default;
  int slots() const { return slots_; }
  // A host buffer of n elements that the link copies to and from (pinned on a GPU).
  virtual Tensor host_buffer(int64_t n, DType dtype, MemCategory category) = 0;
  // Starts copying src into dst (equal dtype and size; one is a host_buffer,
  // the other on the link's device) after the device work queued so far.
  // Neither may be written (dst: read) until the slot is waited for.
  virtual void copy(int slot, const Tensor& dst, const Tensor& src) = 0;
  // Blocks until every copy started on `slot` has completed.
  virtual void wait(int slot) = 0;
  // Device work queued from now on runs after every copy started on `slot`.
  virtual void order(int slot) = 0;

 protected:
  explicit HostLink(int slots) : slots_(slots) {}
  void check(int slot, const Tensor& dst, const Tensor& src) const;

 private:
  int slots_;
};

// The link for tensors on `device`: a GPU's, or the counting device's (meta).
// A CPU has no link: its tensors are host memory already (nullptr).
std::unique_ptr<HostLink> make_host_link(Device device, int slots);
// A CPU stand-in for tests: copies run on one worker thread, each after
// `delay`; order() blocks like wait() (the CPU is the device).
std::unique_ptr<HostLink> make_thread_link(int slots, std::chrono::microseconds delay);

}  // namespace fd
