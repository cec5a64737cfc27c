#pragma once
// SGD with momentum (PyTorch's convention):
//   g' = g + weight_decay * p
//   v  = momentum * v + g'                       (v = g' on the first step)
//   p -= lr * (nesterov ? g' + momentum * v : v)
// State: the velocity v, laid out like p. Communication: none (elementwise on local slices).
// Interface: see optimizer.hpp.
#include <Kokkos_Core.hpp>

#include "optimizer.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor::optim {

class sgd : public optimizer<sgd> {
 public:
  struct config {
    double lr = 1e-2;
    double momentum = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
  };
  template <Tensor P>
  struct state {
    P velocity;
  };

  sgd() = default;
  explicit sgd(config c) : c_(c) {}
  const config& settings() const { return c_; }
  void set_lr(double lr) { c_.lr = lr; }

  template <Tensor P>
  state<P> init(const P& p) const {
    return {P(p.mesh(), p.extents())};
  }
  // The state's tensors by name (checkpoints).
  template <Tensor P, class F>
  static void visit_state(state<P>& s, F&& f) {
    f("velocity", s.velocity);
  }

  template <Tensor P>
  void update(P& p, const P& g, state<P>& s, std::int64_t t) const {
    using T = typename P::value_type;
    const T lr = static_cast<T>(c_.lr), mu = static_cast<T>(c_.momentum), wd = static_cast<T>(c_.weight_decay);
    const bool nesterov = c_.nesterov, first = t <= 1;
    auto pv = p.view();
    auto gv = g.view();
    auto vv = s.velocity.view();
    kernels::parallel_for(
        "meshtensor::optim::sgd", kernels::range<typename P::execution_space>(0, p.local_size()),
        KOKKOS_LAMBDA(std::int64_t i) {
          const T gi = gv(i) + wd * pv(i);
          const T v = first ? gi : mu * vv(i) + gi;
          vv(i) = v;
          pv(i) -= lr * (nesterov ? gi + mu * v : v);
        });
  }

 private:
  config c_{};
};

}  // namespace meshtensor::optim
