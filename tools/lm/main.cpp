// A decoder-only Transformer language model with Mesh-TensorFlow's dims (batch, length, d_model,
// heads, d_kv, d_ff, vocab), byte-level (vocab = 256), trained on a text that Debian ships (by
// default /usr/share/common-licenses/GPL-3, from the base-files package).
//
// Layouts on a 2-D mesh [rows x cols], chosen with --layout:
//   data   batch over rows and cols (pure data parallelism: weight gradients allreduce over both)
//   model  vocab, heads and d_ff over rows and cols (model parallelism as in the Mesh-TensorFlow
//          paper: attention and feed-forward outputs and the logits' softmax allreduce over both)
//   2d     batch over rows; vocab, heads and d_ff over cols (both at once)
//   fsdp   data, with the parameters, their gradients and the optimizer's state split over rows
//          and cols as well (d_model, a dim every parameter has): fully sharded data parallelism;
//          --zero 3 (the default) gathers each parameter where a block uses it, 2 gathers them all
//          once per step, 1 keeps the parameters whole and splits the optimizer's state only
//   fsdp_2d  2d, with the parameters' d_model split over rows as well (ZeRO over the data axis,
//          model parallelism over cols)
//   context  batch over rows, the sequence (length) over cols: context parallelism
//   2d_context  the sequence over rows (the context axis); vocab, heads and d_ff over cols (the
//          tensor axis); the batch whole: context x tensor parallelism
// Under the two context layouts --attention picks the attention: all-to-all (the default; the
// sequence's split moved to the heads and back, DeepSpeed-Ulysses' way: the heads cap the split) or
// ring (the keys' and values' blocks passed around the context axis, ring attention's way: any
// split). Both train in float32 or bf16, and in --pipeline's stages; neither takes
// --sequence-parallel (they split the sequence everywhere already).
// The mesh here is 2-D; the library's meshes take any number of axes (a data x context x tensor
// mesh<data, context, tensor> is a layout away: docs/training.md, "Context parallelism").
// Parameters are initialised from counter-based random numbers and dropout masks are functions of
// (seed, step, global index), so every layout computes the same model: --compare-layouts trains
// each layout in turn from the same start on the same batches and checks their losses agree.
//
//   mpiexec -n 4 meshtensor-lm [--layout 2d] [--steps 300] [--csv loss.csv]
//   mpiexec -n 4 meshtensor-lm --compare-layouts --steps 20
//
// --vocab V (default 256, bytes) above 256 makes the token at position p the byte pair
// (text[p] * 256 + text[p+1]) mod V (below 256: text[p] mod V). --dump DIR writes the initial
// weights, the first batch, its loss and the gradients of that loss to DIR as .npy files (for
// tools/lm/torch_reference.py, which recomputes them with PyTorch). --warmup W
// prints the median time of the steps after the first W; --memory prints the bytes of the
// parameters and the Adam state on each rank, and the peak resident set size.
//
// Checkpoints (docs/checkpoints.md): --checkpoint DIR --save-every N saves the parameters, the
// optimizer's state and step count, the step and the data position every N steps (a safetensors
// file per checkpoint, written by all ranks in parallel, made current atomically); with --async-save
// a save only copies each rank's state and a thread writes it while training goes on. --resume DIR
// continues from DIR's current checkpoint up to --steps, under any layout and rank count: on the
// same layout the losses equal those of an uninterrupted run bit for bit. --stop-on SIGNALS (default
// USR1,TERM; docs/cluster.md): on one of them, to any rank, every rank finishes its step, they agree
// (mt::stop_request), a checkpoint is saved and the job exits with status 85 (mt::stopped_exit_code),
// which scripts/supervise.sh --requeue and examples/slurm/train.sbatch turn into a Slurm requeue.
//
// Planning (docs/plan-mode.md): --plan runs one training step (forward, backward, optimizer) of this
// code on a planned mesh of --mesh sizes, in one process, with no data, and prints what one
// processor would hold and send: the parameter count, the memory per processor (parameters,
// optimizer state, gradients and activations at the peak) against --memory-budget GiB, and the
// collectives by op with their bytes; --plan-json FILE writes the same as JSON. --layers sets the
// number of blocks; --recompute keeps only each block's input for the backward pass and runs the
// block again there (mt::recompute: less activation memory, one more forward pass per block);
// --recompute-attention only attention's core (nn::attention_memory::recompute_core).
// --dtype bf16 computes the model in bf16 from float master weights (docs/training.md, "Mixed
// precision"); --compare-dtypes trains it both ways and checks the losses stay close. The
// Mesh-TensorFlow paper's largest language model on a [16 x 32] mesh:
//
//   meshtensor-lm --plan --mesh 16 32 --layers 6 --d-model 1024 --d-kv 256 --heads 256 --d-ff 262144
//                 --vocab 32768 --length 256 --batch 512 --optimizer adafactor --layout 2d
//
// Inference: --generate N samples N bytes after --prompt (with --resume, from a checkpoint), one at
// a time with a key-value cache, and prints the text and the per-token latency; under --layout
// model one token's work is split over the ranks (heads, d_ff, vocab); under --layout context the
// cache's positions are (a long prompt's cache in 1/P per processor); under 2d_context both (the
// positions over rows, heads, d_ff and vocab over cols). --check-generate compares the
// cached logits with a full forward pass.
//
//   mpiexec -n 4 meshtensor-lm --layout model --steps 300 --generate 200 --prompt "This License"
//
// --check-plan runs one step for real, then plans it for this rank's coordinates, and checks on
// every rank that the planned collectives (calls and bytes per collective and axis set) and the
// bytes of the parameters and optimizer state equal the real step's, and that the planned peak
// lies within --memory-tolerance of the caching allocator's measured one (with --pipeline, on
// every rank of every stage).
#include <CLI/CLI.hpp>
#include <cmath>
#include <fmt/core.h>
#include <meshtensor/layout/candidates.hpp>

