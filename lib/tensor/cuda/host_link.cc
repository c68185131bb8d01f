// The GPU's HostLink: copies on a transfer stream of their own, so that they
// run beside the compute stream's kernels, from and into page-locked host
// memory, so that they are asynchronous DMA transfers.
#include <cstdio>
#include <vector>

#include "kernels/kernels.h"
#include "lib/base/check.h"
#include "lib/tensor/cuda_memory.h"
#include "lib/tensor/host_link.h"

namespace fd::cuda_memory {
namespace {

class CudaLink final : public HostLink {
 public:
  explicit CudaLink(int slots) : HostLink(slots) {
    stream_ = kernels::stream_create();
    before_ = kernels::event_create();
    for (int i = 0; i < slots; ++i) done_.push_back(kernels::event_create());
  }
  ~CudaLink() override {
    try {  // copies in flight read or write buffers about to be freed: finish them
      kernels::stream_synchronize(stream_);
      for (void* e : done_) kernels::event_destroy(e);
      kernels::event_destroy(before_);
      kernels::stream_destroy(stream_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fdtrain: closing the host link: %s\n", e.what());
    }
  }
  Tensor host_buffer(int64_t n, DType dtype, MemCategory category) override {
    auto storage =
        std::make_shared<Storage>(size_t(n) * dtype_size(dtype), category, Storage::Pinned{});
    return Tensor::view_of(std::move(storage), 0, Shape{n}, dtype);
  }
  void copy(int slot, const Tensor& dst, const Tensor& src) override {
    check(slot, dst, src);
    const Tensor& host = dst.is_cuda() ? src : dst;
    FD_CHECK(dst.is_cuda() != src.is_cuda() && host.storage()->pinned(),
             "the host link copies between the GPU and its pinned host buffers");
    // After what the compute stream has queued (the values being copied, or
    // the last readers of what is overwritten).
    kernels::event_record(before_, kernels::compute_stream());
    kernels::stream_wait_event(stream_, before_);
    kernels::copy_async(dst.raw(), src.raw(), dst.nbytes(), stream_);
    kernels::event_record(done_[size_t(slot)], stream_);
  }
  void wait(int slot) override { kernels::event_synchronize(done_.at(size_t(slot))); }
  void order(int slot) override {
    kernels::stream_wait_event(kernels::compute_stream(), done_.at(size_t(slot)));
  }

 private:
  void* stream_ = nullptr;
  void* before_ = nullptr;
  std::vector<void*> done_;
};

}  // namespace

std::unique_ptr<HostLink> make_link(int slots) { return std::make_unique<CudaLink>(slots); }

}  // namespace fd::cuda_memory
