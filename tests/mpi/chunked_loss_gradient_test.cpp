// local_chunk<D> and the loss it serves, nn::chunked_cross_entropy, at 1, 2 and 4 ranks on [P x 1]
// and [2 x 2]: the pieces of a dim whole, split over both axes and cut zigzag hold every element of
// x once, without a collective (where D is whole, piece c is slice<D>'s; split or zigzag, each
// range's rows c of its own, written out here); an extent that is not a multiple of parts x
// chunks and a piece out of range are refused by name; the gradient equals central differences.
// The loss in 1, 2 and 4 pieces equals the whole loss (reduce_mean of softmax_cross_entropy of the
// dense layer's logits), and so do its gradients to h and w, with the vocabulary split too; bf16
// activations with a float weight (cast inside each piece) follow the whole loss.
#include <algorithm>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <meshtensor/nn/chunked_cross_entropy.hpp>
#include <test_support.hpp>

#include "transformer_dims.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

namespace {
constexpr std::int64_t B = 2, S = 16, M = 3, V = 5;

std::int64_t total_calls(const mt::comm_counters& counters) {
  std::int64_t n = 0;
  for (const auto& [key, count] : counters) n += count.calls;
  return n;
}
}  // namespace

TEST_CASE("local_chunk's pieces hold every element once, with no collective", "[gradient]") {
  using Whole = mt::layout<grid>;
  using Split = mt::layout<grid, mt::split<length, r_, c_>>;
  using Zigzag = mt::layout<grid, mt::zigzag<length, r_, c_>>;
  auto g = world_grid();
  const std::int64_t P = world_size();
  std::vector<double> host(static_cast<std::size_t>(B * S * M));
  for (std::size_t k = 0; k < host.size(); ++k) host[k] = static_cast<double>(k);
  for_each_type(list<Whole, Split, Zigzag>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using X = mt::tensor<double, L, batch, length, d_model>;
    const auto x = mt::from_host<X>(g, {B, S, M}, host);
    for (const std::int64_t chunks : {1, 2}) {
      INFO(chunks << " pieces");
      std::vector<double> seen;
      for (std::int64_t c = 0; c < chunks; ++c) {
        g.reset_counters();
        const auto piece = mt::local_chunk<length>(x, c, chunks);
        REQUIRE(total_calls(g.communicator().counters()) == 0);
        REQUIRE(piece.template extent<length>() == S / chunks);
        const auto got = mt::gather_all(piece);
        seen.insert(seen.end(), got.begin(), got.end());
        if constexpr (std::is_same_v<L, Whole>) {
          REQUIRE(got == mt::gather_all(mt::slice<length>(x, c * S / chunks, S / chunks)));
        } else {
          // x's S rows cut into K ranges (P parts, two ranges each under zigzag), the result's S / chunks
          // into K alike: the result's range k, row l is x's range k, row c * m + l. (Under zigzag part q
          // holds ranges q and 2P - 1 - q of both, so both are zigzag: tests/mpi/zigzag_equivalence_test.cpp.)
          const std::int64_t K = std::is_same_v<L, Zigzag> ? 2 * P : P, m = S / (K * chunks);
          std::vector<double> want;
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t k = 0; k < K; ++k)
              for (std::int64_t l = 0; l < m; ++l)
                for (std::int64_t d = 0; d < M; ++d)
                  want.push_back(host[static_cast<std::size_t>((b * S + k * S / K + c * m + l) * M + d)]);
          REQUIRE(got == want);
        }
      }
      std::sort(seen.begin(), seen.end());
      REQUIRE(seen == host);
    }
    check_gradient<X>(g, {B, S, M}, host, [&](const X& y) {
      return weighted_sum(mt::local_chunk<length>(y, 0, 2), 3) + weighted_sum(mt::local_chunk<length>(y, 1, 2), 4);
    }, {.h = 1e-6, .tol = 1e-6, .stride = 5});
  });
}

