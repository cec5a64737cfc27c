#pragma once
// The Transformer LM of meshtensor-lm (main.cpp says what it does and how to run it): its dims and
// layouts, the model, and train<L>, which trains it under one layout. train<L> is compiled once per
// layout in a file of its own (train_data.cpp, train_model.cpp, train_2d.cpp), so the layouts
// compile in parallel and no compiler process holds all three (docs/performance.md, "Build time").
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

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct memory_length : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using layout_model = mt::layout<grid, mt::split<vocab, rows, cols>, mt::split<heads, rows, cols>,
                                mt::split<d_ff, rows, cols>>;
using layout_2d = mt::layout<grid, mt::split<batch, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                             mt::split<d_ff, cols>>;
// --layout context: the batch over rows and the sequence over cols (context parallelism; with
// --mesh 1 N the sequence alone). Attention (transformer_block) either moves the sequence's split to
// the heads and back (--attention all-to-all, nn::all_to_all_causal_attention: four alltoalls each
// way) or passes the keys' and values' blocks around the ring of cols (--attention ring,
// nn::ring_causal_attention: P - 1 shifts forward, P back); everything else is per position.
using layout_context = mt::layout<grid, mt::split<batch, rows>, mt::split<length, cols>>;
// --layout 2d_context: the sequence over rows (the context axis), vocab, heads and d_ff over cols
// (the tensor axis), the batch whole: context x tensor parallelism (Megatron-Core's cp x tp). The
// ring keeps the heads split over cols and passes blocks along rows; all-to-all moves the
// sequence's split onto the heads (heads over cols, then rows), so rows x cols is capped by them
// (parts beyond the heads idle).
using layout_2d_context = mt::layout<grid, mt::split<length, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                                     mt::split<d_ff, cols>>;

// Decoding (--generate) computes under decode_layout_t<L>. One token has no sequence to split, so
// under --layout context (2d_context) the key-value cache's positions (memory_length) are split over
// the context axis, cols (rows), instead: a long prompt's keys and values take 1/P of the memory on
// each of P processors; a token's key and value are written by the processor holding its position,
// and attention's softmax and weighted sum over the cache end in allreduces over that axis. Other
// layouts decode under their own.
template <class L>
struct decode_layout {
  using type = L;
};
template <>
struct decode_layout<layout_context> {
  using type = mt::layout<grid, mt::split<batch, rows>, mt::split<memory_length, cols>>;
};
// --layout 2d_context: the cache's positions over rows (its context axis), a token's heads, d_ff and
// vocab over cols, as in training.
template <>
struct decode_layout<layout_2d_context> {
  using type = mt::layout<grid, mt::split<memory_length, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                          mt::split<d_ff, cols>>;
};
template <class L>
using decode_layout_t = typename decode_layout<L>::type;

// --sequence-parallel: between the blocks' products, the residual stream [batch, length, d_model]
// has length split over the axes that split heads and d_ff, so the products' pending sums arrive
// by reduce_scatter (each processor receives the sum of its part of the sequence: half an
// allreduce's traffic), the layer norms, residual adds and dropout run on 1/P of the tokens, and an
// allgather brings each block's normalised input back whole for the next products (Megatron-LM's
// sequence parallelism, written with ops/partial_sum.hpp); the products keep only its 1/P part for
// the backward pass, which gathers it again (ops/relayout_regathered.hpp). Layouts that split heads
// only.
template <class L>
struct sequence_layout {};
template <>
struct sequence_layout<layout_model> {
  using type = mt::layout<grid, mt::split<vocab, rows, cols>, mt::split<heads, rows, cols>, mt::split<d_ff, rows, cols>,
                          mt::split<length, rows, cols>>;
};
template <>
struct sequence_layout<layout_2d> {
  using type = mt::layout<grid, mt::split<batch, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                          mt::split<d_ff, cols>, mt::split<length, cols>>;
};

