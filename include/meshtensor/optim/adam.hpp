#pragma once
// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019), with bias correction:
//   adam:  g' = g + weight_decay * p              (L2 penalty folded into the gradient)
//   m = beta1 m + (1 - beta1) g';   v = beta2 v + (1 - beta2) g'^2
//   m^ = m / (1 - beta1^t);         v^ = v / (1 - beta2^t)
//   p -= lr * m^ / (sqrt(v^) + eps)
//   adamw: g' = g, and p -= lr * weight_decay * p as well (decoupled decay, on the old p).
// State: m and v, laid out like p. Communication: none (elementwise on local slices). step()
// updates every parameter of a step in one kernel (update_runs), where they share an element type
// and a device.
// Interface: see optimizer.hpp.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "optimizer.hpp"
#include "../element/kokkos_math.hpp"
#include "../kernels/launch.hpp"
#include "../kernels/pool.hpp"
#include "../kernels/walk.hpp"

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

  // One run of elements of a parameter, its gradient and its moments: step() updates every local
  // slice of a step in one kernel over such runs (optimizer.hpp), as apex's and PyTorch's fused
  // Adam do, where a kernel per tensor paid a launch (and on a GPU, a wait) per tensor.
  template <class T>
  struct run {
    T* p;
    const T* g;
    T* m;
    T* v;
    std::int64_t n;
  };
  static constexpr bool updates_in_runs = true;
  template <Tensor P>
  static void add_runs(std::vector<run<typename P::value_type>>& runs, P& p, const P& g, state<P>& s) {
    if (meshtensor::detail::planning()) return;  // a plan counts the kernel (update_runs), not its runs
    constexpr std::int64_t run_length = 4096;  // a work item's elements: long enough that the table stays small, short enough to share out
    const std::int64_t n = p.local_size();
    for (std::int64_t at = 0; at < n; at += run_length)
      runs.push_back({p.view().data() + at, g.view().data() + at, s.m.view().data() + at, s.v.view().data() + at,
                      std::min(run_length, n - at)});
  }

  template <Tensor P>
  void update(P& p, const P& g, state<P>& s, std::int64_t t) const {
    using T = typename P::value_type;
    const auto k = constants<T>(t);
    auto pv = p.view();
    auto gv = g.view();
    auto mv = s.m.view();
    auto vv = s.v.view();
    kernels::parallel_for(
        "meshtensor::optim::adam", kernels::range<typename P::execution_space>(0, p.local_size()),
        KOKKOS_LAMBDA(std::int64_t i) {
          if (k.decoupled)
            element<true>(k, pv(i), gv(i), mv(i), vv(i));
          else
            element<false>(k, pv(i), gv(i), mv(i), vv(i));
        });
  }

  // Every run of a step in one kernel: the same arithmetic per element as update().
  template <class Exec, class T>
  void update_runs(const std::vector<run<T>>& runs, std::int64_t t) const {
    if (kernels::planned_away() || runs.empty()) return;
    const auto k = constants<T>(t);
    auto host = detail::host_table<run<T>>(runs.size());
    std::copy(runs.begin(), runs.end(), host.data());
    const auto table = kernels::copy_to(Exec{}, host);
    if (detail::gpu_shaped_walk<typename Exec::memory_space>()) {  // a team per run (kernels/walk.hpp)
      detail::team_per_item<Exec>(
          "meshtensor::optim::adam", static_cast<std::int64_t>(runs.size()),
          KOKKOS_LAMBDA(std::int64_t r) { return table(r).n; },
          KOKKOS_LAMBDA(std::int64_t r, std::int64_t j) {
            const run<T> w = table(r);
            if (k.decoupled)
              element<true>(k, w.p[j], w.g[j], w.m[j], w.v[j]);
            else
              element<false>(k, w.p[j], w.g[j], w.m[j], w.v[j]);
          });
      return;
    }
    kernels::parallel_for(
        "meshtensor::optim::adam", kernels::range<Exec>(0, static_cast<std::int64_t>(runs.size())),
        KOKKOS_LAMBDA(std::int64_t r) {
          const run<T> w = table(r);
          if (k.decoupled)
            for (std::int64_t j = 0; j < w.n; ++j) element<true>(k, w.p[j], w.g[j], w.m[j], w.v[j]);
          else
            for (std::int64_t j = 0; j < w.n; ++j) element<false>(k, w.p[j], w.g[j], w.m[j], w.v[j]);
        });
  }

  // Public: nvcc's extended lambdas may not name a private member type.
  template <class T>
  struct step_constants {
    T lr, b1, b2, eps, wd, inv_c1, inv_c2;
    bool decoupled;
  };
  // The bias corrections as factors: one division per element instead of three (sqrt's errno
  // keeps g++ from vectorising the loop, and a division costs as much as the rest).
  template <class T>
  step_constants<T> constants(std::int64_t t) const {
    return {static_cast<T>(c_.lr), static_cast<T>(c_.beta1), static_cast<T>(c_.beta2), static_cast<T>(c_.eps),
            static_cast<T>(c_.weight_decay), static_cast<T>(1.0 / (1.0 - std::pow(c_.beta1, static_cast<double>(t)))),
            static_cast<T>(1.0 / (1.0 - std::pow(c_.beta2, static_cast<double>(t)))), c_.decoupled};
  }
  // Decoupled (AdamW) or not as a template argument: no test of it per element in the runs' loops.
  template <bool Decoupled, class T>
  KOKKOS_INLINE_FUNCTION static void element(const step_constants<T>& k, T& p, const T& g, T& m, T& v) {
    const T pi = p;
    T gi = g;
    if constexpr (!Decoupled) gi = g + k.wd * pi;
    const T mi = k.b1 * m + (T(1) - k.b1) * gi;
    const T vi = k.b2 * v + (T(1) - k.b2) * gi * gi;
    m = mi;
    v = vi;
    T step = (mi * k.inv_c1) / (kmath::sqrt(vi * k.inv_c2) + k.eps);
    if constexpr (Decoupled) step += k.wd * pi;
    p = pi - k.lr * step;
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
