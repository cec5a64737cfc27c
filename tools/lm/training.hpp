#pragma once
// train<L>: the model trained under one layout (batches, checkpoints and --resume, --plan and
// --check-plan, dumps), and a pipeline stage's result. train<L> is instantiated once per layout in a
// file of its own (train_data.cpp, train_model.cpp, train_2d.cpp, ...); the build compiles those
// files in a few groups (MESHTENSOR_LAYOUT_UNITY, tools/lm/CMakeLists.txt), so no compiler process
// holds them all and what a group's layouts share is compiled once.
#include <array>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fmt/core.h>
#include <fstream>
#include <iterator>
#include <iomanip>
#include <meshtensor/io/async_checkpoint.hpp>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <optional>
#include <random>
#include <sys/resource.h>
#include <thread>

#include "generation.hpp"
#include "model.hpp"
#include "npy.hpp"

inline std::vector<unsigned char> read_text(const std::string& path, std::int64_t need) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mt::io_error(fmt::format("cannot open '{}'", path));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(bytes.size()) < need)
    throw mt::io_error(fmt::format("'{}' has {} bytes; at least {} are needed for sequences of this length", path,
                                   bytes.size(), need));
  return bytes;
}

// The model's hyperparameters, stored with a checkpoint and checked on resume.
inline mt::io::metadata run_config(const options& o) {
  return {{"d_model", std::to_string(o.d_model)}, {"heads", std::to_string(o.heads)},
          {"d_kv", std::to_string(o.d_kv)},       {"d_ff", std::to_string(o.d_ff)},
          {"vocab", std::to_string(o.vocab)},     {"batch", std::to_string(o.batch)},
          {"length", std::to_string(o.length)},   {"layers", std::to_string(o.layers)},
          {"seed", std::to_string(o.seed)},       {"optimizer", o.optimizer},
          {"tie_embeddings", o.tie_embeddings ? "1" : "0"},
          {"dropout", fmt::format("{:g}", o.dropout)}, {"lr", fmt::format("{:g}", o.lr)}};
}

// Inner with its state split as fsdp splits L's parameters; Inner itself where no layout does.
template <class Inner, class L>
struct sharded_or_plain {
  using type = Inner;
};
template <class Inner, class L>
  requires requires { typename shard_layout_of<L>::type; }
struct sharded_or_plain<Inner, L> {
  using type = mt::optim::sharded<Inner, typename shard_layout_of<L>::type>;
};

// The optimizer --optimizer names; with --zero 1 (parameters stored whole under a layout that
// fsdp shards), the same with its state split (optim/sharded.hpp). visit calls f with the one
// in use.
template <class L, class PL>
struct optimizers {
  mt::optim::adam adam;
  mt::optim::adafactor adafactor;
  explicit optimizers(const options& o)
      : adam({.lr = o.lr, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9}), adafactor({.lr = o.lr}) {}
  template <class F>
  decltype(auto) visit(const options& o, F&& f) {
    if constexpr (std::is_same_v<L, PL> && requires { typename shard_layout_of<L>::type; }) {
      if (o.shard_optimizer_state()) {
        if (o.optimizer == "adafactor") return f(sharded_adafactor);
        return f(sharded_adam);
      }
    }
    if (o.optimizer == "adafactor") return f(adafactor);
    return f(adam);
  }

 private:
  typename sharded_or_plain<mt::optim::adam, L>::type sharded_adam{adam};
  typename sharded_or_plain<mt::optim::adafactor, L>::type sharded_adafactor{adafactor};
};

// The parameters and the chosen optimizer's state, by name, for checkpoints (the same names and
// global tensors whatever the layout or ZeRO stage).
template <class L, class PL>
mt::io::tensor_set training_state(model<L, PL>& m, optimizers<L, PL>& opt, const options& o) {
  mt::io::tensor_set set;
  auto params = m.tie();
  const auto names = param_names(o.layers, o.tie_embeddings);
  for_each_param_tensor(params, [&](std::size_t i, auto& p) { set.add(names[i], p); });
  opt.visit(o, [&](auto& chosen) { mt::io::add_optimizer_state(set, chosen, params, names); });
  return set;
}

