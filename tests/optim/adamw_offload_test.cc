// The offloaded AdamW (optimizer state in a file, StateStream) against the
// in-memory one: bitwise the same parameters, moments and 16-bit copies over
// several steps with chunk edges inside parameters; the state read back for
// checkpoints and filled from them; and every way the file can go wrong:
// truncated, changed, replaced, shared by two jobs, a full disk, an I/O error.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "lib/base/async_file.h"
#include "lib/base/error.h"
#include "lib/optim/adamw.h"
#include "lib/tensor/host_link.h"
#include "lib/tensor/memory.h"

namespace fd::optim {
namespace {

namespace fs = std::filesystem;
using nn::FlatParamGroup;

// Two groups whose parameters straddle chunk edges (1024-element chunks).
struct Model {
  FlatParamGroup a, b;
  explicit Model(DType dtype)
      : a("a", {{"w", Shape{37, 161}, true}, {"bias", Shape{161}, false}, {"w2", Shape{23, 40}, true}},
          dtype),
        b("b", {{"x", Shape{3000}, false}, {"y", Shape{15, 33}, true}}, dtype) {}
  std::vector<const FlatParamGroup*> groups() const { return {&a, &b}; }
};

void fill(const Tensor& t, std::mt19937& rng, float scale) {
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> v(size_t(t.numel()));
  for (float& x : v) x = n(rng);
  t.copy_from(Tensor::from_vector(v, Shape{t.numel()}));
}

// The shards ZeroEngine would give AdamW for stage 0 (whole groups): fp32
// parameters updated in place, or (16-bit) fp32 master weights with the
// compute copy written back; offloaded mixed precision passes no master.
std::vector<AdamWShard> shards(const Model& m, std::vector<Tensor>* masters, bool offload) {
  std::vector<AdamWShard> out;
  for (const FlatParamGroup* g : m.groups()) {
    const bool mixed = g->dtype() != DType::kF32;
    Tensor master;
    if (mixed && !offload) {
      master = g->flat_params().to(DType::kF32, MemCategory::kMaster);
      masters->push_back(master);
    }
    out.push_back({g, 0, g->numel(), mixed ? master : g->flat_params(), g->flat_grads(),
                   mixed ? g->flat_params() : Tensor()});
  }
  return out;
}

// The error of `fn`, which must throw fd::Error.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (std::getenv("FD_SHOW_ERRORS")) std::printf("%s\n", e.what());
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

class OffloadTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fd_adamw_offload_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  AdamWOffload offload(int64_t buffer_bytes) const {
    AdamWOffload o;
    o.stream.path = (dir_ / "state.bin").string();
    o.stream.path_setting = "zero.offload_optimizer.path";
    o.stream.buffer_bytes = buffer_bytes;
    return o;
  }
  fs::path dir_;
};

AdamWOptions options() {
  AdamWOptions o;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.weight_decay = 0.1f;
  return o;
}

// Buffers for 2048-element chunks (the smallest): each group takes several,
// edges inside parameters.
constexpr int64_t kSmallBuffers = 3 * (3 * 8192 + 4096);

TEST_P(OffloadTest, StepsAreBitwiseTheInMemoryOptimizers) {
  const DType dtype = GetParam();
  Model mem(dtype), off(dtype);
  std::mt19937 rng(5);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
    fill(x->flat_params(), rng, 0.5f);
    y->flat_params().copy_from(x->flat_params());
  }
  std::vector<Tensor> masters;
  AdamW resident(shards(mem, &masters, false), options());
  AdamW streamed(shards(off, &masters, true), options(), offload(kSmallBuffers));
  ASSERT_TRUE(streamed.offloaded());
  EXPECT_TRUE(fs::exists(dir_ / "state.bin"));
  EXPECT_GT(streamed.file_bytes(), 4 * 2 * (mem.a.numel() + mem.b.numel()));
  EXPECT_LE(streamed.state_bytes(), kSmallBuffers);
  for (int step = 1; step <= 4; ++step) {
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
      fill(x->flat_grads(), rng, 0.01f);
      y->flat_grads().copy_from(x->flat_grads());
    }
    const float scale = step == 3 ? 0.5f : 1.0f;  // a clip factor folded into the read
    resident.step(1e-2f * float(step), scale);
    streamed.step(1e-2f * float(step), scale);
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}})
      ASSERT_EQ(0, std::memcmp(x->flat_params().raw(), y->flat_params().raw(),
                               x->flat_params().nbytes()))
          << "step " << step << " group " << x->name();
  }
  // The moments and master weights, read back a piece at a time, are the resident ones.
  for (size_t i = 0; i < 2; ++i) {
    const int64_t n = resident.exp_avg(i).numel();
    const int64_t begin = 700, count = n - 900;  // a range with edges inside chunks
    ASSERT_GT(count, 2048);
    std::vector<float> m, v, p;
    streamed.visit_state(i, begin, count,
                         [&](int64_t offset, const Tensor& master, const Tensor& a,
                             const Tensor& b, const Tensor&) {
                           EXPECT_EQ(offset, int64_t(m.size()));
                           for (const auto& [t, out] : {std::pair{&master, &p}, std::pair{&a, &m},
                                                        std::pair{&b, &v}}) {
                             std::vector<float> x = t->to_vector();
                             out->insert(out->end(), x.begin(), x.end());
                           }
                         });
    ASSERT_EQ(int64_t(m.size()), count);
    std::vector<float> rm = resident.exp_avg(i).flat_slice(begin, count).to_vector();
    std::vector<float> rv = resident.exp_avg_sq(i).flat_slice(begin, count).to_vector();
    const Tensor rp = dtype == DType::kF32 ? mem.groups()[i]->flat_params() : masters[i];
    std::vector<float> rpv = rp.flat_slice(begin, count).to_vector();
    EXPECT_EQ(0, std::memcmp(m.data(), rm.data(), m.size() * 4)) << i;
    EXPECT_EQ(0, std::memcmp(v.data(), rv.data(), v.size() * 4)) << i;
    EXPECT_EQ(0, std::memcmp(p.data(), rpv.data(), p.size() * 4)) << i;
  }
}

