#pragma once
// meshtensor-lm's command line: its options (main.cpp's header says what the tool does) and the
// checks of their combinations, each refusal naming the flags.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fmt/core.h>
#include <string>

#include "options.hpp"

// What the command line sets beside options: how the tool runs, not the model.
struct cli_settings {
  bool kernel_times = false;
  double memory_tolerance = 0.05;  // --check-plan's planned peak against the measured one
  bool overlap_grad_reduce = false;
};

inline void add_options(CLI::App& app, options& o, cli_settings& s) {
  app.add_option("--text", o.text, "training text")->capture_default_str();
  app.add_option("--layout", o.layout, "data | model | 2d | fsdp | fsdp_2d | context | 2d_context")
      ->check(CLI::IsMember({"data", "model", "2d", "fsdp", "fsdp_2d", "context", "2d_context"}))
      ->capture_default_str();
  app.add_option("--attention", o.attention,
                 "with --layout context or 2d_context (the sequence split): all-to-all (the sequence's split moved "
                 "to the heads and back) or ring (the keys' and values' blocks passed around the context axis)")
      ->check(CLI::IsMember({"all-to-all", "ring"}))
      ->capture_default_str();
  app.add_option("--zero", o.zero,
                 "with --layout fsdp or fsdp_2d: 3 parameters, gradients and optimizer state split, each parameter "
                 "gathered where it is used; 2 the same, gathered once per step; 1 only the optimizer state split")
      ->check(CLI::Range(1, 3))
      ->capture_default_str();
  app.add_flag("--prefetch", o.prefetch,
               "with --layout fsdp or fsdp_2d --zero 3 (float32, no --recompute): start the next block's gathers "
               "(nonblocking allgathers) before this block computes");
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product must be the number of ranks)")->expected(2);
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", o.batch)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--length", o.length)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-model", o.d_model)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--heads", o.heads)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-kv", o.d_kv)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-ff", o.d_ff)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--dropout", o.dropout)->check(CLI::Range(0.0, 0.9))->capture_default_str();
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"adam", "adafactor"}))->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--log-every", o.log_every)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--straggler-warn", o.straggler_warn,
                 "at each log line, name the rank the others waited for; warn when it is behind by more than this "
                 "share of the stretch")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--csv", o.csv, "loss curve output (a PNG next to it when gnuplot is installed)")->capture_default_str();
  app.add_flag("--compare-layouts", o.compare, "train every layout for --steps steps and check the losses agree");
  app.add_option("--layouts", o.compared, "with --compare-layouts: the layouts compared, the first the reference")
      ->check(CLI::IsMember({"data", "model", "2d", "fsdp", "fsdp_2d", "context", "2d_context"}))
      ->capture_default_str();
  app.add_option("--tolerance", o.tolerance, "relative tolerance of --compare-layouts")->capture_default_str();
  app.add_option("--vocab", o.vocab, "vocabulary: 256 = bytes; above, byte pairs mod vocab")
      ->check(CLI::Range(2, 65536))->capture_default_str();
  app.add_option("--dump", o.dump, "directory for the initial weights, first batch, loss and gradients (.npy)");
  app.add_option("--warmup", o.warmup, "print the median step time after this many warm-up steps");
  app.add_flag("--memory", o.memory, "print the bytes of parameters + Adam state per rank and the peak RSS");
  app.add_option("--checkpoint", o.checkpoint, "directory for checkpoints (with --save-every)");
  app.add_option("--save-every", o.save_every, "save a checkpoint every N steps (needs --checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--async-save", o.async_save,
               "write checkpoints in the background: a save blocks only to copy this rank's state");
  app.add_option("--resume", o.resume, "continue from this directory's current checkpoint, up to --steps");
  app.add_option("--stop-on", o.stop_on,
                 "signals that stop training after the current step on every rank, save a checkpoint (with "
                 "--checkpoint) and exit with status 85 (a batch scheduler's warning; 'none': the default actions)")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "number of Transformer blocks")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "layouts model, 2d and fsdp_2d (and --pipeline's 2d stages): split the residual stream along length over the "
               "axes of heads, so that the blocks' sums arrive by reduce_scatter, the layer norms run on a part of the "
               "sequence and the products keep a part of their input for the backward pass "
               "(with --compare-layouts: the data layout runs without it, as the reference)");
  app.add_flag("--tp-overlap", o.tp_overlap,
               "with --sequence-parallel: the reduce_scatters after attention's and the MLP's last products and the "
               "allgather before the MLP's first run part by part around the ring of the tensor axes, each part's "
               "product computed while the next part travels (Megatron-Core's --tp-comm-overlap)");
  app.add_flag("--tp-overlap-qkv", o.tp_overlap_qkv,
               "with --sequence-parallel: --tp-overlap, and the allgather before q, k and v part by part too, one ring "
               "for the three products (more, smaller products: --plan --calibration says whether it pays)");
  app.add_flag("--tie-embeddings", o.tie_embeddings,
               "compute the logits with the embedding (GPT-2's and GPT-3's weight tying): no output projection");
  app.add_flag("--recompute", o.recompute,
               "keep only each block's input for the backward pass and compute the block again there (less memory, "
               "one more forward pass)");
  app.add_option("--loss-chunks", o.loss_chunks,
                 "compute the loss's logits for 1/N of each processor's positions at a time, forward and backward "
                 "(again in the backward pass): the whole [batch, length, vocab] logits never exist")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--recompute-attention", o.recompute_attention,
               "keep q, k and v of each block's attention and compute its scores, softmax and product with v again "
               "in the backward pass (Korthikanti et al.'s selective recomputation: no s x s tensor per head kept)");
  app.add_flag("--compare-dtypes", o.compare_dtypes,
               "train --layout in float32 and in bf16 for --steps steps from the same weights and batches, and "
               "check that the losses stay within --bf16-tolerance of each other (relative)");
  app.add_option("--bf16-tolerance", o.bf16_tolerance, "relative tolerance of --compare-dtypes")->capture_default_str();
  app.add_option("--dtype", o.dtype,
                 "float32, or bf16: activations and products in bf16 (sums and row statistics in float), "
                 "parameters and optimizer in float")
      ->check(CLI::IsMember({"float32", "bf16"}))
      ->capture_default_str();
  app.add_flag("--plan", o.plan, "plan one training step on a mesh of --mesh sizes (no processes, no data) and report it");
  app.add_option("--plan-json", o.plan_json, "with --plan: write the plan as JSON to this file");
  app.add_option("--memory-budget", o.memory_budget_gib, "with --plan: memory per processor in GiB (a TPUv2 core: 8)")
      ->capture_default_str();
  app.add_option("--timeline", o.timeline,
                 "with --plan and --calibration: draw the planned step replayed on the calibrated machine, this many "
                 "characters across (its work, its waits, and each set of axes' transfers in flight)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--calibration", o.calibration, "with --plan: predict the step time from this bench_calibrate file");
  app.add_option("--processors", o.processors,
                 "with --rank-layouts: rank every pipeline x rows x cols shape of this many processors instead")
      ->check(CLI::PositiveNumber);
  app.add_option("--microbatch-rows", o.microbatch_rows,
                 "with --rank-layouts --processors: rows of a microbatch per data-parallel processor")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--rank-layouts", o.rank_layouts,
               "rank the compiled-in layouts on --mesh by predicted step time (needs --calibration)");
  app.add_flag("--rank-schedules", o.rank_schedules,
               "with --rank-layouts --processors: rank each pipelined shape under 1f1b, zb-h1, zb-v and interleaved "
               "(2 to 4 chunks) too, with the memory each needs");
  app.add_flag("--check-plan", o.check_plan, "run one step, plan it, and check the plan equals it on every rank");
  app.add_option("--memory-tolerance", s.memory_tolerance,
                 "with --check-plan: how far the planned peak may lie from the measured one, as a fraction")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  app.add_option("--pipeline", o.pipeline,
                 "split the blocks over this many pipeline stages of --mesh each (ranks: stages x rows x cols), "
                 "computing under the 2d layout inside each stage (--layout context or 2d_context: that layout)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--microbatches", o.microbatches,
                 "with --pipeline: microbatches per step (default: the stages); alone: gradient accumulation over them")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--schedule", o.schedule,
                 "with --pipeline: gpipe | 1f1b | interleaved (1f1b over --chunks parts per stage) | zb-h1 | zb-v "
                 "(zero-bubble: each backward split into the input's and the weights' gradients)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}))
      ->capture_default_str();
  app.add_option("--chunks", o.chunks,
                 "with --schedule interleaved: parts of the model per stage (default 2; zb-v runs 2, the others 1)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--check-pipeline", o.check_pipeline,
               "with --pipeline: also train the unpipelined model on each stage's mesh and check losses and the first "
               "step's gradients agree to --tolerance");
  app.add_option("--generate", o.generate, "after training: sample this many bytes after --prompt (key-value cache)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prompt", o.prompt, "with --generate: the text to continue")->capture_default_str();
  app.add_option("--temperature", o.temperature, "with --generate: sampling temperature (0: the most likely byte)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--check-generate", o.check_generate,
               "with --generate: check the cached logits against a full forward pass over the sequence");
  app.add_flag("--overlap-grad-reduce", s.overlap_grad_reduce,
               "start the weights' gradient reductions nonblocking as the backward pass makes them (the data-parallel "
               "buckets' allreduces, fsdp's reduce_scatters), landing before the optimizer reads them "
               "(Megatron-LM's --overlap-grad-reduce; the same as MESHTENSOR_GRADIENT_OVERLAP=1)");
  app.add_flag("--kernel-times", s.kernel_times,
               "print where the steps' time went on the device, by Kokkos kernel (each waited for alone: slower)");
}

