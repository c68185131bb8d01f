// Runs the programs of all P stages of one pipeline together, as the
// communicator would: each stage issues its instructions in order, one at a
// time; a forward or backward takes its cost in time; an exchange is posted
// when the stage reaches it and completes once every half has its matching
// half posted by the peer (rendezvous), the messages between an ordered pair
// of stages matching in issue order; transfers themselves take no time.
//
// The outcome says whether every stage finished (else the stages were left
// waiting on each other: a deadlock), whether each matched pair of halves
// agrees on what it carries (kind and micro-batch), and when each stage ended
// and how long it computed.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/pipe/schedule.h"

namespace fd::pipe::testing {

struct SimResult {
  bool completed = false;           // every stage ran its whole program
  std::vector<std::string> errors;  // mismatched or unmatched messages, stuck stages
  std::vector<double> end;          // per stage: when its last instruction completed
  std::vector<double> busy;         // per stage: time spent in forwards and backwards
  double makespan() const { return end.empty() ? 0.0 : *std::max_element(end.begin(), end.end()); }
};

inline SimResult simulate(const std::vector<std::vector<Instruction>>& programs,
                          double forward_cost = 1.0, double backward_cost = 2.0) {
  const int P = int(programs.size());
  SimResult r;
  r.end.assign(size_t(P), 0.0);
  r.busy.assign(size_t(P), 0.0);
  // Per ordered pair (from, to): the senders' and receivers' halves in issue
  // order, as (instruction index, transfer).
  using Half = std::pair<int, Transfer>;
  std::map<std::pair<int, int>, std::vector<Half>> sends, recvs;
  // Per stage and instruction: the sequence number of its send and recv halves.
  std::vector<std::vector<int>> send_seq(static_cast<size_t>(P)), recv_seq(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    const auto& prog = programs[size_t(s)];
    send_seq[size_t(s)].assign(prog.size(), -1);
    recv_seq[size_t(s)].assign(prog.size(), -1);
    for (int i = 0; i < int(prog.size()); ++i) {
      const Instruction& in = prog[size_t(i)];
      if (in.kind != Instruction::Kind::kExchange) continue;
      if (in.send) {
        const int to = send_peer(*in.send, s);
        if (to < 0 || to >= P) {
          r.errors.push_back("stage " + std::to_string(s) +
                             " sends past the pipeline: " + to_string(in));
          continue;
        }
        auto& q = sends[{s, to}];
        send_seq[size_t(s)][size_t(i)] = int(q.size());
        q.emplace_back(i, *in.send);
      }
      if (in.recv) {
        const int from = recv_peer(*in.recv, s);
        if (from < 0 || from >= P) {
          r.errors.push_back("stage " + std::to_string(s) +
                             " receives from past the pipeline: " + to_string(in));
          continue;
        }
        auto& q = recvs[{from, s}];
        recv_seq[size_t(s)][size_t(i)] = int(q.size());
        q.emplace_back(i, *in.recv);
      }
    }
  }
  // Matched in order per pair: the same count, and each pair the same message.
  for (int a = 0; a < P; ++a)
    for (int b = 0; b < P; ++b) {
      const auto& sq = sends[{a, b}];
      const auto& rq = recvs[{a, b}];
      if (sq.size() != rq.size())
        r.errors.push_back("stage " + std::to_string(a) + " sends " + std::to_string(sq.size()) +
                           " message(s) to stage " + std::to_string(b) + ", which receives " +
                           std::to_string(rq.size()));
      for (size_t k = 0; k < std::min(sq.size(), rq.size()); ++k)
        if (!(sq[k].second == rq[k].second)) {
          Instruction x, y;
          x.kind = y.kind = Instruction::Kind::kExchange;
          x.send = sq[k].second;
          y.recv = rq[k].second;
          r.errors.push_back("message " + std::to_string(k) + " from stage " + std::to_string(a) +
                             " to " + std::to_string(b) + ": sent as " + to_string(x) +
                             ", received as " + to_string(y));
        }
    }
  if (!r.errors.empty()) return r;

  // Run. pc[s]: the instruction stage s has reached (posted, if an exchange);
  // posted[s][i]: when stage s reached instruction i.
  std::vector<int> pc(static_cast<size_t>(P), 0);
  std::vector<std::vector<double>> posted(static_cast<size_t>(P));
  std::vector<double> clock(static_cast<size_t>(P), 0.0);
  for (int s = 0; s < P; ++s) posted[size_t(s)].assign(programs[size_t(s)].size(), 0.0);
  auto reach = [&](int s) {
    if (pc[size_t(s)] < int(programs[size_t(s)].size()))
      posted[size_t(s)][size_t(pc[size_t(s)])] = clock[size_t(s)];
  };
  for (int s = 0; s < P; ++s) reach(s);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      const auto& prog = programs[size_t(s)];
      while (pc[size_t(s)] < int(prog.size())) {
        const int i = pc[size_t(s)];
        const Instruction& in = prog[size_t(i)];
        if (in.kind != Instruction::Kind::kExchange) {
          const double cost = in.kind == Instruction::Kind::kForward ? forward_cost : backward_cost;
          clock[size_t(s)] += cost;
          r.busy[size_t(s)] += cost;
        } else {
          // Each half's peer must have reached (posted) the instruction holding its match.
          double done = posted[size_t(s)][size_t(i)];
          bool ready = true;
          if (in.send) {
            const int to = send_peer(*in.send, s);
            const int j = recvs[{s, to}][size_t(send_seq[size_t(s)][size_t(i)])].first;
            if (pc[size_t(to)] < j)
              ready = false;
            else
              done = std::max(done, posted[size_t(to)][size_t(j)]);
          }
          if (in.recv) {
            const int from = recv_peer(*in.recv, s);
            const int j = sends[{from, s}][size_t(recv_seq[size_t(s)][size_t(i)])].first;
            if (pc[size_t(from)] < j)
              ready = false;
            else
              done = std::max(done, posted[size_t(from)][size_t(j)]);
          }
          if (!ready) break;
          clock[size_t(s)] = done;
        }
        ++pc[size_t(s)];
        reach(s);
        progress = true;
      }
    }
  }
  r.completed = true;
  for (int s = 0; s < P; ++s) {
    r.end[size_t(s)] = clock[size_t(s)];
    if (pc[size_t(s)] < int(programs[size_t(s)].size())) {
      r.completed = false;
      r.errors.push_back("stage " + std::to_string(s) + " waits for ever at instruction " +
                         std::to_string(pc[size_t(s)]) + " (" +
                         to_string(programs[size_t(s)][size_t(pc[size_t(s)])]) + ")");
    }
  }
  return r;
}

// The programs of all stages of `schedule`.
inline std::vector<std::vector<Instruction>> all_programs(Schedule schedule, int stages,
                                                          int micro_batches) {
  std::vector<std::vector<Instruction>> out;
  for (int s = 0; s < stages; ++s) out.push_back(stage_program(schedule, stages, micro_batches, s));
  return out;
}

}  // namespace fd::pipe::testing
