// Pipeline schedules: each stage's program does every micro-batch's forward
// and backward once, backwards in micro-batch order, holds the activations the
// schedule promises, and all stages' programs together run to the end under
// rendezvous semantics with every message matching (simulator.h), for P in
// 1..8 and M in 1..32. The simulator itself is shown to catch a deadlock.
#include "lib/pipe/schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/pipe/simulator.h"

namespace fd::pipe {
namespace {

using testing::all_programs;
using testing::SimResult;
using testing::simulate;

constexpr Schedule kSchedules[] = {Schedule::k1F1B, Schedule::kGPipe};

std::string show(const std::vector<Instruction>& program) {
  std::string s;
  for (const Instruction& in : program) s += (s.empty() ? "" : " ") + to_string(in);
  return s;
}

std::string show(const SimResult& r) {
  std::string s;
  for (const std::string& e : r.errors) s += e + "\n";
  return s;
}

TEST(PipeSchedule, Names) {
  EXPECT_EQ(to_string(Schedule::k1F1B), "1f1b");
  EXPECT_EQ(to_string(Schedule::kGPipe), "gpipe");
  Instruction x;
  x.kind = Instruction::Kind::kExchange;
  x.send = Transfer{Payload::kActivation, 2};
  x.recv = Transfer{Payload::kGradient, 0};
  EXPECT_EQ(to_string(x), "send_forward(2)+recv_backward(0)");
  EXPECT_EQ(send_peer(*x.send, 1), 2);
  EXPECT_EQ(recv_peer(*x.recv, 1), 2);
  EXPECT_EQ(send_peer(Transfer{Payload::kGradient, 0}, 1), 0);
  EXPECT_EQ(recv_peer(Transfer{Payload::kActivation, 0}, 1), 0);
}

// The programs written out for P = 4, M = 6: Megatron's non-interleaved 1F1B,
// with each send posted together with the receive after it.
TEST(PipeSchedule, OneFOneBProgramsReadAsMegatrons) {
  EXPECT_EQ(show(stage_program(Schedule::k1F1B, 4, 6, 0)),
            "F0 send_forward(0) F1 send_forward(1) F2 send_forward(2) "
            "F3 send_forward(3)+recv_backward(0) B0 "
            "F4 send_forward(4)+recv_backward(1) B1 "
            "F5 send_forward(5)+recv_backward(2) B2 "
            "recv_backward(3) B3 recv_backward(4) B4 recv_backward(5) B5");
  EXPECT_EQ(show(stage_program(Schedule::k1F1B, 4, 6, 2)),
            "recv_forward(0) F0 send_forward(0)+recv_forward(1) "
            "F1 send_forward(1)+recv_backward(0) B0 send_backward(0)+recv_forward(2) "
            "F2 send_forward(2)+recv_backward(1) B1 send_backward(1)+recv_forward(3) "
            "F3 send_forward(3)+recv_backward(2) B2 send_backward(2)+recv_forward(4) "
            "F4 send_forward(4)+recv_backward(3) B3 send_backward(3)+recv_forward(5) "
            "F5 send_forward(5)+recv_backward(4) B4 send_backward(4)+recv_backward(5) "
            "B5 send_backward(5)");
  EXPECT_EQ(show(stage_program(Schedule::k1F1B, 4, 6, 3)),
            "recv_forward(0) F0 B0 send_backward(0)+recv_forward(1) F1 B1 "
            "send_backward(1)+recv_forward(2) F2 B2 send_backward(2)+recv_forward(3) F3 B3 "
            "send_backward(3)+recv_forward(4) F4 B4 send_backward(4)+recv_forward(5) F5 B5 "
            "send_backward(5)");
  EXPECT_EQ(show(stage_program(Schedule::kGPipe, 3, 2, 1)),
            "recv_forward(0) F0 send_forward(0)+recv_forward(1) F1 "
            "send_forward(1)+recv_backward(0) B0 send_backward(0)+recv_backward(1) B1 "
            "send_backward(1)");
  // One stage: gradient accumulation, nothing to exchange.
  EXPECT_EQ(show(stage_program(Schedule::k1F1B, 1, 3, 0)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(show(stage_program(Schedule::kGPipe, 1, 3, 0)), "F0 F1 F2 B0 B1 B2");
}

// Each stage: every forward and backward once; the backward of m after its
// forward; backwards (and forwards) in micro-batch order; the most
// micro-batches in flight is max_in_flight(); exchanges hold at most one send
// and one receive and are never empty.
TEST(PipeSchedule, EveryMicroBatchOnceBackwardsInOrder) {
  for (Schedule sched : kSchedules)
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 32; ++M)
        for (int s = 0; s < P; ++s) {
          const std::vector<Instruction> prog = stage_program(sched, P, M, s);
          SCOPED_TRACE(std::string(to_string(sched)) + " P=" + std::to_string(P) + " M=" +
                       std::to_string(M) + " stage " + std::to_string(s) + ": " + show(prog));
          std::vector<int> forwards, backwards;
          std::vector<bool> alive(size_t(M), false);
          int in_flight = 0, peak = 0;
          for (const Instruction& in : prog) {
            switch (in.kind) {
              case Instruction::Kind::kForward:
                ASSERT_TRUE(0 <= in.micro && in.micro < M);
                ASSERT_FALSE(alive[size_t(in.micro)]);
                alive[size_t(in.micro)] = true;
                forwards.push_back(in.micro);
                peak = std::max(peak, ++in_flight);
                break;
              case Instruction::Kind::kBackward:
                ASSERT_TRUE(0 <= in.micro && in.micro < M);
                ASSERT_TRUE(alive[size_t(in.micro)])
                    << "backward of " << in.micro << " before its forward";
                alive[size_t(in.micro)] = false;
                backwards.push_back(in.micro);
                --in_flight;
                break;
              case Instruction::Kind::kExchange:
                ASSERT_TRUE(in.send || in.recv);
                ASSERT_EQ(in.micro, -1);
                break;
            }
          }
          std::vector<int> in_order(static_cast<size_t>(M));
          for (int m = 0; m < M; ++m) in_order[size_t(m)] = m;
          EXPECT_EQ(forwards, in_order);
          EXPECT_EQ(backwards, in_order);
          EXPECT_EQ(in_flight, 0);
          EXPECT_EQ(peak, max_in_flight(sched, P, M, s));
        }
}

// The halves each stage needs: s > 0 receives m's activation before its
// forward of m and sends m's input gradient after its backward; s < P - 1
// sends its output after the forward and receives the gradient before the
// backward. Checked as positions in the program.
TEST(PipeSchedule, EachComputeHasItsTransfersAroundIt) {
  for (Schedule sched : kSchedules)
    for (int P = 1; P <= 6; ++P)
      for (int M = 1; M <= 12; ++M)
        for (int s = 0; s < P; ++s) {
          const std::vector<Instruction> prog = stage_program(sched, P, M, s);
          SCOPED_TRACE(std::string(to_string(sched)) + " P=" + std::to_string(P) + " M=" +
                       std::to_string(M) + " stage " + std::to_string(s) + ": " + show(prog));
          auto position = [&](auto pred) {
            for (size_t i = 0; i < prog.size(); ++i)
              if (pred(prog[i])) return int(i);
            return -1;
          };
          for (int m = 0; m < M; ++m) {
            auto is = [&](Instruction::Kind k) {
              return [=](const Instruction& in) { return in.kind == k && in.micro == m; };
            };
            auto sends = [&](Payload p) {
              return [=](const Instruction& in) {
                return in.send && in.send->payload == p && in.send->micro == m;
              };
            };
            auto recvs = [&](Payload p) {
              return [=](const Instruction& in) {
                return in.recv && in.recv->payload == p && in.recv->micro == m;
              };
            };
            const int f = position(is(Instruction::Kind::kForward));
            const int b = position(is(Instruction::Kind::kBackward));
            const int ra = position(recvs(Payload::kActivation));
            const int sa = position(sends(Payload::kActivation));
            const int rg = position(recvs(Payload::kGradient));
            const int sg = position(sends(Payload::kGradient));
            EXPECT_EQ(ra >= 0, s > 0) << m;
            EXPECT_EQ(sg >= 0, s > 0) << m;
            EXPECT_EQ(sa >= 0, s < P - 1) << m;
            EXPECT_EQ(rg >= 0, s < P - 1) << m;
            if (ra >= 0) {
              EXPECT_LT(ra, f) << m;
            }
            if (sa >= 0) {
              EXPECT_GT(sa, f) << m;
            }
            if (rg >= 0) {
              EXPECT_LT(rg, b) << m;
            }
            if (sg >= 0) {
              EXPECT_GT(sg, b) << m;
            }
          }
        }
}

// All stages together: no deadlock, every message matched with the right
// kind and micro-batch, for P in 1..8 and M in 1..32.
TEST(PipeSchedule, AllStagesRunToTheEndWithRendezvous) {
  for (Schedule sched : kSchedules)
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 32; ++M) {
        const SimResult r = simulate(all_programs(sched, P, M));
        EXPECT_TRUE(r.completed && r.errors.empty())
            << to_string(sched) << " P=" << P << " M=" << M << "\n"
            << show(r);
      }
}

// With forward f and backward b the same on every stage and free transfers,
// a step takes (M + P - 1)(f + b) in both schedules, so each stage idles
// bubble_fraction() of it.
TEST(PipeSchedule, SimulatedIdleTimeIsTheBubble) {
  EXPECT_EQ(bubble_fraction(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 16), 1.0 / 17.0);
  for (Schedule sched : kSchedules)
    for (int P = 1; P <= 8; ++P)
      for (int M : {1, 2, 3, 4, 7, 8, 16, 32}) {
        const double f = 1.0, b = 2.0;
        const SimResult r = simulate(all_programs(sched, P, M), f, b);
        ASSERT_TRUE(r.completed) << show(r);
        EXPECT_DOUBLE_EQ(r.makespan(), (M + P - 1) * (f + b))
            << to_string(sched) << " P=" << P << " M=" << M;
        for (int s = 0; s < P; ++s)
          EXPECT_NEAR(1.0 - r.busy[size_t(s)] / r.makespan(), bubble_fraction(P, M), 1e-12);
      }
}

// 1F1B's point: the first stage holds P micro-batches' activations, GPipe's M.
TEST(PipeSchedule, InFlightBounds) {
  EXPECT_EQ(max_in_flight(Schedule::k1F1B, 4, 16, 0), 4);
  EXPECT_EQ(max_in_flight(Schedule::k1F1B, 4, 16, 3), 1);
  EXPECT_EQ(max_in_flight(Schedule::k1F1B, 4, 2, 0), 2);
  EXPECT_EQ(max_in_flight(Schedule::kGPipe, 4, 16, 3), 16);
}

// Splits every exchange into its send, then its receive, as separate ops:
// what naive code that blocks on each does.
std::vector<std::vector<Instruction>> send_then_receive(
    std::vector<std::vector<Instruction>> programs) {
  for (auto& prog : programs) {
    std::vector<Instruction> out;
    for (const Instruction& in : prog) {
      if (in.kind != Instruction::Kind::kExchange || !in.send || !in.recv) {
        out.push_back(in);
        continue;
      }
      Instruction send = in, recv = in;
      send.recv.reset();
      recv.send.reset();
      out.push_back(send);
      out.push_back(recv);
    }
    prog = std::move(out);
  }
  return programs;
}

// The simulator catches a deadlock: 1F1B with blocking send-then-receive
// waits for ever as soon as two neighbours are both in the steady state
// (P >= 2, M >= 2), each sending to the other first. GPipe's sends never form
// a cycle, so it completes either way; and M = 1 has no steady state.
TEST(PipeSchedule, SimulatorCatchesTheNaiveDeadlock) {
  const SimResult r = simulate(send_then_receive(all_programs(Schedule::k1F1B, 2, 2)));
  EXPECT_FALSE(r.completed);
  EXPECT_EQ(show(r),
            "stage 0 waits for ever at instruction 3 (send_forward(1))\n"
            "stage 1 waits for ever at instruction 3 (send_backward(0))\n");
  for (int P = 2; P <= 8; ++P)
    for (int M = 1; M <= 16; ++M) {
      EXPECT_EQ(simulate(send_then_receive(all_programs(Schedule::k1F1B, P, M))).completed, M == 1)
          << "P=" << P << " M=" << M;
      EXPECT_TRUE(simulate(send_then_receive(all_programs(Schedule::kGPipe, P, M))).completed)
          << "P=" << P << " M=" << M;
    }
}

// And a message whose halves disagree (or that has no receiver) is reported.
TEST(PipeSchedule, SimulatorCatchesMismatchedMessages) {
  auto programs = all_programs(Schedule::k1F1B, 3, 4);
  for (Instruction& in : programs[1])
    if (in.recv && in.recv->payload == Payload::kActivation && in.recv->micro == 2) {
      in.recv->micro = 3;
      break;
    }
  SimResult r = simulate(programs);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(show(r).find("message 2 from stage 0 to 1: sent as send_forward(2), received as "
                         "recv_forward(3)"),
            std::string::npos)
      << show(r);
  auto missing = all_programs(Schedule::kGPipe, 2, 2);
  missing[1].erase(missing[1].begin());  // stage 1 never receives micro-batch 0's activation
  r = simulate(missing);
  EXPECT_NE(show(r).find("stage 0 sends 2 message(s) to stage 1, which receives 1"),
            std::string::npos)
      << show(r);
}

}  // namespace
}  // namespace fd::pipe
