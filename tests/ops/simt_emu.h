// A CPU emulation of the CUDA execution model, just large enough to run the
// tensor-core attention kernels' own code (kernels/attention_mma.cuh) on the
// CPU: every thread of a block is a fiber (ucontext), blocks run one after
// another in launch order, and the primitives of kernels/mma_ops.cuh are
// defined here from the PTX ISA's rules (not from kernels/flash_layout.h,
// whose index math they check):
//   - __syncthreads: a barrier over the block's threads; a warp collective
//     (shuffle, ldmatrix, mma.sync) a barrier over the warp's 32 lanes, each
//     lane posting its operands before and reading its results after;
//   - ldmatrix.m8n8.x4(.trans).b16: lanes 8i .. 8i + 7 give the addresses of
//     matrix i's eight 16-byte rows; without .trans lane l receives row l / 4,
//     elements 2 (l % 4) and 2 (l % 4) + 1, with .trans column l / 4 of rows
//     2 (l % 4) and 2 (l % 4) + 1 (low half first);
//   - mma.sync.m16n8k16.row.col.f32 over bf16 or f16: with g = l / 4 and
//     t = l % 4, A registers a0..a3 hold (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..),
//     (g+8, 2t+8..); B registers b0, b1 hold (k = 2t..2t+1, n = g), (k = 2t+8.., n = g);
//     C values c0..c3 are (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1); the
//     products are exact in fp32 and summed in k order (the hardware's order is
//     unspecified, so results are compared with a tolerance);
//   - cp.async: a copy lands when a cp.async.wait_group covers its group
//     (Landing::kLate: a read before the wait sees the 0xFF bytes shared memory
//     is filled with, NaN in bf16 and f16) or at once (Landing::kEarly);
//   - the order threads run in: in turn, each running to its next barrier
//     (Schedule::kLockstep: the warps move together, one collective at a time),
//     or each warp as far as it can go before the next one starts, from warp 0
//     up (Schedule::kLowWarpsFirst) or from the last warp down
//     (kHighWarpsFirst): with early landing, a refill that is not fenced off
//     from another warp's reads by a __syncthreads corrupts them;
// and every shared-memory access is checked against the launch's size and
// 16-byte alignment. A deadlock (every live thread waiting, no barrier
// opening) or a bad access fails the launch with a message. (The kernels'
// #pragma unroll is nvcc's: a file including this one is compiled with
// -Wno-unknown-pragmas, tests/CMakeLists.txt.)
#pragma once

#define FD_SIMT_EMU 1

#include <math.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "lib/tensor/dtype.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

// Switching between fibers: on x86-64 a few instructions (callee-saved
// registers and the stack pointer; glibc's swapcontext also saves the signal
// mask, one system call per switch, which made these tests nearly 4x slower); under
// the sanitizers, which must see the switches, and elsewhere, ucontext.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define FD_SIMT_EMU_FAST_SWITCH 1
// Saves the callee-saved registers on the current stack, stores the stack
// pointer in *save, and resumes the stack `to` (saved the same way).
extern "C" void fd_simt_emu_switch(void** save, void* to);
asm(R"(
  .text
  .globl fd_simt_emu_switch
  .type fd_simt_emu_switch, @function
fd_simt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size fd_simt_emu_switch, .-fd_simt_emu_switch
)");
#endif

namespace fd::kernels::simt_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class Landing { kLate, kEarly };
enum class Schedule { kLockstep, kLowWarpsFirst, kHighWarpsFirst };
struct Mode {
  Landing landing = Landing::kLate;
  Schedule schedule = Schedule::kLockstep;
};

struct Copy {
  uint32_t dst;
  const void* src;
  bool valid;
};

