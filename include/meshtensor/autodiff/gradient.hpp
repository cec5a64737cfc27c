#pragma once
// gradient(loss, params...): reverse-mode gradients of a scalar (rank-0) loss, laid out like the
// params. Communication: whatever the ops' gradient rules need (their headers say which).
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../element/complex.hpp"
#include "../tensor/init.hpp"
#include "gradient_reduction.hpp"
#include "tape.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {
namespace detail {

// The params' gradients that are still partial sums (in a data-parallel step: over the batch's
// axes), reduced as gradient_reduction says: each param is added as soon as its gradient is final;
// a large one is reduced at once, in place, small ones once their bucket (per axes) is full;
// finish() reduces what is left, waits for nonblocking ones and copies the sums back. Gradients of
// another element type or space than T and Exec are reduced one by one.
template <class T, class Exec>
class gradient_buckets {
 public:
  gradient_buckets() = default;
  gradient_buckets(const gradient_buckets&) = delete;
  gradient_buckets& operator=(const gradient_buckets&) = delete;
  ~gradient_buckets() {
    // Only reached with requests in flight when an error left gradient() early: wait for them,
    // since MPI still writes their buffers.
    for (auto& b : started_)
      if (b.started.request != MPI_REQUEST_NULL) MPI_Wait(&b.started.request, MPI_STATUS_IGNORE);
  }

  template <class Node, class M>
  void add(Node& n, const M& mesh) {
    // A gradient on its way (arriving_gradient) is whole, and adding it settles a partial one
    // first: land it before a partial one is handed to MPI, which would then write it in flight.
    if (!n.arriving.empty() && n.has_grad && !n.pending_axes.empty()) n.land_arrivals();
    if (!n.has_grad || n.pending_axes.empty()) return;
    if constexpr (std::is_same_v<Node, grad_node<T, Node::storage_type::rank, Exec>>) {
      const std::pair<communicator*, axis_set> key{&mesh.communicator(), n.pending_axes};
      n.pending_axes = {};  // its sum arrives in finish(), before gradient() reads it
      const view_type v = n.grad.data;
      const auto bytes = [](std::int64_t elements) { return elements * static_cast<std::int64_t>(sizeof(T)); };
      const std::int64_t len = static_cast<std::int64_t>(v.extent(0));
      if (bytes(len) >= settings_.in_place_bytes) {
        bucket alone;
        alone.views.push_back(v);
        alone.n = len;
        start(alone, key);
        return;
      }
      auto& b = open_[key];
      if (!b.views.empty() && bytes(b.n + len) > settings_.bucket_bytes) start(b, key);
      b.views.push_back(v);
      b.n += len;
      if (bytes(b.n) >= settings_.bucket_bytes) start(b, key);
    } else {
      n.settle();
    }
  }

  // Lets MPI advance the allreduces in flight (no progress thread in most MPIs).
  void progress() {
    for (auto& b : started_)
      if (b.started.request != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&b.started.request, &done, MPI_STATUS_IGNORE);
      }
  }

  // Starts what is left, waits for every bucket, copies the sums into the gradients.
  void finish() {
    const collective_subject subject(&bucket_name);
    for (auto& [key, b] : open_)
      if (!b.views.empty()) start(b, key);
    for (auto& b : started_) {
      b.key.first->await_started(b.started, collective::allreduce, b.key.second,
                                 b.n * static_cast<std::int64_t>(sizeof(T)));
      if (b.views.size() == 1) {
        b.buffer->copy_into(b.views[0]);
        continue;
      }
      b.buffer->copy_into(b.packed);
      copy_parts(b, [](const auto& part, const view_type& v) { kernels::deep_copy(Exec{}, v, part); });
    }
    kernels::fence(Exec{});
    started_.clear();  // the packed buffers go back to the pool
  }

 private:
  using view_type = Kokkos::View<T*, typename Exec::memory_space>;
  using buffer_type = mpi_buffer<Exec, T>;
  struct bucket {
    std::vector<view_type> views;
    std::int64_t n = 0;
    view_type packed;
    std::optional<buffer_type> buffer;  // what MPI reduces: the gradient itself or packed
    started_collective started;  // its allreduce, when overlapped
    std::pair<communicator*, axis_set> key{nullptr, {}};  // whose allreduce: the watchdog names it
  };

  template <class F>
  static void copy_parts(const bucket& b, F&& copy) {
    std::int64_t at = 0;
    for (const auto& v : b.views) {
      const auto len = static_cast<std::int64_t>(v.extent(0));
      copy(Kokkos::subview(b.packed, std::make_pair(at, at + len)), v);
      at += len;
    }
  }

