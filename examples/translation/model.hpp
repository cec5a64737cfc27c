#pragma once
// The encoder-decoder Transformer of examples/translation (main.cpp says what it does and how to run
// it): its dims and layouts, the model, training under one layout, and decoding (greedy and beam
// search with a key-value cache). train<L> and run<L> are instantiated once per layout in a file of
// their own (train_data.cpp, train_model_parallel.cpp, train_dp_mp.cpp; MESHTENSOR_LAYOUT_UNITY
// compiles the three as one TU), and once for the example and its checks
// (tests/examples/translation_checks.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fmt/core.h>
#include <fstream>
#include <tuple>
#include <limits>
#include <memory>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "corpus.hpp"

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace translation {

struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};  // the source's positions in the encoder, the target's in the decoder
struct memory_length : mt::dim<"memory_length"> {};  // the keys' positions (self- and cross-attention)
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct beam_slot : mt::dim<"beam_slot"> {};  // beam search: a row's best tokens
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

// The layouts, as types. The paper's two (Table 3) name mesh axes m0 and m1; here m0 is the whole
// mesh for model_parallel (a 1-D mesh is [P x 1] or split over both axes: the same processors) and
// rows for dp_mp, m1 its cols.
//   data            batch over rows and cols
//   model_parallel  "vocab:m0, heads:m0, d_ff:m0"
//   dp_mp           "batch:m0, vocab:m1, heads:m1, d_ff:m1"
using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using layout_model_parallel = mt::layout<grid, mt::split<vocab, rows, cols>, mt::split<heads, rows, cols>,
                                         mt::split<d_ff, rows, cols>>;
using layout_dp_mp = mt::layout<grid, mt::split<batch, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                                mt::split<d_ff, cols>>;

struct options {
  std::string data_dir = "translation_data";  // the tokenizer and the token files (written when missing)
  std::string locale_dir = "/usr/share/locale";
  std::string layout = "dp_mp";
  std::vector<int> mesh{2, 2};
  std::int64_t vocab = 4000;                 // SentencePiece's vocabulary, shared by both languages
  std::int64_t steps = 300, batch = 32;
  std::int64_t src_length = 32, tgt_length = 32;
  std::int64_t d_model = 128, heads = 4, d_kv = 32, d_ff = 512, layers = 2;
  double lr = 1e-3, dropout = 0.1, label_smoothing = 0.0;
  std::uint64_t seed = 1;
  int log_every = 50;
  std::int64_t eval_every = 0;               // dev loss every N steps (0: at the end only)
  std::int64_t dev_sentences = 256;
  bool evaluate = true;                      // the dev loss at the end (false: bare steps, as a plan has)
  std::string csv = "translation_loss.csv";
  std::int64_t warmup = -1;
  // Decoding
  std::int64_t beam = 4;
  double alpha = 0.6;
  std::vector<std::string> translate;
  std::string hypotheses;                    // the test split's translations, one per line
  std::int64_t decode_limit = 0;             // 0: the whole test split
  std::string decode_mode = "beam";          // beam | greedy
  std::int64_t decode_batch = 64;            // sentences decoded together (beam rows: x beam)
  // Checkpoints: the parameters and Adam's state after training; --resume continues from them.
  std::string checkpoint, resume;
  // Planning
  bool plan = false;
  double memory_budget_gib = 8.0;
};

// Sinusoidal positions (Vaswani et al.): no parameters, so the model's parameter count is the
// paper's (Table 3's column counts embeddings and blocks only).
//   pe[p, 2i] = sin(p / 10000^(2i / d)), pe[p, 2i + 1] = cos(p / 10000^(2i / d))
inline std::vector<float> sinusoids(std::int64_t n, std::int64_t d) {
  std::vector<float> pe(static_cast<std::size_t>(n * d));
  for (std::int64_t p = 0; p < n; ++p)
    for (std::int64_t i = 0; i < d; ++i) {
      const double angle = p / std::pow(10000.0, double(i - i % 2) / double(d));
      pe[p * d + i] = static_cast<float>(i % 2 ? std::cos(angle) : std::sin(angle));
    }
  return pe;
}

// The parameter names in the order of model::tie(), a vector param's blocks one after another.
inline std::vector<std::string> param_names(std::int64_t layers) {
  std::vector<std::string> names{"src_embedding", "tgt_embedding"};
  const auto per_block = [&](const char* prefix, std::initializer_list<const char*> kinds) {
    for (const char* k : kinds)
      for (std::int64_t b = 0; b < layers; ++b) names.push_back(fmt::format("{}{}.{}", prefix, b, k));
  };
  per_block("encoder.", {"ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias", "w_in", "w_out"});
  names.insert(names.end(), {"encoder.ln_scale", "encoder.ln_bias"});
  per_block("decoder.", {"ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias", "cq", "ck", "cv",
                         "co", "ln3_scale", "ln3_bias", "w_in", "w_out"});
  names.insert(names.end(), {"decoder.ln_scale", "decoder.ln_bias"});
  return names;
}

template <class Params, class F>
void for_each_param_tensor(Params&& params, F&& f) {
  std::size_t i = 0;
  std::apply([&](auto&... p) { (mt::for_each_tensor(p, [&](auto& t) { f(i++, t); }), ...); }, params);
}

// A sentence pair as token ids (no bos or eos).
struct token_pair {
  std::vector<int> src, tgt;
};

