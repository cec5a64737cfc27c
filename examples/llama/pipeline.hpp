#pragma once
// --pipeline P: the model's blocks split over P pipeline stages of --mesh each, a step of
// --microbatches M microbatches of --batch sequences each run by --schedule
// (pipeline/schedules.hpp): each stage's model holds its blocks alone (the embedding on the first
// stage, the output layer on the last), its weights drawn as the whole model's (a pipelined run
// trains the model an unpipelined run of M x --batch sequences trains, and gives its losses).
//
// With --plan each stage is planned as it runs (pipeline::run on pipeline::stages::planned: its
// receives, sends and passes, the microbatches it holds in flight): under 1F1B the first stage
// holds P, the last one. DeepSeek-V3's published layout (16 stages of [64 x 1]) is that report
// (docs/scale.md).
#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "model.hpp"

namespace pl = meshtensor::pipeline;

// The blocks of stage s of p: as even as can be, the later stages one more (the first holds the
// most microbatches in flight, and the embedding). DeepSeek-V3's 61 over 16: 3, 3, 3, then 4 each.
inline std::pair<std::int64_t, std::int64_t> stage_blocks(std::int64_t layers, int p, int s) {
  const std::int64_t fewer = p - layers % p, base = layers / p;
  const std::int64_t first = s < fewer ? s * base : fewer * base + (s - fewer) * (base + 1);
  return {first, s < fewer ? base : base + 1};
}

// Stage s's share of the blocks: the first, how many, and how many of them are dense (--dense-blocks
// counts from the model's first block).
struct stage_share {
  std::int64_t first = 0, blocks = 0, dense = 0;
  stage_share(const options& o, int s) {
    std::tie(first, blocks) = stage_blocks(o.layers, o.pipeline, s);
    dense = std::clamp<std::int64_t>(o.dense_blocks - first, 0, blocks);
  }
};

// Stage s's model: its blocks, of which its dense ones, and the balance loss's weight over M (each
// microbatch's loss is its share of the step's: the step's loss is their sum).
template <class L, class PL>
struct stage_model : stage_share {
  options o;
  model<L, PL> m;
  stage_model(const grid& g, const options& whole, int s)
      : stage_share(whole, s),
        o(stage_options(whole, blocks, dense)),
        m(g, o, true,
          {.embedding = s == 0 || (s == whole.pipeline - 1 && whole.tie_embeddings),
           .output = s == whole.pipeline - 1,
           .first_block = first,
           .whole_dense_blocks = whole.dense_blocks}) {}
  static options stage_options(options o, std::int64_t blocks, std::int64_t dense) {
    o.aux_loss /= static_cast<double>(o.microbatches);
    o.layers = blocks;
    o.dense_blocks = dense;
    return o;
  }
};

// One stage of the model for pipeline::run: the embedding on the first, the loss on the last
// (every stage's model has a final norm, d_model numbers, which the last one's loss reads).
template <class L, class PL, class C>
struct llama_stage {
  using activation = mt::tensor<C, L, batch, length, d_model>;
  using ids_t = mt::tensor<std::int32_t, L, batch, length>;
  model<L, PL>& m;
  const options& o;
  mt::optim::adam& adam;
  std::vector<ids_t> ids, labels;  // per microbatch
  double loss_sum = 0;             // the step's, on the last stage

  typename activation::extents_type extents(int) const { return {o.batch, o.length, o.d_model}; }
  activation forward(int mb, const activation* in) const {
    return m.through_blocks(in ? *in : m.template embed<C>(ids[static_cast<std::size_t>(mb)]));
  }
  auto loss(int mb, const activation& y) {
    const auto& l = labels[static_cast<std::size_t>(mb)];
    const auto share = 1.0 / static_cast<double>(o.microbatches);
    typename model<L, PL>::scalar ce(
        m.next_token_loss(nn::rms_norm<d_model>(y, model<L, PL>::template as<C>(m.final_norm), m.rms_eps), l) * share);
    loss_sum += mt::item(ce);  // a plan counts the read's wait for the device
    return ce;
  }
  auto params() { return m.tie(); }
  template <class Grads>
  void step_gradients(Grads&& grads) {
    auto p = m.tie();
    adam.step(p, grads);
  }
};