// Where a checkpoint resumes (--resume), read from its metadata after checking it against this run:
// the same text and model (run_config; lr and dropout may change). A key missing is named.
struct resume_point {
  std::int64_t step = 0, optimizer_steps = 0, data_position = 0;
  std::string ranks, layout;  // what saved it, for the log line
};
inline resume_point resume_point_of(const mt::io::metadata& meta, const options& o) {
  const auto saved = [&](const std::string& k) -> const std::string& {
    const auto it = meta.find(k);
    if (it == meta.end())
      throw mt::io_error(fmt::format("--resume {}: the checkpoint's metadata has no '{}' (meshtensor-lm writes it "
                                     "with every checkpoint)", o.resume, k));
    return it->second;
  };
  // The batches drawn again come from the text: another one would continue another stream.
  // (Checkpoints from before the text was saved have no such key.)
  if (meta.count("text") && meta.at("text") != o.text)
    throw mt::io_error(fmt::format("--resume {}: the checkpoint was trained on --text {}, this run on --text {}",
                                   o.resume, meta.at("text"), o.text));
  for (const auto& [k, v] : run_config(o))
    // (checkpoints from before --tie-embeddings have no such key: they are untied)
    if (k != "lr" && k != "dropout" && (meta.count(k) ? meta.at(k) != v : !(k == "tie_embeddings" && v == "0")))
      throw mt::io_error(fmt::format("--resume {}: the checkpoint has {} = {}, this run {}", o.resume, k,
                                     meta.count(k) ? meta.at(k) : "(none)", v));
  return {std::stoll(saved("step")), std::stoll(saved("optimizer.steps")), std::stoll(saved("data_position")),
          saved("ranks"), saved("layout")};
}

// A checkpoint's metadata after `step` steps: the run's configuration, where the data and the
// optimizer are, and what saved it (a layout, or a pipeline's stages and schedule).
inline mt::io::metadata checkpoint_metadata(const options& o, std::int64_t step, std::int64_t data_position,
                                            std::int64_t optimizer_steps, const std::string& layout, int ranks) {
  auto meta = run_config(o);
  meta["step"] = std::to_string(step);
  meta["data_position"] = std::to_string(data_position);
  meta["optimizer.steps"] = std::to_string(optimizer_steps);
  meta["layout"] = layout;
  meta["ranks"] = std::to_string(ranks);
  meta["text"] = o.text;
  return meta;
}

// A test hook (tests/faults/straggler_test.sh): MESHTENSOR_TEST_SLOW_RANK="R,MS" makes world rank R
// sleep MS milliseconds of extra work per step, a slow node the straggler report must name.
inline void slow_rank_hook() {
  static const int slow = [] {
    std::pair<int, int> rank_ms{-1, 0};
    if (const char* v = std::getenv("MESHTENSOR_TEST_SLOW_RANK")) std::sscanf(v, "%d,%d", &rank_ms.first, &rank_ms.second);
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return me == rank_ms.first ? rank_ms.second : 0;
  }();
  if (slow > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow));
}

// The line a run stopped by the scheduler's warning (--stop-on) prints after its last step.
inline void print_stopped(const options& o, int sig, std::int64_t steps_done) {
  std::printf("stopped on %s after step %lld of %lld: %s\n", mt::stop_request::name(sig).c_str(), (long long)steps_done,
              (long long)o.steps,
              o.checkpoint.empty() ? "no --checkpoint, nothing saved (a restart starts from scratch)"
                                   : "resume with --resume to continue bit for bit");
  std::fflush(stdout);
}

struct train_result {
  std::vector<double> losses;  // of every step (the same on every rank) from first_step on
  std::int64_t first_step = 0;
  std::int64_t parameters = 0;                // of the model, global
  std::int64_t param_bytes = 0, state_bytes = 0;  // this processor's slices, and its optimizer's state
  std::optional<mt::plan_report> plan;        // on a planned mesh: what the steps would cost
  bool generated_ok = true;                   // --check-generate's verdict
  int stopped = 0;                            // the stop signal the ranks agreed on, 0 if none
};

