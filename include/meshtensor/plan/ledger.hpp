#pragma once
// What a planned run records (runtime/mesh.hpp's mesh::planned, docs/plan-mode.md): while a planned mesh
// exists, tensors carry shapes and placement but no data, kernels are skipped, collectives are
// counted and not sent, and this ledger keeps the rest of what a real processor would see:
// the bytes of the tensors alive (now and at the peak, by kind), the FLOPs of the local products,
// and every collective by op. One process plans one mesh at a time; the ledger is that process's.
#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../geometry/axis_set.hpp"
#include "collective_context.hpp"
#include "timeline.hpp"

namespace meshtensor {

// What a tensor's memory holds, for the memory report. A tensor is counted under the kind in force
// when its memory was allocated (scopes: plan_kind_scope; gradient() and the optimizers set theirs).
enum class memory_kind { activations, parameters, gradients, optimizer_state };
inline constexpr int memory_kind_count = 4;

inline const char* to_string(memory_kind k) {
  switch (k) {
    case memory_kind::activations: return "activations";
    case memory_kind::parameters: return "parameters";
    case memory_kind::gradients: return "gradients";
    case memory_kind::optimizer_state: return "optimizer_state";
  }
  return "?";
}

namespace detail {

// What a planned op belongs to: the forward pass, the backward pass, a block's forward pass run
// again in the backward pass (autodiff/recompute.hpp), or the weight gradients a split backward
// pass computes apart (autodiff/split_backward.hpp).
enum class plan_phase { forward, backward, recompute, weight_gradient };

struct plan_op_record {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
};

class plan_ledger {
 public:
  using kind_bytes = std::array<std::int64_t, memory_kind_count>;

  // Planned communicators alive (runtime/mesh.hpp); planning() is true while there is one.
  int planned_meshes = 0;
  // Whether plans count the scratch of this host's own kernel paths (the portable bf16 product's
  // operands widened to float, kernels/product.hpp): a plan of a run on this machine holds what the
  // run holds; a plan for another device (a calibration's, such as an A100's) turns it off.
  bool counts_host_scratch = true;