  // One gradient is reduced in place; several are copied into one buffer first.
  static std::string bucket_name() { return "a bucket of parameters' gradients"; }
  void start(bucket& b, const std::pair<communicator*, axis_set>& key) {
    const collective_subject subject(&bucket_name);
    // A group of one (a data-parallel layout on one processor): the door counts the allreduce and
    // skips it, as for a bf16 one (runtime/collectives.hpp); nothing is packed or staged, each
    // gradient is its own sum. (Staged on a GPU, the copies to the host and back cost 6.5 ms of a
    // 125 ms step on an H200.)
    if (key.first->size_over(key.second) == 1) {
      if (settings_.overlap) (void)start_allreduce(*key.first, key.second, static_cast<T*>(nullptr), b.n);
      else allreduce(*key.first, key.second, static_cast<T*>(nullptr), b.n);
      b = bucket{};
      return;
    }
    if (b.views.size() == 1) {
      b.buffer = buffer_type::reading(b.views[0]);
    } else {
      b.packed = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(b.n));
      copy_parts(b, [](const auto& part, const view_type& v) { kernels::deep_copy(Exec{}, part, v); });
      b.buffer = buffer_type::reading(b.packed);  // waits for the copies
    }
    b.key = key;
    if (settings_.overlap) {
      b.started = start_allreduce(*key.first, key.second, b.buffer->data(), b.n);
    } else {
      allreduce(*key.first, key.second, b.buffer->data(), b.n);
    }
    started_.push_back(std::move(b));
    b = bucket{};
  }

  const gradient_reduction settings_ = gradient_reduction_settings();
  std::map<std::pair<communicator*, axis_set>, bucket> open_;
  std::vector<bucket> started_;
};

}  // namespace detail

namespace detail {

// Every node the loss depends on, newest first: reverse creation order is topological. Held by
// the pass: a node released on the way (run_backward) stays valid until the pass ends.
using node_order = std::vector<std::shared_ptr<tape_node>>;
inline node_order nodes_newest_first(tape_node* loss) {
  node_order order;
  std::unordered_set<tape_node*> seen;
  std::vector<tape_node*> stack{loss};
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    order.push_back(n->shared_from_this());
    for (auto& p : n->parents) stack.push_back(p.get());
  }
  std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x->id > y->id; });
  return order;
}

// Seeds the loss's gradient with 1 and runs every node's rule in `order`, recording paused.
// final(p) is called once node p's gradient is final (every node that pushes into it has run).
// A node's gradient is dropped as soon as its rule has pushed it on, unless kept(node) (a param's,
// read after the pass): nothing else reads it, and kept to the pass's end every block's gradient
// stayed alive at once, the backward pass's memory growing with the layers. A node that
// only the pass holds (no tensor, no later node, no rule refers to it: the pass's own reference
// is its only one) is released too, its saved tensors freed: no backward pass can reach it again.
// The loss's node is held by the caller's loss unless gradient() was given it as an rvalue.
// early(node): run the node as soon as its gradient is final rather than at its place in `order`
// (a weight's cast, made in the first microbatch's forward pass and so last by creation order,
// whose weight's reduction can then start while the pass goes on).
struct in_creation_order {
  bool operator()(const tape_node*) const { return false; }
};
template <Tensor Loss, class Final, class Kept, class Early = in_creation_order>
void run_backward(const Loss& loss, grad_node_of<Loss>* seed, const node_order& order, Final&& final, Kept&& kept,
                  Early early = {}) {
  const recording_scope paused(false);
  const plan_phase_scope backward(plan_phase::backward);  // a plan's report: "op (backward)"
  if (planning()) plan_ledger::get().note_backward_start();
  seed->accumulate(full<Loss>(loss.mesh(), {}, typename Loss::value_type(1)).storage());
  std::unordered_map<const tape_node*, int> uses;  // nodes still to run that push into it
  for (const auto& n : order)
    for (auto& p : n->parents) ++uses[p.get()];
  std::unordered_set<const tape_node*> ran_early;
  const auto run = [&](const auto& self, tape_node& n) -> void {
    {
      const plan_node_scope op(n.plan_op);
      n.backward();
    }
    for (auto& p : n.parents)
      if (--uses[p.get()] == 0) {
        final(p.get());
        if (early(p.get()) && ran_early.insert(p.get()).second) self(self, *p);
      }
  };
  for (const auto& n : order) {
    if (ran_early.count(n.get())) {
      if (!kept(n.get())) n->clear_grad();
      continue;
    }
    run(run, *n);
    progress_arrivals();
    if (kept(n.get())) continue;
    n->clear_grad();
    if (n.use_count() == 1) n->release();
  }
}