// A batch of sentence pairs as the model takes them: ids padded with tokenizer::pad.
//   source  ids(en)[:S-1] + eos
//   input   bos + ids(fr)[:T-1]          (the decoder's input, teacher forcing)
//   labels  ids(fr)[:T-1] + eos          (weights: 1 at a label, 0 at padding)
struct host_batch {
  std::int64_t n = 0;
  std::vector<float> source, input, labels, weights;
  double tokens = 0;  // labels that count
};
inline host_batch make_batch(const std::vector<const token_pair*>& pairs, std::int64_t S, std::int64_t T) {
  host_batch b;
  b.n = static_cast<std::int64_t>(pairs.size());
  b.source.assign(static_cast<std::size_t>(b.n * S), float(tokenizer::pad));
  b.input.assign(static_cast<std::size_t>(b.n * T), float(tokenizer::pad));
  b.labels = b.input;
  b.weights.assign(b.input.size(), 0.0f);
  for (std::int64_t r = 0; r < b.n; ++r) {
    const auto& p = *pairs[static_cast<std::size_t>(r)];
    const std::int64_t ns = std::min<std::int64_t>(static_cast<std::int64_t>(p.src.size()), S - 1);
    for (std::int64_t i = 0; i < ns; ++i) b.source[r * S + i] = float(p.src[i]);
    b.source[r * S + ns] = float(tokenizer::eos);
    const std::int64_t nt = std::min<std::int64_t>(static_cast<std::int64_t>(p.tgt.size()), T - 1);
    b.input[r * T] = float(tokenizer::bos);
    for (std::int64_t i = 0; i < nt; ++i) {
      b.input[r * T + i + 1] = float(p.tgt[i]);
      b.labels[r * T + i] = float(p.tgt[i]);
    }
    b.labels[r * T + nt] = float(tokenizer::eos);
    for (std::int64_t i = 0; i <= nt; ++i) b.weights[r * T + i] = 1.0f;
    b.tokens += double(nt + 1);
  }
  return b;
}

// What train<L> works on: the token pairs of each split, and the text of the test split's French.
struct dataset {
  std::vector<token_pair> train, dev, test;
  std::vector<std::string> test_en, test_fr;
};

// A batch of the run's shape for a planned step (its values do not matter to a plan).
inline host_batch make_planned_batch(const options& o) {
  token_pair filler{std::vector<int>(static_cast<std::size_t>(o.src_length), 4),
                    std::vector<int>(static_cast<std::size_t>(o.tgt_length), 4)};
  return make_batch(std::vector<const token_pair*>(static_cast<std::size_t>(o.batch), &filler), o.src_length, o.tgt_length);
}

