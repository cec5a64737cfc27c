#pragma once
// Fused kernels along one dim D, the tensor's local data seen as rows [outer, n, inner] around D
// (one row per (outer, inner) pair, its n elements at stride inner). softmax, log_softmax, layer
// norm and softmax cross-entropy each make one or two passes over memory this way; composed of
// elementwise ops and reductions they made one pass and one fresh result per op (the step's main
// cost). Where D is split, a kernel runs in phases with the allreduces of the composed op between
// them, so the communication is unchanged. As in map.hpp the functors are named and
// templated on the element type only: one Kokkos kernel per (space, element type, functor),
// whatever the layout.
// NaN propagates (docs/concepts.md, "NaN"): the row max is NaN when any element of the row is
// (nan_max here, a NaN-propagating allreduce between phases), its shift is then 0, and the sum of
// exponentials is NaN, so softmax, log_softmax and the cross-entropy loss are NaN for the whole
// row, under every layout.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

#include "../element/kokkos_math.hpp"
#include "../element/nan.hpp"
#include "../error.hpp"
#include "../names/names.hpp"
#include "indexing.hpp"
#include "launch.hpp"
#include "map.hpp"
#include "walk.hpp"

namespace meshtensor::detail {

struct row_shape {
  std::int64_t outer = 1, n = 0, inner = 1;
  std::int64_t begin = 0;  // global index along D of the first local element
  std::int64_t rows() const { return outer * inner; }
  // Offset of element 0 of row r (r = o * inner + i, the row-major index of the reduced tensor).
  KOKKOS_INLINE_FUNCTION std::int64_t base(std::int64_t r) const { return (r / inner) * n * inner + r % inner; }
};

// X is a distributed tensor (tensor/ lies above kernels/: named by what it offers, not its concept).
template <Dim D, class X>
row_shape rows_along(const X& x) {
  constexpr std::size_t a = X::template index_of<D>();
  row_shape s;
  // Two loops, not one with i < a: nvcc warns of an unsigned comparison with zero when a is 0.
  for (std::size_t i = 0; i != a; ++i) s.outer *= x.local_extents()[i];
  for (std::size_t i = a + 1; i < X::rank; ++i) s.inner *= x.local_extents()[i];
  s.n = x.local_extents()[a];
  s.begin = x.template offset<D>();
  return s;
}

// A causal window over rows along D: the row whose coordinate along a query dim Q is q (global)
// sees the elements of D at global positions <= q, and the rest are masked out (attention's causal
// mask, without a mask tensor, its add, or the exponentials of the masked half). Off: every element.
struct causal_rows {
  bool on = false;
  std::int64_t q_stride = 1, q_n = 1, q_begin = 0;  // Q's local stride and extent, its global start
  // How many of the row's leading elements are visible (a prefix: positions grow along the row).
  KOKKOS_INLINE_FUNCTION std::int64_t visible(std::int64_t base, const row_shape& sh) const {
    if (!on || sh.n == 0) return sh.n;  // an empty slice along D: Q's stride may be 0
    const std::int64_t v = q_begin + (base / q_stride) % q_n - sh.begin + 1;
    return v < 0 ? 0 : (v > sh.n ? sh.n : v);
  }
};

template <Dim Q, class X>
causal_rows causal_along(const X& x) {
  constexpr std::size_t a = X::template index_of<Q>();
  causal_rows c;
  c.on = true;
  for (std::size_t i = a + 1; i < X::rank; ++i) c.q_stride *= x.local_extents()[i];
  c.q_n = x.local_extents()[a];
  c.q_begin = x.template offset<Q>();
  return c;
}

// How a row kernel walks the n elements of its row. serial_row: one thread, in order (host
// spaces; on a GPU, rows strided in memory, where neighbouring threads then read neighbouring
// rows). team_row: the threads of a team together (a contiguous row on a GPU, whose threads then
// read neighbouring elements, where one thread per row would read a cache line per element and
// leave most of the GPU idle when rows are few). A team's loops end with a barrier, so that what
// one thread wrote is there for every thread after.
struct serial_row {
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    for (std::int64_t l = 0; l < n; ++l) f(l);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(std::int64_t n, const F& f) const {
    T acc = 0;
    for (std::int64_t l = 0; l < n; ++l) acc += f(l);
    return acc;
  }
  // Two sums in one pass over the row.
  template <class T, class FA, class FB>
  KOKKOS_INLINE_FUNCTION Kokkos::pair<T, T> sum2(std::int64_t n, const FA& fa, const FB& fb) const {
    T a = 0, b = 0;
    for (std::int64_t l = 0; l < n; ++l) {
      a += fa(l);
      b += fb(l);
    }
    return {a, b};
  }
  // NaN if any element is (nan_max), -inf for an empty row.
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T max(std::int64_t n, const F& f) const {
    T mx = -kmath::infinity<T>();
    for (std::int64_t l = 0; l < n; ++l) mx = nan_max(mx, f(l));
    return mx;
  }
  // Per-row results (one thread writes them).
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    f();
  }
};

