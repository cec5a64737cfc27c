#pragma once
// Discrete Fourier transforms along named dims of a tensor, by FFTW on each processor's slice:
//
//   fft<Ds...>(z)   complex -> complex over the dims Ds, X_k = sum_j z_j e^{-2 pi i jk/n} along
//                   each (unnormalised)
//   ifft<Ds...>(z)  its inverse, scaled by 1 / (the product of the n)
//   rfft<D>(x)      real -> complex along D: D's extent n becomes n/2 + 1 (the rest are conjugates)
//   irfft<D>(z, n)  its inverse, back to a real tensor of extent n along D
//
// NumPy's conventions (norm="backward"). Ds must not be split: each processor transforms what it
// holds whole, several dims in one FFTW plan. A transform of a distributed array is a transform
// of the dims a layout keeps whole, a relayout, and the rest (slab and pencil decompositions are
// layouts):
//
//   auto a = mt::fft<y_, z_>(u);                   // slabs: x over the mesh, y and z whole
//   auto b = mt::fft<x_>(mt::relayout<y_slabs>(a));  // one alltoall, as FFTW-MPI's transpose
//
//   auto a = mt::fft<z_>(u);                               // pencils: x over rows, y over cols
//   auto b = mt::fft<y_>(mt::relayout<x_rows_z_cols>(a));   // an alltoall over cols
//   auto c = mt::fft<x_>(mt::relayout<y_rows_z_cols>(b));   // an alltoall over rows
//
// so the plan knows every collective. docs/simulation.md, "A distributed FFT".
//
// Opt-in: not part of meshtensor.hpp, and it needs FFTW 3 (link meshtensor::fft, which CMake
// defines where FFTW is found). On a GPU build the slice is staged through host memory (cuFFT is
// not wired yet). Gradients: the transforms are linear, and their gradients (conjugate Wirtinger
// convention, element/complex.hpp) are the adjoint transforms: fft's is the unscaled inverse
// (n ifft), ifft's fft / n, rfft's the real part of the unscaled inverse of the zero-padded
// gradient, irfft's rfft / n, doubled at the bins that stand for themselves and their conjugates.
#include <Kokkos_Core.hpp>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../element/complex.hpp"
#include "../kernels/launch.hpp"
#include "../ops/complex_parts.hpp"
#include "../ops/op_call.hpp"
#include "../plan/ledger.hpp"
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

// Whether X's layout keeps each of Ds whole.
template <Tensor X, Dim... Ds>
constexpr bool whole_along() {
  return ((X::layout_type::template split_of<Ds>().count == 0) && ...);
}

// FFTW's view of a slice pair: the transform dims (Ds, in the tensor's order) and loops over the
// others, each with the row-major strides of the input and the output slices. `logical` holds the
// transform's extents (a real signal's length along the last of Ds in real transforms, whose complex
// side holds n / 2 + 1).
template <Tensor X, Dim... Ds>
std::pair<std::vector<fftw::dim>, std::vector<fftw::dim>> fftw_shape(const typename X::extents_type& in,
                                                                      const typename X::extents_type& out,
                                                                      const typename X::extents_type& logical) {
  constexpr std::size_t rank = X::rank;
  constexpr std::array<bool, rank> transformed = [] {
    std::array<bool, rank> t{};
    ((t[index_of_v<Ds, typename X::dims>] = true), ...);
    return t;
  }();
  std::array<std::int64_t, rank> in_stride{}, out_stride{};
  std::int64_t a = 1, b = 1;
  for (std::size_t i = rank; i-- > 0;) {
    in_stride[i] = a;
    out_stride[i] = b;
    a *= in[i];
    b *= out[i];
  }
  std::vector<fftw::dim> dims, loops;
  for (std::size_t i = 0; i < rank; ++i)
    (transformed[i] ? dims : loops).push_back({transformed[i] ? logical[i] : in[i], in_stride[i], out_stride[i]});
  return {dims, loops};
}

// The conventional count of a transform's floating-point operations: 5 N log2 N for a complex one
// of N points (all its dims), half that for a real one; times the loops.
inline std::int64_t transform_flops(kind k, const std::pair<std::vector<fftw::dim>, std::vector<fftw::dim>>& shape) {
  double points = 1, loops = 1;
  for (const auto& d : shape.first) points *= double(d.n);
  for (const auto& d : shape.second) loops *= double(d.n);
  const double per = points > 1 ? 5 * points * std::log2(points) : 0;
  const bool real = k == kind::real_to_complex || k == kind::complex_to_real;
  return static_cast<std::int64_t>((real ? per / 2 : per) * loops);
}

