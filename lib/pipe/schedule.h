// Pipeline schedules: what each stage does, in order, for one optimizer step
// of M micro-batches (batch.accumulation) through P stages.
//
// A stage's program is a list of instructions: the forward or backward of one
// micro-batch through the stage's blocks, and exchanges with its neighbours.
// What crosses a boundary between stage s and s + 1, per micro-batch m:
//   activation  s -> s + 1  the output of s's forward of m, the input of s+1's;
//   gradient    s + 1 -> s  the gradient of that activation, the output of s+1's
//                           backward of m and the input of s's.
// So stage s > 0 receives m's activation before its forward of m, s < P - 1
// sends its output after; s < P - 1 receives m's gradient before its backward
// of m, s > 0 sends its input gradient after.
//
// Exchanges. The communicator runs one point-to-point op at a time per rank,
// in issue order, and an op completes only when its peers have posted the
// matching halves (large messages rendezvous: dist::Communicator::
// send_recv_async). Two neighbours that each send before they receive, as
// separate ops, would wait on each other for ever in 1F1B's steady state. So,
// as Megatron-LM's non-interleaved 1F1B does (send_forward_recv_backward,
// send_backward_recv_forward), every send is posted together with the receive
// that follows it, as one exchange of at most one send and one receive, to the
// same neighbour or to the other one: one Communicator::send_recv_async.
// Between a pair of stages, messages match in issue order.
//
// Order of the backwards. Both schedules run the backwards in micro-batch
// order 0, 1, ..., M - 1, as 1F1B does by construction. GPipe could run them
// in any order (it holds all M micro-batches' activations anyway), and the
// order is chosen for the numbers: every parameter then accumulates its
// gradient over micro-batches 0, 1, ..., M - 1, the order of plain gradient
// accumulation without a pipeline, so the sums are bitwise the same.
//
// Schedules (P stages, M micro-batches, stage s):
//   k1F1B   Megatron's non-interleaved one-forward-one-backward: warm-up of
//           min(P - s - 1, M) forwards, then a steady state alternating one
//           forward and one backward, then the remaining backwards. Stage s
//           holds at most min(P - s, M) micro-batches' activations.
//   kGPipe  all M forwards, then all M backwards: holds all M.
// With forward and backward each taking the same time on every stage and free
// transfers, both take (M + P - 1) (forward + backward) per step, of which
// each stage idles (P - 1)/(M + P - 1): bubble_fraction().
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fd::pipe {

enum class Schedule { k1F1B, kGPipe };
std::string_view to_string(Schedule schedule);  // "1f1b", "gpipe"

enum class Payload {
  kActivation,  // forward: from stage s to s + 1
  kGradient,    // backward: from stage s + 1 to s
};

// One message: what it carries and for which micro-batch.
struct Transfer {
  Payload payload = Payload::kActivation;
  int micro = 0;
  bool operator==(const Transfer&) const = default;
};

struct Instruction {
  enum class Kind {
    kForward,   // the forward of `micro` through the stage's segments
    kBackward,  // its backward (the stage's gradients accumulate)
    kExchange,  // one send_recv with the neighbours: `send` and/or `recv`
  };
  Kind kind = Kind::kForward;
  int micro = -1;                // kForward, kBackward
  std::optional<Transfer> send;  // kExchange: sent to send_peer()
  std::optional<Transfer> recv;  // kExchange: received from recv_peer()
  bool operator==(const Instruction&) const = default;
};

// The stage that receives what `stage` sends (activation: stage + 1, gradient:
// stage - 1), and the stage that sends what `stage` receives (activation:
// stage - 1, gradient: stage + 1).
int send_peer(const Transfer& t, int stage);
int recv_peer(const Transfer& t, int stage);

// "F3", "B0", or an exchange by Megatron's names: "send_forward(2)",
// "recv_backward(0)", "send_forward(2)+recv_backward(0)".
std::string to_string(const Instruction& instruction);

// The program of `stage` (0 <= stage < stages) for `micro_batches` >= 1
// micro-batches. Every micro-batch's forward and backward appear exactly once,
// the backwards in micro-batch order, and the programs of all stages together
// complete under the rendezvous rule above (tests/pipe/schedule_test.cc runs
// them).
std::vector<Instruction> stage_program(Schedule schedule, int stages, int micro_batches, int stage);

// Micro-batches whose activations `stage` holds at once, at most: those whose
// forward ran and whose backward has not. k1F1B: min(stages - stage,
// micro_batches); kGPipe: micro_batches.
int max_in_flight(Schedule schedule, int stages, int micro_batches, int stage);

// The share of a step each stage idles with balanced stages and free
// transfers, (stages - 1) / (micro_batches + stages - 1); 0 for one stage.
double bubble_fraction(int stages, int micro_batches);

}  // namespace fd::pipe
