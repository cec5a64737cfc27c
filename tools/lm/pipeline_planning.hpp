#pragma once
// meshtensor-lm's pipeline planning: --plan --pipeline (each stage planned, the step predicted from
// the schedule) and --rank-pipeline (the pipeline shapes of a mesh ranked by predicted step time).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <meshtensor/plan/cost_model.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "training.hpp"

// Bytes as GiB, three decimals.
inline std::string gib(std::int64_t bytes) { return fmt::format("{:g} GiB", std::round(bytes / 1073741824.0 * 1000) / 1000); }

// --plan --pipeline P: one planned step per stage (its first processor), side by side. Stages that
// hold the same (first, last, number of blocks, microbatches held at once) plan alike and are
// planned once. With 1F1B stage s holds at most P - s microbatches, so that many of them plan its
// memory exactly (GPipe: all m are planned).
// With --calibration: each stage's step time from two more plans, of a and 2a microbatches (a = 1,
// or P for interleaved, whose microbatches go in groups of P; twice that with the gradient
// reduction overlapped), t(m) = t_fixed + m t_microbatch
// (t_fixed: the weights' gradient reduction and the optimizer), and the step's: the schedule
// simulated (pipeline/schedules.hpp) with the slowest stage's microbatch time split into forward,
// input gradient and weight gradient by their FLOPs, per chunk, plus the largest t_fixed. For
// gpipe and 1f1b that is (m + P - 1) max t_microbatch + max t_fixed.
namespace pipeline_planning {
struct stage_plan {
  pipeline_result full;  // memory
  double t_fixed = 0, t_microbatch = 0;
  double share_forward = 1, share_input_grad = 0, share_weight_grad = 0;  // of a microbatch's FLOPs
  mt::step_time microbatch, fixed;  // by part
  std::int64_t bytes_fixed = 0, bytes_microbatch = 0, flops_fixed = 0, flops_microbatch = 0;
};
struct estimate {
  std::map<std::tuple<bool, bool, std::int64_t, int>, stage_plan> alike;
  std::vector<const stage_plan*> per_stage;
  std::int64_t parameters = 0, peak_bytes = 0;
  const stage_plan* slowest = nullptr;  // by microbatch time
  double step_seconds = 0;
  mt::step_time step;  // by part: the simulated slots times the slowest microbatch's, plus the largest fixed part
  double slots = 0;     // the simulated step in the slowest stage's microbatch times ((m + p - 1) for 1f1b)
};

inline estimate plan_stages(options o, const mt::machine_calibration* calibration) {
  namespace pl = mt::pipeline;
  o.steps = 2;
  const std::vector<unsigned char> text(static_cast<std::size_t>(o.length + 3), ' ');
  const int m = o.microbatches;
  const std::int64_t rows_per = o.batch / m;
  const auto plan_with = [&](int s, int microbatches) {
    options om = o;
    om.microbatches = microbatches;
    om.batch = rows_per * microbatches;
    return train_pipelined(pl::stages<grid>::planned(o.pipeline, s, {o.mesh[0], o.mesh[1]}), om, text);
  };
  const auto total_bytes = [](const mt::plan_report& r) {
    std::int64_t b = 0;
    for (const auto& [k, n] : r.totals) b += n.bytes;
    return b;
  };
  const auto minus = [](const mt::step_time& a, const mt::step_time& b, double times = 1) {
    return mt::step_time{a.kernels - times * b.kernels, a.memory - times * b.memory, a.products - times * b.products,
                         a.communication - times * b.communication, a.hidden - times * b.hidden};
  };
  const auto scaled = [](const mt::step_time& a, double by) {
    return mt::step_time{a.kernels * by, a.memory * by, a.products * by, a.communication * by, a.hidden * by};
  };
  // A stage's microbatch costs depend on what it holds (the model's input, its loss, how many
  // blocks); its memory also on how many chunk activations its order holds at the peak. Stages
  // alike in both plan once. Gpipe plans all m microbatches; the other schedules the fewest
  // microbatches whose order holds the stage's peak (1f1b: min(m, p - s) on stage s; microbatches
  // in groups of p for interleaved: the cost plans take p and 2p).
  const auto schedule = pl::named_schedule(o.schedule, o.pipeline, m, o.chunks);
  const int group = o.schedule == "interleaved" ? o.pipeline : 1;
  const auto shape_of = [&](int s) {
    bool input = false, loss = false;
    std::int64_t blocks = 0;
    const std::int64_t parts = schedule.parts();
    for (int c = 0; c < schedule.chunks; ++c) {
      const std::int64_t k = schedule.part(s, c);
      input = input || k == 0;
      loss = loss || k == parts - 1;
      blocks += o.layers * (k + 1) / parts - o.layers * k / parts;
    }
    return std::make_tuple(input, loss, blocks);
  };
  const auto microbatches_for_peak = [&](int s) {
    if (o.schedule == "gpipe") return m;
    const int peak = pl::peak_activations(schedule.at(s));
    for (int few = group; few < m; few += group)
      if (pl::peak_activations(pl::named_schedule(o.schedule, o.pipeline, few, o.chunks).at(s)) == peak) return few;
    return m;
  };
  // A microbatch's bytes, FLOPs (by pass) and time on stage s: what plans of a and 2a microbatches
  // differ by.
  const auto cost_of = [&](int s) {
    stage_plan sp;
    // With the gradient reduction overlapped, what it leaves exposed depends on the last backward
    // pass, which accumulates (and so costs less) from the second microbatch on: plans of 2 and 4
    // groups, so that both have such a last pass and t(m) holds for every m >= 2.
    const int a = group * (mt::gradient_reduction_settings().overlap ? 2 : 1);
    const auto one = plan_with(s, a), two = plan_with(s, 2 * a);
    sp.bytes_microbatch = (total_bytes(*two.plan) - total_bytes(*one.plan)) / a;
    sp.bytes_fixed = total_bytes(*one.plan) - a * sp.bytes_microbatch;
    sp.flops_microbatch = (two.plan->total_flops - one.plan->total_flops) / a;
    sp.flops_fixed = one.plan->total_flops - a * sp.flops_microbatch;
    std::map<std::string, std::int64_t> per_op;
    for (const auto& row : two.plan->flops) per_op[row.op] += row.flops;
    for (const auto& row : one.plan->flops) per_op[row.op] -= row.flops;
    double f = 0, b = 0, w = 0;
    for (const auto& [op, flops] : per_op) {
      const bool backward = op.ends_with(" (backward)") || op.ends_with(" (recompute)");
      (backward ? b : op.ends_with(" (weight gradient)") ? w : f) += static_cast<double>(flops);
    }
    if (f + b + w > 0) {
      sp.share_forward = f / (f + b + w);
      sp.share_input_grad = b / (f + b + w);
      sp.share_weight_grad = w / (f + b + w);
    }
    if (calibration) {
      const auto p1 = mt::predict(*one.plan, *calibration), p2 = mt::predict(*two.plan, *calibration);
      sp.microbatch = scaled(minus(p2, p1), 1.0 / a);
      sp.fixed = minus(p1, sp.microbatch, a);
      sp.t_microbatch = sp.microbatch.total();
      sp.t_fixed = sp.fixed.total();
    }
    return sp;
  };
  std::map<std::tuple<bool, bool, std::int64_t>, stage_plan> costs;
  estimate e;
  for (int s = 0; s < o.pipeline; ++s) {
    const auto shape = shape_of(s);
    const auto [input, loss, blocks] = shape;
    // The count held is part of the key: under 1f1b stage s holds p - s microbatches, so stages of
    // the same blocks differ in memory (one plan for stages 1 to p - 2 showed stage 1's on all).
    const auto key = std::make_tuple(input, loss, blocks, pl::peak_activations(schedule.at(s)));
    auto it = e.alike.find(key);
    if (it == e.alike.end()) {
      auto cost = costs.find(shape);
      if (cost == costs.end()) cost = costs.emplace(shape, cost_of(s)).first;
      stage_plan sp = cost->second;
      sp.full = plan_with(s, microbatches_for_peak(s));
      it = e.alike.emplace(key, std::move(sp)).first;
    }
    e.per_stage.push_back(&it->second);
    e.parameters += it->second.full.parameters;
    e.peak_bytes = std::max(e.peak_bytes, it->second.full.plan->peak_bytes);
    if (!e.slowest || it->second.t_microbatch > e.slowest->t_microbatch) e.slowest = &it->second;
  }
  if (calibration) {
    const auto* fixed = e.per_stage[0];
    for (const auto* sp : e.per_stage)
      if (sp->t_fixed > fixed->t_fixed) fixed = sp;
    // The slowest stage's microbatch split over its chunks and passes, the schedule simulated in
    // units of that microbatch's time.
    const auto& slow = *e.slowest;
    const double v = o.chunks;
    const auto sim = mt::pipeline::simulate(mt::pipeline::named_schedule(o.schedule, o.pipeline, m, o.chunks),
                                            {slow.share_forward / v, slow.share_input_grad / v, slow.share_weight_grad / v});
    const double slots = sim.makespan;
    e.slots = slots;
    const auto& mb = slow.microbatch;
    e.step = {slots * mb.kernels + fixed->fixed.kernels, slots * mb.memory + fixed->fixed.memory,
              slots * mb.products + fixed->fixed.products, slots * mb.communication + fixed->fixed.communication,
              slots * mb.hidden + fixed->fixed.hidden};
    e.step_seconds = e.step.total();
  }
  return e;
}
}  // namespace pipeline_planning