#include "cli.hpp"
#include "kernel_times.hpp"
#include "pipeline_planning.hpp"
#include "training.hpp"

train_result train_layout(const std::string& name, const grid& g, const options& o, const std::vector<unsigned char>& text,
                          bool verbose) {
  if (name == "data") return train<layout_data>(g, o, text, verbose);
  if (name == "model") return train<layout_model>(g, o, text, verbose);
  // --zero 1: the parameters stored as the data or 2d layout has them, the optimizer sharded.
  if (name == "fsdp") return o.zero == 1 ? train<layout_data>(g, o, text, verbose) : train<layout_data, params_fsdp>(g, o, text, verbose);
  if (name == "fsdp_2d")
    return o.zero == 1 ? train<layout_2d>(g, o, text, verbose) : train<layout_2d, params_fsdp_2d>(g, o, text, verbose);
  if (name == "context") return train<layout_context>(g, o, text, verbose);
  if (name == "2d_context") return train<layout_2d_context>(g, o, text, verbose);
  return train<layout_2d>(g, o, text, verbose);
}

std::string layout_type(const std::string& name) {
  if (name == "data") return mt::layout_string<layout_data>();
  if (name == "model") return mt::layout_string<layout_model>();
  if (name == "fsdp") return mt::layout_string<layout_data>() + ", parameters " + mt::layout_string<params_fsdp>();
  if (name == "fsdp_2d") return mt::layout_string<layout_2d>() + ", parameters " + mt::layout_string<params_fsdp_2d>();
  if (name == "context") return mt::layout_string<layout_context>();
  if (name == "2d_context") return mt::layout_string<layout_2d_context>();
  return mt::layout_string<layout_2d>();
}

// Two training steps planned on a mesh of o.mesh's sizes; the report is the second's (a steady
// step, with the optimizer's state alive from its start).
train_result plan_layout(options o, const std::string& layout) {
  o.steps = 2;
  o.layout = layout;
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
  const std::vector<unsigned char> text(static_cast<std::size_t>(o.length + 3), ' ');  // values do not matter to a plan
  return train_layout(layout, pm, o, text, false);
}

