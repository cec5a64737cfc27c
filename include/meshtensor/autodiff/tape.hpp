#pragma once
// Reverse-mode autodiff. A tensor that requires gradients carries a node; every op applied to such
// a tensor gives its result a node whose rule pushes the result's gradient into the inputs' nodes.
// Nodes are numbered in creation order, so reverse order is a valid topological order.
//
// Lazy allreduce of gradients: a rule whose product contracts a split dim pushes its local partial
// product with the axes it is a partial sum over (push_partial_grad), not the allreduced sum. The
// node adds partials over the same axes locally and reduces once, when its own rule runs (settle)
// or, for a param, when gradient() hands it out (in buckets, gradient.hpp). Attention's input gets
// its q, k and v gradients as three partials over the heads' axes: one allreduce, not three.
#include <Kokkos_Core.hpp>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "../tensor/allreduce_slice.hpp"
#include "../tensor/tensor.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {
namespace detail {

inline std::atomic<std::uint64_t>& node_counter() {
  static std::atomic<std::uint64_t> counter{0};
  return counter;
}
inline std::uint64_t next_node_id() { return ++node_counter(); }
// Every node made after this call has a larger id (recompute.hpp tells a block's own nodes apart).
inline std::uint64_t last_node_id() { return node_counter().load(); }

// While a gradient is being computed, the ops its rules call are not recorded.
inline bool& recording_paused() {
  static thread_local bool paused = false;
  return paused;
}

struct tape_node;
// The nodes whose gradients the running backward pass hands out or keeps (gradient()'s params,
// accumulate_gradient's leaves), for its lifetime: a rule that would write past a node (einsum's
// product into the float tensor a bf16 copy was cast from) must not write past one of these,
// whose gradient is read after the pass. None outside a pass.
inline const std::unordered_set<const tape_node*>*& nodes_read_after_pass() {
  static thread_local const std::unordered_set<const tape_node*>* nodes = nullptr;
  return nodes;
}
class nodes_read_after_pass_scope {
 public:
  explicit nodes_read_after_pass_scope(const std::unordered_set<const tape_node*>& nodes)
      : was_(nodes_read_after_pass()) {
    nodes_read_after_pass() = &nodes;
  }
  nodes_read_after_pass_scope(const nodes_read_after_pass_scope&) = delete;
  nodes_read_after_pass_scope& operator=(const nodes_read_after_pass_scope&) = delete;
  ~nodes_read_after_pass_scope() { nodes_read_after_pass() = was_; }

 private:
  const std::unordered_set<const tape_node*>* was_;
};

// Recording on or off for the scope's lifetime (restored after).
class recording_scope {
 public:
  explicit recording_scope(bool record) : was_(recording_paused()) { recording_paused() = !record; }
  recording_scope(const recording_scope&) = delete;
  recording_scope& operator=(const recording_scope&) = delete;
  ~recording_scope() { recording_paused() = was_; }