// The bf16 loss of each layout, instantiated in train_<layout>_bf16.cpp (beside train_<layout>.cpp:
// the two computations are the largest part of the tool's build; MESHTENSOR_LAYOUT_UNITY compiles a
// layout's files as one TU).
template <class L>
using ids_of = mt::tensor<float, L, batch, length>;
template <class L, class PL>
mt::tensor<float, L> bf16_loss(const model<L, PL>& m, const ids_of<L>& ids, const ids_of<L>& labels, const options& o,
                               std::uint64_t step) {
  return m.template loss<mt::bf16>(ids, labels, o, step);
}
#define MESHTENSOR_LM_BF16_LOSS(L)                                                                      \
  mt::tensor<float, L> bf16_loss(const model<L>&, const ids_of<L>&, const ids_of<L>&, const options&, \
                                 std::uint64_t)
extern template MESHTENSOR_LM_BF16_LOSS(layout_data);
extern template MESHTENSOR_LM_BF16_LOSS(layout_model);
extern template MESHTENSOR_LM_BF16_LOSS(layout_2d);

// The loss with --sequence-parallel, in float32 or bf16 (--dtype), compiled in train_<layout>_sp.cpp
// (layout_data's, which only refuses, in train_data.cpp; fsdp_2d's, whose parameters are gathered
// at each use, in train_fsdp_2d.cpp).
template <class L, class PL>
mt::tensor<float, L> sequence_parallel_loss(const model<L, PL>& m, const ids_of<L>& ids, const ids_of<L>& labels,
                                            const options& o, std::uint64_t step) {
  if constexpr (requires { typename sequence_layout<L>::type; }) {
    using LS = typename sequence_layout<L>::type;
    if (o.dtype == "bf16") return m.template loss_sequence_parallel<LS, mt::bf16>(ids, labels, o, step);
    return m.template loss_sequence_parallel<LS>(ids, labels, o, step);
  } else
    throw mt::error("--sequence-parallel needs a layout that splits heads and d_ff (model, 2d or fsdp_2d)");
}
#define MESHTENSOR_LM_SP_LOSS(L)                                                                               \
  mt::tensor<float, L> sequence_parallel_loss(const model<L>&, const ids_of<L>&, const ids_of<L>&, const options&, \
                                              std::uint64_t)
extern template MESHTENSOR_LM_SP_LOSS(layout_data);
extern template MESHTENSOR_LM_SP_LOSS(layout_model);
extern template MESHTENSOR_LM_SP_LOSS(layout_2d);

// The next batch of --batch sequences of --length tokens (ids) and the tokens after them (labels),
// from random starts in text: the same on every rank, in every layout and in the pipeline. The token
// at p is the byte text[p] mod vocab, or above 256 the byte pair (text[p] * 256 + text[p+1]) mod vocab.
inline void draw_batch(const options& o, const std::vector<unsigned char>& text, std::mt19937_64& rng,
                       std::uniform_int_distribution<std::int64_t>& start, std::vector<float>& ids,
                       std::vector<float>& labels) {
  const auto token = [&](std::int64_t p) -> float {
    if (o.vocab <= 256) return static_cast<float>(text[p] % o.vocab);
    return static_cast<float>((std::int64_t{text[p]} * 256 + text[p + 1]) % o.vocab);
  };
  for (std::int64_t b = 0; b < o.batch; ++b) {
    const std::int64_t s = start(rng);
    for (std::int64_t l = 0; l < o.length; ++l) {
      ids[b * o.length + l] = token(s + l);
      labels[b * o.length + l] = token(s + l + 1);
    }
  }
}

