// The tensor-parallel region operators (lib/ops/tp_regions.h) in one process: on a world of one
// (LocalCommunicator) each is the identity in both directions, bit for bit, in every float
// dtype, and adds into a gradient that already holds a value; on meta with a
// CountingCommunicator (a simulated rank of T) each issues its collectives with the bytes the
// header states. Several ranks: tests/mpi/tp_regions_test.cc.
#include "lib/ops/tp_regions.h"

#include <cstring>
#include <functional>

#include "lib/autograd/tape.h"
#include "lib/dist/counting_communicator.h"
#include "lib/dist/local_communicator.h"
#include "lib/ops/matmul.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;
using RegionOp = std::function<Variable(const Variable&, dist::Communicator&)>;

struct NamedOp {
  const char* name;
  RegionOp op;
};
const std::vector<NamedOp>& all_ops() {
  static const std::vector<NamedOp> ops = {
      {"copy_to_tp_region", copy_to_tp_region},
      {"reduce_from_tp_region", reduce_from_tp_region},
      {"gather_from_sequence_region", gather_from_sequence_region},
      {"reduce_scatter_to_sequence_region", reduce_scatter_to_sequence_region},
  };
  return ops;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(TpRegions, WorldOfOneIsTheIdentityBitForBit) {
  constexpr int64_t B = 2, T = 5, C = 3;
  std::mt19937 rng(7);
  dist::LocalCommunicator one;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor xv = make_tensor(randn(B * T * C, rng), Shape{B, T, C}, dt);
    const Tensor dyv = make_tensor(randn(B * T * C, rng), Shape{B, T, C}, dt);
    for (const NamedOp& op : all_ops()) {
      std::printf("%s %s\n", op.name, name_of(dt));
      Variable x(xv.to(dt), true);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      Variable y = op.op(x, one);
      EXPECT_TRUE(same_bits(y.value(), xv)) << op.name << " forward";
      y.slot()->ensure_grad().copy_from(dyv);
      tape.run_backward();
      ASSERT_TRUE(x.grad().defined()) << op.name;
      EXPECT_TRUE(same_bits(x.grad(), dyv)) << op.name << " backward";
    }
  }
}

// Backward adds into a gradient that is already there (x used twice).
TEST(TpRegions, BackwardAccumulates) {
  constexpr int64_t B = 1, T = 4, C = 2;
  dist::LocalCommunicator one;
  for (const NamedOp& op : all_ops()) {
    Variable x(Tensor::from_vector(std::vector<float>(B * T * C, 1.0f), Shape{B, T, C}), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y1 = op.op(x, one);
    Variable y2 = op.op(x, one);
    y1.slot()->ensure_grad().fill_(0.25f);
    y2.slot()->ensure_grad().fill_(0.5f);
    tape.run_backward();
    for (float g : x.grad().to_vector()) EXPECT_EQ(g, 0.75f) << op.name;
  }
}

TEST(TpRegions, NoGradientNoNode) {
  dist::LocalCommunicator one;
  for (const NamedOp& op : all_ops()) {
    Variable x(Tensor::zeros(Shape{1, 2, 2}), false);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = op.op(x, one);
    EXPECT_EQ(tape.size(), 0u) << op.name;
    EXPECT_FALSE(y.requires_grad()) << op.name;
  }
}

TEST(TpRegions, RejectsBadShapes) {
  dist::CountingCommunicator four(0, 4);
  Variable flat(Tensor::zeros(Shape{6}), true);
  EXPECT_DEATH(gather_from_sequence_region(flat, four), "must be \\(B, T, C\\)");
  Variable odd(Tensor::zeros(Shape{1, 6, 2}), true);
  EXPECT_DEATH(reduce_scatter_to_sequence_region(odd, four), "does not split over 4 ranks");
  Variable ids(Tensor::zeros(Shape{1, 4, 2}, DType::kI32), true);
  EXPECT_DEATH(copy_to_tp_region(ids, four), "float tensor");
}

// On meta, rank 1 of T: forward and backward of each op on x of the shape it takes, the bytes
// its collectives send by the ring model (communicator.h) in the tensor's dtype.
TEST(TpRegions, MetaCountsItsCollectives) {
  constexpr int64_t B = 2, Ts = 3, C = 4;
  for (int S : {2, 4}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int64_t E = int64_t(dtype_size(dt));
      const int64_t full = B * Ts * S * C * E;  // the (B, T, C) buffer's bytes
      struct Expect {
        const char* name;
        Shape x;
        int64_t forward, backward;
      };
      const std::vector<Expect> expect = {
          {"copy_to_tp_region", Shape{B, Ts * S, C}, 0, 2 * (S - 1) * full / S},
          {"reduce_from_tp_region", Shape{B, Ts * S, C}, 2 * (S - 1) * full / S, 0},
          {"gather_from_sequence_region", Shape{B, Ts, C}, (S - 1) * full / S, (S - 1) * full / S},
          {"reduce_scatter_to_sequence_region", Shape{B, Ts * S, C}, (S - 1) * full / S,
           (S - 1) * full / S},
      };
      for (size_t k = 0; k < expect.size(); ++k) {
        DeviceScope scope(Device::meta());
        dist::CountingCommunicator counting(1, S, /*staging=*/false);
        Variable x(Tensor::empty(expect[k].x, dt), true);
        autograd::Tape tape;
        autograd::TapeScope tscope(tape);
        Variable y = all_ops()[k].op(x, counting);
        const int64_t forward = counting.bytes_sent();
        counting.reset_counters();
        y.slot()->ensure_grad();
        tape.run_backward();
        const int64_t backward = counting.bytes_sent();
        std::printf("%s S=%d %s: forward %lld bytes (expected %lld), backward %lld (%lld)\n",
                    expect[k].name, S, name_of(dt), (long long)forward,
                    (long long)expect[k].forward, (long long)backward,
                    (long long)expect[k].backward);
        EXPECT_EQ(forward, expect[k].forward) << expect[k].name;
        EXPECT_EQ(backward, expect[k].backward) << expect[k].name;
        EXPECT_TRUE(x.grad().defined() && x.grad().is_meta()) << expect[k].name;
      }
    }
  }
}

