#pragma once
// The collectives meshtensor counts and plans, and the counters a run leaves: the words plans,
// reports and communicators share. No MPI.
#include <cstdint>
#include <map>
#include <utility>

#include "../geometry/axis_set.hpp"

namespace meshtensor {

// send: a point-to-point send between neighbouring pipeline stages (pipeline/stages.hpp), counted on
// the sending stage's mesh over no axes.
enum class collective { allreduce, allgather, alltoall, reduce_scatter, shift, broadcast, gather, exscan, send };

inline const char* to_string(collective c) {
  switch (c) {
    case collective::allreduce: return "allreduce";
    case collective::allgather: return "allgather";
    case collective::alltoall: return "alltoall";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::shift: return "shift";
    case collective::broadcast: return "broadcast";
    case collective::gather: return "gather";
    case collective::exscan: return "exscan";
    case collective::send: return "send";
  }
  return "?";
}

struct comm_count {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  // Of bytes, those whose amount the data decides (a ragged dispatch's rows sent back, where the
  // router chose how many each processor holds): a plan counts an even share, so only their sum
  // over the processors is the plan's (plan_verdict.hpp).
  std::int64_t routed_bytes = 0;
  friend bool operator==(const comm_count&, const comm_count&) = default;
};

// Key: which collective, over which axes.
using comm_key = std::pair<collective, axis_set>;
using comm_counters = std::map<comm_key, comm_count>;

}  // namespace meshtensor
