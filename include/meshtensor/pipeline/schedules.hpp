#pragma once
// Pipeline schedules of a whole step as values, and a simulator that runs them on paper. For each
// stage, the ordered work items it runs: a forward (F), a backward split into its input gradient
// (B, which the previous part waits for) and its weight gradient (W, which nothing waits for), or
// the two fused (BW, as gpipe and 1f1b run it). With v chunks per stage a stage holds v parts of
// the model; the parts a stage holds and the order it runs them in are the schedule. No MPI here.
//
//   gpipe              every F, then every BW (Huang et al. 2019)
//   1f1b               PipeDream-Flush (Narayanan et al. 2021): p - s - 1 forwards, then one
//                      forward one backward, then the rest
//   interleaved 1f1b   Megatron's interleaving (Narayanan et al. 2021, section 2.2): v chunks per
//                      stage, part c * p + s on stage s; the bubble shrinks v times
//   zb-h1              Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", section 3.1): 1f1b with
//                      B and W split and the W of stage s deferred by s microbatches, which fills
//                      the drain; bubble (p - 1)(F + B - W) instead of (p - 1)(F + B + W)
//   zb-v               ibid. (the ICLR 2024 version): two chunks per stage in a V, B and W split;
//                      with F = B = W no idle beyond the last stage's wait for its first forward
//
// The simulator honours the data dependencies between parts (F of part k after F of part k - 1,
// B of part k after B of part k + 1 and after its own F, W after its B) and each stage's order,
// one item at a time, zero transfer time; it reports each item's start and end, the makespan, each
// stage's idle time and the activations each stage holds at its peak.
#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"

namespace meshtensor::pipeline {

enum class pass { F, B, W, BW };

inline const char* to_string(pass p) {
  switch (p) {
    case pass::F: return "F";
    case pass::B: return "B";
    case pass::W: return "W";
    case pass::BW: return "BW";
  }
  return "?";
}

struct work_item {
  pass kind = pass::F;
  int microbatch = 0;
  int chunk = 0;
  friend bool operator==(const work_item&, const work_item&) = default;
};

// Which model part chunk c of stage s holds: round robin (Megatron, part c * p + s) or the V shape
// of ZB-V (chunk 0 part s, chunk 1 part 2p - 1 - s).
enum class part_placement { round_robin, v_shape };

struct step_schedule {
  std::string name;
  int stages = 1;
  int microbatches = 1;
  int chunks = 1;
  part_placement placement = part_placement::round_robin;
  std::vector<std::vector<work_item>> per_stage;

  int parts() const { return stages * chunks; }
  int part(int stage, int chunk) const {
    if (stage < 0 || stage >= stages || chunk < 0 || chunk >= chunks)
      throw error(detail::cat("pipeline schedule ", name, ": stage ", stage, " chunk ", chunk, " of ", stages,
                              " stages with ", chunks, " chunks each"));
    if (placement == part_placement::v_shape && chunk == 1) return 2 * stages - 1 - stage;
    return chunk * stages + stage;
  }
  // The stage and chunk that hold `part`.
  std::pair<int, int> holder(int model_part) const {
    for (int s = 0; s < stages; ++s)
      for (int c = 0; c < chunks; ++c)
        if (part(s, c) == model_part) return {s, c};
    throw error(detail::cat("pipeline schedule ", name, ": no stage holds part ", model_part, " of ", parts()));
  }
  const std::vector<work_item>& at(int stage) const {
    if (stage < 0 || stage >= stages)
      throw error(detail::cat("pipeline schedule ", name, ": stage ", stage, " of ", stages));
    return per_stage[static_cast<std::size_t>(stage)];
  }
};

namespace schedule_detail {
inline void check_schedule_arguments(const char* name, int stage, int stages, int microbatches, int chunks = 1) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1 || chunks < 1)
    throw error(detail::cat("pipeline schedule ", name, ": stage ", stage, " of ", stages, " with ", microbatches,
                    " microbatches and ", chunks, " chunks (need 0 <= stage < stages, at least one microbatch"
                    " and at least one chunk)"));
}