// --rank-layouts: every compiled-in layout planned on --mesh, ranked by predicted step time among
// those whose peak fits --memory-budget (docs/scale.md).
int rank_layouts(const mt::environment& env, const options& o) {
  if (o.calibration.empty()) throw mt::error("--rank-layouts needs --calibration FILE (bench_calibrate writes one)");
  const auto c = mt::machine_calibration::load(o.calibration);
  std::vector<mt::layout_candidate> candidates;
  // The fsdp layouts at each ZeRO stage: what each stage costs in memory and traffic, side by side.
  for (const std::string name : {"data", "model", "2d", "fsdp", "fsdp_2d"})
    for (int zero : {1, 2, 3}) {
      if (zero != 3 && name.rfind("fsdp", 0) != 0) continue;
      options oz = o;
      oz.zero = zero;
      auto r = plan_layout(oz, name);
      const std::string label = name.rfind("fsdp", 0) == 0 ? fmt::format("{} --zero {}", name, zero) : name;
      candidates.push_back({label, *r.plan, mt::predict(*r.plan, c), true});
    }
  const std::int64_t budget = static_cast<std::int64_t>(o.memory_budget_gib * 1073741824.0);
  const auto ranked = mt::rank_layouts(candidates, budget);
  if (env.world_rank() != 0) return 0;
  std::printf("layouts on mesh [rows=%d x cols=%d], calibration %s (%d ranks), budget %s per processor:\n", o.mesh[0],
              o.mesh[1], o.calibration.c_str(), c.ranks, fmt::format("{:g} GiB", o.memory_budget_gib).c_str());
  std::printf("%s", mt::ranking_table(ranked).c_str());
  const std::string best = ranked[0].name.substr(0, ranked[0].name.find(' '));
  std::printf("best: --layout %s, that is\n  %s\n", ranked[0].name.c_str(), layout_type(best).c_str());
  return 0;
}

// --plan: a step of the model planned on a mesh of o.mesh's sizes, printed on rank 0.
int plan(const mt::environment& env, const options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = plan_layout(o, o.layout);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (env.world_rank() != 0) return 0;
  const auto& p = *r.plan;
  const std::int64_t budget = static_cast<std::int64_t>(o.memory_budget_gib * 1073741824.0);
  const bool fits = p.peak_bytes <= budget;
  std::printf("planned two training steps, reporting the second (layout %s, %s), on mesh %s in %.3f s\n", o.layout.c_str(), o.optimizer.c_str(),
              p.shape.to_string().c_str(), seconds);
  std::printf("parameters: %lld (%.2f billion)\n", (long long)r.parameters, r.parameters / 1e9);
  std::printf("per processor (the first, which holds the largest parts):\n");
  std::printf("  parameters %s, optimizer state %s (after the step)\n",
              gib(p.bytes_of(mt::memory_kind::parameters)).c_str(), gib(p.bytes_of(mt::memory_kind::optimizer_state)).c_str());
  std::printf("  at the peak: %s = parameters %s + optimizer state %s + gradients %s + activations %s\n",
              gib(p.peak_bytes).c_str(), gib(p.peak_bytes_of(mt::memory_kind::parameters)).c_str(),
              gib(p.peak_bytes_of(mt::memory_kind::optimizer_state)).c_str(),
              gib(p.peak_bytes_of(mt::memory_kind::gradients)).c_str(),
              gib(p.peak_bytes_of(mt::memory_kind::activations)).c_str());
  std::printf("  budget %s: %s\n", gib(budget).c_str(), fits ? "fits" : "DOES NOT FIT");
  std::printf("%s", p.table().c_str());
  std::optional<mt::step_time> predicted;
  if (!o.calibration.empty()) {
    const auto c = mt::machine_calibration::load(o.calibration);
    predicted = mt::predict(p, c);
    std::printf("predicted step time %s (calibration %s, %d ranks)\n", mt::to_string(*predicted).c_str(),
                o.calibration.c_str(), c.ranks);
    std::printf("%s", mt::communication_table(p, c).c_str());
    if (o.timeline > 0) std::printf("%s", mt::timeline_picture(p, c, o.timeline).c_str());
  }
  if (!o.plan_json.empty()) {
    std::ofstream out(o.plan_json);
    out << "{\"layout\": \"" << o.layout << "\", \"optimizer\": \"" << o.optimizer << "\", \"layers\": " << o.layers
        << ", \"d_model\": " << o.d_model << ", \"heads\": " << o.heads << ", \"d_kv\": " << o.d_kv << ", \"d_ff\": " << o.d_ff
        << ", \"vocab\": " << o.vocab << ", \"batch\": " << o.batch << ", \"length\": " << o.length
        << ", \"parameters\": " << r.parameters << ", \"budget_bytes\": " << budget << ", \"fits\": " << (fits ? "true" : "false");
    if (predicted)  // with --calibration, as the pipelined plan's JSON has it
      out << ", \"predicted_step_seconds\": " << predicted->total() << ", \"predicted_memory_seconds\": " << predicted->memory
          << ", \"predicted_exposed_communication_seconds\": " << predicted->communication
          << ", \"predicted_hidden_communication_seconds\": " << predicted->hidden;
    out << ", \"plan\": " << p.json() << "}\n";
    if (!out) throw mt::io_error(fmt::format("cannot write '{}'", o.plan_json));
    std::printf("plan written to %s\n", o.plan_json.c_str());
  }
  return 0;
}

