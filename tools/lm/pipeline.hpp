#pragma once
// --pipeline P: the blocks split over P stages (pipeline/stages.hpp), each stage a [rows x cols]
// mesh computing under a layout L: layout_2d (data parallelism over rows, model parallelism over
// cols: a 3-D mesh [stage x rows x cols]), or with --layout context or 2d_context that layout
// (context parallelism inside each stage, the blocks' attention as --attention says). pipeline.cpp
// instantiates the stages of layout_2d, pipeline_context.cpp those of the two context layouts (one
// TU with MESHTENSOR_LAYOUT_UNITY). The model is cut into P v parts (v = --chunks: 2 for zb-v, 1 but for interleaved)
// and stage s holds the parts the schedule gives it (pipeline/schedules.hpp: chunk c
// is part c P + s, or the V of zb-v); part k holds blocks [k L / (P v), (k + 1) L / (P v)), part 0
// also the embedding and positions, the last part the final layer norm and the output projection.
// A step splits the batch into --microbatches microbatches and runs them as --schedule says.
// Weights are drawn with the seeds model<L> gives them, so the pipelined model is the unpipelined
// one: --check-pipeline trains both on each stage's mesh and compares losses and gradients.
#include <mpi.h>
#include <fmt/core.h>

#include "training.hpp"

// The stages of the context layouts (pipeline_context.cpp), and of layout_2d with
// --sequence-parallel (pipeline_sp.cpp).
pipeline_result train_pipelined_context(const mt::pipeline::stages<grid>& st, const options& o,
                                        const std::vector<unsigned char>& text);
pipeline_result train_pipelined_sequence_parallel(const mt::pipeline::stages<grid>& st, const options& o,
                                                  const std::vector<unsigned char>& text);

namespace lm_pipeline {

namespace pl = meshtensor::pipeline;

// C: the element type of activations and products (float, or bf16 with --dtype bf16: a bf16 copy
// of each float weight per step, whose gradient flows back to the float weight, as model<L>
// computes). A: the layout of the residual stream between the blocks and between the stages: L, or
// with --sequence-parallel sequence_layout<L> (length split over the axes of heads and d_ff; the
// blocks are sequence_parallel_block, and a stage sends its neighbour 1/P of the activation).
template <class L, class C, class A = L>
struct pipeline_stage {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  template <class... D>
  using some = std::vector<t<D...>>;  // a stage's tensors of one kind: per block, or none or one
  using activation = mt::tensor<C, A, batch, length, d_model>;
  using whole_activation = mt::tensor<C, L, batch, length, d_model>;  // the products' operand
  static constexpr bool sequence_parallel = !std::is_same_v<A, L>;
  const pl::stages<grid>& st;
  const options& o;
  const pl::step_schedule& schedule;
  // Per chunk: its blocks [first, end) and where they start in the block vectors below.
  std::vector<std::int64_t> chunk_first, chunk_end;
  std::vector<std::size_t> chunk_offset;
  std::vector<std::int64_t> block_ids;  // the model's block of each entry of the block vectors
  bool holds_input = false, holds_loss = false;  // parts 0 and P v - 1
  some<vocab, d_model> embedding;
  some<length, d_model> positions;
  block_params<some> blocks;
  some<d_model> lnf_scale, lnf_bias;
  some<d_model, vocab> softmax_weights;
  // The step's microbatches, and its number.
  std::vector<t<batch, length>> ids, labels;
  std::uint64_t step = 0;
  mutable double step_loss = 0;  // the last stage's: the step's loss, summed from the microbatches'
  // A value per tensor of params(): the step's gradients.
  using grads_type = decltype(std::tuple_cat(
      std::declval<std::tuple<some<vocab, d_model>, some<length, d_model>>>(),
      std::declval<typename values_of<decltype(std::declval<block_params<some>&>().tie())>::type>(),
      std::declval<std::tuple<some<d_model>, some<d_model>, some<d_model, vocab>>>()));
  std::optional<grads_type> grads;  // this step's, summed over its microbatches

  auto params() {
    return std::tuple_cat(std::tie(embedding, positions), blocks.tie(), std::tie(lnf_scale, lnf_bias, softmax_weights));
  }

