#include "lib/pipe/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "lib/base/check.h"

namespace fd::pipe {

std::string_view to_string(Schedule schedule) {
  switch (schedule) {
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kGPipe:
      return "gpipe";
  }
  return "?";
}

int send_peer(const Transfer& t, int stage) {
  return t.payload == Payload::kActivation ? stage + 1 : stage - 1;
}

int recv_peer(const Transfer& t, int stage) {
  return t.payload == Payload::kActivation ? stage - 1 : stage + 1;
}

std::string to_string(const Instruction& in) {
  switch (in.kind) {
    case Instruction::Kind::kForward:
      return fmt::format("F{}", in.micro);
    case Instruction::Kind::kBackward:
      return fmt::format("B{}", in.micro);
    case Instruction::Kind::kExchange:
      break;
  }
  auto dir = [](const Transfer& t) {
    return t.payload == Payload::kActivation ? "forward" : "backward";
  };
  std::string s;
  if (in.send) s = fmt::format("send_{}({})", dir(*in.send), in.send->micro);
  if (in.recv)
    s += fmt::format("{}recv_{}({})", s.empty() ? "" : "+", dir(*in.recv), in.recv->micro);
  return s;
}

namespace {

// Builds a stage's program in Megatron's order, one half per call, and posts
// each send together with the receive right after it (no compute between).
class Program {
 public:
  Program(int stages, int stage) : first_(stage == 0), last_(stage == stages - 1) {}

  void forward(int m) { compute(Instruction::Kind::kForward, m); }
  void backward(int m) { compute(Instruction::Kind::kBackward, m); }
  // The halves a stage at either end does not have are skipped here.
  void recv_forward(int m) {
    if (!first_) recv({Payload::kActivation, m});
  }
  void send_forward(int m) {
    if (!last_) send({Payload::kActivation, m});
  }
  void recv_backward(int m) {
    if (!last_) recv({Payload::kGradient, m});
  }
  void send_backward(int m) {
    if (!first_) send({Payload::kGradient, m});
  }

  std::vector<Instruction> take() && { return std::move(out_); }

 private:
  void compute(Instruction::Kind kind, int m) {
    Instruction in;
    in.kind = kind;
    in.micro = m;
    out_.push_back(in);
  }
  void send(Transfer t) {
    Instruction in;
    in.kind = Instruction::Kind::kExchange;
    in.send = t;
    out_.push_back(in);
  }
  void recv(Transfer t) {
    if (!out_.empty() && out_.back().kind == Instruction::Kind::kExchange && out_.back().send &&
        !out_.back().recv) {
      out_.back().recv = t;  // posted with the send before it
      return;
    }
    Instruction in;
    in.kind = Instruction::Kind::kExchange;
    in.recv = t;
    out_.push_back(in);
  }

  bool first_, last_;
  std::vector<Instruction> out_;
};

void check_args(int stages, int micro_batches, int stage) {
  FD_CHECK(stages >= 1 && micro_batches >= 1, "{} stages, {} micro-batches", stages, micro_batches);
  FD_CHECK(0 <= stage && stage < stages, "stage {} of {}", stage, stages);
}

}  // namespace

std::vector<Instruction> stage_program(Schedule schedule, int stages, int micro_batches,
                                       int stage) {
  check_args(stages, micro_batches, stage);
  const int M = micro_batches;
  Program p(stages, stage);
  if (schedule == Schedule::kGPipe) {
    for (int m = 0; m < M; ++m) {
      p.recv_forward(m);
      p.forward(m);
      p.send_forward(m);
    }
    for (int m = 0; m < M; ++m) {
      p.recv_backward(m);
      p.backward(m);
      p.send_backward(m);
    }
    return std::move(p).take();
  }
  // Megatron-LM's forward_backward_pipelining_without_interleaving.
  const int warmup = std::min(stages - stage - 1, M);
  const int remaining = M - warmup;
  for (int m = 0; m < warmup; ++m) {
    p.recv_forward(m);
    p.forward(m);
    p.send_forward(m);
  }
  if (remaining > 0) p.recv_forward(warmup);
  for (int i = 0; i < remaining; ++i) {
    const int f = warmup + i;  // this iteration's forward
    const int b = i;           // and backward: the oldest in flight
    p.forward(f);
    p.send_forward(f);  // send_forward_recv_backward
    p.recv_backward(b);
    p.backward(b);
    p.send_backward(b);  // send_backward_recv_forward (but the last iteration)
    if (i + 1 < remaining) p.recv_forward(f + 1);
  }
  for (int b = remaining; b < M; ++b) {
    p.recv_backward(b);
    p.backward(b);
    p.send_backward(b);
  }
  return std::move(p).take();
}

int max_in_flight(Schedule schedule, int stages, int micro_batches, int stage) {
  check_args(stages, micro_batches, stage);
  if (schedule == Schedule::kGPipe) return micro_batches;
  return std::min(stages - stage, micro_batches);
}

double bubble_fraction(int stages, int micro_batches) {
  FD_CHECK(stages >= 1 && micro_batches >= 1, "{} stages, {} micro-batches", stages, micro_batches);
  return double(stages - 1) / double(micro_batches + stages - 1);
}

}  // namespace fd::pipe
