#pragma once
// The Transformer LM of meshtensor-lm (main.cpp says what it does and how to run it): its blocks,
// the model under a layout, and its parameters' names. The training loop is training.hpp's.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "layouts.hpp"
#include "options.hpp"

// The parameter names, in the order of the tensors of model::tie() (a vector param's tensors one
// after another: each block's weight of one kind, then the next kind).
// A block's parameter kinds, in the order of the model's tuple (and the checkpoints' names).
inline constexpr std::array<const char*, 10> block_param_kinds{"ln1_scale", "ln1_bias", "wq",   "wk",   "wv",
                                                                "wo",        "ln2_scale", "ln2_bias", "w_in", "w_out"};
// A block's parameters, declared once, in block_param_kinds's order: Holder<Dims...> holds one
// kind (model's per_block: a vector over the blocks; a pipeline stage's over its own blocks).
template <template <class...> class Holder>
struct block_params {
  Holder<d_model> ln1_scale, ln1_bias;
  Holder<d_model, heads, d_kv> wq, wk, wv;
  Holder<heads, d_kv, d_model> wo;
  Holder<d_model> ln2_scale, ln2_bias;
  Holder<d_model, d_ff> w_in;
  Holder<d_ff, d_model> w_out;

  auto tie() { return tie_of(*this); }
  auto tie() const { return tie_of(*this); }
  std::size_t count() const { return wq.size(); }
  // Block b's parameters through f (a cast for use, a gather started), in the kinds' order: the
  // arguments of transformer_block after its input.
  template <class F>
  auto at(std::size_t b, const F& f) const {
    return std::apply([&](const auto&... kind) { return std::make_tuple(f(kind[b])...); }, tie());
  }

 private:
  template <class Self>
  static auto tie_of(Self& s) {
    return std::tie(s.ln1_scale, s.ln1_bias, s.wq, s.wk, s.wv, s.wo, s.ln2_scale, s.ln2_bias, s.w_in, s.w_out);
  }
};

// The values of a tuple of references (a gradient per parameter kind, say).
template <class Refs>
struct values_of;
template <class... T>
struct values_of<std::tuple<T&...>> {
  using type = std::tuple<std::remove_const_t<T>...>;
};

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
// With overlap (--tp-overlap) the reduce_scatters after attention's output projection and the MLP,
// and the allgather before the MLP, run part by part around the ring, each part's products
// computed while the next part travels (einsum_scattered, einsum_gathered); with overlap_qkv
// (--tp-overlap-qkv) the allgather before q, k and v too, one ring for the three
// (einsum_gathered_each).
template <class X, class XS, class S, class Q, class O, class Wi, class Wo>
XS sequence_parallel_block(const XS& in, const S& ln1_scale, const S& ln1_bias, const Q& wq, const Q& wk, const Q& wv,
                           const O& wo, const S& ln2_scale, const S& ln2_bias, const Wi& w_in, const Wo& w_out,
                           double rate, std::uint64_t site, std::uint64_t step, nn::attention_memory memory,
                           bool overlap = false, bool overlap_qkv = false) {
  const auto attended = [&]() -> XS {
    const auto normed = nn::layer_norm<d_model>(in, ln1_scale, ln1_bias);
    if (overlap_qkv)
      return nn::causal_attention_overlapped<X, length, memory_length, d_model, heads, d_kv>(normed, wq, wk, wv, wo, memory);
    const X h = mt::relayout_regathered<X>(normed);
    if (overlap) return nn::causal_attention_scattered<XS, length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo, memory);
    return mt::relayout<XS>(nn::causal_attention_partial<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo, memory));
  };
  const XS a = nn::residual_dropout(in, attended(), rate, site, step);
  const auto f = nn::layer_norm<d_model>(a, ln2_scale, ln2_bias);
  const auto fed = [&]() -> XS {
    if (overlap || overlap_qkv) return nn::feed_forward_overlapped<X, d_model, d_ff>(f, w_in, w_out);
    return mt::relayout<XS>(nn::feed_forward_partial<d_model, d_ff>(mt::relayout_regathered<X>(f), w_in, w_out));
  };
  return nn::residual_dropout(a, fed(), rate, site + 1, step);
}

