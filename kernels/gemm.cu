// gemm: fdtrain's row-major GEMM (lib/ops/gemm.h conventions) through cuBLASLt.
//
// cuBLASLt is column-major, and a row-major m x n matrix with leading dim ld is
// the column-major n x m matrix with the same ld. So C = op(A) op(B) is run as
// C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B, its "B" is our A, its result
// is n x m. The bias epilogue adds a vector of length rows(D) = n to every
// column of D, i.e. to every row of our C: exactly the per-column bias we need.
//
// Everything the heuristic needs (descriptors, the chosen algorithm) is built
// once per (shape, leading dims, dtypes, transposes, tf32, bias, pointer
// alignments) and cached per device, so the steady state of a training step
// creates no descriptors and runs no heuristic. The cuBLASLt handle, the 32 MiB
// workspace and the cache are created lazily for the current device under a
// mutex and live until the process exits (destroying them from a static
// destructor would race the CUDA runtime's own teardown).
//
// The bias is fused into the epilogue when beta == 0 and C has the operands'
// dtype (cuBLASLt wants the bias in D's type) and the heuristic finds an
// algorithm for it; otherwise C is first filled with the bias and the GEMM runs
// with beta = 1 (beta == 0), or a broadcast-add kernel runs after it (beta != 0).
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Plans are per distinct GEMM; a run has a few dozen. The cap only guards
// against unbounded growth from ever-changing shapes (then the cache restarts).
constexpr size_t kMaxPlans = 4096;

const char* dt_name(DT dt) {
  switch (dt) {
    case DT::kF32:
      return "f32";
    case DT::kBF16:
      return "bf16";
    case DT::kF16:
      return "f16";
    default:
      return "i32";
  }
}

cudaDataType_t cuda_type(DT dt) {
  switch (dt) {
    case DT::kBF16:
      return CUDA_R_16BF;
    case DT::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// The largest power of two (at most 256, cuBLASLt's default assumption) that
// divides the address: algorithms needing more alignment are excluded.
uint32_t alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && u % a != 0) a /= 2;
  return a;
}

// C[i, j] = (beta == 0 ? 0 : beta * C[i, j]) + (bias ? bias[j] : 0) for i < m, j < n.
__global__ void scale_add_bias_kernel(void* C, DT c_dt, int64_t ldc, int64_t m, int64_t n,
                                      float beta, const void* bias, DT bias_dt) {
  const int64_t total = m * n;
  for (int64_t idx = grid_start(); idx < total; idx += grid_step()) {
    const int64_t i = idx / n, j = idx % n;
    const int64_t at = i * ldc + j;
    float v = beta == 0.0f ? 0.0f : beta * load_as_float(C, c_dt, at);
    if (bias != nullptr) v += load_as_float(bias, bias_dt, j);
    store_from_float(C, c_dt, at, v);
  }
}

void scale_add_bias(void* C, DT c_dt, int64_t ldc, int64_t m, int64_t n, float beta,
                    const void* bias, DT bias_dt) {
  scale_add_bias_kernel<<<grid_for(m * n), kBlock, 0, stream()>>>(C, c_dt, ldc, m, n, beta, bias,
                                                                  bias_dt);
  check_launch("gemm: bias/beta kernel");
}

struct PlanKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b, tf32;
  bool bias;       // a bias is added
  bool fuse_bias;  // ... and may go into the epilogue (beta == 0, C in the operands' dtype)
  DT ab_dt, c_dt;
  uint32_t align_a, align_b, align_c, align_bias;

  bool operator==(const PlanKey& o) const {
    return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
           trans_a == o.trans_a && trans_b == o.trans_b && tf32 == o.tf32 && bias == o.bias &&
           fuse_bias == o.fuse_bias && ab_dt == o.ab_dt && c_dt == o.c_dt && align_a == o.align_a &&
           align_b == o.align_b && align_c == o.align_c && align_bias == o.align_bias;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&h](uint64_t v) {
      h ^= v;
      h *= 1099511628211ull;
    };
    mix(uint64_t(key.m));
    mix(uint64_t(key.n));
    mix(uint64_t(key.k));
    mix(uint64_t(key.lda));
    mix(uint64_t(key.ldb));
    mix(uint64_t(key.ldc));
    mix(uint64_t(key.trans_a) | uint64_t(key.trans_b) << 1 | uint64_t(key.tf32) << 2 |
        uint64_t(key.bias) << 3 | uint64_t(key.fuse_bias) << 4 | uint64_t(key.ab_dt) << 8 |
        uint64_t(key.c_dt) << 16);
    mix(uint64_t(key.align_a) | uint64_t(key.align_b) << 16 | uint64_t(key.align_c) << 32 |
        uint64_t(key.align_bias) << 48);
    return size_t(h);
  }
};