// Trains one layout. On a planned mesh (--plan) the same code runs without data or processes and
// the result carries the plan's report.
template <class L, class PL = L>
train_result train(const grid& g, const options& o, const std::vector<unsigned char>& text, bool verbose) {
  train_result result;
  using ids_t = mt::tensor<float, L, batch, length>;
  model<L, PL> m(g, o);
  optimizers<L, PL> opt(o);
  std::mt19937_64 rng(o.seed);  // the same batches on every rank and in every layout
  std::uniform_int_distribution<std::int64_t> start(0, static_cast<std::int64_t>(text.size()) - o.length - 2);
  std::int64_t step0 = 0;
  if (!o.resume.empty()) {
    auto state = training_state(m, opt, o);
    const auto at = resume_point_of(mt::io::checkpoints(o.resume).load(state), o);
    step0 = at.step;
    opt.visit(o, [&](auto& chosen) { chosen.set_steps(at.optimizer_steps); });
    // The data position: the batches drawn so far are drawn again, so the next are the same.
    for (std::int64_t k = 0; k < at.data_position; ++k) (void)start(rng);
    if (verbose && g.rank() == 0)
      std::printf("resumed from %s at step %lld (saved on %s ranks, layout %s)\n", o.resume.c_str(), (long long)step0,
                  at.ranks.c_str(), at.layout.c_str());
  }
  result.first_step = step0;
  std::int64_t drawn = step0 * o.batch;
  std::vector<double> step_seconds;
  std::vector<float> ids(static_cast<std::size_t>(o.batch * o.length)), labels(ids.size());
  std::vector<double> losses;
  const bool root = g.rank() == 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto tlog = t0, tlast = t0;
  mt::straggler_watch watch(g, o.straggler_warn);  // the slow rank, named at each log line
  // --async-save: each save blocks only to copy this rank's state; a later step's poll publishes it.
  std::optional<mt::io::async_checkpoints> background;
  if (o.async_save && !o.checkpoint.empty()) background.emplace(o.checkpoint);
  std::vector<double> save_seconds, in_flight_seconds, idle_seconds;  // what the saves cost training
  for (std::int64_t step = step0; step < o.steps; ++step) {
    const bool saving = background && background->in_flight();
    // A plan reports its last step (the second has the optimizer's state from its start).
    if (g.is_planned()) mt::reset_plan(g);
    if (!g.is_planned()) draw_batch(o, text, rng, start, ids, labels);  // a plan reads no data
    drawn += o.batch;
    const auto x = mt::from_host<ids_t>(g, {o.batch, o.length}, ids);
    const auto y = mt::from_host<ids_t>(g, {o.batch, o.length}, labels);
    const auto s = static_cast<std::uint64_t>(step);
    // --zero 2: the parameters gathered once, for the whole step (3: at each use). Alive until the
    // step's gradient: recompute's blocks refer to the model they ran on.
    std::optional<model<L>> whole;
    auto loss = [&] {
      if constexpr (!std::is_same_v<L, PL>) {
        if (o.zero == 2) {
          whole.emplace(m.gathered());
          return o.sequence_parallel ? sequence_parallel_loss(*whole, x, y, o, s)
                 : o.dtype == "bf16" ? bf16_loss(*whole, x, y, o, s)
                                     : whole->loss(x, y, o, s);
        }
      }
      return o.sequence_parallel   ? sequence_parallel_loss(m, x, y, o, s)
             : o.dtype == "bf16" ? bf16_loss(m, x, y, o, s)
                                 : m.loss(x, y, o, s);
    }();
    auto params = m.tie();
    // The loss given to gradient() as an rvalue: the pass frees each op's saved tensors as it goes
    // (autodiff/gradient.hpp), where a held loss kept the step's graph to its end. Its value stays.
    const auto loss_value = loss.detached();
    auto grads = std::apply([&](auto&... p) { return mt::gradient(std::move(loss), p...); }, params);
    if (step == 0 && !o.dump.empty()) {
      const auto names = param_names(o.layers, o.tie_embeddings);
      for_each_param_tensor(params, [&](std::size_t i, auto& p) { dump_tensor(p, o.dump + "/param." + names[i] + ".npy"); });
      for_each_param_tensor(grads, [&](std::size_t i, auto& p) { dump_tensor(p, o.dump + "/grad." + names[i] + ".npy"); });
      dump_tensor(x, o.dump + "/ids.npy");
      dump_tensor(y, o.dump + "/labels.npy");
      if (root) {
        write_npy(o.dump + "/loss.npy", {mt::item(loss_value)}, {});
        std::ofstream cfg(o.dump + "/config.txt");
        cfg << "layout " << o.layout << "\nranks " << g.nprocs() << "\nbatch " << o.batch << "\nlength " << o.length
            << "\nd_model " << o.d_model << "\nheads " << o.heads << "\nd_kv " << o.d_kv << "\nd_ff " << o.d_ff
            << "\nvocab " << o.vocab << "\nlayers " << o.layers << "\n";
        std::printf("dumped the initial weights, the first batch, its loss and gradients to %s\n", o.dump.c_str());
      }
    }
    opt.visit(o, [&](auto& chosen) { chosen.step(params, grads); });
    slow_rank_hook();
    losses.push_back(mt::item(loss_value));
    const auto save = [&] {
      auto state = training_state(m, opt, o);
      const auto meta = checkpoint_metadata(o, step + 1, drawn, opt.visit(o, [](auto& chosen) { return chosen.steps(); }),
                                            o.layout, g.nprocs());
      const auto t = std::chrono::steady_clock::now();
      const auto name = background ? background->save(state, step + 1, meta)
                                   : mt::io::checkpoints(o.checkpoint).save(state, step + 1, meta);
      save_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
      if (verbose && root)
        std::printf(background ? "saving checkpoint %s/%s (written in the background)\n" : "saved checkpoint %s/%s\n",
                    o.checkpoint.c_str(), name.c_str());
      return name;
    };
    if (background)
      if (const auto name = background->poll(); name && verbose && root)
        std::printf("saved checkpoint %s/%s\n", o.checkpoint.c_str(), name->c_str());
    const bool saved = o.save_every > 0 && (step + 1) % o.save_every == 0;
    if (saved) save();
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - tlast).count());
    if (o.save_every > 0 && !saved) (saving ? in_flight_seconds : idle_seconds).push_back(step_seconds.back());
    tlast = std::chrono::steady_clock::now();
    if (verbose && root && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - tlog).count();
      const int k = static_cast<int>(std::min<std::int64_t>(step % o.log_every, step - step0) + 1);
      std::printf("step %5lld/%lld  loss %.4f  (%.3f bits/byte)  %.1f steps/s  %.0f tokens/s\n", (long long)(step + 1),
                  (long long)o.steps, losses.back(), losses.back() / std::log(2.0), k / dt,
                  k * o.batch * o.length / dt);
      std::fflush(stdout);
      tlog = now;
    }
    // Every rank, at each log line: who the others waited for (runtime/straggler.hpp).
    if (verbose && ((step + 1) % o.log_every == 0 || step + 1 == o.steps) && g.nprocs() > 1) {
      const auto report = watch.report(g);
      if (root && (report.warn || o.log_every <= o.steps)) {
        std::printf("  %s\n", report.describe().c_str());
        std::fflush(stdout);
      }
    }
    // The scheduler's warning (mt::stop_request): every rank asks after the same step, so all stop
    // together, whichever rank the signal reached; the checkpoint holds this step.
    if (o.stop && step + 1 < o.steps) {
      if (const int sig = o.stop->agreed(g)) {
        if (!saved && !o.checkpoint.empty()) save();
        if (background) background->wait();  // on disk and current before the job exits
        if (verbose && root) print_stopped(o, sig, step + 1);
        result.stopped = sig;
        break;
      }
    }
  }
  if (background)
    if (const auto name = background->wait(); name && verbose && root && !result.stopped)
      std::printf("saved checkpoint %s/%s\n", o.checkpoint.c_str(), name->c_str());
  if (verbose && root && !save_seconds.empty()) {
    // What the saves cost training (scripts/dev/bench_async_checkpoint.sh): the time a save blocks the
    // step that makes it, and the other steps' times with a save in flight or none.
    const auto median = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    std::printf("checkpoint_blocked_ms %.3f per save (median of %zu, %s); step_ms %.3f with a save in flight (%zu), "
                "%.3f without (%zu)\n",
                1e3 * median(save_seconds), save_seconds.size(), background ? "async" : "sync",
                1e3 * median(in_flight_seconds), in_flight_seconds.size(), 1e3 * median(idle_seconds),
                idle_seconds.size());
  }
  if (verbose && root) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto trained = static_cast<std::int64_t>(losses.size());
    std::printf("trained %lld steps in %.1f s (%.2f steps/s)\n", (long long)trained, s, trained / s);
  }
  if (o.warmup >= 0 && o.warmup < static_cast<std::int64_t>(step_seconds.size())) {
    // Each step ends when rank 0 has its loss; the slowest rank sets the pace through the collectives.
    std::vector<double> timed(step_seconds.begin() + o.warmup, step_seconds.end());
    std::sort(timed.begin(), timed.end());
    const std::size_t n = timed.size();
    const double median = n % 2 ? timed[n / 2] : 0.5 * (timed[n / 2 - 1] + timed[n / 2]);
    if (root)
      std::printf("step_time_median_ms %.3f over %zu steps after %lld warm-up steps\n", 1e3 * median, n,
                  (long long)o.warmup);
  }
  result.parameters = m.parameter_count();
  result.param_bytes = mt::local_bytes(m.tie());
  result.state_bytes = opt.visit(o, [&](auto& chosen) { return chosen.state_bytes(m.tie()); });
  if (g.is_planned()) {
    result.plan = mt::plan_report_of(g);
    result.losses = std::move(losses);
    return result;
  }
  if (o.generate > 0) {
    if constexpr (std::is_same_v<L, PL>) result.generated_ok = generate(m, g, o);
    else result.generated_ok = generate(m.gathered(), g, o);
  }
  if (o.memory) {
    // Bytes of the local slices of the parameters and of the optimizer's state (laid out like them).
    const long long with_state = result.param_bytes + result.state_bytes;
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    long long rss = ru.ru_maxrss * 1024LL, stats[4] = {with_state, -with_state, rss, -rss};
    MPI_Allreduce(MPI_IN_PLACE, stats, 4, MPI_LONG_LONG, MPI_MAX, g.communicator().cart());
    if (root)
      std::printf("memory_params_adam_bytes_per_rank max %lld min %lld; peak_rss_bytes max %lld min %lld\n", stats[0],
                  -stats[1], stats[2], -stats[3]);
  }
  result.losses = std::move(losses);
  return result;
}


