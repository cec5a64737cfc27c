#pragma once
// Fused kernels along one dim D, the tensor's local data seen as rows [outer, n, inner] around D
// (one row per (outer, inner) pair, its n elements at stride inner). softmax, log_softmax, layer
// norm and softmax cross-entropy each make one or two passes over memory this way; composed of
// elementwise ops and reductions they made one pass and one fresh result per op (the step's main
// cost). Where D is split, a kernel runs in phases with the allreduces of the composed op between
// them, so the communication is unchanged. As in map_kernel.hpp the functors are named and
// templated on the element type only: one Kokkos kernel per (space, element type, functor),
// whatever the layout.
// NaN propagates (docs/concepts.md, "NaN"): the row max is NaN when any element of the row is
// (nan_max here, a NaN-propagating allreduce between phases), its shift is then 0, and the sum of
// exponentials is NaN, so softmax, log_softmax and the cross-entropy loss are NaN for the whole
// row, under every layout.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "../../runtime/nan_ops.hpp"
#include "kernels.hpp"

namespace meshtensor::detail {

struct row_shape {
  std::int64_t outer = 1, n = 0, inner = 1;
  std::int64_t begin = 0;  // global index along D of the first local element
  std::int64_t rows() const { return outer * inner; }
  // Offset of element 0 of row r (r = o * inner + i, the row-major index of the reduced tensor).
  KOKKOS_INLINE_FUNCTION std::int64_t base(std::int64_t r) const { return (r / inner) * n * inner + r % inner; }
};

template <Dim D, Tensor X>
row_shape rows_along(const X& x) {
  constexpr std::size_t a = X::template index_of<D>();
  row_shape s;
  for (std::size_t i = 0; i < X::rank; ++i) {
    if (i < a) s.outer *= x.local_extents()[i];
    if (i > a) s.inner *= x.local_extents()[i];
  }
  s.n = x.local_extents()[a];
  s.begin = x.offsets()[a];
  return s;
}

template <class Exec, class F>
void for_each_row(std::int64_t count, const F& f) {
  Kokkos::parallel_for("meshtensor::rows", Kokkos::RangePolicy<Exec>(0, count), f);
  Exec{}.fence();
}

// Phases of a row kernel: all at once (D not split), or one at a time with an allreduce between.
enum row_phase : int { phase_all = 0, phase_max = 1, phase_sum = 2, phase_write = 3 };

// A max, finite or not, as the shift of exponents: 0 when it is +-inf or NaN (so that a row of
// all -inf gives -inf, not NaN), as logsumexp_to does.
template <class T>
KOKKOS_INLINE_FUNCTION T finite_shift(T v) {
  return (v - v == T(0)) ? v : T(0);
}

// exp(d), with 0 for d below float's smallest subnormal exponent: the same value, without libm's
// slow underflow path, which every masked logit (-1e9) of causal attention took.
template <class T>
KOKKOS_INLINE_FUNCTION T exp_or_zero(T d) {
  constexpr T lowest = sizeof(T) == 4 ? T(-104) : T(-746);
  return d < lowest ? T(0) : Kokkos::Experimental::exp(d);
}

// softmax / log_softmax along D: m = row max, s = sum exp(x - shift(m)), then y = exp(x - shift(m))
// / s, or y = x - lse with lse = shift(m) + log(s).
template <class T, class Mem>
struct softmax_rows {
  Kokkos::View<T*, Mem> x, y, m, s;
  row_shape sh;
  int phase;
  bool log;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    if (phase == phase_all || phase == phase_max) {
      T mx = n > 0 ? x(b) : -Kokkos::Experimental::infinity<T>::value;
      for (std::int64_t l = 1; l < n; ++l) mx = nan_max(mx, x(b + l * st));
      m(r) = mx;
    }
    if (phase == phase_all || phase == phase_sum) {
      const T shift = finite_shift(m(r));
      T acc = 0;
      for (std::int64_t l = 0; l < n; ++l) {
        const T e = exp_or_zero(x(b + l * st) - shift);
        if (!log) y(b + l * st) = e;  // kept for the write phase: one exp per element, not two
        acc += e;
      }
      s(r) = acc;
    }
    if (phase == phase_all || phase == phase_write) {
      if (log) {
        const T lse = finite_shift(m(r)) + Kokkos::Experimental::log(s(r));
        for (std::int64_t l = 0; l < n; ++l) y(b + l * st) = x(b + l * st) - lse;
      } else {
        const T inv = T(1) / s(r);
        for (std::int64_t l = 0; l < n; ++l) y(b + l * st) *= inv;
      }
    }
  }
};

// Their gradient: s = sum(g * y) (softmax) or sum(g) (log_softmax), then dx = y * (g - s) or
// g - exp(y) * s.
template <class T, class Mem>
struct softmax_grad_rows {
  Kokkos::View<T*, Mem> y, g, dx, s;
  row_shape sh;
  int phase;
  bool log;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    if (phase == phase_all || phase == phase_sum) {
      T acc = 0;
      for (std::int64_t l = 0; l < n; ++l) acc += log ? g(b + l * st) : g(b + l * st) * y(b + l * st);
      s(r) = acc;
    }
    if (phase == phase_all || phase == phase_write) {
      const T sr = s(r);
      for (std::int64_t l = 0; l < n; ++l) {
        const std::int64_t k = b + l * st;
        dx(k) = log ? g(k) - Kokkos::Experimental::exp(y(k)) * sr : y(k) * (g(k) - sr);
      }
    }
  }
};