// FFTW on host arrays; a device slice goes through host copies. A plan counts the FLOPs instead.
template <class R, class In, class Out>
void run(kind k, const std::pair<std::vector<fftw::dim>, std::vector<fftw::dim>>& shape, const In& in, const Out& out) {
  kernels::fence(typename In::execution_space{});  // counted in a plan too
  if (planning()) {
    plan_ledger::get().add_flops(transform_flops(k, shape));
    return;
  }
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename In::memory_space>::accessible) {
    fftw::execute<R>(k, shape.first, shape.second, in.data(), out.data());
  } else {
    const auto hin = kernels::copy_to(Kokkos::HostSpace{}, in);
    const auto hout = kernels::host_mirror(out);
    fftw::execute<R>(k, shape.first, shape.second, hin.data(), hout.data());
    kernels::deep_copy(out, hout);
  }
}

// v *= factor.
template <class V>
void scale_all(const V& v, double factor) {
  using Rl = real_of_t<typename V::value_type>;
  kernels::parallel_for(
      "meshtensor::fft_scale", kernels::range<typename V::execution_space>(0, static_cast<std::int64_t>(v.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) { v(i) *= Rl(factor); });
}

// v *= factor per bin along a dim of a half spectrum [outer, m, inner] of a real signal of length n:
// `single` at bin 0 (and n / 2 for even n), which stand for themselves, `paired` at the others,
// which stand for themselves and their conjugates.
template <class V>
void scale_bins(const V& v, std::int64_t m, std::int64_t inner, std::int64_t n, double single, double paired) {
  using Rl = real_of_t<typename V::value_type>;
  kernels::parallel_for(
      "meshtensor::fft_scale_bins", kernels::range<typename V::execution_space>(0, static_cast<std::int64_t>(v.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t k = (i / inner) % m;
        v(i) *= Rl(k == 0 || (n % 2 == 0 && k == n / 2) ? single : paired);
      });
}

// The product of the local extents after D (a slice's stride along D).
template <Dim D, Tensor X>
std::int64_t inner_of(const X& x) {
  std::int64_t inner = 1;
  for (std::size_t i = index_of_v<D, typename X::dims> + 1; i < X::rank; ++i) inner *= x.local_extents()[i];
  return inner;
}

// The complex transforms over Ds, untracked: forward (sign -1) or backward (sign +1, unscaled),
// times `scale`.
template <Dim... Ds, Tensor Z>
Z c2c(const Z& z, kind k, double scale) {
  Z out(z.mesh(), z.extents(), uninitialized);
  const auto& e = z.local_extents();
  run<real_of_t<typename Z::value_type>>(k, fftw_shape<Z, Ds...>(e, e, e), z.view(), out.view());
  if (scale != 1 && !planning()) scale_all(out.view(), scale);
  return out;
}

template <Dim D, Tensor X>
typename X::template rebind<complex<typename X::value_type>> r2c(const X& x) {
  using Z = typename X::template rebind<complex<typename X::value_type>>;
  constexpr std::size_t p = index_of_v<D, typename X::dims>;
  if (x.extents()[p] < 1)
    throw shape_error(cat("meshtensor: rfft<", D::name(), "> of ", X::type_name(), ", whose extent along ", D::name(),
                          " is 0: a spectrum needs at least one point"));
  auto extents = x.extents();
  extents[p] = extents[p] / 2 + 1;
  Z out(x.mesh(), extents, uninitialized);
  const auto& e = x.local_extents();
  run<typename X::value_type>(kind::real_to_complex, fftw_shape<X, D>(e, out.local_extents(), e), x.view(), out.view());
  return out;
}

// The real signal of extent n along D from its half spectrum z (whose extent along D is n/2 + 1),
// unscaled (FFTW's c2r: n times irfft's).
template <Dim D, Tensor Z>
typename Z::template rebind<real_of_t<typename Z::value_type>> c2r(const Z& z, std::int64_t n) {
  using X = typename Z::template rebind<real_of_t<typename Z::value_type>>;
  constexpr std::size_t p = index_of_v<D, typename Z::dims>;
  if (n < 1 || z.extents()[p] != n / 2 + 1)
    throw shape_error(cat("meshtensor: irfft<", D::name(), "> to a length of ", n, " needs ", n / 2 + 1,
                          " frequencies along ", D::name(), "; the tensor ", Z::type_name(), " has ", z.extents()[p]));
  auto extents = z.extents();
  extents[p] = n;
  X out(z.mesh(), extents, uninitialized);
  // FFTW's c2r overwrites its input.
  const Z scratch(z.mesh(), z.extents(), uninitialized);
  kernels::deep_copy(typename Z::execution_space{}, scratch.view(), z.view());
  const auto& e = out.local_extents();
  run<real_of_t<typename Z::value_type>>(kind::complex_to_real, fftw_shape<Z, D>(z.local_extents(), e, e), scratch.view(),
                                         out.view());
  return out;
}

// z, zero-padded along D from its extent to n.
template <Dim D, Tensor Z>
Z padded(const Z& z, std::int64_t n) {
  constexpr std::size_t p = index_of_v<D, typename Z::dims>;
  const std::int64_t m = z.local_extents()[p], inner = inner_of<D>(z);
  auto extents = z.extents();
  extents[p] = n;
  Z out(z.mesh(), extents);  // zeros
  const auto src = z.view();
  const auto dst = out.view();
  kernels::parallel_for(
      "meshtensor::fft_pad", kernels::range<typename Z::execution_space>(0, static_cast<std::int64_t>(src.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::int64_t o = i / (m * inner), r = i - o * m * inner;
        dst(o * n * inner + r) = src(i);
      });
  return out;
}

// Whether an fft op may run on X along Ds (each failure is one error, naming what is wrong).
template <Tensor X, bool Complex, Dim... Ds>
constexpr bool checked() {
  using T = typename X::value_type;
  if constexpr (sizeof...(Ds) == 0) {
    static_assert(sizeof...(Ds) > 0, "meshtensor: fft<Dims...> and ifft<Dims...> need the dims to transform");
    return false;
  } else if constexpr (!(contains_v<Ds, typename X::dims> && ...)) {
    static_assert((contains_v<Ds, typename X::dims> && ...), "meshtensor: fft's dims must be dims of the tensor");
    return false;
  } else if constexpr (((count_v<Ds, type_list<Ds...>> != 1) || ...)) {
    static_assert(((count_v<Ds, type_list<Ds...>> == 1) && ...), "meshtensor: fft<Dims...> names a dim twice");
    return false;
  } else if constexpr (!whole_along<X, Ds...>()) {
    ((void)sizeof(std::conditional_t<X::layout_type::template split_of<Ds>().count == 0, int,
                                     diagnostic::fft_dim_is_split<Ds>>), ...);
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

template <Dim... Ds, Tensor Z>
Z fft(const Z& z) {
  if constexpr (!detail::fft_impl::checked<Z, true, Ds...>()) {
    return z;
  } else {
    using detail::fft_impl::kind;
    const detail::op_call call(detail::planned_op{"fft", comm_plan{}}, z);
    Z out = detail::fft_impl::c2c<Ds...>(z, kind::forward, 1);
    detail::record<Z>(
        out,
        [z = detail::node_only(z)](const Z& g) {
          detail::push_fresh_grad(z, detail::fft_impl::c2c<Ds...>(g, kind::backward, 1));
        },
        z);
    return out;
  }
}

template <Dim... Ds, Tensor Z>
Z ifft(const Z& z) {
  if constexpr (!detail::fft_impl::checked<Z, true, Ds...>()) {
    return z;
  } else {
    using detail::fft_impl::kind;
    const detail::op_call call(detail::planned_op{"ifft", comm_plan{}}, z);
    const std::int64_t n = (z.extents()[index_of_v<Ds, typename Z::dims>] * ... * 1);
    const double inv = n > 0 ? 1.0 / double(n) : 1.0;
    Z out = detail::fft_impl::c2c<Ds...>(z, kind::backward, inv);
    detail::record<Z>(
        out,
        [z = detail::node_only(z), inv](const Z& g) {
          detail::push_fresh_grad(z, detail::fft_impl::c2c<Ds...>(g, kind::forward, inv));
        },
        z);
    return out;
  }
}

template <Dim D, Tensor X>
auto rfft(const X& x) {
  using Z = typename X::template rebind<complex<typename X::value_type>>;
  if constexpr (!detail::fft_impl::checked<X, false, D>()) {
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
          detail::push_fresh_grad(x, real(full));  // rules run with the tape paused: real records nothing
        },
        x);
    return out;
  }
}

template <Dim D, Tensor Z>
auto irfft(const Z& z, std::int64_t n) {
  using X = typename Z::template rebind<real_of_t<typename Z::value_type>>;
  if constexpr (!detail::fft_impl::checked<Z, true, D>()) {
    return X{};
  } else {
    const detail::op_call call(detail::planned_op{"irfft", comm_plan{}}, z);
    X out = detail::fft_impl::c2r<D>(z, n);
    const std::int64_t inner = detail::fft_impl::inner_of<D>(z);
    const double inv = 1.0 / double(n);
    if (!detail::planning()) detail::fft_impl::scale_all(out.view(), inv);
    // Each bin but the first (and the middle one of an even n) stands for itself and its conjugate.
    detail::record<X>(
        out,
        [z = detail::node_only(z), n, inner, inv](const X& g) {
          Z d = detail::fft_impl::r2c<D>(g);
          if (!detail::planning()) detail::fft_impl::scale_bins(d.view(), n / 2 + 1, inner, n, inv, 2 * inv);
          detail::push_fresh_grad(z, std::move(d));
        },
        z);
    return out;
  }
}

}  // namespace meshtensor
