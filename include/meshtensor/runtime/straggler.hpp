#pragma once
// Which rank the others wait for (docs/cluster.md, "The slow rank named"). A rank that is merely
// slow (a busy node, a throttled card, a noisy neighbour) fails nothing: it makes every other rank
// wait at every collective. Each processor times its collectives (communicator::collective_seconds:
// inside their blocking calls and their waits); the rest of a stretch of steps is its own work. The
// slow rank arrives last at each collective and waits least; the others wait for it, about as long
// as its work exceeds theirs. So:
//
//   mt::straggler_watch watch(mesh, 0.1);            // warn beyond 10% of the stretch
//   for (step = ...; ...) {
//     ... one training step ...
//     if ((step + 1) % log_every == 0) {
//       const auto r = watch.report(mesh);           // every rank: one allgather of 3 doubles
//       if (mesh.rank() == 0) std::puts(r.describe().c_str());
//     }
//   }
//
// The report's allgather is bookkeeping (communicator::gather_bookkeeping), not an op's
// communication: not counted, so plans and --check-plan are unchanged.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "../error.hpp"
#include "communicator.hpp"

namespace meshtensor {

// One stretch of steps, every rank of the mesh (in the mesh's rank order).
struct straggler_report {
  std::vector<double> work_seconds, wait_seconds;  // per rank: outside and inside collectives
  std::vector<int> world_ranks;                    // per rank: its rank in MPI_COMM_WORLD
  double stretch_seconds = 0;                      // the longest rank's stretch
  int slowest = -1;                                // the mesh rank with the most work
  double behind_seconds = 0;                       // its work less the others' median: what they waited
  bool warn = false;                               // behind_seconds above the threshold's share of the stretch

  std::string describe() const {
    if (slowest < 0) return "straggler report: no stretch measured";
    const auto [lo, hi] = std::minmax_element(work_seconds.begin(), work_seconds.end());
    const auto [wlo, whi] = std::minmax_element(wait_seconds.begin(), wait_seconds.end());
    char line[512];
    std::snprintf(line, sizeof line,
                  "ranks' work %.3f-%.3f s, waiting in collectives %.3f-%.3f s over %.3f s; slowest: rank %d (world %d), "
                  "%.3f s of work more than the others' median (%.1f%% of the stretch)%s",
                  *lo, *hi, *wlo, *whi, stretch_seconds, slowest, world_ranks[static_cast<std::size_t>(slowest)],
                  behind_seconds, stretch_seconds > 0 ? 100.0 * behind_seconds / stretch_seconds : 0.0,
                  warn ? ": WARNING, the others wait for it" : "");
    return line;
  }
};

class straggler_watch {
 public:
  // The first stretch starts now. Warns when the slowest rank's work exceeds the others' median by more
  // than warn_fraction of the stretch.
  template <class Mesh>
    requires requires(const Mesh& m) { m.communicator(); }
  explicit straggler_watch(const Mesh& mesh, double warn_fraction = 0.1)
      : warn_fraction_(warn_fraction), waited_before_(mesh.communicator().collective_seconds()) {
    if (!(warn_fraction >= 0))
      throw error(detail::cat("straggler_watch: the warning threshold ", warn_fraction, " must be a fraction >= 0"));
  }

  // Every rank of the mesh calls it at the same point (a collective): the stretch since the last
  // call (or since the watch was made), gathered.
  template <class Mesh>
    requires requires(const Mesh& m) { m.communicator(); }
  straggler_report report(const Mesh& mesh) {
    auto& comm = mesh.communicator();
    return report_with(comm, [&](const std::vector<double>& mine) { return comm.gather_bookkeeping(mine); });
  }
  // The same over every rank of a pipeline (pipeline::stages; the watch made on its stage's mesh):
  // a stage's waits for its neighbours are timed by its mesh's communicator, so they count as
  // waiting, and a stage slow in its own work is named, not the ones waiting for it.
  template <class Stages>
    requires requires(Stages& s, const std::vector<double>& v) {
      s.mesh().communicator();
      s.gather_bookkeeping(v);
    }
  straggler_report report(Stages& stages) {
    return report_with(stages.mesh().communicator(),
                       [&](const std::vector<double>& mine) { return stages.gather_bookkeeping(mine); });
  }

 private:
  template <class Gather>
  straggler_report report_with(const detail::communicator& comm, Gather gather) {
    const auto now = std::chrono::steady_clock::now();
    const double stretch = std::chrono::duration<double>(now - since_).count();
    const double wait = comm.collective_seconds() - waited_before_;
    const double work = std::max(0.0, stretch - wait);
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    const auto all = gather({work, wait, static_cast<double>(world)});
    straggler_report r;
    for (std::size_t i = 0; i + 2 < all.size(); i += 3) {
      r.work_seconds.push_back(all[i]);
      r.wait_seconds.push_back(all[i + 1]);
      r.world_ranks.push_back(static_cast<int>(all[i + 2]));
      r.stretch_seconds = std::max(r.stretch_seconds, all[i] + all[i + 1]);
    }
    if (!r.work_seconds.empty()) {
      r.slowest = static_cast<int>(std::max_element(r.work_seconds.begin(), r.work_seconds.end()) - r.work_seconds.begin());
      // Against the others' median (with two ranks: the other's work), not one that counts it.
      std::vector<double> others = r.work_seconds;
      others.erase(others.begin() + r.slowest);
      std::sort(others.begin(), others.end());
      const double typical = others.empty() ? r.work_seconds[0] : others[others.size() / 2];
      r.behind_seconds = r.work_seconds[static_cast<std::size_t>(r.slowest)] - typical;
      r.warn = r.behind_seconds > warn_fraction_ * r.stretch_seconds;
    }
    // The next stretch starts after this report's own allgather.
    since_ = std::chrono::steady_clock::now();
    waited_before_ = comm.collective_seconds();
    return r;
  }

 private:
  double warn_fraction_;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  double waited_before_;
};

}  // namespace meshtensor
