#pragma once
// reduce_sum over named dims, and broadcast_to (its gradient), with the reduction kernel every
// reduction runs (reduce_to). Below elementwise.hpp, whose gradients sum broadcast operands back;
// the reductions built from elementwise ops (reduce_mean, reduce_max, reduce_min, logsumexp) are
// reductions.hpp.
// Communication: reduce_sum allreduces over the axes of the reduced dims that are split (none
// when none is split); broadcast_to communicates nothing.
// NaN: reduce_to's max and min propagate NaN, locally and across processors
// (runtime/nan_allreduce.hpp), so the result does not depend on the layout or on where the NaN is.
#include <Kokkos_Core.hpp>
#include <cmath>
#include <limits>
#include <span>

#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "../runtime/nan_allreduce.hpp"
#include "../tensor/mpi_buffer.hpp"
#include "cast.hpp"
#include "../tensor/allreduce_local.hpp"
#include "detail/op_support.hpp"
#include "detail/map_kernel.hpp"
#include "detail/rows.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Tensor, class Dim>
struct reduced_dim_not_in_tensor {
  static_assert(sizeof(Dim) == 0, "meshtensor: a reduction names a dim that the tensor does not have");
};
template <class Target, class Source>
struct broadcast_target_lacks_dims {
  static_assert(sizeof(Target) == 0,
                "meshtensor: broadcast_to's target must hold every dim of the source tensor");
};
}  // namespace diagnostic

namespace detail {


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
    if (op == reduce_op::sum)
      tile<reduce_op::sum>(base, o, len);
    else if (op == reduce_op::max)
      tile<reduce_op::max>(base, o, len);
    else
      tile<reduce_op::min>(base, o, len);
  }
};

// A team per output: a GPU's shape when each output reduces many positions (a loss, a norm, a sum
// over a long dim), where one thread per output would leave the device idle and read strided.
template <class T, class Member>
struct reduce_team_functor {
  reduce_runs_functor<T> f;
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t q = static_cast<std::int64_t>(team.league_rank());
    const std::int64_t o = q / f.run, j = q - o * f.run;
    const T* xq = f.x + operand_offset(o, f.out_ext, f.base_stride, f.outer) + j * f.last_stride;
    const auto at = [&](std::int64_t r) { return xq[f.reduced_offset(r)]; };
    T acc = 0;
    const auto range = Kokkos::TeamThreadRange(team, f.red_count);
    if (f.op == reduce_op::sum) {
      compute_t<T> sum = 0;
      Kokkos::parallel_reduce(range, [&](std::int64_t r, compute_t<T>& a) { a += at(r); }, sum);
      acc = sum;
    } else if (f.op == reduce_op::max)
      Kokkos::parallel_reduce(range, [&](std::int64_t r, T& m) { m = nan_max(m, at(r)); }, nan_extremum_reducer<T, true>(acc));
    else
      Kokkos::parallel_reduce(range, [&](std::int64_t r, T& m) { m = nan_min(m, at(r)); }, nan_extremum_reducer<T, false>(acc));
    Kokkos::single(Kokkos::PerTeam(team), [&] { f.out[q] = acc; });
  }
};

template <class Exec, class T>
void reduce_kernel(const Kokkos::View<T*, typename Exec::memory_space>& xv,
                   const Kokkos::View<T*, typename Exec::memory_space>& ov, std::int64_t n, const kidx& out_ext,
                   int rout, const kidx& base_stride, const kidx& red_ext, const kidx& red_stride, int nred,
                   std::int64_t red_count, reduce_op op) {
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
    kernels::parallel_for("meshtensor::reduce_team", policy(static_cast<int>(n), Kokkos::AUTO),
                         reduce_team_functor<T, typename policy::member_type>{f});
    return;
  }
  if (!host) f.tile_len = 1;
  f.tiles = (f.run + f.tile_len - 1) / f.tile_len;
  kernels::parallel_for("meshtensor::reduce", Kokkos::RangePolicy<Exec>(0, (n / f.run) * f.tiles), f);
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

// The axes of the dims that reducing X onto Out removes: a local sum is a partial sum over them.
template <Tensor Out, Tensor X>
constexpr unsigned removed_axes() {
  return axes_mask_of<X, difference_t<typename X::dims, typename Out::dims>>();
}

// Local reduction of x onto Out (Out's dims are a subset of X's), then allreduce over the axes of
// the removed dims that are split (with combine false, not: this processor's partial result, for
// gradient rules that hand partial sums to the tape, autodiff/tape.hpp).
template <Tensor Out, bool combine = true, Tensor X>
Out reduce_to(const X& x, reduce_op op) {
  using removed = difference_t<typename X::dims, typename Out::dims>;
  if constexpr (combine && std::is_same_v<typename X::value_type, bf16> && axes_mask_of<X, removed>() != 0) {
    // A bf16 sum's partial results, rounded before the allreduce, would be rounded twice: the
    // whole sum runs in float and is rounded once.
    if (op == reduce_op::sum)
      return cast_local<bf16>(reduce_to<typename Out::template rebind<float>, true>(cast_local<float>(x), op));
  }
  Out out(x.mesh(), result_extents<Out>(x), uninitialized);
  reduce_local<typename X::execution_space>(x.view(), x.local_extents(), positions_in_v<Out, X>, positions_in_v<X, Out>,
                                            out.view(), out.local_extents(), op);
  if constexpr (combine) {
    const collective_subject subject(&X::type_name);
    allreduce_local(out, axes_mask_of<X, removed>(), op);
  }
  return out;
}

