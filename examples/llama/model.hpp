#pragma once
// examples/llama's model: its dims, the four layouts, its options and the model itself (Llama 3's
// blocks), the same code under every layout. main.cpp trains, plans and generates with it;
// hugging_face.hpp maps it to and from Hugging Face checkpoints.
#include <fmt/core.h>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

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
struct experts : mt::dim<"experts"> {};  // routed experts (--experts), each d_ff wide
// Multi-head latent attention (--kv-rank): the queries' and the keys' and values' compressed widths
// (DeepSeek's q_lora_rank and kv_lora_rank), and the rotated part of a query or key head.
struct q_rank : mt::dim<"q_rank"> {};
struct kv_rank : mt::dim<"kv_rank"> {};
struct d_rope : mt::dim<"d_rope"> {};
// A sequence routes as a group: the experts are split over the axes that split the batch.
using expert_dims = nn::moe_dims<batch, length, d_model, d_ff, experts>;
using experts_unsplit = expert_dims::experts_unsplit;
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

using data_layout = mt::layout<grid, mt::split<batch, rows, cols>, mt::split<experts, rows, cols>>;
using tensor_layout = mt::layout<grid, mt::split<batch, rows>, mt::split<experts, rows>, mt::split<kv_heads, cols>,
                                 mt::split<d_ff, cols>, mt::split<vocab, cols>>;
// --experts: the experts over rows and cols (expert parallelism over every processor), routed
// under data_layout (routing_layout below).
using context_layout = mt::layout<grid, mt::split<batch, rows>, mt::split<length, cols>, mt::split<experts, rows, cols>>;
// The ring's layout cuts the sequence zigzag (chunks q and 2P - 1 - q on part q): under the causal
// mask every part then computes as many blocks, where a contiguous split leaves the last part P
// blocks and the first one.
using context_tensor_layout = mt::layout<grid, mt::zigzag<length, rows>, mt::split<kv_heads, cols>, mt::split<d_ff, cols>,
                                         mt::split<vocab, cols>>;
// --fsdp: the weights stored as context_tensor_layout computes with them, and d_model (a dim every
// weight has) split over rows as well, the axis the sequence is split over: fully sharded data
// parallelism over the context axis, as Llama 3's and torchtitan's runs shard it. Each weight is
// gathered where a block uses it (ops/gather_for_use.hpp); its gradient comes back split by a
// reduce_scatter, and Adam's state is split as the weight is.
using context_tensor_sharded = mt::layout<grid, mt::split<d_model, rows>, mt::split<kv_heads, cols>, mt::split<d_ff, cols>,
                                          mt::split<vocab, cols>>;
// Routing is decided within a sequence (a group): a layout that keeps each sequence whole routes
// under itself. The context layout (the sequence over cols) routes under data_layout: a block's
// normalised input moves there by one alltoall over cols (each processor then holds whole
// sequences, the batch over rows and cols, where the experts are split alike), its output back by
// another; the experts' weights are split as there already, so they move nothing. The sequence
// over rows, zigzag (context_tensor), has no experts.
template <class L>
struct routing_layout_of {
  using type = std::conditional_t<L::template split_of<length>().count == 0, L, void>;
};
template <>
struct routing_layout_of<context_layout> {
  using type = data_layout;
};
template <class L>
using routing_layout = typename routing_layout_of<L>::type;
template <class L>
constexpr bool routes_experts = !std::is_void_v<routing_layout<L>>;
// Latent attention (--kv-rank) is built for the tensor layout alone, DeepSeek's on [N x 1] (the
// batch and the experts over N: expert and data parallelism) and with the heads over cols on
// [N x M]: each layout that builds it compiles its products again, forward and backward.
template <class L>
constexpr bool has_latent_attention = std::is_same_v<L, tensor_layout>;