// The corpus, the tokenizer (trained on rank 0 when --data-dir has none of --vocab's size; the
// token files for the PyTorch peer written beside it), and every split as token ids.
inline std::pair<dataset, std::unique_ptr<tokenizer>> prepare_data(const mt::environment& env, const options& o) {
  const bool root = env.world_rank() == 0;
  const corpus c = load_corpus(o.locale_dir);
  const std::string model_path = o.data_dir + "/tokenizer.model";
  if (root) {
    std::printf("%s", describe(c).c_str());
    bool fresh = !std::filesystem::exists(model_path);
    if (!fresh && tokenizer(model_path).vocab_size() != o.vocab) {
      std::printf("%s has another vocabulary size than --vocab %lld: training it again\n", model_path.c_str(),
                  (long long)o.vocab);
      fresh = true;
    }
    if (fresh) {
      std::filesystem::create_directories(o.data_dir);
      const auto t0 = std::chrono::steady_clock::now();
      train_tokenizer(c, static_cast<int>(o.vocab), o.data_dir + "/tokenizer");
      const tokenizer tok(model_path);
      write_token_files(c, tok, o.data_dir);
      std::printf("trained the tokenizer (SentencePiece, vocab %lld, the training split) and wrote the token files "
                  "to %s in %.1f s\n",
                  (long long)o.vocab, o.data_dir.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the other ranks read the tokenizer rank 0 wrote
  auto tok = std::make_unique<tokenizer>(model_path);
  dataset d;
  const auto encode = [&](const std::vector<sentence_pair>& pairs, std::vector<token_pair>& out) {
    for (const auto& p : pairs) out.push_back({tok->encode(p.en), tok->encode(p.fr)});
  };
  encode(c.train, d.train);
  encode(c.dev, d.dev);
  encode(c.test, d.test);
  for (const auto& p : c.test) d.test_en.push_back(p.en), d.test_fr.push_back(p.fr);
  return {std::move(d), std::move(tok)};
}

template <class L>
struct model {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  template <class... D>
  using per_block = std::vector<t<D...>>;
  using X = t<batch, length, d_model>;
  using M = t<batch, memory_length, d_model>;
  using ids_t = t<batch, length>;

  t<vocab, d_model> src_embedding, tgt_embedding;  // the target's is also the softmax's weights
  per_block<d_model> e_ln1_scale, e_ln1_bias;
  per_block<d_model, heads, d_kv> e_wq, e_wk, e_wv;
  per_block<heads, d_kv, d_model> e_wo;
  per_block<d_model> e_ln2_scale, e_ln2_bias;
  per_block<d_model, d_ff> e_w_in;
  per_block<d_ff, d_model> e_w_out;
  t<d_model> e_ln_scale, e_ln_bias;
  per_block<d_model> d_ln1_scale, d_ln1_bias;
  per_block<d_model, heads, d_kv> d_wq, d_wk, d_wv;
  per_block<heads, d_kv, d_model> d_wo;
  per_block<d_model> d_ln2_scale, d_ln2_bias;
  per_block<d_model, heads, d_kv> d_cq, d_ck, d_cv;
  per_block<heads, d_kv, d_model> d_co;
  per_block<d_model> d_ln3_scale, d_ln3_bias;
  per_block<d_model, d_ff> d_w_in;
  per_block<d_ff, d_model> d_w_out;
  t<d_model> d_ln_scale, d_ln_bias;
  // Not parameters: the positions' sinusoids of the source's and the target's lengths.
  t<length, d_model> src_positions, tgt_positions;
  double logit_scale = 1;  // d_model^-0.5: the softmax shares the target embedding (Mesh-TensorFlow's)

  auto tie() {
    return std::tie(src_embedding, tgt_embedding, e_ln1_scale, e_ln1_bias, e_wq, e_wk, e_wv, e_wo, e_ln2_scale,
                    e_ln2_bias, e_w_in, e_w_out, e_ln_scale, e_ln_bias, d_ln1_scale, d_ln1_bias, d_wq, d_wk, d_wv, d_wo,
                    d_ln2_scale, d_ln2_bias, d_cq, d_ck, d_cv, d_co, d_ln3_scale, d_ln3_bias, d_w_in, d_w_out,
                    d_ln_scale, d_ln_bias);
  }

  model(const grid& g, const options& o) {
    const std::int64_t dm = o.d_model, h = o.heads, kv = o.d_kv, ff = o.d_ff;
    {
      const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);
      std::uint64_t s = o.seed * 1000;
      src_embedding = mt::random_normal<decltype(src_embedding)>(g, {o.vocab, dm}, s++, 0, 1.0);
      tgt_embedding = mt::random_normal<decltype(tgt_embedding)>(g, {o.vocab, dm}, s++, 0, 1.0);
      const auto ln = [&](per_block<d_model>& scale, per_block<d_model>& bias) {
        scale.push_back(mt::full<t<d_model>>(g, {dm}, 1.0f));
        bias.push_back(mt::zeros<t<d_model>>(g, {dm}));
      };
      const auto projections = [&](per_block<d_model, heads, d_kv>& q, per_block<d_model, heads, d_kv>& k,
                                   per_block<d_model, heads, d_kv>& v, per_block<heads, d_kv, d_model>& out) {
        using W = t<d_model, heads, d_kv>;
        q.push_back(nn::normal_fan_in<W, d_model>(g, {dm, h, kv}, s++));
        k.push_back(nn::normal_fan_in<W, d_model>(g, {dm, h, kv}, s++));
        v.push_back(nn::normal_fan_in<W, d_model>(g, {dm, h, kv}, s++));
        out.push_back(nn::normal_fan_in<t<heads, d_kv, d_model>, heads, d_kv>(g, {h, kv, dm}, s++));
      };
      const auto feed_forward = [&](per_block<d_model, d_ff>& in, per_block<d_ff, d_model>& out) {
        in.push_back(nn::normal_fan_in<t<d_model, d_ff>, d_model>(g, {dm, ff}, s++));
        out.push_back(nn::normal_fan_in<t<d_ff, d_model>, d_ff>(g, {ff, dm}, s++));
      };
      for (std::int64_t b = 0; b < o.layers; ++b) {
        ln(e_ln1_scale, e_ln1_bias);
        projections(e_wq, e_wk, e_wv, e_wo);
        ln(e_ln2_scale, e_ln2_bias);
        feed_forward(e_w_in, e_w_out);
      }
      for (std::int64_t b = 0; b < o.layers; ++b) {
        ln(d_ln1_scale, d_ln1_bias);
        projections(d_wq, d_wk, d_wv, d_wo);
        ln(d_ln2_scale, d_ln2_bias);
        projections(d_cq, d_ck, d_cv, d_co);
        ln(d_ln3_scale, d_ln3_bias);
        feed_forward(d_w_in, d_w_out);
      }
      e_ln_scale = mt::full<t<d_model>>(g, {dm}, 1.0f);
      e_ln_bias = mt::zeros<t<d_model>>(g, {dm});
      d_ln_scale = mt::full<t<d_model>>(g, {dm}, 1.0f);
      d_ln_bias = mt::zeros<t<d_model>>(g, {dm});
    }
    src_positions = mt::from_host<t<length, d_model>>(g, {o.src_length, dm}, sinusoids(o.src_length, dm));
    tgt_positions = mt::from_host<t<length, d_model>>(g, {o.tgt_length, dm}, sinusoids(o.tgt_length, dm));
    logit_scale = 1.0 / std::sqrt(double(dm));
    for_each_param_tensor(tie(), [](std::size_t, auto& p) { p.requires_grad(); });
  }

  std::int64_t parameter_count() {
    std::int64_t n = 0;
    for_each_param_tensor(tie(), [&](std::size_t, const auto& p) { n += p.size(); });
    return n;
  }

  static t<length, d_model> positions_of(const t<length, d_model>& pe, std::int64_t n) {
    return n == pe.template extent<length>() ? pe : mt::slice<length>(pe, 0, n);
  }

  // The encoder's output [batch, memory_length, d_model] (normalised, renamed for the decoder's
  // cross-attention) and the padding bias [batch, memory_length] of the source.
  std::pair<M, t<batch, memory_length>> encode(const ids_t& source, const options& o, std::uint64_t step) const {
    const auto bias = nn::padding_bias<length, memory_length>(source, float(tokenizer::pad));
    X x = nn::embedding<vocab>(src_embedding, source) + positions_of(src_positions, source.template extent<length>());
    for (std::size_t b = 0; b < e_wq.size(); ++b)
      x = nn::encoder_block<length, memory_length, d_model, heads, d_kv, d_ff>(
          x, bias, nn::attention_sublayer{e_ln1_scale[b], e_ln1_bias[b], e_wq[b], e_wk[b], e_wv[b], e_wo[b]},
          nn::feed_forward_sublayer{e_ln2_scale[b], e_ln2_bias[b], e_w_in[b], e_w_out[b]},
          {o.dropout, o.seed * 7919 + 3 * b, step});
    return {mt::rename<length, memory_length>(nn::layer_norm<d_model>(x, e_ln_scale, e_ln_bias)), bias};
  }

  // Logits [batch, length, vocab] of the decoder's input under teacher forcing.
  t<batch, length, vocab> logits(const ids_t& source, const ids_t& input, const options& o, std::uint64_t step) const {
    const auto [memory, bias] = encode(source, o, step);
    X y = nn::embedding<vocab>(tgt_embedding, input) + positions_of(tgt_positions, input.template extent<length>());
    for (std::size_t b = 0; b < d_wq.size(); ++b)
      y = nn::decoder_block<length, memory_length, d_model, heads, d_kv, d_ff>(
          y, memory, bias, nn::attention_sublayer{d_ln1_scale[b], d_ln1_bias[b], d_wq[b], d_wk[b], d_wv[b], d_wo[b]},
          nn::attention_sublayer{d_ln2_scale[b], d_ln2_bias[b], d_cq[b], d_ck[b], d_cv[b], d_co[b]},
          nn::feed_forward_sublayer{d_ln3_scale[b], d_ln3_bias[b], d_w_in[b], d_w_out[b]},
          {o.dropout, o.seed * 7919 + 1000 + 3 * b, step});
    return output_logits(y);
  }

  t<batch, length, vocab> output_logits(const X& y) const {
    return mt::einsum<batch, length, vocab>(
        nn::layer_norm<d_model>(y, d_ln_scale, d_ln_bias) * static_cast<float>(logit_scale), tgt_embedding);
  }

  // Mean cross-entropy over the batch's labels (padding weighs 0).
  t<> loss(const ids_t& source, const ids_t& input, const ids_t& labels, const ids_t& weights, double tokens,
           const options& o, std::uint64_t step) const {
    const auto ce = nn::softmax_cross_entropy<vocab>(logits(source, input, o, step), labels, o.label_smoothing);
    return mt::reduce_sum<batch, length>(ce * weights) * static_cast<float>(1.0 / tokens);
  }

  // Decoding with a key-value cache: each decoder block's keys and values of the target positions
  // (self-attention), allocated once for all --tgt-length positions and written in place, and of
  // the source (cross-attention, computed once). Appending with concat copied the whole cache for
  // every position (half of beam search's time).
  struct kv_cache {
    std::vector<t<batch, heads, memory_length, d_kv>> k, v, memory_k, memory_v;
    t<batch, memory_length> bias;
  };
  kv_cache start_decoding(const ids_t& source, const options& o) const {
    kv_cache c;
    const auto [memory, bias] = encode(source, o, 0);
    c.bias = bias;
    for (std::size_t b = 0; b < d_wq.size(); ++b) {
      c.memory_k.push_back(mt::einsum<batch, heads, memory_length, d_kv>(memory, d_ck[b]));
      c.memory_v.push_back(mt::einsum<batch, heads, memory_length, d_kv>(memory, d_cv[b]));
      const std::array<std::int64_t, 4> e{source.template extent<batch>(), d_wk[b].template extent<heads>(), o.tgt_length,
                                          d_wk[b].template extent<d_kv>()};
      c.k.emplace_back(source.mesh(), e);
      c.v.emplace_back(source.mesh(), e);
    }
    return c;
  }
  // softmax_m(scale * (q.k + bias)) . v: attention's arithmetic on cached keys and values.
  template <class Q, class K, class B>
  static auto attend(const Q& q, const K& k, const K& v, const B* bias, double scale) {
    using Logits = t<batch, heads, length, memory_length>;
    Logits logits = mt::einsum<batch, heads, length, memory_length>(q, k);
    if (bias) logits = logits + *bias;
    return mt::einsum<batch, heads, length, d_kv>(mt::softmax<memory_length>(logits * static_cast<float>(scale)), v);
  }
  // Logits [batch, 1, vocab] after the tokens at position p (token: [batch, 1]); the cache gains p.
  // The arithmetic of logits() at position p (decoder_block's, without dropout), the positions
  // after p masked out of the self-attention (weight exactly 0): it reads the cache where it lies.
  t<batch, length, vocab> next_logits(const ids_t& token, std::int64_t p, kv_cache& c) const {
    X y = nn::embedding<vocab>(tgt_embedding, token) + mt::slice<length>(tgt_positions, p, 1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d_wq[0].template extent<d_kv>()));
    const std::int64_t capacity = c.k[0].template extent<memory_length>();
    std::vector<float> later(static_cast<std::size_t>(capacity), 0.0f);
    std::fill(later.begin() + p + 1, later.end(), -1e9f);
    const auto causal = mt::from_host<t<memory_length>>(token.mesh(), {capacity}, later);
    for (std::size_t b = 0; b < d_wq.size(); ++b) {
      const auto h = nn::layer_norm<d_model>(y, d_ln1_scale[b], d_ln1_bias[b]);
      const auto hm = mt::rename<length, memory_length>(h);
      mt::update_slice<memory_length>(c.k[b], mt::einsum<batch, heads, memory_length, d_kv>(hm, d_wk[b]), p);
      mt::update_slice<memory_length>(c.v[b], mt::einsum<batch, heads, memory_length, d_kv>(hm, d_wv[b]), p);
      const auto q = mt::einsum<batch, heads, length, d_kv>(h, d_wq[b]);
      const X a = y + mt::einsum<batch, length, d_model>(attend(q, c.k[b], c.v[b], &causal, scale), d_wo[b]);
      const auto hc = nn::layer_norm<d_model>(a, d_ln2_scale[b], d_ln2_bias[b]);
      const auto qc = mt::einsum<batch, heads, length, d_kv>(hc, d_cq[b]);
      const X cx = a + mt::einsum<batch, length, d_model>(attend(qc, c.memory_k[b], c.memory_v[b], &c.bias, scale), d_co[b]);
      y = cx + nn::feed_forward<d_model, d_ff>(nn::layer_norm<d_model>(cx, d_ln3_scale[b], d_ln3_bias[b]), d_w_in[b],
                                               d_w_out[b]);
    }
    return output_logits(y);
  }
  // Beam search keeps its hypotheses in the batch dim: after a step row r continues row rows[r] of
  // the step before, so the self-attention cache's rows follow (mt::take: on each processor, with
  // nothing communicated while every processor's rows come from rows it holds: the beams of a
  // sentence are consecutive rows). Rows of finished sentences are dropped the same way; their
  // source's keys and values too when `memory` is set (within a sentence, rows hold one source).
  static void reorder_rows(kv_cache& c, const std::vector<std::int64_t>& rows, bool memory) {
    for (auto* list : {&c.k, &c.v})
      for (auto& t : *list) t = mt::take<batch>(t, rows);
    if (!memory) return;
    for (auto* list : {&c.memory_k, &c.memory_v})
      for (auto& t : *list) t = mt::take<batch>(t, rows);
    c.bias = mt::take<batch>(c.bias, rows);
  }
};

// ---- decoding ---------------------------------------------------------------------------------
// GNMT's length penalty, Mesh-TensorFlow's default: a hypothesis of n tokens (its eos counted)
// scores (sum of its log-probabilities) / ((5 + n) / 6)^alpha.
inline double length_penalty(std::int64_t n, double alpha) { return std::pow((5.0 + double(n)) / 6.0, alpha); }

// The sources of a chunk of sentences, each repeated `copies` times (a beam's rows), as ids.
inline std::vector<float> source_rows(const std::vector<std::vector<int>>& sources, std::int64_t copies, std::int64_t S) {
  std::vector<float> ids(sources.size() * static_cast<std::size_t>(copies * S), float(tokenizer::pad));
  for (std::size_t s = 0; s < sources.size(); ++s)
    for (std::int64_t c = 0; c < copies; ++c) {
      float* row = ids.data() + (s * copies + c) * S;
      const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(sources[s].size()), S - 1);
      for (std::int64_t i = 0; i < n; ++i) row[i] = float(sources[s][i]);
      row[n] = float(tokenizer::eos);
    }
  return ids;
}

