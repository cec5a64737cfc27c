#pragma once
// A direct convolution of one processor's slice, as kernels::convolution_* (kernels/convolution.hpp)
// and its providers see it: extents and element strides, so that any dim order a tensor has can be
// handed over without a copy.
#include <array>
#include <cstdint>

namespace meshtensor::kernels {

struct conv_problem {
  int spatial = 0;  // 1, 2 or 3 spatial dims
  std::int64_t n = 1, ic = 1, oc = 1;
  std::array<std::int64_t, 3> in{}, out{}, taps{}, stride{}, dilation{}, pad_lo{}, pad_hi{};
  // Element strides: src {n, c, in...}, weights {oc, ic, taps...}, dst {n, oc, out...}.
  std::array<std::int64_t, 5> src_strides{}, weights_strides{}, dst_strides{};
  std::int64_t src_offset = 0;  // where src's first element lies in the buffer handed over

  std::int64_t out_positions() const {
    std::int64_t p = n;
    for (int j = 0; j < spatial; ++j) p *= out[j];
    return p;
  }
  std::int64_t taps_total() const {
    std::int64_t t = 1;
    for (int j = 0; j < spatial; ++j) t *= taps[j];
    return t;
  }
  bool empty() const {
    bool e = n == 0 || ic == 0 || oc == 0;
    for (int j = 0; j < spatial; ++j) e = e || out[j] == 0 || in[j] == 0;
    return e;
  }
};

}  // namespace meshtensor::kernels
