// A Llama-style language model (RMSNorm, grouped-query attention with rotary position embeddings, a
// SwiGLU feed-forward) that learns
// a text's next byte, its tensors split over a 2-D mesh [rows x cols] by one of four layouts:
//   data     the batch over rows and cols (data parallelism)
//   tensor   the batch over rows; KV heads, d_ff and the vocabulary over cols (Megatron's split)
//   context  the batch over rows; the sequence over cols (context parallelism: attention by
//            all-to-all or, with --attention ring, by a ring; everything else per position)
//   context_tensor  the sequence over rows, zigzag (attention by the ring); KV heads, d_ff and the
//            vocabulary over cols (Llama 3 405B's split within a pipeline stage); with --fsdp
//            the weights are stored with d_model split over rows too, gathered where used
// The model below is the same code under each: only the layout type differs (and, where it splits
// the sequence, which attention runs). --plan prints what a
// step needs per processor and what it communicates, on a mesh of any size, without running it;
// --check-plan runs one step and checks on every rank that its plan is what ran (collectives,
// bytes, peak memory).
// --pipeline P splits the blocks over P stages of --mesh (pipeline.hpp): trained, planned and
// checked against its plan as the unpipelined model is.
// --experts N puts routed SwiGLU experts in the blocks' feed-forward (Mixtral; with --dense-blocks,
// --kv-rank and their siblings, DeepSeek-V3's blocks: dense first blocks and multi-head latent
// attention).
// Rotary positions (nn/rope.hpp) are global, so they are the same under every layout, the zigzag
// sequence included. --generate N continues --ids greedily, one token at a time through a key-value
// cache written in place. The model is model.hpp; Hugging Face checkpoints in and out are
// hugging_face.hpp.
#include <CLI/CLI.hpp>
#include <chrono>
#include <fmt/core.h>
#include <fstream>
#include <iterator>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <meshtensor/plan/cost_model.hpp>
#include <optional>
#include <random>
#include <string_view>

#include "hugging_face.hpp"
#include "model.hpp"
#include "pipeline.hpp"

// LLAMA_ONLY_LAYOUT (CMake: -DMESHTENSOR_LLAMA_LAYOUT=context) builds one of the four layouts: each
// instantiates the whole model, so one compiles in about half the time of all four (nvcc for sm_90:
// context 142 s, all four 265), for a build that runs one. The others are refused by name.
#ifdef LLAMA_ONLY_LAYOUT
#define LLAMA_QUOTE_(x) #x
#define LLAMA_QUOTE(x) LLAMA_QUOTE_(x)
constexpr std::string_view only_layout = LLAMA_QUOTE(LLAMA_ONLY_LAYOUT);
#else
constexpr std::string_view only_layout;
#endif
static_assert(only_layout.empty() || only_layout == "data" || only_layout == "tensor" || only_layout == "context" ||
                  only_layout == "context_tensor",
              "LLAMA_ONLY_LAYOUT names one of the layouts: data, tensor, context or context_tensor");
constexpr bool built(std::string_view layout) { return only_layout.empty() || layout == only_layout; }

std::vector<unsigned char> read_text(const std::string& path, std::int64_t need) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mt::io_error(fmt::format("cannot open '{}'", path));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(bytes.size()) < need)
    throw mt::io_error(fmt::format("'{}' has {} bytes; sequences of this length need {}", path, bytes.size(), need));
  return bytes;
}

// Trains (or, on a planned mesh, plans) up to step o.steps; returns the losses from the first step
// run (after a resumed checkpoint's).
struct losses_from {
  std::int64_t first_step = 0;
  std::vector<double> losses;
  std::int64_t param_bytes = 0, state_bytes = 0;  // this processor's slices, and Adam's state of them
  std::optional<mt::plan_report> plan;            // on a planned mesh, taken while the model lives
};

