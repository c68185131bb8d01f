#include "lib/ops/shape_util.h"

#include "lib/base/check.h"

namespace fd::ops {

Shape with_last_dim(const Shape& s, int64_t last) {
  FD_CHECK(s.ndim() >= 1, "with_last_dim of a 0-d shape");
  int64_t d[Shape::kMaxDims];
  for (int i = 0; i < s.ndim(); ++i) d[i] = s[i];
  d[s.ndim() - 1] = last;
  return Shape(std::span<const int64_t>(d, size_t(s.ndim())));
}

Shape append_dim(const Shape& s, int64_t last) {
  FD_CHECK(s.ndim() < Shape::kMaxDims, "append_dim to {}", s.str());
  int64_t d[Shape::kMaxDims];
  for (int i = 0; i < s.ndim(); ++i) d[i] = s[i];
  d[s.ndim()] = last;
  return Shape(std::span<const int64_t>(d, size_t(s.ndim() + 1)));
}

}  // namespace fd::ops
