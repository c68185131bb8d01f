// The Ulysses exchange (lib/ops/ulysses.h) in one process: on a world of one (LocalCommunicator)
// both ops are the identity in both directions, bit for bit, in every float dtype, through a
// copy, and add into a gradient that already holds a value; on meta with a
// CountingCommunicator (a simulated rank of S) each issues one all-to-all forward and one
// backward with the bytes the header states, and allocates what the CPU allocates. Several
// ranks: tests/mpi/ulysses_test.cc.
#include "lib/ops/ulysses.h"

#include <cstring>
#include <functional>

#include "lib/autograd/tape.h"
#include "lib/dist/counting_communicator.h"
#include "lib/dist/local_communicator.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;
using UlyssesOp = std::function<Variable(const Variable&, int, dist::Communicator&)>;

struct NamedOp {
  const char* name;
  UlyssesOp op;
};
const std::vector<NamedOp>& all_ops() {
  static const std::vector<NamedOp> ops = {
      {"sequence_to_heads", sequence_to_heads},
      {"heads_to_sequence", heads_to_sequence},
  };
  return ops;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Ulysses, WorldOfOneIsTheIdentityBitForBitThroughACopy) {
  constexpr int64_t B = 2, T = 5, H = 3, D = 2;
  std::mt19937 rng(11);
  dist::LocalCommunicator one;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor xv = make_tensor(randn(B * T * H * D, rng), Shape{B, T, H * D}, dt);
    const Tensor dyv = make_tensor(randn(B * T * H * D, rng), Shape{B, T, H * D}, dt);
    for (const NamedOp& op : all_ops()) {
      std::printf("%s %s\n", op.name, name_of(dt));
      Variable x(xv.to(dt), true);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      Variable y = op.op(x, int(H), one);
      EXPECT_TRUE(same_bits(y.value(), xv)) << op.name << " forward";
      EXPECT_NE(y.value().raw(), x.value().raw()) << op.name << ": a copy, not a view";
      y.slot()->ensure_grad().copy_from(dyv);
      tape.run_backward();
      ASSERT_TRUE(x.grad().defined()) << op.name;
      EXPECT_TRUE(same_bits(x.grad(), dyv)) << op.name << " backward";
    }
  }
}