template <class L, class PL>
losses_from train(const grid& g, const options& o, const std::vector<unsigned char>& text) {
  using ids_t = mt::tensor<std::int32_t, L, batch, length>;
  const bool load = !o.pretrained.empty() && !g.is_planned() && o.resume.empty();
  model<L, PL> m(g, o, !load && o.resume.empty());  // weights a checkpoint fills are not drawn first
  if (load) load_pretrained(m, o.pretrained);
  mt::optim::adam adam({.lr = o.lr});
  auto params = m.tie();
  const auto state = [&] { return m.checkpoint_state(adam, params); };
  std::mt19937_64 rng(7);  // the same batches on every rank and under every layout
  std::uniform_int_distribution<std::int64_t> start(0, static_cast<std::int64_t>(text.size()) - o.length - 2);
  // What the data stream depends on: a resumed run must draw the same batches.
  const mt::io::metadata data_config{{"batch", std::to_string(o.batch)}, {"length", std::to_string(o.length)}, {"text", o.text}};
  std::int64_t step0 = 0;
  if (!o.resume.empty()) {
    auto set = state();
    step0 = resumed_step(mt::io::checkpoints(o.resume).load(set), data_config, o.resume);
    adam.set_steps(step0);
    for (std::int64_t k = 0; k < step0 * o.batch; ++k) (void)start(rng);  // the batches drawn before
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(o.batch * o.length)), labels(ids.size());
  std::vector<double> losses;
  if (g.is_planned() && o.plan && g.rank() == 0) {
    const std::int64_t n = m.parameter_count();
    fmt::print("parameters: {} ({:.2f} billion)\n", n, n / 1e9);
    if (o.experts > 0) {  // a token passes through top_k of the routed experts
      std::int64_t routed = 0;
      const auto add = [&](const auto& w) { routed += w.size(); };
      mt::for_each_tensor(m.expert_gate, add);
      mt::for_each_tensor(m.expert_up, add);
      mt::for_each_tensor(m.expert_down, add);
      const std::int64_t active = n - routed / o.experts * (o.experts - o.top_k);
      fmt::print("active parameters per token: {} ({:.2f} billion; {} of {} routed experts)\n", active, active / 1e9,
                 o.top_k, o.experts);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  std::int64_t logged = step0;  // the step of the last printed line
  for (std::int64_t step = step0; step < o.steps; ++step) {
    if (g.is_planned()) mt::reset_plan(g);  // a plan reports the last step, the optimizer's state made
    for (std::int64_t b = 0; b < o.batch; ++b)
      for (std::int64_t s = start(rng), p = 0; p < o.length; ++p) {
        ids[b * o.length + p] = static_cast<std::int32_t>(text[s + p] % o.vocab);
        labels[b * o.length + p] = static_cast<std::int32_t>(text[s + p + 1] % o.vocab);
      }
    const auto batch_ids = mt::from_host<ids_t>(g, {o.batch, o.length}, ids);
    const auto batch_labels = mt::from_host<ids_t>(g, {o.batch, o.length}, labels);
    const auto loss = o.dtype == "bf16" ? m.template loss<mt::bf16>(batch_ids, batch_labels) : m.loss(batch_ids, batch_labels);
    const auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
    adam.step(params, grads);
    // One load per block, from its first run: a block recomputed in the backward pass adds none.
    if (m.last_loads.size() != m.router_bias.size())
      throw mt::error(fmt::format("step {}: {} experts' loads kept for {} blocks", step + 1, m.last_loads.size(),
                                  m.router_bias.size()));
    if (o.router_bias_rate > 0)  // DeepSeek-V3's balancing: toward the mean load, off the tape
      for (std::size_t b = 0; b < m.router_bias.size(); ++b)
        nn::update_router_bias(m.router_bias[b], m.last_loads[b], o.router_bias_rate);
    const double loss_value = mt::item(loss);  // a plan counts the read's wait for the device
    if (g.is_planned()) continue;
    losses.push_back(loss_value);
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) {
      auto meta = data_config;
      meta["step"] = std::to_string(step + 1);
      const auto name = mt::io::checkpoints(o.checkpoint).save(state(), step + 1, meta);
      if (g.rank() == 0) fmt::print("saved {}/{}\n", o.checkpoint, name);
    }
    if (g.rank() == 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print("step {:5d}  loss {:.4f}  {:.0f} tokens/s\n", step + 1, losses.back(), (step + 1 - logged) * o.batch * o.length / s);
      std::fflush(stdout);
      t0 = std::chrono::steady_clock::now();
      logged = step + 1;
    }
  }
  if (!o.save_pretrained.empty() && !g.is_planned()) {
    save_pretrained(m, o);
    if (g.rank() == 0) fmt::print("saved {} (Hugging Face's layout)\n", o.save_pretrained);
  }
  const std::int64_t param_bytes = m.parameter_bytes();
  std::optional<mt::plan_report> plan;
  if (g.is_planned()) plan = mt::plan_report_of(g);
  return {step0, losses, param_bytes, adam.state_bytes(params), std::move(plan)};
}

// --plan: two steps on a planned mesh (no processes, no data), the second reported; returns the
// peak bytes of the first processor (which holds the largest parts).
template <class L, class PL>
std::int64_t plan(options o, bool print) {
  // read first: a file that cannot be read fails before the planning, not after it
  const auto machine = o.calibration.empty() ? std::optional<mt::machine_calibration>()
                                             : std::optional(mt::machine_calibration::load(o.calibration));
  if (machine) mt::plan_for(*machine);  // the plan is for the calibrated machine
  if (o.pipeline > 1) return plan_pipeline<L, PL>(o, print);
  o.steps = 2;
  o.resume.clear();  // a plan has no data to load or save
  o.save_every = 0;
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
  train<L, PL>(pm, o, std::vector<unsigned char>(static_cast<std::size_t>(o.length + 3), ' '));
  const auto p = mt::plan_report_of(pm);
  const auto gib = [](std::int64_t bytes) { return bytes / 1073741824.0; };
  if (print) {
    fmt::print("one training step of layout {} on mesh {}, per processor (the first):\n", o.layout, p.shape.to_string());
    fmt::print("  peak {:.3f} GiB = parameters {:.3f} + optimizer state {:.3f} + gradients {:.3f} + activations {:.3f}\n",
               gib(p.peak_bytes), gib(p.peak_bytes_of(mt::memory_kind::parameters)),
               gib(p.peak_bytes_of(mt::memory_kind::optimizer_state)), gib(p.peak_bytes_of(mt::memory_kind::gradients)),
               gib(p.peak_bytes_of(mt::memory_kind::activations)));
    if (!o.plan) return p.peak_bytes;
    fmt::print("{}", p.table());
    if (machine) {  // the cost model: docs/plan-mode.md
      fmt::print("predicted step time {} (calibration {})\n", mt::to_string(mt::predict(p, *machine)), o.calibration);
      fmt::print("{}", mt::communication_table(p, *machine));
    }
  }
  return p.peak_bytes;
}

// --check-plan: one step run for real, then planned for this rank's coordinates; on every rank the
// planned collectives (calls and bytes per collective and axis set), parameter and Adam bytes must
// equal the run's, and the planned peak lie within --memory-tolerance of the caching allocator's
// measured one (from before the model is made: what the plan's peak counts).
template <class L, class PL>
int check_plan(const grid& g, options o, const std::vector<unsigned char>& text) {
  o.steps = 1;
  o.save_every = 0;  // the step alone: no checkpoint, no Hugging Face export
  o.save_pretrained.clear();
  g.reset_counters();
  const std::int64_t before = mt::memory_stats().bytes_in_use;
  mt::reset_peak_memory();
  const std::int64_t waits_before = mt::host_waits();
  const auto real = train<L, PL>(g, o, text);
  const std::int64_t waits = mt::host_waits() - waits_before;
  const std::int64_t measured = mt::memory_stats().peak_bytes_in_use - before;
  const mt::comm_counters counted = g.counters();
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]}, {g.template coord<rows>(), g.template coord<cols>()});
  const auto p = *train<L, PL>(pm, o, text).plan;
  const auto v = mt::agree_on_plan(g.communicator().cart(), g, counted, p, real.param_bytes, real.state_bytes, waits);
  if (!v.differences.empty()) fmt::print("rank {}: {}", g.rank(), v.differences);
  const auto memory = mt::agree_on_peak(g.communicator().cart(), p.peak_bytes, measured, o.memory_tolerance);
  if (g.rank() == 0) {
    fmt::print("check-plan (layout {}, {}, mesh {}): {}; rank 0 sent {} bytes in {} collectives\n", o.layout, o.dtype,
               g.shape().to_string(), v.equal_everywhere ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS",
               v.bytes, v.calls);
    std::fflush(stdout);
    memory.print("rank 0's", p.peak_bytes, measured, o.memory_tolerance);
  }
  return v.equal_everywhere && memory.close ? 0 : 3;
}

