#pragma once
// Discrete Fourier transforms along one named dim of a tensor, by FFTW on each processor's slice:
//
//   fft<D>(z)       complex -> complex, X_k = sum_j z_j e^{-2 pi i jk/n} (unnormalised)
//   ifft<D>(z)      its inverse, z_j = (1/n) sum_k X_k e^{+2 pi i jk/n}
//   rfft<D>(x)      real -> complex: D's extent n becomes n/2 + 1 (the rest is their conjugates)
//   irfft<D>(z, n)  its inverse, back to a real tensor of extent n along D
//
// NumPy's conventions (norm="backward"). D must not be split: each processor transforms the
// lines it holds whole. A multi-dimensional transform of a distributed array is a transform per
// dim with relayouts between them (slab and pencil decompositions are layouts):
//
//   auto a = mt::fft<z_>(u);                               // pencils: x over rows, y over cols
//   auto b = mt::fft<y_>(mt::relayout<x_rows_z_cols>(a));   // an alltoall over cols
//   auto c = mt::fft<x_>(mt::relayout<y_rows_z_cols>(b));   // an alltoall over rows
//
// so the plan knows every collective, and the relayouts move what FFTW-MPI's transposes move.
// docs/simulation.md, "A distributed FFT".
//
// Opt-in: not part of meshtensor.hpp, and it needs FFTW 3 (link meshtensor::fft, which CMake
// defines where FFTW is found). On a GPU build the slice is staged through host memory (cuFFT is
// not wired yet). Gradients: the transforms are linear, and their gradients (conjugate Wirtinger
// convention, element/complex.hpp) are the adjoint transforms: fft's is n ifft, ifft's fft / n,
// rfft's the real part of the inverse of the zero-padded gradient, irfft's rfft / n doubled where a
// bin stands for two.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "../autodiff/tape.hpp"
#include "../element/complex.hpp"
#include "../kernels/launch.hpp"
#include "../ops/complex_parts.hpp"
#include "../ops/detail/map_to.hpp"
#include "../ops/op_call.hpp"
#include "../plan/comm_plan.hpp"
#include "../tensor/tensor.hpp"
#include "fftw_plans.hpp"

namespace meshtensor {
namespace diagnostic {
template <class D>
struct fft_dim_is_split {
  static_assert(sizeof(D) == 0,
                "meshtensor: fft<D> along a dim that the layout splits: each processor transforms whole lines; "
                "relayout first to a layout that keeps D whole (a slab or pencil whose other dims carry the axes)");
};
template <class T>
struct fft_needs_complex_float_or_double {
  static_assert(sizeof(T) == 0,
                "meshtensor: fft and ifft take complex<float> or complex<double> tensors; rfft takes float or double");
};
}  // namespace diagnostic

namespace detail::fft_impl {
using fftw::kind;

template <Dim D, Tensor X>
constexpr bool whole_along() {
  return X::layout_type::template split_of<D>().count == 0;
}

// The slice's shape as [outer, n, inner] around D.
template <Dim D, Tensor X>
std::array<std::int64_t, 3> around(const X& x) {
  constexpr std::size_t p = index_of_v<D, typename X::dims>;
  const auto& e = x.local_extents();
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < p; ++i) outer *= e[i];
  for (std::size_t i = p + 1; i < X::rank; ++i) inner *= e[i];
  return {outer, e[p], inner};
}

// FFTW on host arrays; a device slice goes through host copies.
template <class R, class In, class Out>
void run(kind k, std::int64_t n, std::int64_t outer, std::int64_t inner, const In& in, const Out& out) {
  if (planning()) return;
  typename In::execution_space().fence();
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename In::memory_space>::accessible) {
    fftw::execute<R>(k, n, outer, inner, in.data(), out.data());
  } else {
    const auto hin = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, in);
    const auto hout = Kokkos::create_mirror_view(Kokkos::HostSpace{}, out);
    fftw::execute<R>(k, n, outer, inner, hin.data(), hout.data());
    Kokkos::deep_copy(out, hout);
  }
}