template <Tensor Loss>
void check_differentiable(const Loss& loss, const char* who) {
  static_assert(Loss::rank == 0, "meshtensor: gradient() needs a scalar loss; reduce it with reduce_sum first");
  static_assert(!is_complex_v<typename Loss::value_type>,
                "meshtensor: gradient() needs a real loss: take real(), imag() or abs() of a complex one");
  if (!loss.tracks_grad()) throw error(cat(who, ": the loss does not depend on any tensor that requires gradients"));
}

// The params' gradients as tensors, in the params' kinds and order (zeros where a param got none).
// A node's gradient shares its memory with nothing else (tape.hpp: pushes copy, or take over a
// fresh result), so it is handed out as it is, not copied: one copy of every gradient less at the
// peak. A param given twice gets a copy the second time.
template <Parameter... Params>
std::tuple<Params...> hand_out_gradients(const Params&... params) {
  const plan_kind_scope as_gradients(memory_kind::gradients);
  std::unordered_set<const tape_node*> handed_out;
  const auto gradient_of = [&](const auto& t) {
    using TT = std::remove_cvref_t<decltype(t)>;
    if (t.tracks_grad()) t.node()->land_arrivals();  // a reduce_scatter started in the pass (gradient_reduction::overlap)
    if (!t.tracks_grad() || !t.node()->has_grad) return TT(t.mesh(), t.extents());
    t.node()->settle();  // reduced by the buckets already, unless of another kind than the buckets'
    TT g(from_storage, t.mesh().shared_communicator(), t.node()->grad);
    if (!handed_out.insert(t.node()).second) return clone(g);
    if (planning()) plan_ledger::get().reclassify(g.view().data(), memory_kind::gradients);
    return g;
  };
  const auto gradients_of = [&](const auto& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    if constexpr (Tensor<P>) {
      return gradient_of(p);
    } else {
      P gs;
      gs.reserve(p.size());
      for (const auto& t : p) gs.push_back(gradient_of(t));
      return gs;
    }
  };
  return std::tuple<Params...>{gradients_of(params)...};
}

// The nodes of params that gradients accumulate in, between calls: leaves only.
template <Parameter... Params>
std::unordered_set<const tape_node*> leaf_nodes(const char* who, const Params&... params) {
  std::unordered_set<const tape_node*> kept;
  const auto keep = [&](const auto& t) {
    if (!t.tracks_grad()) return;
    if (!t.node()->parents.empty())
      throw error(cat(who, ": the parameter ", std::remove_cvref_t<decltype(t)>::type_name(), t.shape_string(),
                      " is the result of an op, not a leaf (requires_grad() marks leaves): ",
                      "what it holds would be pushed on again by every later call"));
    kept.insert(t.node());
  };
  (for_each_tensor(params, keep), ...);
  return kept;
}

// Runs the backward pass of loss, adding into the gradients of the `kept` nodes what earlier calls
// left there; every other node's gradient is dropped before and after.
template <Tensor Loss>
void accumulate_into(const Loss& loss, grad_node_of<Loss>* seed, const std::unordered_set<const tape_node*>& kept,
                     const node_order& order) {
  const auto clear_others = [&] {
    for (const auto& n : order)
      if (!kept.count(n.get())) n->clear_grad();
  };
  clear_others();
  const nodes_read_after_pass_scope read_after(kept);
  run_backward(loss, seed, order, [](const tape_node*) {}, [&](const tape_node* n) { return kept.count(n) > 0; });
  clear_others();
}

// The loss's node, taken from an rvalue loss: the caller's handle on the tape goes (its value
// stays readable), so that the pass alone holds the graph and frees it as it goes.
template <Tensor Loss>
grad_node_of<Loss>* give_up_node(Loss& loss, node_order& order) {
  auto* seed = loss.node();
  order = nodes_newest_first(seed);
  loss.node_slot().reset();
  return seed;
}

template <class P>
struct first_tensor_of {
  using type = typename P::value_type;  // a std::vector of tensors
};
template <Tensor P>
struct first_tensor_of<P> {
  using type = P;
};

}  // namespace detail