// --logits-out FILE: the logits of one sequence (--ids) at each position, one line of --vocab
// numbers per position, written by rank 0 (what a comparison with another implementation reads).
template <class L, class PL>
int write_logits(const grid& g, const options& o) {
  if (o.ids.empty()) throw mt::error("--logits-out needs --ids: the token ids of the sequence");
  for (const auto id : o.ids)
    if (id < 0 || id >= o.vocab) throw mt::error(fmt::format("--ids: {} is outside the vocabulary [0, {})", id, o.vocab));
  model<L, PL> m(g, o, o.pretrained.empty());
  if (!o.pretrained.empty()) load_pretrained(m, o.pretrained);
  const mt::no_grad inference;
  const auto n = static_cast<std::int64_t>(o.ids.size());
  const std::vector<std::int32_t> ids(o.ids.begin(), o.ids.end());
  const auto logits = mt::gather_all(m.logits(mt::from_host<mt::tensor<std::int32_t, L, batch, length>>(g, {1, n}, ids)));
  if (g.rank() == 0) {
    std::ofstream out(o.logits_out);
    for (std::int64_t p = 0; p < n; ++p)
      for (std::int64_t v = 0; v < o.vocab; ++v) out << fmt::format("{:.9g}{}", logits[p * o.vocab + v], v + 1 < o.vocab ? ' ' : '\n');
    if (!out) throw mt::io_error(fmt::format("cannot write '{}'", o.logits_out));
  }
  return 0;
}