template <class Member>
struct team_row {
  const Member& team;
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), f);
    team.team_barrier();
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(std::int64_t n, const F& f) const {
    T acc = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, n), [&](std::int64_t l, T& a) { a += f(l); }, acc);
    team.team_barrier();
    return acc;
  }
  template <class T, class FA, class FB>
  KOKKOS_INLINE_FUNCTION Kokkos::pair<T, T> sum2(std::int64_t n, const FA& fa, const FB& fb) const {
    return {sum<T>(n, fa), sum<T>(n, fb)};
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T max(std::int64_t n, const F& f) const {
    T mx = -kmath::infinity<T>();
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, n), [&](std::int64_t l, T& m) { m = nan_max(m, f(l)); },
        nan_extremum_reducer<T, true>(mx));
    team.team_barrier();
    return mx;
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void single(const F& f) const {
    Kokkos::single(Kokkos::PerTeam(team), f);
    team.team_barrier();
  }
};

template <class F>
struct serial_rows_kernel {
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r) const { f.row(serial_row{}, r); }
};
template <class F, class Member>
struct team_rows_kernel {
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    f.row(team_row<Member>{team}, static_cast<std::int64_t>(team.league_rank()));
  }
};

// Runs f.row(walk, r) for every row r. automatic: a team per row on a GPU where rows are
// contiguous and long enough to share (inner == 1, n >= 32), one thread per row elsewhere.
template <class Exec, class F>
void for_each_row(std::int64_t count, const F& f) {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  row_walk walk = row_walk_from_environment();
  if (walk == row_walk::automatic) walk = !host && f.sh.inner == 1 && f.sh.n >= 32 ? row_walk::team : row_walk::serial;
  if (walk == row_walk::team) {
    using policy = Kokkos::TeamPolicy<Exec>;
    if (count > INT32_MAX)
      throw error(cat("meshtensor: a row kernel over ", count, " rows exceeds a Kokkos team policy's int league"));
    kernels::parallel_for("meshtensor::rows_team", kernels::policy<policy>(static_cast<int>(count), Kokkos::AUTO),
                         team_rows_kernel<F, typename policy::member_type>{f});
  } else {
    kernels::parallel_for("meshtensor::rows", kernels::range<Exec>(0, count), serial_rows_kernel<F>{f});
  }
}

// One work item per index, for kernels that are not one row each (layer_norm_grad_columns).
template <class Exec, class F>
void for_each_item(std::int64_t count, const F& f) {
  kernels::parallel_for("meshtensor::items", kernels::range<Exec>(0, count), f);
}

// Phases of a row kernel: all at once (D not split), or one at a time with an allreduce between.
enum row_phase : int { phase_all = 0, phase_max = 1, phase_sum = 2, phase_write = 3 };

// A row kernel's passes over the rows: one (phase_all) where its dim is whole; where it is split,
// each of `phases` in order, and after each but the last between(phase): the allreduce that joins
// the processors' partial results of that phase (the row max, the sums) before the next reads them.
// The one home of the sequence softmax, log_softmax and the cross-entropy share.
template <class Exec, class F, class Between>
void run_row_phases(std::int64_t rows, F f, bool split, std::initializer_list<row_phase> phases, Between between) {
  if (!split) {
    f.phase = phase_all;
    for_each_row<Exec>(rows, f);
    return;
  }
  std::size_t done = 0;
  for (const row_phase p : phases) {
    f.phase = p;
    for_each_row<Exec>(rows, f);
    if (++done < phases.size()) between(p);
  }
}

