#pragma once
// The local reduction kernel every reduction runs (reduce_sum, reduce_max and reduce_min, the
// reductions built on them, and the gradients that sum broadcast operands back): a slice reduced
// over some of its dims, sum, NaN-propagating max or min, per (space, element type) whatever the
// layout. The typed entry and the allreduce across processors are ops/sum_broadcast.hpp's reduce_to.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <limits>
#include <span>

#include "../element/bf16.hpp"
#include "../element/complex.hpp"
#include "../element/nan.hpp"
#include "../error.hpp"
#include "../names/names.hpp"
#include "../runtime/collectives.hpp"
#include "indexing.hpp"
#include "launch.hpp"
#include "pool.hpp"
#include "rows.hpp"

namespace meshtensor::detail {

// The local reduction, on a host: one work item per tile (up to tile_len outputs) of a run of the
// output's last dim (on a GPU a tile is one output, so that neighbouring threads take neighbouring
// outputs). The base offset (a 64-bit division per outer dim) is computed once per tile and the
// reduce op is chosen outside the loops. Where the outputs are contiguous in x, the inner loop runs
// over the tile (vectorised), accumulating in the output one reduced position at a time;
// otherwise each output accumulates its own positions. Either way each output combines the reduced
// positions in the same order as before, so results are unchanged. A named functor templated on the element type only, so
// reductions under every layout share one kernel per (space, element type).
template <class T>
struct reduce_runs_functor {
  static constexpr std::int64_t host_tile_len = 1024;
  const T* x;
  T* out;
  std::int64_t run;    // extent of the output's last dim (1 for a rank-0 output)
  std::int64_t tiles;  // tiles per run
  std::int64_t last_stride;  // x's stride along the output's last dim
  int outer;                 // output dims before the last
  kidx out_ext, base_stride, red_ext, red_stride;
  int nred;
  std::int64_t red_count;
  reduce_op op;
  std::int64_t tile_len = host_tile_len;

  template <reduce_op Op, class A>
  KOKKOS_INLINE_FUNCTION static A combine(A acc, A v) {
    if constexpr (Op == reduce_op::sum) return acc + v;
    // NaN propagates: a NaN v replaces acc, and a NaN acc stays (a plain v > acc ? v : acc kept a
    // NaN only when it came first). Ties keep acc, as before.
    else if constexpr (Op == reduce_op::max) return nan_max(acc, v);
    else return nan_min(acc, v);
  }

  KOKKOS_INLINE_FUNCTION std::int64_t reduced_offset(std::int64_t r) const {
    // One reduced dim (the common case): its offset needs no 64-bit division.
    return nred == 1 ? r * red_stride[0] : operand_offset(r, red_ext, red_stride, nred);
  }

  template <reduce_op Op>
  KOKKOS_INLINE_FUNCTION void tile(std::int64_t base, T* o, std::int64_t len) const {
    // A bf16 sum accumulates in float, per output (accumulating in the bf16 outputs would round
    // at every step).
    constexpr bool accumulate_apart = Op == reduce_op::sum && !std::is_same_v<compute_t<T>, T>;
    if (last_stride == 1 && !accumulate_apart) {
      // Outputs contiguous in x: one reduced position at a time over the whole tile.
      if (Op == reduce_op::sum)
        for (std::int64_t j = 0; j < len; ++j) o[j] = T(0);
      for (std::int64_t r = 0; r < red_count; ++r) {
        const T* xr = x + base + reduced_offset(r);
        if (r == 0 && Op != reduce_op::sum)
          for (std::int64_t j = 0; j < len; ++j) o[j] = xr[j];
        else
          for (std::int64_t j = 0; j < len; ++j) o[j] = combine<Op>(o[j], xr[j]);
      }
    } else {
      // Reduced dims inside the output's last dim: each output's positions, one output at a time.
      for (std::int64_t j = 0; j < len; ++j) {
        const T* xj = x + base + j * last_stride;
        using A = compute_t<T>;
        A acc = Op == reduce_op::sum ? A(0) : A(xj[reduced_offset(0)]);
        for (std::int64_t r = 0; r < red_count; ++r) acc = combine<Op>(acc, A(xj[reduced_offset(r)]));
        o[j] = acc;
      }
    }
  }

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t q = item / tiles, j0 = (item - q * tiles) * tile_len;
    const std::int64_t len = run - j0 < tile_len ? run - j0 : tile_len;
    const std::int64_t base = operand_offset(q, out_ext, base_stride, outer) + j0 * last_stride;
    T* o = out + q * run + j0;
    if (op == reduce_op::sum || is_complex_v<T>)  // complex: sums only (reduce_kernel refuses the rest)
      tile<reduce_op::sum>(base, o, len);
    else if constexpr (is_complex_v<T>)
      return;
    else if (op == reduce_op::max)
      tile<reduce_op::max>(base, o, len);
    else
      tile<reduce_op::min>(base, o, len);
  }
};

