#pragma once
// Adafactor (Shazeer & Stern 2018), as in Mesh-TensorFlow's AdafactorOptimizer. For a param of
// rank >= 2 the second moment is factored over its last two dims R and C (for a matrix: rows and
// columns): the state holds vr (p's dims without C) and vc (p's dims without R) instead of v.
//   beta2_t = 1 - t^(-decay_rate)
//   g2 = g^2 + eps1
//   factored:   vr = beta2_t vr + (1 - beta2_t) mean_C(g2);  vc = beta2_t vc + (1 - beta2_t) mean_R(g2)
//               u = g / sqrt(vr vc / mean_R(vr))
//   otherwise:  v  = beta2_t v + (1 - beta2_t) g2;            u = g / sqrt(v)
//   u /= max(1, rms(u) / clip_threshold)                        (update clipping)
//   rho = lr > 0 ? lr : min(1e-2, 1 / sqrt(t))                  (relative step size)
//   alpha = multiply_by_parameter_scale ? max(eps2, rms(p)) * rho : rho
//   beta1 > 0: m = beta1 m + (1 - beta1) u, u = m               (optional momentum)
//   p -= alpha * (u + weight_decay * p)
// rms(x) is over the whole global tensor. Communication per param: the means over R and C
// allreduce over the axes that split R (resp. C), mean_R(vr) over R's axes; rms(u) and rms(p)
// allreduce one scalar each over the axes that split any dim of p (none when p is replicated).
// Interface: see optimizer.hpp.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "../ops/elementwise.hpp"
#include "../ops/sum_broadcast.hpp"
#include "optimizer.hpp"
#include "../element/kokkos_math.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor::optim {

namespace detail_adafactor {
template <std::size_t I, class List>
struct nth;
template <std::size_t I, class... Ds>
struct nth<I, type_list<Ds...>> {
  using type = std::tuple_element_t<I, std::tuple<Ds...>>;
};
template <Tensor P, bool = (P::rank >= 2)>
struct factors {
  static constexpr bool factored = false;
  using row_t = P;
  using col_t = P;
  using outer_t = P;
};
template <Tensor P>
struct factors<P, true> {
  static constexpr bool factored = true;
  using R = typename nth<P::rank - 2, typename P::dims>::type;
  using C = typename nth<P::rank - 1, typename P::dims>::type;
  using row_t = detail::with_dims_t<P, difference_t<typename P::dims, type_list<C>>>;       // vr
  using col_t = detail::with_dims_t<P, difference_t<typename P::dims, type_list<R>>>;       // vc
  using outer_t = detail::with_dims_t<P, difference_t<typename P::dims, type_list<R, C>>>;  // mean_R(vr)
};

// Global mean of x onto Out (sum, allreduce over the removed dims' axes, divide).
template <Tensor Out, Tensor X>
Out mean_onto(const X& x) {
  using T = typename X::value_type;
  Out s = detail::reduce_to<Out>(x, reduce_op::sum);
  const T n = static_cast<T>(x.size() / std::max<std::int64_t>(1, s.size()));
  auto sv = s.view();
  kernels::parallel_for(
      "meshtensor::optim::mean", kernels::range<typename X::execution_space>(0, s.local_size()),
      KOKKOS_LAMBDA(std::int64_t i) { sv(i) /= n; });
  return s;
}

// Root mean square of the whole global tensor, on every processor.
template <Tensor X>
double rms(const X& x) {
  using T = typename X::value_type;
  using S = detail::with_dims_t<X, type_list<>>;
  const X sq = detail::map_broadcast<X>(x.extents(), KOKKOS_LAMBDA(T v) { return v * v; }, x);
  const S s = detail::reduce_to<S>(sq, reduce_op::sum);
  const double total = static_cast<double>(detail::host_copy<typename X::execution_space>(s.view())(0));
  return x.size() > 0 ? std::sqrt(total / static_cast<double>(x.size())) : 0.0;
}
}  // namespace detail_adafactor

class adafactor : public optimizer<adafactor> {
 public:
  struct config {
    double lr = 0.0;  // <= 0: relative step min(1e-2, 1/sqrt(t))
    double beta1 = 0.0;
    double decay_rate = 0.8;
    double eps1 = 1e-30;
    double eps2 = 1e-3;
    double clip_threshold = 1.0;
    bool multiply_by_parameter_scale = true;
    bool factored = true;
    double weight_decay = 0.0;
  };
  template <Tensor P>
  struct state {
    using F = detail_adafactor::factors<P>;
    std::optional<typename F::row_t> vr;  // factored
    std::optional<typename F::col_t> vc;
    std::optional<P> v;  // not factored
    std::optional<P> m;  // beta1 > 0
  };

