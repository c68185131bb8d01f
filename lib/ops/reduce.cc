#include "lib/ops/reduce.h"

#include "lib/base/check.h"
#include "lib/ops/backend.h"

namespace fd::ops {
namespace {

void check_float(const Tensor& t, const char* op) {
  FD_CHECK(t.dtype() != DType::kI32 && t.dtype() != DType::kU8,
           "{}: expected a float tensor, got {}", op, dtype_name(t.dtype()));
}

}  // namespace

double sum_of_squares(const Tensor& t) {
  check_float(t, "sum_of_squares");
  return t.is_cuda() ? cuda::sum_of_squares(t) : cpu::sum_of_squares(t);
}

void scale_(const Tensor& t, float factor) {
  check_float(t, "scale_");
  if (t.is_cuda()) return cuda::scale_(t, factor);
  cpu::scale_(t, factor);
}

bool all_finite(const Tensor& t) {
  check_float(t, "all_finite");
  return t.is_cuda() ? cuda::all_finite(t) : cpu::all_finite(t);
}

void add_(const Tensor& acc, const Tensor& x) {
  check_float(acc, "add_");
  check_float(x, "add_");
  FD_CHECK(x.numel() == acc.numel(), "add_: {} elements into {}", x.numel(), acc.numel());
  if (acc.is_cuda()) return cuda::add_(acc, x);
  cpu::add_(acc, x);
}

}  // namespace fd::ops