  pipeline_stage(const pl::stages<grid>& s, const options& opt, const pl::step_schedule& sch)
      : st(s), o(opt), schedule(sch) {
    const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);
    const grid& g = st.mesh();
    const std::int64_t parts = schedule.parts();
    for (int c = 0; c < schedule.chunks; ++c) {
      const std::int64_t k = schedule.part(st.index(), c);
      holds_input = holds_input || k == 0;
      holds_loss = holds_loss || k == parts - 1;
      chunk_first.push_back(o.layers * k / parts);
      chunk_end.push_back(o.layers * (k + 1) / parts);
      chunk_offset.push_back(block_ids.size());
      for (std::int64_t b = chunk_first.back(); b < chunk_end.back(); ++b) block_ids.push_back(b);
    }
    // model<L>'s seeds: embedding, positions, then six per block (push_block), then the output
    // projection.
    const std::uint64_t s0 = o.seed * 1000;
    const std::int64_t dm = o.d_model;
    if (holds_input) {
      embedding.push_back(mt::random_normal<t<vocab, d_model>>(g, {o.vocab, dm}, s0, 0, 0.3));
      positions.push_back(mt::random_normal<t<length, d_model>>(g, {o.length, dm}, s0 + 1, 0, 0.1));
    }
    for (std::int64_t b : block_ids)
      push_block(g, o, b, blocks);
    if (holds_loss) {
      lnf_scale.push_back(mt::full<t<d_model>>(g, {dm}, 1.0f));
      lnf_bias.push_back(mt::zeros<t<d_model>>(g, {dm}));
      softmax_weights.push_back(nn::normal_fan_in<t<d_model, vocab>, d_model>(g, {dm, o.vocab}, softmax_seed(o)));
    }
    for_each_param_tensor(params(), [](std::size_t, auto& p) { p.requires_grad(); });
  }

  activation::extents_type extents(int) const { return {o.batch / o.microbatches, o.length, o.d_model}; }

  template <class P>
  static auto as_c(const P& p) {
    if constexpr (std::is_same_v<C, float>) return p;
    else return mt::cast<C>(p);
  }

  // A block's weights in C: with bf16, one working copy per step, made at the step's first forward
  // pass and shared by its microbatches (Megatron's bf16 weights), counted as parameters, not as a
  // microbatch's activations: a copy per microbatch, which each microbatch's products kept until its
  // backward pass, was p copies on the first stage of a 1F1B pipeline. Every microbatch's gradient
  // reaches the float weight through the copy's cast, as before.
  template <class Blocks>
  static auto weights_in_c(const Blocks& w, std::size_t j) {
    return w.at(j, [](const auto& p) { return as_c(p); });
  }
  using block_weights = decltype(weights_in_c(std::declval<const block_params<some>&>(), 0));
  mutable std::vector<block_weights> working;  // this step's; emptied when a step starts
  const block_weights& weights_of(std::size_t k) const {
    if (working.empty()) {
      const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);
      for (std::size_t j = 0; j < blocks.count(); ++j) working.push_back(weights_in_c(blocks, j));
    }
    return working[k];
  }

  // Under sequence parallelism the stream is split along length: each processor keeps its part.
  static activation as_activation(const whole_activation& x) {
    if constexpr (sequence_parallel) return mt::relayout<activation>(x);
    else return x;
  }
  static whole_activation as_whole(const activation& x) {
    if constexpr (sequence_parallel) return mt::relayout<whole_activation>(x);
    else return x;
  }

  activation forward(int chunk, int mb, const activation* in) const {
    // The rows looked up and the positions added in float, then cast: a bf16 copy of the whole table
    // per microbatch would be held by the lookup's gradient rule until that microbatch's backward.
    activation x = in ? *in : as_activation(as_c(t<batch, length, d_model>(nn::embedding<vocab>(embedding[0], ids[mb]) + positions[0])));
    const std::uint64_t dseed = o.seed * 7919;
    // Made here, outside any block: made inside a recomputed block's first run, the copies would be
    // that block's own nodes, which its recompute replaces (their gradients would never reach the
    // weights).
    if (!block_ids.empty()) (void)weights_of(0);
    const auto c = static_cast<std::size_t>(chunk);
    for (std::int64_t b = chunk_first[c]; b < chunk_end[c]; ++b) {
      const std::size_t k = chunk_offset[c] + static_cast<std::size_t>(b - chunk_first[c]);
      const std::uint64_t site = dseed + 2 * static_cast<std::uint64_t>(b), at = step;
      const double rate = o.dropout;
      const auto memory = o.attention_memory();
      const bool ring = o.ring(), overlap = o.tp_overlap, overlap_qkv = o.tp_overlap_qkv;
      const auto block = [this, k, site, at, rate, memory, ring, overlap, overlap_qkv](const activation& in) {
        return std::apply(
            [&](const auto&... w) {
              if constexpr (sequence_parallel)
                return sequence_parallel_block<whole_activation>(in, w..., rate, site, at, memory, overlap, overlap_qkv);
              else
                return transformer_block(in, w..., rate, site, at, memory, ring);
            },
            weights_of(k));
      };
      x = o.recompute ? mt::recompute(block, x) : block(x);
    }
    return x;
  }
  // This microbatch's share of the step's mean loss.
  t<> loss(int mb, const activation& out) const {
    const auto logits = mt::cast<float>(nn::dense<d_model, vocab>(
        as_whole(nn::layer_norm<d_model>(out, as_c(lnf_scale[0]), as_c(lnf_bias[0]))),
        as_c(softmax_weights[0])));
    const t<> share = mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(logits, labels[mb])) *
                      static_cast<float>(1.0 / o.microbatches);
    step_loss += mt::item(share);  // 0 in a plan, which counts the read's wait for the device
    return share;
  }
  void step_gradients(grads_type&& g) { grads.emplace(std::move(g)); }

  // The global names of this stage's tensors, in params()'s order: the unpipelined model's
  // (param_names), so a checkpoint resumes under any stage count, or none.
  std::vector<std::string> param_names() const {
    std::vector<std::string> names;
    if (holds_input) names.insert(names.end(), {"embedding", "positions"});
    for (const char* n : block_param_kinds)
      for (std::int64_t b : block_ids) names.push_back(fmt::format("blocks.{}.{}", b, n));
    if (holds_loss) names.insert(names.end(), {"lnf_scale", "lnf_bias", "softmax_weights"});
    return names;
  }
};