  adafactor() = default;
  explicit adafactor(config c) : c_(c) {}
  const config& settings() const { return c_; }
  void set_lr(double lr) { c_.lr = lr; }

  template <Tensor P>
  bool factored_for() const {
    return c_.factored && detail_adafactor::factors<P>::factored;
  }

  template <Tensor P>
  state<P> init(const P& p) const {
    using F = detail_adafactor::factors<P>;
    state<P> s;
    if constexpr (F::factored) {
      if (factored_for<P>()) {
        s.vr.emplace(p.mesh(), detail::result_extents<typename F::row_t>(p));
        s.vc.emplace(p.mesh(), detail::result_extents<typename F::col_t>(p));
      }
    }
    if (!s.vr) s.v.emplace(p.mesh(), p.extents());
    if (c_.beta1 > 0) s.m.emplace(p.mesh(), p.extents());
    return s;
  }
  // The state's tensors by name (checkpoints): vr and vc where factored, else v; m with momentum.
  template <Tensor P, class F>
  static void visit_state(state<P>& s, F&& f) {
    if (s.vr) f("vr", *s.vr);
    if (s.vc) f("vc", *s.vc);
    if (s.v) f("v", *s.v);
    if (s.m) f("m", *s.m);
  }

  template <Tensor P>
  void update(P& p, const P& g, state<P>& s, std::int64_t t) const {
    using T = typename P::value_type;
    using F = detail_adafactor::factors<P>;
    using E = typename P::execution_space;
    const T b2 = static_cast<T>(1.0 - std::pow(static_cast<double>(t), -c_.decay_rate));
    const T eps1 = static_cast<T>(c_.eps1);
    const P g2 = detail::map_broadcast<P>(g.extents(), KOKKOS_LAMBDA(T x) { return x * x + eps1; }, g);
    P u;
    if constexpr (F::factored) {
      if (s.vr) {
        using Row = typename F::row_t;
        using Col = typename F::col_t;
        using Outer = typename F::outer_t;
        const Row rm = detail_adafactor::mean_onto<Row>(g2);
        const Col cm = detail_adafactor::mean_onto<Col>(g2);
        ema(*s.vr, rm, b2);
        ema(*s.vc, cm, b2);
        const Outer lt = detail_adafactor::mean_onto<Outer>(*s.vr);
        u = detail::map_broadcast<P>(
            g.extents(),
            KOKKOS_LAMBDA(T gv, T r, T c) { return gv / kmath::sqrt(r * c); }, g, *s.vr, *s.vc);
        // Divide by sqrt(1 / mean_R(vr)), i.e. multiply by sqrt(mean_R(vr)).
        u = detail::map_broadcast<P>(
            g.extents(), KOKKOS_LAMBDA(T x, T l) { return x * kmath::sqrt(l); }, u, lt);
      }
    }
    if (s.v) {
      ema(*s.v, g2, b2);
      u = detail::map_broadcast<P>(
          g.extents(), KOKKOS_LAMBDA(T gv, T v) { return gv / kmath::sqrt(v); }, g, *s.v);
    }
    const double clip = std::max(1.0, detail_adafactor::rms(u) / c_.clip_threshold);
    const double rho = c_.lr > 0 ? c_.lr : std::min(1e-2, 1.0 / std::sqrt(static_cast<double>(t)));
    const double alpha = c_.multiply_by_parameter_scale ? std::max(c_.eps2, detail_adafactor::rms(p)) * rho : rho;
    const T scale = static_cast<T>(1.0 / clip), a = static_cast<T>(alpha), b1 = static_cast<T>(c_.beta1),
            wd = static_cast<T>(c_.weight_decay);
    const bool momentum = s.m.has_value();
    auto pv = p.view();
    auto uv = u.view();
    auto mv = momentum ? s.m->view() : typename P::view_type{};
    kernels::parallel_for(
        "meshtensor::optim::adafactor", kernels::range<E>(0, p.local_size()), KOKKOS_LAMBDA(std::int64_t i) {
          T ui = uv(i) * scale;
          if (momentum) {
            ui = b1 * mv(i) + (T(1) - b1) * ui;
            mv(i) = ui;
          }
          pv(i) -= a * (ui + wd * pv(i));
        });
  }

  // acc = b acc + (1 - b) x. Public: nvcc allows no device lambda in a private member function.
  template <Tensor S>
  static void ema(S& acc, const S& x, typename S::value_type b) {
    using T = typename S::value_type;
    auto av = acc.view();
    auto xv = x.view();
    kernels::parallel_for(
        "meshtensor::optim::ema", kernels::range<typename S::execution_space>(0, acc.local_size()),
        KOKKOS_LAMBDA(std::int64_t i) { av(i) = b * av(i) + (T(1) - b) * xv(i); });
  }

 private:
  config c_{};
};

}  // namespace meshtensor::optim