// The descriptors and algorithm of one GEMM. Owns its cuBLASLt descriptors.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // cuBLASLt's A: our B
  cublasLtMatrixLayout_t b = nullptr;  // cuBLASLt's B: our A
  cublasLtMatrixLayout_t c = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo{};
  bool fused_bias = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};

// Per-device state: the handle, the workspace and the plan cache.
struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};

std::string describe(const PlanKey& key) {
  return "gemm(m=" + std::to_string(key.m) + ", n=" + std::to_string(key.n) +
         ", k=" + std::to_string(key.k) + ", lda=" + std::to_string(key.lda) +
         ", ldb=" + std::to_string(key.ldb) + ", ldc=" + std::to_string(key.ldc) +
         ", trans_a=" + std::to_string(int(key.trans_a)) +
         ", trans_b=" + std::to_string(int(key.trans_b)) + ", ab=" + dt_name(key.ab_dt) +
         ", c=" + dt_name(key.c_dt) + (key.tf32 ? ", tf32" : "") + (key.bias ? ", bias" : "") + ")";
}

void check_cublas(cublasStatus_t status, const PlanKey& key, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(describe(key) + ": " + call + ": " + cublasLtGetStatusName(status) + " (" +
                cublasLtGetStatusString(status) + ")");
  }
}

// Builds the plan for key; with_bias asks for the bias epilogue (bias is then
// the pointer whose alignment the heuristic sees). Returns null when the
// heuristic finds no algorithm; throws on any other cuBLASLt failure.
std::unique_ptr<Plan> build_plan(const DeviceState& dev, const PlanKey& key, bool with_bias,
                                 const void* bias) {
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_cublas(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F), key,
               "cublasLtMatmulDescCreate");
  auto set_op = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    check_cublas(cublasLtMatmulDescSetAttribute(plan->op, attr, value, size), key,
                 "cublasLtMatmulDescSetAttribute");
  };
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our B
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // on our A
  set_op(CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  set_op(CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  if (with_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = cuda_type(key.ab_dt);
    set_op(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    set_op(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    set_op(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  }

  // Column-major views of the row-major operands (see the top of the file).
  const cudaDataType_t ab = cuda_type(key.ab_dt);
  const cudaDataType_t cd = cuda_type(key.c_dt);
  check_cublas(cublasLtMatrixLayoutCreate(&plan->a, ab, key.trans_b ? key.k : key.n,
                                          key.trans_b ? key.n : key.k, key.ldb),
               key, "cublasLtMatrixLayoutCreate(B)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan->b, ab, key.trans_a ? key.m : key.k,
                                          key.trans_a ? key.k : key.m, key.lda),
               key, "cublasLtMatrixLayoutCreate(A)");
  check_cublas(cublasLtMatrixLayoutCreate(&plan->c, cd, key.n, key.m, key.ldc), key,
               "cublasLtMatrixLayoutCreate(C)");

  cublasLtMatmulPreference_t pref_raw = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref_raw), key, "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter> pref(
      pref_raw);
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* value, size_t size) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, value, size), key,
                 "cublasLtMatmulPreferenceSetAttribute");
  };
  const uint64_t workspace = kWorkspaceBytes;
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  // cuBLASLt's A is our B and vice versa; D is C.
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_b, sizeof(key.align_b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_a, sizeof(key.align_a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(key.align_c));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(key.align_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      dev.handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref.get(), 1, &result, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    return nullptr;
  }
  check_cublas(status, key, "cublasLtMatmulAlgoGetHeuristic");
  check_cublas(result.state, key, "cublasLtMatmulAlgoGetHeuristic (result)");
  plan->algo = result.algo;
  plan->fused_bias = with_bias;
  return plan;
}

std::mutex& state_mutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: see the top of the file
  return *mu;
}

