// A Llama-style language model (RMSNorm, grouped-query attention with rotary position embeddings, a
// SwiGLU feed-forward) that learns
// a text's next byte, its tensors split over a 2-D mesh [rows x cols] by one of four layouts:
//   data     the batch over rows and cols (data parallelism)
//   tensor   the batch over rows; KV heads, d_ff and the vocabulary over cols (Megatron's split)
//   context  the batch over rows; the sequence over cols (context parallelism: attention by
//            all-to-all or, with --attention ring, by a ring; everything else per position)
//   context_tensor  the sequence over rows, zigzag (attention by the ring); KV heads, d_ff and the
//            vocabulary over cols (Llama 3 405B's split within a pipeline stage)
// The model below is the same code under each: only the layout type differs (and, where it splits
// the sequence, which attention runs). --plan prints what a
// step needs per processor and what it communicates, on a mesh of any size, without running it.
// Rotary positions (nn/rope.hpp) are global, so they are the same under every layout, the zigzag
// sequence included.
#include <CLI/CLI.hpp>
#include <chrono>
#include <fmt/core.h>
#include <fstream>
#include <iterator>
#include <functional>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/io/pretrained.hpp>
#include <meshtensor/meshtensor.hpp>
#include <nlohmann/json.hpp>
#include <meshtensor/plan/cost_model.hpp>
#include <optional>
#include <random>

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct memory_length : mt::dim<"memory_length"> {};  // the attended positions
struct d_model : mt::dim<"d_model"> {};
struct kv_heads : mt::dim<"kv_heads"> {};  // key and value heads
struct group : mt::dim<"group"> {};        // query heads per KV head
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

using data_layout = mt::layout<grid, mt::split<batch, rows, cols>>;
using tensor_layout = mt::layout<grid, mt::split<batch, rows>, mt::split<kv_heads, cols>, mt::split<d_ff, cols>,
                                 mt::split<vocab, cols>>;
using context_layout = mt::layout<grid, mt::split<batch, rows>, mt::split<length, cols>>;
// The ring's layout cuts the sequence zigzag (chunks q and 2P - 1 - q on part q): under the causal
// mask every part then computes as many blocks, where a contiguous split leaves the last part P
// blocks and the first one.
using context_tensor_layout = mt::layout<grid, mt::zigzag<length, rows>, mt::split<kv_heads, cols>, mt::split<d_ff, cols>,
                                         mt::split<vocab, cols>>;

struct options {
  std::string layout = "data", attention = "all-to-all", text, checkpoint, resume, csv;
  std::string dtype = "float32", calibration;
  std::vector<int> mesh{1, 1};
  std::int64_t steps = 100, batch = 8, length = 64, d_model = 64, layers = 2, kv_heads = 2, group = 2, d_kv = 16,
               d_ff = 172, vocab = 256, save_every = 0, log_every = 10;
  double lr = 3e-3, memory_budget = 0;  // GiB per processor; 0: unchecked
  double rope_theta = 500000, rms_eps = 1e-5;  // Llama 3's
  std::optional<nn::rope_llama3_scaling> rope_llama3;  // Llama 3.1's frequency scaling (from a config.json)
  bool plan = false, recompute = false, tie_embeddings = false;
  std::string pretrained, config, logits_out;  // --from-pretrained DIR; --config FILE; --logits-out FILE of --ids
  std::string config_text;                     // the config.json read, written again by --save-pretrained
  std::string save_pretrained, save_dtype = "float32";
  std::int64_t max_shard_bytes = std::int64_t{5} << 30;
  std::vector<std::int64_t> ids;
};

template <class T>
constexpr bool is_vector = false;
template <class T>
constexpr bool is_vector<std::vector<T>> = true;

template <class L>
struct model {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  template <class... D>
  using per_block = std::vector<t<D...>>;  // one entry per block: gradient() and adam take a vector as one
  // Each weight's dims in the order of Hugging Face's tensor ([out, in] for a Linear, its heads
  // split into kv_heads x group), so that its checkpoints load as they are (the einsums do not
  // care about the order).
  t<vocab, d_model> embedding;
  per_block<d_model> attention_norm, feed_forward_norm;
  per_block<kv_heads, group, d_kv, d_model> wq;
  per_block<kv_heads, d_kv, d_model> wk, wv;
  per_block<d_model, kv_heads, group, d_kv> wo;
  per_block<d_ff, d_model> w_gate, w_up;
  per_block<d_model, d_ff> w_down;
  t<d_model> final_norm;
  std::vector<t<vocab, d_model>> output;  // none where tied to the embedding (--tie-embeddings)