// Layer norm along an unsplit D: mean, biased variance, rstd = 1/sqrt(var + eps) per row, and
// y = (x - mean) * rstd * scale + bias (scale and bias indexed by the position along D).
template <class T, class Mem>
struct layer_norm_rows {
  Kokkos::View<T*, Mem> x, scale, bias, y, mean, rstd;
  row_shape sh;
  T eps;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    T acc = 0;
    for (std::int64_t l = 0; l < n; ++l) acc += x(b + l * st);
    const T mu = acc / T(n);
    T sq = 0;
    for (std::int64_t l = 0; l < n; ++l) sq += (x(b + l * st) - mu) * (x(b + l * st) - mu);
    const T rs = T(1) / Kokkos::Experimental::sqrt(sq / T(n) + eps);
    for (std::int64_t l = 0; l < n; ++l) y(b + l * st) = (x(b + l * st) - mu) * rs * scale(l) + bias(l);
    mean(r) = mu;
    rstd(r) = rs;
  }
};

// Gradient to x: with xhat = (x - mean) * rstd and d = g * scale,
// dx = rstd * (d - mean_D(d) - xhat * mean_D(d * xhat)).
template <class T, class Mem>
struct layer_norm_grad_rows {
  Kokkos::View<T*, Mem> x, g, scale, mean, rstd, dx;
  row_shape sh;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    const T mu = mean(r), rs = rstd(r);
    T sd = 0, sdx = 0;
    for (std::int64_t l = 0; l < n; ++l) {
      const T d = g(b + l * st) * scale(l);
      sd += d;
      sdx += d * (x(b + l * st) - mu) * rs;
    }
    sd /= T(n);
    sdx /= T(n);
    for (std::int64_t l = 0; l < n; ++l) {
      const std::int64_t k = b + l * st;
      dx(k) = rs * (g(k) * scale(l) - sd - (x(k) - mu) * rs * sdx);
    }
  }
};

// Gradients to scale and bias: the sums over all rows of g * xhat and of g (local; the caller
// allreduces over the axes of the other dims). One work item per block of `width` positions along
// D, walking the rows: with D innermost each row's block is one or two cache lines, where one
// item per position would read a line per element.
template <class T, class Mem>
struct layer_norm_grad_columns {
  static constexpr std::int64_t width = 16;
  Kokkos::View<T*, Mem> x, g, mean, rstd, dscale, dbias;
  row_shape sh;
  static std::int64_t blocks(const row_shape& s) { return (s.n + width - 1) / width; }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t blk) const {
    const std::int64_t l0 = blk * width, w = sh.n - l0 < width ? sh.n - l0 : width;
    T ds[width] = {}, db[width] = {};
    const std::int64_t rows = sh.outer * sh.inner;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t b = sh.base(r) + l0 * sh.inner;
      const T mu = mean(r), rs = rstd(r);
      for (std::int64_t j = 0; j < w; ++j) {
        const T gk = g(b + j * sh.inner);
        ds[j] += gk * (x(b + j * sh.inner) - mu) * rs;
        db[j] += gk;
      }
    }
    for (std::int64_t j = 0; j < w; ++j) {
      dscale(l0 + j) = ds[j];
      dbias(l0 + j) = db[j];
    }
  }
};

// Softmax cross-entropy along D (the vocabulary) against integer ids I: with targets
// t = on where the position along D (global) equals the id, off elsewhere (one_hot's rule),
// m = row max, s = sum exp(x - shift(m)), p = sum t * x; lse = shift(m) + log(s), loss = lse - p.
template <class T, class I, class Mem>
struct xent_rows {
  Kokkos::View<T*, Mem> x, m, s, p, lse, loss;
  Kokkos::View<I*, Mem> ids;
  row_shape sh;
  T on, off;
  int phase;
  KOKKOS_INLINE_FUNCTION T target(std::int64_t r, std::int64_t l) const {
    return ids(r) == static_cast<I>(sh.begin + l) ? on : off;
  }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    if (phase == phase_all || phase == phase_max) {
      T mx = n > 0 ? x(b) : -Kokkos::Experimental::infinity<T>::value;
      for (std::int64_t l = 1; l < n; ++l) mx = nan_max(mx, x(b + l * st));
      m(r) = mx;
    }
    if (phase == phase_all || phase == phase_sum) {
      const T shift = finite_shift(m(r));
      T acc = 0, picked = 0;
      for (std::int64_t l = 0; l < n; ++l) {
        acc += Kokkos::Experimental::exp(x(b + l * st) - shift);
        picked += x(b + l * st) * target(r, l);
      }
      s(r) = acc;
      p(r) = picked;
    }
    if (phase == phase_all || phase == phase_write) {
      lse(r) = finite_shift(m(r)) + Kokkos::Experimental::log(s(r));
      loss(r) = lse(r) - p(r);
    }
  }
};

// Its gradient to x: g * (exp(x - lse) - t).
template <class T, class I, class Mem>
struct xent_grad_rows {
  Kokkos::View<T*, Mem> x, g, lse, dx;
  Kokkos::View<I*, Mem> ids;
  row_shape sh;
  T on, off;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    const T gr = g(r), lr = lse(r);
    const I id = ids(r);
    for (std::int64_t l = 0; l < n; ++l) {
      const std::int64_t k = b + l * st;
      dx(k) = gr * (Kokkos::Experimental::exp(x(k) - lr) - (id == static_cast<I>(sh.begin + l) ? on : off));
    }
  }
};

}  // namespace meshtensor::detail