// --check-plan: a real step against its plan, on every rank.
int check_plan(const grid& g, options o, const std::vector<unsigned char>& text, double memory_tolerance) {
  o.steps = 1;
  g.reset_counters();
  // The step's memory as the caching allocator measured it (every buffer of the step is its),
  // from before the model is made: what the plan's peak counts (parameters, optimizer state,
  // gradients, activations).
  const std::int64_t before = mt::memory_stats().bytes_in_use;
  mt::reset_peak_memory();
  const std::int64_t waits_before = mt::host_waits();
  const auto real = train_layout(o.layout, g, o, text, false);
  const std::int64_t waits = mt::host_waits() - waits_before;
  const std::int64_t measured_peak = mt::memory_stats().peak_bytes_in_use - before;
  const mt::comm_counters counted = g.counters();
  const grid pm = grid::planned({g.size<rows>(), g.size<cols>()}, {g.coord<rows>(), g.coord<cols>()});
  const auto planned = train_layout(o.layout, pm, o, text, false);
  const auto& p = *planned.plan;
  const auto v = mt::agree_on_plan(g.communicator().cart(), g, counted, p, real.param_bytes, real.state_bytes, waits);
  if (!v.differences.empty()) std::printf("rank %d: %s", g.rank(), v.differences.c_str());
  const auto memory = mt::agree_on_peak(g.communicator().cart(), p.peak_bytes, measured_peak, memory_tolerance);
  if (g.rank() == 0) {
    std::printf("check-plan (layout %s, %s, mesh %s): %s; rank 0 sent %lld bytes in %lld collectives, holds %lld bytes "
                "of parameters and %lld of optimizer state\n",
                o.layout.c_str(), o.optimizer.c_str(), g.shape().to_string().c_str(),
                v.equal_everywhere ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS",
                (long long)v.bytes, (long long)v.calls, (long long)real.param_bytes, (long long)real.state_bytes);
    memory.print("rank 0's", p.peak_bytes, measured_peak, memory_tolerance);
  }
  return v.equal_everywhere && memory.close ? 0 : 3;
}