// A team per output: a GPU's shape when each output reduces many positions (a loss, a norm, a sum
// over a long dim), where one thread per output would leave the device idle and read strided.
// Where there are few outputs (chunks > 1), a team per chunk of each output's positions writes the
// chunk's result to partial (in compute_t<T>: a bf16 sum is rounded once, at the end), and
// reduce_partials_functor combines each output's chunks in order.
template <class T, class Member>
struct reduce_team_functor {
  reduce_runs_functor<T> f;
  std::int64_t chunk = 0, chunks = 1;  // positions per team, teams per output (1: f.out directly)
  compute_t<T>* partial = nullptr;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t league = static_cast<std::int64_t>(team.league_rank());
    const std::int64_t q = league / chunks, c = league - q * chunks;
    const std::int64_t o = q / f.run, j = q - o * f.run;
    const T* xq = f.x + operand_offset(o, f.out_ext, f.base_stride, f.outer) + j * f.last_stride;
    const auto at = [&](std::int64_t r) { return static_cast<compute_t<T>>(xq[f.reduced_offset(r)]); };
    const std::int64_t begin = chunks > 1 ? c * chunk : 0;
    const std::int64_t end = chunks > 1 && begin + chunk < f.red_count ? begin + chunk : f.red_count;
    const auto range = Kokkos::TeamThreadRange(team, begin, end);
    compute_t<T> acc = 0;
    if (f.op == reduce_op::sum || is_complex_v<T>) {  // complex: sums only (reduce_kernel refuses the rest)
      Kokkos::parallel_reduce(range, [&](std::int64_t r, compute_t<T>& a) { a += at(r); }, acc);
    } else if constexpr (is_complex_v<T>)
      return;
    else if (f.op == reduce_op::max)
      Kokkos::parallel_reduce(range, [&](std::int64_t r, compute_t<T>& m) { m = nan_max(m, at(r)); },
                              nan_extremum_reducer<compute_t<T>, true>(acc));
    else
      Kokkos::parallel_reduce(range, [&](std::int64_t r, compute_t<T>& m) { m = nan_min(m, at(r)); },
                              nan_extremum_reducer<compute_t<T>, false>(acc));
    Kokkos::single(Kokkos::PerTeam(team), [&] {
      if (chunks > 1)
        partial[league] = acc;
      else
        f.out[q] = static_cast<T>(acc);
    });
  }
};

// Each output's chunk results, combined in chunk order by one thread (a few hundred at most).
template <class T>
struct reduce_partials_functor {
  const compute_t<T>* partial;
  T* out;
  std::int64_t chunks;
  reduce_op op;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t q) const {
    const compute_t<T>* p = partial + q * chunks;
    compute_t<T> acc = p[0];
    for (std::int64_t c = 1; c < chunks; ++c) {
      if (op == reduce_op::sum || is_complex_v<T>)
        acc += p[c];
      else if constexpr (!is_complex_v<T>)
        acc = op == reduce_op::max ? nan_max(acc, p[c]) : nan_min(acc, p[c]);
    }
    out[q] = static_cast<T>(acc);
  }
};

// Positions per team, and the outputs below which a team per output leaves the device idle: one
// team read a whole 1024 x 1024 sum on one multiprocessor of an H200, 3.7 ms, each thread waiting
// on its loads in turn (PyTorch's sum: under 0.2 ms).
inline constexpr std::int64_t reduce_team_chunk = 4096;
inline constexpr std::int64_t reduce_chunked_outputs = 1024;

