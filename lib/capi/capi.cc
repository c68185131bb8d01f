// The C API (include/fd.h, include/tm.h) over the C++ library.
//
// Every entry point catches everything: argument checks throw ApiError before
// any C++ call whose FD_CHECK would abort on the same mistake, and fd::Error
// or std::exception from below become TM_ERR_RUNTIME. The message goes to a
// thread-local string read by tm_last_error / fd_last_error.
//
// A tm_tensor is a heap handle holding an autograd::Variable (a shared handle
// to the data and gradient slot), so freeing a handle never frees what the
// tape or an optimizer still uses. tm_adamw_create moves its parameters into
// one FlatParamGroup (one segment of a one-segment Module) and rebinds each
// handle to a bound leaf over its views; fd_zero_wrap runs a ZeroEngine over
// that Module, driven through acquire_all()/reduce_all() because the C
// caller's forward does not go through SegmentRunner::run.
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/autograd/segment.h"
#include "lib/autograd/tape.h"
#include "lib/base/error.h"
#include "lib/capi/include/fd.h"
#include "lib/dist/init.h"
#include "lib/nn/module.h"
#include "lib/ops/cross_entropy.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/gelu.h"
#include "lib/ops/layernorm.h"
#include "lib/ops/matmul.h"
#include "lib/optim/adamw.h"
#include "lib/zero/zero_engine.h"

using fd::DType;
using fd::Shape;
using fd::Tensor;
using fd::autograd::Variable;

struct tm_tensor {
  Variable var;
};

namespace {

// One group holding every parameter of a tm_adamw.
class CapiModule : public fd::nn::Module {
 public:
  explicit CapiModule(std::unique_ptr<fd::nn::FlatParamGroup> group) : group_(std::move(group)) {}
  std::vector<const fd::nn::Parameter*> parameters() const override {
    std::vector<const fd::nn::Parameter*> out;
    for (const auto& p : group_->params()) out.push_back(&p);
    return out;
  }
  std::vector<const fd::nn::FlatParamGroup*> groups() const override { return {group_.get()}; }
  const fd::nn::FlatParamGroup& group() const { return *group_; }

 private:
  std::unique_ptr<fd::nn::FlatParamGroup> group_;
};

}  // namespace

struct tm_adamw {
  std::unique_ptr<CapiModule> module;
  fd::optim::AdamWOptions options;
  Tensor master;  // fp32 copy of 16-bit parameters (undefined for fp32)
  std::unique_ptr<fd::optim::AdamW> adamw;
  bool wrapped = false;               // handed to fd_zero_wrap: ZeRO steps it from now on
  fd_zero_optimizer* zero = nullptr;  // the live wrapper, if any
};

struct fd_zero_optimizer {
  tm_adamw* opt = nullptr;
  std::unique_ptr<fd::zero::ZeroEngine> engine;
  double last_grad_norm = -1.0;
};