// --pipeline (pipeline.hpp; compiled in pipeline.cpp and pipeline_context.cpp): one stage's run of the steps.
struct pipeline_result {
  std::vector<double> losses;                       // the step's loss where holds_loss (0 elsewhere)
  bool holds_loss = false;                          // this stage computes the loss (the last part's)
  std::vector<mt::pipeline::stage_stats> stats;     // per step
  std::int64_t param_bytes = 0, state_bytes = 0;    // this processor's
  std::int64_t parameters = 0;                      // the stage's (global extents)
  int max_in_flight = 0;                            // the schedule's, in chunk activations
  std::int64_t first_step = 0;                      // resumed after this many steps (--resume)
  int stopped = 0;                                  // the stop signal the stages agreed on, 0 if none
  double gradient_error = 0;                        // --check-pipeline: against the unpipelined model
  std::optional<mt::plan_report> plan;              // on a planned stage
};
pipeline_result train_pipelined(const mt::pipeline::stages<grid>& st, const options& o,
                                const std::vector<unsigned char>& text);

// Compiled in train_<layout>.cpp (train_fsdp.cpp, train_fsdp_2d.cpp: the fsdp layouts).
extern template train_result train<layout_data>(const grid&, const options&, const std::vector<unsigned char>&, bool);
extern template train_result train<layout_model>(const grid&, const options&, const std::vector<unsigned char>&, bool);
extern template train_result train<layout_2d>(const grid&, const options&, const std::vector<unsigned char>&, bool);
extern template train_result train<layout_context>(const grid&, const options&, const std::vector<unsigned char>&, bool);
extern template train_result train<layout_2d_context>(const grid&, const options&, const std::vector<unsigned char>&,
                                                      bool);
extern template train_result train<layout_data, params_fsdp>(const grid&, const options&, const std::vector<unsigned char>&,
                                                             bool);
extern template train_result train<layout_2d, params_fsdp_2d>(const grid&, const options&,
                                                              const std::vector<unsigned char>&, bool);