// Each param is a tensor or a std::vector of tensors (layers stacked at run time); the result holds
// the same kinds in the same order.
namespace detail {
template <Tensor Loss, Parameter... Params>
std::tuple<Params...> gradient_of(const Loss& loss, grad_node_of<Loss>* seed, const node_order& order,
                                  const Params&... params) {
  const detail::recording_scope paused(false);
  const detail::plan_phase_scope backward(detail::plan_phase::backward);
  for (const auto& n : order) n->clear_grad();
  const auto clear = [](const auto& t) {
    if (t.tracks_grad()) t.node()->clear_grad();
  };
  (for_each_tensor(params, clear), ...);

  // A param's gradient is final once every node that uses it has run: then it joins a bucket
  // (above), whose allreduce overlaps the rest of the backward pass.
  detail::gradient_buckets<typename Loss::value_type, typename Loss::execution_space> buckets;
  std::unordered_map<const detail::tape_node*, std::vector<std::function<void()>>> when_final;
  const auto watch = [&](const auto& t) {
    if (t.tracks_grad() && t.node()->parents.empty())
      when_final[t.node()].push_back([&buckets, &t] {
        const detail::plan_node_scope op("weight gradients");
        buckets.add(*t.node(), t.mesh());
      });
  };
  (for_each_tensor(params, watch), ...);
  std::unordered_set<const detail::tape_node*> wanted;  // the params' nodes, leaves or not: read after
  const auto want = [&](const auto& t) {
    if (t.tracks_grad()) wanted.insert(t.node());
  };
  (for_each_tensor(params, want), ...);
  const detail::nodes_read_after_pass_scope read_after(wanted);
  detail::run_backward(
      loss, seed, order,
      [&](const detail::tape_node* p) {
        if (const auto f = when_final.find(p); f != when_final.end())
          for (auto& join : f->second) join();
        buckets.progress();
      },
      [&](const detail::tape_node* n) { return wanted.count(n) > 0; });
  {
    const detail::plan_node_scope op("weight gradients");
    buckets.finish();
  }
  auto result = detail::hand_out_gradients(params...);
  for (const auto& n : order) n->clear_grad();
  return result;
}
}  // namespace detail

template <Tensor Loss, Parameter... Params>
std::tuple<Params...> gradient(const Loss& loss, const Params&... params) {
  detail::check_differentiable(loss, "gradient");
  return detail::gradient_of(loss, loss.node(), detail::nodes_newest_first(loss.node()), params...);
}
// An rvalue loss (a temporary, or std::move(loss)) gives up its place on the tape: its value stays
// readable, and the pass frees each op's saved tensors once its rule has run, where no other tensor
// still refers to them (run_backward). A second gradient() of it is an error (no longer on the tape).
template <Tensor Loss, Parameter... Params>
  requires(!std::is_lvalue_reference_v<Loss>)
std::tuple<Params...> gradient(Loss&& loss, const Params&... params) {
  detail::check_differentiable(loss, "gradient");
  detail::node_order order;
  auto* seed = detail::give_up_node(loss, order);
  return detail::gradient_of(loss, seed, order, params...);
}

// Gradient accumulation (pipeline microbatches, large batches in parts): adds the gradients of
// `loss` with respect to the params into what earlier calls left in them, and hands out nothing.
// Data-parallel partial sums stay partial: the processors' sums are reduced once, by
// take_gradients, not once per call. The params must be leaves (tensors that requires_grad()
// marked, not results of ops), whose gradients the tape keeps between calls.
template <Tensor Loss, Parameter... Params>
void accumulate_gradient(const Loss& loss, const Params&... params) {
  detail::check_differentiable(loss, "accumulate_gradient");
  detail::accumulate_into(loss, loss.node(), detail::leaf_nodes("accumulate_gradient", params...),
                          detail::nodes_newest_first(loss.node()));
}
// An rvalue loss gives up its place on the tape, as gradient()'s: the pass frees as it goes.
template <Tensor Loss, Parameter... Params>
  requires(!std::is_lvalue_reference_v<Loss>)
void accumulate_gradient(Loss&& loss, const Params&... params) {
  detail::check_differentiable(loss, "accumulate_gradient");
  const auto kept = detail::leaf_nodes("accumulate_gradient", params...);
  detail::node_order order;
  auto* seed = detail::give_up_node(loss, order);
  detail::accumulate_into(loss, seed, kept, order);
}

// The reductions accumulate_gradient_reducing started: finish() waits for them and puts the sums
// in the params' gradients (take_gradients then hands them out as they are). Must be finished
// before the gradients are taken, on every processor, in one order among its other collectives.
template <class T, class Exec>
class gradients_reducing {
 public:
  void finish() {
    const detail::recording_scope paused(false);
    const detail::plan_phase_scope backward(detail::plan_phase::backward);
    const detail::plan_node_scope op("weight gradients");
    buckets_.finish();
  }
  detail::gradient_buckets<T, Exec>& buckets() { return buckets_; }

