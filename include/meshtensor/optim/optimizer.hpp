#pragma once
// The interface every optimizer shares (sgd, adam/adamw, adafactor).
//
//   mt::optim::adam opt({.lr = 1e-3});
//   auto grads = mt::gradient(loss, w1, b1);      // std::tuple<W1, B1>, laid out like the params
//   opt.step(std::tie(w1, b1), grads);            // updates w1 and b1 in place
//
// step() keeps one state per position in the params tuple (created on the first step, laid out
// like its param) and counts steps from 1. The per-param form is public too:
//
//   auto s = opt.init(w1);                         // e.g. adam::state<W1>{m, v}
//   opt.update(w1, g1, s, /*t=*/1);
//
// Params are updated in place (their local views are overwritten), so a param keeps its place on
// the tape (requires_grad) across steps. The state tensors have the param's type, hence its
// layout: elementwise updates need no communication under any layout. What each optimizer
// communicates is said in its header (only adafactor does: its factored moments and RMS clipping).
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../ops/op_call.hpp"
#include "../tensor/tensor.hpp"

namespace meshtensor::optim {

namespace checks {
template <class P>
struct param_value {
  using type = typename P::value_type;
};
template <class T>
struct param_value<std::vector<T>> {
  using type = typename T::value_type;
};
// Master weights: an update of 1e-4 to a bf16 weight of 1 rounds to nothing (its ulp is 2^-7), so
// a bf16 model keeps float parameters and casts them where they are used.
template <class P>
constexpr bool master_weights_ok() {
  static_assert(!std::is_same_v<typename param_value<P>::type, bf16>,
                "meshtensor: optimizers update float (or double) master weights, not bf16 parameters: keep "
                "the parameter in float and use cast<bf16>(parameter) in the model (docs/training.md, "
                "\"Mixed precision\")");
  return true;
}
}  // namespace checks

template <class Derived>
class optimizer {
 public:
  // params: a tuple of references (std::tie(w, b)); grads: the tuple gradient() returns. A param
  // may be a std::vector of tensors (gradient() returns a vector for it); its tensors each get a
  // state, numbered after those before them (the numbering for_each_state uses).
  template <Parameter... Ps>
  void step(std::tuple<Ps&...> params, const std::tuple<Ps...>& grads) {
    static_assert((checks::master_weights_ok<Ps>() && ...));
    const meshtensor::detail::op_call call(meshtensor::detail::composite_op{"optimizer step"});
    if (states_.empty()) make_states(params);
    check_count(params, "step");
    ++t_;
    std::size_t i = 0;
    if constexpr (in_runs<Ps...>()) {
      // Every tensor's elements in one kernel (Derived::update_runs), the plan's bytes and the
      // states' types checked per tensor as apply_one does.
      using P0 = tensor_of_t<std::tuple_element_t<0, std::tuple<Ps...>>>;
      std::vector<typename Derived::template run<typename P0::value_type>> runs;
      const auto collect = [&]<class P>(P& p, const P& g, std::size_t k) {
        Derived::add_runs(runs, p, g, checked_state(p, k, "step"));
        plan_bytes(p);
      };
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (apply_all(std::get<I>(params), std::get<I>(grads), i, collect), ...);
      }(std::index_sequence_for<Ps...>{});
      derived().template update_runs<typename P0::execution_space>(runs, t_);
    } else {
      const auto one = [&]<class P>(P& p, const P& g, std::size_t k) { apply_one(p, g, k); };
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (apply_all(std::get<I>(params), std::get<I>(grads), i, one), ...);
      }(std::index_sequence_for<Ps...>{});
    }
  }
  // Steps taken so far.
  std::int64_t steps() const { return t_; }
  // Sets the step count (a resumed run continues from a checkpoint's count).
  void set_steps(std::int64_t t) {
    if (t < 0) throw error(detail::cat("optimizer::set_steps: step count ", t, " is negative"));
    t_ = t;
  }

  // Calls f(tensor_index, state_name, state_tensor) for every state tensor of these params (for
  // checkpoints: saved after a step, loaded into before the next), making the states first where
  // no step has run yet. The params must be those step() is given, in the same order; the tensors
  // of a vector param are numbered one after another.
  template <Parameter... Ps, class F>
  void for_each_state(std::tuple<Ps&...> params, F&& f) {
    if (states_.empty()) make_states(params);
    check_count(params, "for_each_state");
    std::size_t i = 0;
    std::apply([&](auto&... p) { (for_each_tensor(p, [&](auto& t) { visit_one(t, i++, f); }), ...); }, params);
  }

  // The bytes of this processor's slices of the optimizer's state for these params (made first
  // where no step has run yet, as for_each_state).
  template <Parameter... Ps>
  std::int64_t state_bytes(std::tuple<Ps&...> params) {
    std::int64_t n = 0;
    for_each_state(params, [&](std::size_t, const char*, const auto& t) { n += local_bytes(t); });
    return n;
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
  template <Parameter... Ps>
  void check_count(const std::tuple<Ps&...>& params, const char* what) const {
    std::size_t n = 0;
    std::apply([&](const auto&... p) { ((n += detail::tensor_count(p)), ...); }, params);
    if (states_.size() != n)
      throw error(detail::cat("optimizer::", what, ": called with ", n, " param tensors, but its state was made for ",
                              states_.size(), "; use one optimizer per set of params"));
  }
  template <Parameter... Ps>
  void make_states(std::tuple<Ps&...> params) {
    const plan_kind_scope as_state(memory_kind::optimizer_state);
    std::apply([&](auto&... p) { (for_each_tensor(p, [&](auto& t) { make_state(t); }), ...); }, params);
  }
  template <class P>
  void make_state(P& p) {
    using S = decltype(derived().init(p));
    states_.push_back({&typeid(P), std::make_shared<S>(derived().init(p))});
  }
  template <class P, class F>
  void visit_one(P& p, std::size_t i, F& f) {
    if (*states_[i].first != typeid(P))
      throw error(detail::cat("optimizer::for_each_state: param ", i, " is a ", P::type_name(),
                              ", but the optimizer's state there was made for another type"));
    using S = decltype(derived().init(p));
    Derived::visit_state(*static_cast<S*>(states_[i].second.get()),
                         [&](const char* name, auto& tensor) { f(i, name, tensor); });
  }
  // The tensor type of a param (a tensor, or a vector's element).
  template <class P>
  struct tensor_of {
    using type = P;
  };
  template <class T>
  struct tensor_of<std::vector<T>> {
    using type = T;
  };
  template <class P>
  using tensor_of_t = typename tensor_of<P>::type;
  // Whether one kernel updates every param: the optimizer updates runs of elements, and the params
  // share an element type and an execution space (else a kernel per tensor).
  template <class... Ps>
  static constexpr bool in_runs() {
    if constexpr (requires { Derived::updates_in_runs; }) {
      using P0 = tensor_of_t<std::tuple_element_t<0, std::tuple<Ps...>>>;
      return ((std::is_same_v<typename tensor_of_t<Ps>::value_type, typename P0::value_type> &&
               std::is_same_v<typename tensor_of_t<Ps>::execution_space, typename P0::execution_space>) &&
              ...);
    } else {
      return false;
    }
  }
  // f(p, g, index) for every tensor of param p (a vector's one after another).
  template <class P, class F>
  void apply_all(P& p, const P& g, std::size_t& i, F&& f) {
    if constexpr (Tensor<P>) {
      f(p, g, i++);
    } else {
      if (g.size() != p.size())
        throw error(detail::cat("optimizer::step: a vector of ", p.size(), " params was given ", g.size(), " gradients"));
      for (std::size_t k = 0; k < p.size(); ++k) f(p[k], g[k], i++);
    }
  }
  template <class P>
  auto& checked_state(P& p, std::size_t i, const char* what) {
    if (*states_[i].first != typeid(P))
      throw error(detail::cat("optimizer::", what, ": param ", i, " is a ", P::type_name(),
                              ", but the optimizer's state there was made for another type"));
    using S = decltype(derived().init(p));
    return *static_cast<S*>(states_[i].second.get());
  }
  template <class P>
  static void plan_bytes(const P& p) {
    if (meshtensor::detail::planning())
      meshtensor::detail::plan_ledger::get().add_optimizer_bytes(
          elements_to_update(p) * static_cast<std::int64_t>(sizeof(typename P::value_type)));
  }
  template <class P>
  void apply_one(P& p, const P& g, std::size_t i) {
    auto& s = checked_state(p, i, "step");
    plan_bytes(p);
    derived().update(p, g, s, t_);
  }
  // The elements of p this processor updates: its slice, unless the optimizer says otherwise
  // (sharded.hpp updates a part of it).
  template <class P>
  static std::int64_t elements_to_update(const P& p) {
    if constexpr (requires { Derived::updated_size(p); }) return Derived::updated_size(p);
    else return p.local_size();
  }
  std::vector<std::pair<const std::type_info*, std::shared_ptr<void>>> states_;
  std::int64_t t_ = 0;
};

}  // namespace meshtensor::optim