namespace {

thread_local std::string g_error;
std::unique_ptr<fd::dist::Communicator> g_comm;
bool g_initialised = false;
bool g_finalised = false;
int g_live_wrappers = 0;

struct ApiError {
  tm_status status;
  std::string message;
};

template <typename... Args>
[[noreturn]] void fail(tm_status s, fmt::format_string<Args...> f, Args&&... args) {
  throw ApiError{s, fmt::format(f, std::forward<Args>(args)...)};
}

// Runs body, turning every exception into a status and the thread's message.
template <typename F>
tm_status guarded(F&& body) {
  try {
    body();
    return TM_OK;
  } catch (const ApiError& e) {
    g_error = e.message;
    return e.status;
  } catch (const fd::Error& e) {
    g_error = e.what();
    return e.kind() == fd::ErrorKind::kUsage ? TM_ERR_ARG : TM_ERR_RUNTIME;
  } catch (const std::exception& e) {
    g_error = e.what();
    return TM_ERR_RUNTIME;
  } catch (...) {
    g_error = "unknown C++ exception";
    return TM_ERR_RUNTIME;
  }
}

// The same for functions returning a new tensor (NULL on error).
template <typename F>
tm_tensor* guarded_tensor(F&& body) {
  tm_tensor* out = nullptr;
  guarded([&] { out = new tm_tensor{body()}; });
  return out;
}

const Variable& need(const tm_tensor* t, const char* fn, const char* arg) {
  if (t == nullptr) fail(TM_ERR_ARG, "{}: {} is NULL", fn, arg);
  if (!t->var.defined()) fail(TM_ERR_ARG, "{}: {} is not a tensor", fn, arg);
  if (!t->var.value().storage()->resident())
    fail(TM_ERR_STATE, "{}: the data of {} is not resident on this rank", fn, arg);
  return t->var;
}

const Variable& need_float(const tm_tensor* t, const char* fn, const char* arg) {
  const Variable& v = need(t, fn, arg);
  if (v.dtype() == DType::kI32)
    fail(TM_ERR_ARG, "{}: {} is i32; a float tensor is needed", fn, arg);
  return v;
}

void need_count(const Tensor& t, size_t count, const char* fn) {
  if (count != size_t(t.numel()))
    fail(TM_ERR_ARG, "{}: count {} for a tensor of {} elements {}", fn, count, t.numel(),
         t.shape().str());
}

fd::dist::Communicator& comm(const char* fn) {
  if (!g_initialised || !g_comm) fail(TM_ERR_STATE, "{}: call fd_init first", fn);
  return *g_comm;
}

DType to_dtype(tm_dtype d, const char* fn) {
  switch (d) {
    case TM_F32:
      return DType::kF32;
    case TM_BF16:
      return DType::kBF16;
    case TM_F16:
      return DType::kF16;
    case TM_I32:
      return DType::kI32;
  }
  fail(TM_ERR_ARG, "{}: unknown dtype {}", fn, int(d));
}

tm_dtype from_dtype(DType d) {
  switch (d) {
    case DType::kF32:
      return TM_F32;
    case DType::kBF16:
      return TM_BF16;
    case DType::kF16:
      return TM_F16;
    case DType::kI32:
      return TM_I32;
    case DType::kU8:
      fail(TM_ERR_ARG, "a u8 tensor (4-bit storage) has no C API dtype");
  }
  return TM_F32;
}

}  // namespace