// A max, finite or not, as the shift of exponents: 0 when it is +-inf or NaN (so that a row of
// all -inf gives -inf, not NaN), as logsumexp_to does.
template <class T>
KOKKOS_INLINE_FUNCTION T finite_shift(T v) {
  return (v - v == T(0)) ? v : T(0);
}

// exp(d), with 0 for d below float's smallest subnormal exponent: the same value, without libm's
// slow underflow path, which every masked logit (-1e9) of causal attention took.
template <class T>
inline constexpr T exp_zero_below = sizeof(T) == 4 ? T(-104) : T(-746);
template <class T>
KOKKOS_INLINE_FUNCTION T exp_or_zero(T d) {
  return d < exp_zero_below<T> ? T(0) : kmath::exp(d);
}

// exp(scale x - shift), or 0 below float's smallest subnormal exponent (exp_or_zero), with the host's
// vectorisable exp (element/vector_math.hpp): softmax's exponentials over a contiguous float row,
// compiled for the job's ISA as a map's runs are (with_isa, rounding as the baseline does).
struct shifted_exp {
  float scale, shift;
  KOKKOS_FORCEINLINE_FUNCTION float operator()(float v) const {
    const float d = scale * v - shift;
    return vector_math::select(d < exp_zero_below<float>, 0.0f, kmath::vectorised::exp(d));
  }
};