// Greedy decoding of a chunk of sentences: the most likely token at each position, until eos (not
// included in the result) or the target length.
template <class L>
std::vector<std::vector<int>> greedy_decode(const model<L>& m, const grid& g, const std::vector<std::vector<int>>& sources,
                                            const options& o) {
  using ids_t = typename model<L>::ids_t;
  const mt::no_grad inference;
  const auto n = static_cast<std::int64_t>(sources.size());
  auto cache = m.start_decoding(mt::from_host<ids_t>(g, {n, o.src_length}, source_rows(sources, 1, o.src_length)), o);
  std::vector<std::vector<int>> out(sources.size());
  std::vector<char> done(sources.size(), 0);
  std::vector<float> token(static_cast<std::size_t>(n), float(tokenizer::bos));
  for (std::int64_t p = 0; p < o.tgt_length; ++p) {
    const auto logits = mt::gather_all(m.next_logits(mt::from_host<ids_t>(g, {n, 1}, token), p, cache));
    std::int64_t left = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const float* row = logits.data() + r * o.vocab;
      const int next = static_cast<int>(std::max_element(row, row + o.vocab) - row);
      token[r] = float(next);
      if (done[r]) continue;
      if (next == tokenizer::eos) done[r] = 1;
      else out[r].push_back(next), ++left;
    }
    if (left == 0) break;
  }
  return out;
}

