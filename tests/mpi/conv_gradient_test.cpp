// Gradients of unfold, fold, conv (input and filter), conv_transpose, max_pool, avg_pool and
// batch_norm (input, scale, bias) equal central finite differences, under the replicated layout and
// layouts that split height, width, both, or height over two axes (the allgather path), with strided,
// dilated and padded windows. float64; loss = sum(op(x) * fixed random weights); h 1e-6; tolerance
// 1e-6 relative to max(1, |fd|).
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
struct co_ : mt::dim<"co"> {};
using b_ = i_;
using h_ = j_;
using w_ = k_;
using c_in = l_;
using kh_ = m_;
using kw_ = n_;
using sh = mt::spatial<h_, kh_>;
using sw = mt::spatial<w_, kw_>;

constexpr std::int64_t B = 1, H = 7, W = 5, C = 2, CO = 2;

template <class L, class M>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, b_, h_, w_, c_in>;
  using F = mt::tensor<double, L, kh_, kw_, c_in, co_>;
  using P = mt::tensor<double, L, c_in>;
  const typename X::extents_type e{B, H, W, C};
  const std::pair<mt::window, mt::window> cases[] = {
      {{.size = 3, .pad = mt::padding::same}, {.size = 2, .stride = 2, .pad = mt::padding::valid}},
      {{.size = 3, .stride = 2, .pad = mt::padding::same}, {.size = 3, .dilation = 2, .pad = mt::padding::same}},
  };
  for (const auto& [wh, ww] : cases) {
    INFO("h window size " << wh.size << " stride " << wh.stride << "; w window size " << ww.size << " dilation "
                          << ww.dilation);
    check_grad_at_normal<X>("unfold", g, e, 1, [&](const X& x) { return weighted_sum(mt::unfold<sh, sw>(x, wh, ww), 2); });
    const auto cols_ext = mt::unfold<sh, sw>(mt::random_normal<X>(g, e, 3), wh, ww).extents();
    using Cols = mt::tensor<double, L, b_, h_, w_, kh_, kw_, c_in>;
    check_grad_at_normal<Cols>("fold", g, cols_ext, 4,
                     [&](const Cols& c) { return weighted_sum(mt::fold<sh, sw>(c, {H, W}, wh, ww), 5); });
    const auto f = mt::random_normal<F>(g, {wh.size, ww.size, C, CO}, 6);
    check_grad_at_normal<X>("conv (input)", g, e, 7, [&](const X& x) { return weighted_sum(mt::nn::conv<sh, sw>(x, f, wh, ww), 8); });
    const auto x0 = mt::random_normal<X>(g, e, 9);
    check_grad_at_normal<F>("conv (filter)", g, f.extents(), 10,
                  [&](const F& ff) { return weighted_sum(mt::nn::conv<sh, sw>(x0, ff, wh, ww), 11); });
    const auto y_ext = mt::nn::conv<sh, sw>(x0, f, wh, ww).extents();
    using Y = mt::tensor<double, L, b_, h_, w_, co_>;
    check_grad_at_normal<Y>("conv_transpose", g, y_ext, 12, [&](const Y& y) {
      return weighted_sum(mt::nn::conv_transpose<sh, sw>(y, f, {H, W}, wh, ww), 13);
    });
    check_grad_at_normal<X>("max_pool", g, e, 14, [&](const X& x) { return weighted_sum(mt::nn::max_pool<sh, sw>(x, wh, ww), 15); });
    check_grad_at_normal<X>("avg_pool", g, e, 16, [&](const X& x) { return weighted_sum(mt::nn::avg_pool<sh, sw>(x, wh, ww), 17); });
  }
  const auto scale = mt::random_normal<P>(g, {C}, 18), bias = mt::random_normal<P>(g, {C}, 19);
  check_grad_at_normal<X>("batch_norm (input)", g, e, 20,
                [&](const X& x) { return weighted_sum(mt::nn::batch_norm<b_, h_, w_>(x, scale, bias), 21); });
  const auto x1 = mt::random_normal<X>(g, e, 22);
  check_grad_at_normal<P>("batch_norm (scale)", g, {C}, 23,
                [&](const P& s) { return weighted_sum(mt::nn::batch_norm<b_, h_, w_>(x1, s, bias), 24); });
  check_grad_at_normal<P>("batch_norm (bias)", g, {C}, 25,
                [&](const P& b) { return weighted_sum(mt::nn::batch_norm<b_, h_, w_>(x1, scale, b), 26); });
}
}  // namespace

TEST_CASE("conv, pools, batch_norm, unfold and fold gradients equal central finite differences", "[gradient]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_layout<mt::layout<line>>(g);
    check_layout<mt::layout<line, mt::split<h_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<w_, x_>>>(g);
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto g = world_grid();
    check_layout<mt::layout<grid, mt::split<h_, r_>, mt::split<w_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<h_, r_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<c_in, r_>, mt::split<w_, c_>>>(g);
  }
}

TEST_CASE("no_grad: ops on tensors that track gradients record nothing while it lives", "[gradient]") {
  auto g = world_line();
  using X = mt::tensor<double, mt::layout<line, mt::split<h_, x_>>, b_, h_, w_, c_in>;
  using F = mt::tensor<double, mt::layout<line, mt::split<h_, x_>>, kh_, kw_, c_in, co_>;
  auto x = mt::random_normal<X>(g, {B, H, W, C}, 1);
  const auto f = mt::random_normal<F>(g, {3, 3, C, CO}, 2);
  x.requires_grad();
  const mt::window k3{.size = 3, .pad = mt::padding::same};
  {
    const mt::no_grad inference;
    REQUIRE_FALSE(mt::nn::conv<sh, sw>(x, f, k3, k3).tracks_grad());
  }
  const auto y = mt::nn::conv<sh, sw>(x, f, k3, k3);
  REQUIRE(y.tracks_grad());
  const auto [gx] = mt::gradient(weighted_sum(y, 3), x);
  REQUIRE(gx.extents() == x.extents());
}
