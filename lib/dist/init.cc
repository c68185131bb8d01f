#include "lib/dist/init.h"

#include <fcntl.h>
#include <mpi.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/base/host_name.h"
#include "lib/dist/local_communicator.h"
#include "lib/dist/mpi_communicator.h"

namespace fd::dist {
namespace {

bool g_initialised = false;
double g_timeout_s = 600.0;  // init()'s timeout, for finalize() too
int g_guard_fd = -1;         // this process's end of the exit guard's socket, or -1

// launcher_rank() for messages: the variable's text, or "?".
const char* launcher_rank_text() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(var)) return v;
  }
  return "?";
}

// MPI_Init and MPI_Finalize wait for every rank (PMIx fences) and have no
// timeout of their own: with a rank stopped or wedged there, its peers would
// wait forever. A Watchdog ends this process if `what` takes longer than
// `seconds`; mpirun then sees a rank exit and ends the whole job.
class Watchdog {
 public:
  Watchdog(double seconds, const char* what) {
    thread_ = std::thread([this, seconds, what] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; }))
        return;
      std::fprintf(stderr,
                   "fdtrain: rank %s (pid %d): %s did not complete within %g s (dist.timeout_s): "
                   "another rank is stopped, dead or unreachable; ending the job\n",
                   launcher_rank_text(), int(::getpid()), what, seconds);
      std::fflush(stderr);
      std::_Exit(1);
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The exit guard. A rank stopped (SIGSTOP, a debugger's detach gone wrong, a
// frozen cgroup of one rank) after its peers have left MPI_Finalize has no
// live peer left to notice: every other rank exits 0 and mpirun waits for the
// stopped one forever. Only another process can see that, so a rank started
// with the guard forks a small child before MPI_Init (the process is still
// small and has no MPI state). The child does nothing until the rank reaches
// finalize() and says so over a socket; from then on, if the rank stays
// stopped for timeout_s, the child says so on stderr and SIGKILLs it, and
// mpirun ends the job non-zero. The child ends with the rank (end of file on
// the socket, and PR_SET_PDEATHSIG as a backstop) and holds nothing else open
// but stderr, so mpirun never waits for it. After fork() in a process that may
// have threads, the child only makes async-signal-safe calls.

// What the guard needs, prepared before fork() so that the child formats nothing.
struct GuardPlan {
  pid_t rank_pid;
  int limit_ms;        // how long the rank may stay stopped once armed
  char stat_path[64];  // /proc/<rank pid>/stat
  char message[320];   // written to stderr before the kill
  size_t message_len;
};

// The state letter of the process's /proc/<pid>/stat ('R', 'S', 'T' stopped, ...), or 0.
char process_state(const char* stat_path) {
  int fd = ::open(stat_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // "pid (comm) S ...": comm may hold spaces and parentheses; the state
  // follows the last ')'.
  const char* close_paren = nullptr;
  for (const char* c = buf; *c != '\0'; ++c) {
    if (*c == ')') close_paren = c;
  }
  return close_paren != nullptr && close_paren[1] == ' ' ? close_paren[2] : 0;
}

[[noreturn]] void run_exit_guard(int fd, const GuardPlan& plan) {
  for (int other = 0; other < 1024; ++other) {
    if (other != fd && other != STDERR_FILENO) ::close(other);
  }
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != plan.rank_pid) ::_exit(0);  // the rank is already gone
  ::prctl(PR_SET_NAME, "fdtrain-guard");
  bool armed = false;
  int stopped_ms = 0;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, armed ? 100 : -1);
    if (ready < 0 && errno != EINTR) ::_exit(0);
    if (ready > 0) {
      char byte = 0;
      ssize_t n = ::read(fd, &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) ::_exit(0);  // the rank ended
      if (n == 1) armed = true;
      continue;
    }
    if (!armed) continue;
    char state = process_state(plan.stat_path);
    if (state == 0 || state == 'Z' || state == 'X') ::_exit(0);
    stopped_ms = state == 'T' ? stopped_ms + 100 : 0;  // 't' (a debugger's stop) is left alone
    if (stopped_ms < plan.limit_ms) continue;
    ssize_t ignored = ::write(STDERR_FILENO, plan.message, plan.message_len);
    (void)ignored;
    ::kill(plan.rank_pid, SIGKILL);
    ::_exit(0);
  }
}

