#pragma once
// The order of a planned step: its local work between collectives, and each collective as it was
// called (blocking), started (nonblocking) or waited for. The ledger (ledger.hpp) records it; the
// cost model (cost_model.hpp) replays it on a calibrated machine, so that a started collective
// costs only what the work done while it was in flight leaves unhidden. Totals alone (the ledger's
// counts by op) cannot say that: only the order can.
#include <cstdint>
#include <vector>

#include "../geometry/axis_set.hpp"
#include "collective.hpp"

namespace meshtensor {

// The local work a plan recorded between two collective events, in the units the cost model times.
struct plan_work {
  struct product {
    std::int64_t mnk = 0;    // m n k of one product: its rate's key
    std::int64_t flops = 0;  // of the batch
    bool bf16 = false;       // operands in bf16: timed at that rate
  };
  std::int64_t kernels = 0, allocated_bytes = 0, optimizer_bytes = 0, host_bytes = 0;
  std::vector<product> products;
};

enum class plan_event_kind {
  blocking,  // called and finished before the next work
  started,   // started; its transfer runs until its wait
  waited,    // the wait for a started one (its ticket)
};

struct plan_event {
  plan_event_kind kind = plan_event_kind::blocking;
  collective op = collective::allreduce;
  axis_set axes;
  std::int64_t bytes = 0;    // sent by this processor, as the counters count them
  std::int64_t ticket = -1;  // started and waited: which started collective
  plan_work before;          // the work since the previous event
};

struct plan_timeline {
  std::vector<plan_event> events;
  plan_work after;  // the work since the last event
};

}  // namespace meshtensor
