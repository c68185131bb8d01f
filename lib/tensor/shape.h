// Shape: the sizes of a tensor's dimensions, row-major, at most 8 of them.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace fd {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  // From a list of dimensions (at most kMaxDims, each >= 0).
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[i < 0 ? ndim_ + i : i]; }
  int64_t numel() const;
  // Product of all dimensions but the last (rows of a row-major matrix view).
  int64_t rows() const { return ndim_ == 0 ? 1 : numel() / dims_[ndim_ - 1]; }
  int64_t cols() const { return ndim_ == 0 ? 1 : dims_[ndim_ - 1]; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "(2, 3, 4)"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

}  // namespace fd