// --plan --pipeline P: one planned step per stage (its first processor), side by side; stages alike
// are planned once (plan_stages). With --calibration, the step time predicted by simulating the
// schedule with the slowest stage's costs (plan_stages).
inline int plan_pipeline(const mt::environment& env, const options& o) {
  namespace pl = mt::pipeline;
  if (env.world_rank() != 0) return 0;
  std::optional<mt::machine_calibration> calibration;
  if (!o.calibration.empty()) calibration = mt::machine_calibration::load(o.calibration);
  const auto e = pipeline_planning::plan_stages(o, calibration ? &*calibration : nullptr);
  const int m = o.microbatches;
  std::printf("planned --pipeline %d, schedule %s, %d microbatches of %lld, stage mesh [rows=%d x cols=%d], %s: "
              "%lld parameters (%.2f billion); %zu stages planned (the others hold alike)\n",
              o.pipeline, o.schedule.c_str(), m, (long long)(o.batch / m), o.mesh[0], o.mesh[1], o.dtype.c_str(),
              (long long)e.parameters, e.parameters / 1e9, e.alike.size());
  std::printf("%6s %8s %14s %14s %14s %14s %16s%s\n", "stage", "held", "parameters", "optimizer", "activations", "peak",
              "bytes/step", calibration ? "  step ms: microbatch, fixed" : "");
  std::string json = "[";
  for (int s = 0; s < o.pipeline; ++s) {
    const auto& sp = *e.per_stage[static_cast<std::size_t>(s)];
    const auto& p = *sp.full.plan;
    const int held = pl::peak_activations(pl::named_schedule(o.schedule, o.pipeline, m, o.chunks).at(s));
    const std::int64_t bytes = sp.bytes_fixed + m * sp.bytes_microbatch;
    std::printf("%6d %8d %14s %14s %14s %14s %16lld", s, held, gib(p.bytes_of(mt::memory_kind::parameters)).c_str(),
                gib(p.bytes_of(mt::memory_kind::optimizer_state)).c_str(),
                gib(p.peak_bytes_of(mt::memory_kind::activations)).c_str(), gib(p.peak_bytes).c_str(), (long long)bytes);
    if (calibration) std::printf("  %10.3f %10.3f", 1e3 * sp.t_microbatch, 1e3 * sp.t_fixed);
    std::printf("\n");
    json += fmt::format("{}{{\"stage\": {}, \"held\": {}, \"parameters\": {}, \"bytes_per_step\": {}, "
                        "\"flops_per_step\": {}, \"seconds_per_microbatch\": {:g}, \"seconds_fixed\": {:g}, "
                        "\"hidden_fixed_seconds\": {:g}, "
                        "\"microbatch_seconds\": {{\"kernels\": {:g}, \"memory\": {:g}, \"products\": {:g}, "
                        "\"communication\": {:g}}}, \"plan\": {}}}",
                        s ? ", " : "", s, held, sp.full.parameters, bytes, sp.flops_fixed + m * sp.flops_microbatch,
                        sp.t_microbatch, sp.t_fixed, sp.fixed.hidden, sp.microbatch.kernels, sp.microbatch.memory, sp.microbatch.products,
                        sp.microbatch.communication, p.json());
  }
  json += "]";
  if (calibration) {
    std::printf("predicted step time %.3f s = %.2f x %.3f ms + %.3f ms (the schedule's simulated slots ((m + p - 1) for "
                "1f1b) x the slowest stage's microbatch + the largest fixed part; calibration %s)\n",
                e.step_seconds, e.slots, 1e3 * e.slowest->t_microbatch,
                1e3 * (e.step_seconds - e.slots * e.slowest->t_microbatch),
                o.calibration.c_str());
    std::printf("the slowest stage's microbatch: %s\n", mt::to_string(e.slowest->microbatch).c_str());
  }
  if (!o.plan_json.empty()) {
    std::ofstream out(o.plan_json);
    out << "{\"pipeline\": " << o.pipeline << ", \"microbatches\": " << m << ", \"schedule\": \"" << o.schedule
        << "\", \"chunks\": " << o.chunks << ", \"slots\": " << e.slots << ", \"dtype\": \"" << o.dtype << "\", \"layers\": " << o.layers << ", \"d_model\": " << o.d_model
        << ", \"batch\": " << o.batch << ", \"length\": " << o.length << ", \"parameters\": " << e.parameters
        << ", \"predicted_step_seconds\": " << e.step_seconds << ", \"stages\": " << json << "}\n";
    if (!out) throw mt::io_error(fmt::format("cannot write '{}'", o.plan_json));
    std::printf("plan written to %s\n", o.plan_json.c_str());
  }
  return 0;
}