// --check-pipeline: the largest difference, relative to each tensor's largest element, between this
// stage's gradients of the first step and the unpipelined model's (model<L> on this stage's mesh,
// the whole batch at once) for the same parameters.
template <class L, class C, class A>
double compare_gradients(pipeline_stage<L, C, A>& stage, const grid& g, const options& o, const std::vector<float>& ids,
                         const std::vector<float>& labels) {
  using ids_t = mt::tensor<float, L, batch, length>;
  model<L> whole(g, o);
  const auto x = mt::from_host<ids_t>(g, {o.batch, o.length}, ids);
  const auto y = mt::from_host<ids_t>(g, {o.batch, o.length}, labels);
  const auto loss = whole.loss(x, y, o, 0);
  auto params = whole.tie();
  const auto want = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  double worst = 0;
  const auto compare = [&](const auto& a, const auto& b) {
    const auto av = mt::gather_all(a), bv = mt::gather_all(b);
    double scale = 1e-30, diff = 0;
    for (std::size_t i = 0; i < bv.size(); ++i) {
      scale = std::max(scale, std::abs(double(bv[i])));
      diff = std::max(diff, std::abs(double(av[i]) - double(bv[i])));
    }
    worst = std::max(worst, diff / scale);
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          const auto& ref = std::get<I>(want);
          const auto& got = std::get<I>(*stage.grads);
          if constexpr (mt::Tensor<std::remove_cvref_t<decltype(ref)>>) {
            if (!got.empty()) compare(got[0], ref);
          } else if constexpr (I >= 2 && I < 2 + block_param_kinds.size()) {  // the blocks' kinds
            for (std::size_t k = 0; k < got.size(); ++k) compare(got[k], ref[static_cast<std::size_t>(stage.block_ids[k])]);
          } else if (!got.empty()) {
            compare(got[0], ref[0]);
          }
        }(),
        ...);
  }(std::make_index_sequence<std::tuple_size_v<typename pipeline_stage<L, C, A>::grads_type>>{});
  return worst;
}

