#pragma once
// The one door every op goes through: `const op_call call(op, x);` first thing in the op.
// It opens the scope the op's collectives are credited to (plan reports, the watchdog's message),
// named by the op descriptor, and where plans are checked (MESHTENSOR_CHECK_PLANS=1, as the test
// suite runs) it compares the collectives the op counted, nested ops included, with the plan its
// descriptor states, when the op returns: a static plan that drifts from what its op does fails
// every test that calls the op, not only the comm_plan tests that compare the two by hand.
//
// An op descriptor is a value with a name and, unless it is a layer made of ops that check their
// own plans (composite_op), a plan(). Where the types decide the collectives it is a planned_op
// holding the op's public *_plan(); where the op chooses at run time (shift's neighbour or general
// path, halo_exchange's window), the op's own descriptor type (shift_op, halo_op), computed from
// the values that choose, and read by both the op's execution and its plan. ("Step" is kept for
// a training step and for the steps of a relayout, geometry/split.hpp's relayout_step.)
#include <concepts>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "../plan/comm_plan.hpp"
#include "../runtime/communicator.hpp"
#include "../plan/ledger.hpp"

namespace meshtensor::detail {

// An op whose collectives the types decide: its name and its plan.
struct planned_op {
  const char* name;
  comm_plan collectives;
  constexpr comm_plan plan() const { return collectives; }
};

// A layer made of ops (dense, attention, a transformer block): a name for the scope only.
struct composite_op {
  const char* name;
};

template <class S>
concept op_descriptor = requires(const S& s) {
  { s.name } -> std::convertible_to<const char*>;
};
template <class S>
concept planned_op_descriptor = op_descriptor<S> && requires(const S& s) {
  { s.plan() } -> std::same_as<comm_plan>;
};

// Whether ops check their plans: MESHTENSOR_CHECK_PLANS set and not "0", read once; a test of the
// check itself may switch it.
inline bool& plans_checked_switch() {
  static bool on = [] {
    const char* v = std::getenv("MESHTENSOR_CHECK_PLANS");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}
inline bool plans_checked() { return plans_checked_switch(); }

inline std::string counts_string(const communicator& comm, const comm_counters& c) {
  std::string s;
  for (const auto& [key, count] : c)
    s += cat(s.empty() ? "" : ", ", count.calls, " x ", to_string(key.first), " over ", comm.axes_string(key.second));
  return s.empty() ? "no collective" : s;
}

// The check itself, not a template: every op's door shares one copy of it (compile time).
class plan_check {
 public:
  plan_check() = default;
  plan_check(const plan_check&) = delete;
  plan_check& operator=(const plan_check&) = delete;
  bool active() const { return comm_ != nullptr; }

  [[gnu::noinline]] void begin(communicator& comm) {
    comm_ = &comm;
    if (comm.call_log() == nullptr) {
      comm.set_call_log(&log_);
      owns_log_ = true;
    }
    start_ = comm.call_log()->size();
    uncaught_ = std::uncaught_exceptions();
  }
  // Throws only when the op returned normally: every rank counts the same collectives (a
  // collective is called on all ranks of its group), so all throw alike.
  [[gnu::noinline]] void end(const char* op, const comm_plan& plan) {
    const auto& log = *comm_->call_log();
    comm_counters got;
    for (std::size_t i = start_; i < log.size(); ++i) got[log[i]].calls += 1;
    if (owns_log_) comm_->set_call_log(nullptr);
    if (std::uncaught_exceptions() > uncaught_) return;
    const comm_counters want = plan.as_counts();
    if (got != want)
      throw error(cat("meshtensor: ", op, " ran ", counts_string(*comm_, got), ", but its plan says ",
                      counts_string(*comm_, want), " (a bug in meshtensor: the op and its plan disagree)"));
  }

 private:
  communicator* comm_ = nullptr;
  std::vector<comm_key> log_;
  std::size_t start_ = 0;
  bool owns_log_ = false;
  int uncaught_ = 0;
};

template <op_descriptor Op>
class op_call {
 public:
  // A composite: the scope alone.
  explicit op_call(const Op& op)
    requires(!planned_op_descriptor<Op>)
      : op_(op), scope_(op.name) {}
  template <class AnyTensor>
  op_call(const Op& op, const AnyTensor& operand) : op_call(op, operand.mesh().communicator()) {}
  op_call(const Op& op, communicator& comm) : op_(op), scope_(op.name) {
    if constexpr (planned_op_descriptor<Op>)
      if (plans_checked()) check_.begin(comm);
  }
  op_call(const op_call&) = delete;
  op_call& operator=(const op_call&) = delete;
  ~op_call() noexcept(false) {
    if constexpr (planned_op_descriptor<Op>)
      if (check_.active()) check_.end(op_.name, op_.plan());
  }

  const Op& op() const { return op_; }

 private:
  Op op_;
  plan_op_scope scope_;
  plan_check check_;
};

}  // namespace meshtensor::detail