// The loss of each step, exactly (17 digits: the float32 loss as a double, round-trippable).
void write_curve(const options& o, const std::vector<double>& losses, std::int64_t first_step) {
  std::ofstream csv(o.csv);
  if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  csv << "step,loss\n" << std::setprecision(17);
  for (std::size_t i = 0; i < losses.size(); ++i) csv << first_step + i + 1 << ',' << losses[i] << '\n';
  csv.close();
  std::printf("loss curve: %s\n", o.csv.c_str());
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    const std::string png = o.csv.substr(0, o.csv.rfind('.')) + ".png";
    const std::string cmd = "gnuplot -e \"set terminal png size 800,500; set output '" + png +
                            "'; set datafile separator ','; set xlabel 'step'; set ylabel 'loss (nats/byte)';"
                            " set title 'meshtensor-lm, layout " + o.layout + "' noenhanced;"
                            " plot '" + o.csv + "' every ::1 using 1:2 with lines title 'training loss'\"";
    if (std::system(cmd.c_str()) == 0) std::printf("loss plot: %s\n", png.c_str());
  } else {
    std::printf("(gnuplot not found: no PNG)\n");
  }
}

// --pipeline P: the steps on P stages of --mesh each, world ranks in stage-major blocks. Prints the
// losses, and per stage the measured bubble against the schedule's (its simulation with a forward,
// an input gradient and a weight gradient of equal cost: (p - 1) / (m + p - 1) for gpipe and 1f1b)
// and the chunk activations held at once. --check-pipeline also trains the unpipelined model on each stage's
// mesh and compares (losses on the last stage, the first step's gradients on every stage).
int run_pipeline(const mt::environment& env, options o, const std::vector<unsigned char>& text, double memory_tolerance) {
  namespace pl = mt::pipeline;
  pl::stages<grid> st(env.world(), o.pipeline, {o.mesh[0], o.mesh[1]});
  const grid& g = st.mesh();
  const bool root = env.world_rank() == 0;
  if (o.check_plan) {
    o.steps = 1;
    g.reset_counters();
    // As unpipelined: the caching allocator's peak over the step, from before the stage's model is made.
    const std::int64_t before = mt::memory_stats().bytes_in_use;
    mt::reset_peak_memory();
    const std::int64_t waits_before = mt::host_waits();
    const auto real = train_pipelined(st, o, text);
    const std::int64_t waits = mt::host_waits() - waits_before;
    const std::int64_t measured_peak = mt::memory_stats().peak_bytes_in_use - before;
    const mt::comm_counters counted = g.counters();
    const auto planned_stage = pl::stages<grid>::planned(o.pipeline, st.index(), {o.mesh[0], o.mesh[1]},
                                                         {g.coord<rows>(), g.coord<cols>()});
    const auto planned = train_pipelined(planned_stage, o, text);
    const auto v = mt::agree_on_plan(env.world(), g, counted, *planned.plan, real.param_bytes, real.state_bytes, waits);
    if (!v.differences.empty()) std::printf("rank %d (stage %d): %s", env.world_rank(), st.index(), v.differences.c_str());
    const std::int64_t planned_peak = planned.plan->peak_bytes;
    const auto memory = mt::agree_on_peak(env.world(), planned_peak, measured_peak, memory_tolerance);
    const double mine = measured_peak > 0 ? static_cast<double>(planned_peak) / static_cast<double>(measured_peak) : 0.0;
    if (std::abs(mine - 1.0) > memory_tolerance)  // each rank apart names itself (one line each at scale is too many)
      std::printf("check-plan memory, stage %d rank %d: planned %lld bytes, measured %lld\n", st.index(),
                  env.world_rank(), (long long)planned_peak, (long long)measured_peak);
    if (root) {
      std::printf("check-plan (--pipeline %d, %s, %d microbatches, stage mesh %s): %s\n", o.pipeline, o.schedule.c_str(),
                  o.microbatches, g.shape().to_string().c_str(),
                  v.equal_everywhere ? "the plan equals the real step on every rank of every stage" : "THE PLAN DIFFERS");
      memory.print("stage 0 rank 0's", planned_peak, measured_peak, memory_tolerance);
    }
    return v.equal_everywhere && memory.close ? 0 : 3;
  }
  const auto r = train_pipelined(st, o, text);
  // The step's loss is known on the last stage: summed over the world, divided by its processors.
  const int per_stage = g.nprocs();
  std::vector<double> losses(r.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) losses[i] = r.holds_loss ? r.losses[i] / per_stage : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, losses.data(), static_cast<int>(losses.size()), MPI_DOUBLE, MPI_SUM, env.world());
  // Each stage's median bubble over the steps after the first, gathered from its first processor.
  std::vector<double> bubbles;
  for (std::size_t i = 1; i < r.stats.size(); ++i) bubbles.push_back(r.stats[i].bubble());
  if (bubbles.empty()) bubbles.push_back(r.stats.empty() ? 0.0 : r.stats[0].bubble());  // (none: resumed at the end)
  std::sort(bubbles.begin(), bubbles.end());
  // The step's time: each stage's median over the steps after the first; the slowest stage's is the step's.
  std::vector<double> times;
  for (std::size_t i = r.stats.size() > 1 ? 1 : 0; i < r.stats.size(); ++i) times.push_back(r.stats[i].total_seconds);
  if (times.empty()) times.push_back(0.0);
  std::sort(times.begin(), times.end());
  double step_seconds = times[times.size() / 2];
  MPI_Allreduce(MPI_IN_PLACE, &step_seconds, 1, MPI_DOUBLE, MPI_MAX, env.world());
  double mine[2] = {bubbles[bubbles.size() / 2], static_cast<double>(r.max_in_flight)};
  std::vector<double> all(2 * static_cast<std::size_t>(env.world_size()));
  MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, env.world());
  if (root) {  // (the step lines came from the last stage as it trained)
    const auto sim = pl::simulate(pl::named_schedule(o.schedule, o.pipeline, o.microbatches, o.chunks));
    std::printf("pipeline: %d stages of %s, %d microbatches of %lld, schedule %s, %d chunk%s per stage; its bubble "
                "with F = B = W (simulated) per stage:\n",
                o.pipeline, g.shape().to_string().c_str(), o.microbatches, (long long)(o.batch / o.microbatches),
                o.schedule.c_str(), o.chunks, o.chunks > 1 ? "s" : "");
    double measured = 0, formula = 0;
    for (int s = 0; s < o.pipeline; ++s) {
      const double expected = sim.idle[static_cast<std::size_t>(s)] / sim.makespan;
      std::printf("  stage %d: measured bubble %.3f (median over steps), schedule's %.3f; chunk activations held at "
                  "once %d\n",
                  s, all[2 * s * per_stage], expected, static_cast<int>(all[2 * s * per_stage + 1]));
      measured += all[2 * s * per_stage] / o.pipeline;
      formula += expected / o.pipeline;
    }
    std::printf("pipeline_bubble_measured_mean %.4f formula %.4f\n", measured, formula);
    std::printf("pipeline_step_seconds_median %.4f\n", step_seconds);
    write_curve(o, losses, r.first_step);
  }
  if (r.stopped) return mt::stopped_exit_code;
  if (!o.check_pipeline) return 0;
  // The unpipelined model on this stage's mesh, the same steps, under the stages' layout.
  options whole = o;
  whole.layout = o.layout == "context" || o.layout == "2d_context" ? o.layout : "2d";
  const auto ref = train_layout(whole.layout, g, whole, text, false).losses;
  double worst_loss = 0;
  for (std::size_t i = 0; i < ref.size() && r.holds_loss; ++i)
    worst_loss = std::max(worst_loss, std::abs(r.losses[i] - ref[i]) / std::abs(ref[i]));
  double worst[2] = {worst_loss, r.gradient_error};
  MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, env.world());
  const bool ok = worst[0] <= o.tolerance && worst[1] <= o.tolerance;
  if (root)
    std::printf("check-pipeline: largest relative difference from the unpipelined model: losses %.2e over %lld steps, "
                "first-step gradients %.2e (tolerance %.0e): %s\n",
                worst[0], (long long)o.steps, worst[1], o.tolerance, ok ? "agree" : "DISAGREE");
  return ok ? 0 : 3;
}

