#pragma once
// layer_norm<Ds...>(x, scale, bias, eps): normalised over the dims Ds (usually d_model),
//   y = (x - mean) / sqrt(var + eps) * scale + bias,  mean and var over Ds (biased variance).
// scale and bias hold dims among Ds (usually exactly Ds). Communication: two allreduces (mean and
// variance) over the axes that split Ds, none when Ds are not split; the gradient the transposes
// of those, and the scale and bias gradients one allreduce each over the axes that split x's other
// dims (as any broadcast operand's). Gradient: through every input.
// One unsplit dim D with scale and bias over exactly D (the Transformer's case) runs as fused row
// kernels (kernels/rows.hpp): one pass forward, two backward, in place of some fifteen
// elementwise ops and reductions with a fresh result each. Other cases are composed of the
// recording ops.
#include "../kernels/pool.hpp"
#include "../kernels/rows.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/reductions.hpp"

namespace meshtensor::nn {

template <Dim... Ds, Tensor X>
X normalize(const X& x, typename X::value_type eps = 1e-6) {
  static_assert(sizeof...(Ds) > 0, "meshtensor::nn::layer_norm<Dims...> needs the dims to normalise over");
  const auto mean = reduce_mean<Ds...>(x);
  const X centered = x - mean;
  const auto var = reduce_mean<Ds...>(square(centered));
  return centered * rsqrt(var + eps);
}

}  // namespace meshtensor::nn

namespace meshtensor::detail {
// The scale's and bias's gradients: sums over every row of x of g * x_hat and of g. On the host,
// a thread per 16 columns walks every row (cache-friendly there); on a GPU (or where
// MESHTENSOR_ROW_WALK=team asks for the GPU's walk, so that the CPU suite covers it) partial sums
// over chunks of rows, then their totals (kernels/rows.hpp).
template <class Exec, class T, class Mem>
void layer_norm_column_sums(const Kokkos::View<T*, Mem>& x, const Kokkos::View<T*, Mem>& g,
                            const Kokkos::View<T*, Mem>& mean, const Kokkos::View<T*, Mem>& rstd,
                            const Kokkos::View<T*, Mem>& ds, const Kokkos::View<T*, Mem>& db, const row_shape& gs) {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  const row_walk walk = row_walk_from_environment();
  if (walk == row_walk::serial || (walk == row_walk::automatic && host)) {
    using cols = layer_norm_grad_columns<T, Mem>;
    for_each_item<Exec>(cols::blocks(gs), cols{x, g, mean, rstd, ds, db, gs});
    return;
  }
  using chunks = layer_norm_grad_column_chunks<T, Mem>;
  using C = typename chunks::C;
  const std::int64_t count = chunks::chunks(gs);
  const temporary_view<C, Mem> part_ds(static_cast<std::size_t>(count * gs.n)),
      part_db(static_cast<std::size_t>(count * gs.n));  // counted in a plan, as the run allocates them
  kernels::parallel_for("meshtensor::layer_norm_column_chunks", kernels::range<Exec>(0, count * gs.n),
                        chunks{x, g, mean, rstd, part_ds.v, part_db.v, gs});
  kernels::parallel_for("meshtensor::layer_norm_column_totals", kernels::range<Exec>(0, gs.n),
                        layer_norm_grad_column_totals<T, Mem>{part_ds.v, part_db.v, ds, db, gs.n, count});
}

template <Dim D, Tensor X, Tensor S>
X layer_norm_fused(const X& x, const S& scale, const S& bias, typename X::value_type eps) {
  namespace md = meshtensor::detail;
  using T = typename X::value_type;
  using Mem = typename X::memory_space;
  using Exec = typename X::execution_space;
  using R = md::reduced_t<X, D>;
  md::check_shared_extents("layer_norm", x, scale);
  md::check_shared_extents("layer_norm", x, bias);
  const md::row_shape sh = md::rows_along<D>(x);
  X y(x.mesh(), x.extents(), uninitialized);
  R mean(x.mesh(), md::result_extents<R>(x), uninitialized), rstd(x.mesh(), md::result_extents<R>(x), uninitialized);
  md::for_each_row<Exec>(sh.rows(), md::layer_norm_rows<T, Mem>{x.view(), scale.view(), bias.view(), y.view(),
                                                                 mean.view(), rstd.view(), sh, eps});
  md::record<X>(
      y,
      [x, scale, bias, mean, rstd](const X& g) {
        const md::row_shape gs = md::rows_along<D>(x);
        if (x.tracks_grad()) {
          X dx(x.mesh(), x.extents(), uninitialized);
          md::for_each_row<Exec>(gs.rows(), md::layer_norm_grad_rows<T, Mem>{x.view(), g.view(), scale.view(),
                                                                            mean.view(), rstd.view(), dx.view(), gs});
          md::push_fresh_grad(x, std::move(dx));
        }
        const auto push_scale_and_bias = [x = md::without_node(x), g = md::without_node(g), scale, bias, mean, rstd] {
          const md::row_shape gs = md::rows_along<D>(x);
          S ds(x.mesh(), scale.extents(), uninitialized), db(x.mesh(), bias.extents(), uninitialized);
          md::layer_norm_column_sums<Exec>(x.view(), g.view(), mean.view(), rstd.view(), ds.view(), db.view(), gs);
          // Partial sums over the axes of x's other dims, for the tape to reduce (with the other
          // weights' gradients, in a data-parallel step: autodiff/gradient.hpp).
          constexpr unsigned axes = md::axes_mask_of<X, difference_t<typename X::dims, type_list<D>>>();
          md::push_partial_grad(bias, std::move(db), axes);
          md::push_partial_grad(scale, std::move(ds), axes);
        };
        // Both are weights (or neither): an input-gradient pass defers them together.
        if (scale.tracks_grad()) md::push_weight_grad(scale, push_scale_and_bias);
        else if (bias.tracks_grad()) md::push_weight_grad(bias, push_scale_and_bias);
      },
      x, scale, bias);
  return y;
}
}  // namespace meshtensor::detail

namespace meshtensor::nn {

template <Dim... Ds, Tensor X, Tensor S, Tensor B>
X layer_norm(const X& x, const S& scale, const B& bias, typename X::value_type eps = 1e-6) {
  const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"layer_norm"});
  // Fused where D is one unsplit dim and scale and bias are [D], replicated: under X's layout or
  // another that splits D alike (the residual stream of sequence parallelism, docs/training.md).
  if constexpr (sizeof...(Ds) == 1 && std::is_same_v<S, B> &&
                std::is_same_v<typename S::dims, type_list<Ds...>> && S::splits[0].count == 0 &&
                std::is_same_v<typename S::value_type, typename X::value_type> &&
                std::is_same_v<typename S::execution_space, typename X::execution_space> &&
                std::is_same_v<typename S::mesh_type, typename X::mesh_type> &&
                meshtensor::detail::axes_mask_of<X, type_list<Ds...>>() == 0)
    return meshtensor::detail::layer_norm_fused<Ds...>(x, scale, bias, eps);
  else
    return normalize<Ds...>(x, eps) * scale + bias;
}

}  // namespace meshtensor::nn