// x *= factor(position along D), over a slice [outer, m, inner].
template <class V>
void scale_along(const V& v, std::int64_t m, std::int64_t inner, double edge, double middle, std::int64_t n) {
  using T = typename V::value_type;
  using Rl = real_of_t<T>;
  const std::int64_t size = static_cast<std::int64_t>(v.extent(0));
  kernels::parallel_for(
      "meshtensor::fft_scale", Kokkos::RangePolicy<typename V::execution_space>(0, size), KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t k = (i / inner) % m;
        const bool single = k == 0 || (n % 2 == 0 && k == n / 2);
        v(i) *= Rl(single ? edge : middle);
      });
}

// The complex transforms, untracked: forward (sign -1) or backward (sign +1, unscaled), times
// `scale`.
template <Dim D, Tensor Z>
Z c2c(const Z& z, kind k, double scale) {
  using Rl = real_of_t<typename Z::value_type>;
  const auto [outer, n, inner] = around<D>(z);
  Z out(z.mesh(), z.extents(), uninitialized);
  run<Rl>(k, n, outer, inner, z.view(), out.view());
  if (scale != 1 && !planning()) scale_along(out.view(), n, inner, scale, scale, n);
  return out;
}

template <Dim D, Tensor X>
typename X::template rebind<complex<typename X::value_type>> r2c(const X& x) {
  using Z = typename X::template rebind<complex<typename X::value_type>>;
  constexpr std::size_t p = index_of_v<D, typename X::dims>;
  const auto [outer, n, inner] = around<D>(x);
  auto extents = x.extents();
  extents[p] = extents[p] / 2 + 1;
  Z out(x.mesh(), extents, uninitialized);
  run<typename X::value_type>(kind::real_to_complex, n, outer, inner, x.view(), out.view());
  return out;
}

// The real signal of extent n along D from its half spectrum z (whose extent along D is n/2 + 1),
// unscaled (FFTW's c2r: n times irfft's).
template <Dim D, Tensor Z>
typename Z::template rebind<real_of_t<typename Z::value_type>> c2r(const Z& z, std::int64_t n) {
  using X = typename Z::template rebind<real_of_t<typename Z::value_type>>;
  constexpr std::size_t p = index_of_v<D, typename Z::dims>;
  if (z.extents()[p] != n / 2 + 1)
    throw shape_error(cat("meshtensor: irfft<", D::name(), "> to a length of ", n, " needs ", n / 2 + 1,
                          " frequencies along ", D::name(), "; the tensor ", Z::type_name(), " has ", z.extents()[p]));
  const auto [outer, half, inner] = around<D>(z);
  auto extents = z.extents();
  extents[p] = n;
  X out(z.mesh(), extents, uninitialized);
  // FFTW's c2r overwrites its input.
  const Z scratch(z.mesh(), z.extents(), uninitialized);
  if (!planning()) Kokkos::deep_copy(typename Z::execution_space{}, scratch.view(), z.view());
  run<real_of_t<typename Z::value_type>>(kind::complex_to_real, n, outer, inner, scratch.view(), out.view());
  return out;
}

// z, zero-padded along D from its extent to n.
template <Dim D, Tensor Z>
Z padded(const Z& z, std::int64_t n) {
  constexpr std::size_t p = index_of_v<D, typename Z::dims>;
  const auto [outer, m, inner] = around<D>(z);
  auto extents = z.extents();
  extents[p] = n;
  Z out(z.mesh(), extents);  // zeros
  const auto src = z.view();
  const auto dst = out.view();
  kernels::parallel_for(
      "meshtensor::fft_pad", Kokkos::RangePolicy<typename Z::execution_space>(0, outer * m * inner),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t o = i / (m * inner), r = i - o * m * inner;
        dst(o * n * inner + r) = src(i);
      });
  return out;
}