// --compare-dtypes: the same run (weights, batches, layout) in float32 and in bf16. bf16 keeps 8
// significant bits, so the losses differ from the first step on; the check is that they stay
// close over the whole run, not that they agree.
int compare_dtypes(const grid& g, options o, const std::vector<unsigned char>& text) {
  const bool root = g.rank() == 0;
  o.dtype = "float32";
  const auto f32 = train_layout(o.layout, g, o, text, false).losses;
  o.dtype = "bf16";
  const auto b16 = train_layout(o.layout, g, o, text, false).losses;
  double worst = 0, sum_f = 0, sum_b = 0;
  const std::size_t n = f32.size(), tail = std::max<std::size_t>(1, n / 4);
  for (std::size_t s = 0; s < n; ++s) {
    const double d = std::abs(b16[s] - f32[s]) / std::abs(f32[s]);
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
    if (s >= n - tail) {
      sum_f += f32[s];
      sum_b += b16[s];
    }
  }
  const bool falls = b16.back() < b16.front() && f32.back() < f32.front();
  const bool ok = worst <= o.bf16_tolerance && falls;
  if (root) {
    std::printf("layout %s, %zu steps: loss float32 %.4f -> %.4f, bf16 %.4f -> %.4f; mean of the last %zu steps "
                "float32 %.4f, bf16 %.4f\n",
                o.layout.c_str(), n, f32.front(), f32.back(), b16.front(), b16.back(), tail, sum_f / tail, sum_b / tail);
    std::printf("largest relative difference between float32 and bf16: %.2e (tolerance %.0e); loss %s: %s\n", worst,
                o.bf16_tolerance, falls ? "falls" : "DOES NOT FALL", ok ? "close" : "APART");
  }
  return ok ? 0 : 3;
}

