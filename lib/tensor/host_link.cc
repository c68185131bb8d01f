#include "lib/tensor/host_link.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/base/check.h"
#include "lib/tensor/cuda_memory.h"

namespace fd {

void HostLink::check(int slot, const Tensor& dst, const Tensor& src) const {
  FD_CHECK(slot >= 0 && slot < slots_, "host link slot {} of {}", slot, slots_);
  FD_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(),
           "host link copy of {} {} into {} {}", src.numel(), dtype_name(src.dtype()),
           dst.numel(), dtype_name(dst.dtype()));
}

namespace {

// The counting device: buffers are accounted like any meta tensor; nothing moves.
class MetaLink final : public HostLink {
 public:
  explicit MetaLink(int slots) : HostLink(slots) {}
  Tensor host_buffer(int64_t n, DType dtype, MemCategory category) override {
    return Tensor::empty(Shape{n}, dtype, category, Device::meta());
  }
  void copy(int slot, const Tensor& dst, const Tensor& src) override { check(slot, dst, src); }
  void wait(int) override {}
  void order(int) override {}
};

class ThreadLink final : public HostLink {
 public:
  ThreadLink(int slots, std::chrono::microseconds delay)
      : HostLink(slots), delay_(delay), started_(size_t(slots)), done_(size_t(slots)) {
    worker_ = std::thread([this] { work(); });
  }
  ~ThreadLink() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  Tensor host_buffer(int64_t n, DType dtype, MemCategory category) override {
    return Tensor::empty(Shape{n}, dtype, category, Device::cpu());
  }
  void copy(int slot, const Tensor& dst, const Tensor& src) override {
    check(slot, dst, src);
    FD_CHECK(!dst.is_cuda() && !src.is_cuda(), "the thread link copies CPU tensors");
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({slot, dst, src});
      ++started_[size_t(slot)];
    }
    cv_.notify_all();
  }
  void wait(int slot) override {
    FD_CHECK(slot >= 0 && slot < slots(), "host link slot {} of {}", slot, slots());
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[size_t(slot)] == started_[size_t(slot)]; });
  }
  void order(int slot) override { wait(slot); }

 private:
  struct Job {
    int slot;
    Tensor dst, src;
  };
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left to copy
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(delay_);
      job.dst.copy_from(job.src);
      const int slot = job.slot;
      job = Job{};  // drop the views before reporting the copy done
      lock.lock();
      ++done_[size_t(slot)];
      cv_.notify_all();
    }
  }
  std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<int64_t> started_, done_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<HostLink> make_host_link(Device device, int slots) {
  if (device.is_meta()) return std::make_unique<MetaLink>(slots);
  if (device.is_cuda()) return cuda_memory::make_link(slots);
  return nullptr;
}

std::unique_ptr<HostLink> make_thread_link(int slots, std::chrono::microseconds delay) {
  return std::make_unique<ThreadLink>(slots, delay);
}

}  // namespace fd