// One block's weights, appended to the vectors of its kinds, drawn with model<L>'s seeds for block b
// (seed * 1000 + 2 + 6 b onwards: after the embedding and positions), so that a pipeline stage
// holding some blocks draws them as the whole model does.
template <class G, template <class...> class H>
void push_block(const G& g, const options& o, std::int64_t b, block_params<H>& w) {
  using s_t = typename decltype(w.ln1_scale)::value_type;
  const std::uint64_t s = o.seed * 1000 + 2 + 6 * static_cast<std::uint64_t>(b);
  const std::int64_t dm = o.d_model, h = o.heads, kv = o.d_kv, ff = o.d_ff;
  w.ln1_scale.push_back(mt::full<s_t>(g, {dm}, 1.0f));
  w.ln1_bias.push_back(mt::zeros<s_t>(g, {dm}));
  w.wq.push_back(nn::normal_fan_in<typename decltype(w.wq)::value_type, d_model>(g, {dm, h, kv}, s));
  w.wk.push_back(nn::normal_fan_in<typename decltype(w.wk)::value_type, d_model>(g, {dm, h, kv}, s + 1));
  w.wv.push_back(nn::normal_fan_in<typename decltype(w.wv)::value_type, d_model>(g, {dm, h, kv}, s + 2));
  w.wo.push_back(nn::normal_fan_in<typename decltype(w.wo)::value_type, heads, d_kv>(g, {h, kv, dm}, s + 3));
  w.ln2_scale.push_back(mt::full<s_t>(g, {dm}, 1.0f));
  w.ln2_bias.push_back(mt::zeros<s_t>(g, {dm}));
  w.w_in.push_back(nn::normal_fan_in<typename decltype(w.w_in)::value_type, d_model>(g, {dm, ff}, s + 4));
  w.w_out.push_back(nn::normal_fan_in<typename decltype(w.w_out)::value_type, d_ff>(g, {ff, dm}, s + 5));
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
  block_params<per_block> blocks;
  param<d_model> lnf_scale, lnf_bias;
  // The output projection: none with --tie-embeddings (the logits use the embedding, as GPT-2 and
  // GPT-3 do), else one.
  std::vector<param<d_model, vocab>> softmax_weights;

  auto tie() {
    return std::tuple_cat(std::tie(embedding, positions), blocks.tie(), std::tie(lnf_scale, lnf_bias, softmax_weights));
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
      push_block(g, o, b, blocks);
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
    return mt::use_as<C, L>(p);
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
    return project_out<C>(hidden<C>(ids, o, step));
  }

  // The last block's output, layer-normalised: what the output projection takes.
  template <class C = float>
  auto hidden(const t<batch, length>& ids, const options& o, std::uint64_t step) const {
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
          return blocks.at(b, [](const auto& p) { return start_use(p); });
        };
        std::optional<decltype(start_block(0))> next;
        if (blocks.count() > 0) next.emplace(start_block(0));
        for (std::size_t b = 0; b < blocks.count(); ++b) {
          auto w = std::apply([](auto&... g) { return std::make_tuple(g.wait()...); }, *next);
          if (b + 1 < blocks.count()) next.emplace(start_block(b + 1));
          x = std::apply([&](const auto&... ws) {
            return transformer_block(x, ws..., o.dropout, dseed + 2 * b, step, o.attention_memory());
          }, w);
        }
        return nn::layer_norm<d_model>(x, as<C>(lnf_scale), as<C>(lnf_bias));
      }
    }
    for (std::size_t b = 0; b < blocks.count(); ++b) {
      // Captures by value what dies with this call: the block runs again in gradient() with --recompute.
      const std::uint64_t site = dseed + 2 * b;
      const double rate = o.dropout;
      const auto memory = o.attention_memory();
      const bool ring = o.ring();
      const auto block = [this, b, site, rate, step, memory, ring](const X& in) {
        return std::apply([&](const auto&... w) { return transformer_block(in, w..., rate, site, step, memory, ring); },
                          blocks.at(b, [](const auto& p) { return as<C>(p); }));
      };
      x = o.recompute ? mt::recompute(block, x) : block(x);
    }
    return nn::layer_norm<d_model>(x, as<C>(lnf_scale), as<C>(lnf_bias));
  }

  // Logits [batch, length, vocab] of the final normalised stream h.
  template <class C, class H>
  auto project_out(const H& h) const {
    if (softmax_weights.empty()) return mt::einsum<batch, length, vocab>(h, as<C>(embedding));
    return nn::dense<d_model, vocab>(h, as<C>(softmax_weights[0]));
  }

  // Mean next-byte cross-entropy of a batch, in float whatever C is (the logits cast up first).
  // With --loss-chunks N, the logits of 1/N of each processor's positions at a time
  // (nn/chunked_cross_entropy.hpp).
  template <class C = float>
  t<> loss(const t<batch, length>& ids, const t<batch, length>& labels, const options& o, std::uint64_t step) const {
    if (o.loss_chunks == 1)
      return mt::reduce_mean<batch, length>(
          nn::softmax_cross_entropy<vocab>(mt::cast<float>(logits<C>(ids, o, step)), labels));
    // The float weights (gathered for use where stored split): each piece casts them to C, so
    // the pieces' gradients add up in float.
    const auto h = hidden<C>(ids, o, step);
    if (softmax_weights.empty())
      return nn::chunked_cross_entropy<d_model, vocab, length>(h, as<float>(embedding), labels, o.loss_chunks);
    return nn::chunked_cross_entropy<d_model, vocab, length>(h, as<float>(softmax_weights[0]), labels, o.loss_chunks);
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
    for (std::size_t b = 0; b < blocks.count(); ++b) {
      const std::uint64_t site = dseed + 2 * b;
      const double rate = o.dropout;
      const auto memory = o.attention_memory();
      const bool overlap = o.tp_overlap, overlap_qkv = o.tp_overlap_qkv;
      const auto block = [this, b, site, rate, step, memory, overlap, overlap_qkv](const XS& in) {
        return std::apply(
            [&](const auto&... w) {
              return sequence_parallel_block<X>(in, w..., rate, site, step, memory, overlap, overlap_qkv);
            },
            blocks.at(b, [](const auto& p) { return as<C>(p); }));
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
      for (const auto& wq : m.blocks.wq) {
        const std::array<std::int64_t, 4> e{1, wq.template extent<heads>(), capacity, wq.template extent<d_kv>()};
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
    const auto& blk = blocks;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(blk.wq[0].template extent<d_kv>())));
    // Positions after p masked out (weight exactly 0): the attention reads the cache where it
    // lies. slice<memory_length>(cache, 0, p + 1) would copy positions 0..p of every block's keys
    // and values for every token, as concat did (its copy was 40% of a 600-byte generation).
    const std::int64_t capacity = cache.k[0].template extent<memory_length>();
    std::vector<float> mask(static_cast<std::size_t>(capacity), 0.0f);
    std::fill(mask.begin() + p + 1, mask.end(), -1e9f);
    const auto bias = mt::from_host<t<memory_length>>(token.mesh(), {capacity}, mask);
    for (std::size_t b = 0; b < blk.count(); ++b) {
      const auto h = nn::layer_norm<d_model>(x, blk.ln1_scale[b], blk.ln1_bias[b]);
      const auto q = mt::einsum<batch, heads, length, d_kv>(h, blk.wq[b]) * scale;
      const auto hm = mt::rename<length, memory_length>(h);
      mt::update_slice<memory_length>(cache.k[b], mt::einsum<batch, heads, memory_length, d_kv>(hm, blk.wk[b]), p);
      mt::update_slice<memory_length>(cache.v[b], mt::einsum<batch, heads, memory_length, d_kv>(hm, blk.wv[b]), p);
      const auto w = mt::softmax<memory_length>(mt::einsum<batch, heads, length, memory_length>(q, cache.k[b]) + bias);
      const auto o = mt::einsum<batch, heads, length, d_kv>(w, cache.v[b]);
      const X a = x + mt::einsum<batch, length, d_model>(o, blk.wo[b]);
      const auto f = nn::layer_norm<d_model>(a, blk.ln2_scale[b], blk.ln2_bias[b]);
      x = a + nn::feed_forward<d_model, d_ff>(f, blk.w_in[b], blk.w_out[b]);
    }
    return project_out<float>(nn::layer_norm<d_model>(x, lnf_scale, lnf_bias));
  }
};
