#pragma once
// Pipeline schedules: the order in which one stage of a pipeline runs the forward and backward
// passes of the microbatches of a step. A value, computed before the step: the stage's execution
// (run in pipeline/stages.hpp, through schedules.hpp's step_schedule) walks it, and its plan (the
// sends it makes, the activations it holds) is read from it, so the two cannot drift. No MPI here.
//
//   gpipe   every forward, then every backward (Huang et al. 2019): a stage holds the activations
//           of all m microbatches at once
//   1f1b    one forward, one backward (PipeDream-Flush, Narayanan et al. 2021): stage s runs
//           p - s - 1 forwards first, then alternates, then drains: it holds at most p - s
// Both idle each stage for (p - 1) of the m + p - 1 slots of a step (when forward and backward of
// a microbatch take equal time per stage): bubble_fraction.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"

namespace meshtensor::pipeline {

enum class schedule_kind { gpipe, one_f_one_b };

inline const char* to_string(schedule_kind k) { return k == schedule_kind::gpipe ? "gpipe" : "1f1b"; }
inline schedule_kind schedule_from_string(const std::string& s) {
  if (s == "gpipe") return schedule_kind::gpipe;
  if (s == "1f1b") return schedule_kind::one_f_one_b;
  throw error(detail::cat("pipeline schedule '", s, "': expected gpipe or 1f1b"));
}

struct action {
  bool forward = true;
  int microbatch = 0;
  friend bool operator==(const action&, const action&) = default;
};

// Stage `stage` of `stages`, `microbatches` microbatches per step.
inline std::vector<action> schedule(schedule_kind kind, int stage, int stages, int microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1)
    throw error(detail::cat("pipeline schedule: stage ", stage, " of ", stages, " with ", microbatches,
                            " microbatches (need 0 <= stage < stages and at least one microbatch)"));
  std::vector<action> out;
  if (kind == schedule_kind::gpipe) {
    for (int m = 0; m < microbatches; ++m) out.push_back({true, m});
    for (int m = 0; m < microbatches; ++m) out.push_back({false, m});
    return out;
  }
  const int warmup = std::min(stages - stage - 1, microbatches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back({true, next_forward});
  while (next_forward < microbatches) {
    out.push_back({true, next_forward++});
    out.push_back({false, next_backward++});
  }
  while (next_backward < microbatches) out.push_back({false, next_backward++});
  return out;
}

// The most microbatches whose forward has run and backward has not, at any point: the
// activations the stage holds at its peak.
inline int max_in_flight(const std::vector<action>& s) {
  int live = 0, most = 0;
  for (const auto& a : s) {
    live += a.forward ? 1 : -1;
    most = std::max(most, live);
  }
  return most;
}

// The idle share of a step for equal-cost stages: (p - 1) / (m + p - 1).
inline double bubble_fraction(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

}  // namespace meshtensor::pipeline
