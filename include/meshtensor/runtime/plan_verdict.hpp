#pragma once
// The verdict of a plan check, for the programs that check a real step against its plan
// (meshtensor-lm's and the examples' check-plan): this rank's differences (plan_differences),
// agreed over a communicator by one MPI_MIN so that every rank returns the same verdict, and what
// this rank's step sent.
#include <mpi.h>

#include <cstdint>
#include <string>

#include "../plan/report.hpp"

namespace meshtensor {

struct plan_verdict {
  std::string differences;        // this rank's, empty where its step equals its plan
  bool equal_everywhere = false;  // the same on every rank of the communicator
  std::int64_t calls = 0, bytes = 0;  // this rank's collectives in the real step
};

// Collective over comm (every rank calls it with its own step and plan).
template <class Mesh>
plan_verdict agree_on_plan(MPI_Comm comm, const Mesh& m, const comm_counters& counted, const plan_report& planned,
                           std::int64_t parameter_bytes, std::int64_t optimizer_state_bytes) {
  plan_verdict v;
  v.differences = plan_differences(m, counted, planned, parameter_bytes, optimizer_state_bytes);
  int ok = v.differences.empty() ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  v.equal_everywhere = all == 1;
  for (const auto& [key, n] : counted) v.calls += n.calls, v.bytes += n.bytes;
  return v;
}

}  // namespace meshtensor