struct options {
  std::string layout = "data", attention = "all-to-all", text, checkpoint, resume, csv;
  std::string dtype = "float32", calibration;
  std::vector<int> mesh{1, 1};
  std::int64_t steps = 100, batch = 8, length = 64, d_model = 64, layers = 2, kv_heads = 2, group = 2, d_kv = 16,
               d_ff = 172, vocab = 256, save_every = 0, log_every = 10;
  double lr = 3e-3, memory_budget = 0;  // GiB per processor; 0: unchecked
  bool check_plan = false;               // --check-plan: one step against its plan
  double memory_tolerance = 0.05;        // how far --check-plan's planned peak may lie from the measured one
  double rope_theta = 500000, rms_eps = 1e-5;  // Llama 3's
  std::optional<nn::rope_llama3_scaling> rope_llama3;  // Llama 3.1's frequency scaling (from a config.json)
  bool plan = false, recompute = false, tie_embeddings = false;
  bool fsdp = false;  // --fsdp: the weights and Adam's state split over rows (context_tensor_sharded)
  std::int64_t loss_chunks = 1;  // the loss's logits for 1/N of each processor's positions at a time
  std::string pretrained, config, logits_out;  // --from-pretrained DIR; --config FILE; --logits-out FILE of --ids
  std::string config_text;                     // the config.json read, written again by --save-pretrained
  std::string save_pretrained, save_dtype = "float32";
  std::int64_t max_shard_bytes = std::int64_t{5} << 30;
  std::vector<std::int64_t> ids;
  std::int64_t generate = 0;  // --generate N: N tokens after --ids, greedily
  std::string generate_out;   // --generate-out FILE: the generated ids, one line
  // Mixture of experts (--experts N): every block's feed-forward is nn::routed_moe over N SwiGLU
  // experts of width --d-ff (top --top-k), beside --shared-experts SwiGLU experts as wide each.
  std::int64_t experts = 0, top_k = 2, shared_experts = 0, capacity = 0, expert_chunks = 1;
  std::string router = "softmax", moe_dispatch = "one-hot";
  double routed_scale = 1, aux_loss = 0.01, router_bias_rate = 0;
  // DeepSeek-V3's blocks: the first --dense-blocks with a dense SwiGLU of --dense-d-ff (0: --d-ff)
  // in place of the experts; multi-head latent attention where --kv-rank > 0 (--q-rank, --d-rope).
  std::int64_t dense_blocks = 0, dense_d_ff = 0, q_rank = 0, kv_rank = 0, d_rope = 0;
  // --pipeline P: the blocks over P stages of --mesh, --microbatches of --batch each (0: P) run by
  // --schedule (pipeline.hpp).
  int pipeline = 1;
  std::int64_t microbatches = 0;
  std::string schedule = "1f1b";
};

// What a pipeline stage's model holds beside its blocks (--pipeline): the first stage the
// embedding, the last the output layer (and the embedding too, where they are tied); its blocks
// are the whole model's from first_block on, drawn from the same seeds (so that a pipelined run
// trains the model an unpipelined one does), of which the first whole_dense_blocks are dense.
struct stage_part {
  bool embedding = true, output = true;
  std::int64_t first_block = 0, whole_dense_blocks = 0;
};

// The step a checkpoint in dir resumes from, once its metadata matches what this run's data (and,
// for a pipeline, its stages) depend on: io_error naming the key otherwise, alike on every rank
// (each read the same metadata).
inline std::int64_t resumed_step(const mt::io::metadata& meta, const mt::io::metadata& config, const std::string& dir) {
  for (const auto& [k, v] : config)
    if (!meta.count(k) || meta.at(k) != v)
      throw mt::io_error(fmt::format("--resume {}: the checkpoint has {} = {}, this run {}", dir, k,
                                     meta.count(k) ? meta.at(k) : "(none)", v));
  if (!meta.count("step")) throw mt::io_error(fmt::format("--resume {}: the checkpoint has no step", dir));
  return std::stoll(meta.at("step"));
}

template <class T>
constexpr bool is_vector = false;
template <class T>
constexpr bool is_vector<std::vector<T>> = true;

// L: the layout the model computes under; PL: the one its weights are stored under (L, or
// context_tensor_sharded with --fsdp).
template <class L, class PL = L>
struct model {
  template <class... D>
  using t = mt::tensor<float, PL, D...>;
  template <class... D>
  using per_block = std::vector<t<D...>>;  // one entry per block: gradient() and adam take a vector as one
  using scalar = mt::tensor<float, L>;     // the loss, under the layout the model computes under
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
  // --experts: the router and the routed experts (stacked over experts); w_gate, w_up and w_down
  // are then the shared experts' (none without --shared-experts).
  per_block<d_model, experts_unsplit> w_router;
  per_block<experts, d_ff, d_model> expert_gate, expert_up;
  per_block<experts, d_model, d_ff> expert_down;
  // Not parameters: update_router_bias moves them after each step (--router-bias-rate).
  per_block<experts_unsplit> router_bias;
  // --kv-rank: multi-head latent attention's weights (wq, wk and wv then empty; wo its output's).
  // The queries and the keys and values each come from a compressed projection of the block's input
  // (normalised); a head's query and key are a part without position (d_kv) and a rotated part
  // (d_rope), the key's rotated part one for all heads.
  per_block<q_rank, d_model> w_q_a;
  per_block<q_rank> q_a_norm;
  per_block<kv_heads, group, d_kv, q_rank> w_q_nope;
  per_block<kv_heads, group, d_rope, q_rank> w_q_rope;
  per_block<kv_rank, d_model> w_kv_a;
  per_block<d_rope, d_model> w_k_rope;
  per_block<kv_rank> kv_a_norm;
  per_block<kv_heads, d_kv, kv_rank> w_k_nope, w_v;

