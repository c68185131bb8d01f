// RunLock: one job per run directory.
//
// Rank 0 of a training job holds an exclusive flock(2) on RUN/.lock for the
// job's whole life, taken before anything in RUN is read for resuming or
// changed. A second job on the same directory is refused (usage error, exit
// 2) with the holder's pid, host and start time, which the holder writes into
// the file. The lock is the kernel's: it goes away with the process however it
// ends (a crash, SIGKILL), so a stale .lock file never blocks a later job.
//
// flock works between processes on one host and on local file systems; on
// NFS it is emulated with POSIX locks on Linux (>= 2.6.12), which is enough
// for jobs started on different nodes of a cluster sharing the directory.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace fd::engine {

class RunLock {
 public:
  // Takes the lock on `dir`/.lock (dir must exist). Throws fd::Error kUsage
  // when another process holds it, naming that process; kUsage also when the
  // file cannot be created (no permission).
  explicit RunLock(const std::filesystem::path& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // Who holds the lock on `dir`, as "pid N on host H since T", or nullopt when
  // nobody does (or there is no .lock file). Does not take the lock.
  static std::optional<std::string> holder(const std::filesystem::path& dir);

 private:
  int fd_ = -1;
};

}  // namespace fd::engine