template <class Order>
step_schedule whole_step(const char* name, int stages, int microbatches, int chunks, part_placement placement,
                         Order order_of_stage) {
  step_schedule out{name, stages, microbatches, chunks, placement, {}};
  for (int s = 0; s < stages; ++s) out.per_stage.push_back(order_of_stage(s));
  return out;
}
}  // namespace schedule_detail

// GPipe: every forward, then every backward (fused, BW), in microbatch order: a stage holds the
// activations of all m microbatches at once.
inline std::vector<work_item> gpipe_order(int stage, int stages, int microbatches) {
  schedule_detail::check_schedule_arguments("gpipe", stage, stages, microbatches);
  std::vector<work_item> out;
  for (int m = 0; m < microbatches; ++m) out.push_back({pass::F, m, 0});
  for (int m = 0; m < microbatches; ++m) out.push_back({pass::BW, m, 0});
  return out;
}
// 1F1B: p - s - 1 forwards, then one forward one backward (fused), then the remaining backwards:
// stage s holds at most p - s microbatches.
inline std::vector<work_item> one_f_one_b_order(int stage, int stages, int microbatches) {
  schedule_detail::check_schedule_arguments("1f1b", stage, stages, microbatches);
  std::vector<work_item> out;
  const int warmup = std::min(stages - stage - 1, microbatches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back({pass::F, next_forward, 0});
  while (next_forward < microbatches) {
    out.push_back({pass::F, next_forward++, 0});
    out.push_back({pass::BW, next_backward++, 0});
  }
  while (next_backward < microbatches) out.push_back({pass::BW, next_backward++, 0});
  return out;
}

// Interleaved 1F1B in Megatron's order (forward_backward_pipelining_with_interleaving): the k-th
// forward of a stage is microbatch (k / pv) p + k % p on chunk (k / p) % v, so microbatches go
// through the chunks in groups of p, which is why m must be a multiple of p; the k-th backward walks
// the chunks in reverse. Stage s warms up with (p - s - 1) * 2 + (v - 1) * p forwards (all m v at
// most), then alternates, then drains. It holds at most that warm-up plus one chunk activations.
inline std::vector<work_item> interleaved_1f1b_order(int stage, int stages, int microbatches, int chunks) {
  schedule_detail::check_schedule_arguments("interleaved 1f1b", stage, stages, microbatches, chunks);
  if (microbatches % stages != 0)
    throw error(detail::cat("pipeline schedule interleaved 1f1b: ", microbatches,
                            " microbatches is not a multiple of the ", stages, " stages"));
  const int group = stages * chunks, total = microbatches * chunks;
  const auto nth = [&](int k, pass kind) {
    const int chunk_in_order = (k % group) / stages;
    const int chunk = kind == pass::F ? chunk_in_order : chunks - 1 - chunk_in_order;
    return work_item{kind, (k / group) * stages + k % stages, chunk};
  };
  const int warmup = std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  std::vector<work_item> out;
  for (int k = 0; k < warmup; ++k) out.push_back(nth(k, pass::F));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(nth(warmup + k, pass::F));
    out.push_back(nth(k, pass::BW));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(nth(k, pass::BW));
  return out;
}

// ZB-H1 (Qi et al. 2023, section 3.1; the order of PyTorch's _get_1f1b_rank_ops with zero bubble):
// 1F1B's p - s - 1 warm-up forwards, then F, B pairs whose W is deferred: stage s runs its first
// s pairs with no W, and from then on each pair is followed by the oldest pending W; the drain
// runs B, W, then the Ws still pending. Deferring W by s lets the Bs, which the previous stages
// wait for, go first. Stage s so holds min(p, m) activations, not 1F1B's p - s: the peak over all
// stages, stage 0's p, is 1F1B's, which is the paper's memory claim (p M_B).
inline std::vector<work_item> zb_h1_order(int stage, int stages, int microbatches) {
  schedule_detail::check_schedule_arguments("zb-h1", stage, stages, microbatches);
  std::vector<work_item> out;
  const int warmup = std::min(stages - stage - 1, microbatches);
  int next_forward = 0, next_backward = 0, next_weight = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back({pass::F, next_forward, 0});
  for (int pair = 0; next_forward < microbatches; ++pair) {
    out.push_back({pass::F, next_forward++, 0});
    out.push_back({pass::B, next_backward++, 0});
    if (pair >= stage) out.push_back({pass::W, next_weight++, 0});
  }
  while (next_backward < microbatches) {
    out.push_back({pass::B, next_backward++, 0});
    out.push_back({pass::W, next_weight++, 0});
  }
  while (next_weight < microbatches) out.push_back({pass::W, next_weight++, 0});
  return out;
}

// ZB-V (Qi et al., the ICLR 2024 version of the paper; the order of PyTorch's
// ScheduleZBVZeroBubble): two chunks per stage in a V, chunk 0 part s and chunk 1 part 2p - 1 - s,
// so the last stage runs parts p - 1 and p back to back and the first stage both ends of the
// model. Stage s warms up with 2 (p - s) - 1 forwards on chunk 0, then s pairs of forwards on
// chunk 1 then chunk 0, then p - s rounds of F, B, W on chunk 1; steady state is F, B, W on chunk 0
// then on chunk 1; the drain runs s pairs of Bs, then p - s rounds of B, W on chunk 0, then the
// pending Ws. The order is laid out for at least 2p - 1 microbatches (what fills the V) and the
// items of microbatches past m are dropped. With F = B = W it holds 2p chunk activations (p
// stages' worth, 1f1b's stage 0) and idles only the (p - 1) F the last stage waits for its first
// forward.
inline std::vector<work_item> zb_v_order(int stage, int stages, int microbatches, int chunks = 2) {
  schedule_detail::check_schedule_arguments("zb-v", stage, stages, microbatches, chunks);
  if (chunks != 2)
    throw error(detail::cat("pipeline schedule zb-v: ", chunks, " chunks per stage (the V shape takes 2)"));
  const int laid_out = std::max(2 * stages - 1, microbatches);
  std::vector<work_item> order;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  for (int i = 0; i < 2 * (stages - stage) - 1; ++i) order.push_back({pass::F, f0++, 0});
  for (int i = 0; i < stage; ++i) {
    order.push_back({pass::F, f1++, 1});
    order.push_back({pass::F, f0++, 0});
  }
  for (int i = 0; i < stages - stage; ++i) {
    order.push_back({pass::F, f1++, 1});
    order.push_back({pass::B, b1, 1});
    order.push_back({pass::W, b1++, 1});
  }
  while (f1 < f0 || f0 < laid_out) {
    if (f0 < laid_out) order.push_back({pass::F, f0++, 0});
    order.push_back({pass::B, b0, 0});
    order.push_back({pass::W, b0++, 0});
    order.push_back({pass::F, f1++, 1});
    order.push_back({pass::B, b1, 1});
    order.push_back({pass::W, b1++, 1});
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < stage; ++i) {
    order.push_back({pass::B, b1++, 1});
    order.push_back({pass::B, b0++, 0});
  }
  for (int i = 0; i < stages - stage; ++i) {
    order.push_back({pass::B, b0++, 0});
    order.push_back({pass::W, w0++, 0});
  }
  while (w1 < b1) order.push_back({pass::W, w1++, 1});
  while (w0 < b0) order.push_back({pass::W, w0++, 0});
  std::vector<work_item> out;
  for (const auto& item : order)
    if (item.microbatch < microbatches) out.push_back(item);
  return out;
}

inline step_schedule gpipe_schedule(int stages, int microbatches) {
  schedule_detail::check_schedule_arguments("gpipe", 0, stages, microbatches);
  return schedule_detail::whole_step("gpipe", stages, microbatches, 1, part_placement::round_robin,
                            [&](int s) { return gpipe_order(s, stages, microbatches); });
}
inline step_schedule one_f_one_b_schedule(int stages, int microbatches) {
  schedule_detail::check_schedule_arguments("1f1b", 0, stages, microbatches);
  return schedule_detail::whole_step("1f1b", stages, microbatches, 1, part_placement::round_robin,
                            [&](int s) { return one_f_one_b_order(s, stages, microbatches); });
}
inline step_schedule interleaved_1f1b_schedule(int stages, int microbatches, int chunks) {
  interleaved_1f1b_order(0, stages, microbatches, chunks);  // the checks, before any stage
  return schedule_detail::whole_step("interleaved 1f1b", stages, microbatches, chunks, part_placement::round_robin,
                            [&](int s) { return interleaved_1f1b_order(s, stages, microbatches, chunks); });
}
inline step_schedule zb_h1_schedule(int stages, int microbatches) {
  schedule_detail::check_schedule_arguments("zb-h1", 0, stages, microbatches);
  return schedule_detail::whole_step("zb-h1", stages, microbatches, 1, part_placement::round_robin,
                            [&](int s) { return zb_h1_order(s, stages, microbatches); });
}
inline step_schedule zb_v_schedule(int stages, int microbatches, int chunks = 2) {
  zb_v_order(0, stages, microbatches, chunks);  // the checks, before any stage
  return schedule_detail::whole_step("zb-v", stages, microbatches, chunks, part_placement::v_shape,
                                     [&](int s) { return zb_v_order(s, stages, microbatches); });
}

// The schedule a name gives (a command line's --schedule): gpipe, 1f1b, interleaved (1F1B over
// `chunks` chunks), zb-h1 or zb-v (two chunks).
inline step_schedule named_schedule(const std::string& name, int stages, int microbatches, int chunks = 1) {
  const bool one_chunk = name == "gpipe" || name == "1f1b" || name == "zb-h1";
  if (one_chunk && chunks != 1)
    throw error(detail::cat("pipeline schedule ", name, " runs one chunk per stage, not ", chunks,
                            " (interleaved and zb-v run several)"));
  if (name == "gpipe") return gpipe_schedule(stages, microbatches);
  if (name == "1f1b") return one_f_one_b_schedule(stages, microbatches);
  if (name == "zb-h1") return zb_h1_schedule(stages, microbatches);
  if (name == "interleaved") return interleaved_1f1b_schedule(stages, microbatches, chunks);
  if (name == "zb-v") return zb_v_schedule(stages, microbatches, chunks == 1 ? 2 : chunks);
  throw error(detail::cat("pipeline schedule '", name, "': expected gpipe, 1f1b, interleaved, zb-h1 or zb-v"));
}

// The most chunk activations a stage holds at once: a forward keeps its activation until the
// weight gradient (W, or the fused BW) has used it; B alone releases nothing.
inline int peak_activations(const std::vector<work_item>& items) {
  int live = 0, most = 0;
  for (const auto& item : items) {
    if (item.kind == pass::F) ++live;
    if (item.kind == pass::W || item.kind == pass::BW) --live;
    most = std::max(most, live);
  }
  return most;
}

// GPipe's and 1F1B's idle share of a step for equal-cost stages: (p - 1) / (m + p - 1).
inline double bubble_fraction(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

// Time per work item (one chunk of one stage); BW costs B + W.
struct pass_costs {
  double forward = 1, input_grad = 1, weight_grad = 1;
  double of(pass p) const {
    switch (p) {
      case pass::F: return forward;
      case pass::B: return input_grad;
      case pass::W: return weight_grad;
      case pass::BW: return input_grad + weight_grad;
    }
    return 0;
  }
};

struct item_timing {
  double start = 0, end = 0;
};

struct simulation {
  std::vector<std::vector<item_timing>> timings;  // per stage, per item of its list
  double makespan = 0;
  std::vector<double> idle;              // per stage: makespan less the time it computes
  std::vector<int> peak_activations;     // per stage, in chunk activations
};

// Runs every stage's list in order, each item as soon as its stage is free and its dependencies
// have finished. Since a stage's order is fixed, an item's start is final once its dependencies'
// ends are known, so stages advance in any order until none can; items left then are a deadlock.
inline simulation simulate(const step_schedule& schedule, const pass_costs& costs = {}) {
  const auto stages = static_cast<std::size_t>(schedule.stages);
  if (schedule.per_stage.size() != stages)
    throw error(detail::cat("simulate ", schedule.name, ": ", schedule.per_stage.size(), " stage lists for ",
                            schedule.stages, " stages"));
  // The end of each finished (pass, microbatch, part); BW finishes both B and W. A flat table:
  // ranking a thousand shapes simulates every schedule, and a map's lookups were a sixth of that.
  const int parts = schedule.parts();
  const auto entries = static_cast<std::size_t>(3 * std::max(schedule.microbatches, 0) * parts);
  std::vector<double> finished(entries, 0.0);
  std::vector<unsigned char> has_finished(entries, 0);
  const auto index = [&](pass p, int microbatch, int model_part) {
    if (microbatch < 0 || microbatch >= schedule.microbatches)
      throw error(detail::cat("simulate ", schedule.name, ": microbatch ", microbatch, " of ",
                              schedule.microbatches));
    return static_cast<std::size_t>((static_cast<int>(p) * schedule.microbatches + microbatch) * parts + model_part);
  };
  const auto end_of = [&](pass p, int microbatch, int model_part) -> const double* {
    const auto i = index(p, microbatch, model_part);
    return has_finished[i] ? &finished[i] : nullptr;
  };
  const auto finish = [&](pass p, int microbatch, int model_part, double end) {
    const auto i = index(p, microbatch, model_part);
    finished[i] = end;
    has_finished[i] = 1;
  };
  simulation out;
  out.timings.resize(stages);
  std::vector<std::size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0.0);
  const int last_part = schedule.parts() - 1;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < stages; ++s) {
      const auto& items = schedule.per_stage[s];
      for (; next[s] < items.size(); ++next[s]) {
        const work_item& item = items[next[s]];
        const int k = schedule.part(static_cast<int>(s), item.chunk);
        double start = free_at[s];
        bool ready = true;
        const auto after = [&](pass p, int model_part) {
          const double* end = end_of(p, item.microbatch, model_part);
          if (!end) ready = false;
          else start = std::max(start, *end);
        };
        if (item.kind == pass::F) {
          if (k > 0) after(pass::F, k - 1);
        } else if (item.kind == pass::W) {
          after(pass::B, k);
        } else {
          after(pass::F, k);
          if (k < last_part) after(pass::B, k + 1);
        }
        if (!ready) break;
        const double end = start + costs.of(item.kind);
        const pass kind = item.kind == pass::BW ? pass::B : item.kind;
        if (end_of(kind, item.microbatch, k))
          throw error(detail::cat("simulate ", schedule.name, ": stage ", s, " runs ", to_string(item.kind),
                                  " of microbatch ", item.microbatch, " part ", k, " twice"));
        finish(kind, item.microbatch, k, end);
        if (item.kind == pass::BW) finish(pass::W, item.microbatch, k, end);
        out.timings[s].push_back({start, end});
        free_at[s] = end;
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < stages; ++s)
    if (next[s] < schedule.per_stage[s].size()) {
      const work_item& item = schedule.per_stage[s][next[s]];
      throw error(detail::cat("simulate ", schedule.name, ": deadlock, stage ", s, " waits at item ", next[s], " (",
                              to_string(item.kind), " of microbatch ", item.microbatch, " chunk ", item.chunk,
                              ") for a dependency no stage can run"));
    }
  for (std::size_t s = 0; s < stages; ++s) out.makespan = std::max(out.makespan, free_at[s]);
  for (std::size_t s = 0; s < stages; ++s) {
    double busy = 0;
    for (const auto& t : out.timings[s]) busy += t.end - t.start;
    out.idle.push_back(out.makespan - busy);
    out.peak_activations.push_back(peak_activations(schedule.per_stage[s]));
  }
  return out;
}

// Refuses a schedule that cannot run, before anything runs: each stage's list alone (an item
// outside the microbatches or chunks; a B or BW before its F; a W without its B, or after a fused
// BW; a pass run twice or never; a chunk's forwards, or backwards, out of microbatch order, which
// the messages' tags need), then the stages together (simulate: a stage waiting for a pass no stage
// can run). The error names the stage, the item's place in its list, the pass and the microbatch.
// Every rank checks the whole schedule, so every rank refuses it, and none waits for another.
inline void validate(const step_schedule& schedule) {
  const auto where = [&](int stage, std::size_t index, const work_item& item) {
    return detail::cat("pipeline schedule ", schedule.name, ": stage ", stage, " item ", index, " (",
                       to_string(item.kind), " of microbatch ", item.microbatch, " chunk ", item.chunk, ")");
  };
  if (schedule.per_stage.size() != static_cast<std::size_t>(schedule.stages))
    throw error(detail::cat("pipeline schedule ", schedule.name, ": ", schedule.per_stage.size(), " stage lists for ",
                            schedule.stages, " stages"));
  for (int s = 0; s < schedule.stages; ++s) {
    struct seen {
      bool f = false, b = false, bw = false, w = false;
    };
    std::map<std::pair<int, int>, seen> passes;       // by (microbatch, chunk)
    std::map<std::pair<bool, int>, int> last_in_order;  // (forward, chunk): the last microbatch
    const auto& items = schedule.at(s);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const work_item& item = items[i];
      if (item.microbatch < 0 || item.microbatch >= schedule.microbatches || item.chunk < 0 ||
          item.chunk >= schedule.chunks)
        throw error(detail::cat(where(s, i, item), ": outside the step's ", schedule.microbatches, " microbatches and ",
                                schedule.chunks, " chunks"));
      seen& p = passes[{item.microbatch, item.chunk}];
      const bool backward = item.kind == pass::B || item.kind == pass::BW;
      if ((item.kind == pass::F && p.f) || (backward && (p.b || p.bw)) || (item.kind == pass::W && p.w))
        throw error(detail::cat(where(s, i, item), ": runs twice"));
      if (backward && !p.f) throw error(detail::cat(where(s, i, item), ": comes before its F"));
      if (item.kind == pass::W && p.bw)
        throw error(detail::cat(where(s, i, item), ": its backward was fused (BW), which computed the weights' gradients"));
      if (item.kind == pass::W && !p.b) throw error(detail::cat(where(s, i, item), ": comes before its B"));
      if (item.kind != pass::W) {
        const auto at = last_in_order.find({item.kind == pass::F, item.chunk});
        if (at != last_in_order.end() && item.microbatch <= at->second)
          throw error(detail::cat(where(s, i, item), ": comes after microbatch ", at->second,
                                  "'s; a chunk's forwards, and its backwards, go in microbatch order (the messages' "
                                  "tags say only the part)"));
        last_in_order[{item.kind == pass::F, item.chunk}] = item.microbatch;
      }
      p.f |= item.kind == pass::F;
      p.b |= item.kind == pass::B;
      p.bw |= item.kind == pass::BW;
      p.w |= item.kind == pass::W;
    }
    for (int c = 0; c < schedule.chunks; ++c)
      for (int m = 0; m < schedule.microbatches; ++m) {
        const seen p = passes[{m, c}];
        const char* missing = !p.f ? "F" : !(p.b || p.bw) ? "B or BW" : (p.b && !p.w) ? "W" : nullptr;
        if (missing)
          throw error(detail::cat("pipeline schedule ", schedule.name, ": stage ", s, " never runs the ", missing,
                                  " of microbatch ", m, " chunk ", c));
      }
  }
  (void)simulate(schedule);
}