// Whether an fft op may run on X along D (each failure is one error, naming what is wrong).
template <Dim D, Tensor X, bool Complex>
constexpr bool checked() {
  using T = typename X::value_type;
  if constexpr (!whole_along<D, X>()) {
    (void)sizeof(diagnostic::fft_dim_is_split<D>);
    return false;
  } else if constexpr ((!std::is_same_v<real_of_t<T>, float> && !std::is_same_v<real_of_t<T>, double>) ||
                       is_complex_v<T> != Complex) {
    (void)sizeof(diagnostic::fft_needs_complex_float_or_double<T>);
    return false;
  } else {
    return true;
  }
}
}  // namespace detail::fft_impl

template <Dim D, Tensor Z>
Z fft(const Z& z) {
  if constexpr (!detail::fft_impl::checked<D, Z, true>()) {
    return z;
  } else {
    using detail::fft_impl::kind;
    const detail::op_call call(detail::planned_op{"fft", comm_plan{}}, z);
    Z out = detail::fft_impl::c2c<D>(z, kind::forward, 1);
    detail::record<Z>(
        out,
        [z = detail::node_only(z)](const Z& g) {
          detail::push_fresh_grad(z, detail::fft_impl::c2c<D>(g, kind::backward, 1));
        },
        z);
    return out;
  }
}

template <Dim D, Tensor Z>
Z ifft(const Z& z) {
  if constexpr (!detail::fft_impl::checked<D, Z, true>()) {
    return z;
  } else {
    using detail::fft_impl::kind;
    const detail::op_call call(detail::planned_op{"ifft", comm_plan{}}, z);
    const std::int64_t n = z.extents()[index_of_v<D, typename Z::dims>];
    const double inv = n > 0 ? 1.0 / double(n) : 1.0;
    Z out = detail::fft_impl::c2c<D>(z, kind::backward, inv);
    detail::record<Z>(
        out,
        [z = detail::node_only(z), inv](const Z& g) {
          detail::push_fresh_grad(z, detail::fft_impl::c2c<D>(g, kind::forward, inv));
        },
        z);
    return out;
  }
}

template <Dim D, Tensor X>
auto rfft(const X& x) {
  using Z = typename X::template rebind<complex<typename X::value_type>>;
  if constexpr (!detail::fft_impl::checked<D, X, false>()) {
    return Z{};
  } else {
    using detail::fft_impl::kind;
    const detail::op_call call(detail::planned_op{"rfft", comm_plan{}}, x);
    Z out = detail::fft_impl::r2c<D>(x);
    const std::int64_t n = x.extents()[index_of_v<D, typename X::dims>];
    // d/dx of a real x: the real part of the adjoint, F^H applied to g padded with zeros to n.
    detail::record<Z>(
        out,
        [x = detail::node_only(x), n](const Z& g) {
          const Z full = detail::fft_impl::c2c<D>(detail::fft_impl::padded<D>(g, n), kind::backward, 1);
          detail::push_fresh_grad(x, detail::map_to<X>(x.extents(), detail::complex_fn::real_part{}, full));
        },
        x);
    return out;
  }
}

template <Dim D, Tensor Z>
auto irfft(const Z& z, std::int64_t n) {
  using X = typename Z::template rebind<real_of_t<typename Z::value_type>>;
  if constexpr (!detail::fft_impl::checked<D, Z, true>()) {
    return X{};
  } else {
    const detail::op_call call(detail::planned_op{"irfft", comm_plan{}}, z);
    X out = detail::fft_impl::c2r<D>(z, n);
    const std::int64_t inner = detail::fft_impl::around<D>(z)[2];
    const double inv = n > 0 ? 1.0 / double(n) : 1.0;
    if (!detail::planning()) detail::fft_impl::scale_along(out.view(), n, inner, inv, inv, n);
    // Each bin but the first (and the middle one of an even n) stands for itself and its conjugate.
    detail::record<X>(
        out,
        [z = detail::node_only(z), n, inner, inv](const X& g) {
          Z d = detail::fft_impl::r2c<D>(g);
          if (!detail::planning()) detail::fft_impl::scale_along(d.view(), n / 2 + 1, inner, inv, 2 * inv, n);
          detail::push_fresh_grad(z, std::move(d));
        },
        z);
    return out;
  }
}

}  // namespace meshtensor