// After a step's passes: the router's biases moved by the step's loads (each microbatch's, block
// after block, summed: DeepSeek-V3's balancing), and this stage's part of the step's loss (the last
// stage's cross-entropy, every stage's balance losses) over its processors, which hold the same
// scalars: summed over every rank, the step's loss. The same in a plan (its reads counted).
template <class L, class PL, class C>
double finish_step(llama_stage<L, PL, C>& stage, const options& o, bool last, std::int64_t step) {
  auto& m = stage.m;
  const std::size_t routed_blocks = m.router_bias.size();
  if (m.last_loads.size() != routed_blocks * static_cast<std::size_t>(o.microbatches))
    throw mt::error(fmt::format("step {}: {} experts' loads kept for {} blocks and {} microbatches", step + 1,
                                m.last_loads.size(), routed_blocks, o.microbatches));
  if (o.router_bias_rate > 0)
    for (std::size_t b = 0; b < routed_blocks; ++b) {
      auto load = m.last_loads[b];
      for (std::size_t k = 1; k < static_cast<std::size_t>(o.microbatches); ++k)
        load = decltype(load)(load + m.last_loads[k * routed_blocks + b]);
      nn::update_router_bias(m.router_bias[b], load, o.router_bias_rate);
    }
  const double part = (last ? stage.loss_sum : 0.0) + (m.last_aux_loss ? mt::item(*m.last_aux_loss) : 0.0);
  return part / static_cast<double>(o.mesh[0] * o.mesh[1]);
}

// Before a step's passes: its microbatches' token ids and labels, the kept loads and losses cleared.
template <class L, class PL, class C>
void start_step(llama_stage<L, PL, C>& stage, std::vector<typename llama_stage<L, PL, C>::ids_t> ids,
                std::vector<typename llama_stage<L, PL, C>::ids_t> labels) {
  stage.ids = std::move(ids);
  stage.labels = std::move(labels);
  stage.m.last_loads.clear();
  stage.m.last_aux_loss.reset();
  stage.loss_sum = 0;
}

struct stage_plan {
  stage_share share;
  int in_flight = 0;
  std::int64_t parameters = 0;  // the stage's, whole (not per processor)
  mt::plan_report report;
};

// Stage st.index() planned for `steps` steps, the last reported (--plan: two, Adam's state made by
// the first; --check-plan: one, as it ran).
template <class L, class PL, class C>
stage_plan plan_stage(const options& o, pl::stages<grid>& st, int steps) {
  const int s = st.index();
  stage_model<L, PL> sm(st.mesh(), o, s);
  mt::optim::adam adam({.lr = o.lr});
  llama_stage<L, PL, C> stage{sm.m, sm.o, adam};
  using ids_t = typename llama_stage<L, PL, C>::ids_t;
  const auto schedule = pl::named_schedule(o.schedule, o.pipeline, static_cast<int>(o.microbatches));
  pl::stage_stats stats;
  const std::vector<std::int32_t> no_data(static_cast<std::size_t>(o.batch * o.length));  // a plan reads none
  for (int step = 0; step < steps; ++step) {
    if (step + 1 == steps) mt::reset_plan(st.mesh());
    std::vector<ids_t> ids, labels;
    for (std::int64_t mb = 0; mb < o.microbatches; ++mb) {  // made as a run makes them
      ids.push_back(mt::from_host<ids_t>(st.mesh(), {o.batch, o.length}, no_data));
      labels.push_back(mt::from_host<ids_t>(st.mesh(), {o.batch, o.length}, no_data));
    }
    start_step(stage, std::move(ids), std::move(labels));
    stats = pl::run(schedule, st, stage);
    (void)finish_step(stage, sm.o, st.last(), step);
  }
  return {sm, stats.max_in_flight, sm.m.parameter_count(), mt::plan_report_of(st.mesh())};
}