  auto tie() {
    return std::tie(embedding, attention_norm, feed_forward_norm, wq, wk, wv, wo, w_gate, w_up, w_down, final_norm, output,
                    w_router, expert_gate, expert_up, expert_down, w_q_a, q_a_norm, w_q_nope, w_q_rope, w_kv_a, w_k_rope,
                    kv_a_norm, w_k_nope, w_v);
  }
  // The parameters' count, whole (not per processor).
  std::int64_t parameter_count() {
    std::int64_t n = 0;
    std::apply([&](auto&... p) { (mt::for_each_tensor(p, [&](auto& w) { n += w.size(); }), ...); }, tie());
    return n;
  }
  // This processor's bytes of model state: the parameters and the router's biases (model state a
  // plan counts with the parameters, though not trained).
  std::int64_t parameter_bytes() {
    return std::apply([](auto&... p) { return mt::local_bytes(p...); }, tie()) + mt::local_bytes(router_bias);
  }
  // Hugging Face's names (LlamaForCausalLM's state dict): its checkpoints and this model's name the
  // same tensors. "{}" is the block.
  static constexpr const char* names[] = {
      "model.embed_tokens.weight", "model.layers.{}.input_layernorm.weight",
      "model.layers.{}.post_attention_layernorm.weight", "model.layers.{}.self_attn.q_proj.weight",
      "model.layers.{}.self_attn.k_proj.weight", "model.layers.{}.self_attn.v_proj.weight",
      "model.layers.{}.self_attn.o_proj.weight", "model.layers.{}.mlp.gate_proj.weight",
      "model.layers.{}.mlp.up_proj.weight", "model.layers.{}.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight",
      // --experts (stacked over the experts, where Mixtral's checkpoints hold one tensor per expert)
      "model.layers.{}.moe.router.weight", "model.layers.{}.moe.experts.gate_proj", "model.layers.{}.moe.experts.up_proj",
      "model.layers.{}.moe.experts.down_proj",
      // --kv-rank (DeepSeek's names where a tensor is theirs; their q_b_proj and kv_b_proj in parts)
      "model.layers.{}.self_attn.q_a_proj.weight", "model.layers.{}.self_attn.q_a_layernorm.weight",
      "model.layers.{}.self_attn.q_b_proj.nope", "model.layers.{}.self_attn.q_b_proj.rope",
      "model.layers.{}.self_attn.kv_a_proj.latent", "model.layers.{}.self_attn.kv_a_proj.rope",
      "model.layers.{}.self_attn.kv_a_layernorm.weight", "model.layers.{}.self_attn.kv_b_proj.k",
      "model.layers.{}.self_attn.kv_b_proj.v"};
  static constexpr const char* router_bias_name = "model.layers.{}.moe.router.bias";
  // f(name, tensor) for every weight, named by its block in the whole model (the experts' entries
  // start at the first block with experts, after --dense-blocks; a pipeline stage's blocks at its
  // first), so that a pipeline's stages name each tensor once. A stage's stand-ins (the embedding
  // where it has none, the final norm where it has no output layer: never read) are named as the
  // stage's own.
  template <class F>
  void each_named(F&& f) {
    static_assert(std::tuple_size_v<decltype(tie())> == std::size(names), "a name for every tensor of tie()");
    std::size_t kind = 0;
    const auto visit = [&]<class P>(P& p) {
      const void* at = &p;
      const bool of_experts = at == &w_router || at == &expert_gate || at == &expert_up || at == &expert_down;
      const std::size_t first = part_.first_block + (of_experts ? dense_blocks : 0);
      const bool stand_in = (at == &embedding && !part_.embedding) || (at == &final_norm && !part_.output);
      if constexpr (is_vector<P>)
        for (std::size_t b = 0; b < p.size(); ++b) f(fmt::format(fmt::runtime(names[kind]), first + b), p[b]);
      else if (stand_in)
        f(fmt::format("pipeline.stage_from_block_{}.stand_in.{}", part_.first_block, names[kind]), p);
      else
        f(std::string(names[kind]), p);
      ++kind;
    };
    std::apply([&](auto&... p) { (visit(p), ...); }, tie());
  }
  // What a checkpoint holds: the weights (params: tie()), adam's moments of them, and the router's
  // biases, each under its name in the whole model.
  template <class Adam, class Params>
  mt::io::tensor_set checkpoint_state(Adam& adam, Params params) {
    mt::io::tensor_set set;
    std::vector<std::string> names;
    each_named([&](const std::string& name, auto& w) { set.add(names.emplace_back(name), w); });
    mt::io::add_optimizer_state(set, adam, params, names);
    each_buffer([&](const std::string& name, auto& w) { set.add(name, w); });
    return set;
  }
  // f(name, tensor) for the state that is not a parameter (a checkpoint holds it too).
  template <class F>
  void each_buffer(F&& f) {
    for (std::size_t b = 0; b < router_bias.size(); ++b)
      f(fmt::format(fmt::runtime(router_bias_name), part_.first_block + dense_blocks + b), router_bias[b]);
  }