// --compare-layouts: every layout of --layouts trained in turn from the same start on the same
// batches; their losses agree within --tolerance, and the loss falls.
int compare_layouts(const grid& g, const options& o, const std::vector<unsigned char>& text) {
  const bool root = g.rank() == 0;
  const std::vector<std::string>& names = o.compared;
  std::vector<std::vector<double>> runs;
  for (const auto& n : names) {
    options on = o;
    on.layout = n;
    on.sequence_parallel = o.sequence_parallel && (n == "model" || n == "2d" || n == "fsdp_2d");
    on.tp_overlap = o.tp_overlap && on.sequence_parallel;
    on.tp_overlap_qkv = o.tp_overlap_qkv && on.sequence_parallel;
    runs.push_back(train_layout(n, g, on, text, false).losses);
  }
  double worst = 0;
  if (root) {
    std::printf("%5s", "step");
    for (const auto& n : names) std::printf(" %12s", n.c_str());
    std::printf(" %10s   (fsdp: --zero %d)\n", "max rel", o.zero);
  }
  for (std::size_t s = 0; s < runs[0].size(); ++s) {
    double d = 0;
    for (std::size_t r = 1; r < runs.size(); ++r)
      d = std::max(d, std::abs(runs[r][s] - runs[0][s]) / std::abs(runs[0][s]));
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
    if (root) {
      std::printf("%5zu", s + 1);
      for (const auto& r : runs) std::printf(" %12.6f", r[s]);
      std::printf(" %10.2e\n", d);
    }
  }
  const bool falls = runs[0].back() < runs[0].front();
  const bool ok = worst <= o.tolerance && falls;
  if (root)
    std::printf("largest relative difference between layouts: %.2e (tolerance %.0e); loss %s: %s\n", worst,
                o.tolerance, falls ? "falls" : "DOES NOT FALL", ok ? "agree" : "DISAGREE");
  return ok ? 0 : 3;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor-lm: a byte-level Transformer language model on a 2-D mesh"};
  cli_settings settings;
  add_options(app, o, settings);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  try {
    if (settings.overlap_grad_reduce) {
      mt::gradient_reduction r = mt::gradient_reduction_settings();
      r.overlap = true;
      mt::set_gradient_reduction(r);
    }
    check_options(o);
    // A calibrated plan is for the calibrated machine (cost_model.hpp, plan_for).
    if (!o.calibration.empty()) mt::plan_for(mt::machine_calibration::load(o.calibration));
    // --microbatches without --pipeline: one stage, its microbatches' gradients accumulated.
    if (o.pipeline > 1 || o.microbatches > 0 || o.check_pipeline) {
      if (o.microbatches == 0) o.microbatches = o.pipeline;
      // The schedule's own checks (microbatches in groups of the stages for interleaved, chunks),
      // before any stage is built.
      (void)mt::pipeline::named_schedule(o.schedule, o.pipeline, o.microbatches, o.chunks);
      if (o.compare || o.compare_dtypes || o.rank_layouts || o.generate > 0)
        throw mt::error(fmt::format("{} trains (or plans, or checks) only: no --compare-layouts, --compare-dtypes, "
                                    "--rank-layouts or --generate",
                                    o.pipeline > 1 || o.check_pipeline
                                        ? fmt::format("--pipeline {}", o.pipeline)
                                        : fmt::format("--microbatches {} without --pipeline (gradients accumulated over "
                                                      "{} microbatches on one stage)",
                                                      o.microbatches, o.microbatches)));
      if (o.plan) return plan_pipeline(env, o);
      std::optional<mt::stop_request> stop;  // as below: every stage stops after the same step
      if (const auto sigs = mt::stop_request::parse(o.stop_on); !sigs.empty()) stop.emplace(sigs);
      o.stop = stop ? &*stop : nullptr;
      return run_pipeline(env, o, read_text(o.text, o.length + 3), settings.memory_tolerance);
    }
    if (o.rank_layouts && o.processors > 0) return rank_pipeline_shapes(env, o);
    if (o.processors > 0) throw mt::error("--processors N goes with --rank-layouts");
    if (o.rank_layouts) return rank_layouts(env, o);
    if (o.plan) return plan(env, o);
    const auto text = read_text(o.text, o.length + 3);
    grid g(env, {o.mesh[0], o.mesh[1]});
    if (o.check_plan) return check_plan(g, o, text, settings.memory_tolerance);
    const bool root = env.world_rank() == 0;
    if (root)
      std::printf("meshtensor-lm: %zu bytes of %s; %d layers, d_model %lld, heads %lld, d_kv %lld, d_ff %lld, "
                  "vocab %lld; batch %lld x length %lld; mesh [rows=%d x cols=%d]; %s lr %g, dropout %g\n",
                  text.size(), o.text.c_str(), (int)o.layers, (long long)o.d_model, (long long)o.heads, (long long)o.d_kv,
                  (long long)o.d_ff, (long long)o.vocab, (long long)o.batch, (long long)o.length, g.size<rows>(),
                  g.size<cols>(), o.optimizer.c_str(), o.lr, o.dropout);
    if (!o.compare && !o.compare_dtypes) {
      if (root) std::printf("layout %s; local kernels: %s\n", o.layout.c_str(), mt::kernels::describe().c_str());
      // Caught from here on: a signal before it ends the process as it would without (MPI_Init is done).
      std::optional<mt::stop_request> stop;
      if (const auto sigs = mt::stop_request::parse(o.stop_on); !sigs.empty()) stop.emplace(sigs);
      o.stop = stop ? &*stop : nullptr;
      if (settings.kernel_times) lm::kernel_times::install();
      const auto r = train_layout(o.layout, g, o, text, true);
      if (settings.kernel_times && root)
        lm::kernel_times::print(static_cast<std::int64_t>(std::max<std::size_t>(1, r.losses.size())));
      if (root) write_curve(o, r.losses, r.first_step);
      if (r.stopped) return mt::stopped_exit_code;
      return r.generated_ok ? 0 : 3;
    }
    if (o.compare_dtypes) return compare_dtypes(g, o, text);
    return compare_layouts(g, o, text);
  } catch (const std::exception& e) {
    // Every rank failed alike: rank 0 prints it once and all return 1. This rank alone: the job ends
    // with its message instead of leaving the others waiting in a collective.
    return env.fail(e, "meshtensor-lm: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("meshtensor-lm: error: ");
}