// The max of scale * p[l] (NaN if any is, nan_max) and the sum of p[l] over a contiguous row, in 8
// lanes: a loop carrying one accumulator waits for each add or compare before the next (4 cycles a
// float), 8 independent ones do not. The max is the same in any order; the sum's order is fixed
// (lane by lane, then the lanes pairwise), so every rank and ISA rounds it alike.
inline constexpr int row_lanes = 8;
KOKKOS_INLINE_FUNCTION float lanes_max(const float* p, std::int64_t n, float scale) {
  float acc[row_lanes];
  int nan[row_lanes] = {};  // a NaN seen, kept apart: the compare-and-pick below is a max instruction
  for (float& a : acc) a = -kmath::infinity<float>();
  std::int64_t l = 0;
  for (; l + row_lanes <= n; l += row_lanes)
    for (int k = 0; k < row_lanes; ++k) {
      const float v = scale * p[l + k];
      nan[k] |= v != v;
      acc[k] = acc[k] < v ? v : acc[k];
    }
  for (; l < n; ++l) {
    const float v = scale * p[l];
    nan[0] |= v != v;
    acc[0] = acc[0] < v ? v : acc[0];
  }
  float m = acc[0];
  int any_nan = nan[0];
  for (int k = 1; k < row_lanes; ++k) {
    m = m < acc[k] ? acc[k] : m;
    any_nan |= nan[k];
  }
  return any_nan ? vector_math::float_of(0x7fc00000u) : m;  // a quiet NaN
}
KOKKOS_INLINE_FUNCTION float lanes_sum(const float* p, std::int64_t n) {
  float acc[row_lanes] = {};
  std::int64_t l = 0;
  for (; l + row_lanes <= n; l += row_lanes)
    for (int k = 0; k < row_lanes; ++k) acc[k] += p[l + k];
  for (; l < n; ++l) acc[0] += p[l];
  for (int width = row_lanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

// softmax / log_softmax along D of scale * x: m = row max, s = sum exp(scale x - shift(m)), then
// y = exp(scale x - shift(m)) / s, or y = scale x - lse with lse = shift(m) + log(s). Under a causal
// window the masked elements take no part and are written 0 (softmax) or -inf (log_softmax).
template <class T, class Mem>
struct softmax_rows {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  // A contiguous float row in host memory: its max and sum in lanes, its exponentials vectorised
  // (shifted_exp) and written to y; one loop of libm's expf and one accumulator each took 2.7 times
  // PyTorch's time at 64 x 64 (bench_op_overhead).
  static constexpr bool host_float =
      std::is_same_v<T, float> && Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  Kokkos::View<T*, Mem> x, y, m, s;
  row_shape sh;
  int phase;
  bool log;
  C scale = 1;
  causal_rows causal{};
  map_isa isa = map_isa_of_job();
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = causal.visible(b, sh);
    if constexpr (host_float) {
      if (st == 1) {  // y holds the exponentials until the write phase (log_softmax's too)
        const float* in = x.data() + b;
        float* out = y.data() + b;
        with_isa(isa, [&] {
          if (phase == phase_all || phase == phase_max) m(r) = lanes_max(in, n, scale);
          if (phase == phase_all || phase == phase_sum) {
            const shifted_exp e{scale, finite_shift(m(r))};
            for (std::int64_t l = 0; l < n; ++l) out[l] = e(in[l]);
            s(r) = lanes_sum(out, n);
          }
        });
        return write(w, r, n);
      }
    }
    if (phase == phase_all || phase == phase_max) {
      const C mx = w.template max<C>(n, [&](std::int64_t l) { return scale * C(x(b + l * st)); });
      w.single([&] { m(r) = mx; });
    }
    if (phase == phase_all || phase == phase_sum) {
      const C shift = finite_shift(m(r));
      const C acc = w.template sum<C>(n, [&](std::int64_t l) {
        const C e = exp_or_zero(scale * C(x(b + l * st)) - shift);
        if (!log) y(b + l * st) = e;  // kept for the write phase: one exp per element, not two
        return e;
      });
      w.single([&] { s(r) = acc; });
    }
    write(w, r, n);
  }
  template <class Row>
  KOKKOS_INLINE_FUNCTION void write(const Row& w, std::int64_t r, std::int64_t n) const {
    if (phase != phase_all && phase != phase_write) return;
    const std::int64_t b = sh.base(r), st = sh.inner;
    if (log) {
      const C lse = finite_shift(m(r)) + kmath::log(s(r));
      w.for_each(n, [&](std::int64_t l) { y(b + l * st) = scale * C(x(b + l * st)) - lse; });
    } else {
      const C inv = C(1) / s(r);
      w.for_each(n, [&](std::int64_t l) { y(b + l * st) *= inv; });
    }
    const T masked = log ? T(-kmath::infinity<C>()) : T(0);
    w.for_each(sh.n - n, [&](std::int64_t l) { y(b + (n + l) * st) = masked; });
  }
};

// Their gradient: s = sum(g * y) (softmax) or sum(g) (log_softmax), then dx = scale y (g - s) or
// scale (g - exp(y) s); 0 where a causal window masks x out.
template <class T, class Mem>
struct softmax_grad_rows {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  Kokkos::View<T*, Mem> y, g, dx, s;
  row_shape sh;
  int phase;
  bool log;
  C scale = 1;
  causal_rows causal{};
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = causal.visible(b, sh);
    if (phase == phase_all || phase == phase_sum) {
      const C acc =
          w.template sum<C>(n, [&](std::int64_t l) { return log ? C(g(b + l * st)) : C(g(b + l * st) * y(b + l * st)); });
      w.single([&] { s(r) = acc; });
    }
    if (phase == phase_all || phase == phase_write) {
      const C sr = s(r);
      w.for_each(n, [&](std::int64_t l) {
        const std::int64_t k = b + l * st;
        dx(k) = scale * (log ? g(k) - kmath::exp(y(k)) * sr : y(k) * (g(k) - sr));
      });
      w.for_each(sh.n - n, [&](std::int64_t l) { dx(b + (n + l) * st) = T(0); });
    }
  }
};

// Layer norm along an unsplit D: mean, biased variance, rstd = 1/sqrt(var + eps) per row, and
// y = (x - mean) * rstd * scale + bias (scale and bias indexed by the position along D).
template <class T, class Mem>
struct layer_norm_rows {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  Kokkos::View<T*, Mem> x, scale, bias, y, mean, rstd;
  row_shape sh;
  T eps;
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    const C mu = w.template sum<C>(n, [&](std::int64_t l) { return x(b + l * st); }) / C(n);
    const C sq = w.template sum<C>(n, [&](std::int64_t l) { return (x(b + l * st) - mu) * (x(b + l * st) - mu); });
    const C rs = C(1) / kmath::sqrt(sq / C(n) + eps);
    w.for_each(n, [&](std::int64_t l) { y(b + l * st) = (x(b + l * st) - mu) * rs * scale(l) + bias(l); });
    w.single([&] {
      mean(r) = mu;
      rstd(r) = rs;
    });
  }
};

