#include "lib/ops/shape_util.h"

#include "lib/base/check.h"

namespace fd::ops {
namespace {

Shape make_shape(const int64_t* d, int n) {
  switch (n) {
    case 0:
      return Shape{};
    case 1:
      return Shape{d[0]};
    case 2:
      return Shape{d[0], d[1]};
    case 3:
      return Shape{d[0], d[1], d[2]};
    case 4:
      return Shape{d[0], d[1], d[2], d[3]};
    case 5:
      return Shape{d[0], d[1], d[2], d[3], d[4]};
    case 6:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5]};
    case 7:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5], d[6]};
    case 8:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]};
  }
  FD_CHECK(false, "shape of rank {}", n);
  return Shape{};
}

}  // namespace

Shape with_last_dim(const Shape& s, int64_t last) {
  FD_CHECK(s.ndim() >= 1, "with_last_dim of a 0-d shape");
  int64_t d[Shape::kMaxDims];
  for (int i = 0; i < s.ndim(); ++i) d[i] = s[i];
  d[s.ndim() - 1] = last;
  return make_shape(d, s.ndim());
}

Shape append_dim(const Shape& s, int64_t last) {
  FD_CHECK(s.ndim() < Shape::kMaxDims, "append_dim to {}", s.str());
  int64_t d[Shape::kMaxDims];
  for (int i = 0; i < s.ndim(); ++i) d[i] = s[i];
  d[s.ndim()] = last;
  return make_shape(d, s.ndim() + 1);
}

}  // namespace fd::ops
