// offload_bench: the NVMe tier's optimizer pass against the file system it
// runs on, in one process (issue 21).
//
//   offload_bench [--dir DIR] [--elements N] [--buffer-mib B] [--steps S] [--threads T]
//
// 1. The file system's sequential bandwidth under DIR: one file of the size
//    the state file will have, written then read in 8 MiB requests through
//    the same AsyncFile (I/O threads, O_DIRECT where allowed) the optimizer
//    uses.
// 2. AdamW over N bf16 parameters with fp32 master weights and moments in
//    memory (the resident optimizer), then offloaded to DIR (read and write
//    of 12 bytes per parameter each step, through B MiB of buffers): time per
//    step, the state traffic in MB/s, and that against the time the
//    sequential bandwidths allow for the same bytes (efficiency).
// Prints a table; asserts nothing.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "lib/base/async_file.h"
#include "lib/nn/parameter.h"
#include "lib/ops/adamw.h"
#include "lib/optim/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::string dir = "/tmp";
  int64_t elements = int64_t(64) << 20;
  int buffer_mib = 64;
  int steps = 3;
  int threads = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--elements") a.elements = std::atoll(v.c_str());
    else if (k == "--buffer-mib") a.buffer_mib = std::atoi(v.c_str());
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "offload_bench: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// Sequential write then read of `bytes` under dir, 8 MiB requests, up to 4 in flight.
void sequential(const std::string& dir, int64_t bytes, double* write_mbs, double* read_mbs,
                bool* direct) {
  const std::string path = dir + "/offload_bench_seq_" + std::to_string(::getpid());
  constexpr int64_t kReq = int64_t(8) << 20;
  bytes = (bytes + kReq - 1) / kReq * kReq;
  fd::AlignedBuffer buf[4] = {fd::AlignedBuffer(kReq), fd::AlignedBuffer(kReq),
                              fd::AlignedBuffer(kReq), fd::AlignedBuffer(kReq)};
  for (auto& b : buf) std::memset(b.data(), 0x5a, size_t(kReq));
  {
    auto f = fd::AsyncFile::create(path, bytes, fd::AsyncFile::Options{});
    *direct = f->direct();
    fd::AsyncFile::Ticket t[4] = {0, 0, 0, 0};
    auto start = Clock::now();
    for (int64_t off = 0, k = 0; off < bytes; off += kReq, ++k) {
      f->wait(t[k % 4]);
      t[k % 4] = f->write(off, buf[k % 4].data(), kReq);
    }
    f->sync();
    *write_mbs = double(bytes) / 1e6 / seconds_since(start);
    start = Clock::now();
    for (int64_t off = 0, k = 0; off < bytes; off += kReq, ++k) {
      f->wait(t[k % 4]);
      t[k % 4] = f->read(off, buf[k % 4].data(), kReq);
    }
    f->wait_all();
    *read_mbs = double(bytes) / 1e6 / seconds_since(start);
  }
  std::filesystem::remove(path);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  using fd::DType;
  using fd::Shape;
  fd::ops::set_adamw_threads(a.threads);
  // One group of N bf16 parameters (decayed), its gradients random-ish.
  fd::nn::FlatParamGroup g("bench", {{"w", Shape{a.elements}, true}}, DType::kBF16);
  {
    std::vector<float> v(size_t(a.elements));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * float(int(i % 201) - 100);
    g.flat_params().copy_from(fd::Tensor::from_vector(v, Shape{a.elements}));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 1e-4f * float(int(i % 97) - 48);
    g.flat_grads().copy_from(fd::Tensor::from_vector(v, Shape{a.elements}));
  }
  fd::optim::AdamWOptions o;
  o.weight_decay = 0.1f;
  const double state_bytes = 12.0 * double(a.elements);  // master, m, v (fp32)

  double resident_s = 0;
  {
    fd::Tensor master = g.flat_params().to(DType::kF32, fd::MemCategory::kMaster);
    fd::optim::AdamW opt({{&g, 0, g.numel(), master, g.flat_grads(), g.flat_params()}}, o);
    opt.step(1e-4f);  // warm-up: page in the moments
    const auto t = Clock::now();
    for (int s = 0; s < a.steps; ++s) opt.step(1e-4f);
    resident_s = seconds_since(t) / a.steps;
  }

  fd::optim::AdamWOffload off;
  off.stream.path = a.dir + "/offload_bench_state_" + std::to_string(::getpid());
  off.stream.path_setting = "--dir";
  off.stream.buffer_bytes = int64_t(a.buffer_mib) << 20;
  double offload_s = 0;
  int64_t file_bytes = 0;
  {
    fd::optim::AdamW opt({{&g, 0, g.numel(), fd::Tensor(), g.flat_grads(), g.flat_params()}}, o,
                         off);
    file_bytes = opt.file_bytes();
    opt.step(1e-4f);
    const auto t = Clock::now();
    for (int s = 0; s < a.steps; ++s) opt.step(1e-4f);
    offload_s = seconds_since(t) / a.steps;
  }
  double write_mbs = 0, read_mbs = 0;
  bool direct = false;
  sequential(a.dir, file_bytes, &write_mbs, &read_mbs, &direct);

  const double moved = 2.0 * double(file_bytes);  // read and written back each step
  const double floor_s = double(file_bytes) / 1e6 / read_mbs + double(file_bytes) / 1e6 / write_mbs;
  std::printf("offload_bench: %lld bf16 parameters (%.0f MB of fp32 master + Adam m, v), %s, "
              "%d MiB buffers, %d AdamW thread(s), %d timed steps\n",
              (long long)a.elements, state_bytes / 1e6, a.dir.c_str(), a.buffer_mib, a.threads,
              a.steps);
  std::printf("file system under %s (%s): sequential write %.0f MB/s, read %.0f MB/s "
              "(8 MiB requests, %lld MB)\n",
              a.dir.c_str(), direct ? "O_DIRECT" : "buffered: O_DIRECT refused",
              write_mbs, read_mbs, (long long)(file_bytes / 1000000));
  std::printf("%-34s %12s %14s %12s\n", "", "s/step", "state MB/s", "vs seq");
  std::printf("%-34s %12.3f %14.0f %12s\n", "AdamW, state in memory", resident_s,
              2 * state_bytes / 1e6 / resident_s, "");
  std::printf("%-34s %12.3f %14.0f %11.0f%%\n", "AdamW, state on file (nvme tier)", offload_s,
              moved / 1e6 / offload_s, 100.0 * floor_s / offload_s);
  std::printf("optimizer pass: offloaded / in memory = %.2fx; the file's read + write at the "
              "sequential bandwidths would take %.3f s\n",
              offload_s / resident_s, floor_s);
  return 0;
}