struct Fiber {
  ucontext_t ctx{};    // without FD_SIMT_EMU_FAST_SWITCH
  void* sp = nullptr;  // with it
  std::unique_ptr<char[]> stack;
  Dim3 tid;
  bool done = false;
  std::vector<Copy> open;                 // cp.async's not yet committed
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

struct Warp {
  int count = 0;
  uint64_t gen = 0;
  uint64_t slot[32][8] = {};
};

struct Machine {
  Dim3 grid, block, block_idx;
  Landing landing = Landing::kLate;
  Schedule schedule = Schedule::kLockstep;
  std::vector<unsigned char> smem;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int current = -1;
  int threads = 0;
  ucontext_t scheduler{};
  void* scheduler_sp = nullptr;
  int block_count = 0;
  uint64_t block_gen = 0;
  uint64_t progress = 0;
  std::string error;
  const std::function<void()>* body = nullptr;
};

inline Machine& machine() {
  static Machine m;
  return m;
}
inline Fiber& fiber() { return machine().fibers[size_t(machine().current)]; }
inline const Dim3& this_thread() { return fiber().tid; }
inline int linear_tid() {
  const Dim3& t = this_thread();
  const Machine& m = machine();
  return int(t.x + m.block.x * (t.y + m.block.y * t.z));
}

// Back to the scheduler.
inline void yield() {
  Machine& m = machine();
  Fiber& f = fiber();
#if defined(FD_SIMT_EMU_FAST_SWITCH)
  fd_simt_emu_switch(&f.sp, m.scheduler_sp);
#else
  swapcontext(&f.ctx, &m.scheduler);
#endif
}

// Ends the launch with `message` (thrown by launch()); this thread never resumes.
[[noreturn]] inline void fail(const std::string& message) {
  Machine& m = machine();
  if (m.error.empty()) {
    m.error = "block (" + std::to_string(m.block_idx.x) + ", " + std::to_string(m.block_idx.y) +
              ") thread " + std::to_string(linear_tid()) + ": " + message;
  }
  for (;;) yield();
}

inline void block_barrier() {
  Machine& m = machine();
  const uint64_t gen = m.block_gen;
  if (++m.block_count == m.threads) {
    m.block_count = 0;
    ++m.block_gen;
    ++m.progress;
    return;
  }
  while (m.block_gen == gen) yield();
}

inline Warp& this_warp() { return machine().warps[size_t(linear_tid() / 32)]; }
inline int lane() { return linear_tid() % 32; }

inline void warp_barrier() {
  Machine& m = machine();
  Warp& w = this_warp();
  const uint64_t gen = w.gen;
  if (++w.count == 32) {
    w.count = 0;
    ++w.gen;
    ++m.progress;
    return;
  }
  while (w.gen == gen) yield();
}

// A shared-memory address (an offset into the block's buffer) checked for
// `bytes` in bounds and `align`-byte alignment.
inline unsigned char* smem_at(uint32_t addr, size_t bytes, size_t align, const char* what) {
  Machine& m = machine();
  if (addr % align != 0)
    fail(std::string(what) + ": shared address " + std::to_string(addr) + " not " +
         std::to_string(align) + "-byte aligned");
  if (size_t(addr) + bytes > m.smem.size()) {
    fail(std::string(what) + ": shared address " + std::to_string(addr) + " + " +
         std::to_string(bytes) + " past the launch's " + std::to_string(m.smem.size()) + " bytes");
  }
  return m.smem.data() + addr;
}

inline void land(const Copy& c) {
  unsigned char* dst = smem_at(c.dst, 16, 16, "cp.async");
  if (c.valid) {
    std::memcpy(dst, c.src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
}

// A thread's life: the kernel, then back to the scheduler for good.
inline void fiber_entry() {
  Machine& m = machine();
  (*m.body)();
  fiber().done = true;
  for (;;) yield();
}

// Readies f to start fiber_entry on its stack of `bytes`.
inline void start_fiber(Fiber& f, size_t bytes) {
#if defined(FD_SIMT_EMU_FAST_SWITCH)
  // The stack as fd_simt_emu_switch leaves it: six saved registers, then the
  // address `ret` jumps to, then a null return address for fiber_entry, which
  // so starts with the stack aligned as after a call.
  auto top = reinterpret_cast<uintptr_t>(f.stack.get() + bytes) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;
  *--sp = reinterpret_cast<void*>(&fiber_entry);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_entry, 0);
#endif
}

// Runs body() as every thread of every block of a grid, blocks in launch order
// (x fastest), with `smem_bytes` of dynamic shared memory filled with 0xFF.
// Throws std::runtime_error on a deadlock or a bad shared-memory access.
inline void launch(Dim3 grid, Dim3 block, size_t smem_bytes, const std::function<void()>& body,
                   Mode mode = {}) {
  Machine& m = machine();
  m.grid = grid;
  m.block = block;
  m.landing = mode.landing;
  m.schedule = mode.schedule;
  m.threads = int(block.x * block.y * block.z);
  if (m.threads % 32 != 0) throw std::runtime_error("simt_emu: block size not a multiple of 32");
  m.body = &body;
  constexpr size_t kStack = 256 * 1024;
  m.fibers.clear();
  m.fibers.resize(size_t(m.threads));
  for (Fiber& f : m.fibers) f.stack = std::make_unique<char[]>(kStack);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        m.block_idx = {bx, by, bz};
        m.smem.assign(smem_bytes, 0xFF);
        m.warps.assign(size_t(m.threads / 32), Warp{});
        m.block_count = 0;
        m.error.clear();
        for (int i = 0; i < m.threads; ++i) {
          Fiber& f = m.fibers[size_t(i)];
          f.done = false;
          f.open.clear();
          f.groups.clear();
          f.tid = {unsigned(i) % block.x, unsigned(i) / block.x % block.y,
                   unsigned(i) / (block.x * block.y)};
          start_fiber(f, kStack);
        }
        // Runs thread i once, to its next wait; false when the launch failed.
        int live = m.threads;
        auto step = [&](int i) {
          Fiber& f = m.fibers[size_t(i)];
          if (f.done) return true;
          m.current = i;
#if defined(FD_SIMT_EMU_FAST_SWITCH)
          fd_simt_emu_switch(&m.scheduler_sp, f.sp);
#else
          swapcontext(&m.scheduler, &f.ctx);
#endif
          if (!m.error.empty()) return false;
          if (f.done) {
            --live;
            ++m.progress;
          }
          return true;
        };
        const int warps = m.threads / 32;
        while (live > 0) {
          const uint64_t before = m.progress;
          for (int wi = 0; wi < warps; ++wi) {
            const int w = m.schedule == Schedule::kHighWarpsFirst ? warps - 1 - wi : wi;
            const int first = m.schedule == Schedule::kLockstep ? 0 : 32 * w;
            const int end = m.schedule == Schedule::kLockstep ? m.threads : first + 32;
            // Lockstep: every thread once per pass. Otherwise this warp's threads
            // in turn until none of them gets further (all at a block barrier, or done).
            for (;;) {
              const uint64_t mark = m.progress;
              for (int i = first; i < end; ++i)
                if (!step(i)) throw std::runtime_error("simt_emu: " + m.error);
              if (m.schedule == Schedule::kLockstep || m.progress == mark) break;
            }
            if (m.schedule == Schedule::kLockstep) break;
          }
          if (live > 0 && m.progress == before) {
            throw std::runtime_error("simt_emu: block (" + std::to_string(bx) + ", " +
                                     std::to_string(by) + ") deadlocked: " + std::to_string(live) +
                                     " threads wait on barriers that "
                                     "cannot open");
          }
        }
      }
  m.current = -1;
}

inline uint16_t bits16(uint32_t reg, int half) { return uint16_t(half == 0 ? reg : reg >> 16); }

template <DT kDt>
inline float to_float(uint16_t b) {
  return kDt == DT::kBF16 ? bf16_to_f32(b) : f16_to_f32(b);
}

}  // namespace fd::kernels::simt_emu

