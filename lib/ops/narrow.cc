#include "lib/ops/narrow.h"

#include <cstring>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/tensor/dtype.h"

namespace fd::ops {

Variable narrow_last(const Variable& x, int64_t begin, int64_t count) {
  const Shape& shape = x.shape();
  FD_CHECK(shape.ndim() >= 1, "narrow_last: x must have a dimension, got {}", shape.str());
  const int64_t C = shape.cols(), rows = shape.rows();
  FD_CHECK(begin >= 0 && count >= 1 && begin + count <= C,
           "narrow_last: columns [{}, {}) of a last dimension of {}", begin, begin + count, C);
  FD_CHECK(!x.value().is_cuda(), "narrow_last: CPU and meta only");
  std::vector<int64_t> dims;
  for (int d = 0; d + 1 < shape.ndim(); ++d) dims.push_back(shape[d]);
  dims.push_back(count);
  const Tensor& in = x.value();
  Tensor out =
      Tensor::empty(Shape(std::span<const int64_t>(dims)), in.dtype(), MemCategory::kActivations,
                    in.is_meta() ? Device::meta() : Device::cpu());
  if (!out.is_meta()) {
    const size_t elem = dtype_size(in.dtype());
    const char* src = static_cast<const char*>(in.raw());
    char* dst = static_cast<char*>(out.raw());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + size_t(r * count) * elem, src + size_t(r * C + begin) * elem,
                  size_t(count) * elem);
  }
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record(
        {"narrow_last", {ys}, [ys, xs, rows, C, begin, count] {
           if (!xs->requires_grad) return;
           const Tensor& dx = xs->ensure_grad();
           if (dx.is_meta()) return;
           const Tensor& dy = ys->grad;
           std::vector<float> g(static_cast<size_t>(count)), acc(static_cast<size_t>(count));
           const size_t dx_elem = dtype_size(dx.dtype()), dy_elem = dtype_size(dy.dtype());
           const char* src = static_cast<const char*>(dy.raw());
           char* dst = static_cast<char*>(dx.raw());
           for (int64_t r = 0; r < rows; ++r) {
             void* row = dst + size_t(r * C + begin) * dx_elem;
             convert_to_f32(dy.dtype(), src + size_t(r * count) * dy_elem, g.data(), size_t(count));
             convert_to_f32(dx.dtype(), row, acc.data(), size_t(count));
             for (int64_t j = 0; j < count; ++j) acc[size_t(j)] += g[size_t(j)];
             convert_f32_to(dx.dtype(), acc.data(), row, size_t(count));
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