// Backward adds into a gradient that is already there (x used twice).
TEST(Ulysses, BackwardAccumulates) {
  dist::LocalCommunicator one;
  for (const NamedOp& op : all_ops()) {
    Variable x(Tensor::from_vector(std::vector<float>(12, 1.0f), Shape{1, 3, 4}), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y1 = op.op(x, 2, one);
    Variable y2 = op.op(x, 2, one);
    y1.slot()->ensure_grad().fill_(0.25f);
    y2.slot()->ensure_grad().fill_(0.5f);
    tape.run_backward();
    for (float g : x.grad().to_vector()) EXPECT_EQ(g, 0.75f) << op.name;
  }
}

TEST(Ulysses, NoGradientNoNode) {
  dist::LocalCommunicator one;
  for (const NamedOp& op : all_ops()) {
    Variable x(Tensor::zeros(Shape{1, 2, 4}), false);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = op.op(x, 2, one);
    EXPECT_EQ(tape.size(), 0u) << op.name;
    EXPECT_FALSE(y.requires_grad()) << op.name;
  }
}

TEST(UlyssesDeathTest, RejectsBadShapesAndHeadCounts) {
  dist::CountingCommunicator four(0, 4);
  Variable flat(Tensor::zeros(Shape{24}), true);
  EXPECT_DEATH(sequence_to_heads(flat, 4, four), "must be \\(B, T, C\\)");
  Variable x(Tensor::zeros(Shape{1, 2, 24}), true);
  EXPECT_DEATH(sequence_to_heads(x, 6, four), "6 heads do not split over the 4 ranks");
  EXPECT_DEATH(sequence_to_heads(x, 5, four), "5 heads do not divide the 24 columns");
  EXPECT_DEATH(sequence_to_heads(x, 0, four), "0 heads do not divide");
  Variable odd(Tensor::zeros(Shape{1, 6, 6}), true);
  EXPECT_DEATH(heads_to_sequence(odd, 4, four), "6 positions does not split over 4 ranks");
  Variable y(Tensor::zeros(Shape{1, 8, 6}), true);
  EXPECT_DEATH(heads_to_sequence(y, 6, four), "6 heads do not split over the 4 ranks");
  Variable ids(Tensor::zeros(Shape{1, 4, 8}, DType::kI32), true);
  EXPECT_DEATH(sequence_to_heads(ids, 4, four), "float tensor");
}

// On meta, rank 1 of S: forward and backward of each op, one all-to-all of numel(x) elements
// each, (S-1)/S of it sent (communicator.h) in the tensor's dtype.
TEST(Ulysses, MetaCountsOneAllToAllEachWay) {
  constexpr int64_t B = 2, Ts = 3, H = 8, D = 5;
  for (int S : {2, 4}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int64_t E = int64_t(dtype_size(dt));
      const int64_t bytes = (S - 1) * B * Ts * H * D * E / S;
      const Shape shapes[2] = {Shape{B, Ts, H * D}, Shape{B, Ts * S, H / S * D}};
      for (size_t k = 0; k < all_ops().size(); ++k) {
        DeviceScope scope(Device::meta());
        dist::CountingCommunicator counting(1, S, /*staging=*/false);
        Variable x(Tensor::empty(shapes[k], dt), true);
        autograd::Tape tape;
        autograd::TapeScope tscope(tape);
        Variable y = all_ops()[k].op(x, int(H), counting);
        EXPECT_EQ(y.shape(), shapes[1 - k]) << all_ops()[k].name;
        const int64_t forward = counting.bytes_sent();
        counting.reset_counters();
        y.slot()->ensure_grad();
        tape.run_backward();
        const int64_t backward = counting.bytes_sent();
        std::printf("%s S=%d %s: forward %lld bytes, backward %lld (expected %lld each)\n",
                    all_ops()[k].name, S, name_of(dt), (long long)forward, (long long)backward,
                    (long long)bytes);
        EXPECT_EQ(forward, bytes) << all_ops()[k].name;
        EXPECT_EQ(backward, bytes) << all_ops()[k].name;
        EXPECT_TRUE(x.grad().defined() && x.grad().is_meta()) << all_ops()[k].name;
      }
    }
  }
}

// The kActivations peak of forward + backward: on the CPU over a world of one, and on meta over
// a counting communicator of one (which stages nothing, as LocalCommunicator): the same
// allocations, as the estimate relies on.
int64_t activation_peak(const NamedOp& op, Device device, dist::Communicator& group) {
  DeviceScope scope(device);
  Variable x(Tensor::zeros(Shape{2, 4, 6}, DType::kBF16), true);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = acct.current(MemCategory::kActivations);
  acct.reset_peaks();
  {
    autograd::Tape tape;
    autograd::TapeScope tscope(tape);
    Variable y = op.op(x, 3, group);
    y.slot()->ensure_grad().zero_();
    tape.run_backward();
  }
  return acct.peak(MemCategory::kActivations) - base;
}

TEST(Ulysses, MetaAllocatesAsTheCpu) {
  for (const NamedOp& op : all_ops()) {
    dist::LocalCommunicator one;
    dist::CountingCommunicator counting(0, 1);
    const int64_t cpu = activation_peak(op, Device::cpu(), one);
    const int64_t meta = activation_peak(op, Device::meta(), counting);
    std::printf("%s: activation peak %lld bytes on the CPU, %lld on meta\n", op.name,
                (long long)cpu, (long long)meta);
    EXPECT_EQ(meta, cpu) << op.name;
    EXPECT_GT(cpu, 0) << op.name;
  }
}

}  // namespace
}  // namespace fd::ops
