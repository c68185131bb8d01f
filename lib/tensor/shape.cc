#include "lib/tensor/shape.h"

#include <fmt/format.h>

#include "lib/base/check.h"

namespace fd {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  FD_CHECK(dims.size() <= kMaxDims, "too many dimensions: {}", dims.size());
  for (int64_t d : dims) {
    FD_CHECK(d >= 0, "negative dimension {}", d);
    dims_[ndim_++] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < ndim_; ++i) s += fmt::format("{}{}", i ? ", " : "", dims_[i]);
  return s + (ndim_ == 1 ? ",)" : ")");
}

}  // namespace fd