  auto tie() { return std::tie(embedding, attention_norm, feed_forward_norm, wq, wk, wv, wo, w_gate, w_up, w_down, final_norm, output); }
  // Hugging Face's names (LlamaForCausalLM's state dict): its checkpoints and this model's name the
  // same tensors. "{}" is the block.
  static constexpr const char* names[] = {
      "model.embed_tokens.weight", "model.layers.{}.input_layernorm.weight",
      "model.layers.{}.post_attention_layernorm.weight", "model.layers.{}.self_attn.q_proj.weight",
      "model.layers.{}.self_attn.k_proj.weight", "model.layers.{}.self_attn.v_proj.weight",
      "model.layers.{}.self_attn.o_proj.weight", "model.layers.{}.mlp.gate_proj.weight",
      "model.layers.{}.mlp.up_proj.weight", "model.layers.{}.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"};
  // f(name, tensor) for every weight.
  template <class F>
  void each_named(F&& f) {
    std::size_t kind = 0;
    const auto visit = [&]<class P>(P& p) {
      if constexpr (is_vector<P>)
        for (std::size_t b = 0; b < p.size(); ++b) f(fmt::format(fmt::runtime(names[kind]), b), p[b]);
      else
        f(std::string(names[kind]), p);
      ++kind;
    };
    std::apply([&](auto&... p) { (visit(p), ...); }, tie());
  }

  model(const grid& g, const options& o) {
    const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);  // what a plan counts them as
    const std::int64_t dm = o.d_model, kv = o.kv_heads, gr = o.group, dk = o.d_kv, ff = o.d_ff;
    std::uint64_t seed = 1;
    const auto init = [&]<class W, class FanIn>(std::vector<W>& ws, const typename W::extents_type& e, FanIn) {
      ws.push_back(nn::normal_fan_in<W, FanIn>(g, e, seed++));
    };
    embedding = mt::random_normal<decltype(embedding)>(g, {o.vocab, dm}, seed++, 0, 1);
    for (std::int64_t b = 0; b < o.layers; ++b) {
      attention_norm.push_back(mt::full<t<d_model>>(g, {dm}, 1.0f));
      feed_forward_norm.push_back(mt::full<t<d_model>>(g, {dm}, 1.0f));
      init(wq, {kv, gr, dk, dm}, d_model{});
      init(wk, {kv, dk, dm}, d_model{});
      init(wv, {kv, dk, dm}, d_model{});
      wo.push_back(nn::normal_fan_in<t<d_model, kv_heads, group, d_kv>, kv_heads, group, d_kv>(g, {dm, kv, gr, dk}, seed++));
      init(w_gate, {ff, dm}, d_model{});
      init(w_up, {ff, dm}, d_model{});
      init(w_down, {dm, ff}, d_ff{});
    }
    ring = o.attention == "ring";
    rope = {.theta = o.rope_theta, .llama3 = o.rope_llama3};
    rms_eps = static_cast<float>(o.rms_eps);
    recompute = o.recompute;
    final_norm = mt::full<t<d_model>>(g, {dm}, 1.0f);
    if (!o.tie_embeddings) output.push_back(nn::normal_fan_in<t<vocab, d_model>, d_model>(g, {o.vocab, dm}, seed++));
    std::apply([](auto&... p) { (mt::for_each_tensor(p, [](auto& w) { w.requires_grad(); }), ...); }, tie());
  }

  bool recompute = false;
  bool ring = false;  // --attention ring: where the layout splits the sequence, attention by a ring
  nn::rope_config rope;  // q and k rotated at their positions (--rope-theta)
  float rms_eps = 1e-5f;

  // A weight as the computation in C uses it: itself (float32), or a bf16 copy whose gradient flows
  // back to the float weight, which Adam updates (--dtype bf16: mixed precision).
  template <class C, class W>
  static auto as(const W& w) {
    if constexpr (std::is_same_v<C, float>) return w;
    else return mt::cast<C>(w);
  }

  // Grouped-query attention: where the layout splits the sequence, by all-to-all or by a ring.
  template <class C, class X>
  X attention(const X& x, std::size_t b) const {
    const auto q = as<C>(wq[b]);  // one declaration each: an auto declaration deduces one type, and these differ
    const auto k = as<C>(wk[b]);
    const auto v = as<C>(wv[b]);
    const auto o = as<C>(wo[b]);
    if constexpr (std::is_same_v<L, context_tensor_layout>)
      return nn::ring_grouped_causal_attention<length, memory_length, d_model, kv_heads, group, d_kv>(x, q, k, v, o, rope);
    else if constexpr (std::is_same_v<L, context_layout>)
      return ring ? nn::ring_grouped_causal_attention<length, memory_length, d_model, kv_heads, group, d_kv>(x, q, k, v, o, rope)
                  : nn::all_to_all_grouped_causal_attention<length, memory_length, d_model, kv_heads, group, d_kv>(
                        x, q, k, v, o, rope);
    else
      return nn::grouped_causal_attention<length, memory_length, d_model, kv_heads, group, d_kv>(x, q, k, v, o, rope);
  }

  // The next token's logits [batch, length, vocab] at each position of a batch of token ids,
  // computed in C (float, or bf16: the activations and products in bf16, their sums in float).
  template <class C = float>
  auto logits(const mt::tensor<std::int32_t, L, batch, length>& ids) const {
    using X = mt::tensor<C, L, batch, length, d_model>;
    X x = nn::embedding<vocab>(as<C>(embedding), ids);
    for (std::size_t b = 0; b < wq.size(); ++b) {
      const auto block = [this, b](const X& in) {
        const X a = in + attention<C>(nn::rms_norm<d_model>(in, as<C>(attention_norm[b]), rms_eps), b);
        return X(a + nn::gated_feed_forward<d_model, d_ff>(nn::rms_norm<d_model>(a, as<C>(feed_forward_norm[b]), rms_eps),
                                                           as<C>(w_gate[b]), as<C>(w_up[b]), as<C>(w_down[b])));
      };
      // --recompute: only each block's input is kept; the backward pass runs the block again
      x = recompute ? mt::recompute(block, x) : block(x);
    }
    return nn::dense<d_model, vocab>(nn::rms_norm<d_model>(x, as<C>(final_norm), rms_eps),
                                     as<C>(output.empty() ? embedding : output[0]));
  }

  // Mean next-token cross-entropy of a batch of token ids, computed in C (the loss in float).
  template <class C = float>
  t<> loss(const mt::tensor<std::int32_t, L, batch, length>& ids, const mt::tensor<std::int32_t, L, batch, length>& labels) const {
    return mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(mt::cast<float>(logits<C>(ids)), labels));
  }
};