 private:
  bool was_;
};

struct tape_node : std::enable_shared_from_this<tape_node> {
  std::uint64_t id = next_node_id();
  std::vector<std::shared_ptr<tape_node>> parents;
  std::shared_ptr<communicator> comm;  // the result's mesh's: partial gradients are reduced over its axes
  const char* plan_op = plan_ledger::get().op();  // the op that made it, for a plan's report
  virtual ~tape_node() = default;
  virtual void backward() = 0;
  virtual void clear_grad() = 0;
  // Adds the gradients on their way here (arriving_gradient, below); nothing for a node that takes none.
  virtual void land_arrivals() {}
  // Drops what the rule saved (its inputs, its closure) and the links to the parents, after the
  // rule has run in a pass that alone holds this node (gradient.hpp, run_backward).
  virtual void release() { parents.clear(); }
};

// A gradient on its way to a node: a reduce_scatter started nonblocking (relayout's rule, under
// gradient_reduction's overlap), to be added into the node once it has arrived. The node lands it
// before anything reads or adds to its gradient, and gradient() before handing gradients out, so
// the collective runs behind the rest of the backward pass. Destroyed unlanded (an error left the
// pass), it still waits: MPI writes its buffers until then.
struct arriving_gradient {
  tape_node* const owner;  // the node it lands in, which holds it
  explicit arriving_gradient(tape_node* node) : owner(node) { in_flight().push_back(this); }
  arriving_gradient(const arriving_gradient&) = delete;
  arriving_gradient& operator=(const arriving_gradient&) = delete;
  virtual ~arriving_gradient() { std::erase(in_flight(), this); }
  virtual void progress() = 0;  // lets MPI move it on (one test)
  virtual void land() = 0;      // waits for it and adds it into its node
  // Every gradient on its way, oldest first, for progress_arrivals and the limit on how many.
  static std::vector<arriving_gradient*>& in_flight() {
    static thread_local std::vector<arriving_gradient*> all;
    return all;
  }
};
// Most MPIs move a nonblocking collective on only inside MPI calls: the backward pass calls this
// between rules.
inline void progress_arrivals() {
  for (auto* a : arriving_gradient::in_flight()) a->progress();
}

template <Tensor TT>
TT clone(const TT& t) {
  return TT(from_storage, t.mesh().shared_communicator(), t.storage().copy());
}

// acc += add, elementwise. One kernel per (space, element type), not per tensor type: a lambda here
// would be compiled again for every layout and dim list (compile time).
template <class Exec, class V>
void accumulate_kernel(const V& acc, const V& add) {
  kernels::parallel_for("meshtensor::grad_accumulate", kernels::range<Exec>(0, static_cast<std::int64_t>(acc.extent(0))),
                       KOKKOS_LAMBDA(std::int64_t i) { acc(i) += add(i); });
}

// The gradient of a tensor on the tape, held as its storage (extents, slice, View) and its mesh's
// communicator: one node class per (element type, rank, space), not per tensor type, whose
// members and std::optional were compiled again for every layout and dim list (compile time).
template <class T, std::size_t R, class Exec>
struct grad_node : tape_node {
  using storage_type = tensor_storage<T, R, Exec>;
  storage_type grad;
  bool has_grad = false;
  // Axes over which grad is still a sum of per-processor partials (0: grad is the gradient).
  axis_set pending_axes;
  // Gradients started on their way here, not yet added (arriving_gradient).
  std::vector<std::unique_ptr<arriving_gradient>> arriving;

  // Adds what is on its way: before anything reads grad, has_grad or pending_axes.
  void land_arrivals() override {
    if (arriving.empty()) return;
    auto landing = std::move(arriving);
    arriving.clear();
    for (auto& a : landing) a->land();
  }
  void accumulate(const storage_type& g) {
    land_arrivals();
    if (!has_grad) return take(g.copy());
    settle();  // a whole gradient added to a partial would be counted once per processor
    add_in_place(g);
  }
  // g is a fresh result that nothing else refers to: the first one is kept as it is, not copied.
  void accumulate_fresh(storage_type&& g) {
    land_arrivals();
    if (!has_grad) return take(std::move(g));
    settle();
    add_in_place(g);
  }
  // g is fresh and a partial sum over axes: added locally to partials over the same axes.
  void accumulate_partial(storage_type&& g, axis_set axes) {
    if (axes == 0) return accumulate_fresh(std::move(g));
    land_arrivals();
    if (!has_grad) {
      take(std::move(g));
      pending_axes = axes;
      return;
    }
    if (pending_axes != axes) {
      settle();
      allreduce_slice<Exec, T>(*comm, g.data, axes, reduce_op::sum);
    }
    add_in_place(g);
  }
  // Reduces a pending partial sum: grad is then the gradient on every processor.
  void settle() {
    land_arrivals();
    if (pending_axes.empty() || !has_grad) return;
    allreduce_slice<Exec, T>(*comm, grad.data, pending_axes, reduce_op::sum);
    pending_axes = {};
  }
  void add_in_place(const storage_type& g) { accumulate_kernel<Exec>(grad.data, g.data); }
  void backward() override {}  // a leaf: nothing to push further
  void clear_grad() override {
    land_arrivals();  // MPI writes its buffers until it has arrived
    grad = storage_type{};
    has_grad = false;
    pending_axes = 0;
  }