// --layout fsdp and fsdp_2d: fully sharded data parallelism (ops/gather_for_use.hpp). The model
// computes under layout_data (fsdp) or layout_2d (fsdp_2d); its parameters are stored with d_model
// (a dim every one of them has) split over the axes that split the batch, on top of the model
// splits of layout_2d. --zero says what is split (optim/sharded.hpp): 3 (the default) stores the
// parameters split and gathers each where a block uses it; 2 stores them split and gathers them all
// once per step; 1 stores them whole and splits only the optimizer's state. In each case the
// gradients, the optimizer's state and (2, 3) the parameters are split as the same layout says.
using params_fsdp = mt::layout<grid, mt::split<d_model, rows, cols>>;
using params_fsdp_2d = mt::layout<grid, mt::split<d_model, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                                  mt::split<d_ff, cols>>;
template <class L>
struct shard_layout_of {};
template <>
struct shard_layout_of<layout_data> {
  using type = params_fsdp;
};
template <>
struct shard_layout_of<layout_2d> {
  using type = params_fsdp_2d;
};
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
  bool sequence_parallel = false;  // the residual stream split along length (layouts model, 2d)
  // Attention of the layouts that split the sequence (context, 2d_context): "all-to-all" or "ring".
  std::string attention = "all-to-all";
  bool ring() const { return attention == "ring"; }
  std::string dtype = "float32";  // or bf16: activations and products in bf16, float master weights
  bool compare_dtypes = false;
  double bf16_tolerance = 1e-2;
  // Planning (docs/plan-mode.md): --plan plans one training step for --mesh on no processes.
  bool plan = false, check_plan = false;
  std::string plan_json, calibration;
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

// The parameter names, in the order of the tensors of model::tie() (a vector param's tensors one
// after another: each block's weight of one kind, then the next kind).
// A block's parameter kinds, in the order of the model's tuple (and the checkpoints' names).
inline constexpr std::array<const char*, 10> block_param_kinds{"ln1_scale", "ln1_bias", "wq",   "wk",   "wv",
                                                                "wo",        "ln2_scale", "ln2_bias", "w_in", "w_out"};
inline std::vector<std::string> param_names(std::int64_t layers, bool tied_embeddings) {
  std::vector<std::string> names{"embedding", "positions"};
  for (const char* n : block_param_kinds)
    for (std::int64_t b = 0; b < layers; ++b) names.push_back("blocks." + std::to_string(b) + "." + n);
  for (const char* n : {"lnf_scale", "lnf_bias"}) names.push_back(n);
  if (!tied_embeddings) names.push_back("softmax_weights");
  return names;
}

// Calls f(index, tensor) for every tensor of a tuple of params (vectors flattened, as the names).
template <class Params, class F>
void for_each_param_tensor(Params&& params, F&& f) {
  std::size_t i = 0;
  std::apply([&](auto&... p) { (mt::for_each_tensor(p, [&](auto& t) { f(i++, t); }), ...); }, params);
}

// A float32 array in NumPy's .npy format (version 1.0, little-endian, C order).
inline void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<std::int64_t>& shape) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (auto e : shape) header += std::to_string(e) + ", ";
  header += "), }";
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw mt::io_error(fmt::format("cannot write '{}'", path));
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const unsigned char le[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  out.write(reinterpret_cast<const char*>(le), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) throw mt::io_error(fmt::format("cannot write '{}'", path));
}

// Gathers t to rank 0, which writes it to path. Collective.
template <class T>
void dump_tensor(const T& t, const std::string& path) {
  const auto full = mt::gather(t);
  if (t.mesh().rank() != 0) return;
  const auto ext = t.extents();
  write_npy(path, full, std::vector<std::int64_t>(ext.begin(), ext.end()));
}