// The combinations of flags that cannot run, refused by name before anything is built; fills in
// what follows from the others (--chunks by the schedule).
inline void check_options(options& o) {
  if (o.save_every > 0 && o.checkpoint.empty()) throw mt::error("--save-every needs --checkpoint DIR");
  if (o.async_save && o.checkpoint.empty()) throw mt::error("--async-save needs --checkpoint DIR");
  if (o.compare && (!o.checkpoint.empty() || !o.resume.empty()))
    throw mt::error("--compare-layouts trains every layout from scratch; it takes no --checkpoint or --resume");
  if (o.prefetch && (!o.fsdp() || o.zero != 3 || o.recompute || o.dtype != "float32") && !o.compare)
    throw mt::error("--prefetch starts the gathers of --layout fsdp or fsdp_2d at --zero 3, in float32, without "
                    "--recompute (whose blocks gather again in the backward pass)");
  // The layouts that split the sequence (context parallelism), run or compared.
  const auto splits_length = [](const std::string& n) { return n == "context" || n == "2d_context"; };
  const bool context = splits_length(o.layout) ||
                       (o.compare && std::any_of(o.compared.begin(), o.compared.end(), splits_length));
  if (o.ring() && !context)
    throw mt::error(fmt::format("--attention ring passes the sequence's blocks around the context axis: it needs "
                                "--layout context or 2d_context ({} does not split the sequence)",
                                o.compare ? "none of --layouts" : "--layout " + o.layout));
  if (o.rank_layouts && splits_length(o.layout))
    throw mt::error(fmt::format("--rank-layouts ranks the data, model, 2d and fsdp layouts (with --processors, "
                                "pipelines of 2d stages), not --layout {} yet: plan it with --plan", o.layout));
  if (context && o.sequence_parallel)
    throw mt::error("--sequence-parallel splits the residual stream along length outside attention; --layout "
                    "context and 2d_context already split length everywhere (layer norms, dropout and residual "
                    "adds included): they are sequence parallelism, and take no --sequence-parallel");
  if (o.timeline > 0 && (!o.plan || o.calibration.empty()))
    throw mt::error("--timeline draws the planned step replayed on a calibrated machine: add --plan and --calibration FILE");
  if (o.tp_overlap_qkv && !o.sequence_parallel)
    throw mt::error("--tp-overlap-qkv overlaps sequence parallelism's allgathers and reduce_scatters with the products: "
                    "add --sequence-parallel");
  if (o.tp_overlap && !o.sequence_parallel)
    throw mt::error("--tp-overlap overlaps sequence parallelism's allgathers and reduce_scatters with the products: "
                    "add --sequence-parallel");
  if (o.sequence_parallel && !o.compare && (o.layout == "data" || o.layout == "fsdp"))
    throw mt::error("--sequence-parallel needs a layout that splits heads and d_ff (model, 2d or fsdp_2d)");
  if (o.loss_chunks > 1 && (o.sequence_parallel || o.pipeline > 1 || o.microbatches > 0 || o.check_pipeline))
    throw mt::error(fmt::format("--loss-chunks cuts the loss of an unpipelined step without --sequence-parallel, not "
                                "with {}: drop one of the two",
                                o.sequence_parallel ? "--sequence-parallel"
                                : o.pipeline > 1    ? "--pipeline"
                                : o.microbatches > 0 ? "--microbatches"
                                                     : "--check-pipeline"));
  if (o.sequence_parallel && o.prefetch && !o.compare)
    throw mt::error("--prefetch starts the gathers of the unsplit blocks; --sequence-parallel's blocks gather at "
                    "each use: use one of the two");
  if (o.zero != 3 && !o.fsdp() && !o.compare && !o.rank_layouts)
    throw mt::error(fmt::format("--zero {} applies to --layout fsdp and fsdp_2d, not {}", o.zero, o.layout));
  if (o.chunks == 0) o.chunks = o.schedule == "interleaved" || o.schedule == "zb-v" ? 2 : 1;
}