template <class Exec, class T>
void reduce_kernel(const Kokkos::View<T*, typename Exec::memory_space>& xv,
                   const Kokkos::View<T*, typename Exec::memory_space>& ov, std::int64_t n, const kidx& out_ext,
                   int rout, const kidx& base_stride, const kidx& red_ext, const kidx& red_stride, int nred,
                   std::int64_t red_count, reduce_op op) {
  if constexpr (is_complex_v<T>)
    if (op != reduce_op::sum) throw error("meshtensor: a max or min of complex elements: complex numbers have no order");
  if (n == 0) return;
  // Adjacent reduced dims that lie contiguously in x become one: the same positions in the same
  // order (the same result, bit for bit) with fewer 64-bit divisions each. A whole-tensor sum (a
  // loss) had one division per dim per element, about 6 ns per element; now none.
  kidx ext{}, stride{};
  int m = 0;
  for (int i = 0; i < nred; ++i) {
    if (m > 0 && stride[m - 1] == red_ext[i] * red_stride[i]) {
      ext[m - 1] *= red_ext[i];
      stride[m - 1] = red_stride[i];
    } else {
      ext[m] = red_ext[i];
      stride[m] = red_stride[i];
      ++m;
    }
  }
  reduce_runs_functor<T> f{xv.data(), ov.data(), 1, 1, 0, 0, out_ext, base_stride, ext, stride, m, red_count, op};
  if (rout > 0) {
    f.run = out_ext[rout - 1];
    f.last_stride = base_stride[rout - 1];
    f.outer = rout - 1;
  }
  // As the row kernels (MESHTENSOR_ROW_WALK forces the walk): on a GPU a team per output that
  // reduces 32 or more positions, else a thread per output; on a host, tiles.
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  row_walk walk = row_walk_from_environment();
  if (walk == row_walk::automatic) walk = !host && red_count >= 32 ? row_walk::team : row_walk::serial;
  if (walk == row_walk::team) {
    using policy = Kokkos::TeamPolicy<Exec>;
    if (n > INT32_MAX)
      throw error(cat("meshtensor: a reduction to ", n, " outputs exceeds a Kokkos team policy's int league"));
    using team_functor = reduce_team_functor<T, typename policy::member_type>;
    const std::int64_t chunks = n < reduce_chunked_outputs && red_count >= 2 * reduce_team_chunk
                                    ? (red_count + reduce_team_chunk - 1) / reduce_team_chunk
                                    : 1;
    if (chunks == 1) {
      kernels::parallel_for("meshtensor::reduce_team", kernels::policy<policy>(static_cast<int>(n), Kokkos::AUTO),
                            team_functor{f});
      return;
    }
    // (counted in a plan, as the run allocates it)
    const temporary_view<compute_t<T>, typename Exec::memory_space> partial(static_cast<std::size_t>(n * chunks));
    kernels::parallel_for("meshtensor::reduce_team_chunks",
                          kernels::policy<policy>(static_cast<int>(n * chunks), Kokkos::AUTO),
                          team_functor{f, reduce_team_chunk, chunks, partial.v.data()});
    kernels::parallel_for("meshtensor::reduce_partials", kernels::range<Exec>(0, n),
                          reduce_partials_functor<T>{partial.v.data(), ov.data(), chunks, op});
    return;
  }
  if (!host) f.tile_len = 1;
  f.tiles = (f.run + f.tile_len - 1) / f.tile_len;
  kernels::parallel_for("meshtensor::reduce", kernels::range<Exec>(0, (n / f.run) * f.tiles), f);
}

// The local part of reduce_to: x's slice (local extents x_ext) reduced onto out's (out_ext). Dim i
// of out sits at out_in_x[i] of x, and dim i of x at x_in_out[i] of out (out's rank where out
// lacks it: a reduced dim). A function per (space, element type), not per pair of tensor types
// (compile time).
template <class Exec, class T>
void reduce_local(const Kokkos::View<T*, typename Exec::memory_space>& xv, std::span<const std::int64_t> x_ext,
                  std::span<const std::size_t> out_in_x, std::span<const std::size_t> x_in_out,
                  const Kokkos::View<T*, typename Exec::memory_space>& ov, std::span<const std::int64_t> out_ext,
                  reduce_op op) {
  kidx out_k{}, red_ext{}, red_stride{};
  for (std::size_t i = 0; i != out_ext.size(); ++i) out_k[i] = out_ext[i];
  const kidx base_stride = broadcast_strides_at(out_in_x, x_ext);
  const kidx x_stride = row_major_strides_of(x_ext);
  std::int64_t red_count = 1, out_size = 1;
  for (auto e : out_ext) out_size *= e;
  int nred = 0;
  for (std::size_t i = 0; i != x_ext.size(); ++i)
    if (!found_at(x_in_out[i], out_ext.size())) {
      red_ext[nred] = x_ext[i];
      red_stride[nred] = x_stride[i];
      red_count *= x_ext[i];
      ++nred;
    }
  if (red_count == 0 && out_size > 0) {
    // This processor holds none of the reduced elements (a dim smaller than its parts): its share
    // is the identity of op, so the allreduce sees only real elements.
    using lim = std::numeric_limits<T>;
    const T identity = op == reduce_op::sum ? T(0)
                       : op == reduce_op::max ? (lim::has_infinity ? T(-lim::infinity()) : lim::lowest())
                                              : (lim::has_infinity ? lim::infinity() : lim::max());
    kernels::deep_copy(Exec{}, ov, identity);
  } else {
    reduce_kernel<Exec>(xv, ov, out_size, out_k, static_cast<int>(out_ext.size()), base_stride, red_ext, red_stride, nred,
                        red_count, op);
  }
}

}  // namespace meshtensor::detail