// One block: pre-norm causal attention and feed-forward, each with dropout (sites site and site + 1)
// and a residual add. The weights as the computation uses them (gathered, cast). Where X's layout
// splits the sequence (context parallelism), attention runs by the ring (ring) or by all-to-all.
template <class X, class S, class Q, class O, class Wi, class Wo>
X transformer_block(const X& in, const S& ln1_scale, const S& ln1_bias, const Q& wq, const Q& wk, const Q& wv,
                    const O& wo, const S& ln2_scale, const S& ln2_bias, const Wi& w_in, const Wo& w_out, double rate,
                    std::uint64_t site, std::uint64_t step,
                    nn::attention_memory memory = nn::attention_memory::keep_all, bool ring = false) {
  const auto h = nn::layer_norm<d_model>(in, ln1_scale, ln1_bias);
  const auto attended = [&]() -> X {
    if constexpr (std::is_same_v<typename X::layout_type::template axes_of<length>, mt::type_list<>>) {
      (void)ring;
      return nn::causal_attention<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo, memory);
    } else {  // the sequence split: context parallelism
      if (ring) return nn::ring_causal_attention<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo);
      return nn::all_to_all_causal_attention<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo, memory);
    }
  };
  const X a = nn::residual_dropout(in, attended(), rate, site, step);
  const auto f = nn::layer_norm<d_model>(a, ln2_scale, ln2_bias);
  return nn::residual_dropout(a, nn::feed_forward<d_model, d_ff>(f, w_in, w_out), rate, site + 1, step);
}

// transformer_block under sequence parallelism (--sequence-parallel): the residual stream `in` is
// XS (length split over the axes that split heads and d_ff), the products run on X (the same dims
// whole along length). Each sublayer: the layer norm on this processor's tokens; an allgather of
// its result, whose 1/P part alone the products keep for the backward pass, which gathers it again
// (relayout_regathered); the products; their pending sum by reduce_scatter back to XS. The layer
// norms take the [d_model] parameters as they are (replicated under both layouts).
template <class X, class XS, class S, class Q, class O, class Wi, class Wo>
XS sequence_parallel_block(const XS& in, const S& ln1_scale, const S& ln1_bias, const Q& wq, const Q& wk, const Q& wv,
                           const O& wo, const S& ln2_scale, const S& ln2_bias, const Wi& w_in, const Wo& w_out,
                           double rate, std::uint64_t site, std::uint64_t step, nn::attention_memory memory) {
  const X h = mt::relayout_regathered<X>(nn::layer_norm<d_model>(in, ln1_scale, ln1_bias));
  const XS a = nn::residual_dropout(
      in,
      mt::relayout<XS>(nn::causal_attention_partial<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo, memory)),
      rate, site, step);
  const X f = mt::relayout_regathered<X>(nn::layer_norm<d_model>(a, ln2_scale, ln2_bias));
  return nn::residual_dropout(a, mt::relayout<XS>(nn::feed_forward_partial<d_model, d_ff>(f, w_in, w_out)), rate, site + 1,
                              step);
}

// One block's weights, appended to the vectors of its kinds, drawn with model<L>'s seeds for block b
// (seed * 1000 + 2 + 6 b onwards: after the embedding and positions), so that a pipeline stage
// holding some blocks draws them as the whole model does.
template <class S, class Q, class O, class Wi, class Wo>
void push_block(const typename S::value_type::mesh_type& g, const options& o, std::int64_t b, S& ln1_scale,
                S& ln1_bias, Q& wq, Q& wk, Q& wv, O& wo, S& ln2_scale, S& ln2_bias, Wi& w_in, Wo& w_out) {
  using s_t = typename S::value_type;
  const std::uint64_t s = o.seed * 1000 + 2 + 6 * static_cast<std::uint64_t>(b);
  const std::int64_t dm = o.d_model, h = o.heads, kv = o.d_kv, ff = o.d_ff;
  ln1_scale.push_back(mt::full<s_t>(g, {dm}, 1.0f));
  ln1_bias.push_back(mt::zeros<s_t>(g, {dm}));
  wq.push_back(nn::normal_fan_in<typename Q::value_type, d_model>(g, {dm, h, kv}, s));
  wk.push_back(nn::normal_fan_in<typename Q::value_type, d_model>(g, {dm, h, kv}, s + 1));
  wv.push_back(nn::normal_fan_in<typename Q::value_type, d_model>(g, {dm, h, kv}, s + 2));
  wo.push_back(nn::normal_fan_in<typename O::value_type, heads, d_kv>(g, {h, kv, dm}, s + 3));
  ln2_scale.push_back(mt::full<s_t>(g, {dm}, 1.0f));
  ln2_bias.push_back(mt::zeros<s_t>(g, {dm}));
  w_in.push_back(nn::normal_fan_in<typename Wi::value_type, d_model>(g, {dm, ff}, s + 4));
  w_out.push_back(nn::normal_fan_in<typename Wo::value_type, d_ff>(g, {ff, dm}, s + 5));
}
// The output projection's seed: after every block's.
inline std::uint64_t softmax_seed(const options& o) { return o.seed * 1000 + 2 + 6 * static_cast<std::uint64_t>(o.layers); }