#define threadIdx (::fd::kernels::simt_emu::this_thread())
#define blockIdx (::fd::kernels::simt_emu::machine().block_idx)
#define gridDim (::fd::kernels::simt_emu::machine().grid)
#define blockDim (::fd::kernels::simt_emu::machine().block)

// The primitives of kernels/mma_ops.cuh.
namespace fd::kernels::mma {

template <typename T>
inline T* dynamic_smem() {
  return reinterpret_cast<T*>(simt_emu::machine().smem.data());
}

inline uint32_t smem_addr(const void* p) {
  auto& m = simt_emu::machine();
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < m.smem.data() || c > m.smem.data() + m.smem.size()) {
    simt_emu::fail("smem_addr of a pointer outside shared memory");
  }
  return uint32_t(c - m.smem.data());
}

inline void cp_async16(uint32_t dst, const void* src, bool valid) {
  simt_emu::smem_at(dst, 16, 16, "cp.async");
  if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    simt_emu::fail("cp.async: global source not 16-byte aligned");
  }
  const simt_emu::Copy c{dst, src, valid};
  if (simt_emu::machine().landing == simt_emu::Landing::kEarly) {
    simt_emu::land(c);
  } else {
    simt_emu::fiber().open.push_back(c);
  }
}
inline void cp_async_commit() {
  simt_emu::Fiber& f = simt_emu::fiber();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
template <int kPending>
inline void cp_async_wait() {
  simt_emu::Fiber& f = simt_emu::fiber();
  while (f.groups.size() > size_t(kPending)) {
    for (const simt_emu::Copy& c : f.groups.front()) simt_emu::land(c);
    f.groups.erase(f.groups.begin());
  }
}

inline void sync_threads() {
  // A thread's own copies stay in flight across a barrier, as on the GPU.
  simt_emu::block_barrier();
}

inline float load_l2(const float* p) { return *p; }
inline void store_l2(float* p, float v) { *p = v; }

// Blocks run one after another in launch order here: the block that releases
// `count` ran before, so the value must already be there.
inline void wait_count(const int* count, int value) {
  if (*count != value) {
    simt_emu::fail("wait_count: waits for " + std::to_string(value) +
                   " but an earlier block left " + std::to_string(*count) +
                   " (the order of the releases is broken)");
  }
}
inline void release_count(int* count, int value) { *count = value; }

inline float shfl_xor(float v, int mask) {
  simt_emu::Warp& w = simt_emu::this_warp();
  const int l = simt_emu::lane();
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  w.slot[l][0] = bits;
  simt_emu::warp_barrier();
  const uint32_t other = uint32_t(w.slot[l ^ mask][0]);
  simt_emu::warp_barrier();
  float r;
  std::memcpy(&r, &other, 4);
  return r;
}

inline void ldmatrix_x4_impl(uint32_t (&r)[4], uint32_t addr, bool trans) {
  simt_emu::Warp& w = simt_emu::this_warp();
  const int l = simt_emu::lane();
  w.slot[l][0] = addr;
  simt_emu::warp_barrier();
  const int g = l / 4, t = l % 4;
  auto element = [&](int matrix, int row, int col) {
    const uint32_t a = uint32_t(w.slot[8 * matrix + row][0]);
    const unsigned char* p = simt_emu::smem_at(a, 16, 16, "ldmatrix");
    uint16_t v;
    std::memcpy(&v, p + 2 * col, 2);
    return uint32_t(v);
  };
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = trans ? element(i, 2 * t, g) : element(i, g, 2 * t);
    const uint32_t hi = trans ? element(i, 2 * t + 1, g) : element(i, g, 2 * t + 1);
    r[i] = lo | (hi << 16);
  }
  simt_emu::warp_barrier();
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { ldmatrix_x4_impl(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { ldmatrix_x4_impl(r, addr, true); }

template <DT kDt>
inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(kDt == DT::kBF16 || kDt == DT::kF16, "tensor-core attention takes bf16 or f16");
  simt_emu::Warp& w = simt_emu::this_warp();
  const int l = simt_emu::lane();
  for (int i = 0; i < 4; ++i) w.slot[l][i] = a[i];
  w.slot[l][4] = b0;
  w.slot[l][5] = b1;
  simt_emu::warp_barrier();
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      const auto reg = [&](int i) { return uint32_t(w.slot[lane][i]); };
      A[g][2 * t + h] = simt_emu::to_float<kDt>(simt_emu::bits16(reg(0), h));
      A[g + 8][2 * t + h] = simt_emu::to_float<kDt>(simt_emu::bits16(reg(1), h));
      A[g][2 * t + 8 + h] = simt_emu::to_float<kDt>(simt_emu::bits16(reg(2), h));
      A[g + 8][2 * t + 8 + h] = simt_emu::to_float<kDt>(simt_emu::bits16(reg(3), h));
      B[2 * t + h][g] = simt_emu::to_float<kDt>(simt_emu::bits16(reg(4), h));
      B[2 * t + 8 + h][g] = simt_emu::to_float<kDt>(simt_emu::bits16(reg(5), h));
    }
  }
  simt_emu::warp_barrier();
  const int g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    c[i] = acc;
  }
}

template <DT kDt>
inline uint32_t pack2(float lo, float hi) {
  if constexpr (kDt == DT::kBF16) {
    return uint32_t(f32_to_bf16(lo)) | uint32_t(f32_to_bf16(hi)) << 16;
  } else {
    return uint32_t(f32_to_f16(lo)) | uint32_t(f32_to_f16(hi)) << 16;
  }
}

inline float load_as_float(const void* p, DT dt, int64_t i) {
  switch (dt) {
    case DT::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DT::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

inline void store_from_float(void* p, DT dt, int64_t i, float v) {
  switch (dt) {
    case DT::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DT::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

}  // namespace fd::kernels::mma
