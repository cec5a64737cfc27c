#pragma once
// meshtensor-lm's options, as the command line sets them (main.cpp) and every part reads them.
#include <array>
#include <cstdint>
#include <meshtensor/meshtensor.hpp>
#include <string>
#include <vector>

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct options {
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string layout = "2d";
  // a vector, not std::array: nvcc cannot compile CLI11 2.1's std::array overloads
  std::vector<int> mesh{2, 2};
  std::int64_t steps = 300, batch = 8, length = 64, d_model = 64, heads = 4, d_kv = 16, d_ff = 256;
  double lr = 2e-3, dropout = 0.0;
  std::string optimizer = "adam";
  int zero = 3;  // with --layout fsdp or fsdp_2d: the ZeRO stage (what is split)
  bool prefetch = false;  // --zero 3: the next block's gathers started while this block computes
  std::uint64_t seed = 1;
  int log_every = 25;
  double straggler_warn = 0.1;  // the slow-rank report warns beyond this share of a logged stretch
  std::string csv = "lm_loss.csv";
  bool compare = false;
  std::vector<std::string> compared{"data", "model", "2d", "fsdp", "fsdp_2d"};
  double tolerance = 1e-4;
  std::int64_t vocab = 256;
  std::string dump;
  std::int64_t warmup = -1;
  bool memory = false;
  std::string checkpoint, resume;
  std::int64_t save_every = 0;
  bool async_save = false;  // checkpoints written by a thread while training goes on
  // --stop-on: the signals that stop training after the current step, with a checkpoint, on every
  // rank alike (mt::stop_request); set by main for the training run only.
  std::string stop_on = "USR1,TERM";
  const mt::stop_request* stop = nullptr;
  std::int64_t layers = 2;
  bool tie_embeddings = false;  // the logits from the embedding, no output projection of their own
  bool recompute = false;  // each block's activations computed again in the backward pass
  bool recompute_attention = false;  // attention's core computed again in the backward pass (selective)
  nn::attention_memory attention_memory() const {
    return recompute_attention ? nn::attention_memory::recompute_core : nn::attention_memory::keep_all;
  }
  std::int64_t loss_chunks = 1;    // the loss's logits for 1/N of each processor's positions at a time
  bool sequence_parallel = false;  // the residual stream split along length (layouts model, 2d)
  bool tp_overlap = false;  // with it: the blocks' reduce_scatters and the MLP's allgather part by part with the products
  bool tp_overlap_qkv = false;  // and the allgather before q, k and v (one ring for the three)
  // Attention of the layouts that split the sequence (context, 2d_context): "all-to-all" or "ring".
  std::string attention = "all-to-all";
  bool ring() const { return attention == "ring"; }
  std::string dtype = "float32";  // or bf16: activations and products in bf16, float master weights
  bool compare_dtypes = false;
  double bf16_tolerance = 1e-2;
  // Planning (docs/plan-mode.md): --plan plans one training step for --mesh on no processes.
  bool plan = false, check_plan = false;
  std::string plan_json, calibration;
  int timeline = 0;  // --plan --calibration: the replayed step drawn this many characters across (0: not drawn)
  bool rank_layouts = false;
  bool rank_schedules = false;  // --rank-layouts --processors: each pipelined shape under every schedule too
  double memory_budget_gib = 8.0;
  // Sampling after training (--generate N): N bytes after --prompt, with a key-value cache.
  std::int64_t generate = 0;
  std::string prompt = "The GNU General Public License is";
  double temperature = 0.7;  // 0: the most likely byte
  bool check_generate = false;
  // --pipeline P: the blocks over P stages of --mesh each (pipeline.hpp).
  int pipeline = 1;
  int microbatches = 0;  // 0: as many as stages
  int processors = 0;      // --rank-layouts over pipeline shapes of this many processors
  int microbatch_rows = 1;
  std::string schedule = "1f1b";
  int chunks = 0;  // parts of the model per stage; 0: the schedule's (2 for interleaved and zb-v, else 1)
  bool check_pipeline = false;

  bool fsdp() const { return layout.rfind("fsdp", 0) == 0; }
  // --zero 1: the parameters whole, the optimizer's state split (sharded<Inner, Shard>).
  bool shard_optimizer_state() const { return fsdp() && zero == 1; }
};
