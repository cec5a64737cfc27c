// The encoder-decoder layers (nn/attention.hpp's attention and self_attention with a padding bias,
// nn/transformer.hpp's blocks): values equal a host loop and are the same under every layout
// (batch split, heads and d_ff split, both, uneven extents), padded keys weigh nothing, the
// decoder is causal, and gradients equal central finite differences (float64).
#include <meshtensor/nn/transformer.hpp>
#include <test_support.hpp>

#include "transformer_dims.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
using L_replicated = mt::layout<grid>;
using L_data = mt::layout<grid, mt::split<batch, r_, c_>>;
using L_model = mt::layout<grid, mt::split<heads, r_, c_>, mt::split<d_ff, r_, c_>>;
using L_2d = mt::layout<grid, mt::split<batch, r_>, mt::split<heads, c_>, mt::split<d_ff, c_>>;
using all_layouts = list<L_replicated, L_data, L_model, L_2d>;

// The source ids of 3 sequences of 5 positions, 0 the padding: lengths 5, 3 and 1.
const std::vector<double> source_ids{4, 7, 1, 9, 2, 5, 3, 8, 0, 0, 6, 0, 0, 0, 0};
constexpr std::int64_t B = 3, S = 5, T = 4, D = 6, H = 3, K = 2, F = 5;

// softmax_m(scale * (sum_k q k + bias)) v, projected: the definition, on the host.
std::vector<double> host_attention(const std::vector<double>& x, const std::vector<double>& mem,
                                   const std::vector<double>& wq, const std::vector<double>& wk,
                                   const std::vector<double>& wv, const std::vector<double>& wo,
                                   const std::vector<double>& bias, std::int64_t L, std::int64_t M) {
  const double scale = 1.0 / std::sqrt(double(K));
  std::vector<double> y(static_cast<std::size_t>(B * L * D), 0.0);
  // in[b, p, :] w[:, h, k], in holding `positions` positions per sequence.
  auto proj = [&](const std::vector<double>& in, std::int64_t positions, const std::vector<double>& w, std::int64_t b,
                  std::int64_t p, std::int64_t h, std::int64_t k) {
    double s = 0;
    for (std::int64_t d = 0; d < D; ++d) s += in[(b * positions + p) * D + d] * w[(d * H + h) * K + k];
    return s;
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t l = 0; l < L; ++l) {
        std::vector<double> logit(static_cast<std::size_t>(M));
        double top = -INFINITY;
        for (std::int64_t m = 0; m < M; ++m) {
          double s = 0;
          for (std::int64_t k = 0; k < K; ++k) s += proj(x, L, wq, b, l, h, k) * proj(mem, M, wk, b, m, h, k);
          logit[m] = scale * (s + bias[b * M + m]);
          top = std::max(top, logit[m]);
        }
        double z = 0;
        for (auto& v : logit) z += (v = std::exp(v - top));
        for (std::int64_t k = 0; k < K; ++k) {
          double o = 0;
          for (std::int64_t m = 0; m < M; ++m) o += logit[m] / z * proj(mem, M, wv, b, m, h, k);
          for (std::int64_t d = 0; d < D; ++d) y[(b * L + l) * D + d] += o * wo[(h * K + k) * D + d];
        }
      }
  return y;
}

