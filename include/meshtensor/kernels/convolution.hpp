#pragma once
// kernels::convolution_*: a direct convolution of one processor's slice (its halos already in), for
// nn::conv (nn/conv.hpp). The problem is described by extents and element strides, so that any
// dim order a tensor has can be handed over without a copy: src [n, c, spatial...], weights
// [oc, ic, taps...], dst [n, oc, out...].
//   provider: oneDNN on host spaces for float and bf16 (kernels/dnnl.hpp), when built with it and
//   not turned off (MESHTENSOR_KERNELS=portable); elsewhere has_convolution is false and nn::conv
//   takes its portable path (unfold, then a product).
// While planning, the multiply-adds are counted as the portable path's products would be, and
// nothing runs.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <type_traits>

#include "../element/bf16.hpp"
#include "conv_problem.hpp"
#include "launch.hpp"

#include "dnnl_convolution.hpp"

namespace meshtensor::kernels {

// Whether a provider computes convolutions of T on Exec in this build and run (the same answer on
// every processor of a job on one kind of CPU).
template <class Exec, class T>
bool has_convolution() {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  if constexpr (host && (std::is_same_v<T, float> || std::is_same_v<T, bf16>)) {
#if MESHTENSOR_HAVE_DNNL
    if (!dnnl_provider::enabled()) return false;
    return std::is_same_v<T, float> || dnnl_provider::has_bf16();
#endif
  }
  return false;
}

enum class conv_pass { forward, backward_data, backward_weights };

namespace detail {
// The multiply-adds of a pass, as the portable path's product (rows, columns, contracted) counts them.
inline planned_product conv_product(const conv_problem& p, conv_pass pass) {
  const std::int64_t rows = p.out_positions(), taps = p.ic * p.taps_total();
  if (pass == conv_pass::forward) return {1, rows, p.oc, taps};
  if (pass == conv_pass::backward_data) return {1, rows, taps, p.oc};
  return {1, taps, p.oc, rows};
}
}  // namespace detail

// dst = conv(src, weights): every dst element written.
template <class Exec, class T>
void convolution_forward(const conv_problem& p, const T* src, const T* weights, T* dst) {
  if (planned_away({detail::conv_product(p, conv_pass::forward)})) return;
#if MESHTENSOR_HAVE_DNNL
  if (p.empty()) return;
  Exec().fence();
  dnnl_provider::convolution(p, conv_pass::forward, src, weights, dst);
#else
  (void)p, (void)src, (void)weights, (void)dst;
#endif
}
// diff_src = the adjoint in src (every element of the described src region written; elements of
// the buffer outside it are left alone).
template <class Exec, class T>
void convolution_backward_data(const conv_problem& p, const T* diff_dst, const T* weights, T* diff_src) {
  if (planned_away({detail::conv_product(p, conv_pass::backward_data)})) return;
#if MESHTENSOR_HAVE_DNNL
  if (p.empty()) return;
  Exec().fence();
  dnnl_provider::convolution(p, conv_pass::backward_data, diff_src, weights, diff_dst);
#else
  (void)p, (void)diff_dst, (void)weights, (void)diff_src;
#endif
}
// diff_weights = the adjoint in weights (every element written; zeros where the problem is empty).
template <class Exec, class T>
void convolution_backward_weights(const conv_problem& p, const T* src, const T* diff_dst, T* diff_weights) {
  if (planned_away({detail::conv_product(p, conv_pass::backward_weights)})) return;
#if MESHTENSOR_HAVE_DNNL
  Exec().fence();
  dnnl_provider::convolution(p, conv_pass::backward_weights, src, diff_weights, diff_dst);
#else
  (void)p, (void)src, (void)diff_dst, (void)diff_weights;
#endif
}

}  // namespace meshtensor::kernels
