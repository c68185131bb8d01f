// Communicator: the collectives data-parallel training needs (c10d's Backend,
// trimmed): all-reduce, reduce-scatter, all-gather, broadcast, barrier, and
// the all-to-all of sequence parallelism (DeepSpeed-Ulysses), each with an
// async form that returns a Work; point-to-point send_recv for
// pipeline parallelism; split() into sub-communicators (MPI_Comm_split, the
// whole grouping given as a SplitPlan).
//
// Contract (as in c10d): every rank calls the same collectives in the same
// order with matching counts, dtypes, ops and roots. A rank that fails must
// end the whole job (abort()) rather than leave its peers waiting in a
// collective it will never join; a collective that does not complete within
// the timeout aborts the job with a diagnostic naming rank, host and op.
// Collectives are issued from one thread (the compute thread); they are not
// thread-safe among themselves.
//
// Point-to-point: send_recv_async sends to one rank and receives from another
// in one op, both halves posted together, so two neighbours exchanging in both
// directions at once (Megatron's send_forward_recv_backward) never deadlock.
// Only the ranks named take part. Between a pair of ranks, messages match in
// issue order, and the receiver's count must equal the sender's (the MPI
// backend aborts the job on a mismatch; NCCL cannot tell). A half with count
// 0 posts no message (its peer must not post one either); an op with nothing
// to send or receive is complete when returned. The timeout applies as to
// collectives.
//
// Order: the ops of one communicator (collectives and send_recv alike) start
// one at a time in issue order (MPI: the FIFO communication thread; NCCL: one
// stream), so a rank's ops must complete if each were blocking in issue order:
// an op waits for its peers' matching ops, which must not be queued behind one
// that waits for this rank's later op. Traffic that must not wait on another
// (a pipeline's send_recv, the data-parallel all-reduce) goes on separate
// communicators made by split(); those run independently.
//
// Buffers are raw host pointers with an element count and a dtype (f32, bf16,
// f16, i32). They must stay valid and untouched until the Work's wait() has
// returned. Counts are per the MPI int limit (< 2^31 elements per call).
//
// Numerics of bf16/f16 sums (all_reduce, reduce_scatter), chosen per
// communicator by set_sum16() (the recipe's zero.reduce_dtype):
//   Sum16::kFp32 (the default): the inputs are widened to fp32 staging buffers
//     (MemCategory::kComm), summed in fp32 and rounded to the 16-bit dtype once,
//     round-to-nearest-even, at the end.
//   Sum16::kNative: summed in the 16-bit dtype, half the bytes on the wire:
//     every partial sum is rounded (nearest even) to the dtype's 8 (bf16) or
//     11 (fp16) significant bits. MPI: each rank receives every rank's 16-bit
//     contribution (an all-to-all of the chunks for a reduce-scatter, an
//     all-gather for an all-reduce) and adds them on the host in rank order,
//     ((x0 + x1) + x2) + ..., each add computed in fp32 and rounded to the
//     dtype (which is the correctly rounded 16-bit sum); NCCL: in its ring or
//     tree, in the order and grouping its algorithm, protocol and channel
//     count give, which depend on the world size, the message size and the
//     topology. The error of a sum of n values grows with n: up to (n-1) unit
//     roundings (2^-8 bf16, 2^-11 fp16, relative to the partial sums) against
//     one for kFp32.
// Results are bitwise identical on every rank and across runs with the same
// world size and counts (fixed MPI algorithms, rank-ordered host sums; no
// reductions whose order depends on timing). send_recv moves raw bits.
//
// Byte accounting (ring model, the nccl-tests "bus bandwidth" convention):
// with S the full buffer's bytes and n = size(), a rank sends
//   all-reduce 2(n-1)/n*S, reduce-scatter and all-gather (n-1)/n*S (S = the
//   gathered / scattered total, size()*count*elem), broadcast (n-1)/n*S (the
//   pipelined-ring broadcast, nccl-tests' busbw factor 1 on algbw), barrier 0,
//   all-to-all (n-1)/n*S (S = the whole send buffer, size()*count*elem: every
//   block but this rank's own leaves it; exact, not only a model).
// send_recv is exact, no model: the bytes this rank sends (send_count*elem;
// the receive half counts on the sender).
// To stay exact the counters accumulate n times these values (always an
// integer) and bytes_sent() divides by n when read (rounding down the total,
// not each op). The f64 helpers count into control_bytes(), not bytes_sent().
// Each communicator counts its own traffic: a sub-communicator's is not its
// parent's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/dist/work.h"
#include "lib/tensor/dtype.h"