 private:
  void take(storage_type&& g) {
    grad = std::move(g);
    grad.node.reset();
    has_grad = true;
  }
};
template <Tensor TT>
using grad_node_of = grad_node<typename TT::value_type, TT::rank, typename TT::execution_space>;

// An op's result: its gradient rule, stored as its own type. Not a std::function, whose copying
// and type-erasure machinery was compiled for every rule of every tensor type and never used: a
// rule is moved into its node once (compile time, docs/performance.md).
template <class TT, class Rule>
struct rule_node final : grad_node_of<TT> {
  // noexcept (moving tensors does not throw): no cleanup path in every record (compile time).
  explicit rule_node(Rule&& r) noexcept : rule_(std::move(r)) {}
  ~rule_node() { drop_rule(); }
  // The rule, or null once released.
  const Rule* rule() const { return held_ ? std::addressof(rule_) : nullptr; }
  void backward() override {
    this->land_arrivals();
    if (!this->has_grad) return;
    if (!held_)  // unreachable by construction: only nodes that nothing outside a pass holds are released
      throw error("meshtensor: a gradient reached an op whose saved tensors an earlier backward pass released");
    const TT g(from_storage, this->comm, this->grad);
    // A rule that can take a partial gradient (relayout's: a reduce_scatter) may reduce it itself.
    if constexpr (requires(const Rule& r) { r.partial(g, axis_set{}); })
      if (!this->pending_axes.empty() && rule_.partial(g, this->pending_axes)) return;
    this->settle();
    rule_(g);
  }
  void release() override {
    drop_rule();
    this->parents.clear();
  }