// A gradient rule's sum of g onto an input of type X: pushed as a partial sum for the tape to reduce.
template <Tensor X, Tensor G>
void push_summed_grad(const X& input, const G& g) {
  if (input.tracks_grad()) push_partial_grad(input, reduce_to<X, false>(g, reduce_op::sum), removed_axes<X, G>());
}

// Out (a superset of X's dims) with x repeated along the dims X lacks.
template <Tensor Out, Tensor X>
Out broadcast_local(const X& x, const typename Out::extents_type& extents) {
  return map_to<Out>(extents, identity_fn{}, x);
}

template <class X, class... Ds>
constexpr void check_reduced_dims() {
  (
      [] {
        if constexpr (!contains_v<Ds, typename X::dims>) (void)sizeof(diagnostic::reduced_dim_not_in_tensor<X, Ds>);
      }(),
      ...);
}

template <class X, class... Ds>
using reduced_t = with_dims_t<X, difference_t<typename X::dims, type_list<Ds...>>>;

}  // namespace detail

// x repeated along the dims of Out that x lacks: no collective (its gradient, a sum over them,
// allreduces where they are split).
template <Tensor Out, Tensor X>
constexpr comm_plan broadcast_to_plan() {
  return {};
}

// x repeated along the dims of Out that x lacks. Gradient: sum back over those dims.
template <Tensor Out, Tensor X>
Out broadcast_to(const X& x, const typename Out::extents_type& extents) {
  detail::require_same_layout<Out, X>();
  if constexpr (difference_t<typename X::dims, typename Out::dims>::size != 0)
    (void)sizeof(diagnostic::broadcast_target_lacks_dims<Out, X>);
  constexpr auto pos = detail::positions_in<X, Out>();
  for (std::size_t i = 0; i < X::rank; ++i)
    if (x.extents()[i] != extents[pos[i]])
      throw shape_error(detail::cat("broadcast_to: dim '", X::dim_names()[i], "' has extent ", x.extents()[i],
                                    " in ", X::type_name(), " but ", extents[pos[i]], " in the target ",
                                    Out::type_name()));
  const detail::op_call call(detail::planned_step{"broadcast_to", broadcast_to_plan<Out, X>()}, x);
  Out out = detail::broadcast_local<Out>(x, extents);
  detail::record<Out>(out, [x = detail::node_only(x)](const Out& g) { detail::push_summed_grad(x, g); }, x);
  return out;
}

// Plan of a reduction of X onto Out: one allreduce over the axes of the removed dims that are split.
template <Tensor Out, Tensor X>
constexpr comm_plan reduce_plan() {
  return comm_plan{}.then(collective::allreduce,
                          detail::axes_mask_of<X, difference_t<typename X::dims, typename Out::dims>>());
}

// Sum of x onto Out, whose dims are a subset of x's (in any order). Gradient: broadcast back.
template <Tensor Out, Tensor X>
Out sum_to(const X& x) {
  detail::require_same_layout<Out, X>();
  [&]<class... Ds>(type_list<Ds...>) { detail::check_reduced_dims<X, Ds...>(); }(typename Out::dims{});
  const detail::op_call call(detail::planned_step{"sum_to", reduce_plan<Out, X>()}, x);
  Out out = detail::reduce_to<Out>(x, reduce_op::sum);
  detail::record<Out>(out, [x = detail::node_only(x)](const Out& g) { detail::push_fresh_grad(x, detail::broadcast_local<X>(g, x.extents())); }, x);
  return out;
}

// Sum over the named dims.
template <Dim... Ds, Tensor X>
auto reduce_sum(const X& x) {
  detail::check_reduced_dims<X, Ds...>();
  const detail::op_call call(detail::planned_step{"reduce_sum", reduce_plan<detail::reduced_t<X, Ds...>, X>()}, x);
  return sum_to<detail::reduced_t<X, Ds...>>(x);
}

// The same tensor with its dims in another order (a local copy; no communication).
template <Dim... Ds, Tensor X>
auto transpose(const X& x) {
  using Out = detail::with_dims_t<X, type_list<Ds...>>;
  static_assert(sizeof...(Ds) == X::rank && difference_t<typename X::dims, type_list<Ds...>>::size == 0,
                "meshtensor: transpose<Dims...> must name every dim of the tensor once");
  const detail::op_call call(detail::planned_step{"transpose", broadcast_to_plan<Out, X>()}, x);
  return broadcast_to<Out>(x, detail::result_extents<Out>(x));
}

}  // namespace meshtensor