// The kActivations peak of forward + backward: on the CPU over a world of one, and on meta over
// a counting communicator of one (which stages nothing, as LocalCommunicator): the same
// allocations, as the estimate relies on.
int64_t activation_peak(const NamedOp& op, Device device, dist::Communicator& group) {
  DeviceScope scope(device);
  Variable x(Tensor::zeros(Shape{2, 4, 3}, DType::kBF16), true);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = acct.current(MemCategory::kActivations);
  acct.reset_peaks();
  {
    autograd::Tape tape;
    autograd::TapeScope tscope(tape);
    Variable y = op.op(x, group);
    y.slot()->ensure_grad().zero_();
    tape.run_backward();
  }
  return acct.peak(MemCategory::kActivations) - base;
}

TEST(TpRegions, MetaAllocatesAsTheCpu) {
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

// A world of one that tells when an asynchronous all-reduce starts and when it is waited for
// (what copy_to_tp_region_overlapped does in between is the overlap).
class WatchedCommunicator final : public dist::Communicator {
 public:
  std::function<void()> on_start, on_wait;
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  dist::WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype,
                                 dist::ReduceOp op) override {
    return watched(one_.all_reduce_async(buf, count, dtype, op));
  }
  dist::WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t n, DType d) override {
    return watched(one_.reduce_scatter_async(send, recv, n, d));
  }
  dist::WorkPtr all_gather_async(const void* send, void* recv, int64_t n, DType d) override {
    return one_.all_gather_async(send, recv, n, d);
  }
  dist::WorkPtr all_to_all_async(const void* send, void* recv, int64_t n, DType d) override {
    return one_.all_to_all_async(send, recv, n, d);
  }
  dist::WorkPtr broadcast_async(void* buf, int64_t n, DType d, int root) override {
    return one_.broadcast_async(buf, n, d, root);
  }
  dist::WorkPtr barrier_async() override { return one_.barrier_async(); }
  dist::WorkPtr send_recv_async(const void* send, int64_t sn, int dst, void* recv, int64_t rn,
                                int src, DType d) override {
    return one_.send_recv_async(send, sn, dst, recv, rn, src, d);
  }
  std::unique_ptr<Communicator> split(const dist::SplitPlan& plan) override {
    return one_.split(plan);
  }
  void set_timeout(double seconds) override { one_.set_timeout(seconds); }
  [[noreturn]] void abort(int exit_code, const std::string& message) override {
    one_.abort(exit_code, message);
  }

 private:
  // on_start now (the op was just issued), on_wait when it is waited for.
  dist::WorkPtr watched(dist::WorkPtr inner) {
    if (on_start) on_start();
    struct Watched final : dist::Work {
      dist::WorkPtr inner;
      std::function<void()> on_wait;
      void wait() override {
        if (on_wait) on_wait();
        inner->wait();
      }
      bool is_completed() override { return inner->is_completed(); }
    };
    auto w = std::make_shared<Watched>();
    w->inner = std::move(inner);
    w->on_wait = on_wait;
    return w;
  }
  dist::LocalCommunicator one_;
};

