// MpiCommunicator: collectives over MPI, driven by one communication thread.
//
// Open MPI 4.1 has no asynchronous progress: a nonblocking collective only
// advances while some thread is inside MPI. So every MPI call of the
// communicator is made by its own communication thread: *_async queues the op
// (FIFO, so all ranks start the same ops in the same order), the thread starts
// the nonblocking MPI call and polls MPI_Testall with short sleeps (20 us backing
// off to 200 us) so that it leaves the CPU to the compute thread, and Work::
// wait() sleeps on a condition variable. One op is in flight at a time.
//
// An op that has run longer than the timeout aborts the job (MPI_Abort) with a
// diagnostic naming rank, host, op, sequence number, size and time waited.
// MPI return codes are checked (MPI_ERRORS_RETURN) and abort the job likewise.
// bf16/f16 sums are staged on the communication thread (MemCategory::kComm):
// with Sum16::kFp32 in fp32 buffers, summed by MPI in fp32 and rounded back
// with round-to-nearest-even; with Sum16::kNative every rank's 16-bit
// contribution is received (MPI_Ialltoall for a reduce-scatter, MPI_Iallgather
// for an all-reduce) and added on this thread in rank order, each partial sum
// rounded to 16 bits (communicator.h, Numerics).
//
// all_to_all is an MPI_Ialltoall of raw elements (16-bit ones as
// MPI_UINT16_T: nothing is summed, nothing staged).
//
// send_recv is an MPI_Irecv and an MPI_Isend (one fixed tag, so MPI's
// non-overtaking rule keeps a pair's messages in issue order) completed
// together with MPI_Testall; a received count other than recv_count aborts
// the job. split() goes through the queue too (in order with the collectives):
// an MPI_Ibarrier, so that a rank that never joins times out like a
// collective, then the blocking MPI_Comm_split; the new communicator has its
// own thread, inherits the timeout, and its diagnostics name it ("split(color
// c, key k)") and give peers' world ranks.
//
// Requires MPI initialised with MPI_THREAD_MULTIPLE (init() does it). The
// destructor (or shutdown()) drains the queue, joins the thread and frees the
// duplicated (or split) MPI communicator; finalize() shuts down every one
// still alive, sub-communicators included.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "lib/dist/communicator.h"

namespace fd::dist {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates MPI_COMM_WORLD and starts the communication thread.
  MpiCommunicator();
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  FD_COMMUNICATOR_OVERRIDES;
  void keep_staging(Collective c, int64_t count, DType dtype) override;
  // A timeout's message lists the group's ranks by host when they span hosts.
  void nodes_changed() override;
  void name_changed() override;

  // Completes every queued op, joins the thread and frees the MPI
  // communicator. Idempotent; finalize() calls it for a live communicator.
  void shutdown();

  struct Op;
  struct State;

 private:
  // Over state's MPI communicator (split() made it).
  explicit MpiCommunicator(std::shared_ptr<State> state);
  // Reads rank and size, starts the thread, registers for finalize().
  void begin();
  WorkPtr enqueue(std::shared_ptr<Op> op);

  int rank_ = 0;
  int size_ = 1;
  int64_t next_seq_ = 1;
  std::shared_ptr<State> state_;
  std::thread thread_;
  bool shut_down_ = false;
};

namespace detail {
// Prints "fdtrain: rank R (host H): message" to stderr and ends the job
// (MPI_Abort when MPI is initialised, else std::exit). Only the first caller
// in a process gets through; a concurrent second caller blocks forever.
[[noreturn]] void abort_job(int exit_code, const std::string& message);
// Aborts the job naming the failed MPI call, its error string, file and line.
[[noreturn]] void mpi_failed(const char* call, int code, const char* file, int line);
// Shuts down every MpiCommunicator still alive (finalize() calls it).
void shutdown_live_communicators();
}  // namespace detail

}  // namespace fd::dist

#define FD_MPI_CHECK(call)                                                   \
  do {                                                                       \
    int fd_mpi_rc_ = (call);                                                 \
    if (fd_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                              \
      ::fd::dist::detail::mpi_failed(#call, fd_mpi_rc_, __FILE__, __LINE__); \
  } while (0)