// The state of the current device; creates it on first use. Caller holds state_mutex().
DeviceState& device_state(int device) {
  static auto* states = new std::unordered_map<int, DeviceState>;
  DeviceState& dev = (*states)[device];
  if (dev.handle == nullptr) {
    cublasLtHandle_t handle = nullptr;
    const cublasStatus_t status = cublasLtCreate(&handle);
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw Error(std::string("gemm: cublasLtCreate on device ") + std::to_string(device) + ": " +
                  cublasLtGetStatusName(status) + " (" + cublasLtGetStatusString(status) + ")");
    }
    dev.handle = handle;
  }
  if (dev.workspace == nullptr) dev.workspace = device_alloc(kWorkspaceBytes);
  return dev;
}

std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

}  // namespace

void set_tf32(bool allow) { tf32_flag().store(allow); }
bool tf32_allowed() { return tf32_flag().load(); }

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, DT ab_dt, float beta, void* C, int64_t ldc,
          DT c_dt, const void* bias) {
  require_float(ab_dt, "gemm (A and B)");
  require(c_dt == ab_dt || c_dt == DT::kF32, "gemm", "C must have the dtype of A and B, or be f32");
  require(m >= 0 && n >= 0 && k >= 0, "gemm", "negative size");
  if (m == 0 || n == 0) return;
  const PlanKey key{m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldc,
                    trans_a,
                    trans_b,
                    tf32_allowed() && ab_dt == DT::kF32,
                    bias != nullptr,
                    bias != nullptr && beta == 0.0f && c_dt == ab_dt,
                    ab_dt,
                    c_dt,
                    alignment_of(A),
                    alignment_of(B),
                    alignment_of(C),
                    bias != nullptr ? alignment_of(bias) : 0};
  if (lda < std::max<int64_t>(1, trans_a ? m : k) || ldb < std::max<int64_t>(1, trans_b ? k : n) ||
      ldc < n) {
    throw Error(describe(key) + ": a leading dimension is smaller than its row");
  }
  if (C == nullptr || (k > 0 && (A == nullptr || B == nullptr))) {
    throw Error(describe(key) + ": null matrix pointer");
  }
  if (k == 0) {  // op(A) op(B) is the zero matrix
    if (beta != 1.0f || bias != nullptr) scale_add_bias(C, c_dt, ldc, m, n, beta, bias, ab_dt);
    return;
  }

  const cudaStream_t s = stream();  // first: makes the runtime's device current on this thread
  int device = -1;
  check_cuda(cudaGetDevice(&device), "gemm: cudaGetDevice");
  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceState& dev = device_state(device);

  auto it = dev.plans.find(key);
  if (it == dev.plans.end()) {
    if (dev.plans.size() >= kMaxPlans) dev.plans.clear();
    std::unique_ptr<Plan> plan;
    if (key.fuse_bias) plan = build_plan(dev, key, true, bias);
    if (plan == nullptr) plan = build_plan(dev, key, false, nullptr);
    if (plan == nullptr) {
      throw Error(describe(key) + ": cublasLtMatmulAlgoGetHeuristic found no algorithm");
    }
    it = dev.plans.emplace(key, std::move(plan)).first;
  }
  Plan& plan = *it->second;

  float gemm_beta = beta;
  if (bias != nullptr && !plan.fused_bias) {
    if (beta == 0.0f) {
      // C = bias, then C = alpha op(A) op(B) + C: one rounding, as on the CPU.
      scale_add_bias(C, c_dt, ldc, m, n, 0.0f, bias, ab_dt);
      gemm_beta = 1.0f;
    }
  }
  if (plan.fused_bias) {
    // The pointer changes between calls with the same key; its alignment does not.
    check_cublas(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)),
                 key, "cublasLtMatmulDescSetAttribute(bias)");
  }
  // cuBLASLt's A is our B, its B is our A (the row-major swap).
  check_cublas(cublasLtMatmul(dev.handle, plan.op, &alpha, B, plan.a, A, plan.b, &gemm_beta, C,
                              plan.c, C, plan.c, &plan.algo, dev.workspace, kWorkspaceBytes, s),
               key, "cublasLtMatmul");
  if (bias != nullptr && !plan.fused_bias && beta != 0.0f) {
    scale_add_bias(C, c_dt, ldc, m, n, 1.0f, bias, ab_dt);  // C += bias
  }
}

}  // namespace fd::kernels
