#pragma once
// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019), with bias correction:
//   adam:  g' = g + weight_decay * p              (L2 penalty folded into the gradient)
//   m = beta1 m + (1 - beta1) g';   v = beta2 v + (1 - beta2) g'^2
//   m^ = m / (1 - beta1^t);         v^ = v / (1 - beta2^t)
//   p -= lr * m^ / (sqrt(v^) + eps)
//   adamw: g' = g, and p -= lr * weight_decay * p as well (decoupled decay, on the old p).
// State: m and v, laid out like p. Communication: none (elementwise on local slices).
// Interface: see optimizer.hpp.
#include <Kokkos_Core.hpp>
#include <cmath>

#include "optimizer.hpp"
#include "../element/kokkos_math.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor::optim {

class adam : public optimizer<adam> {
 public:
  struct config {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    bool decoupled = false;  // true: AdamW
  };
  template <Tensor P>
  struct state {
    P m, v;
  };

  adam() = default;
  explicit adam(config c) : c_(c) {}
  const config& settings() const { return c_; }
  void set_lr(double lr) { c_.lr = lr; }

  template <Tensor P>
  state<P> init(const P& p) const {
    return {P(p.mesh(), p.extents()), P(p.mesh(), p.extents())};
  }
  // The state's tensors by name (checkpoints).
  template <Tensor P, class F>
  static void visit_state(state<P>& s, F&& f) {
    f("m", s.m);
    f("v", s.v);
  }

  template <Tensor P>
  void update(P& p, const P& g, state<P>& s, std::int64_t t) const {
    using T = typename P::value_type;
    const T lr = static_cast<T>(c_.lr), b1 = static_cast<T>(c_.beta1), b2 = static_cast<T>(c_.beta2),
            eps = static_cast<T>(c_.eps), wd = static_cast<T>(c_.weight_decay);
    // The bias corrections as factors: one division per element instead of three (the loop is
    // scalar, sqrt's errno keeps g++ from vectorising it, and a division costs as much as the rest).
    const T inv_c1 = static_cast<T>(1.0 / (1.0 - std::pow(c_.beta1, static_cast<double>(t))));
    const T inv_c2 = static_cast<T>(1.0 / (1.0 - std::pow(c_.beta2, static_cast<double>(t))));
    const bool decoupled = c_.decoupled;
    auto pv = p.view();
    auto gv = g.view();
    auto mv = s.m.view();
    auto vv = s.v.view();
    kernels::parallel_for(
        "meshtensor::optim::adam", Kokkos::RangePolicy<typename P::execution_space>(0, p.local_size()),
        KOKKOS_LAMBDA(std::int64_t i) {
          const T pi = pv(i);
          const T gi = decoupled ? gv(i) : gv(i) + wd * pi;
          const T m = b1 * mv(i) + (T(1) - b1) * gi;
          const T v = b2 * vv(i) + (T(1) - b2) * gi * gi;
          mv(i) = m;
          vv(i) = v;
          T step = (m * inv_c1) / (kmath::sqrt(v * inv_c2) + eps);
          if (decoupled) step += wd * pi;
          pv(i) = pi - lr * step;
        });
  }

 private:
  config c_{};
};

// AdamW: Adam with decoupled weight decay (default 0.01, as in PyTorch).
class adamw : public adam {
 public:
  struct config {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
  };
  adamw() : adamw(config{}) {}
  explicit adamw(config c) : adam(adam::config{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, true}) {}
};

}  // namespace meshtensor::optim