// --generate N: N tokens after the prompt --ids, each the argmax of the next token's logits (greedy,
// as transformers' generate(do_sample=False)), through the key-value cache: the prompt's positions
// one at a time, then each generated token. Rank 0 prints them (and writes --generate-out).
template <class L>
int generate(const grid& g, const options& o) {
  if (o.ids.empty()) throw mt::error("--generate needs --ids: the prompt's token ids");
  const auto n_prompt = static_cast<std::int64_t>(o.ids.size());
  for (const auto id : o.ids)
    if (id < 0 || id >= o.vocab) throw mt::error(fmt::format("--ids: {} is outside the vocabulary [0, {})", id, o.vocab));
  model<L> m(g, o, o.pretrained.empty());
  if (!o.pretrained.empty()) load_pretrained(m, o.pretrained);
  const mt::no_grad inference;
  using ids_t = mt::tensor<std::int32_t, L, batch, length>;
  auto cache = m.start_cache(g, 1, n_prompt + o.generate);
  std::vector<std::int64_t> out;
  std::int32_t token = static_cast<std::int32_t>(o.ids[0]);
  for (std::int64_t p = 0; p + 1 < n_prompt + o.generate; ++p) {
    const auto next = m.next_logits(mt::from_host<ids_t>(g, {1, 1}, std::vector<std::int32_t>{token}), p, cache);
    if (p + 1 < n_prompt) {  // a prompt position only fills the cache: its logits are not read (nor gathered)
      token = static_cast<std::int32_t>(o.ids[static_cast<std::size_t>(p + 1)]);
      continue;
    }
    const auto logits = mt::gather_all(next);
    // every rank holds the gathered logits: each takes the same argmax (the first of equal ones)
    token = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(token);
  }
  if (g.rank() == 0) {
    fmt::print("generated:");
    for (const auto id : out) fmt::print(" {}", id);
    fmt::print("\n");
    if (!o.generate_out.empty()) {
      std::ofstream f(o.generate_out);
      for (std::size_t i = 0; i < out.size(); ++i) f << out[i] << (i + 1 < out.size() ? ' ' : '\n');
      if (!f) throw mt::io_error(fmt::format("cannot write '{}'", o.generate_out));
    }
  }
  return 0;
}