// Beam search (beam k, length penalty alpha) of a chunk of sentences, k rows per sentence. At each
// position a sentence's k best continuations of its live hypotheses (by total log-probability)
// are kept; a continuation that is eos ends its hypothesis, scored with the length penalty. A
// sentence stops when no hypothesis is live or its best finished score beats what any live one
// could still reach (its total so far over the largest penalty); the result is the best finished
// hypothesis (or the best live one at the target length). With k = 1 this is greedy decoding.
// The log-probabilities and each row's k best tokens are computed where the logits live (float64,
// as the host loop did); only [rows, k] values and tokens come to the host, where the sentence's
// k best among its live rows' k x k are chosen (they contain the k best of all k x vocab: a
// continuation outside its row's k best has k of its row's ahead of it). Finished sentences' rows
// are dropped from the batch, cache included. The batch holds whole sentences per processor where
// batch is split (a multiple of its parts, padded with idle slots), so that the reorder moves no
// row between processors; only dropping rows does.
template <class L>
std::vector<std::vector<int>> beam_decode(const model<L>& m, const grid& g, const std::vector<std::vector<int>>& sources,
                                          const options& o) {
  using ids_t = typename model<L>::ids_t;
  const mt::no_grad inference;
  const std::int64_t k = o.beam, n = static_cast<std::int64_t>(sources.size());
  const std::int64_t parts = mt::tensor<float, L, batch>(g, {1}).placement().parts(0);
  const auto whole_parts = [&](std::int64_t sentences) { return (sentences + parts - 1) / parts * parts; };
  // slot[a]: the sentence in rows a * k .. a * k + k - 1 (hypothesis j in row a * k + j), or -1 for
  // an idle slot; only the first row of each sentence is live at the start.
  std::vector<std::int64_t> slot(static_cast<std::size_t>(whole_parts(n)), -1);
  std::iota(slot.begin(), slot.begin() + n, std::int64_t{0});
  std::vector<std::vector<int>> padded(sources);
  padded.resize(slot.size());
  const auto slots = static_cast<std::int64_t>(slot.size());
  auto cache = m.start_decoding(mt::from_host<ids_t>(g, {slots * k, o.src_length}, source_rows(padded, k, o.src_length)), o);
  const double ninf = -std::numeric_limits<double>::infinity();
  struct hypothesis {
    std::vector<int> tokens;
    double total = 0;  // sum of log-probabilities
    bool live = false;
  };
  std::vector<hypothesis> hyp(static_cast<std::size_t>(slots * k));
  for (std::int64_t s = 0; s < n; ++s) hyp[s * k].live = true;
  std::vector<std::vector<int>> best(sources.size());
  std::vector<double> best_score(sources.size(), ninf);
  std::vector<float> token(static_cast<std::size_t>(slots * k), float(tokenizer::bos));
  const double largest_penalty = length_penalty(o.tgt_length, o.alpha);
  for (std::int64_t p = 0; p < o.tgt_length; ++p) {
    const auto rows = static_cast<std::int64_t>(slot.size()) * k;
    const auto logits = m.next_logits(mt::from_host<ids_t>(g, {rows, 1}, token), p, cache);
    const auto top = mt::top_k<vocab, beam_slot>(mt::log_softmax<vocab>(mt::cast<double>(logits)), k);
    const auto lp = mt::gather_all(top.values);  // [rows, 1, k]
    const auto tokens = mt::gather_all(top.indices);
    std::vector<hypothesis> next(static_cast<std::size_t>(rows));
    std::vector<std::int64_t> parents(static_cast<std::size_t>(rows));
    std::iota(parents.begin(), parents.end(), std::int64_t{0});  // a dead row keeps its own (anything valid)
    std::vector<float> next_token(static_cast<std::size_t>(rows), float(tokenizer::pad));
    std::int64_t live_sentences = 0;
    for (std::size_t a = 0; a < slot.size(); ++a) {
      const std::int64_t s = slot[a], first = static_cast<std::int64_t>(a) * k;
      if (s < 0) continue;
      // (total, row, token) of the k best continuations of each live hypothesis; the k best.
      std::vector<std::tuple<double, std::int64_t, int>> cand;
      for (std::int64_t r = first; r < first + k; ++r) {
        if (!hyp[r].live) continue;
        for (std::int64_t j = 0; j < k; ++j)
          cand.emplace_back(hyp[r].total + lp[r * k + j], r, static_cast<int>(tokens[r * k + j]));
      }
      const auto kept = std::min<std::size_t>(static_cast<std::size_t>(k), cand.size());
      // Ties go to the lower row, then the lower token: what greedy's max_element picks.
      std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(kept), cand.end(), [](const auto& x, const auto& y) {
        if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x) > std::get<0>(y);
        if (std::get<1>(x) != std::get<1>(y)) return std::get<1>(x) < std::get<1>(y);
        return std::get<2>(x) < std::get<2>(y);
      });
      std::int64_t filled = 0;
      double best_live = ninf;
      for (std::size_t c = 0; c < kept; ++c) {
        const auto [total, r, v] = cand[c];
        if (v == tokenizer::eos || p + 1 == o.tgt_length) {
          std::vector<int> done_tokens = hyp[r].tokens;
          if (v != tokenizer::eos) done_tokens.push_back(v);
          const double score = total / length_penalty(static_cast<std::int64_t>(hyp[r].tokens.size()) + 1, o.alpha);
          if (score > best_score[s]) best_score[s] = score, best[s] = std::move(done_tokens);
          continue;
        }
        auto& h = next[first + filled];
        h.tokens = hyp[r].tokens;
        h.tokens.push_back(v);
        h.total = total;
        h.live = true;
        parents[first + filled] = r;
        next_token[first + filled] = float(v);
        best_live = std::max(best_live, total);
        ++filled;
      }
      if (filled == 0 || best_score[s] >= best_live / largest_penalty) {
        slot[a] = -1;  // done: its rows idle
        for (std::int64_t j = 0; j < k; ++j) next[first + j].live = false, parents[first + j] = first + j;
      } else {
        ++live_sentences;
      }
    }
    if (live_sentences == 0) break;
    hyp = std::move(next);
    token = std::move(next_token);
    // Fewer parts' worth of sentences: the live ones (and idle slots up to whole parts) move up.
    const bool shrinks = whole_parts(live_sentences) < static_cast<std::int64_t>(slot.size());
    if (shrinks) {
      std::vector<std::int64_t> kept_slots, rows_kept;
      for (std::size_t a = 0; a < slot.size(); ++a)
        if (slot[a] >= 0) kept_slots.push_back(static_cast<std::int64_t>(a));
      for (std::size_t a = 0; kept_slots.size() < static_cast<std::size_t>(whole_parts(live_sentences)); ++a)
        if (slot[a] < 0) kept_slots.push_back(static_cast<std::int64_t>(a));
      std::sort(kept_slots.begin(), kept_slots.end());
      std::vector<std::int64_t> moved_slot;
      std::vector<hypothesis> moved_hyp;
      std::vector<float> moved_token;
      for (const std::int64_t a : kept_slots) {
        moved_slot.push_back(slot[a]);
        for (std::int64_t j = 0; j < k; ++j) {
          rows_kept.push_back(parents[a * k + j]);
          moved_hyp.push_back(std::move(hyp[a * k + j]));
          moved_token.push_back(token[a * k + j]);
        }
      }
      slot = std::move(moved_slot);
      hyp = std::move(moved_hyp);
      token = std::move(moved_token);
      parents = std::move(rows_kept);
    }
    model<L>::reorder_rows(cache, parents, shrinks);
  }
  return best;
}

