#pragma once
// The parts of complex tensors: real(z), imag(z), conj(z), abs(z), and make_complex(re, im) from
// two real tensors of the same dims. Gradients in the conjugate Wirtinger convention of element/complex.hpp
// (the gradient held for z = x + iy is dL/dx + i dL/dy):
//   real(z): g -> g + 0i;  imag(z): g -> 0 + gi;  conj(z): g -> conj(g);  abs(z): g -> g z / |z|;
//   make_complex(re, im): g -> real(g) to re, imag(g) to im.
// Communication: none, forward or gradient.
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "../element/complex.hpp"
#include "detail/map_to.hpp"
#include "detail/op_support.hpp"
#include "elementwise.hpp"
#include "op_call.hpp"

namespace meshtensor {

namespace detail {
namespace complex_fn {
struct real_part {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(Kokkos::complex<T> z) const {
    return z.real();
  }
};
struct imag_part {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(Kokkos::complex<T> z) const {
    return z.imag();
  }
};
struct as_real_part {  // g -> g + 0i
  template <class T>
  KOKKOS_INLINE_FUNCTION Kokkos::complex<T> operator()(T g) const {
    return {g, T(0)};
  }
};
struct as_imag_part {  // g -> 0 + gi
  template <class T>
  KOKKOS_INLINE_FUNCTION Kokkos::complex<T> operator()(T g) const {
    return {T(0), g};
  }
};
struct magnitude {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(Kokkos::complex<T> z) const {
    return Kokkos::abs(z);
  }
};
struct magnitude_grad {  // g z / |z|: dL/dx + i dL/dy of |z| (0 at z = 0, a subgradient)
  template <class T>
  KOKKOS_INLINE_FUNCTION Kokkos::complex<T> operator()(T g, Kokkos::complex<T> z) const {
    const T r = Kokkos::abs(z);
    return r == T(0) ? Kokkos::complex<T>(T(0), T(0)) : z * (g / r);
  }
};
struct compose {
  template <class T>
  KOKKOS_INLINE_FUNCTION Kokkos::complex<T> operator()(T re, T im) const {
    return {re, im};
  }
};
}  // namespace complex_fn

// The tensor of Z's dims and layout holding the real type under Z's elements.
template <Tensor Z>
using real_tensor_t = typename Z::template rebind<real_of_t<typename Z::value_type>>;
}  // namespace detail

namespace detail {
// real(z) or imag(z): Part reads it, AsPart puts a real gradient back in its place.
template <class Part, class AsPart, Tensor Z>
real_tensor_t<Z> complex_part(const char* name, const Z& z) {
  using R = real_tensor_t<Z>;
  const op_call call(planned_op{name, elementwise_plan()}, z);
  R out = map_to<R>(z.extents(), Part{}, z);
  record<R>(
      out, [z = node_only(z)](const R& g) { push_fresh_grad(z, map_to<Z>(z.extents(), AsPart{}, g)); }, z);
  return out;
}
}  // namespace detail

template <Tensor Z>
detail::real_tensor_t<Z> real(const Z& z) {
  static_assert(is_complex_v<typename Z::value_type>, "meshtensor: real takes a complex tensor (meshtensor::complex<float> or <double>)");
  return detail::complex_part<detail::complex_fn::real_part, detail::complex_fn::as_real_part>("real", z);
}

template <Tensor Z>
detail::real_tensor_t<Z> imag(const Z& z) {
  static_assert(is_complex_v<typename Z::value_type>, "meshtensor: imag takes a complex tensor (meshtensor::complex<float> or <double>)");
  return detail::complex_part<detail::complex_fn::imag_part, detail::complex_fn::as_imag_part>("imag", z);
}

// |z|, a real tensor (the real types' abs is elementwise.hpp's). Gradient: g z / |z|.
template <Tensor Z>
  requires is_complex_v<typename Z::value_type>
detail::real_tensor_t<Z> abs(const Z& z) {
  using R = detail::real_tensor_t<Z>;
  const detail::op_call call(detail::planned_op{"abs", elementwise_plan()}, z);
  R out = detail::map_to<R>(z.extents(), detail::complex_fn::magnitude{}, z);
  detail::record<R>(
      out,
      [z](const R& g) { detail::push_fresh_grad(z, detail::map_to<Z>(z.extents(), detail::complex_fn::magnitude_grad{}, g, z)); },
      z);
  return out;
}

template <Tensor Z>
Z conj(const Z& z) {
  static_assert(is_complex_v<typename Z::value_type>, "meshtensor: conj takes a complex tensor (meshtensor::complex<float> or <double>)");
  const detail::op_call call(detail::planned_op{"conj", elementwise_plan()}, z);
  Z out = detail::map_to<Z>(z.extents(), detail::conj_fn{}, z);
  detail::record<Z>(
      out,
      [z = detail::node_only(z)](const Z& g) {
        detail::push_fresh_grad(z, detail::map_to<Z>(z.extents(), detail::conj_fn{}, g));
      },
      z);
  return out;
}

// re + i im, elementwise; re and im hold the same dims (no broadcast: a part broadcast along a dim
// would need its gradient summed, which real(z) + imag(z) spells out where it is meant).
template <Tensor R>
typename R::template rebind<complex<typename R::value_type>> make_complex(const R& re, const R& im) {
  static_assert(std::is_floating_point_v<typename R::value_type>,
                "meshtensor: make_complex takes float or double parts");
  using Z = typename R::template rebind<complex<typename R::value_type>>;
  detail::check_shared_extents("make_complex", re, im);
  const detail::op_call call(detail::planned_op{"make_complex", elementwise_plan()}, re);
  Z out = detail::map_to<Z>(re.extents(), detail::complex_fn::compose{}, re, im);
  detail::record<Z>(
      out,
      [re = detail::node_only(re), im = detail::node_only(im)](const Z& g) {
        if (re.tracks_grad()) detail::push_fresh_grad(re, detail::map_to<R>(re.extents(), detail::complex_fn::real_part{}, g));
        if (im.tracks_grad()) detail::push_fresh_grad(im, detail::map_to<R>(im.extents(), detail::complex_fn::imag_part{}, g));
      },
      re, im);
  return out;
}

}  // namespace meshtensor