namespace fd::dist {

enum class ReduceOp { kSum, kMax };
std::string_view reduce_op_name(ReduceOp op);  // "sum", "max"

// The ops a communicator counts bytes for (kSendRecv is point-to-point).
enum class Collective {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kSendRecv,
  kAllToAll
};
std::string_view collective_name(Collective c);  // "all_reduce", ..., "send_recv", "all_to_all"

// Ring-model bytes one rank sends for collective `c` over a full buffer of
// `full_bytes` in a world of `n` ranks, multiplied by n (so it is an exact
// integer): all-reduce 2(n-1)*S, reduce-scatter / all-gather / broadcast /
// all-to-all (n-1)*S, barrier 0. For kSendRecv, `full_bytes` is what this
// rank sends, counted as it is: n*S.
int64_t ring_bytes_times_n(Collective c, int64_t full_bytes, int n);

// How bf16/f16 values are summed (see Numerics above).
enum class Sum16 {
  kFp32,    // widened to fp32, summed in fp32, rounded to the 16-bit dtype once
  kNative,  // summed in the 16-bit dtype: every partial sum rounded to it
};
std::string_view sum16_name(Sum16 s);  // "fp32", "native"

// The fp32 elements MpiCommunicator stages a 16-bit sum through (Sum16::kFp32),
// in a world of `n` > 1 ranks: an all-reduce of `count` elements stages count
// (in place), a reduce-scatter of `count` per rank its input and output,
// (n + 1) * count; other collectives nothing.
int64_t fp32_staging_elements(Collective c, int64_t count, int n);
// The 16-bit elements MpiCommunicator stages a 16-bit sum through
// (Sum16::kNative), in a world of `n` > 1 ranks: every rank's contribution to
// what this rank sums, side by side in rank order: n * count for an all-reduce
// of `count` and for a reduce-scatter of `count` per rank; else nothing.
int64_t native16_staging_elements(Collective c, int64_t count, int n);
// The staging's bytes in either mode: 4 * fp32_staging_elements or
// 2 * native16_staging_elements.
int64_t sum16_staging_bytes(Collective c, int64_t count, int n, Sum16 mode);

// One rank's part in a split: ranks with the same color (>= 0) form one
// group, ordered by key (ties by rank).
struct SplitKey {
  int color = 0;
  int key = 0;
  bool operator==(const SplitKey&) const = default;
};

// A split of a communicator's n ranks into groups: every rank's SplitKey,
// indexed by rank. Every rank builds the same plan (rank arithmetic on a
// Mesh), so any rank can tell any group's members without communicating.
class SplitPlan {
 public:
  // of_rank[r] is rank r's key; colors >= 0 (FD_CHECK), at least one rank.
  explicit SplitPlan(std::vector<SplitKey> of_rank);
  static SplitPlan whole(int n);  // one group of all n ranks, in rank order
  static SplitPlan each(int n);   // n groups of one rank
  // n ranks, rank r's key key_of(r).
  static SplitPlan by(int n, const std::function<SplitKey(int rank)>& key_of);

  int size() const { return int(of_rank_.size()); }
  const SplitKey& of(int rank) const;
  // Rank `rank`'s group: its size and `rank`'s place in it (by key, then rank).
  int group_size(int rank) const;
  int group_rank(int rank) const;

