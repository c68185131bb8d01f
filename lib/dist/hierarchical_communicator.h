// HierarchicalCommunicator: a group's collectives as steps inside and across its nodes (hosts),
// and the node-aware collectives of ZeRO++ (arXiv 2306.10209).
//
// The group (a "flat" communicator whose nodes() are known) has H nodes of L ranks each, node
// by node: group rank r = h * L + l is local rank l on node h (mpirun's --map-by slot or
// ppr:L:node placement and the Mesh's axis order give this; anything else is refused). It is
// split once into `whole` (its own copy of the flat group, for the other ops), `intra` (the L ranks
// of this rank's node) and `inter` (the H ranks with this rank's local index, one per node). With S
// the full buffer's bytes, a rank sends across nodes (ring model, communicator.h):
//
//   op              flat ring (ranks at a node's end)    hierarchical (every rank)
//   reduce-scatter  (N-1)/N * S                          (H-1)/N * S
//   all-gather      (N-1)/N * S                          (H-1)/N * S
//   all-reduce      2(N-1)/N * S                         2(H-1)/(H L) * S
//
// so a node's link carries L(H-1)/N * S instead of (N-1)/N * S per reduce-scatter (2 nodes of 2:
// 1/2 S instead of 3/4 S). Steps:
//   reduce-scatter: the chunks reordered so that each local rank's block holds the chunks of
//     the H ranks with its local index; reduce-scatter inside the node (each rank: its H
//     chunks summed over the node), then across nodes an all-to-all of those partial sums, each
//     rank adding the H partials of its own chunk in node order (in fp32; 16-bit values rounded
//     once, or after each add with Sum16::kNative). An all-to-all, not MPI's reduce-scatter:
//     with few ranks that reduces to one and scatters, 1.5x the bytes at 2 (the hosts' links'
//     counters show it); the all-to-all sends exactly the ring model's (H-1)/H.
//   all-gather: across nodes (the H chunks of this local index), then inside the node, then
//     reordered into rank order.
//   all-reduce (sum): reduce-scatter inside the node (a 1/L slice, the buffer padded to a
//     multiple of L in staging), all-reduce of the slice across nodes, all-gather inside.
//     A max is the flat all-reduce.
// Numerics: the sums are the same, grouped by node: sum over nodes of (sum over the node's
// ranks), not the flat rank-order sum, so an fp32 result differs from the flat one by rounding
// (a few units in the last place; tested <= 1e-5 relative) and does not depend on anything
// but the node layout. 16-bit sums are rounded to the dtype twice (each node's partial sum,
// then the total) in Sum16::kFp32 mode, against once flat. Other ops (broadcast, barrier,
// all-to-all, send_recv, split, the f64 helpers) are the flat communicator's.
// With `hierarchical` false, every op is the flat communicator's: the object then only serves
// the node collectives below (ZeRO++'s secondary partition and quantized gradients).
//
// Order and threads: every op, of this communicator and of its intra/inter parts, is run by one
// worker thread in issue order (the parts are used by nothing else), so the Communicator contract
// holds: ops start in issue order and a Work completes when its last step has. The worker waits
// on the parts' Works, whose timeouts abort the job as usual; a part's failure is rethrown by
// this communicator's Work::wait().
//
// Counting: the parts' traffic counts in this communicator's bytes_sent() and inter_node_bytes()
// (count_into) and in the flat communicator's family (join_family), so summary.json's `network`
// and the estimate see what the parts send. Staging (reorder buffers, wire codes, fp32 sums) is
// MemCategory::kComm, grown to the largest op and kept: no allocation in the steady state. On
// the counting backend (the estimate) nothing is moved or decoded; the same parts' ops are
// issued and counted, the same staging allocated on the meta device.
// CPU communicators only (a GPU run's NCCL already runs its rings and trees hierarchically; the
// recipe refuses these settings with device: cuda).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/dist/communicator.h"
#include "lib/dist/wire_quant.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {

class HierarchicalCommunicator final : public Communicator {
 public:
  // Collective over `flat` (it splits it). `flat` must outlive the result. Throws fd::Error
  // (kUsage) when flat's nodes do not hold equal runs of consecutive ranks, naming the layout
  // and `setting` (the recipe key that asked for it). Without known nodes the group is one node.
  // `world_ranks`: flat's ranks' numbers in the world, for the message (empty: flat's own).
  static std::unique_ptr<HierarchicalCommunicator> make(Communicator& flat, bool hierarchical,
                                                        const std::string& setting,
                                                        const std::vector<int>& world_ranks = {});
  ~HierarchicalCommunicator() override;

  int rank() const override { return flat_.rank(); }
  int size() const override { return flat_.size(); }
  std::string_view backend() const override { return flat_.backend(); }
  FD_COMMUNICATOR_OVERRIDES;
  void keep_staging(Collective c, int64_t count, DType dtype) override;
  void all_gather_f64(const double* send, double* recv, int64_t send_count) override;

  int num_node_groups() const { return nodes_h_; }  // H
  int local_size() const { return local_l_; }       // L
  int local_rank() const { return rank() % local_l_; }
  bool hierarchical() const { return hierarchical_; }

  // Sizes now, and keeps, the staging of reduce-scatters and all-gathers of up to `count`
  // elements of `dtype` per rank, and with codes.bits > 0 of quantized reduce-scatters: none
  // of them allocates afterwards, so the kComm figure does not depend on when the worker runs
  // them. Blocks until done.
  void reserve(int64_t count, DType dtype, const WireFormat& codes);

  // ZeRO++'s hpZ: an all-gather inside this rank's node (recv gets local_size() * send_count
  // elements, local rank l's at l * send_count).
  WorkPtr node_all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype);
  // ZeRO++'s qgZ: reduce_scatter_async's result (send: size() * recv_count values of dtype;
  // recv: this rank's chunk summed over all ranks) through a hierarchical all-to-all of wire
  // codes (wire_quant.h): each rank's chunks for the node encoded and exchanged inside the node,
  // decoded and summed in fp32 in local rank order; the node's partial sums encoded and
  // exchanged across nodes, decoded and summed in fp32 in node order, rounded to dtype once.
  // Every rank's contribution is quantized once (inside the node; with one rank per node it
  // enters its node's partial exact) and every node's partial once (across nodes; with one node
  // there is no such step). The error bound is in docs/ZERO.md (ZeRO++).
  WorkPtr quantized_reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                         DType dtype, const WireFormat& format);

 private:
  HierarchicalCommunicator(Communicator& flat, bool hierarchical, int nodes, int local);
  struct Worker;
  // Runs `task` on the worker after everything issued before; its Work completes after it.
  WorkPtr enqueue(std::function<void()> task);
  // The kept staging buffer `i`, at least `bytes` long (grown, never shrunk); its data, or null
  // when nothing moves (counting).
  uint8_t* scratch(int i, int64_t bytes);

  void do_reduce_scatter(const uint8_t* send, uint8_t* recv, int64_t count, DType dtype,
                         Sum16 mode);
  void do_all_gather(const uint8_t* send, uint8_t* recv, int64_t count, DType dtype);
  void do_all_reduce(uint8_t* buf, int64_t count, DType dtype, Sum16 mode);
  void do_quantized_reduce_scatter(const uint8_t* send, uint8_t* recv, int64_t count, DType dtype,
                                   const WireFormat& f);

  Communicator& flat_;
  bool hierarchical_;
  int nodes_h_;
  int local_l_;
  bool moves_data_;                      // false on the counting backend
  std::unique_ptr<Communicator> whole_;  // flat's ranks, for the ops that are not hierarchical
  std::unique_ptr<Communicator> intra_;
  std::unique_ptr<Communicator> inter_;
  std::vector<Tensor> scratch_;
  std::unique_ptr<Worker> worker_;
};

}  // namespace fd::dist