// fill_state puts a checkpoint's values in (the 16-bit copy follows the
// master weights), and the next steps continue bitwise as in memory.
TEST_P(OffloadTest, FilledStateContinuesBitwise) {
  const DType dtype = GetParam();
  Model mem(dtype), off(dtype);
  std::mt19937 rng(9);
  std::vector<Tensor> masters;
  AdamW resident(shards(mem, &masters, false), options());
  AdamW streamed(shards(off, &masters, true), options(), offload(kSmallBuffers));
  // A "checkpoint": random master weights and moments, taken into both.
  for (size_t i = 0; i < 2; ++i) {
    const int64_t n = mem.groups()[i]->numel();
    Tensor cm = Tensor::empty(Shape{n}), cv = Tensor::empty(Shape{n}), cp = Tensor::empty(Shape{n});
    fill(cm, rng, 0.01f);
    fill(cv, rng, 0.001f);
    for (int64_t k = 0; k < n; ++k) cv.f32()[k] = std::abs(cv.f32()[k]);
    fill(cp, rng, 0.3f);
    auto put = [&](int64_t offset, const Tensor& master, const Tensor& m, const Tensor& v, const Tensor&) {
      master.copy_from(cp.flat_slice(offset, master.numel()));
      m.copy_from(cm.flat_slice(offset, m.numel()));
      v.copy_from(cv.flat_slice(offset, v.numel()));
    };
    resident.fill_state(i, put);
    streamed.fill_state(i, put);
  }
  resident.set_steps_taken(7);
  streamed.set_steps_taken(7);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}})
    ASSERT_EQ(0, std::memcmp(x->flat_params().raw(), y->flat_params().raw(),
                             x->flat_params().nbytes()));
  for (int step = 0; step < 2; ++step) {
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
      fill(x->flat_grads(), rng, 0.01f);
      y->flat_grads().copy_from(x->flat_grads());
    }
    resident.step(3e-3f);
    streamed.step(3e-3f);
  }
  EXPECT_EQ(streamed.steps_taken(), 9);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}})
    EXPECT_EQ(0, std::memcmp(x->flat_params().raw(), y->flat_params().raw(),
                             x->flat_params().nbytes()));
}