// A picture of the schedule for docs: one row per stage, one cell per time unit with
// F = B = W = 1 per item (so BW spans two cells, both drawn B), the cell the pass letter and the
// microbatch (and, with chunks, the chunk as a letter: a, b, ...), dots where the stage idles.
inline std::string picture(const step_schedule& schedule) {
  const simulation run = simulate(schedule, pass_costs{1, 1, 1});
  const auto units = static_cast<std::size_t>(run.makespan);
  std::vector<std::vector<std::string>> cells(schedule.per_stage.size(), std::vector<std::string>(units));
  std::size_t width = 1;
  for (std::size_t s = 0; s < cells.size(); ++s)
    for (std::size_t i = 0; i < schedule.per_stage[s].size(); ++i) {
      const work_item& item = schedule.per_stage[s][i];
      std::string cell = detail::cat(item.kind == pass::F ? "F" : item.kind == pass::W ? "W" : "B", item.microbatch);
      if (schedule.chunks > 1) cell += static_cast<char>('a' + item.chunk);
      width = std::max(width, cell.size());
      for (auto t = static_cast<std::size_t>(run.timings[s][i].start); t < static_cast<std::size_t>(run.timings[s][i].end); ++t)
        cells[s][t] = cell;
    }
  std::string out;
  for (const auto& row : cells) {
    for (std::size_t t = 0; t < row.size(); ++t) {
      std::string cell = row[t].empty() ? std::string(width, '.') : row[t];
      cell.resize(width, ' ');
      out += cell;
      if (t + 1 < row.size()) out += ' ';
    }
    out += '\n';
  }
  return out;
}

}  // namespace meshtensor::pipeline