extern "C" {

const char* tm_last_error(void) { return g_error.c_str(); }
const char* fd_last_error(void) { return g_error.c_str(); }

// ---- Tensors ----

tm_tensor* tm_create(const int64_t* dims, int ndim, tm_dtype dtype, int requires_grad) {
  return guarded_tensor([&] {
    if (ndim < 0 || ndim > TM_MAX_DIMS) fail(TM_ERR_ARG, "tm_create: ndim {} not in [0, 8]", ndim);
    if (ndim > 0 && dims == nullptr) fail(TM_ERR_ARG, "tm_create: dims is NULL");
    for (int i = 0; i < ndim; ++i)
      if (dims[i] < 0) fail(TM_ERR_ARG, "tm_create: dims[{}] = {} is negative", i, dims[i]);
    const DType dt = to_dtype(dtype, "tm_create");
    if (requires_grad && dt == DType::kI32)
      fail(TM_ERR_ARG, "tm_create: an i32 tensor cannot require grad");
    Shape shape(std::span<const int64_t>(dims, size_t(ndim)));
    return Variable(Tensor::zeros(shape, dt), requires_grad != 0);
  });
}

void tm_free(tm_tensor* t) { delete t; }

int tm_ndim(const tm_tensor* t) { return t && t->var.defined() ? t->var.shape().ndim() : -1; }

int64_t tm_dim(const tm_tensor* t, int i) {
  if (!t || !t->var.defined() || i < 0 || i >= t->var.shape().ndim()) return -1;
  return t->var.shape()[i];
}

int64_t tm_numel(const tm_tensor* t) { return t && t->var.defined() ? t->var.value().numel() : -1; }

tm_dtype tm_get_dtype(const tm_tensor* t) {
  return t && t->var.defined() ? from_dtype(t->var.dtype()) : TM_F32;
}

tm_status tm_write_f32(tm_tensor* t, const float* src, size_t count) {
  return guarded([&] {
    const Tensor& v = need_float(t, "tm_write_f32", "t").value();
    need_count(v, count, "tm_write_f32");
    if (count > 0 && src == nullptr) fail(TM_ERR_ARG, "tm_write_f32: src is NULL");
    fd::convert_f32_to(v.dtype(), src, v.raw(), count);
  });
}

tm_status tm_read_f32(const tm_tensor* t, float* dst, size_t count) {
  return guarded([&] {
    const Tensor& v = need_float(t, "tm_read_f32", "t").value();
    need_count(v, count, "tm_read_f32");
    if (count > 0 && dst == nullptr) fail(TM_ERR_ARG, "tm_read_f32: dst is NULL");
    fd::convert_to_f32(v.dtype(), v.raw(), dst, count);
  });
}

tm_status tm_write_i32(tm_tensor* t, const int32_t* src, size_t count) {
  return guarded([&] {
    const Tensor& v = need(t, "tm_write_i32", "t").value();
    if (v.dtype() != DType::kI32) fail(TM_ERR_ARG, "tm_write_i32: t is not an i32 tensor");
    need_count(v, count, "tm_write_i32");
    if (count > 0 && src == nullptr) fail(TM_ERR_ARG, "tm_write_i32: src is NULL");
    std::copy(src, src + count, v.data<int32_t>());
  });
}

tm_status tm_read_i32(const tm_tensor* t, int32_t* dst, size_t count) {
  return guarded([&] {
    const Tensor& v = need(t, "tm_read_i32", "t").value();
    if (v.dtype() != DType::kI32) fail(TM_ERR_ARG, "tm_read_i32: t is not an i32 tensor");
    need_count(v, count, "tm_read_i32");
    if (count > 0 && dst == nullptr) fail(TM_ERR_ARG, "tm_read_i32: dst is NULL");
    std::copy(v.data<int32_t>(), v.data<int32_t>() + count, dst);
  });
}

tm_status tm_read_grad_f32(const tm_tensor* t, float* dst, size_t count) {
  return guarded([&] {
    const Variable& v = need_float(t, "tm_read_grad_f32", "t");
    if (!v.requires_grad()) fail(TM_ERR_ARG, "tm_read_grad_f32: t does not require grad");
    need_count(v.value(), count, "tm_read_grad_f32");
    if (count > 0 && dst == nullptr) fail(TM_ERR_ARG, "tm_read_grad_f32: dst is NULL");
    if (!v.slot()->has_grad()) {
      std::fill(dst, dst + count, 0.0f);
      return;
    }
    const Tensor& g = v.grad();
    if (!g.storage()->resident()) fail(TM_ERR_STATE, "tm_read_grad_f32: gradient not resident");
    fd::convert_to_f32(g.dtype(), g.raw(), dst, count);
  });
}

tm_status tm_zero_grad(tm_tensor* t) {
  return guarded([&] {
    const Variable& v = need_float(t, "tm_zero_grad", "t");
    if (!v.requires_grad()) fail(TM_ERR_ARG, "tm_zero_grad: t does not require grad");
    // Through ensure_grad: a gradient shared with another slot (a residual add's two inputs)
    // is copied before it is cleared, so the other keeps its values.
    if (v.slot()->has_grad() && v.grad().storage()->resident()) v.slot()->ensure_grad().zero_();
  });
}

// ---- Ops ----

tm_tensor* tm_matmul(const tm_tensor* a, const tm_tensor* b, const tm_tensor* bias) {
  return guarded_tensor([&] {
    const Variable& va = need_float(a, "tm_matmul", "a");
    const Variable& vb = need_float(b, "tm_matmul", "b");
    const Shape& as = va.shape();
    const Shape& bs = vb.shape();
    if (bs.ndim() != 2) fail(TM_ERR_ARG, "tm_matmul: b must be 2-D (K, N), got {}", bs.str());
    if (as.ndim() < 1) fail(TM_ERR_ARG, "tm_matmul: a must have at least 1 dimension");
    if (as.cols() != bs[0])
      fail(TM_ERR_ARG, "tm_matmul: a {} and b {}: a's last dim must equal b's first", as.str(),
           bs.str());
    Variable vbias;
    if (bias != nullptr) {
      vbias = need_float(bias, "tm_matmul", "bias");
      if (vbias.shape() != Shape{bs[1]})
        fail(TM_ERR_ARG, "tm_matmul: bias {} for N = {}; expected ({})", vbias.shape().str(), bs[1],
             bs[1]);
    }
    return fd::ops::matmul(va, vb, vbias);
  });
}

tm_tensor* tm_add(const tm_tensor* a, const tm_tensor* b) {
  return guarded_tensor([&] {
    const Variable& va = need_float(a, "tm_add", "a");
    const Variable& vb = need_float(b, "tm_add", "b");
    if (va.shape() != vb.shape())
      fail(TM_ERR_ARG, "tm_add: shapes {} and {} differ", va.shape().str(), vb.shape().str());
    return fd::ops::add(va, vb);
  });
}

tm_tensor* tm_gelu(const tm_tensor* x) {
  return guarded_tensor([&] { return fd::ops::gelu(need_float(x, "tm_gelu", "x")); });
}

tm_tensor* tm_layernorm(const tm_tensor* x, const tm_tensor* weight, const tm_tensor* bias,
                        float eps) {
  return guarded_tensor([&] {
    const Variable& vx = need_float(x, "tm_layernorm", "x");
    const Variable& vw = need_float(weight, "tm_layernorm", "weight");
    if (vx.shape().ndim() < 1) fail(TM_ERR_ARG, "tm_layernorm: x must have at least 1 dimension");
    const int64_t C = vx.shape().cols();
    if (vw.shape() != Shape{C})
      fail(TM_ERR_ARG, "tm_layernorm: weight {} for x {}; expected ({})", vw.shape().str(),
           vx.shape().str(), C);
    Variable vb;
    if (bias != nullptr) {
      vb = need_float(bias, "tm_layernorm", "bias");
      if (vb.shape() != Shape{C})
        fail(TM_ERR_ARG, "tm_layernorm: bias {} for x {}; expected ({})", vb.shape().str(),
             vx.shape().str(), C);
    }
    if (!(eps > 0.0f)) fail(TM_ERR_ARG, "tm_layernorm: eps {} must be > 0", eps);
    return fd::ops::layernorm(vx, vw, vb, eps);
  });
}

tm_tensor* tm_cross_entropy(const tm_tensor* logits, const tm_tensor* targets) {
  return guarded_tensor([&] {
    const Variable& vl = need_float(logits, "tm_cross_entropy", "logits");
    const Tensor& tg = need(targets, "tm_cross_entropy", "targets").value();
    if (vl.shape().ndim() < 1)
      fail(TM_ERR_ARG, "tm_cross_entropy: logits must have at least 1 dimension");
    if (tg.dtype() != DType::kI32) fail(TM_ERR_ARG, "tm_cross_entropy: targets must be i32");
    const int64_t rows = vl.shape().rows(), V = vl.shape().cols();
    if (tg.numel() != rows)
      fail(TM_ERR_ARG, "tm_cross_entropy: {} targets for logits {} ({} rows)", tg.numel(),
           vl.shape().str(), rows);
    const int32_t* t = tg.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r)
      if (t[r] != -1 && (t[r] < 0 || t[r] >= V))
        fail(TM_ERR_ARG, "tm_cross_entropy: target {} at row {} outside [0, {})", t[r], r, V);
    return fd::ops::cross_entropy(vl, tg, -1);
  });
}