// Host memory (ZeRO-Offload's tier for GPU runs, here on CPU tensors: the same
// chunk walk without the file): bitwise the in-memory optimizer, no file made.
TEST_P(OffloadTest, HostMemoryStepsAreBitwise) {
  const DType dtype = GetParam();
  Model mem(dtype), off(dtype);
  std::mt19937 rng(8);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
    fill(x->flat_params(), rng, 0.5f);
    y->flat_params().copy_from(x->flat_params());
  }
  std::vector<Tensor> masters;
  AdamW resident(shards(mem, &masters, false), options());
  AdamWOffload o = offload(kSmallBuffers);
  o.stream.path.clear();
  AdamW host(shards(off, &masters, true), options(), o);
  EXPECT_TRUE(fs::is_empty(dir_));
  EXPECT_EQ(host.file_bytes(), 0);
  EXPECT_GT(host.host_bytes(), 4 * 2 * (mem.a.numel() + mem.b.numel()));
  EXPECT_EQ(host.state_bytes(), host.host_bytes());  // CPU gradients: no staging
  for (int step = 1; step <= 3; ++step) {
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
      fill(x->flat_grads(), rng, 0.01f);
      y->flat_grads().copy_from(x->flat_grads());
    }
    resident.step(1e-2f, 0.7f);
    host.step(1e-2f, 0.7f);
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}})
      ASSERT_EQ(0, std::memcmp(x->flat_params().raw(), y->flat_params().raw(),
                               x->flat_params().nbytes()))
          << "step " << step;
  }
  std::vector<float> m;
  host.visit_state(1, 0, off.b.numel(),
                   [&](int64_t, const Tensor&, const Tensor& a, const Tensor&, const Tensor&) {
                     std::vector<float> x = a.to_vector();
                     m.insert(m.end(), x.begin(), x.end());
                   });
  EXPECT_EQ(m, resident.exp_avg(1).to_vector());
}

// ZeRO-3 parameter offload: the parameters live in the file too; after each
// step fetch_params gives the in-memory optimizer's parameters bitwise, a
// prefetched shard and one read on demand alike.
TEST_P(OffloadTest, ParametersInTheFileAreTheInMemoryOnes) {
  const DType dtype = GetParam();
  Model mem(dtype), off(dtype);
  std::mt19937 rng(3);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
    fill(x->flat_params(), rng, 0.5f);
    y->flat_params().copy_from(x->flat_params());
  }
  std::vector<Tensor> masters;
  AdamW resident(shards(mem, &masters, false), options());
  AdamWOffload o = offload(3 * (14 * 2048 + 4096));  // 2048-element chunks of 14 bytes each
  o.params_in_file = true;
  std::vector<AdamWShard> sh = shards(off, &masters, true);
  AdamW streamed(sh, options(), o);
  EXPECT_TRUE(streamed.params_in_file());
  EXPECT_GT(streamed.params_staging_bytes(), 0);
  // The engine releases its copy: scribble over it to be sure the file is what counts.
  for (const FlatParamGroup* g : off.groups()) g->flat_params().zero_();
  for (int step = 1; step <= 3; ++step) {
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
      fill(x->flat_grads(), rng, 0.01f);
      y->flat_grads().copy_from(x->flat_grads());
    }
    resident.step(1e-2f);
    streamed.step(1e-2f);
    if (step == 2) streamed.prefetch_params(1);  // b read ahead, a on demand
    for (size_t i : {size_t(0), size_t(1)}) {
      const Tensor got = streamed.fetch_params(i);
      const Tensor& want = mem.groups()[i]->flat_params();
      ASSERT_EQ(got.numel(), want.numel());
      ASSERT_EQ(got.dtype(), dtype);
      EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes())) << "step " << step << " " << i;
    }
  }
  // A changed byte in a parameter field is caught by the fetch that reads it
  // (after a step: the staging buffers hold nothing from before it).
  streamed.step(1e-2f);
  const int fdw = ::open((dir_ / "state.bin").c_str(), O_WRONLY);
  ASSERT_GE(fdw, 0);
  // fp32: the parameters are field 0 (chunk 0 of shard 0 starts after the
  // header); bf16: the last field (the last chunk is shard 1's).
  const bool f32 = dtype == DType::kF32;
  const int64_t at = f32 ? 4096 + 10 : streamed.file_bytes() - 3;
  ASSERT_EQ(::pwrite(fdw, "xyz", 3, at), 3);
  ::close(fdw);
  const std::string e = error_of([&] { streamed.fetch_params(f32 ? 0 : 1); });
  EXPECT_NE(e.find("other bytes"), std::string::npos) << e;
}