  // random: drawn as for training from scratch; else zeros, for weights a checkpoint fills (drawing
  // 8 billion normal numbers only to overwrite them took longer than reading them). part: with
  // --pipeline, a stage's share of the model (o.layers and o.dense_blocks then the stage's).
  model(const grid& g, const options& o, bool random = true, stage_part part = {}) : part_(part) {
    const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);  // what a plan counts them as
    const std::int64_t dm = o.d_model, kv = o.kv_heads, gr = o.group, dk = o.d_kv, ff = o.d_ff;
    std::uint64_t seed = 1;
    // A weight of extents e: normal with the fan-in's variance (FanIn... its dims), or zeros.
    const auto make = [&]<class W, class... FanIn>(const typename W::extents_type& e, mt::type_list<FanIn...>) {
      const std::uint64_t s = seed++;  // drawn either way: the seeds stay those of a random model
      return random ? nn::normal_fan_in<W, FanIn...>(g, e, s) : W(g, e);
    };
    // A stage without the embedding holds a stand-in of one row per processor (tie() has one tensor
    // per kind), which its forward pass never reads.
    const std::int64_t embedded = part.embedding ? o.vocab : g.sizes()[0] * g.sizes()[1];
    embedding = random ? mt::random_normal<decltype(embedding)>(g, {embedded, dm}, seed, 0, 1) : decltype(embedding)(g, {embedded, dm});
    ++seed;
    // The seeds the blocks before this stage's draw: a block's weights as the loop below makes them.
    for (std::int64_t b = 0; b < part.first_block; ++b) {
      const bool routed = o.experts > 0 && b >= part.whole_dense_blocks;
      const std::int64_t dense_ff = routed ? o.shared_experts * ff : (o.experts > 0 && o.dense_d_ff > 0 ? o.dense_d_ff : ff);
      seed += (o.kv_rank > 0 ? 7 : 3) + 1 + (dense_ff > 0 ? 3 : 0) + (routed ? 4 : 0);
    }
    dense_blocks = static_cast<std::size_t>(o.experts > 0 ? o.dense_blocks : 0);
    for (std::int64_t b = 0; b < o.layers; ++b) {
      attention_norm.push_back(mt::full<t<d_model>>(g, {dm}, 1.0f));
      feed_forward_norm.push_back(mt::full<t<d_model>>(g, {dm}, 1.0f));
      if (o.kv_rank > 0) {
        const std::int64_t qr = o.q_rank, kr = o.kv_rank, dr = o.d_rope;
        w_q_a.push_back(make.template operator()<t<q_rank, d_model>>({qr, dm}, mt::type_list<d_model>{}));
        q_a_norm.push_back(mt::full<t<q_rank>>(g, {qr}, 1.0f));
        w_q_nope.push_back(make.template operator()<t<kv_heads, group, d_kv, q_rank>>({kv, gr, dk, qr}, mt::type_list<q_rank>{}));
        w_q_rope.push_back(make.template operator()<t<kv_heads, group, d_rope, q_rank>>({kv, gr, dr, qr}, mt::type_list<q_rank>{}));
        w_kv_a.push_back(make.template operator()<t<kv_rank, d_model>>({kr, dm}, mt::type_list<d_model>{}));
        w_k_rope.push_back(make.template operator()<t<d_rope, d_model>>({dr, dm}, mt::type_list<d_model>{}));
        kv_a_norm.push_back(mt::full<t<kv_rank>>(g, {kr}, 1.0f));
        w_k_nope.push_back(make.template operator()<t<kv_heads, d_kv, kv_rank>>({kv, dk, kr}, mt::type_list<kv_rank>{}));
        w_v.push_back(make.template operator()<t<kv_heads, d_kv, kv_rank>>({kv, dk, kr}, mt::type_list<kv_rank>{}));
      } else {
        wq.push_back(make.template operator()<t<kv_heads, group, d_kv, d_model>>({kv, gr, dk, dm}, mt::type_list<d_model>{}));
        wk.push_back(make.template operator()<t<kv_heads, d_kv, d_model>>({kv, dk, dm}, mt::type_list<d_model>{}));
        wv.push_back(make.template operator()<t<kv_heads, d_kv, d_model>>({kv, dk, dm}, mt::type_list<d_model>{}));
      }
      wo.push_back(make.template operator()<t<d_model, kv_heads, group, d_kv>>({dm, kv, gr, dk},
                                                                          mt::type_list<kv_heads, group, d_kv>{}));
      const bool routed = o.experts > 0 && b >= o.dense_blocks;
      const std::int64_t dense_ff = routed ? o.shared_experts * ff : (o.experts > 0 && o.dense_d_ff > 0 ? o.dense_d_ff : ff);
      if (dense_ff > 0) {
        w_gate.push_back(make.template operator()<t<d_ff, d_model>>({dense_ff, dm}, mt::type_list<d_model>{}));
        w_up.push_back(make.template operator()<t<d_ff, d_model>>({dense_ff, dm}, mt::type_list<d_model>{}));
        w_down.push_back(make.template operator()<t<d_model, d_ff>>({dm, dense_ff}, mt::type_list<d_ff>{}));
      }
      if (routed) {
        const std::int64_t e = o.experts;
        w_router.push_back(make.template operator()<t<d_model, experts_unsplit>>({dm, e}, mt::type_list<d_model>{}));
        expert_gate.push_back(make.template operator()<t<experts, d_ff, d_model>>({e, ff, dm}, mt::type_list<d_model>{}));
        expert_up.push_back(make.template operator()<t<experts, d_ff, d_model>>({e, ff, dm}, mt::type_list<d_model>{}));
        expert_down.push_back(make.template operator()<t<experts, d_model, d_ff>>({e, dm, ff}, mt::type_list<d_ff>{}));
        router_bias.push_back(mt::full<t<experts_unsplit>>(g, {e}, 0.0f));
      }
    }
    routing = {.top_k = o.top_k,
               .scores = o.router == "sigmoid" ? nn::router_scores::sigmoid : nn::router_scores::softmax,
               .weight_scale = o.routed_scale,
               .capacity = o.capacity,
               .overlap_chunks = o.expert_chunks,
               .dispatch = o.moe_dispatch == "ragged" ? nn::moe_dispatch::ragged : nn::moe_dispatch::one_hot};
    aux_loss_weight = static_cast<float>(o.aux_loss);
    ring = o.attention == "ring";
    rope = {.theta = o.rope_theta, .llama3 = o.rope_llama3};
    rms_eps = static_cast<float>(o.rms_eps);
    recompute = o.recompute;
    loss_chunks = o.loss_chunks;
    final_norm = mt::full<t<d_model>>(g, {dm}, 1.0f);
    if (!o.tie_embeddings && part.output)
      output.push_back(make.template operator()<t<vocab, d_model>>({o.vocab, dm}, mt::type_list<d_model>{}));
    std::apply([](auto&... p) { (mt::for_each_tensor(p, [](auto& w) { w.requires_grad(); }), ...); }, tie());
  }

  stage_part part_;  // the whole model, or a pipeline stage's share of it
  bool recompute = false;
  std::size_t dense_blocks = 0;  // with --experts, the first blocks' feed-forward is dense (--dense-blocks)
  std::int64_t loss_chunks = 1;  // --loss-chunks
  nn::routed_moe_options routing;  // --experts
  float aux_loss_weight = 0.01f;   // --aux-loss
  // The last forward pass's tokens per expert, one tensor per block, for update_router_bias: what
  // a step leaves behind beside its loss (hence mutable in a const forward pass).
  mutable std::vector<t<experts_unsplit>> last_loads;
  mutable std::optional<scalar> last_aux_loss;  // the blocks' weighted balance losses summed, in float, off the tape
  bool ring = false;  // --attention ring: where the layout splits the sequence, attention by a ring
  nn::rope_config rope;  // q and k rotated at their positions (--rope-theta)
  float rms_eps = 1e-5f;

  // A weight as the computation in C uses it: itself (float32), or a bf16 copy whose gradient flows
  // back to the float weight, which Adam updates (--dtype bf16: mixed precision); with --fsdp,
  // gathered under L (cast first: the allgather then moves half the bytes).
  template <class C, class W, class U = L>
  static auto as(const W& w, U = {}) {
    return mt::use_as<C, U>(w);
  }

  // x under To's layout: itself where it is there already, else relayouted (its gradient back alike).
  template <class To, class X>
  static To moved(const X& x) {
    if constexpr (std::is_same_v<To, X>) return x;
    else return mt::relayout<To>(x);
  }

  template <class W>
  static auto in_float(const W& w) {
    if constexpr (std::is_same_v<typename W::value_type, float>) return w;
    else return mt::cast<float>(w);
  }

  // Grouped-query attention: where the layout splits the sequence, by all-to-all or by a ring.
  template <class C, class X>
  X attention(const X& x, std::size_t b) const {
    if constexpr (has_latent_attention<L>)
      if (!w_q_a.empty()) return latent_attention<C>(x, b);
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

  // Multi-head latent attention (DeepSeek-V2, Liu et al. 2024; DeepSeek-V3): the queries from a
  // compressed projection of x, normalised (q_rank wide), the keys and values from another (kv_rank
  // wide: what a cache would keep). A head's score is its query and key without positions (d_kv)
  // dotted, plus their rotated parts (d_rope; the key's one for all heads) dotted, over
  // sqrt(d_kv + d_rope); causal, as grouped-query attention's (its group of query heads per KV
  // head, 1 in DeepSeek's). Under --layout tensor the heads are split over cols, the compressed
  // projections computed whole on each.
  template <class C, class X>
  X latent_attention(const X& x, std::size_t b) const {
    const auto cq = compressed_query<C>(x, b);
    const auto xm = mt::rename<length, memory_length>(x);
    const auto ckv = nn::rms_norm<kv_rank>(mt::einsum<batch, memory_length, kv_rank>(xm, as<C>(w_kv_a[b])),
                                           as<C>(kv_a_norm[b]), rms_eps);
    const auto q_nope = mt::einsum<batch, kv_heads, group, length, d_kv>(cq, as<C>(w_q_nope[b]));
    const auto q_rope = nn::rope<length, d_rope>(mt::einsum<batch, kv_heads, group, length, d_rope>(cq, as<C>(w_q_rope[b])), rope);
    const auto k_rope = nn::rope<memory_length, d_rope>(mt::einsum<batch, memory_length, d_rope>(xm, as<C>(w_k_rope[b])), rope);
    const auto k_nope = mt::einsum<batch, kv_heads, memory_length, d_kv>(ckv, as<C>(w_k_nope[b]));
    const auto v = mt::einsum<batch, kv_heads, memory_length, d_kv>(ckv, as<C>(w_v[b]));
    using scores = mt::tensor<C, L, batch, kv_heads, group, length, memory_length>;
    const scores logits = scores(mt::einsum<batch, kv_heads, group, length, memory_length>(q_nope, k_nope) +
                                 mt::einsum<batch, kv_heads, group, length, memory_length>(q_rope, k_rope));
    const auto weights = mt::causal_softmax<length, memory_length>(logits, latent_scale(b));
    const auto heads = mt::einsum<batch, length, kv_heads, group, d_kv>(weights, v);
    return mt::einsum<batch, length, d_model>(heads, as<C>(wo[b]));
  }
  // Latent attention's queries before the heads: x's compressed projection (q_rank wide), normalised.
  template <class C, class X>
  auto compressed_query(const X& x, std::size_t b) const {
    return nn::rms_norm<q_rank>(mt::einsum<batch, length, q_rank>(x, as<C>(w_q_a[b])), as<C>(q_a_norm[b]), rms_eps);
  }
  // Its scores' scale: 1 / sqrt(d_kv + d_rope), a head's query width with its rotated part.
  double latent_scale(std::size_t b) const {
    return 1.0 / std::sqrt(static_cast<double>(w_k_nope[b].template extent<d_kv>() + w_k_rope[b].template extent<d_rope>()));
  }

  // The next token's logits [batch, length, vocab] at each position of a batch of token ids,
  // computed in C (float, or bf16: the activations and products in bf16, their sums in float).
  template <class C = float>
  auto logits(const mt::tensor<std::int32_t, L, batch, length>& ids) const {
    // The final norm before the output weight's cast (function arguments have no order): the
    // backward pass runs newest first, so the cast's gradient is pushed, and its bf16 copy freed,
    // before the blocks' backward pass rather than held through it.
    const auto h = hidden<C>(ids);
    return nn::dense<d_model, vocab>(h, as<C>(output_weight()));
  }

  // The last block's output, normalised: what the output layer's product takes.
  // A forward pass starts here, so the loads and balance losses it keeps start afresh.
  template <class C = float>
  auto hidden(const mt::tensor<std::int32_t, L, batch, length>& ids) const {
    last_loads.clear();
    last_aux_loss.reset();
    return nn::rms_norm<d_model>(through_blocks(embed<C>(ids)), as<C>(final_norm), rms_eps);
  }
  // The token ids' embeddings: the first blocks' input.
  template <class C = float>
  mt::tensor<C, L, batch, length, d_model> embed(const mt::tensor<std::int32_t, L, batch, length>& ids) const {
    return nn::embedding<vocab>(as<C>(embedding), ids);
  }
  // x through every block this model holds (with --pipeline, a stage's).
  template <class X>
  X through_blocks(X x) const {
    using C = typename X::value_type;
    for (std::size_t b = 0; b < attention_norm.size(); ++b) {
      const auto block = [this, b](const X& in) {
        const X a = in + attention<C>(nn::rms_norm<d_model>(in, as<C>(attention_norm[b]), rms_eps), b);
        const auto n = nn::rms_norm<d_model>(a, as<C>(feed_forward_norm[b]), rms_eps);
        if constexpr (routes_experts<L>)
          if (b >= dense_blocks && !expert_gate.empty()) return X(a + experts_of<C>(n, b));
        return X(a + nn::gated_feed_forward<d_model, d_ff>(n, as<C>(w_gate[b]), as<C>(w_up[b]), as<C>(w_down[b])));
      };
      // --recompute: only each block's input is kept; the backward pass runs the block again
      x = recompute ? mt::recompute(block, x) : block(x);
    }
    return x;
  }
  const t<vocab, d_model>& output_weight() const { return output.empty() ? embedding : output[0]; }

  // Block b's routed experts (its entry b - dense_blocks of the experts' weights) and its shared ones
  // on the normalised n; keeps the block's loads
  // and adds its weighted balance loss's value to last_aux_loss, the first time the block runs (with --recompute
  // the backward pass runs it again, for the gradients alone). The shared experts are gated_feed_forward beside
  // routed_moe (its overload with shared_experts is the same sum): one routed_moe per layout and
  // element type to compile, not two.
  template <class C, class N>
  N experts_of(const N& n, std::size_t b) const {
    const std::size_t e = b - dense_blocks;
    using R = routing_layout<L>;
    const auto routed = nn::routed_moe<expert_dims>(
        moved<mt::with_layout_t<N, R>>(n), as<C>(w_router[e], R{}), as<C>(router_bias[e], R{}),
        as<C>(expert_gate[e], R{}), as<C>(expert_up[e], R{}), as<C>(expert_down[e], R{}), routing);
    // The weighted balance loss rides on the block's output (mt::with_loss): a recomputed block makes
    // it again with the rest, so nothing it reads (the attention's output, the norm) is kept for it
    // between the passes; its value goes to last_aux_loss for the reported loss.
    const scalar aux = moved<scalar>(in_float(routed.aux_loss) * aux_loss_weight);
    if (!mt::recomputing()) {
      last_loads.push_back(moved<t<experts_unsplit>>(in_float(routed.load)));
      last_aux_loss = last_aux_loss ? scalar(*last_aux_loss + aux.detached()) : aux.detached();
    }
    const N y = mt::with_loss(moved<N>(routed.y), aux);
    if (b >= w_gate.size()) return y;  // no shared experts
    return N(y + nn::gated_feed_forward<d_model, d_ff>(n, as<C>(w_gate[b]), as<C>(w_up[b]), as<C>(w_down[b])));
  }

  // Inference with a key-value cache: each block's keys (rotated at their positions) and values,
  // allocated once for `capacity` positions and written in place, one position per token. Under
  // latent attention a position keeps its compressed keys and values (kv_rank numbers) and its
  // rotated key (d_rope), for all heads at once: 576 numbers per position and block for
  // DeepSeek-V3's sizes, against 2 x heads x d_kv = 32768 for its heads' keys and values.
  struct kv_cache {
    std::vector<t<batch, memory_length, kv_heads, d_kv>> k, v;
    std::vector<t<batch, memory_length, kv_rank>> latent;
    std::vector<t<batch, memory_length, d_rope>> k_rope;
    std::int64_t capacity = 0;
  };
  kv_cache start_cache(const grid& g, std::int64_t sequences, std::int64_t capacity) const {
    kv_cache c;
    c.capacity = capacity;
    for (std::size_t b = 0; b < wk.size(); ++b) {
      const std::array<std::int64_t, 4> e{sequences, capacity, wk[b].template extent<kv_heads>(), wk[b].template extent<d_kv>()};
      c.k.emplace_back(g, e);
      c.v.emplace_back(g, e);
    }
    for (std::size_t b = 0; b < w_kv_a.size(); ++b) {
      c.latent.emplace_back(g, std::array<std::int64_t, 3>{sequences, capacity, w_kv_a[b].template extent<kv_rank>()});
      c.k_rope.emplace_back(g, std::array<std::int64_t, 3>{sequences, capacity, w_k_rope[b].template extent<d_rope>()});
    }
    return c;
  }

  // Block b's attention for the one position p of h (next_logits), through the cache, which gains
  // position p; `masked` is 0 up to p and -1e9 after it. Latent attention reads the compressed cache
  // as it lies (DeepSeek-V2's absorbed form): a head's query without positions is taken through the
  // keys' projection first (kv_rank wide), and the weighted sum of the cached latents through the
  // values' projection after, so no position's keys or values are made again.
  template <class H, class Masked>
  H cached_attention(const H& h, std::size_t b, std::int64_t p, const nn::rope_config& at, kv_cache& cache,
                     const Masked& masked) const {
    if constexpr (has_latent_attention<L>) {
      if (!w_q_a.empty()) {
        const auto cq = compressed_query<typename H::value_type>(h, b);
        const auto ckv = nn::rms_norm<kv_rank>(mt::einsum<batch, length, kv_rank>(h, w_kv_a[b]), kv_a_norm[b], rms_eps);
        const auto k_rope = nn::rope<length, d_rope>(mt::einsum<batch, length, d_rope>(h, w_k_rope[b]), at);
        mt::update_slice<memory_length>(cache.latent[b], mt::rename<length, memory_length>(ckv), p);
        mt::update_slice<memory_length>(cache.k_rope[b], mt::rename<length, memory_length>(k_rope), p);
        const auto q_latent = mt::einsum<batch, length, kv_heads, group, kv_rank>(
            mt::einsum<batch, length, kv_heads, group, d_kv>(cq, w_q_nope[b]), w_k_nope[b]);
        const auto q_rope = nn::rope<length, d_rope>(mt::einsum<batch, length, kv_heads, group, d_rope>(cq, w_q_rope[b]), at);
        using scores = t<batch, length, kv_heads, group, memory_length>;
        const scores dots(mt::einsum<batch, length, kv_heads, group, memory_length>(q_latent, cache.latent[b]) +
                          mt::einsum<batch, length, kv_heads, group, memory_length>(q_rope, cache.k_rope[b]));
        const auto w = mt::softmax<memory_length>(dots * static_cast<float>(latent_scale(b)) + masked);
        const auto heads = mt::einsum<batch, length, kv_heads, group, d_kv>(
            mt::einsum<batch, length, kv_heads, group, kv_rank>(w, cache.latent[b]), w_v[b]);
        return mt::einsum<batch, length, d_model>(heads, wo[b]);
      }
    }
    const auto q = nn::rope<length, d_kv>(mt::einsum<batch, length, kv_heads, group, d_kv>(h, wq[b]), at);
    const auto k = nn::rope<length, d_kv>(mt::einsum<batch, length, kv_heads, d_kv>(h, wk[b]), at);
    mt::update_slice<memory_length>(cache.k[b], mt::rename<length, memory_length>(k), p);
    mt::update_slice<memory_length>(cache.v[b], mt::rename<length, memory_length>(mt::einsum<batch, length, kv_heads, d_kv>(h, wv[b])), p);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(wk[b].template extent<d_kv>())));
    const auto w = mt::softmax<memory_length>(
        mt::einsum<batch, length, kv_heads, group, memory_length>(q, cache.k[b]) * scale + masked);
    const auto o = mt::einsum<batch, length, kv_heads, group, d_kv>(w, cache.v[b]);
    return mt::einsum<batch, length, d_model>(o, wo[b]);
  }

  // Logits [batch, length = 1, vocab] after the tokens at position p (ids [batch, length = 1]); the
  // cache gains position p. logits()'s arithmetic at position p, with the cache in place of the
  // earlier positions' keys and values: positions after p get a bias of -1e9 (weight exactly 0),
  // so the attention reads the cache where it lies instead of a copy of its first p + 1 positions.
  auto next_logits(const mt::tensor<std::int32_t, L, batch, length>& token, std::int64_t p, kv_cache& cache) const {
    using X = t<batch, length, d_model>;
    X x = nn::embedding<vocab>(embedding, token);
    std::vector<float> mask(static_cast<std::size_t>(cache.capacity), 0.0f);
    std::fill(mask.begin() + p + 1, mask.end(), -1e9f);
    const auto masked = mt::from_host<t<memory_length>>(token.mesh(), {cache.capacity}, mask);
    nn::rope_config at = rope;
    at.position_offset = p;  // the one token's global position
    for (std::size_t b = 0; b < attention_norm.size(); ++b) {
      const X a = x + cached_attention(nn::rms_norm<d_model>(x, attention_norm[b], rms_eps), b, p, at, cache, masked);
      x = a + nn::gated_feed_forward<d_model, d_ff>(nn::rms_norm<d_model>(a, feed_forward_norm[b], rms_eps), w_gate[b],
                                                    w_up[b], w_down[b]);
    }
    return nn::dense<d_model, vocab>(nn::rms_norm<d_model>(x, final_norm, rms_eps), output_weight());
  }

  // Mean next-token cross-entropy of a batch of token ids, computed in C (the loss in float); with
  // --loss-chunks N the logits of 1/N of each processor's positions at a time.
  template <class C = float>
  scalar loss(const mt::tensor<std::int32_t, L, batch, length>& ids, const mt::tensor<std::int32_t, L, batch, length>& labels) const {
    auto loss = next_token_loss(hidden<C>(ids), labels);
    if (last_aux_loss) return scalar(loss + *last_aux_loss);  // its value (its gradient rides on the blocks)
    return loss;
  }
  // The cross-entropy of the output layer's logits of h (the last block's output, normalised)
  // against labels. The float weight (gathered, with --fsdp): each piece casts it to C, so the
  // pieces' gradients add up in float.
  template <class H>
  scalar next_token_loss(const H& h, const mt::tensor<std::int32_t, L, batch, length>& labels) const {
    return nn::chunked_cross_entropy<d_model, vocab, length>(h, as<float>(output_weight()), labels, loss_chunks);
  }
};