// One block's weights under layout L (seeds fixed: the same values under every layout).
template <class L>
struct block_weights {
  using S = mt::tensor<double, L, d_model>;
  using W = mt::tensor<double, L, d_model, heads, d_kv>;
  using WO = mt::tensor<double, L, heads, d_kv, d_model>;
  using WI = mt::tensor<double, L, d_model, d_ff>;
  using WF = mt::tensor<double, L, d_ff, d_model>;
  S s1, b1, s2, b2, s3, b3;
  W wq, wk, wv, cq, ck, cv;
  WO wo, co;
  WI w_in;
  WF w_out;
  explicit block_weights(const grid& g) {
    s1 = mt::random_uniform<S>(g, {D}, 101, 0.5, 1.5), b1 = mt::random_normal<S>(g, {D}, 102, 0, 0.1);
    s2 = mt::random_uniform<S>(g, {D}, 103, 0.5, 1.5), b2 = mt::random_normal<S>(g, {D}, 104, 0, 0.1);
    s3 = mt::random_uniform<S>(g, {D}, 105, 0.5, 1.5), b3 = mt::random_normal<S>(g, {D}, 106, 0, 0.1);
    wq = mt::random_normal<W>(g, {D, H, K}, 111, 0, 0.5), wk = mt::random_normal<W>(g, {D, H, K}, 112, 0, 0.5);
    wv = mt::random_normal<W>(g, {D, H, K}, 113, 0, 0.5), wo = mt::random_normal<WO>(g, {H, K, D}, 114, 0, 0.5);
    cq = mt::random_normal<W>(g, {D, H, K}, 121, 0, 0.5), ck = mt::random_normal<W>(g, {D, H, K}, 122, 0, 0.5);
    cv = mt::random_normal<W>(g, {D, H, K}, 123, 0, 0.5), co = mt::random_normal<WO>(g, {H, K, D}, 124, 0, 0.5);
    w_in = mt::random_normal<WI>(g, {D, F}, 131, 0, 0.4), w_out = mt::random_normal<WF>(g, {F, D}, 132, 0, 0.4);
  }
  auto self() const { return nn::attention_sublayer{s1, b1, wq, wk, wv, wo}; }
  auto cross() const { return nn::attention_sublayer{s2, b2, cq, ck, cv, co}; }
  auto ff() const { return nn::feed_forward_sublayer{s3, b3, w_in, w_out}; }
};
}  // namespace

TEST_CASE("attention with a padding bias equals a host loop under every layout; padded keys weigh nothing",
          "[nn][equivalence]") {
  const auto g = world_grid();
  for_each_type(all_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using M = mt::tensor<double, L, batch, mlen, d_model>;
    using Ids = mt::tensor<double, L, batch, length>;
    const block_weights<L> w(g);
    const auto ids = mt::from_host<Ids>(g, {B, S}, source_ids);
    const auto bias = nn::padding_bias<length, mlen>(ids, 0.0);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(bias)>, mt::tensor<double, L, batch, mlen>>);
    const auto host_bias = mt::gather_all(bias);
    for (std::size_t n = 0; n < source_ids.size(); ++n) REQUIRE(host_bias[n] == (source_ids[n] == 0 ? -1e9 : 0.0));

    // Cross-attention: T queries over S keys.
    const auto x = mt::random_normal<X>(g, {B, T, D}, 141);
    const auto mem = mt::random_normal<M>(g, {B, S, D}, 142);
    const auto y = mt::gather_all(nn::attention<length, mlen, d_model, heads, d_kv>(x, mem, w.wq, w.wk, w.wv, w.wo, bias));
    const auto host = host_attention(mt::gather_all(x), mt::gather_all(mem), mt::gather_all(w.wq), mt::gather_all(w.wk),
                                     mt::gather_all(w.wv), mt::gather_all(w.wo), host_bias, T, S);
    REQUIRE(max_rel_error(y, host) < 1e-12);
    // Without a bias every key counts: the host loop with a zero bias.
    const auto y_all = mt::gather_all(nn::attention<length, mlen, d_model, heads, d_kv>(x, mem, w.wq, w.wk, w.wv, w.wo));
    const auto host_all = host_attention(mt::gather_all(x), mt::gather_all(mem), mt::gather_all(w.wq), mt::gather_all(w.wk),
                                         mt::gather_all(w.wv), mt::gather_all(w.wo), std::vector<double>(B * S, 0.0), T, S);
    REQUIRE(max_rel_error(y_all, host_all) < 1e-12);
    REQUIRE(max_rel_error(y_all, host) > 1e-3);

    // Changing the memory at padded positions changes nothing; at a real one, that sequence's outputs.
    auto changed = mt::gather_all(mem);
    for (std::int64_t d = 0; d < D; ++d) changed[(1 * S + 4) * D + d] += 3.0, changed[(2 * S + 2) * D + d] -= 2.0;
    const auto y_pad = mt::gather_all(nn::attention<length, mlen, d_model, heads, d_kv>(
        x, mt::from_host<M>(g, {B, S, D}, changed), w.wq, w.wk, w.wv, w.wo, bias));
    REQUIRE(y_pad == y);
    for (std::int64_t d = 0; d < D; ++d) changed[(2 * S + 0) * D + d] += 1.0;
    const auto y_real = mt::gather_all(nn::attention<length, mlen, d_model, heads, d_kv>(
        x, mt::from_host<M>(g, {B, S, D}, changed), w.wq, w.wk, w.wv, w.wo, bias));
    for (std::int64_t n = 0; n < B * T * D; ++n) {
      INFO("element " << n);
      if (n < 2 * T * D) REQUIRE(y_real[n] == y[n]);
      else REQUIRE(y_real[n] != y[n]);
    }

    // Self-attention is attention over x renamed.
    const auto xs = mt::random_normal<X>(g, {B, S, D}, 143);
    const auto ys = mt::gather_all(nn::self_attention<length, mlen, d_model, heads, d_kv>(xs, w.wq, w.wk, w.wv, w.wo, bias));
    const auto hs = mt::gather_all(xs);
    REQUIRE(max_rel_error(ys, host_attention(hs, hs, mt::gather_all(w.wq), mt::gather_all(w.wk), mt::gather_all(w.wv),
                                             mt::gather_all(w.wo), host_bias, S, S)) < 1e-12);
  });
}