// Plans the stages that differ (in blocks, dense blocks, embedding, output layer), each where it
// first occurs: a later stage alike holds no more microbatches in flight. Returns the largest peak.
template <class L, class PL>
std::int64_t plan_pipeline(const options& o, bool print) {
  std::map<std::tuple<std::int64_t, std::int64_t, bool, bool>, int> kinds;  // the first stage of each kind
  for (int s = o.pipeline - 1; s >= 0; --s) {
    const stage_share share(o, s);
    kinds[{share.blocks, share.dense, s == 0, s == o.pipeline - 1}] = s;
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
    auto st = pl::stages<grid>::planned(o.pipeline, s, {o.mesh[0], o.mesh[1]});
    const auto r = o.dtype == "bf16" ? plan_stage<L, PL, mt::bf16>(o, st, 2) : plan_stage<L, PL, float>(o, st, 2);
    largest = std::max(largest, r.report.peak_bytes);
    if (!print) continue;
    const auto& p = r.report;
    fmt::print("  stage {:2d} (blocks {}-{}{}{}{}; {} parameters), {} in flight: peak {:.3f} GiB = parameters {:.3f} + "
               "optimizer state {:.3f} + gradients {:.3f} + activations {:.3f}\n",
               s, r.share.first, r.share.first + r.share.blocks - 1, o.experts > 0 ? fmt::format(", {} dense", r.share.dense) : "",
               s == 0 ? ", the embedding" : "", s == o.pipeline - 1 ? ", the output layer" : "", r.parameters, r.in_flight,
               gib(p.peak_bytes), gib(p.peak_bytes_of(mt::memory_kind::parameters)),
               gib(p.peak_bytes_of(mt::memory_kind::optimizer_state)), gib(p.peak_bytes_of(mt::memory_kind::gradients)),
               gib(p.peak_bytes_of(mt::memory_kind::activations)));
  }
  if (print)
    fmt::print("  (stages not listed are like the one listed before them, with fewer microbatches in flight)\n");
  return largest;
}

struct pipeline_run {
  std::int64_t first_step = 0;  // the step resumed from (--resume), else 0
  std::vector<double> losses;   // every step's since, on every rank
  std::int64_t parameter_bytes = 0, optimizer_state_bytes = 0;  // this processor's
};

// Trains on st's ranks; every step's loss is the last stage's cross-entropy plus every stage's
// balance losses, as an unpipelined run reports it. Checkpoints (--save-every, --resume): one for
// the whole pipeline, a shard per stage (checkpoints::save_shard), each tensor under its name in
// the whole model; a pipeline resumes one of as many stages (the stand-ins are each stage's own).
template <class L, class PL, class C>
pipeline_run train_pipeline(pl::stages<grid>& st, const options& o, const std::vector<unsigned char>& text, bool root) {
  const grid& g = st.mesh();
  stage_model<L, PL> sm(g, o, st.index());
  mt::optim::adam adam({.lr = o.lr});
  llama_stage<L, PL, C> stage{sm.m, sm.o, adam};
  using ids_t = typename llama_stage<L, PL, C>::ids_t;
  const auto schedule = pl::named_schedule(o.schedule, o.pipeline, static_cast<int>(o.microbatches));
  std::mt19937_64 rng(7);  // the batches of an unpipelined run of microbatches x batch sequences
  std::uniform_int_distribution<std::int64_t> start(0, static_cast<std::int64_t>(text.size()) - o.length - 2);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(o.batch * o.length)), labels(ids.size());
  const auto state = [&] { return sm.m.checkpoint_state(adam, sm.m.tie()); };
  // What the data stream and the stages' shards depend on: a resumed run must match them.
  const mt::io::metadata config{{"batch", std::to_string(o.batch)}, {"length", std::to_string(o.length)},
                                {"text", o.text}, {"microbatches", std::to_string(o.microbatches)},
                                {"pipeline", std::to_string(o.pipeline)}};
  pipeline_run run;
  if (!o.resume.empty()) {
    const mt::io::checkpoints saved(o.resume);
    mt::io::tensor_set none;  // the metadata first: another pipeline's stages hold other tensors
    run.first_step = resumed_step(saved.load(none, g.communicator().cart()), config, o.resume);
    auto set = state();
    (void)saved.load(set);
    adam.set_steps(run.first_step);
    for (std::int64_t k = 0; k < run.first_step * o.microbatches * o.batch; ++k) (void)start(rng);  // drawn before
  }
  for (std::int64_t step = run.first_step; step < o.steps; ++step) {
    std::vector<ids_t> step_ids, step_labels;
    for (std::int64_t mb = 0; mb < o.microbatches; ++mb) {
      for (std::int64_t b = 0; b < o.batch; ++b)
        for (std::int64_t s = start(rng), p = 0; p < o.length; ++p) {
          ids[b * o.length + p] = static_cast<std::int32_t>(text[s + p] % o.vocab);
          labels[b * o.length + p] = static_cast<std::int32_t>(text[s + p + 1] % o.vocab);
        }
      step_ids.push_back(mt::from_host<ids_t>(g, {o.batch, o.length}, ids));
      step_labels.push_back(mt::from_host<ids_t>(g, {o.batch, o.length}, labels));
    }
    start_step(stage, std::move(step_ids), std::move(step_labels));
    (void)pl::run(schedule, st, stage);
    const double part = finish_step(stage, sm.o, st.last(), step);
    double loss = 0;
    MPI_Allreduce(&part, &loss, 1, MPI_DOUBLE, MPI_SUM, st.whole());
    run.losses.push_back(loss);
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) {
      auto meta = config;
      meta["step"] = std::to_string(step + 1);
      const auto name =
          mt::io::checkpoints(o.checkpoint).save_shard(state(), st.index(), o.pipeline, st.whole(), step + 1, meta);
      if (root) fmt::print("saved {}/{}\n", o.checkpoint, name);
    }
    if (root && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      fmt::print("step {:5d}  loss {:.4f}\n", step + 1, loss);
      std::fflush(stdout);
    }
  }
  run.parameter_bytes = sm.m.parameter_bytes();
  run.optimizer_state_bytes = adam.state_bytes(sm.m.tie());
  return run;
}

