#pragma once
// --plan --pipeline P: the model's blocks split over P pipeline stages of --mesh each, a step of
// --microbatches microbatches of --batch sequences run by --schedule (pipeline/schedules.hpp) on
// planned stages, and each stage's peak per processor reported: its blocks' weights and Adam's
// state, and the activations of the microbatches it holds at once (under 1F1B the first stage holds
// P, the last one). What DeepSeek-V3's published layout (16 stages of [64 x 1] experts and data)
// needs per GPU is that report (docs/scale.md).
//
// Planned only: the stages' processors are not run here (meshtensor-lm runs pipelines and checks
// their plans; tests/mpi/nn_moe_test.routed.cpp runs routed experts in stages against one
// processor). A stage is planned as it would run: the pipeline's own receives, sends and passes
// (pipeline::run on pipeline::stages::planned), the model's blocks built for the stage alone.
#include <algorithm>
#include <map>
#include <tuple>

#include "model.hpp"

namespace pl = meshtensor::pipeline;

// The blocks of stage s of p: as even as can be, the later stages one more (the first holds the
// most microbatches in flight, and the embedding). DeepSeek-V3's 61 over 16: 3, 3, 3, then 4 each.
inline std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t layers, int p, int s) {
  const std::int64_t fewer = p - layers % p, base = layers / p;
  const std::int64_t first = s < fewer ? s * base : fewer * base + (s - fewer) * (base + 1);
  return {first, s < fewer ? base : base + 1};
}

// One stage of the model for pipeline::run: the embedding on the first, the loss on the last
// (every stage's model has a final norm, d_model numbers, which the last one's loss reads).
template <class L, class PL, class C>
struct llama_stage {
  using activation = mt::tensor<C, L, batch, length, d_model>;
  using ids_t = mt::tensor<std::int32_t, L, batch, length>;
  const grid& g;
  model<L, PL>& m;
  const options& o;
  mt::optim::adam& adam;

  typename activation::extents_type extents(int) const { return {o.batch, o.length, o.d_model}; }
  ids_t tokens() const { return ids_t(g, {o.batch, o.length}); }  // planned: no data
  activation forward(int, const activation* in) const {
    return m.through_blocks(in ? *in : m.template embed<C>(tokens()));
  }
  auto loss(int, const activation& y) const {
    return m.next_token_loss(nn::rms_norm<d_model>(y, model<L, PL>::template as<C>(m.final_norm), m.rms_eps), tokens());
  }
  auto params() { return m.tie(); }
  template <class Grads>
  void step_gradients(Grads&& grads) {
    auto p = m.tie();
    adam.step(p, grads);
  }
};

struct stage_plan {
  int stage = 0;
  std::int64_t first_block = 0, blocks = 0, dense = 0;
  int in_flight = 0;
  std::int64_t parameters = 0;  // the stage's, whole (not per processor)
  mt::plan_report report;
};

// Two steps of stage s planned (the second reported, as --plan's: Adam's state made by the first).
template <class L, class PL, class C>
stage_plan plan_stage(const options& o, int s) {
  const int p = o.pipeline;
  const auto [first, count] = stage_blocks(o.layers, p, s);
  options os = o;
  os.layers = count;
  os.dense_blocks = std::clamp<std::int64_t>(o.dense_blocks - first, 0, count);
  auto st = pl::stages<grid>::planned(p, s, {o.mesh[0], o.mesh[1]});
  const stage_part part{.embedding = s == 0 || (s == p - 1 && o.tie_embeddings), .output = s == p - 1};
  model<L, PL> m(st.mesh(), os, true, part);
  mt::optim::adam adam({.lr = o.lr});
  llama_stage<L, PL, C> stage{st.mesh(), m, os, adam};
  const auto schedule = pl::named_schedule(o.schedule, p, static_cast<int>(o.microbatches));
  (void)pl::run(schedule, st, stage);
  mt::reset_plan(st.mesh());
  const auto stats = pl::run(schedule, st, stage);
  std::int64_t n = 0;
  std::apply([&](auto&... w) { (mt::for_each_tensor(w, [&](auto& t) { n += t.size(); }), ...); }, m.tie());
  return {s, first, count, os.experts > 0 ? os.dense_blocks : count, stats.max_in_flight, n, mt::plan_report_of(st.mesh())};
}

// Plans the stages that differ (in blocks, dense blocks, embedding, output layer), each where it
// first occurs: a later stage alike holds no more microbatches in flight. Returns the largest peak.
template <class L, class PL>
std::int64_t plan_pipeline(const options& o, bool print) {
  std::map<std::tuple<std::int64_t, std::int64_t, bool, bool>, int> kinds;  // the first stage of each kind
  for (int s = o.pipeline - 1; s >= 0; --s) {
    const auto [first, count] = stage_blocks(o.layers, o.pipeline, s);
    const std::int64_t dense = std::clamp<std::int64_t>(o.dense_blocks - first, 0, count);
    kinds[{count, dense, s == 0, s == o.pipeline - 1}] = s;
  }
  std::vector<int> planned;
  for (const auto& [kind, s] : kinds) planned.push_back(s);
  std::sort(planned.begin(), planned.end());
  const auto gib = [](std::int64_t bytes) { return bytes / 1073741824.0; };
  if (print)
    fmt::print("one training step of layout {}, {} stages of mesh [{} x {}], schedule {}, {} microbatches of {} sequences, "
               "per processor (the first of each stage):\n",
               o.layout, o.pipeline, o.mesh[0], o.mesh[1], o.schedule, o.microbatches, o.batch);
  std::int64_t largest = 0;
  for (int s : planned) {
    const auto r = o.dtype == "bf16" ? plan_stage<L, PL, mt::bf16>(o, s) : plan_stage<L, PL, float>(o, s);
    largest = std::max(largest, r.report.peak_bytes);
    if (!print) continue;
    const auto& p = r.report;
    fmt::print("  stage {:2d} (blocks {}-{}{}{}{}; {} parameters), {} in flight: peak {:.3f} GiB = parameters {:.3f} + "
               "optimizer state {:.3f} + gradients {:.3f} + activations {:.3f}\n",
               s, r.first_block, r.first_block + r.blocks - 1, o.experts > 0 ? fmt::format(", {} dense", r.dense) : "",
               s == 0 ? ", the embedding" : "", s == o.pipeline - 1 ? ", the output layer" : "", r.parameters, r.in_flight,
               gib(p.peak_bytes), gib(p.peak_bytes_of(mt::memory_kind::parameters)),
               gib(p.peak_bytes_of(mt::memory_kind::optimizer_state)), gib(p.peak_bytes_of(mt::memory_kind::gradients)),
               gib(p.peak_bytes_of(mt::memory_kind::activations)));
  }
  if (print)
    fmt::print("  (stages not listed are like the one listed before them, with fewer microbatches in flight)\n");
  return largest;
}