TEST_CASE("attention gradients with a padding bias equal central differences", "[nn][gradient]") {
  const auto g = world_grid();
  for_each_type(list<L_replicated, L_2d, L_model>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using M = mt::tensor<double, L, batch, mlen, d_model>;
    using W = mt::tensor<double, L, d_model, heads, d_kv>;
    using WO = mt::tensor<double, L, heads, d_kv, d_model>;
    using Ids = mt::tensor<double, L, batch, length>;
    const block_weights<L> w(g);
    const auto bias = nn::padding_bias<length, mlen>(mt::from_host<Ids>(g, {B, S}, source_ids), 0.0);
    const auto x0 = mt::random_normal<X>(g, {B, T, D}, 151);
    const auto m0 = mt::random_normal<M>(g, {B, S, D}, 152);
    const auto att = [&](const X& x, const M& m, const W& q, const W& k, const W& v, const WO& o) {
      return weighted_sum(nn::attention<length, mlen, d_model, heads, d_kv>(x, m, q, k, v, o, bias), 153);
    };
    const gradient_check_options opt{.h = 1e-6, .tol = 1e-6, .stride = 5};
    const auto normal = [&]<class T>(std::uint64_t seed, const typename T::extents_type& e) {
      return mt::gather_all(mt::random_normal<T>(g, e, seed, 0, 0.5));
    };
    check_gradient<X>(g, {B, T, D}, normal.template operator()<X>(154, {B, T, D}),
                      [&](const X& x) { return att(x, m0, w.wq, w.wk, w.wv, w.wo); }, opt);
    check_gradient<M>(g, {B, S, D}, normal.template operator()<M>(155, {B, S, D}),
                      [&](const M& m) { return att(x0, m, w.wq, w.wk, w.wv, w.wo); }, opt);
    check_gradient<W>(g, {D, H, K}, normal.template operator()<W>(156, {D, H, K}),
                      [&](const W& q) { return att(x0, m0, q, w.wk, w.wv, w.wo); }, opt);
    check_gradient<W>(g, {D, H, K}, normal.template operator()<W>(157, {D, H, K}),
                      [&](const W& k) { return att(x0, m0, w.wq, k, w.wv, w.wo); }, opt);
    check_gradient<W>(g, {D, H, K}, normal.template operator()<W>(158, {D, H, K}),
                      [&](const W& v) { return att(x0, m0, w.wq, w.wk, v, w.wo); }, opt);
    check_gradient<WO>(g, {H, K, D}, normal.template operator()<WO>(159, {H, K, D}),
                       [&](const WO& o) { return att(x0, m0, w.wq, w.wk, w.wv, o); }, opt);
  });
}