float tm_item(const tm_tensor* t) {
  float out = NAN;
  guarded([&] {
    const Tensor& v = need_float(t, "tm_item", "t").value();
    if (v.numel() != 1) fail(TM_ERR_ARG, "tm_item: t has {} elements, not 1", v.numel());
    fd::convert_to_f32(v.dtype(), v.raw(), &out, 1);
  });
  return out;
}

tm_status tm_backward(tm_tensor* loss) {
  return guarded([&] {
    const Variable& v = need_float(loss, "tm_backward", "loss");
    if (!v.requires_grad())
      fail(TM_ERR_ARG, "tm_backward: loss does not require grad (no input of its ops did)");
    fd::autograd::Tape& tape = fd::autograd::current_tape();
    try {
      tape.backward(v);
    } catch (...) {
      tape.clear();  // a failed recompute leaves a half-run tape
      throw;
    }
  });
}

// ---- AdamW ----

tm_adamw* tm_adamw_create(tm_tensor* const* params, size_t count, float lr, float beta1,
                          float beta2, float eps, float weight_decay) {
  tm_adamw* out = nullptr;
  guarded([&] {
    if (params == nullptr || count == 0) fail(TM_ERR_ARG, "tm_adamw_create: no parameters");
    if (!(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f && eps >= 0.0f))
      fail(TM_ERR_ARG, "tm_adamw_create: betas ({}, {}) must lie in [0, 1) and eps {} >= 0", beta1,
           beta2, eps);
    std::vector<fd::nn::ParamSpec> specs;
    DType dtype = DType::kF32;
    for (size_t i = 0; i < count; ++i) {
      const std::string name = fmt::format("params[{}]", i);
      const Variable& v = need_float(params[i], "tm_adamw_create", name.c_str());
      if (!v.requires_grad()) fail(TM_ERR_ARG, "tm_adamw_create: {} does not require grad", name);
      if (!v.slot()->is_leaf) fail(TM_ERR_ARG, "tm_adamw_create: {} is not a leaf", name);
      if (i == 0) dtype = v.dtype();
      if (v.dtype() != dtype)
        fail(TM_ERR_ARG, "tm_adamw_create: {} is {} but params[0] is {}", name,
             fd::dtype_name(v.dtype()), fd::dtype_name(dtype));
      for (size_t j = 0; j < i; ++j)
        if (params[j] == params[i] || params[j]->var.slot() == v.slot())
          fail(TM_ERR_ARG, "tm_adamw_create: params[{}] and {} are the same tensor", j, name);
      specs.push_back({name, v.shape(), true});
    }
    // Aligned only: fd_zero_wrap's engine pads it for the world it partitions over.
    auto group = std::make_unique<fd::nn::FlatParamGroup>("capi", specs, dtype);
    auto opt = std::make_unique<tm_adamw>();
    for (size_t i = 0; i < count; ++i) {
      const fd::nn::Parameter& p = group->params()[i];
      const Variable& old = params[i]->var;
      p.value.copy_from(old.value());
      if (old.slot()->has_grad()) p.grad.copy_from(old.grad());
    }
    // Rebind only once nothing can fail.
    for (size_t i = 0; i < count; ++i) params[i]->var = group->params()[i].var();
    opt->options = {lr, beta1, beta2, eps, weight_decay};
    const Tensor& flat = group->flat_params();
    fd::optim::AdamWShard shard{group.get(),         0,       group->numel(), flat,
                                group->flat_grads(), Tensor()};
    if (dtype != DType::kF32) {
      opt->master = flat.to(DType::kF32, fd::MemCategory::kMaster);
      shard.params = opt->master;
      shard.compute_params = flat;
    }
    opt->module = std::make_unique<CapiModule>(std::move(group));
    std::vector<fd::optim::AdamWShard> shards{shard};
    opt->adamw = std::make_unique<fd::optim::AdamW>(std::move(shards), opt->options);
    out = opt.release();
  });
  return out;
}