// --rank-layouts --processors N: every way of running the model on N processors as P pipeline
// stages of [rows x cols] (the 2d layout inside each: data parallelism over rows, model parallelism
// over cols), P a divisor of N up to the layers, microbatches of --microbatch-rows rows per
// data-parallel processor (P = 1: the whole batch at once), ranked by predicted step time among those
// whose largest stage fits the budget. With --rank-schedules each pipelined shape is ranked under
// every schedule as well (interleaved with the chunks, 2 to 4, that fit the layers and whose
// microbatches come in groups of P): the schedules trade idle time for memory (zb-h1's last stages
// hold what their deferred weight gradients read; interleaved holds more chunk activations).
inline int rank_pipeline_shapes(const mt::environment& env, const options& o) {
  if (o.calibration.empty()) throw mt::error("--rank-layouts needs --calibration FILE (bench_calibrate writes one)");
  if (env.world_rank() != 0) return 0;
  const auto c = mt::machine_calibration::load(o.calibration);
  std::vector<mt::layout_candidate> candidates;
  int skipped = 0;
  for (int p = 1; p <= o.processors; ++p) {
    if (o.processors % p != 0 || p > o.layers) continue;
    for (int cols = 1; cols <= o.processors / p; ++cols) {
      if (o.processors / p % cols != 0) continue;
      const int rows = o.processors / p / cols;
      options oc = o;
      oc.pipeline = p;
      oc.mesh = {rows, cols};
      const std::int64_t per_microbatch = std::int64_t{rows} * o.microbatch_rows;
      if (p > 1 && o.batch % per_microbatch != 0) {
        ++skipped;  // the batch does not divide into microbatches of this many rows
        continue;
      }
      oc.microbatches = p == 1 ? 1 : static_cast<int>(o.batch / per_microbatch);
      std::vector<std::pair<std::string, int>> schedules{{o.schedule, o.chunks}};
      if (o.rank_schedules && p > 1) {
        schedules = {{"1f1b", 1}, {"zb-h1", 1}};
        if (2 * p <= o.layers) schedules.emplace_back("zb-v", 2);
        for (int v = 2; v <= 4 && v * p <= o.layers; ++v)
          if (oc.microbatches % p == 0) schedules.emplace_back("interleaved", v);
      }
      for (const auto& [schedule, chunks] : schedules) {
        oc.schedule = schedule;
        oc.chunks = chunks;
        const auto e = pipeline_planning::plan_stages(oc, &c);
        mt::plan_report peak = *e.per_stage[0]->full.plan;
        for (const auto* sp : e.per_stage)
          if (sp->full.plan->peak_bytes > peak.peak_bytes) peak = *sp->full.plan;
        std::string name = fmt::format("--pipeline {} --mesh {} {} --microbatches {}", p, rows, cols, oc.microbatches);
        if (o.rank_schedules && p > 1)
          name += fmt::format(" --schedule {}{}", schedule,
                              schedule == "interleaved" ? fmt::format(" --chunks {}", chunks) : "");
        candidates.push_back({name, peak, e.step, true});
      }
    }
  }
  if (candidates.empty())
    throw mt::error(fmt::format("--rank-layouts --processors {}: no shape divides --batch {} into microbatches of "
                                "--microbatch-rows {} per row", o.processors, o.batch, o.microbatch_rows));
  const std::int64_t budget = static_cast<std::int64_t>(o.memory_budget_gib * 1073741824.0);
  const auto ranked = mt::rank_layouts(candidates, budget);
  std::printf("%d processors as stages x [rows x cols], schedule %s, %s, calibration %s, budget %s per processor "
              "(peak: the largest stage's):\n",
              o.processors, o.rank_schedules ? "each" : o.schedule.c_str(), o.dtype.c_str(), o.calibration.c_str(),
              fmt::format("{:g} GiB", o.memory_budget_gib).c_str());
  std::printf("%s", mt::ranking_table(ranked).c_str());
  if (skipped) std::printf("(%d shapes left out: their rows do not divide --batch into whole microbatches)\n", skipped);
  const auto& best = ranked[0];
  std::printf("best: %s (%s)\n", best.name.c_str(),
              best.fits ? fmt::format("fits; {}", mt::to_string(best.time)).c_str() : "NONE FITS: the smallest peak");
  return 0;
}