template <class L, class C, class A = L>
pipeline_result train_pipelined_as(const pl::stages<grid>& st_const, const options& o, const std::vector<unsigned char>& text) {
  auto& st = const_cast<pl::stages<grid>&>(st_const);
  const grid& g = st.mesh();
  if (o.batch % o.microbatches != 0)
    throw mt::error(fmt::format("--pipeline: --batch {} does not divide into --microbatches {} equal microbatches",
                                o.batch, o.microbatches));
  if (o.tie_embeddings || o.fsdp())
    throw mt::error("--pipeline's stages run the 2d layout (or --layout context, 2d_context), without "
                    "--tie-embeddings or fsdp");
  if (o.check_pipeline && !std::is_same_v<C, float>)
    throw mt::error("--check-pipeline compares gradients to 1e-5, which bf16's 8 bits cannot: use --dtype float32");
  if (o.check_pipeline && !o.resume.empty())
    throw mt::error("--check-pipeline compares the first step's gradients with the unpipelined model's from the "
                    "start: it takes no --resume");
  if (o.check_pipeline && o.dropout > 0)
    throw mt::error("--check-pipeline compares with the unpipelined model, whose dropout masks are drawn over the "
                    "whole batch (a microbatch draws its own): use --dropout 0");
  pipeline_result result;
  const auto schedule = pl::named_schedule(o.schedule, st.count(), o.microbatches, o.chunks);
  using ids_t = mt::tensor<float, L, batch, length>;
  pipeline_stage<L, C, A> stage(st, o, schedule);
  result.holds_loss = stage.holds_loss;
  optimizers<L, L> opt(o);
  std::mt19937_64 rng(o.seed);  // train()'s batches
  std::uniform_int_distribution<std::int64_t> start(0, static_cast<std::int64_t>(text.size()) - o.length - 2);
  const std::int64_t rows_per = o.batch / o.microbatches;
  std::vector<float> ids(static_cast<std::size_t>(o.batch * o.length)), labels(ids.size());
  // Checkpoints: this stage's tensors and optimizer state under the model's global names, one
  // shard per stage (io/shards.hpp), loaded under any stage count or layout.
  const auto names = stage.param_names();
  const auto training_state = [&] {
    mt::io::tensor_set set;
    auto params = stage.params();
    for_each_param_tensor(params, [&](std::size_t i, auto& p) { set.add(names[i], p); });
    opt.visit(o, [&](auto& chosen) { mt::io::add_optimizer_state(set, chosen, params, names); });
    return set;
  };
  const bool root = !g.is_planned() && st.index() == 0 && g.rank() == 0;
  std::int64_t step0 = 0;
  if (!o.resume.empty() && !g.is_planned()) {
    auto state = training_state();
    const auto at = resume_point_of(mt::io::checkpoints(o.resume).load(state, g.communicator().cart()), o);
    step0 = at.step;
    opt.visit(o, [&](auto& chosen) { chosen.set_steps(at.optimizer_steps); });
    for (std::int64_t k = 0; k < at.data_position; ++k) (void)start(rng);  // the batches drawn so far
    if (root)
      std::printf("resumed from %s at step %lld (saved on %s ranks, layout %s)\n", o.resume.c_str(), (long long)step0,
                  at.ranks.c_str(), at.layout.c_str());
  }
  result.first_step = step0;
  std::int64_t drawn = step0 * o.batch;
  int ranks = 0;
  if (!g.is_planned()) MPI_Comm_size(st.whole(), &ranks);
  // --async-save: each save blocks only to copy this rank's state; a later step's poll publishes it.
  std::optional<mt::io::async_checkpoints> background;
  if (o.async_save && !o.checkpoint.empty() && !g.is_planned()) background.emplace(o.checkpoint);
  const auto save = [&](std::int64_t done) {
    auto state = training_state();
    const auto meta =
        checkpoint_metadata(o, done, drawn, opt.visit(o, [](auto& chosen) { return chosen.steps(); }),
                            fmt::format("{} in {} pipeline stages ({})", o.layout, st.count(), o.schedule), ranks);
    const auto name = background ? background->save_shard(state, st.index(), st.count(), st.whole(), done, meta)
                                 : mt::io::checkpoints(o.checkpoint).save_shard(state, st.index(), st.count(),
                                                                                st.whole(), done, meta);
    if (root)
      std::printf(background ? "saving checkpoint %s/%s (written in the background)\n" : "saved checkpoint %s/%s\n",
                  o.checkpoint.c_str(), name.c_str());
  };
  const auto published = [&](const std::optional<std::string>& name) {
    if (name && root) std::printf("saved checkpoint %s/%s\n", o.checkpoint.c_str(), name->c_str());
  };
  mt::straggler_watch watch(g, o.straggler_warn);
  for (std::int64_t step = step0; step < o.steps; ++step) {
    if (g.is_planned()) mt::reset_plan(g);
    if (!g.is_planned()) draw_batch(o, text, rng, start, ids, labels);  // a plan reads no data
    drawn += o.batch;
    stage.ids.clear();
    stage.labels.clear();
    for (int m = 0; m < o.microbatches; ++m) {
      const std::span<const float> part_ids(ids.data() + m * rows_per * o.length, rows_per * o.length);
      const std::span<const float> part_labels(labels.data() + m * rows_per * o.length, rows_per * o.length);
      if (stage.holds_input) stage.ids.push_back(mt::from_host<ids_t>(g, {rows_per, o.length}, part_ids));
      if (stage.holds_loss) stage.labels.push_back(mt::from_host<ids_t>(g, {rows_per, o.length}, part_labels));
    }
    stage.step = static_cast<std::uint64_t>(step);
    stage.grads.reset();
    stage.working.clear();  // the weights changed: new working copies at the first forward pass
    stage.step_loss = 0;
    const auto stats = pl::run(schedule, st, stage);
    if constexpr (std::is_same_v<C, float>)
      if (step == 0 && o.check_pipeline) result.gradient_error = compare_gradients(stage, g, o, ids, labels);
    auto params = stage.params();
    opt.visit(o, [&](auto& chosen) { chosen.step(params, *stage.grads); });
    result.stats.push_back(stats);
    result.losses.push_back(stage.step_loss);
    if (g.is_planned()) continue;
    slow_rank_hook();
    if (background) published(background->poll());
    // The step's loss is the last stage's (the same on each of its processors): its first prints it.
    if (stage.holds_loss && g.rank() == 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      std::printf("step %5lld/%lld  loss %.4f\n", (long long)(step + 1), (long long)o.steps, stage.step_loss);
      std::fflush(stdout);
    }
    const bool saved = o.save_every > 0 && (step + 1) % o.save_every == 0;
    if (saved) save(step + 1);
    // Every rank of every stage, at each log line: who the others waited for (a stage's waits for
    // its neighbours count as waiting).
    if (((step + 1) % o.log_every == 0 || step + 1 == o.steps) && ranks > 1) {
      const auto report = watch.report(st);
      if (root && (report.warn || o.log_every <= o.steps)) {
        std::printf("  %s\n", report.describe().c_str());
        std::fflush(stdout);
      }
    }
    // The scheduler's warning (mt::stop_request): every stage stops after the same step.
    if (o.stop && step + 1 < o.steps) {
      if (const int sig = st.agree_max(o.stop->received())) {
        if (!saved && !o.checkpoint.empty()) save(step + 1);
        if (background) published(background->wait());  // on disk and current before the job exits
        if (root) print_stopped(o, sig, step + 1);
        result.stopped = sig;
        break;
      }
    }
  }
  if (background) published(background->wait());
  result.param_bytes = mt::local_bytes(stage.params());
  if constexpr (!std::is_same_v<C, float>)  // the bf16 working copies, which the plan counts as parameters
    for (const auto& w : stage.working) result.param_bytes += std::apply([](const auto&... c) { return mt::local_bytes(c...); }, w);
  for_each_param_tensor(stage.params(), [&](std::size_t, const auto& p) { result.parameters += p.size(); });
  result.state_bytes = opt.visit(o, [&](auto& chosen) { return chosen.state_bytes(stage.params()); });
  result.max_in_flight = pl::peak_activations(schedule.at(st.index()));
  if (g.is_planned()) result.plan = mt::plan_report_of(g);
  return result;
}

// The steps on this stage under layout L, in o.dtype.
template <class L>
pipeline_result train_pipelined_in(const pl::stages<grid>& st, const options& o, const std::vector<unsigned char>& text) {
  if (o.dtype == "bf16") return train_pipelined_as<L, mt::bf16>(st, o, text);
  return train_pipelined_as<L, float>(st, o, text);
}
// The same with the residual stream under sequence_layout<L> (--sequence-parallel).
template <class L>
pipeline_result train_pipelined_sequence_parallel_in(const pl::stages<grid>& st, const options& o,
                                                     const std::vector<unsigned char>& text) {
  using A = typename sequence_layout<L>::type;
  if (o.dtype == "bf16") return train_pipelined_as<L, mt::bf16, A>(st, o, text);
  return train_pipelined_as<L, float, A>(st, o, text);
}

}  // namespace lm_pipeline