tm_status tm_adamw_step(tm_adamw* opt) {
  return guarded([&] {
    if (opt == nullptr) fail(TM_ERR_ARG, "tm_adamw_step: opt is NULL");
    if (opt->wrapped) fail(TM_ERR_STATE, "tm_adamw_step: opt is under ZeRO; use fd_zero_step");
    opt->adamw->step(opt->options.lr);
  });
}

tm_status tm_adamw_zero_grad(tm_adamw* opt) {
  return guarded([&] {
    if (opt == nullptr) fail(TM_ERR_ARG, "tm_adamw_zero_grad: opt is NULL");
    const Tensor& g = opt->module->group().flat_grads();
    if (g.storage()->resident()) g.zero_();
  });
}

tm_status tm_adamw_set_lr(tm_adamw* opt, float lr) {
  return guarded([&] {
    if (opt == nullptr) fail(TM_ERR_ARG, "tm_adamw_set_lr: opt is NULL");
    if (!std::isfinite(lr) || lr < 0.0f)
      fail(TM_ERR_ARG, "tm_adamw_set_lr: lr {} must be >= 0", lr);
    opt->options.lr = lr;
  });
}

void tm_adamw_free(tm_adamw* opt) {
  if (opt == nullptr) return;
  if (opt->zero != nullptr) fd_zero_free(opt->zero);  // the wrapper borrows opt
  delete opt;
}