// The model computes under layout L; its parameters are stored under PL (L itself, or a layout
// that splits them over the data axes as well: fsdp).
template <class L, class PL = L>
struct model {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  template <class... D>
  using param = mt::tensor<float, PL, D...>;
  // The blocks' weights, one vector per kind with an entry per block (--layers): gradient() and the
  // optimizers take a vector as one param.
  template <class... D>
  using per_block = std::vector<param<D...>>;
  param<vocab, d_model> embedding;
  param<length, d_model> positions;
  per_block<d_model> ln1_scale, ln1_bias;
  per_block<d_model, heads, d_kv> wq, wk, wv;
  per_block<heads, d_kv, d_model> wo;
  per_block<d_model> ln2_scale, ln2_bias;
  per_block<d_model, d_ff> w_in;
  per_block<d_ff, d_model> w_out;
  param<d_model> lnf_scale, lnf_bias;
  // The output projection: none with --tie-embeddings (the logits use the embedding, as GPT-2 and
  // GPT-3 do), else one.
  std::vector<param<d_model, vocab>> softmax_weights;

  auto tie() {
    return std::tie(embedding, positions, ln1_scale, ln1_bias, wq, wk, wv, wo, ln2_scale, ln2_bias, w_in, w_out,
                    lnf_scale, lnf_bias, softmax_weights);
  }

