#pragma once
// The verdict of a plan check, for the programs that check a real step against its plan
// (meshtensor-lm's and the examples' check-plan): this rank's differences (plan_differences), and
// the bytes the data routed (a ragged dispatch's), whose per-rank share no plan can know but whose
// sum over the ranks it does: both agreed over a communicator (one MPI_SUM, one MPI_MIN) so that
// every rank returns the same verdict; and what this rank's step sent; and the planned peak against the measured one (agree_on_peak).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <optional>
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
                           std::int64_t parameter_bytes, std::int64_t optimizer_state_bytes,
                           std::optional<std::int64_t> waits = std::nullopt) {
  plan_verdict v;
  v.differences = plan_differences(m, counted, planned, parameter_bytes, optimizer_state_bytes, waits);
  std::int64_t routed[2] = {0, 0};  // real, planned
  for (const auto& [key, n] : counted) routed[0] += n.routed_bytes;
  for (const auto& [key, n] : planned.totals) routed[1] += n.routed_bytes;
  MPI_Allreduce(MPI_IN_PLACE, routed, 2, MPI_INT64_T, MPI_SUM, comm);
  if (routed[0] != routed[1])
    v.differences += detail::cat("bytes routed by the data, summed over the ranks: planned ", routed[1], ", real ",
                                 routed[0], "\n");
  int ok = v.differences.empty() ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  v.equal_everywhere = all == 1;
  for (const auto& [key, n] : counted) v.calls += n.calls, v.bytes += n.bytes;
  return v;
}

// The planned peak against the measured one (the caching allocator's, memory_stats()) on every
// rank of comm: the smallest and largest planned / measured ratio, agreed by one collective, so
// that every rank returns the same verdict.
struct peak_agreement {
  double smallest = 0, largest = 0;
  bool close = false;  // both within the tolerance of 1
  void print(const char* whose, std::int64_t planned, std::int64_t measured, double tolerance) const {
    std::printf("check-plan memory: %s peak planned %lld bytes, measured %lld (the caching allocator's); "
                "planned / measured on every rank from %.4f to %.4f (tolerance %g): %s\n",
                whose, (long long)planned, (long long)measured, smallest, largest, tolerance, close ? "close" : "APART");
  }
};

// Collective over comm.
inline peak_agreement agree_on_peak(MPI_Comm comm, std::int64_t planned, std::int64_t measured, double tolerance) {
  const double ratio = measured > 0 ? static_cast<double>(planned) / static_cast<double>(measured) : 0.0;
  double worst[2] = {-ratio, ratio};  // the smallest and the largest, by one MAX
  MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, comm);
  peak_agreement a{-worst[0], worst[1], false};
  a.close = a.smallest >= 1.0 - tolerance && a.largest <= 1.0 + tolerance;
  return a;
}

}  // namespace meshtensor