std::vector<unsigned char> read_text(const std::string& path, std::int64_t need) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mt::io_error(fmt::format("cannot open '{}'", path));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(bytes.size()) < need)
    throw mt::io_error(fmt::format("'{}' has {} bytes; sequences of this length need {}", path, bytes.size(), need));
  return bytes;
}

// --config FILE (or --from-pretrained DIR's config.json): the architecture into the options
// (Hugging Face's LlamaConfig keys); anything this model does not compute is refused, naming the key.
void read_config(options& o, const std::string& path) {
  nlohmann::json c;
  try {
    o.config_text = mt::io::read_text(path, MPI_COMM_WORLD);
    c = nlohmann::json::parse(o.config_text);
  } catch (const nlohmann::json::exception& e) {
    throw mt::io_error(fmt::format("'{}' is not JSON: {}", path, e.what()));
  }
  const auto need = [&](const char* key) -> const nlohmann::json& {
    if (!c.contains(key) || c[key].is_null()) throw mt::io_error(fmt::format("'{}' has no '{}'", path, key));
    return c[key];
  };
  const auto refuse = [&](const char* key, const std::string& value, const char* why) {
    throw mt::io_error(fmt::format("'{}': {} is {}; {}", path, key, value, why));
  };
  if (c.value("model_type", std::string()) != "llama") refuse("model_type", c.value("model_type", std::string("(none)")), "this model reads llama");
  if (c.value("hidden_act", std::string("silu")) != "silu") refuse("hidden_act", c["hidden_act"].dump(), "Llama's feed-forward is SwiGLU (silu)");
  if (c.value("attention_bias", false) || c.value("mlp_bias", false)) refuse("attention_bias or mlp_bias", "true", "this model has no biases");
  try {
    o.d_model = need("hidden_size").get<std::int64_t>();
    o.layers = need("num_hidden_layers").get<std::int64_t>();
    const auto heads = need("num_attention_heads").get<std::int64_t>();
    o.kv_heads = c.value("num_key_value_heads", heads);
    if (o.kv_heads <= 0 || heads % o.kv_heads != 0)
      refuse("num_key_value_heads", std::to_string(o.kv_heads), fmt::format("it must divide num_attention_heads ({})", heads).c_str());
    o.group = heads / o.kv_heads;
    o.d_kv = c.contains("head_dim") && !c["head_dim"].is_null() ? c["head_dim"].get<std::int64_t>() : o.d_model / heads;
    o.d_ff = need("intermediate_size").get<std::int64_t>();
    o.vocab = need("vocab_size").get<std::int64_t>();
    o.rms_eps = c.value("rms_norm_eps", 1e-6);
    o.rope_theta = c.value("rope_theta", 10000.0);
    o.tie_embeddings = c.value("tie_word_embeddings", false);
    if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
      const auto& r = c["rope_scaling"];
      const std::string type = r.value("rope_type", r.value("type", std::string()));
      if (type != "llama3") refuse("rope_scaling's rope_type", type, "the default and llama3 are read");
      o.rope_llama3 = nn::rope_llama3_scaling{r.at("factor").get<double>(), r.at("low_freq_factor").get<double>(),
                                              r.at("high_freq_factor").get<double>(),
                                              r.at("original_max_position_embeddings").get<double>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw mt::io_error(fmt::format("'{}': {}", path, e.what()));
  }
}

// --from-pretrained DIR: the model's weights from a Hugging Face checkpoint (save_pretrained's
// model.safetensors or shards), each processor reading its own slices; F32 files loaded as they
// are, BF16 ones into bf16 copies then cast to the float weights.
template <class L>
void load_pretrained(model<L>& m, const std::string& dir) {
  const mt::no_grad loading;  // the casts below are no steps of the model
  const std::string dtype = mt::io::pretrained_dtype(dir, MPI_COMM_WORLD);
  mt::io::tensor_set set;
  std::vector<std::function<void()>> cast_back;
  m.each_named([&]<class W>(const std::string& name, W& w) {
    if (dtype == "F32") {
      set.add(name, w);
    } else if (dtype == "BF16") {
      auto copy = mt::cast<mt::bf16>(w);  // its values come from the file
      set.add(name, copy);
      cast_back.push_back([&w, copy] {
        w = mt::cast<float>(copy);
        w.requires_grad();
      });
    } else {
      throw mt::io_error(fmt::format("'{}' holds {} tensors; F32 and BF16 are read", dir, dtype));
    }
  });
  mt::io::load_pretrained(dir, set);
  for (const auto& f : cast_back) f();
}

// The config.json --save-pretrained writes: the one read (its other keys kept), or one made from
// the options, its torch_dtype the weights'.
std::string config_json(const options& o) {
  nlohmann::json c = o.config_text.empty() ? nlohmann::json::object() : nlohmann::json::parse(o.config_text);
  if (o.config_text.empty()) {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["hidden_size"] = o.d_model;
    c["intermediate_size"] = o.d_ff;
    c["num_hidden_layers"] = o.layers;
    c["num_attention_heads"] = o.kv_heads * o.group;
    c["num_key_value_heads"] = o.kv_heads;
    c["head_dim"] = o.d_kv;
    c["vocab_size"] = o.vocab;
    c["max_position_embeddings"] = o.length;
    c["rms_norm_eps"] = o.rms_eps;
    c["rope_theta"] = o.rope_theta;
    c["tie_word_embeddings"] = o.tie_embeddings;
  }
  c["torch_dtype"] = o.save_dtype == "bf16" ? "bfloat16" : "float32";
  return c.dump(2) + "\n";
}

// --save-pretrained DIR: the weights and config.json as transformers' save_pretrained writes them
// (q, k, v and o as [out, in] matrices, their heads merged), in --save-dtype, sharded past
// --max-shard-bytes; every processor writes its own slices.
template <class L>
void save_pretrained(model<L>& m, const options& o) {
  const mt::no_grad saving;  // the bf16 copies are no steps of the model
  const std::int64_t heads = o.kv_heads * o.group;
  const auto file_shape = [&](const std::string& name) -> std::vector<std::int64_t> {
    if (name.ends_with("q_proj.weight")) return {heads * o.d_kv, o.d_model};
    if (name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight")) return {o.kv_heads * o.d_kv, o.d_model};
    if (name.ends_with("o_proj.weight")) return {o.d_model, heads * o.d_kv};
    return {};
  };
  mt::io::tensor_set set;
  m.each_named([&](const std::string& name, auto& w) {
    if (o.save_dtype == "bf16") {
      auto copy = mt::cast<mt::bf16>(w);  // the set keeps its data alive
      set.add(name, copy);
    } else {
      set.add(name, w);
    }
    if (const auto merged = file_shape(name); !merged.empty()) set.merge_dims_in_files(name, merged);
  });
  mt::io::save_pretrained(o.save_pretrained, set, config_json(o), o.max_shard_bytes);
}

// Trains (or, on a planned mesh, plans) up to step o.steps; returns the losses from the first step
// run (after a resumed checkpoint's).
struct losses_from {
  std::int64_t first_step = 0;
  std::vector<double> losses;
};

template <class L>
losses_from train(const grid& g, const options& o, const std::vector<unsigned char>& text) {
  using ids_t = mt::tensor<std::int32_t, L, batch, length>;
  model<L> m(g, o);
  if (!o.pretrained.empty() && !g.is_planned() && o.resume.empty()) load_pretrained(m, o.pretrained);
  mt::optim::adam adam({.lr = o.lr});
  auto params = m.tie();
  const auto state = [&] {  // what a checkpoint holds: the weights and adam's moments
    mt::io::tensor_set set;
    std::vector<std::string> names;
    m.each_named([&](const std::string& name, auto& w) { set.add(names.emplace_back(name), w); });
    mt::io::add_optimizer_state(set, adam, params, names);
    return set;
  };
  std::mt19937_64 rng(7);  // the same batches on every rank and under every layout
  std::uniform_int_distribution<std::int64_t> start(0, static_cast<std::int64_t>(text.size()) - o.length - 2);
  // What the data stream depends on: a resumed run must draw the same batches.
  const mt::io::metadata data_config{{"batch", std::to_string(o.batch)}, {"length", std::to_string(o.length)}, {"text", o.text}};
  std::int64_t step0 = 0;
  if (!o.resume.empty()) {
    auto set = state();
    const auto meta = mt::io::checkpoints(o.resume).load(set);
    for (const auto& [k, v] : data_config)
      if (!meta.count(k) || meta.at(k) != v)
        throw mt::io_error(fmt::format("--resume {}: the checkpoint has {} = {}, this run {}", o.resume, k,
                                       meta.count(k) ? meta.at(k) : "(none)", v));
    if (!meta.count("step")) throw mt::io_error(fmt::format("--resume {}: the checkpoint has no step", o.resume));
    step0 = std::stoll(meta.at("step"));
    adam.set_steps(step0);
    for (std::int64_t k = 0; k < step0 * o.batch; ++k) (void)start(rng);  // the batches drawn before
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(o.batch * o.length)), labels(ids.size());
  std::vector<double> losses;
  if (g.is_planned() && o.plan && g.rank() == 0) {
    std::int64_t n = 0;
    std::apply([&](auto&... p) { (mt::for_each_tensor(p, [&](auto& w) { n += w.size(); }), ...); }, params);
    fmt::print("parameters: {} ({:.2f} billion)\n", n, n / 1e9);
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
    if (g.is_planned()) continue;
    losses.push_back(mt::item(loss));
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
  return {step0, losses};
}

// --plan: two steps on a planned mesh (no processes, no data), the second reported; returns the
// peak bytes of the first processor (which holds the largest parts).
template <class L>
std::int64_t plan(options o, bool print) {
  // read first: a file that cannot be read fails before the planning, not after it
  const auto machine = o.calibration.empty() ? std::optional<mt::machine_calibration>()
                                             : std::optional(mt::machine_calibration::load(o.calibration));
  o.steps = 2;
  o.resume.clear();  // a plan has no data to load or save
  o.save_every = 0;
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
  train<L>(pm, o, std::vector<unsigned char>(static_cast<std::size_t>(o.length + 3), ' '));
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
    if (machine)  // the cost model: docs/plan-mode.md
      fmt::print("predicted step time {} (calibration {})\n", mt::to_string(mt::predict(p, *machine)), o.calibration);
  }
  return p.peak_bytes;
}

// --logits-out FILE: the logits of one sequence (--ids) at each position, one line of --vocab
// numbers per position, written by rank 0 (what a comparison with another implementation reads).
template <class L>
int write_logits(const grid& g, const options& o) {
  if (o.ids.empty()) throw mt::error("--logits-out needs --ids: the token ids of the sequence");
  for (const auto id : o.ids)
    if (id < 0 || id >= o.vocab) throw mt::error(fmt::format("--ids: {} is outside the vocabulary [0, {})", id, o.vocab));
  model<L> m(g, o);
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

template <class L>
int run(const mt::environment& env, const options& o) {
  const bool root = env.world_rank() == 0;
  if (o.plan || o.memory_budget > 0) {
    // Every rank plans alike (no communication), so every rank takes the same decision.
    const std::int64_t peak = plan<L>(o, root);
    if (o.memory_budget > 0) {
      const bool fits = peak <= o.memory_budget * 1073741824.0;
      if (root) fmt::print("  budget {:g} GiB per processor: {}\n", o.memory_budget, fits ? "fits" : "DOES NOT FIT");
      if (!fits) return 2;  // refused before any data is read
    }
    if (o.plan) return 0;
  }
  const grid g(env, {o.mesh[0], o.mesh[1]});
  if (!o.logits_out.empty()) return write_logits<L>(g, o);
  if (o.text.empty()) throw mt::error("--text FILE: the text to train on (any file: its bytes are the tokens)");
  const auto [first, losses] = train<L>(g, o, read_text(o.text, o.length + 2));
  if (g.rank() == 0 && !o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "step,loss\n";
    for (std::size_t i = 0; i < losses.size(); ++i) csv << fmt::format("{},{:.9g}\n", first + std::int64_t(i) + 1, losses[i]);
    if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  }
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
  app.add_option("--logits-out", o.logits_out, "write the logits of --ids (a line of --vocab numbers per position) and stop");
  app.add_option("--text", o.text, "the text to train on (any file: its bytes are the tokens)");
  app.add_option("--checkpoint", o.checkpoint, "directory of checkpoints, saved every --save-every steps");
  app.add_option("--save-every", o.save_every, "steps between checkpoints");
  app.add_option("--resume", o.resume, "continue from the latest checkpoint in this directory");
  app.add_option("--log-every", o.log_every, "steps between printed losses")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--csv", o.csv, "write every step's loss to this file");
  app.add_flag("--recompute", o.recompute, "keep only each block's input for the backward pass, computing the rest again");
  app.add_option("--dtype", o.dtype, "float32, or bf16: activations and products in bf16, float master weights")
      ->check(CLI::IsMember({"float32", "bf16"}))->capture_default_str();
  app.add_flag("--plan", o.plan, "print what a step needs on --mesh, without running it");
  app.add_option("--calibration", o.calibration, "with --plan: the step time predicted on the machine this file describes "
                 "(benchmarks/bench_calibrate.cpp writes one)");
  app.add_option("--memory-budget", o.memory_budget, "GiB per processor: plan the step first, refuse to run (exit 2) if its planned peak does not fit "
                 "(the program itself, MPI's buffers and the ring's tile scratch come on top)");
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
    if (!o.calibration.empty() && !o.plan) throw mt::error("--calibration needs --plan: it predicts the planned step's time");
    if (o.attention == "ring" && o.layout.rfind("context", 0) != 0)
      throw mt::error(fmt::format("--attention ring needs a layout that splits the sequence (context or context_tensor), not {}", o.layout));
    if (o.layout == "tensor") return run<tensor_layout>(env, o);
    if (o.layout == "context") return run<context_layout>(env, o);
    if (o.layout == "context_tensor") {
      // the KV heads are split over cols already: the all-to-all has no heads left to move the sequence to
      if (o.attention != "ring") throw mt::error("--layout context_tensor attends by the ring: add --attention ring");
      return run<context_tensor_layout>(env, o);
    }
    return run<data_layout>(env, o);
  } catch (const std::exception& e) {
    return env.fail(e, "llama: ");  // one rank's error ends the job with its message
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("llama: ");
}