// ---- Process group and collectives ----

fd_status fd_init(int* argc, char*** argv) {
  return guarded([&] {
    if (g_initialised) fail(TM_ERR_STATE, "fd_init: already called");
    if (g_finalised) fail(TM_ERR_STATE, "fd_init: called after fd_finalize");
    g_comm = fd::dist::init(argc, argv);
    g_initialised = true;
  });
}

fd_status fd_finalize(void) {
  return guarded([&] {
    if (!g_initialised) fail(TM_ERR_STATE, "fd_finalize: fd_init was not called");
    if (g_live_wrappers > 0)
      fail(TM_ERR_STATE, "fd_finalize: {} fd_zero_optimizer(s) not freed", g_live_wrappers);
    g_comm.reset();
    fd::dist::finalize();
    g_initialised = false;
    g_finalised = true;
  });
}

int fd_rank(void) { return g_comm ? g_comm->rank() : -1; }
int fd_world_size(void) { return g_comm ? g_comm->size() : -1; }

fd_status fd_all_reduce(tm_tensor* t) {
  return guarded([&] {
    fd::dist::Communicator& c = comm("fd_all_reduce");
    const Tensor& v = need(t, "fd_all_reduce", "t").value();
    c.all_reduce(v.raw(), v.numel(), v.dtype());
  });
}

fd_status fd_broadcast(tm_tensor* t, int root) {
  return guarded([&] {
    fd::dist::Communicator& c = comm("fd_broadcast");
    const Tensor& v = need(t, "fd_broadcast", "t").value();
    if (root < 0 || root >= c.size())
      fail(TM_ERR_ARG, "fd_broadcast: root {} not in [0, {})", root, c.size());
    c.broadcast(v.raw(), v.numel(), v.dtype(), root);
  });
}

fd_status fd_all_gather(const tm_tensor* send, tm_tensor* recv) {
  return guarded([&] {
    fd::dist::Communicator& c = comm("fd_all_gather");
    const Tensor& s = need(send, "fd_all_gather", "send").value();
    const Tensor& r = need(recv, "fd_all_gather", "recv").value();
    if (s.dtype() != r.dtype())
      fail(TM_ERR_ARG, "fd_all_gather: send is {}, recv is {}", fd::dtype_name(s.dtype()),
           fd::dtype_name(r.dtype()));
    if (r.numel() != s.numel() * c.size())
      fail(TM_ERR_ARG, "fd_all_gather: recv has {} elements; world {} x send {} = {} needed",
           r.numel(), c.size(), s.numel(), s.numel() * c.size());
    c.all_gather(s.raw(), r.raw(), s.numel(), s.dtype());
  });
}