// Shards on a device reached through a host link (ZeRO-Offload on a GPU):
// master weights offloaded, the parameters given as the compute copy.
std::vector<AdamWShard> device_shards(const Model& m) {
  std::vector<AdamWShard> out;
  for (const FlatParamGroup* g : m.groups())
    out.push_back({g, 0, g->numel(), Tensor(), g->flat_grads(), g->flat_params()});
  return out;
}

// The GPU's host tier, its ordering on this machine: CPU tensors stand in for
// the device and a worker thread, 1 ms late each time, for its transfer
// stream. Host memory and file alike give the resident optimizer's bits when
// the gradients are downloaded early (shard 0, as ZeRO does when a
// reduce-scatter completes) or by step(), and on_shard_done reports each
// shard once, in order.
TEST_P(OffloadTest, DeviceShardsThroughALinkAreBitwise) {
  const DType dtype = GetParam();
  for (bool in_file : {false, true}) {
    Model mem(dtype), off(dtype);
    std::mt19937 rng(11);
    for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
      fill(x->flat_params(), rng, 0.5f);
      y->flat_params().copy_from(x->flat_params());
    }
    std::vector<Tensor> masters;
    AdamW resident(shards(mem, &masters, false), options());
    AdamWOffload o = offload(kSmallBuffers);
    if (!in_file) o.stream.path.clear();
    o.link = make_thread_link(4, std::chrono::milliseconds(1));
    AdamW linked(device_shards(off), options(), o);
    EXPECT_TRUE(linked.device_shards());
    const int64_t elements = off.a.numel() + off.b.numel();
    EXPECT_EQ(linked.link_bytes(), 2 * elements * int64_t(dtype_size(dtype)));
    for (int step = 1; step <= 3; ++step) {
      for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
        fill(x->flat_grads(), rng, 0.01f);
        y->flat_grads().copy_from(x->flat_grads());
      }
      if (step != 2) linked.stage_grads(0);
      resident.step(1e-2f, 0.7f);
      std::vector<size_t> done;
      linked.step(1e-2f, 0.7f, [&](size_t i) { done.push_back(i); });
      EXPECT_EQ(done, (std::vector<size_t>{0, 1}));
      // The device's gradients may change at once: what was downloaded counts.
      for (const FlatParamGroup* g : off.groups()) g->flat_grads().zero_();
      for (size_t i : {size_t(0), size_t(1)}) linked.params_ready(i);
      for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}})
        ASSERT_EQ(0, std::memcmp(x->flat_params().raw(), y->flat_params().raw(),
                                 x->flat_params().nbytes()))
            << (in_file ? "file" : "host memory") << ", step " << step;
    }
  }
}