 private:
  detail::gradient_buckets<T, Exec> buckets_;
};

// accumulate_gradient for a step's last microbatch (Megatron's overlapped gradient reduction):
// adds the loss's gradients into the params' as accumulate_gradient does, and starts reducing
// each param's gradient that is still a partial sum as soon as this pass has made it final (in
// buckets, as gradient() does), so that the reduction runs behind the rest of the pass and
// whatever the caller does before finish() (a pipeline stage: sending its input's gradient back).
// Params the pass does not reach are left to take_gradients. The reductions are started
// (nonblocking) under gradient_reduction's overlap, else run where they are started. inputs (a
// tuple of references: a pipeline stage's received activation) accumulate alike and are not
// reduced: take_gradients takes them whenever the caller wants.
template <Tensor Loss, class... Inputs, Parameter... Params>
auto accumulate_gradient_reducing(const Loss& loss, const std::tuple<Inputs&...>& inputs, const Params&... params) {
  using First = typename detail::first_tensor_of<std::tuple_element_t<0, std::tuple<Params...>>>::type;
  using T = std::conditional_t<std::is_same_v<typename First::value_type, bf16>, float, typename First::value_type>;
  detail::check_differentiable(loss, "accumulate_gradient_reducing");
  auto kept = detail::leaf_nodes("accumulate_gradient_reducing", params...);
  std::apply([&](auto&... in) { kept.merge(detail::leaf_nodes("accumulate_gradient_reducing", in...)); }, inputs);
  auto reducing = std::make_shared<gradients_reducing<T, typename First::execution_space>>();
  auto& buckets = reducing->buckets();
  std::unordered_map<const detail::tape_node*, std::vector<std::function<void()>>> when_final;
  const auto watch = [&](const auto& t) {
    if (t.tracks_grad())
      when_final[t.node()].push_back([&buckets, &t] {
        const detail::plan_node_scope op("weight gradients");
        buckets.add(*t.node(), t.mesh());
      });
  };
  (for_each_tensor(params, watch), ...);
  const auto order = detail::nodes_newest_first(loss.node());
  const auto clear_others = [&] {
    for (const auto& n : order)
      if (!kept.count(n.get())) n->clear_grad();
  };
  clear_others();
  {
    const detail::nodes_read_after_pass_scope read_after(kept);
    detail::run_backward(
        loss, loss.node(), order,
        [&](const detail::tape_node* p) {
          if (const auto f = when_final.find(p); f != when_final.end())
            for (auto& join : f->second) join();
          buckets.progress();
        },
        [&](const detail::tape_node* n) { return kept.count(n) > 0; },
        // A node made from the weights alone (their bf16 working copy, cast once per step) runs as
        // soon as it is final, so that their reductions start then, not at the pass's end.
        [&](const detail::tape_node* n) {
          return !n->parents.empty() && std::all_of(n->parents.begin(), n->parents.end(), [&](const auto& p) {
            return when_final.count(p.get()) > 0;
          });
        });
  }
  clear_others();
  return reducing;
}

// The gradients accumulate_gradient summed in the params, reduced where they are still partial
// sums (in buckets, as gradient() does) and handed out; the params hold none afterwards.
template <Parameter... Params>
std::tuple<Params...> take_gradients(const Params&... params) {
  using First = typename detail::first_tensor_of<std::tuple_element_t<0, std::tuple<Params...>>>::type;
  const detail::recording_scope paused(false);
  const detail::plan_phase_scope backward(detail::plan_phase::backward);
  // bf16 gradients (an activation's) are reduced one by one, in float (collectives.hpp).
  using T = std::conditional_t<std::is_same_v<typename First::value_type, bf16>, float, typename First::value_type>;
  detail::gradient_buckets<T, typename First::execution_space> buckets;
  {
    const detail::plan_node_scope op("weight gradients");
    const auto join = [&](const auto& t) {
      if (t.tracks_grad()) buckets.add(*t.node(), t.mesh());
    };
    (for_each_tensor(params, join), ...);
    buckets.finish();
  }
  auto result = detail::hand_out_gradients(params...);
  const auto clear = [](const auto& t) {
    if (t.tracks_grad()) t.node()->clear_grad();
  };
  (for_each_tensor(params, clear), ...);
  return result;
}

}  // namespace meshtensor