// Decodes sentences --decode-batch at a time (each a row, or --beam rows), with beam search or greedily.
template <class L>
std::vector<std::vector<int>> decode(const model<L>& m, const grid& g, const std::vector<std::vector<int>>& sources,
                                     const options& o, bool greedy) {
  const auto chunk = static_cast<std::size_t>(o.decode_batch);
  std::vector<std::vector<int>> out;
  for (std::size_t first = 0; first < sources.size(); first += chunk) {
    const std::vector<std::vector<int>> part(sources.begin() + static_cast<std::ptrdiff_t>(first),
                                             sources.begin() + static_cast<std::ptrdiff_t>(std::min(sources.size(), first + chunk)));
    auto got = greedy ? greedy_decode(m, g, part, o) : beam_decode(m, g, part, o);
    for (auto& s : got) out.push_back(std::move(s));
  }
  return out;
}

// What the options ask of a trained model: --translate, --hypotheses (the test split).
template <class L>
void decode_requests(const model<L>& m, const grid& g, const options& o, const dataset& data, const tokenizer& tok,
                     bool verbose) {
  const bool root = g.rank() == 0;
  if (!o.translate.empty()) {
    std::vector<std::vector<int>> sources;
    for (const auto& text : o.translate) sources.push_back(tok.encode(text));
    const auto out = decode(m, g, sources, o, o.decode_mode == "greedy");
    if (root)
      for (std::size_t i = 0; i < out.size(); ++i)
        std::printf("%s\n  -> %s\n", o.translate[i].c_str(), tok.decode(out[i]).c_str());
  }
  if (!o.hypotheses.empty()) {
    const std::size_t n = o.decode_limit > 0 ? std::min(data.test.size(), static_cast<std::size_t>(o.decode_limit))
                                              : data.test.size();
    std::vector<std::vector<int>> sources;
    for (std::size_t i = 0; i < n; ++i) sources.push_back(data.test[i].src);
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = decode(m, g, sources, o, o.decode_mode == "greedy");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (root) {
      std::ofstream hyp(o.hypotheses), ref(o.hypotheses + ".ref"), src(o.hypotheses + ".src");
      for (std::size_t i = 0; i < n; ++i) {
        hyp << tok.decode(out[i]) << '\n';
        ref << data.test_fr[i] << '\n';
        src << data.test_en[i] << '\n';
      }
      if (!hyp || !ref || !src) throw mt::io_error(fmt::format("cannot write '{}' (or its .ref, .src)", o.hypotheses));
      if (verbose)
        std::printf("decoded %zu test sentences (%s%s) in %.1f s: %s (references %s.ref, sources %s.src)\n", n,
                    o.decode_mode.c_str(), o.decode_mode == "beam" ? fmt::format(" {}, alpha {:g}", o.beam, o.alpha).c_str() : "",
                    seconds, o.hypotheses.c_str(), o.hypotheses.c_str(), o.hypotheses.c_str());
    }
  }
}