  // A distinct fake address per planned allocation (never dereferenced: no kernel runs), so that
  // tensors sharing a slice share its bytes in the count.
  std::uintptr_t fake_address(std::size_t bytes) {
    allocated_bytes_ += static_cast<std::int64_t>(bytes);
    timeline_.after.allocated_bytes += static_cast<std::int64_t>(bytes);
    const std::uintptr_t a = next_;
    next_ += (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
    return a;
  }

  // A tensor's claim on planned memory at address a: shared with every tensor of that address.
  std::shared_ptr<void> claim(const void* a, std::int64_t bytes) {
    auto& slot = claims_[a];
    if (auto live = slot.lock()) return live;
    live_[static_cast<int>(kind_)] += bytes;
    total_live_ += bytes;
    const op_key made_by{op_, phase_};
    if (kind_ == memory_kind::activations) activations_by_op_[made_by] += bytes;
    if (total_live_ > peak_total_) {
      peak_total_ = total_live_;
      at_peak_ = live_;
      peak_is_now_ = true;
    }
    std::shared_ptr<claim_record> token(new claim_record{bytes, kind_, made_by}, [this, a](claim_record* r) {
      keep_peak_by_op();
      live_[static_cast<int>(r->kind)] -= r->bytes;
      total_live_ -= r->bytes;
      if (r->kind == memory_kind::activations) forget_activation(r->made_by, r->bytes);
      claims_.erase(a);
      delete r;
    });
    slot = token;
    return token;
  }
  // The memory at address a now holds kind k (a gradient handed out by gradient() was allocated
  // in the backward pass, as an activation).
  void reclassify(const void* a, memory_kind k) {
    const auto c = claims_.find(a);
    if (c == claims_.end()) return;
    if (const auto r = c->second.lock()) {
      keep_peak_by_op();
      live_[static_cast<int>(r->kind)] -= r->bytes;
      live_[static_cast<int>(k)] += r->bytes;
      if (r->kind == memory_kind::activations) forget_activation(r->made_by, r->bytes);
      if (k == memory_kind::activations) activations_by_op_[r->made_by] += r->bytes;
      r->kind = k;
    }
  }

  memory_kind kind() const { return kind_; }
  void set_kind(memory_kind k) { kind_ = k; }
  // The op being run (a string literal, or null), to which collectives and FLOPs are credited.
  const char* op() const { return op_; }
  void set_op(const char* op) { op_ = op; }
  plan_phase phase() const { return phase_; }
  void set_phase(plan_phase p) { phase_ = p; }

  // Collectives and FLOPs by op ("einsum", "einsum (backward)", ...).
  void count(const char* kind, axis_set axes, std::int64_t bytes) {
    auto& r = collectives_[{op_label(), kind, axes.mask()}];
    r.calls += 1;
    r.bytes += bytes;
  }
  void add_flops(std::int64_t f) { flops_[op_label()] += f; }
  // A batch of nb products of (m x k) by (k x n): its FLOPs, by op and by the size m n k of one
  // product (exactly: a plan has few sizes, and a rate measured at a size is then the rate used
  // there), since a small product runs at a lower rate than a large one; those of bf16 operands
  // also apart, since they run at a rate of their own.
  void add_product(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool bf16_operands = false) {
    const std::int64_t f = 2 * nb * m * n * k;
    add_flops(f);
    product_flops_[m * n * k] += f;
    if (bf16_operands) bf16_product_flops_[m * n * k] += f;
    // Products of one size run back to back (a block's, a ring's tiles): one record for them.
    auto& products = timeline_.after.products;
    if (!products.empty() && products.back().mnk == m * n * k && products.back().bf16 == bf16_operands)
      products.back().flops += f;
    else
      products.push_back({m * n * k, f, bf16_operands});
  }
  const std::map<std::int64_t, std::int64_t>& product_flops_by_size() const { return product_flops_; }
  const std::map<std::int64_t, std::int64_t>& bf16_product_flops_by_size() const { return bf16_product_flops_; }
  // Kernels launched (a product counts one) and bytes allocated (results and scratch, each written
  // once): what the cost model (layout/candidates.hpp) charges besides FLOPs and collectives.
  void add_kernel() {
    ++kernels_;
    ++timeline_.after.kernels;
  }
  // Work that allocates nothing, charged at rates of its own: bytes of parameters an optimizer
  // updates in place, and bytes the host copies into tensors (from_host, scatter).
  void add_optimizer_bytes(std::int64_t b) {
    optimizer_bytes_ += b;
    timeline_.after.optimizer_bytes += b;
  }
  // A wait of the host for an execution space's work (kernels::fence): where a GPU's step would
  // stop the host, counted as collectives are.
  void add_wait() { ++waits_; }
  void add_host_bytes(std::int64_t b) {
    host_bytes_ += b;
    timeline_.after.host_bytes += b;
  }
  // A collective's place in the step's order (timeline.hpp), after the work recorded since the
  // last one. A started one gets a ticket, which its wait gives back.
  std::int64_t add_event(plan_event_kind kind, collective op, axis_set axes, std::int64_t bytes,
                         std::int64_t ticket = -1) {
    if (kind == plan_event_kind::started) ticket = next_ticket_++;
    timeline_.events.push_back({kind, op, axes, bytes, ticket, std::move(timeline_.after)});
    timeline_.after = {};
    return ticket;
  }
  const plan_timeline& timeline() const { return timeline_; }
  std::int64_t optimizer_bytes() const { return optimizer_bytes_; }
  std::int64_t host_bytes() const { return host_bytes_; }
  std::int64_t waits() const { return waits_; }
  std::int64_t kernels() const { return kernels_; }
  std::int64_t allocated_bytes() const { return allocated_bytes_; }

  void reset() {
    collectives_.clear();
    flops_.clear();
    kernels_ = 0;
    allocated_bytes_ = 0;
    optimizer_bytes_ = 0;
    host_bytes_ = 0;
    waits_ = 0;
    product_flops_.clear();
    bf16_product_flops_.clear();
    timeline_ = {};  // tickets go on counting: a wait for one started before is not this step's
    peak_total_ = total_live_;
    at_peak_ = live_;
    peak_is_now_ = true;
    saved_for_backward_ = -1;
    saved_for_backward_by_op_.clear();
  }

  const kind_bytes& live() const { return live_; }
  std::int64_t live_total() const { return total_live_; }
  std::int64_t peak_total() const { return peak_total_; }
  const kind_bytes& at_peak() const { return at_peak_; }
  const std::map<std::tuple<std::string, std::string, unsigned>, plan_op_record>& collectives() const {
    return collectives_;
  }
  const std::map<std::string, std::int64_t>& flops() const { return flops_; }
  // A backward pass starts (autodiff/gradient.hpp): the activations alive now are what the tape
  // saved for it. The largest such moment since reset() is kept, with its split by op.
  void note_backward_start() {
    const std::int64_t now = live_[static_cast<int>(memory_kind::activations)];
    if (now < saved_for_backward_) return;
    saved_for_backward_ = now;
    saved_for_backward_by_op_ = activations_by_op_;
  }
  std::int64_t saved_for_backward() const { return saved_for_backward_; }
  std::map<std::string, std::int64_t> saved_for_backward_by_op() const { return by_label(saved_for_backward_by_op_); }
  // The bytes of activations alive at the peak, by the op (and pass) that allocated them.
  std::map<std::string, std::int64_t> activations_at_peak_by_op() const {
    return by_label(peak_is_now_ ? activations_by_op_ : activations_by_op_at_peak_);
  }

  static plan_ledger& get() {
    static plan_ledger l;
    return l;
  }
  // "einsum", "einsum (backward)", ...: how reports and the watchdog name an op in its phase.
  static std::string label_of(const char* op, plan_phase phase) {
    const std::string base = op ? op : "other";
    switch (phase) {
      case plan_phase::backward: return base + " (backward)";
      case plan_phase::recompute: return base + " (recompute)";
      case plan_phase::weight_gradient: return base + " (weight gradient)";
      default: return base;
    }
  }

 private:
  using op_key = std::pair<const char*, plan_phase>;
  static std::map<std::string, std::int64_t> by_label(const std::map<op_key, std::int64_t>& by_op) {
    std::map<std::string, std::int64_t> m;
    for (const auto& [key, bytes] : by_op)
      if (bytes) m[label_of(key.first, key.second)] += bytes;
    return m;
  }
  std::string op_label() const { return label_of(op_, phase_); }
  std::uintptr_t next_ = std::uintptr_t{1} << 44;
  struct claim_record {
    std::int64_t bytes;
    memory_kind kind;
    op_key made_by;
  };
  void forget_activation(const op_key& made_by, std::int64_t bytes) {
    const auto it = activations_by_op_.find(made_by);
    if (it != activations_by_op_.end() && (it->second -= bytes) == 0) activations_by_op_.erase(it);
  }
  // The by-op bytes at the peak are copied only when the bytes alive first change after it (a
  // peak is followed by many larger ones while a forward pass allocates: one copy, not one each).
  void keep_peak_by_op() {
    if (!peak_is_now_) return;
    activations_by_op_at_peak_ = activations_by_op_;
    peak_is_now_ = false;
  }
  std::map<op_key, std::int64_t> activations_by_op_, activations_by_op_at_peak_;
  bool peak_is_now_ = true;
  std::int64_t saved_for_backward_ = -1;
  std::map<op_key, std::int64_t> saved_for_backward_by_op_;
  std::map<const void*, std::weak_ptr<claim_record>> claims_;
  kind_bytes live_{}, at_peak_{};
  std::int64_t total_live_ = 0, peak_total_ = 0;
  std::int64_t kernels_ = 0, allocated_bytes_ = 0, optimizer_bytes_ = 0, host_bytes_ = 0, waits_ = 0;
  memory_kind kind_ = memory_kind::activations;
  const char* op_ = nullptr;
  plan_phase phase_ = plan_phase::forward;
  std::map<std::tuple<std::string, std::string, unsigned>, plan_op_record> collectives_;
  std::map<std::string, std::int64_t> flops_;
  std::map<std::int64_t, std::int64_t> product_flops_;       // m n k of one product -> FLOPs
  std::map<std::int64_t, std::int64_t> bf16_product_flops_;  // the part of them of bf16 operands
  plan_timeline timeline_;
  std::int64_t next_ticket_ = 0;
};

// True while a planned mesh exists: kernels, copies and MPI are skipped.
inline bool planning() { return plan_ledger::get().planned_meshes > 0; }

// Names the op that the collectives and FLOPs inside it belong to (the outermost op wins: a layer's
// reductions are counted under the layer). Costs a branch when not planning.
class plan_op_scope {
 public:
  explicit plan_op_scope(const char* name) {
    auto& running = collective_context::get();
    if (!running.op) {  // for the collective watchdog's message, planned or not
      running.op = name;
      owns_running_ = true;
    }
    if (!planning() || plan_ledger::get().op()) return;
    plan_ledger::get().set_op(name);
    owner_ = true;
  }
  plan_op_scope(const plan_op_scope&) = delete;
  plan_op_scope& operator=(const plan_op_scope&) = delete;
  ~plan_op_scope() {
    if (owner_) plan_ledger::get().set_op(nullptr);
    if (owns_running_) collective_context::get().op = nullptr;
  }