// --check-plan --pipeline P: one step run on the world's ranks, then this rank's stage planned at
// its coordinates; on every rank of every stage the planned collectives and sends, parameter and
// Adam bytes equal the run's, and the planned peak lies within --memory-tolerance of the measured.
template <class L, class PL, class C>
int check_pipeline(options o, const std::vector<unsigned char>& text, bool root) {
  o.steps = 1;
  o.save_every = 0;  // the step alone, as the unpipelined check
  pl::stages<grid> st(MPI_COMM_WORLD, o.pipeline, {o.mesh[0], o.mesh[1]});
  const grid& g = st.mesh();
  g.reset_counters();
  const std::int64_t before = mt::memory_stats().bytes_in_use;
  mt::reset_peak_memory();
  const std::int64_t waits_before = mt::host_waits();
  const auto real = train_pipeline<L, PL, C>(st, o, text, false);
  const std::int64_t waits = mt::host_waits() - waits_before;
  const std::int64_t measured = mt::memory_stats().peak_bytes_in_use - before;
  const mt::comm_counters counted = g.counters();
  auto planned = pl::stages<grid>::planned(o.pipeline, st.index(), {o.mesh[0], o.mesh[1]},
                                           {g.template coord<rows>(), g.template coord<cols>()});
  const auto p = plan_stage<L, PL, C>(o, planned, 1).report;
  const auto v = mt::agree_on_plan(st.whole(), g, counted, p, real.parameter_bytes, real.optimizer_state_bytes, waits);
  if (!v.differences.empty()) fmt::print("stage {} rank {}: {}", st.index(), g.rank(), v.differences);
  const auto memory = mt::agree_on_peak(st.whole(), p.peak_bytes, measured, o.memory_tolerance);
  if (root) {
    fmt::print("check-plan (layout {}, {}, {} stages of mesh {}, schedule {}): {}; rank 0 sent {} bytes in {} collectives "
               "and sends\n",
               o.layout, o.dtype, o.pipeline, g.shape().to_string(), o.schedule,
               v.equal_everywhere ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS", v.bytes, v.calls);
    std::fflush(stdout);
    memory.print("rank 0's", p.peak_bytes, measured, o.memory_tolerance);
  }
  return v.equal_everywhere && memory.close ? 0 : 3;
}