  model() = default;
  // In a planned run, the tensors made here count as parameters (no effect on a real run).
  model(const grid& g, const options& o) {
    const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);
    const std::uint64_t s = o.seed * 1000;
    const std::int64_t dm = o.d_model;
    embedding = mt::random_normal<decltype(embedding)>(g, {o.vocab, dm}, s, 0, 0.3);
    positions = mt::random_normal<decltype(positions)>(g, {o.length, dm}, s + 1, 0, 0.1);
    for (std::int64_t b = 0; b < o.layers; ++b)
      push_block(g, o, b, ln1_scale, ln1_bias, wq, wk, wv, wo, ln2_scale, ln2_bias, w_in, w_out);
    lnf_scale = mt::full<param<d_model>>(g, {dm}, 1.0f);
    lnf_bias = mt::zeros<param<d_model>>(g, {dm});
    if (!o.tie_embeddings)
      softmax_weights.push_back(nn::normal_fan_in<param<d_model, vocab>, d_model>(g, {dm, o.vocab}, softmax_seed(o)));
    for_each_param_tensor(tie(), [](std::size_t, auto& p) { p.requires_grad(); });
  }

  // Parameters of the whole model (global extents), counted from its tensors.
  std::int64_t parameter_count() {
    std::int64_t n = 0;
    for_each_param_tensor(tie(), [&](std::size_t, const auto& p) { n += p.size(); });
    return n;
  }

  // A parameter as the computation uses it: under L (gathered, where stored split: its gradient
  // comes back split by reduce_scatter) and in the element type C (for bf16, a bf16 copy whose
  // gradient flows back to the float master weight, what the optimizer updates; cast before the
  // gather, which then moves half the bytes).
  template <class C, class P>
  static auto as(const P& p) {
    using used = mt::with_layout_t<P, L>;
    if constexpr (std::is_same_v<P, used>) {
      if constexpr (std::is_same_v<C, float>) return p;
      else return mt::cast<C>(p);
    } else if constexpr (std::is_same_v<C, float>) {
      return mt::gather_for_use<used>(p);
    } else {
      return mt::gather_for_use<typename used::template rebind<C>>(mt::cast<C>(p));
    }
  }

  // A stored parameter's gather for its use under L, started (gather_in_flight: wait() gives it).
  template <class P>
  static auto start_use(const P& p) {
    return mt::start_gather_for_use<mt::with_layout_t<P, L>>(p);
  }

  // The parameters gathered once under L, on the tape (--zero 2: every block then uses the
  // gathered copy; the gradients still come back split).
  model<L> gathered() const {
    return converted<model<L>>([]<class W>(const auto& p) { return mt::gather_for_use<W>(p); });
  }
  // The parameters moved to layout D (a copy, off the tape): decoding under decode_layout_t<L>.
  template <class D>
  model<D> relayouted() const {
    const mt::no_grad copy;
    return converted<model<D>>([]<class W>(const auto& p) { return mt::relayout<W>(p); });
  }
  // Model M with each parameter of this one converted by convert.template operator()<W>(p), W the
  // parameter's type in M (a per-block vector converted entry by entry).
  template <class M, class Convert>
  M converted(const Convert& convert) const {
    M out;
    auto to = out.tie();
    const auto from = const_cast<model&>(*this).tie();
    const auto one = [&]<class W, class P>(W& w, const P& p) {
      if constexpr (mt::Tensor<P>) {
        w = convert.template operator()<W>(p);
      } else {
        w.clear();
        for (const auto& e : p) w.push_back(convert.template operator()<typename W::value_type>(e));
      }
    };
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (one(std::get<I>(to), std::get<I>(from)), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(from)>>{});
    return out;
  }

  // Logits [batch, length, vocab] of sequences of up to --length tokens, computed in C (float, or
  // bf16 with --dtype bf16: activations and products in bf16, sums and row statistics in float).
  template <class C = float>
  auto logits(const t<batch, length>& ids, const options& o, std::uint64_t step) const {
    const std::uint64_t dseed = o.seed * 7919;
    using X = mt::tensor<C, L, batch, length, d_model>;
    const std::int64_t n = ids.template extent<length>();
    X x = nn::embedding<vocab>(as<C>(embedding), ids) +
          as<C>(n == positions.template extent<length>() ? positions : mt::slice<length>(positions, 0, n));
    if constexpr (!std::is_same_v<PL, L> && std::is_same_v<C, float>) {
      // --prefetch (--zero 3, no --recompute): block b + 1's gathers are started (nonblocking
      // allgathers) before block b computes, and waited for when block b + 1 needs them.
      if (o.prefetch) {
        const auto start_block = [this](std::size_t b) {
          return std::make_tuple(start_use(ln1_scale[b]), start_use(ln1_bias[b]), start_use(wq[b]), start_use(wk[b]),
                                 start_use(wv[b]), start_use(wo[b]), start_use(ln2_scale[b]), start_use(ln2_bias[b]),
                                 start_use(w_in[b]), start_use(w_out[b]));
        };
        std::optional<decltype(start_block(0))> next;
        if (!wq.empty()) next.emplace(start_block(0));
        for (std::size_t b = 0; b < wq.size(); ++b) {
          auto w = std::apply([](auto&... g) { return std::make_tuple(g.wait()...); }, *next);
          if (b + 1 < wq.size()) next.emplace(start_block(b + 1));
          x = std::apply([&](const auto&... ws) {
            return transformer_block(x, ws..., o.dropout, dseed + 2 * b, step, o.attention_memory());
          }, w);
        }
        return project_out<C>(nn::layer_norm<d_model>(x, as<C>(lnf_scale), as<C>(lnf_bias)));
      }
    }
    for (std::size_t b = 0; b < wq.size(); ++b) {
      // Captures by value what dies with this call: the block runs again in gradient() with --recompute.
      const std::uint64_t site = dseed + 2 * b;
      const double rate = o.dropout;
      const auto memory = o.attention_memory();
      const bool ring = o.ring();
      const auto block = [this, b, site, rate, step, memory, ring](const X& in) {
        return transformer_block(in, as<C>(ln1_scale[b]), as<C>(ln1_bias[b]), as<C>(wq[b]), as<C>(wk[b]), as<C>(wv[b]),
                                 as<C>(wo[b]), as<C>(ln2_scale[b]), as<C>(ln2_bias[b]), as<C>(w_in[b]), as<C>(w_out[b]),
                                 rate, site, step, memory, ring);
      };
      x = o.recompute ? mt::recompute(block, x) : block(x);
    }
    return project_out<C>(nn::layer_norm<d_model>(x, as<C>(lnf_scale), as<C>(lnf_bias)));
  }

  // Logits [batch, length, vocab] of the final normalised stream h.
  template <class C, class H>
  auto project_out(const H& h) const {
    if (softmax_weights.empty()) return mt::einsum<batch, length, vocab>(h, as<C>(embedding));
    return nn::dense<d_model, vocab>(h, as<C>(softmax_weights[0]));
  }

  // Mean next-byte cross-entropy of a batch, in float whatever C is (the logits cast up first).
  template <class C = float>
  t<> loss(const t<batch, length>& ids, const t<batch, length>& labels, const options& o, std::uint64_t step) const {
    return mt::reduce_mean<batch, length>(
        nn::softmax_cross_entropy<vocab>(mt::cast<float>(logits<C>(ids, o, step)), labels));
  }

  // loss() with --sequence-parallel: the same arithmetic, the residual stream under LS
  // (sequence_layout<L>), computed in C as loss<C> is (bf16: the weights cast once each, the
  // gathers and reduce_scatters move bf16, their sums run in float).
  template <class LS, class C = float>
  t<> loss_sequence_parallel(const t<batch, length>& ids, const t<batch, length>& labels, const options& o,
                             std::uint64_t step) const {
    using X = mt::tensor<C, L, batch, length, d_model>;
    using XS = mt::tensor<C, LS, batch, length, d_model>;
    const std::uint64_t dseed = o.seed * 7919;
    // Local: each processor keeps its part of the sequence.
    XS x = mt::relayout<XS>(X(nn::embedding<vocab>(as<C>(embedding), ids) + as<C>(positions)));
    for (std::size_t b = 0; b < wq.size(); ++b) {
      const std::uint64_t site = dseed + 2 * b;
      const double rate = o.dropout;
      const auto memory = o.attention_memory();
      const auto block = [this, b, site, rate, step, memory](const XS& in) {
        return sequence_parallel_block<X>(in, as<C>(ln1_scale[b]), as<C>(ln1_bias[b]), as<C>(wq[b]), as<C>(wk[b]),
                                          as<C>(wv[b]), as<C>(wo[b]), as<C>(ln2_scale[b]), as<C>(ln2_bias[b]),
                                          as<C>(w_in[b]), as<C>(w_out[b]), rate, site, step, memory);
      };
      x = o.recompute ? mt::recompute(block, x) : block(x);
    }
    const X last = mt::relayout<X>(nn::layer_norm<d_model>(x, as<C>(lnf_scale), as<C>(lnf_bias)));
    return mt::reduce_mean<batch, length>(
        nn::softmax_cross_entropy<vocab>(mt::cast<float>(project_out<C>(last)), labels));
  }

  // Inference with a key-value cache: each block's keys and values, allocated once for `capacity`
  // positions (the prompt and the bytes to generate) and written in place, one position per
  // token: appending with concat copied the whole cache for every token.
  struct kv_cache {
    std::vector<t<batch, heads, memory_length, d_kv>> k, v;
    kv_cache(const model& m, const grid& g, std::int64_t capacity) {
      for (std::size_t b = 0; b < m.wq.size(); ++b) {
        const std::array<std::int64_t, 4> e{1, m.wq[b].template extent<heads>(), capacity,
                                            m.wq[b].template extent<d_kv>()};
        k.emplace_back(g, e);
        v.emplace_back(g, e);
      }
    }
  };
  // Logits [batch, length = 1, vocab] after the token at position p (ids [batch, length = 1]); the
  // cache gains position p. The same arithmetic as logits() at position p (causal_attention's, with
  // the cache in place of the earlier positions' keys and values); under the model layout the
  // heads, d_ff and vocab splits leave two allreduces per block (attention's output projection,
  // the feed-forward's) and the layer norms' none.
  auto next_logits(const t<batch, length>& token, std::int64_t p, kv_cache& cache) const {
    using X = t<batch, length, d_model>;
    X x = nn::embedding<vocab>(embedding, token) + mt::slice<length>(positions, p, 1);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(wq[0].template extent<d_kv>())));
    // Positions after p masked out (weight exactly 0): the attention reads the cache where it
    // lies. slice<memory_length>(cache, 0, p + 1) would copy positions 0..p of every block's keys
    // and values for every token, as concat did (its copy was 40% of a 600-byte generation).
    const std::int64_t capacity = cache.k[0].template extent<memory_length>();
    std::vector<float> mask(static_cast<std::size_t>(capacity), 0.0f);
    std::fill(mask.begin() + p + 1, mask.end(), -1e9f);
    const auto bias = mt::from_host<t<memory_length>>(token.mesh(), {capacity}, mask);
    for (std::size_t b = 0; b < wq.size(); ++b) {
      const auto h = nn::layer_norm<d_model>(x, ln1_scale[b], ln1_bias[b]);
      const auto q = mt::einsum<batch, heads, length, d_kv>(h, wq[b]) * scale;
      const auto hm = mt::rename<length, memory_length>(h);
      mt::update_slice<memory_length>(cache.k[b], mt::einsum<batch, heads, memory_length, d_kv>(hm, wk[b]), p);
      mt::update_slice<memory_length>(cache.v[b], mt::einsum<batch, heads, memory_length, d_kv>(hm, wv[b]), p);
      const auto w = mt::softmax<memory_length>(mt::einsum<batch, heads, length, memory_length>(q, cache.k[b]) + bias);
      const auto o = mt::einsum<batch, heads, length, d_kv>(w, cache.v[b]);
      const X a = x + mt::einsum<batch, length, d_model>(o, wo[b]);
      const auto f = nn::layer_norm<d_model>(a, ln2_scale[b], ln2_bias[b]);
      x = a + nn::feed_forward<d_model, d_ff>(f, w_in[b], w_out[b]);
    }
    return project_out<float>(nn::layer_norm<d_model>(x, lnf_scale, lnf_bias));
  }
};