template <class L, class PL = L>
int run(const mt::environment& env, const options& o) {
  const bool root = env.world_rank() == 0;
  if (o.plan || o.memory_budget > 0) {
    // Every rank plans alike (no communication), so every rank takes the same decision.
    const std::int64_t peak = plan<L, PL>(o, root);
    if (o.memory_budget > 0) {
      const bool fits = peak <= o.memory_budget * 1073741824.0;
      if (root) fmt::print("  budget {:g} GiB per processor: {}\n", o.memory_budget, fits ? "fits" : "DOES NOT FIT");
      if (!fits) return 2;  // refused before any data is read
    }
    if (o.plan) return 0;
  }
  const auto write_csv = [&](std::int64_t first, const std::vector<double>& losses) {
    if (!root || o.csv.empty()) return;
    std::ofstream csv(o.csv);
    csv << "step,loss\n";
    for (std::size_t i = 0; i < losses.size(); ++i) csv << fmt::format("{},{:.9g}\n", first + std::int64_t(i) + 1, losses[i]);
    if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  };
  if (o.pipeline > 1) {
    if (o.text.empty()) throw mt::error("--text FILE: the text to train on (any file: its bytes are the tokens)");
    const auto text = read_text(o.text, o.length + 2);
    if (o.check_plan) return o.dtype == "bf16" ? check_pipeline<L, PL, mt::bf16>(o, text, root) : check_pipeline<L, PL, float>(o, text, root);
    pl::stages<grid> st(MPI_COMM_WORLD, o.pipeline, {o.mesh[0], o.mesh[1]});
    const auto run = o.dtype == "bf16" ? train_pipeline<L, PL, mt::bf16>(st, o, text, root)
                                       : train_pipeline<L, PL, float>(st, o, text, root);
    write_csv(run.first_step, run.losses);
    return 0;
  }
  const grid g(env, {o.mesh[0], o.mesh[1]});
  if (!o.logits_out.empty()) return write_logits<L, PL>(g, o);
  if (o.generate > 0) {
    // one token has no sequence to split: decoding runs where the sequence is whole
    if constexpr (std::is_same_v<L, context_layout> || std::is_same_v<L, context_tensor_layout>)
      throw mt::error(fmt::format("--generate decodes one token at a time, which has no sequence to split: use --layout "
                                  "data or tensor, not {}", o.layout));
    else
      return generate<L>(g, o);
  }
  if (o.text.empty()) throw mt::error("--text FILE: the text to train on (any file: its bytes are the tokens)");
  if (o.check_plan) return check_plan<L, PL>(g, o, read_text(o.text, o.length + 2));
  const auto trained = train<L, PL>(g, o, read_text(o.text, o.length + 2));
  write_csv(trained.first_step, trained.losses);
  return 0;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  CLI::App app{"meshtensor: a Llama-style language model on a 2-D mesh"};
  options o;
  app.add_option("--layout", o.layout, "data, tensor, context or context_tensor")
      ->check(CLI::IsMember({"data", "tensor", "context", "context_tensor"}))->capture_default_str();
  app.add_option("--attention", o.attention, "where the sequence is split: all-to-all or ring")
      ->check(CLI::IsMember({"all-to-all", "ring"}))->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product: the number of ranks, or any with --plan)")->expected(2);
  app.add_option("--steps", o.steps, "training steps")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  app.add_option("--length", o.length, "tokens per sequence")->capture_default_str();
  app.add_option("--d-model", o.d_model, "width of the residual stream")->capture_default_str();
  app.add_option("--layers", o.layers, "blocks")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "key and value heads")->capture_default_str();
  app.add_option("--group", o.group, "query heads per KV head")->capture_default_str();
  app.add_option("--d-kv", o.d_kv, "width of a head")->capture_default_str();
  app.add_option("--d-ff", o.d_ff, "width of the feed-forward")->capture_default_str();
  app.add_option("--vocab", o.vocab, "vocabulary (256: bytes; larger only matters to --plan)")->capture_default_str();
  app.add_option("--lr", o.lr, "Adam's learning rate")->capture_default_str();
  app.add_option("--rope-theta", o.rope_theta, "rotary position embeddings' base (Llama 3: 500000)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--rms-eps", o.rms_eps, "RMSNorm's epsilon")->capture_default_str();
  app.add_flag("--tie-embeddings", o.tie_embeddings, "the output projection is the embedding table");
  app.add_option("--from-pretrained", o.pretrained, "a Hugging Face Llama checkpoint's directory (config.json and "
                 "model.safetensors or its shards): its architecture and weights, in float32");
  app.add_option("--config", o.config, "a Hugging Face Llama config.json: the architecture (with --plan: a published "
                 "size planned from its card's config alone)");
  app.add_option("--save-pretrained", o.save_pretrained, "after training, write the weights and config.json as "
                 "transformers' save_pretrained does (LlamaForCausalLM loads the directory)");
  app.add_option("--save-dtype", o.save_dtype, "--save-pretrained's dtype: float32 or bf16")
      ->check(CLI::IsMember({"float32", "bf16"}))->capture_default_str();
  app.add_option("--max-shard-bytes", o.max_shard_bytes, "--save-pretrained: a new file past this many bytes")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--ids", o.ids, "token ids of one sequence, for --logits-out");
  app.add_option("--generate", o.generate, "continue --ids by this many tokens, greedily, through a key-value cache, "
                 "and stop")->check(CLI::PositiveNumber);
  app.add_option("--generate-out", o.generate_out, "with --generate: also write the generated ids to this file");
  app.add_option("--logits-out", o.logits_out, "write the logits of --ids (a line of --vocab numbers per position) and stop");
  app.add_option("--text", o.text, "the text to train on (any file: its bytes are the tokens)");
  app.add_option("--checkpoint", o.checkpoint, "directory of checkpoints, saved every --save-every steps");
  app.add_option("--save-every", o.save_every, "steps between checkpoints");
  app.add_option("--resume", o.resume, "continue from the latest checkpoint in this directory");
  app.add_option("--log-every", o.log_every, "steps between printed losses")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--csv", o.csv, "write every step's loss to this file");
  app.add_option("--experts", o.experts, "a mixture of experts in every block: this many routed SwiGLU experts, each "
                 "--d-ff wide, in place of the feed-forward (--layout data or tensor: the experts split where the batch is; context: "
                 "over rows and cols, each block's sequences moved whole to where they route)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--top-k", o.top_k, "with --experts: the experts each token goes to")->capture_default_str();
  app.add_option("--shared-experts", o.shared_experts, "with --experts: SwiGLU experts every token goes through beside them")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--router", o.router, "with --experts: the router's scores, softmax (Mixtral) or sigmoid (DeepSeek-V3)")
      ->check(CLI::IsMember({"softmax", "sigmoid"}))->capture_default_str();
  app.add_option("--routed-scale", o.routed_scale, "with --experts: the routed experts' weights scaled (DeepSeek-V3: 2.5)")
      ->capture_default_str();
  app.add_option("--capacity", o.capacity, "with --experts: tokens per expert per sequence, choices past it dropped "
                 "(0: dropless)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--expert-chunks", o.expert_chunks, "with --experts: the experts' buffers (one-hot) or each processor's "
                 "experts (ragged) in N chunks, the next chunk's dispatch and the last one's return in flight while a "
                 "chunk's experts compute (1: no overlap)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--moe-dispatch", o.moe_dispatch, "with --experts: one-hot (Mesh-TensorFlow's dispatch and combine "
                 "products over the experts' buffers) or ragged (dropless: each token's rows sent to its experts' "
                 "processors, one product per expert; needs --capacity 0)")
      ->check(CLI::IsMember({"one-hot", "ragged"}))->capture_default_str();
  app.add_option("--aux-loss", o.aux_loss, "with --experts: the balance loss's weight in the loss")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--router-bias-rate", o.router_bias_rate, "with --experts: after each step, each expert's router bias "
                 "moves by this toward the mean load (DeepSeek-V3: 0.001; 0: no bias)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--dense-blocks", o.dense_blocks, "with --experts: the first N blocks have a dense SwiGLU feed-forward "
                 "(--dense-d-ff wide) in place of the experts (DeepSeek-V3: 3)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--dense-d-ff", o.dense_d_ff, "with --dense-blocks: their feed-forward's width (0: --d-ff; DeepSeek-V3: 18432)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--kv-rank", o.kv_rank, "multi-head latent attention (DeepSeek-V2 and V3): keys and values from a "
                 "projection this wide (kv_lora_rank; --d-kv is then a head's width without positions, its value's too; "
                 "0: grouped-query attention)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--q-rank", o.q_rank, "with --kv-rank: queries from a projection this wide (q_lora_rank)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--d-rope", o.d_rope, "with --kv-rank: the rotated part of a query and key head, beside --d-kv's "
                 "(qk_rope_head_dim; even)")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_flag("--fsdp", o.fsdp, "with --layout context_tensor: store the float weights, their gradients and Adam's state "
               "split over rows (d_model), each weight gathered where a block uses it (fully sharded data parallelism "
               "over the context axis)");
  app.add_flag("--recompute", o.recompute, "keep only each block's input for the backward pass, computing the rest again");
  app.add_option("--loss-chunks", o.loss_chunks, "compute the loss's logits for 1/N of each processor's positions at a time, "
                 "forward and backward (again in the backward pass): the whole [batch, length, vocab] logits never exist")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32, or bf16: activations and products in bf16, float master weights")
      ->check(CLI::IsMember({"float32", "bf16"}))->capture_default_str();
  app.add_flag("--plan", o.plan, "print what a step needs on --mesh, without running it");
  app.add_option("--calibration", o.calibration, "with --plan: the step time predicted on the machine this file describes "
                 "(benchmarks/bench_calibrate.cpp writes one)");
  app.add_option("--memory-budget", o.memory_budget, "GiB per processor: plan the step first, refuse to run (exit 2) if its planned peak does not fit "
                 "(the program itself and MPI's buffers come on top)");
  app.add_option("--pipeline", o.pipeline, "the blocks over this many pipeline stages of --mesh each (ranks: stages x "
                 "rows x cols); with --plan each stage planned with the microbatches it holds in flight")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--microbatches", o.microbatches, "with --pipeline: microbatches of --batch sequences per step (default: --pipeline); "
                 "the same training as an unpipelined run of microbatches x --batch sequences")
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", o.schedule, "with --pipeline: gpipe, 1f1b or zb-h1")
      ->check(CLI::IsMember({"gpipe", "1f1b", "zb-h1"}))->capture_default_str();
  app.add_flag("--check-plan", o.check_plan, "run one step, plan it, and check the plan equals it on every rank "
               "(collectives, parameter and optimizer bytes, the peak within --memory-tolerance)");
  app.add_option("--memory-tolerance", o.memory_tolerance,
                 "with --check-plan: how far the planned peak may lie from the measured one, as a fraction")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    if (o.save_every > 0 && o.checkpoint.empty()) throw mt::error("--save-every needs --checkpoint DIR");
    if (!o.pretrained.empty() && !o.config.empty())
      throw mt::error("--from-pretrained DIR reads DIR/config.json: drop --config");
    if (!o.pretrained.empty() || !o.config.empty()) {
      const char* from = o.pretrained.empty() ? "--config" : "--from-pretrained";
      for (const char* flag : {"--d-model", "--layers", "--kv-heads", "--group", "--d-kv", "--d-ff", "--vocab",
                                "--rope-theta", "--rms-eps", "--tie-embeddings"})
        if (app.count(flag) > 0)
          throw mt::error(fmt::format("{} takes the architecture from config.json: drop {}", from, flag));
      read_config(o, o.pretrained.empty() ? o.config : o.pretrained + "/config.json");
    }
    if (o.pipeline > 1) {
      for (const char* flag : {"--generate", "--logits-out", "--from-pretrained", "--save-pretrained", "--fsdp"})
        if (app.count(flag) > 0)
          throw mt::error(fmt::format("--pipeline {} trains (from scratch or its own checkpoints) and plans; {} is for an "
                                      "unpipelined run", o.pipeline, flag));
      if (o.tie_embeddings)  // Megatron sums the two copies' gradients over an embedding group; not built here
        throw mt::error(fmt::format("--tie-embeddings with --pipeline {}: the first stage's embedding and the last "
                                    "stage's output layer would be two copies trained apart", o.pipeline));
      if (o.pipeline > o.layers)
        throw mt::error(fmt::format("--pipeline {} stages need at least as many blocks; --layers is {}", o.pipeline, o.layers));
      if (!o.calibration.empty())
        throw mt::error("--calibration with --pipeline: the step time of a pipeline is meshtensor-lm's --plan (its "
                        "bubble and sends); drop one");
      if (o.microbatches == 0) o.microbatches = o.pipeline;
    } else {
      for (const char* flag : {"--microbatches", "--schedule"})
        if (app.count(flag) > 0) throw mt::error(fmt::format("{} needs --pipeline P (P > 1)", flag));
    }
    if (!o.calibration.empty() && !o.plan) throw mt::error("--calibration needs --plan: it predicts the planned step's time");
    if (o.check_plan && (o.plan || !o.resume.empty() || o.generate > 0 || !o.logits_out.empty()))
      throw mt::error("--check-plan runs one training step from the start against its plan: drop --plan, --resume, "
                      "--generate and --logits-out");
    if (o.attention == "ring" && o.layout.rfind("context", 0) != 0)
      throw mt::error(fmt::format("--attention ring needs a layout that splits the sequence (context or context_tensor), not {}", o.layout));
    if (!built(o.layout))
      throw mt::error(fmt::format("--layout {}: this build holds --layout {} alone (compiled with LLAMA_ONLY_LAYOUT={}, "
                                  "which CMake's MESHTENSOR_LLAMA_LAYOUT sets): build without it for all four",
                                  o.layout, only_layout, only_layout));
    if (o.experts > 0) {
      if (o.layout == "context_tensor")
        throw mt::error("--experts: a sequence is routed as a group, which --layout context_tensor splits over rows "
                        "(zigzag) with nothing to move it to: use --layout data, tensor or context (which routes each "
                        "block's sequences whole, moved by an alltoall over cols)");
      if (o.experts < 2 || o.top_k < 1 || o.top_k > o.experts)
        throw mt::error(fmt::format("--experts {} --top-k {}: needs at least 2 experts and 1 <= --top-k <= --experts",
                                    o.experts, o.top_k));
      if (o.generate > 0)
        throw mt::error("--experts with --generate: the key-value cache's decoder has no experts yet");
      if (!o.pretrained.empty() || !o.save_pretrained.empty())
        throw mt::error("--experts: Hugging Face's MoE checkpoints (one tensor per expert) are not mapped: drop "
                        "--from-pretrained and --save-pretrained");
      if (o.dense_blocks >= o.layers)
        throw mt::error(fmt::format("--dense-blocks {} leaves none of the --layers {} blocks to the experts", o.dense_blocks,
                                    o.layers));
      if (app.count("--dense-d-ff") > 0 && o.dense_blocks == 0) throw mt::error("--dense-d-ff needs --dense-blocks N");
    } else {
      for (const char* flag : {"--top-k", "--shared-experts", "--router", "--routed-scale", "--capacity",
                               "--expert-chunks", "--moe-dispatch", "--aux-loss", "--router-bias-rate", "--dense-blocks", "--dense-d-ff"})
        if (app.count(flag) > 0) throw mt::error(fmt::format("{} needs --experts N", flag));
    }
    if (o.kv_rank > 0) {
      if (o.layout != "tensor")
        throw mt::error(fmt::format("--kv-rank: latent attention is built for --layout tensor (on [N x 1] the batch "
                                    "and the experts over N, DeepSeek's expert and data parallelism), not {}", o.layout));
      if (o.q_rank <= 0 || o.d_rope <= 0 || o.d_rope % 2 != 0)
        throw mt::error(fmt::format("--kv-rank {} needs --q-rank > 0 and an even --d-rope > 0 (got --q-rank {}, --d-rope {})",
                                    o.kv_rank, o.q_rank, o.d_rope));
      if (!o.pretrained.empty() || !o.save_pretrained.empty() || !o.config.empty())
        throw mt::error("--kv-rank: DeepSeek's checkpoints and config.json are not mapped: drop --from-pretrained, "
                        "--save-pretrained and --config");
    } else {
      for (const char* flag : {"--q-rank", "--d-rope"})
        if (app.count(flag) > 0) throw mt::error(fmt::format("{} needs --kv-rank N (latent attention)", flag));
    }
    if (o.fsdp && o.layout != "context_tensor")
      throw mt::error(fmt::format("--fsdp splits the weights over rows, the axis --layout context_tensor splits the sequence "
                                  "over; --layout {} is not sharded: use --layout context_tensor", o.layout));
    // the KV heads are split over cols already: the all-to-all has no heads left to move the sequence to
    if (o.layout == "context_tensor" && o.attention != "ring")
      throw mt::error("--layout context_tensor attends by the ring: add --attention ring");
    if constexpr (built("tensor"))
      if (o.layout == "tensor") return run<tensor_layout>(env, o);
    if constexpr (built("context"))
      if (o.layout == "context") return run<context_layout>(env, o);
    if constexpr (built("context_tensor"))
      if (o.layout == "context_tensor")
        return o.fsdp ? run<context_tensor_layout, context_tensor_sharded>(env, o) : run<context_tensor_layout>(env, o);
    if constexpr (built("data")) return run<data_layout>(env, o);
    throw mt::error(fmt::format("--layout {}: not among the layouts built", o.layout));  // refused above
  } catch (const std::exception& e) {
    return env.fail(e, "llama: ");  // one rank's error ends the job with its message
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("llama: ");
}