 private:
  // The rule in a union and a flag rather than a std::optional: optional's members were compiled
  // for every rule type (a sixth of a test object's functions, docs/performance.md).
  union {
    Rule rule_;
  };
  bool held_ = true;
  void drop_rule() noexcept {
    if (!held_) return;
    held_ = false;  // first, as std::optional does: nothing reaches a rule being destroyed
    rule_.~Rule();
  }
};

// Gives node n (just made) the communicator and the parents' nodes, and makes it the node that
// slot (a tensor's) holds. Not a template: record's own code is only the new node (compile time).
inline void attach_node(std::shared_ptr<tape_node>& slot, tape_node* n, const std::shared_ptr<communicator>& comm,
                        const std::shared_ptr<tape_node>* const* parents, std::size_t n_parents) {
  std::shared_ptr<tape_node> node(n);
  node->comm = comm;
  for (std::size_t i = 0; i != n_parents; ++i)
    if (*parents[i]) node->parents.push_back(*parents[i]);
  slot = std::move(node);
}

// Gives `out` a node when an input is on the tape. The rule receives out's gradient.
template <Tensor Out, class Rule, Tensor... In>
void record(Out& out, Rule rule, const In&... inputs) {
  if (recording_paused() || !(inputs.tracks_grad() || ...)) return;
  const std::shared_ptr<tape_node>* const parents[] = {&inputs.shared_node()..., nullptr};
  attach_node(out.node_slot(), new rule_node<Out, Rule>(std::move(rule)), out.mesh().shared_communicator(), parents,
              sizeof...(In));
}

// A tensor's place on the tape without its data, for a rule that pushes a gradient into an input
// whose values it never reads (a sum's operands, softmax's logits, a fused expression's linear
// parts): its node, type and extents only, so that the tape does not keep the data alive (nor, in
// a plan, count it).
template <Tensor TT>
TT node_only(const TT& x) {
  auto st = x.storage();
  st.data = {};
  st.planned_bytes = {};
  return TT(from_storage, x.mesh().shared_communicator(), st);
}

// Used inside rules: adds g to the gradient of an input, if the input is on the tape.
template <Tensor TT>
void push_grad(const TT& input, const TT& g) {
  if (input.tracks_grad()) input.node()->accumulate(g.storage());
}
// The same for a g that the rule has just computed and that shares its View with nothing (a
// kernel's fresh result): the input's first gradient takes it over without a copy. Never pass a
// tensor that shares its View with another (the rule's own g, a rename of it): later
// accumulations add into it in place.
template <Tensor TT>
void push_fresh_grad(const TT& input, TT&& g) {
  if (input.tracks_grad()) input.node()->accumulate_fresh(std::move(g).storage());
}
// The same for a fresh g that is this processor's partial sum over axes (a product that
// contracted dims split over them, not yet allreduced): the input's node reduces it (tape.hpp's
// first comment).
template <Tensor TT>
void push_partial_grad(const TT& input, TT&& g, axis_set axes) {
  if (input.tracks_grad()) input.node()->accumulate_partial(std::move(g).storage(), axes);
}

// The weight gradients an input-gradient pass (autodiff/split_backward.hpp) leaves for later: each
// a rule's computation for one weight, with what it reads (captured by value), and the op it
// belongs to, for a plan's report. A class per computation, not a std::function: moved once, run
// once (compile time, as rule_node).
struct deferred_work {
  const char* plan_op = nullptr;
  virtual ~deferred_work() = default;
  virtual void run() = 0;
};
template <class F>
struct deferred_call final : deferred_work {
  F f;
  explicit deferred_call(F g) noexcept : f(std::move(g)) {}
  void run() override { f(); }
};
// While an input-gradient pass runs: the weights' nodes and the work deferred for them.
struct weight_deferral {
  std::unordered_set<const tape_node*> weights;
  std::vector<std::unique_ptr<deferred_work>> work;
  static weight_deferral*& active() {
    static thread_local weight_deferral* d = nullptr;
    return d;
  }
};

// x's data and extents without its place on the tape: what a deferred weight gradient reads, kept
// without keeping the tape above x alive until the weight pass.
template <Tensor TT>
TT without_node(const TT& x) {
  auto st = x.storage();
  st.node.reset();
  return TT(from_storage, x.mesh().shared_communicator(), st);
}

// Inside rules, for an input that may be a weight (a product's operand, a norm's scale, a bias, an
// embedding table): push() computes its gradient and pushes it now or, during an input-gradient
// pass where `input` is one of the weights, in the weight pass. push() then runs after the tape
// has gone: it captures by value what it reads, through without_node.
template <Tensor TT, class Push>
void push_weight_grad(const TT& input, Push&& push) {
  if (!input.tracks_grad()) return;
  if (auto* d = weight_deferral::active(); d && d->weights.count(input.node())) {
    // A unique_ptr of the base from the start: one per deferred computation's type was compiled
    // (its tuple, deleter and conversions), over a quarter of a test object's functions.
    std::unique_ptr<deferred_work> w(new deferred_call<std::decay_t<Push>>(std::forward<Push>(push)));
    w->plan_op = plan_ledger::get().op();
    d->work.push_back(std::move(w));
    return;
  }
  push();
}

}  // namespace detail

template <class T, Layout L, class E, Dim... Ds>
basic_tensor<T, L, E, Ds...>& basic_tensor<T, L, E, Ds...>::requires_grad() {
  if (!st_.node) detail::attach_node(st_.node, new detail::grad_node<T, rank, E>(), mesh_.shared_communicator(), nullptr, 0);
  return *this;
}

// While one is alive, ops record nothing for gradient(), even on tensors that track gradients:
// inference (sampling, evaluation) holds no tape and no activations for a backward pass.
//   { mt::no_grad off; auto logits = model(x); }
class no_grad {
  detail::recording_scope off_{false};
};

}  // namespace meshtensor