 private:
  std::vector<SplitKey> of_rank_;
};

// Shared by a communicator and its Works (a Work may outlive the communicator).
struct CommStats {
  std::atomic<int64_t> bytes_times_n{0};    // model traffic, times size()
  std::atomic<int64_t> inter_times_n{0};    // of it, to ranks on other nodes, times size()
  std::atomic<int64_t> family_bytes{0};     // a family's (Communicator::family_bytes), bytes
  std::atomic<int64_t> family_inter{0};     // of them to other nodes
  std::atomic<int64_t> control_times_n{0};  // f64 helper traffic, times size()
  std::atomic<int64_t> wait_ns{0};          // caller time blocked in Work::wait()
};

class Communicator {
 public:
  Communicator() = default;
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "local" | "mpi" | "counting" | "nccl"

  // In place: every rank's buf ends up holding the elementwise op over all ranks.
  virtual WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  // send holds size()*recv_count elements; rank r receives the sum of every
  // rank's chunk r (elements [r*recv_count, (r+1)*recv_count)).
  virtual WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                       DType dtype) = 0;
  // recv gets size()*send_count elements, rank r's send at offset
  // r*send_count. send may equal recv + rank()*send_count (in place).
  virtual WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count,
                                   DType dtype) = 0;
  // send holds size()*count_per_rank elements, block j (elements
  // [j*count_per_rank, (j+1)*count_per_rank)) for rank j; recv gets
  // size()*count_per_rank elements, block i from rank i (this rank's own
  // block copied). No sum: 16-bit dtypes move as raw bits. send and recv must
  // not overlap (FD_CHECK). DeepSpeed-Ulysses' exchange (lib/ops/ulysses.h).
  virtual WorkPtr all_to_all_async(const void* send, void* recv, int64_t count_per_rank,
                                   DType dtype) = 0;
  // Every rank's buf gets root's buf.
  virtual WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual WorkPtr barrier_async() = 0;

  // Point-to-point (see the top of this file): sends send_count elements of
  // `send` to rank `dst` and receives recv_count elements from rank `src` into
  // `recv`, both posted together. A half may be absent: dst (or src) -1 with
  // count 0 and the pointer may be null. dst/src outside [-1, size()), a count
  // without a peer, a negative count, a non-zero count to or from this rank
  // itself, or overlapping send and recv buffers are FD_CHECK failures.
  virtual WorkPtr send_recv_async(const void* send, int64_t send_count, int dst, void* recv,
                                  int64_t recv_count, int src, DType dtype) = 0;

  // The largest 16-bit sum of kind `c` (kAllReduce: count; kReduceScatter:
  // count per rank) the caller will issue. A communicator that sums 16-bit
  // values through staging copies of its own (MpiCommunicator: fp32 copies,
  // or with Sum16::kNative every rank's 16-bit contribution; NcclCommunicator:
  // fp32 copies on the GPU) then allocates them once, now, for the current
  // sum16() mode, and keeps them (MemCategory::kComm) for every sum up to that
  // size, where it would otherwise allocate them at each one: no allocation
  // in the steady-state step, and a kComm figure that does not depend on when
  // its communication thread runs (CountingCommunicator counts the same). The
  // kept staging serves any number of ops in flight because a backend runs
  // its ops one at a time (MPI: its one thread; NCCL: its one stream, on
  // which the staging's casts run too). Grows what it keeps, never shrinks
  // it. Others: nothing.
  virtual void keep_staging(Collective c, int64_t count, DType dtype) {
    (void)c, (void)count, (void)dtype;
  }

  // How bf16/f16 values are summed from now on (default Sum16::kFp32). Every
  // rank must set the same; ops already issued keep the mode they were issued
  // with. Call keep_staging() after it. Not inherited by split().
  void set_sum16(Sum16 mode) { sum16_ = mode; }
  Sum16 sum16() const { return sum16_; }

  // A new communicator over each group of `plan` (MPI_Comm_split with this
  // rank's plan.of(rank()): the ranks of one color, ranked by key, ties by
  // rank). Collective over this communicator: every rank calls it with the
  // same plan, in order with its other collectives; plan.size() == size().
  // Every backend honours it (the counting one learns its group from the
  // plan, which is why the plan holds every rank's entry, not just this
  // rank's). The result has its own queue (thread or stream) and counters,
  // starts with this one's timeout, may outlive this one, and its abort()
  // ends the whole job. A group's communicators come from a Mesh (mesh.h).
  virtual std::unique_ptr<Communicator> split(const SplitPlan& plan) = 0;

  // Blocking forms: the async call followed by wait().
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op = ReduceOp::kSum);
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype);
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype);
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype);
  void broadcast(void* buf, int64_t count, DType dtype, int root);
  void barrier();
  // send / recv: send_recv with one half; the peer comes after the count, as there.
  void send(const void* buf, int64_t count, int dst, DType dtype);
  void recv(void* buf, int64_t count, int src, DType dtype);
  void send_recv(const void* send, int64_t send_count, int dst, void* recv, int64_t recv_count,
                 int src, DType dtype);

  // Doubles for metrics and norm partials. Both gather every rank's values
  // bitwise (an all-gather) and all_reduce_f64 then combines them in rank
  // order 0..n-1, so the result is identical on all ranks and independent of
  // the MPI algorithm. Their traffic counts in control_bytes().
  void all_reduce_f64(double* buf, int64_t count, ReduceOp op = ReduceOp::kSum);
  // Virtual: a backend whose buffers are not host memory (NCCL) sends these
  // over its host communicator.
  virtual void all_gather_f64(const double* send, double* recv, int64_t send_count);  // rank order

  // Ring-model bytes this rank has sent since the last reset_counters() (see
  // the top of this file): model traffic and f64-helper traffic.
  int64_t bytes_sent() const;
  int64_t control_bytes() const;
  // Seconds the caller has spent blocked inside Work::wait() since the last
  // reset_counters(): the communication not hidden behind computation.
  double wait_seconds() const;
  void reset_counters();

  // Nodes (hosts; issue 40): the node of each of this communicator's ranks, indexed by rank,
  // ids >= 0 (FD_CHECK: size() of them). Empty (the default): not known, every byte counts as
  // inside a node. dist::init sets the world's (MPI: the ranks that share memory, numbered by
  // their lowest rank), the estimate a simulated world's (`--nodes`), and Mesh::group passes
  // them to every group it makes.
  // `names`: each node's host name, by node id (empty: not known), for messages.
  void set_nodes(std::vector<int> node_of_rank, std::vector<std::string> names = {});
  const std::vector<int>& nodes() const { return nodes_; }
  const std::vector<std::string>& node_names() const { return node_names_; }
  // "ranks 0-1 on host a, ranks 2-3 on host b": this communicator's ranks, named `world_ranks`
  // (by rank), grouped by host; "" when they are on one node or the nodes are not known.
  std::string ranks_by_host(const std::vector<int>& world_ranks) const;
  int num_nodes() const;  // distinct ids; 1 when not known
  // What this communicator is for, in messages (MPI: a collective's timeout says "on <name>" where
  // it would say "on split(color c, key k)"). Set before its first op.
  void set_name(std::string name);
  const std::string& name() const { return name_; }
  // Of bytes_sent(): the bytes that went to ranks on other nodes, by the same ring model: a ring
  // collective's (all-reduce, reduce-scatter, all-gather, broadcast) go to this rank's successor
  // (rank + 1 mod size), so all or none of them cross; an all-to-all's 1/(size-1) to each other
  // rank; a send_recv's to its destination.
  int64_t inter_node_bytes() const;
  // A rank's whole traffic: every group made from this communicator by Mesh::group counts its
  // bytes here too (join_family), floor(bytes / size) per op, model traffic only: the bytes
  // this rank sent over all its groups since reset_family_counters(), and of them to other
  // nodes. On the world: what summary.json's `network` block and `fdtrain estimate --nodes`
  // report per step.
  int64_t family_bytes() const;
  int64_t family_inter_node_bytes() const;
  void reset_family_counters();
  // From now on this communicator's traffic also counts in `parent`'s family totals.
  void join_family(const Communicator& parent);
  // From now on this communicator's traffic (model and control) also counts in `whole`'s
  // bytes_sent(), inter_node_bytes() and control_bytes(), floor(bytes / size) per op: the parts
  // of a communicator that runs its collectives through them (HierarchicalCommunicator).
  // `whole` must outlive this one.
  void count_into(const Communicator& whole);

  // Seconds an op may run before the job is aborted (default 600).
  virtual void set_timeout(double seconds) = 0;
  // Ends the whole job now with `exit_code` after printing `message`
  // (prefixed with rank and host) to stderr: MPI_Abort for mpi, std::exit for
  // local. Never returns; safe to call from any thread.
  [[noreturn]] virtual void abort(int exit_code, const std::string& message) = 0;

 protected:
  // Adds the ring-model bytes of one collective (called by backends on the
  // calling thread when the op is issued); for kSendRecv, the bytes sent to `peer`.
  void count_bytes(Collective c, int64_t full_bytes, int peer = -1);
  // The plan's size matches this communicator's (FD_CHECK); this rank's key.
  const SplitKey& check_split(const SplitPlan& plan) const;
  // The send_recv_async checks every backend makes (FD_CHECK; see there).
  void check_send_recv(const void* send, int64_t send_count, int dst, const void* recv,
                       int64_t recv_count, int src, DType dtype) const;
  // The all_to_all_async checks every backend makes (FD_CHECK): a count >= 0,
  // and send and recv (size()*count_per_rank elements each) not overlapping.
  void check_all_to_all(const void* send, const void* recv, int64_t count_per_rank,
                        DType dtype) const;
  // Called by set_nodes() once the nodes are set: a backend that names them in its messages
  // (MPI: a collective's timeout lists the group's ranks by host) keeps what it needs.
  virtual void nodes_changed() {}
  // Called by set_name(): a backend that names its communicator in messages keeps the name.
  virtual void name_changed() {}
  // The same, into control_bytes() (f64 helper traffic a backend forwards).
  void count_control_bytes(Collective c, int64_t full_bytes);
  const std::shared_ptr<CommStats>& stats() const { return stats_; }

 private:
  std::shared_ptr<CommStats> stats_ = std::make_shared<CommStats>();
  std::shared_ptr<CommStats> family_ = stats_;  // where family totals go (join_family)
  std::shared_ptr<CommStats> into_;             // count_into()'s, or null
  int into_size_ = 0;                           // its communicator's size
  std::vector<int> nodes_;                      // set_nodes()
  std::vector<std::string> node_names_;         // set_nodes(), by node id
  std::string name_;                            // set_name()
  Sum16 sum16_ = Sum16::kFp32;
  bool control_scope_ = false;  // inside an f64 helper: count as control traffic
};