// The axes that split the cache's positions under decode layout D, for the report.
template <class D>
const char* cache_axes() {
  using A = typename D::template axes_of<memory_length>;
  if constexpr (std::is_same_v<A, mt::type_list<>>) return "no axis";
  else if constexpr (std::is_same_v<A, mt::type_list<rows>>) return "rows";
  else return "cols";
}

// --generate N: N bytes sampled after --prompt, one at a time through the key-value cache, with the
// per-token latency (the logits gathered on every rank, so each knows the next byte). With
// --check-generate, the cached logits of every position are compared with one full forward pass
// over the whole sequence. Returns false when they disagree.
// Decoding runs on dm, the model under decode_layout_t<L> (m itself, or its copy there); the check's
// full forward pass on m, under L.
template <class L, class D>
bool generate_on(const model<L>& m, const model<D>& dm, const grid& g, const options& o) {
  using ids_t = mt::tensor<float, L, batch, length>;
  using token_t = mt::tensor<float, D, batch, length>;
  const std::int64_t n_prompt = static_cast<std::int64_t>(o.prompt.size()), total = n_prompt + o.generate;
  if (o.vocab != 256) throw mt::error("--generate samples bytes: it needs --vocab 256");
  if (n_prompt == 0) throw mt::error("--generate needs a --prompt of at least one byte");
  if (total > o.length)
    throw mt::error(fmt::format("--generate: the prompt's {} bytes and {} new ones exceed --length {} (the positions "
                                "the model has)", n_prompt, o.generate, o.length));
  // Positions 0 .. total - 2 go through the cache (the last byte is only sampled).
  typename model<D>::kv_cache cache(dm, g, total - 1);
  std::mt19937_64 rng(o.seed * 31 + 7);  // the same draws on every rank
  std::vector<float> seq(o.prompt.begin(), o.prompt.end());
  std::vector<std::vector<float>> cached;  // each position's logits, for --check-generate
  std::vector<double> token_ms;
  for (std::int64_t p = 0; p + 1 < total; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    auto lv = mt::gather_all(dm.next_logits(mt::from_host<token_t>(g, {1, 1}, std::span<const float>(&seq[p], 1)), p, cache));
    if (p + 1 >= n_prompt) {
      // The next byte: the most likely, or drawn from softmax(logits / temperature).
      std::size_t next = std::max_element(lv.begin(), lv.end()) - lv.begin();
      if (o.temperature > 0) {
        std::vector<double> w(lv.size());
        for (std::size_t i = 0; i < lv.size(); ++i) w[i] = std::exp((lv[i] - lv[next]) / o.temperature);
        next = std::discrete_distribution<std::size_t>(w.begin(), w.end())(rng);
      }
      seq.push_back(static_cast<float>(next));
      token_ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (o.check_generate) cached.push_back(std::move(lv));
  }
  const bool root = g.rank() == 0;
  // The cache this processor holds (keys and values of every block), against the whole cache: the
  // context layout splits its positions.
  std::int64_t held = 0, whole = 0;
  for (const auto* list : {&cache.k, &cache.v})
    for (const auto& t : *list) held += t.local_size(), whole += t.size();
  std::int64_t most_held = held;
  MPI_Allreduce(&held, &most_held, 1, MPI_INT64_T, MPI_MAX, g.communicator().cart());
  // The median of the first and of the last 20 tokens: flat when a token's cost does not grow
  // with its position.
  const auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const auto ends = static_cast<std::ptrdiff_t>(std::min<std::size_t>(20, token_ms.size()));
  const double first_ms = median_of({token_ms.begin(), token_ms.begin() + ends});
  const double last_ms = median_of({token_ms.end() - ends, token_ms.end()});
  std::sort(token_ms.begin(), token_ms.end());
  if (root) {
    std::string text;
    for (float c : seq) text += (c >= 32 && c < 127) || c == '\n' ? static_cast<char>(c) : '?';
    std::printf("generated %lld bytes after a prompt of %lld on %d ranks (temperature %g):\n%s\n",
                (long long)o.generate, (long long)n_prompt, g.nprocs(), o.temperature, text.c_str());
    std::printf("per-token latency: median %.3f ms, min %.3f ms, max %.3f ms; median of the first %td %.3f ms, "
                "of the last %td %.3f ms\n",
                token_ms[token_ms.size() / 2], token_ms.front(), token_ms.back(), ends, first_ms, ends, last_ms);
    std::printf("key-value cache: %lld positions, at most %.1f KiB per rank of %.1f KiB (positions split over %s)\n",
                (long long)(total - 1), double(most_held) * sizeof(float) / 1024, double(whole) * sizeof(float) / 1024,
                cache_axes<D>());
  }
  if (!o.check_generate) return true;
  // One forward pass over the sequence (without its last byte): position p's logits must be the
  // cached run's.
  const std::vector<float> ids(seq.begin(), seq.end() - 1);
  const auto full = mt::gather_all(m.logits(mt::from_host<ids_t>(g, {1, total - 1}, ids), o, 0));
  double worst = 0;
  for (std::int64_t p = 0; p + 1 < total; ++p)
    for (std::int64_t v = 0; v < o.vocab; ++v)
      worst = std::max(worst, std::abs(double(full[p * o.vocab + v]) - double(cached[p][v])));
  const bool ok = worst <= 1e-4;
  if (root)
    std::printf("check-generate: largest difference between cached and full logits %.2e over %lld positions: %s\n",
                worst, (long long)(total - 1), ok ? "the cached and full logits agree" : "THEY DIFFER");
  return ok;
}

template <class L>
bool generate(const model<L>& m, const grid& g, const options& o) {
  const mt::no_grad inference;  // no tape: nothing is kept for a backward pass
  if constexpr (std::is_same_v<decode_layout_t<L>, L>) return generate_on(m, m, g, o);
  else return generate_on(m, m.template relayouted<decode_layout_t<L>>(), g, o);
}

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

// The bf16 loss of each layout, compiled in train_<layout>_bf16.cpp (beside train_<layout>.cpp:
// the two computations are the largest part of the tool's build, and build in parallel).
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