// Gradient to x: with xhat = (x - mean) * rstd and d = g * scale,
// dx = rstd * (d - mean_D(d) - xhat * mean_D(d * xhat)).
template <class T, class Mem>
struct layer_norm_grad_rows {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  Kokkos::View<T*, Mem> x, g, scale, mean, rstd, dx;
  row_shape sh;
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    const C mu = mean(r), rs = rstd(r);
    const auto sums = w.template sum2<C>(
        n, [&](std::int64_t l) { return g(b + l * st) * scale(l); },
        [&](std::int64_t l) { return g(b + l * st) * scale(l) * (x(b + l * st) - mu) * rs; });
    const C sd = sums.first / C(n), sdx = sums.second / C(n);
    w.for_each(n, [&](std::int64_t l) {
      const std::int64_t k = b + l * st;
      dx(k) = rs * (g(k) * scale(l) - sd - (x(k) - mu) * rs * sdx);
    });
  }
};

// Gradients to scale and bias: the sums over all rows of g * xhat and of g (local; the caller
// allreduces over the axes of the other dims). One work item per block of `width` positions along
// D, walking the rows: with D innermost each row's block is one or two cache lines, where one
// item per position would read a line per element.
template <class T, class Mem>
struct layer_norm_grad_columns {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  static constexpr std::int64_t width = 16;
  Kokkos::View<T*, Mem> x, g, mean, rstd, dscale, dbias;
  row_shape sh;
  static std::int64_t blocks(const row_shape& s) { return (s.n + width - 1) / width; }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t blk) const {
    const std::int64_t l0 = blk * width, w = sh.n - l0 < width ? sh.n - l0 : width;
    C ds[width] = {}, db[width] = {};
    const std::int64_t rows = sh.outer * sh.inner;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t b = sh.base(r) + l0 * sh.inner;
      const C mu = mean(r), rs = rstd(r);
      for (std::int64_t j = 0; j < w; ++j) {
        const C gk = g(b + j * sh.inner);
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

// The same sums on a GPU, where layer_norm_grad_columns' one thread per 16 columns leaves the
// device nearly idle (d_model 1024: 64 threads walking every row; 13.5 ms of a 125 ms step on an
// H200): one thread per (chunk of rows, column), columns fastest so that neighbouring threads read
// neighbouring elements, into partial sums [chunks x n] (in C), then one thread per column adds
// its chunks in order (deterministic).
template <class T, class Mem>
struct layer_norm_grad_column_chunks {
  using C = compute_t<T>;
  static constexpr std::int64_t rows_per_chunk = 64;
  Kokkos::View<T*, Mem> x, g, mean, rstd;
  Kokkos::View<C*, Mem> part_ds, part_db;
  row_shape sh;
  static std::int64_t chunks(const row_shape& s) { return (s.rows() + rows_per_chunk - 1) / rows_per_chunk; }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t chunk = i / sh.n, l = i % sh.n, rows = sh.outer * sh.inner;
    const std::int64_t end = (chunk + 1) * rows_per_chunk < rows ? (chunk + 1) * rows_per_chunk : rows;
    C ds = 0, db = 0;
    for (std::int64_t r = chunk * rows_per_chunk; r < end; ++r) {
      const std::int64_t at = sh.base(r) + l * sh.inner;
      const C gk = g(at);
      ds += gk * (C(x(at)) - C(mean(r))) * C(rstd(r));
      db += gk;
    }
    part_ds(i) = ds;
    part_db(i) = db;
  }
};
template <class T, class Mem>
struct layer_norm_grad_column_totals {
  using C = compute_t<T>;
  Kokkos::View<C*, Mem> part_ds, part_db;
  Kokkos::View<T*, Mem> dscale, dbias;
  std::int64_t n, chunks;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t l) const {
    C ds = 0, db = 0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      ds += part_ds(c * n + l);
      db += part_db(c * n + l);
    }
    dscale(l) = ds;
    dbias(l) = db;
  }
};