// Megatron's asynchronous f: x -> f -> two column-parallel linears (x W1^T, x W2^T, the second
// marked by weight_grads_behind). In backward the input's gradient is all-reduced while the
// weights' gradients are computed: both are still empty when the all-reduce starts and done when
// it is waited for; every gradient has the bits of the plain f's (no overlap, no marker). With
// the overlapped f but no marker nothing is deferred; with the marker but a plain f the weight
// gradients are done when the backward ends.
// Sequence parallelism's gather before the same linears: its reduce-scatter likewise.
TEST(TpRegions, OverlappedFComputesWeightGradientsWhileItsSumRuns) {
  constexpr int64_t M = 6, K = 5, N1 = 4, N2 = 3;
  std::mt19937 rng(11);
  const Tensor xv = make_tensor(randn(M * K, rng), Shape{1, M, K}, DType::kF32);
  const Tensor w1v = make_tensor(randn(N1 * K, rng), Shape{N1, K}, DType::kF32);
  const Tensor w2v = make_tensor(randn(N2 * K, rng), Shape{N2, K}, DType::kF32);
  const Tensor d1 = make_tensor(randn(M * N1, rng), Shape{1, M, N1}, DType::kF32);
  const Tensor d2 = make_tensor(randn(M * N2, rng), Shape{1, M, N2}, DType::kF32);
  struct Grads {
    Tensor x, w1, w2;
  };
  // overlapped: f's overlapped form (or, with gather, the gather, which always is).
  auto run = [&](bool overlapped, bool marked, WatchedCommunicator& comm, bool gather = false) {
    Variable x(xv.to(DType::kF32), true), w1(w1v.to(DType::kF32), true),
        w2(w2v.to(DType::kF32), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    const ops::MatmulOptions t{.trans_a = false, .trans_b = true};
    Variable in = gather       ? gather_from_sequence_region(x, comm)
                  : overlapped ? copy_to_tp_region_overlapped(x, comm)
                               : copy_to_tp_region(x, comm);
    Variable y1 = matmul(in, w1, {}, t);
    Variable y2 = matmul(in, w2, {}, t);
    if (marked) y2 = weight_grads_behind(y2);
    y1.slot()->ensure_grad().copy_from(d1);
    y2.slot()->ensure_grad().copy_from(d2);
    // Marked: deferred until the overlapped f computes them (or, behind a plain f, until the
    // backward ends).
    comm.on_start = [&] {
      EXPECT_EQ(w1.grad().defined() && w2.grad().defined(), !marked)
          << "weight gradients when the all-reduce starts";
    };
    comm.on_wait = [&] {
      EXPECT_EQ(w1.grad().defined() && w2.grad().defined(), !marked || overlapped)
          << "weight gradients when the all-reduce is waited for";
    };
    tape.run_backward();
    return Grads{x.grad(), w1.grad(), w2.grad()};
  };
  WatchedCommunicator comm;
  const Grads plain = run(false, false, comm);
  for (auto [overlapped, marked] : {std::pair{true, true}, {true, false}, {false, true}}) {
    const Grads g = run(overlapped, marked, comm);
    EXPECT_TRUE(same_bits(g.x, plain.x)) << overlapped << marked;
    EXPECT_TRUE(same_bits(g.w1, plain.w1)) << overlapped << marked;
    EXPECT_TRUE(same_bits(g.w2, plain.w2)) << overlapped << marked;
  }
  for (bool marked : {false, true}) {
    const Grads g = run(true, marked, comm, /*gather=*/true);
    EXPECT_TRUE(same_bits(g.x, plain.x)) << "gather " << marked;
    EXPECT_TRUE(same_bits(g.w1, plain.w1)) << "gather " << marked;
    EXPECT_TRUE(same_bits(g.w2, plain.w2)) << "gather " << marked;
  }
}

}  // namespace
}  // namespace fd::ops