TEST_CASE("encoder and decoder blocks: the same under every layout, causal, gradients equal central differences",
          "[nn][gradient][equivalence]") {
  const auto g = world_grid();
  std::vector<double> enc_reference, dec_reference;
  for_each_type(all_layouts{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using M = mt::tensor<double, L, batch, mlen, d_model>;
    using Ids = mt::tensor<double, L, batch, length>;
    const block_weights<L> w(g);
    const auto bias = nn::padding_bias<length, mlen>(mt::from_host<Ids>(g, {B, S}, source_ids), 0.0);
    const nn::block_dropout drop{.rate = 0.25, .seed = 161, .step = 3};
    const auto encode = [&](const X& x) {
      return nn::encoder_block<length, mlen, d_model, heads, d_kv, d_ff>(x, bias, w.self(), w.ff(), drop);
    };
    const auto decode = [&](const X& y, const M& memory) {
      return nn::decoder_block<length, mlen, d_model, heads, d_kv, d_ff>(y, memory, bias, w.self(), w.cross(), w.ff(), drop);
    };
    const auto src = mt::random_normal<X>(g, {B, S, D}, 162);
    const auto memory = mt::rename<length, mlen>(encode(src));
    const auto tgt_host = mt::gather_all(mt::random_normal<X>(g, {B, T, D}, 163));
    const auto enc = mt::gather_all(memory);
    const auto dec = mt::gather_all(decode(mt::from_host<X>(g, {B, T, D}, tgt_host), memory));
    if (enc_reference.empty()) enc_reference = enc, dec_reference = dec;
    REQUIRE(max_rel_error(enc, enc_reference) < 1e-12);
    REQUIRE(max_rel_error(dec, dec_reference) < 1e-12);
    // Causal: a change at target position 2 leaves positions 0 and 1 as they were. (Not the same
    // change to every d_model element: the layer norms would remove it.)
    auto changed = tgt_host;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t d = 0; d < D; ++d) changed[(b * T + 2) * D + d] += 0.5 * double(d + 1);
    const auto dec2 = mt::gather_all(decode(mt::from_host<X>(g, {B, T, D}, changed), memory));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t l = 0; l < T; ++l) {
        double diff = 0;
        for (std::int64_t d = 0; d < D; ++d) diff += std::abs(dec2[(b * T + l) * D + d] - dec[(b * T + l) * D + d]);
        INFO("batch " << b << " position " << l);
        if (l < 2) REQUIRE(diff == 0.0);
        else REQUIRE(diff > 1e-6);
      }
    if constexpr (!std::is_same_v<L, L_data>) {  // three layouts are enough for the differences
      const gradient_check_options opt{.h = 1e-6, .tol = 1e-6, .stride = 7};
      check_gradient<X>(g, {B, S, D}, mt::gather_all(src), [&](const X& x) { return weighted_sum(encode(x), 164); }, opt);
      check_gradient<X>(g, {B, T, D}, tgt_host, [&](const X& y) { return weighted_sum(decode(y, memory), 165); }, opt);
      check_gradient<M>(g, {B, S, D}, enc, [&](const M& m) { return weighted_sum(decode(mt::from_host<X>(g, {B, T, D}, tgt_host), m), 166); }, opt);
      using W = typename block_weights<L>::W;
      check_gradient<W>(g, {D, H, K}, mt::gather_all(w.ck), [&](const W& ck) {
        return weighted_sum(nn::decoder_block<length, mlen, d_model, heads, d_kv, d_ff>(
                                mt::from_host<X>(g, {B, T, D}, tgt_host), memory, bias, w.self(),
                                nn::attention_sublayer{w.s2, w.b2, w.cq, ck, w.cv, w.co}, w.ff(), drop),
                            167);
      }, opt);
    }
  });
}

// Uneven: heads 3 and d_ff 5 over the rows, batch 3 over the columns: parts differ and some
// processors hold nothing of a split dim.
TEST_CASE("encoder-decoder layers under uneven splits equal the replicated run", "[nn][equivalence]") {
  using L_uneven = mt::layout<grid, mt::split<batch, c_>, mt::split<heads, r_>, mt::split<d_ff, r_>>;
  const auto g = world_grid();
  std::vector<double> reference;
  for_each_type(list<L_replicated, L_uneven>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    using Ids = mt::tensor<double, L, batch, length>;
    const block_weights<L> w(g);
    const auto bias = nn::padding_bias<length, mlen>(mt::from_host<Ids>(g, {B, S}, source_ids), 0.0);
    const auto src = mt::random_normal<X>(g, {B, S, D}, 171);
    auto y = mt::random_normal<X>(g, {B, T, D}, 172);
    y.requires_grad();
    const auto memory = mt::rename<length, mlen>(
        nn::encoder_block<length, mlen, d_model, heads, d_kv, d_ff>(src, bias, w.self(), w.ff()));
    const auto out = nn::decoder_block<length, mlen, d_model, heads, d_kv, d_ff>(y, memory, bias, w.self(), w.cross(), w.ff());
    const auto [dy] = mt::gradient(weighted_sum(out, 173), y);
    auto values = mt::gather_all(out);
    const auto grads = mt::gather_all(dy);
    values.insert(values.end(), grads.begin(), grads.end());
    if (reference.empty()) reference = values;
    REQUIRE(max_rel_error(values, reference) < 1e-12);
  });
}