// Softmax cross-entropy along D (the vocabulary) against integer ids I: with targets
// t = on where the position along D (global) equals the id, off elsewhere (one_hot's rule),
// m = row max, s = sum exp(x - shift(m)), p = sum t * x; lse = shift(m) + log(s), loss = lse - p.
template <class T, class I, class Mem>
struct xent_rows {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  Kokkos::View<T*, Mem> x, m, s, p, lse, loss;
  Kokkos::View<I*, Mem> ids;
  row_shape sh;
  T on, off;
  int phase;
  KOKKOS_INLINE_FUNCTION T target(std::int64_t r, std::int64_t l) const {
    return ids(r) == static_cast<I>(sh.begin + l) ? on : off;
  }
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    if (phase == phase_all || phase == phase_max) {
      const C mx = w.template max<C>(n, [&](std::int64_t l) { return C(x(b + l * st)); });
      w.single([&] { m(r) = mx; });
    }
    if (phase == phase_all || phase == phase_sum) {
      const C shift = finite_shift(m(r));
      const auto sums = w.template sum2<C>(
          n, [&](std::int64_t l) { return kmath::exp(x(b + l * st) - shift); },
          [&](std::int64_t l) { return x(b + l * st) * target(r, l); });
      w.single([&] {
        s(r) = sums.first;
        p(r) = sums.second;
      });
    }
    if (phase == phase_all || phase == phase_write) {
      w.single([&] {
        lse(r) = finite_shift(m(r)) + kmath::log(s(r));
        loss(r) = lse(r) - p(r);
      });
    }
  }
};

// The loss of rows whose log_softmax a provider wrote (kernels::softmax_rows; D unsplit and
// contiguous): loss = -sum_l t_l logp_l = -((on - off) logp[label] + off sum_l logp_l). A label
// outside D's range leaves targets that sum to n off, not 1: then, as xent_rows computes it,
// loss = lse - off sum_l x_l = (1 - n off) lse - off sum_l logp_l, with lse = x_0 - logp_0.
template <class T, class I, class Mem>
struct xent_logp_rows {
  using C = compute_t<T>;
  Kokkos::View<T*, Mem> x, logp, loss;
  Kokkos::View<I*, Mem> ids;
  row_shape sh;
  T on, off;
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), n = sh.n;
    const C total = off != T(0) ? w.template sum<C>(n, [&](std::int64_t l) { return C(logp(b + l)); }) : C(0);
    const I id = ids(r);
    const std::int64_t label = static_cast<std::int64_t>(id) - sh.begin;
    const bool here = static_cast<I>(label + sh.begin) == id && label >= 0 && label < n;
    w.single([&] {
      loss(r) = here ? -(C(on) - C(off)) * C(logp(b + label)) - C(off) * total
                     : (C(1) - C(off) * C(n)) * (n > 0 ? C(x(b)) - C(logp(b)) : C(0)) - C(off) * total;
    });
  }
};

// Its gradient, from the rows' softmax p that a provider wrote into dx: dx = g * (p - t).
template <class T, class I, class Mem>
struct xent_prob_grad_rows {
  Kokkos::View<T*, Mem> g, dx;
  Kokkos::View<I*, Mem> ids;
  row_shape sh;
  T on, off;
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r);
    const T gr = g(r);
    const I id = ids(r);
    w.for_each(sh.n, [&](std::int64_t l) {
      dx(b + l) = gr * (dx(b + l) - (id == static_cast<I>(sh.begin + l) ? on : off));
    });
  }
};

// Its gradient to x: g * (exp(x - lse) - t).
template <class T, class I, class Mem>
struct xent_grad_rows {
  using C = compute_t<T>;  // what a row computes and accumulates in (float for bf16)
  Kokkos::View<T*, Mem> x, g, lse, dx;
  Kokkos::View<I*, Mem> ids;
  row_shape sh;
  T on, off;
  template <class Row>
  KOKKOS_INLINE_FUNCTION void row(const Row& w, std::int64_t r) const {
    const std::int64_t b = sh.base(r), st = sh.inner, n = sh.n;
    const C gr = g(r), lr = lse(r);
    const I id = ids(r);
    w.for_each(n, [&](std::int64_t l) {
      const std::int64_t k = b + l * st;
      dx(k) = gr * (kmath::exp(x(k) - lr) - (id == static_cast<I>(sh.begin + l) ? on : off));
    });
  }
};

}  // namespace meshtensor::detail