// A skipped step (non-finite gradients) forgets its downloads: the next step
// downloads the gradients it is given.
TEST_P(OffloadTest, ForgottenDownloadsAreDownloadedAgain) {
  const DType dtype = GetParam();
  Model mem(dtype), off(dtype);
  std::mt19937 rng(12);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
    fill(x->flat_params(), rng, 0.5f);
    y->flat_params().copy_from(x->flat_params());
  }
  std::vector<Tensor> masters;
  AdamW resident(shards(mem, &masters, false), options());
  AdamWOffload o = offload(kSmallBuffers);
  o.stream.path.clear();
  o.link = make_thread_link(4, std::chrono::microseconds(200));
  AdamW linked(device_shards(off), options(), o);
  for (const FlatParamGroup* g : off.groups()) fill(g->flat_grads(), rng, 1.0f);
  linked.stage_grads(0);
  linked.stage_grads(1);
  linked.forget_staged();  // the step was skipped
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}}) {
    fill(x->flat_grads(), rng, 0.01f);
    y->flat_grads().copy_from(x->flat_grads());
  }
  resident.step(1e-2f);
  linked.step(1e-2f);
  for (size_t i : {size_t(0), size_t(1)}) linked.params_ready(i);
  for (const auto& [x, y] : {std::pair{&mem.a, &off.a}, std::pair{&mem.b, &off.b}})
    EXPECT_EQ(0, std::memcmp(x->flat_params().raw(), y->flat_params().raw(),
                             x->flat_params().nbytes()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OffloadTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class OffloadFaults : public OffloadTest {};

TEST_F(OffloadFaults, ATruncatedFileIsDetectedAtTheNextStep) {
  Model m(DType::kBF16);
  std::vector<Tensor> unused;
  AdamW opt(shards(m, &unused, true), options(), offload(kSmallBuffers));
  opt.step(1e-3f);
  ASSERT_EQ(::truncate((dir_ / "state.bin").c_str(), opt.file_bytes() / 2), 0);
  const std::string e = error_of([&] { opt.step(1e-3f); });
  EXPECT_NE(e.find("state.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST_F(OffloadFaults, ChangedBytesAndAReplacedHeaderAreDetected) {
  Model m(DType::kF32);
  std::vector<Tensor> unused;
  AdamW opt(shards(m, &unused, true), options(), offload(kSmallBuffers));
  opt.step(1e-3f);
  const std::string path = (dir_ / "state.bin").string();
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(::pwrite(fd, junk, sizeof junk, 4096 + 5000), ssize_t(sizeof junk));
  std::string e = error_of([&] { opt.step(1e-3f); });
  EXPECT_NE(e.find("other bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("resume from the last checkpoint"), std::string::npos) << e;
  // A header from another step (the file swapped for an older copy, say).
  ASSERT_EQ(::pwrite(fd, junk, sizeof junk, 40), ssize_t(sizeof junk));  // inside the step field
  ::close(fd);
  e = error_of([&] { opt.step(1e-3f); });
  EXPECT_NE(e.find("no valid header"), std::string::npos) << e;
}

TEST_F(OffloadFaults, TwoJobsCannotShareAFile) {
  Model m(DType::kF32);
  std::vector<Tensor> unused;
  AdamW first(shards(m, &unused, true), options(), offload(kSmallBuffers));
  first.step(1e-3f);
  Model m2(DType::kF32);
  const std::string e =
      error_of([&] { AdamW second(shards(m2, &unused, true), options(), offload(kSmallBuffers)); });
  EXPECT_NE(e.find("in use by another fdtrain job"), std::string::npos) << e;
  EXPECT_NE(e.find("zero.offload_optimizer.path"), std::string::npos) << e;
  first.step(1e-3f);  // the first job's file is untouched
}

TEST_F(OffloadFaults, TheFileIsRemovedWithTheOptimizer) {
  Model m(DType::kF32);
  std::vector<Tensor> unused;
  {
    AdamW opt(shards(m, &unused, true), options(), offload(kSmallBuffers));
    EXPECT_TRUE(fs::exists(dir_ / "state.bin"));
  }
  EXPECT_FALSE(fs::exists(dir_ / "state.bin"));
}

TEST_F(OffloadFaults, AMissingDirectoryIsAClearError) {
  Model m(DType::kF32);
  std::vector<Tensor> unused;
  AdamWOffload o = offload(kSmallBuffers);
  o.stream.path = (dir_ / "no_such_dir" / "state.bin").string();
  const std::string e = error_of([&] { AdamW opt(shards(m, &unused, true), options(), o); });
  EXPECT_NE(e.find("no_such_dir"), std::string::npos) << e;
  EXPECT_NE(e.find("zero.offload_optimizer.path"), std::string::npos) << e;
}

// A real full disk: a 1 MiB tmpfs cannot hold the state; the optimizer is
// refused when it is made (the space is reserved up front), with nothing left.
TEST_F(OffloadFaults, AFullDiskIsRefusedUpFront) {
  const fs::path mnt = dir_ / "small";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  FlatParamGroup big("big", {{"w", Shape{512, 512}, true}}, DType::kF32);  // 2 MiB of m + v
  AdamWOffload o = offload(kSmallBuffers);
  o.stream.path = (mnt / "state.bin").string();
  std::vector<AdamWShard> sh = {{&big, 0, big.numel(), big.flat_params(), big.flat_grads(), {}}};
  const std::string e = error_of([&] { AdamW opt(sh, options(), o); });
  EXPECT_NE(e.find("no space left"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(mnt / "state.bin"));
  ::umount(mnt.c_str());
}

// A disk that fills up or fails during a step (FDTRAIN_IO_FAULT): the step
// ends with the error, nothing left in flight.
TEST_F(OffloadFaults, AnIoErrorDuringAStepEndsItWithTheReason) {
  Model m(DType::kBF16);
  std::vector<Tensor> unused;
  ::setenv("FDTRAIN_IO_FAULT", "enospc:after=200000", 1);
  detail::reset_io_fault_for_testing();
  {
    AdamW opt(shards(m, &unused, true), options(), offload(kSmallBuffers));
    const std::string e = error_of([&] {
      for (int i = 0; i < 5; ++i) opt.step(1e-3f);
    });
    EXPECT_NE(e.find("no space left"), std::string::npos) << e;
  }
  ::setenv("FDTRAIN_IO_FAULT", "eio:after=100000", 1);
  detail::reset_io_fault_for_testing();
  {
    AdamW opt(shards(m, &unused, true), options(), offload(kSmallBuffers));
    const std::string e = error_of([&] {
      for (int i = 0; i < 5; ++i) opt.step(1e-3f);
    });
    EXPECT_NE(e.find("Input/output error"), std::string::npos) << e;
  }
  ::unsetenv("FDTRAIN_IO_FAULT");
  detail::reset_io_fault_for_testing();
}

// On the meta device (estimates) the buffers are counted and no file is made.
TEST(OffloadMeta, BuffersAreAccountedAndNoFileIsMade) {
  DeviceScope meta(Device::meta());
  FlatParamGroup g("g", {{"w", Shape{4096, 64}, true}}, DType::kBF16);
  Tensor compute = g.flat_params();
  AdamWOffload o;
  o.stream.path = "/nonexistent/state.bin";
  o.stream.buffer_bytes = int64_t(1) << 20;
  MemoryAccountant& acc = MemoryAccountant::global();
  const int64_t before = acc.current(MemCategory::kOptimizer);
  AdamW opt({{&g, 0, g.numel(), Tensor(), g.flat_grads(), compute}}, options(), o);
  EXPECT_EQ(acc.current(MemCategory::kOptimizer) - before, opt.state_bytes());
  EXPECT_LE(opt.state_bytes(), int64_t(1) << 20);
  EXPECT_EQ(opt.file_bytes(), 4096 + 3 * 4 * g.numel());
  opt.step(1e-3f);
  EXPECT_FALSE(fs::exists("/nonexistent/state.bin"));
}

// The contract the engine relies on: step() returns with the last upload
// still in flight (so the next forward overlaps it), and the device's
// parameters are the updated ones only after params_ready.
TEST(OffloadLink, TheUploadIsOnlyOrderedByParamsReady) {
  FlatParamGroup g("g", {{"w", Shape{64, 64}, true}}, DType::kF32);
  g.flat_params().fill_(0.25f);
  g.flat_grads().fill_(1.0f);
  AdamWOffload o;  // host memory
  o.stream.buffer_bytes = 3 * (3 * 8192 + 4096);
  o.link = make_thread_link(2, std::chrono::milliseconds(300));
  AdamW opt({{&g, 0, g.numel(), Tensor(), g.flat_grads(), g.flat_params()}}, options(), o);
  opt.step(1e-2f);
  EXPECT_EQ(g.flat_params().to_vector()[0], 0.25f);  // 300 ms to go
  opt.params_ready(0);
  EXPECT_LT(g.flat_params().to_vector()[0], 0.25f);
}

// The counting device (fdtrain estimate of a GPU run): the link's buffers are
// accounted in the optimizer category, and nothing moves.
TEST(OffloadLink, MetaLinkBuffersAreAccounted) {
  DeviceScope meta(Device::meta());
  FlatParamGroup g("g", {{"w", Shape{4096, 64}, true}}, DType::kBF16);
  AdamWOffload o;
  o.stream.buffer_bytes = int64_t(1) << 20;
  o.link = make_host_link(Device::meta(), 2);
  MemoryAccountant& acc = MemoryAccountant::global();
  const int64_t before = acc.current(MemCategory::kOptimizer);
  AdamW opt({{&g, 0, g.numel(), Tensor(), g.flat_grads(), g.flat_params()}}, options(), o);
  EXPECT_EQ(opt.link_bytes(), 2 * 2 * g.numel());
  EXPECT_EQ(acc.current(MemCategory::kOptimizer) - before, opt.state_bytes());
  EXPECT_EQ(opt.state_bytes(), opt.host_bytes() + opt.link_bytes());
  opt.stage_grads(0);
  opt.step(1e-3f);
  opt.params_ready(0);
}

}  // namespace
}  // namespace fd::optim