// ---- training ---------------------------------------------------------------------------------
struct train_result {
  std::vector<double> losses;                // every step's (the same on every rank)
  std::vector<std::pair<std::int64_t, double>> dev_losses;  // (step, mean dev loss)
  std::int64_t parameters = 0;
  std::int64_t param_bytes = 0, state_bytes = 0;
  double median_step_ms = 0;
  std::optional<mt::plan_report> plan;
};

// The Adam settings of every run (the peer uses the same).
inline mt::optim::adam make_adam(const options& o) { return mt::optim::adam({.lr = o.lr, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9}); }

inline mt::io::metadata run_config(const options& o) {
  return {{"d_model", std::to_string(o.d_model)},       {"heads", std::to_string(o.heads)},
          {"d_kv", std::to_string(o.d_kv)},             {"d_ff", std::to_string(o.d_ff)},
          {"vocab", std::to_string(o.vocab)},           {"layers", std::to_string(o.layers)},
          {"src_length", std::to_string(o.src_length)}, {"tgt_length", std::to_string(o.tgt_length)},
          {"batch", std::to_string(o.batch)},           {"seed", std::to_string(o.seed)}};
}

// Trains m for o.steps steps (from --resume's checkpoint when given) and saves --checkpoint. On a
// planned mesh the same code runs without data and returns the plan of its last step.
template <class L>
train_result train(model<L>& m, const grid& g, const options& o, const dataset& data, bool verbose) {
  using ids_t = typename model<L>::ids_t;
  train_result result;
  auto adam = make_adam(o);
  const bool root = g.rank() == 0;
  std::int64_t step0 = 0;
  const auto state_of = [&] {
    mt::io::tensor_set set;
    auto params = m.tie();
    const auto names = param_names(o.layers);
    for_each_param_tensor(params, [&](std::size_t i, auto& p) { set.add(names[i], p); });
    mt::io::add_optimizer_state(set, adam, params, names);
    return set;
  };
  if (!o.resume.empty()) {
    auto state = state_of();
    const auto meta = mt::io::checkpoints(o.resume).load(state);
    for (const auto& [key, value] : run_config(o))
      if (!meta.count(key) || meta.at(key) != value)
        throw mt::io_error(fmt::format("--resume {}: the checkpoint has {} = {}, this run {}", o.resume, key,
                                       meta.count(key) ? meta.at(key) : "(none)", value));
    step0 = std::stoll(meta.at("step"));
    adam.set_steps(std::stoll(meta.at("optimizer.steps")));
    if (verbose && root) std::printf("resumed from %s at step %lld\n", o.resume.c_str(), (long long)step0);
  }
  // The batch order: epoch e visits the training pairs in permutation(n, seed * 1000003 + e)
  // (corpus.hpp; benchmarks/peers/torch_translation.py draws the same).
  const auto n_train = static_cast<std::int64_t>(data.train.size());
  std::vector<std::int64_t> order;
  std::int64_t epoch = -1;
  const auto pairs_of_step = [&](std::int64_t step) {
    std::vector<const token_pair*> pairs;
    for (std::int64_t i = step * o.batch; i < (step + 1) * o.batch; ++i) {
      if (i / n_train != epoch) epoch = i / n_train, order = permutation(n_train, o.seed * 1000003 + std::uint64_t(epoch));
      pairs.push_back(&data.train[static_cast<std::size_t>(order[static_cast<std::size_t>(i % n_train)])]);
    }
    return pairs;
  };
  const auto upload = [&](const host_batch& b) {
    return std::array{mt::from_host<ids_t>(g, {b.n, o.src_length}, b.source),
                      mt::from_host<ids_t>(g, {b.n, o.tgt_length}, b.input),
                      mt::from_host<ids_t>(g, {b.n, o.tgt_length}, b.labels),
                      mt::from_host<ids_t>(g, {b.n, o.tgt_length}, b.weights)};
  };
  const auto dev_loss = [&] {
    const mt::no_grad eval;
    options od = o;
    od.dropout = 0;
    double sum = 0, tokens = 0;
    const auto n = std::min<std::size_t>(data.dev.size(), static_cast<std::size_t>(o.dev_sentences));
    for (std::size_t first = 0; first < n; first += static_cast<std::size_t>(o.batch)) {
      std::vector<const token_pair*> pairs;
      for (std::size_t i = first; i < std::min(n, first + static_cast<std::size_t>(o.batch)); ++i) pairs.push_back(&data.dev[i]);
      const auto b = make_batch(pairs, o.src_length, o.tgt_length);
      const auto [s, in, lab, w] = upload(b);
      sum += mt::item(m.loss(s, in, lab, w, b.tokens, od, 0)) * b.tokens;
      tokens += b.tokens;
    }
    return tokens > 0 ? sum / tokens : 0.0;
  };
  std::vector<double> step_ms;
  const auto t0 = std::chrono::steady_clock::now();
  auto tlog = t0;
  for (std::int64_t step = step0; step < o.steps; ++step) {
    if (g.is_planned()) mt::reset_plan(g);  // a plan reports its last step
    const auto ts = std::chrono::steady_clock::now();
    const auto b = g.is_planned() ? host_batch{} : make_batch(pairs_of_step(step), o.src_length, o.tgt_length);
    const auto [s, in, lab, w] = g.is_planned() ? upload(make_planned_batch(o)) : upload(b);
    const auto loss = m.loss(s, in, lab, w, g.is_planned() ? 1.0 : b.tokens, o, static_cast<std::uint64_t>(step));
    auto params = m.tie();
    auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
    adam.step(params, grads);
    result.losses.push_back(mt::item(loss));
    step_ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count());
    const bool log_now = verbose && ((step + 1) % o.log_every == 0 || step + 1 == o.steps);
    const bool eval_now = !g.is_planned() && o.evaluate && ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == o.steps);
    if (eval_now) result.dev_losses.emplace_back(step + 1, dev_loss());
    if (log_now && root) {
      const auto now = std::chrono::steady_clock::now();
      std::printf("step %5lld/%lld  loss %.4f%s  %.1f ms/step\n", (long long)(step + 1), (long long)o.steps,
                  result.losses.back(),
                  eval_now ? fmt::format("  dev loss {:g}", std::round(result.dev_losses.back().second * 1e4) / 1e4).c_str() : "",
                  1e3 * std::chrono::duration<double>(now - tlog).count() /
                      double(std::min<std::int64_t>(o.log_every, step + 1 - step0)));
      std::fflush(stdout);
      tlog = now;
    }
  }
  if (o.warmup >= 0 && o.warmup < static_cast<std::int64_t>(step_ms.size())) {
    std::vector<double> timed(step_ms.begin() + o.warmup, step_ms.end());
    std::sort(timed.begin(), timed.end());
    result.median_step_ms = timed.size() % 2 ? timed[timed.size() / 2]
                                             : 0.5 * (timed[timed.size() / 2 - 1] + timed[timed.size() / 2]);
    if (root) std::printf("step_time_median_ms %.3f over %zu steps after %lld warm-up steps\n", result.median_step_ms,
                          timed.size(), (long long)o.warmup);
  }
  result.parameters = m.parameter_count();
  result.param_bytes = mt::local_bytes(m.tie());
  result.state_bytes = adam.state_bytes(m.tie());
  if (g.is_planned()) {
    result.plan = mt::plan_report_of(g);
    return result;
  }
  if (!o.checkpoint.empty()) {
    auto state = state_of();
    auto meta = run_config(o);
    meta["step"] = std::to_string(o.steps);
    meta["optimizer.steps"] = std::to_string(adam.steps());
    meta["layout"] = o.layout;
    const auto name = mt::io::checkpoints(o.checkpoint).save(state, o.steps, meta);
    if (verbose && root) std::printf("saved checkpoint %s/%s\n", o.checkpoint.c_str(), name.c_str());
  }
  return result;
}

