// NcclCommunicator on a world of one rank (CUDA builds only: tests/CMakeLists.txt
// adds this file to gpu_tests when the CUDA backend is built; skipped without a
// GPU). One rank makes every sum exact, so what this checks is the plumbing
// of 16-bit sums: with Sum16::kFp32 the widening and the rounding back on the
// communication stream (bf16 -> fp32 -> bf16 is exact), with Sum16::kNative
// the collective in place in bf16, and in both modes several reductions in
// flight completed by Work::order_device_after only (the compute stream waits
// on their events, the host does not) before device work reads the results.
// The data-parallel numerics need 2+ GPUs (tests/gpu/device_check.sh).
#include "lib/dist/nccl_communicator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "lib/dist/local_communicator.h"
#include "lib/tensor/device.h"
#include "lib/tensor/dtype.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {
namespace {

TEST(NcclOneRank, SixteenBitSumsInFlightAreOrderedOnTheDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no usable GPU: " << cuda_unavailable_reason();
  init_cuda_device(0);
  DeviceScope on_gpu(Device::cuda(0));
  LocalCommunicator host;
  NcclCommunicator nccl(host);
  constexpr int kInFlight = 4;
  const int64_t n = (int64_t(1) << 20) + 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (Sum16 mode : {Sum16::kFp32, Sum16::kNative}) {
    SCOPED_TRACE(sum16_name(mode));
    nccl.set_sum16(mode);
    nccl.keep_staging(Collective::kReduceScatter, n, DType::kBF16);
    std::vector<std::vector<float>> want(kInFlight);
    std::vector<Tensor> in, out, ar;
    std::vector<WorkPtr> works;
    for (int k = 0; k < kInFlight; ++k) {
      for (int64_t i = 0; i < n; ++i)
        want[size_t(k)].push_back(bf16_to_f32(f32_to_bf16(d(rng))));  // exact in bf16
      in.push_back(Tensor::from_vector(want[size_t(k)], Shape{n}, DType::kBF16));
      out.push_back(Tensor::zeros(Shape{n}, DType::kBF16));
      ar.push_back(Tensor::from_vector(want[size_t(k)], Shape{n}, DType::kBF16));
      works.push_back(
          nccl.reduce_scatter_async(in.back().raw(), out.back().raw(), n, DType::kBF16));
      works.push_back(nccl.all_reduce_async(ar.back().raw(), n, DType::kBF16, ReduceOp::kSum));
    }
    for (const WorkPtr& w : works) w->order_device_after();
    // Device work queued now (copies on the compute stream) must see the results.
    for (int k = 0; k < kInFlight; ++k) {
      Tensor rs = Tensor::empty(Shape{n}, DType::kBF16);
      rs.copy_from(out[size_t(k)]);
      Tensor all = Tensor::empty(Shape{n}, DType::kBF16);
      all.copy_from(ar[size_t(k)]);
      EXPECT_EQ(rs.to_vector(), want[size_t(k)]) << "reduce_scatter " << k;
      EXPECT_EQ(all.to_vector(), want[size_t(k)]) << "all_reduce " << k;
    }
    for (const WorkPtr& w : works) w->wait();
  }
}

// All-to-all on one rank: one ncclSend and one ncclRecv to itself in a group, the block moved
// as it is (bf16 and f32), completed by wait(); 0 bytes counted.
TEST(NcclOneRank, AllToAllMovesTheOneBlock) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no usable GPU: " << cuda_unavailable_reason();
  init_cuda_device(0);
  DeviceScope on_gpu(Device::cuda(0));
  LocalCommunicator host;
  NcclCommunicator nccl(host);
  const int64_t n = (int64_t(1) << 16) + 5;
  std::vector<float> want;
  for (int64_t i = 0; i < n; ++i) want.push_back(float(i % 251) - 125.0f);  // exact in bf16
  for (DType dt : {DType::kBF16, DType::kF32}) {
    Tensor send = Tensor::from_vector(want, Shape{n}, dt);
    Tensor recv = Tensor::zeros(Shape{n}, dt);
    nccl.all_to_all_async(send.raw(), recv.raw(), n, dt)->wait();
    EXPECT_EQ(recv.to_vector(), want) << dtype_name(dt);
  }
  EXPECT_EQ(nccl.bytes_sent(), 0);
}

}  // namespace
}  // namespace fd::dist
