#pragma once
// What a rank is doing when it calls a collective: the op (set by the op's plan_op_scope, the
// outermost op winning, as in plan reports) and the tensor it moves (set by the op around its
// collectives). Read only by the collective watchdog (watchdog.hpp) when a collective times out, so
// setting them costs a pointer store. MPI-free: plan/ledger.hpp sets the op.
#include <string>

namespace meshtensor::detail {

struct collective_context {
  const char* op = nullptr;
  std::string (*tensor)() = nullptr;  // the tensor type's name, built only when needed
  static collective_context& get() {
    static collective_context c;
    return c;
  }
};

// Names the tensor an op's collectives move, for as long as it lives. The outermost wins, as for
// the op: a reduction names its input, not the partial sums it allreduces.
class collective_subject {
 public:
  explicit collective_subject(std::string (*type_name)()) : was_(collective_context::get().tensor) {
    if (!was_) collective_context::get().tensor = type_name;
  }
  collective_subject(const collective_subject&) = delete;
  collective_subject& operator=(const collective_subject&) = delete;
  ~collective_subject() { collective_context::get().tensor = was_; }

 private:
  std::string (*was_)();
};

}  // namespace meshtensor::detail