// A model of layout L trained, then asked what the options ask (tok: null to train only).
template <class L>
train_result run(const grid& g, const options& o, const dataset& data, const tokenizer* tok, bool verbose) {
  model<L> m(g, o);
  auto result = train(m, g, o, data, verbose);
  if (tok && !g.is_planned()) decode_requests(m, g, o, data, *tok, verbose);
  return result;
}

// Compiled in train_<layout>.cpp.
extern template train_result train<layout_data>(model<layout_data>&, const grid&, const options&, const dataset&, bool);
extern template train_result train<layout_model_parallel>(model<layout_model_parallel>&, const grid&, const options&,
                                                          const dataset&, bool);
extern template train_result train<layout_dp_mp>(model<layout_dp_mp>&, const grid&, const options&, const dataset&,
                                                 bool);
extern template train_result run<layout_data>(const grid&, const options&, const dataset&, const tokenizer*, bool);
extern template train_result run<layout_model_parallel>(const grid&, const options&, const dataset&, const tokenizer*,
                                                        bool);
extern template train_result run<layout_dp_mp>(const grid&, const options&, const dataset&, const tokenizer*, bool);

// The layout named by --layout.
inline train_result run_layout(const std::string& layout, const grid& g, const options& o, const dataset& data,
                               const tokenizer* tok, bool verbose) {
  if (layout == "data") return run<layout_data>(g, o, data, tok, verbose);
  if (layout == "model_parallel") return run<layout_model_parallel>(g, o, data, tok, verbose);
  return run<layout_dp_mp>(g, o, data, tok, verbose);
}

// Two steps of --layout planned on a mesh of --mesh sizes (no processes, no data); the plan is the second's.
inline train_result plan_layout(options o, const std::string& layout) {
  o.steps = 2;
  o.layout = layout;
  o.resume.clear(), o.checkpoint.clear();
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
  return run_layout(layout, pm, o, dataset{}, nullptr, false);
}

}  // namespace translation