// The overrides every backend (local, mpi, nccl, counting) declares, stated
// once: a backend's class body says FD_COMMUNICATOR_OVERRIDES and defines
// them in its .cc. Their contracts are Communicator's, above; a new op is one
// line here (as the all-to-all of sequence parallelism was), and the compiler
// then asks every backend for its definition. A macro rather than a shared
// base: the pure virtuals already are that base, and what repeated was only
// the list of their signatures. rank(), size() and backend() stay each
// backend's one-liners; keep_staging() and all_gather_f64() are overridden
// only where a backend needs to.
#define FD_COMMUNICATOR_OVERRIDES                                                             \
  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;      \
  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype) \
      override;                                                                               \
  WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype)     \
      override;                                                                               \
  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count_per_rank, DType dtype) \
      override;                                                                               \
  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override;          \
  WorkPtr barrier_async() override;                                                           \
  WorkPtr send_recv_async(const void* send, int64_t send_count, int dst, void* recv,          \
                          int64_t recv_count, int src, DType dtype) override;                 \
  std::unique_ptr<Communicator> split(const SplitPlan& plan) override;                        \
  void set_timeout(double seconds) override;                                                  \
  [[noreturn]] void abort(int exit_code, const std::string& message) override

// A function that abort() (and a collective's timeout, which aborts) calls on
// the aborting rank just before the job ends, with the message: the trainer
// records the failure in the run directory. Process-wide; pass nullptr to
// remove it. The hook must not throw or call collectives.
void set_abort_hook(std::function<void(const std::string& message)> hook);
// Calls the hook, if any, once per process (later calls do nothing).
void run_abort_hook(const std::string& message);

}  // namespace fd::dist