fd_status fd_reduce_scatter(const tm_tensor* send, tm_tensor* recv) {
  return guarded([&] {
    fd::dist::Communicator& c = comm("fd_reduce_scatter");
    const Tensor& s = need(send, "fd_reduce_scatter", "send").value();
    const Tensor& r = need(recv, "fd_reduce_scatter", "recv").value();
    if (s.dtype() != r.dtype())
      fail(TM_ERR_ARG, "fd_reduce_scatter: send is {}, recv is {}", fd::dtype_name(s.dtype()),
           fd::dtype_name(r.dtype()));
    if (s.numel() != r.numel() * c.size())
      fail(TM_ERR_ARG, "fd_reduce_scatter: send has {} elements; world {} x recv {} = {} needed",
           s.numel(), c.size(), r.numel(), r.numel() * c.size());
    c.reduce_scatter(s.raw(), r.raw(), r.numel(), s.dtype());
  });
}

// ---- ZeRO ----

fd_zero_optimizer* fd_zero_wrap(tm_adamw* opt, int stage) {
  fd_zero_optimizer* out = nullptr;
  guarded([&] {
    fd::dist::Communicator& c = comm("fd_zero_wrap");
    if (opt == nullptr) fail(TM_ERR_ARG, "fd_zero_wrap: opt is NULL");
    if (stage < 0 || stage > 3) fail(TM_ERR_ARG, "fd_zero_wrap: stage {} not in 0..3", stage);
    if (opt->wrapped) fail(TM_ERR_STATE, "fd_zero_wrap: opt was already wrapped");
    if (opt->adamw->steps_taken() > 0)
      fail(TM_ERR_STATE, "fd_zero_wrap: opt has already stepped; wrap it before its first step");
    fd::zero::ZeroConfig cfg;
    cfg.stage = stage;
    cfg.accumulation = 1;
    cfg.adamw = opt->options;
    cfg.grad_clip = 0.0f;  // as tm_adamw_step: no clipping
    auto z = std::make_unique<fd_zero_optimizer>();
    z->opt = opt;
    z->engine = std::make_unique<fd::zero::ZeroEngine>(*opt->module, c, cfg);
    z->engine->begin_micro_batch(0);
    z->engine->acquire_all();
    opt->wrapped = true;
    opt->zero = z.get();
    ++g_live_wrappers;
    out = z.release();
  });
  return out;
}

fd_status fd_zero_step(fd_zero_optimizer* z) {
  return guarded([&] {
    if (z == nullptr) fail(TM_ERR_ARG, "fd_zero_step: z is NULL");
    fd::dist::Communicator& c = comm("fd_zero_step");
    fd::zero::ZeroEngine& e = *z->engine;
    e.reduce_all();
    e.end_micro_batch(0);
    // The reduction sums gradients over ranks; the engine removes a "loss
    // scale" of world, which turns the sum into the mean.
    fd::zero::StepResult r = e.step(z->opt->options.lr, double(c.size()));
    z->last_grad_norm = r.grad_norm;
    e.begin_micro_batch(0);
    e.acquire_all();
    if (r.skipped) fail(TM_ERR_RUNTIME, "fd_zero_step: non-finite gradients; the step was skipped");
  });
}

double fd_zero_last_grad_norm(const fd_zero_optimizer* z) { return z ? z->last_grad_norm : -1.0; }

void fd_zero_free(fd_zero_optimizer* z) {
  if (z == nullptr) return;
  z->opt->zero = nullptr;
  --g_live_wrappers;
  delete z;
}

// ---- Activation checkpointing ----

tm_tensor* fd_checkpoint(tm_tensor* (*fn)(tm_tensor*), tm_tensor* input) {
  return guarded_tensor([&] {
    if (fn == nullptr) fail(TM_ERR_ARG, "fd_checkpoint: fn is NULL");
    need(input, "fd_checkpoint", "input");
    auto call = [fn](const std::vector<Variable>& in) -> Variable {
      tm_tensor arg{in[0]};
      tm_tensor* out = fn(&arg);
      if (out == nullptr) fail(TM_ERR_RUNTIME, "fd_checkpoint: fn returned NULL: {}", g_error);
      Variable v = std::move(out->var);
      delete out;
      return v;
    };
    return fd::autograd::checkpoint(call, {input->var});
  });
}

}  // extern "C"