 private:
  bool owner_ = false, owns_running_ = false;
};

// In the backward pass: a node's gradient rule runs under the name of the op that made the node.
class plan_node_scope {
 public:
  explicit plan_node_scope(const char* op) : was_(plan_ledger::get().op()), was_running_(collective_context::get().op) {
    if (planning()) plan_ledger::get().set_op(op);
    collective_context::get().op = op;
  }
  plan_node_scope(const plan_node_scope&) = delete;
  plan_node_scope& operator=(const plan_node_scope&) = delete;
  ~plan_node_scope() {
    plan_ledger::get().set_op(was_);
    collective_context::get().op = was_running_;
  }

 private:
  const char* was_;
  const char* was_running_;
};

// Ops run inside are reported as "op (backward)" or "op (recompute)" (autodiff/gradient.hpp,
// autodiff/recompute.hpp).
class plan_phase_scope {
 public:
  explicit plan_phase_scope(plan_phase p) : was_(plan_ledger::get().phase()) { plan_ledger::get().set_phase(p); }
  plan_phase_scope(const plan_phase_scope&) = delete;
  plan_phase_scope& operator=(const plan_phase_scope&) = delete;
  ~plan_phase_scope() { plan_ledger::get().set_phase(was_); }

 private:
  plan_phase was_;
};

}  // namespace detail

// Tensors allocated inside count as kind k in a plan's memory report (no effect on real runs).
class plan_kind_scope {
 public:
  explicit plan_kind_scope(memory_kind k) : was_(detail::plan_ledger::get().kind()) {
    detail::plan_ledger::get().set_kind(k);
  }
  plan_kind_scope(const plan_kind_scope&) = delete;
  plan_kind_scope& operator=(const plan_kind_scope&) = delete;
  ~plan_kind_scope() { detail::plan_ledger::get().set_kind(was_); }

 private:
  memory_kind was_;
};

}  // namespace meshtensor