// Forks the exit guard (see above); without it (socketpair or fork failed)
// the run goes on unguarded, as any MPI program.
void start_exit_guard(double seconds) {
  GuardPlan plan{};
  plan.rank_pid = ::getpid();
  plan.limit_ms = seconds >= 1e6 ? 1000000000 : std::max(100, int(seconds * 1000));
  std::snprintf(plan.stat_path, sizeof plan.stat_path, "/proc/%d/stat", int(plan.rank_pid));
  int len = std::snprintf(plan.message, sizeof plan.message,
                          "fdtrain: rank %.16s (pid %d) stayed stopped for %g s after it finished "
                          "(dist.timeout_s); no peer is left to notice, so its guard killed it "
                          "and the job ends\n",
                          launcher_rank_text(), int(plan.rank_pid), seconds);
  plan.message_len = len > 0 ? std::min(size_t(len), sizeof plan.message - 1) : 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  pid_t child = ::fork();
  if (child == 0) run_exit_guard(fds[1], plan);
  ::close(fds[1]);
  if (child < 0) {
    ::close(fds[0]);
    return;
  }
  g_guard_fd = fds[0];
}

// Tells the exit guard that this rank is about to finalise.
void arm_exit_guard() {
  if (g_guard_fd < 0) return;
  char byte = 1;
  ssize_t ignored = ::send(g_guard_fd, &byte, 1, MSG_NOSIGNAL);  // a dead guard is no error
  (void)ignored;
}

// Which MPI world the environment announces: > 1 means "use mpi".
bool launched_with_mpi_world() {
  const char* force = std::getenv("FDTRAIN_FORCE_MPI");
  if (force != nullptr && std::string(force) == "1") return true;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v) > 1;
  }
  return std::getenv("PMIX_RANK") != nullptr;
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return std::to_string(level);
}

}  // namespace

int launcher_rank() {
  const char* text = launcher_rank_text();
  char* end = nullptr;
  const long rank = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && rank >= 0 ? int(rank) : -1;
}

namespace {

// Every world rank's node (Communicator::set_nodes): the ranks that share memory
// (MPI_COMM_TYPE_SHARED: one host), the nodes numbered in the order of their lowest ranks.
struct Nodes {
  std::vector<int> of_rank;        // node id per world rank
  std::vector<std::string> names;  // host name per node id
};

Nodes discover_nodes(double timeout_s) {
  Watchdog watchdog(timeout_s, "MPI node discovery (MPI_Comm_split_type)");
  int rank = 0, size = 0;
  FD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  FD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  MPI_Comm local = MPI_COMM_NULL;
  FD_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  int lowest = rank;
  FD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, local));
  FD_MPI_CHECK(MPI_Comm_free(&local));
  std::vector<int> lowest_of(static_cast<size_t>(size));
  FD_MPI_CHECK(MPI_Allgather(&lowest, 1, MPI_INT, lowest_of.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::vector<int> leaders = lowest_of;
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  Nodes nodes;
  for (int l : lowest_of)
    nodes.of_rank.push_back(
        int(std::lower_bound(leaders.begin(), leaders.end(), l) - leaders.begin()));
  // Host names, for messages: each node's first rank's.
  constexpr int kName = 64;
  char mine[kName] = {};
  const std::string host = host_name();
  std::memcpy(mine, host.data(), std::min<size_t>(host.size(), kName - 1));
  std::vector<char> all(size_t(size) * kName);
  FD_MPI_CHECK(MPI_Allgather(mine, kName, MPI_CHAR, all.data(), kName, MPI_CHAR, MPI_COMM_WORLD));
  for (int l : leaders)
    nodes.names.emplace_back(all.data() + size_t(l) * kName,
                             strnlen(all.data() + size_t(l) * kName, kName));
  return nodes;
}

}  // namespace

std::unique_ptr<Communicator> init(int* argc, char*** argv, double timeout_s, bool exit_guard) {
  FD_CHECK(!g_initialised, "dist::init() called twice");
  FD_CHECK(timeout_s > 0, "timeout {}", timeout_s);
  g_initialised = true;
  g_timeout_s = timeout_s;
  if (!launched_with_mpi_world()) return std::make_unique<LocalCommunicator>();
  if (exit_guard) start_exit_guard(timeout_s);

  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_SUCCESS;
  {
    Watchdog watchdog(timeout_s, "MPI initialisation");
    rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  }
  if (rc != MPI_SUCCESS) {
    runtime_error("MPI_Init_thread failed (code {}); check the MPI installation and launcher", rc);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    runtime_error(
        "the MPI library provides only {}, but fdtrain's communication thread needs "
        "MPI_THREAD_MULTIPLE; use an MPI built with thread support (Open MPI >= 3 is)",
        thread_level_name(provided));
  }
  FD_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  Nodes nodes = discover_nodes(timeout_s);
  auto comm = std::make_unique<MpiCommunicator>();
  comm->set_timeout(timeout_s);  // from the first collective on
  comm->set_nodes(std::move(nodes.of_rank), std::move(nodes.names));
  return comm;
}

void finalize() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  detail::shutdown_live_communicators();
  arm_exit_guard();
  Watchdog watchdog(g_timeout_s, "MPI_Finalize");
  MPI_Finalize();
}

}  // namespace fd::dist