TEST_CASE("local_chunk refuses an extent it cannot cut evenly and a piece out of range", "[gradient]") {
  using Split = mt::layout<grid, mt::split<length, r_, c_>>;
  using X = mt::tensor<double, Split, batch, length, d_model>;
  const auto g = world_grid();
  const auto x = X(g, {B, S, M});
  REQUIRE_THROWS_WITH(mt::local_chunk<length>(x, 0, 3),
                      Catch::Matchers::ContainsSubstring("dim 'length' of extent 16") &&
                          Catch::Matchers::ContainsSubstring("multiple of " + std::to_string(3 * world_size())));
  REQUIRE_THROWS_WITH(mt::local_chunk<length>(x, 2, 2), Catch::Matchers::ContainsSubstring("piece 2 of 2"));
}

TEST_CASE("chunked_cross_entropy equals the whole loss and its gradients, in 1, 2 and 4 pieces", "[gradient]") {
  using Data = mt::layout<grid, mt::split<batch, r_>>;
  using Context = mt::layout<grid, mt::split<length, r_, c_>>;
  using ContextTensor = mt::layout<grid, mt::zigzag<length, r_>, mt::split<vocab, c_>>;
  const auto g = world_grid();
  for_each_type(list<Data, Context, ContextTensor>{}, [&]<class L>() {
    INFO(layout_name<L>());
    using H = mt::tensor<double, L, batch, length, d_model>;
    using W = mt::tensor<double, L, vocab, d_model>;
    using Ids = mt::tensor<std::int32_t, L, batch, length>;
    auto h = mt::random_normal<H>(g, {B, S, M}, 21);
    auto w = mt::random_normal<W>(g, {V, M}, 22);
    h.requires_grad();
    w.requires_grad();
    std::vector<std::int32_t> ids;
    for (std::int64_t k = 0; k < B * S; ++k) ids.push_back(static_cast<std::int32_t>((k * 3 + 1) % V));
    const auto labels = mt::from_host<Ids>(g, {B, S}, ids);
    const auto whole = mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(nn::dense<d_model, vocab>(h, w), labels));
    const auto [gh, gw] = mt::gradient(whole, h, w);
    for (const std::int64_t chunks : {1, 2, 4}) {
      INFO(chunks << " pieces");
      const auto loss = nn::chunked_cross_entropy<d_model, vocab, length>(h, w, labels, chunks);
      require_close(mt::gather_all(loss), mt::gather_all(whole), 1e-12);
      const auto [ch, cw] = mt::gradient(loss, h, w);
      require_close(mt::gather_all(ch), mt::gather_all(gh), 1e-12);
      require_close(mt::gather_all(cw), mt::gather_all(gw), 1e-12);
    }
  });
}

TEST_CASE("chunked_cross_entropy with bf16 activations and a float weight follows the whole loss", "[gradient]") {
  using L = mt::layout<grid, mt::split<batch, r_>, mt::split<vocab, c_>>;
  using H = mt::tensor<float, L, batch, length, d_model>;
  using W = mt::tensor<float, L, vocab, d_model>;
  using Ids = mt::tensor<std::int32_t, L, batch, length>;
  const auto g = world_grid();
  auto h = mt::random_normal<H>(g, {B, S, M}, 31);
  auto w = mt::random_normal<W>(g, {V, M}, 32);
  h.requires_grad();
  w.requires_grad();
  std::vector<std::int32_t> ids;
  for (std::int64_t k = 0; k < B * S; ++k) ids.push_back(static_cast<std::int32_t>((k * 2 + 3) % V));
  const auto labels = mt::from_host<Ids>(g, {B, S}, ids);
  const auto hb = mt::cast<mt::bf16>(h);
  const auto whole = nn::chunked_cross_entropy<d_model, vocab, length>(hb, w, labels, 1);
  const auto pieces = nn::chunked_cross_entropy<d_model, vocab, length>(hb, w, labels, 4);
  // bf16 products in pieces of other sizes may round a logit apart: close, not equal.
  require_close(mt::gather_all(pieces), mt::gather_all(whole), 1e-3);
  const auto [gh, gw] = mt::gradient(whole, h, w);
  const auto [ph, pw] = mt::gradient(pieces, h, w);
  require_close(mt::gather_all(ph), mt::gather_all(gh), 1e-3);  // gradients of about 0.03: bf16's rounding apart
  require_close(mt::gather_all(pw), mt::gather_all(gw), 1e-3);
}
