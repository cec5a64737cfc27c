// nn::conv's direct path (a convolution provider on each processor's slice, kernels/convolution.hpp)
// against its portable path, einsum(unfold(x), filter), in float: the results, the gradients of
// the input and the filter, and the collectives of the forward pass are the same, under every
// layout of conv_equivalence_test (height, width, both, batch or channels split; a height split
// over two axes: unfold's allgather fallback; channels out split), for windows with stride 2,
// dilation and both paddings on extents that split unevenly; conv1d and conv3d too, and bf16
// against float. conv_transpose's direct path (conv's backward data) against fold(einsum(y, f)),
// the same way. Where the build has a provider (oneDNN), it must be the one that ran.
// Run with MESHTENSOR_KERNELS=portable as well (tests/CMakeLists.txt): both sides are then the
// portable path, and the test still holds.
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
struct co_ : mt::dim<"co"> {};
struct kd_ : mt::dim<"kd"> {};
struct o_ : mt::dim<"o"> {};  // depth
using b_ = i_;
using h_ = j_;
using w_ = k_;
using c_in = l_;
using kh_ = m_;
using kw_ = n_;
using sh = mt::spatial<h_, kh_>;
using sw = mt::spatial<w_, kw_>;

constexpr std::int64_t B = 3, H = 9, W = 7, C = 3, CO = 4;

// Which path conv took: the number of convolutions the provider has made primitives for.
std::size_t provider_convolutions() {
#if MESHTENSOR_HAVE_DNNL
  return mt::kernels::dnnl_provider::conv_cache().size();
#else
  return 0;
#endif
}

template <class L, class M>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<float, L, b_, h_, w_, c_in>;
  using F = mt::tensor<float, L, kh_, kw_, c_in, co_>;
  using Y = mt::tensor<float, L, b_, h_, w_, co_>;
  const mt::window cases[][2] = {
      {{.size = 3, .pad = mt::padding::same}, {.size = 3, .pad = mt::padding::same}},
      {{.size = 3, .stride = 2, .pad = mt::padding::same}, {.size = 2, .stride = 2, .pad = mt::padding::valid}},
      {{.size = 3, .dilation = 2, .pad = mt::padding::valid}, {.size = 3, .stride = 2, .dilation = 2, .pad = mt::padding::same}},
      {{.size = 1}, {.size = 5, .pad = mt::padding::same}},
  };
  for (const auto& [wh, ww] : cases) {
    INFO("h window " << wh.size << "/" << wh.stride << "/" << wh.dilation << ", w window " << ww.size << "/" << ww.stride
                     << "/" << ww.dilation);
    auto x = mt::random_normal<X>(g, {B, H, W, C}, 1);
    auto f = mt::random_normal<F>(g, {wh.size, ww.size, C, CO}, 2);
    x.requires_grad();
    f.requires_grad();
    g.reset_counters();
    const Y y_direct = mt::nn::conv<sh, sw>(x, f, wh, ww);
    const auto direct_calls = calls_of(g);
    g.reset_counters();
    const Y y_portable = mt::einsum<b_, h_, w_, co_>(mt::unfold<sh, sw>(x, wh, ww), f);
    REQUIRE(direct_calls == calls_of(g));
    require_close(mt::gather_all(y_direct), mt::gather_all(y_portable), 2e-5);

    const auto [gx_d, gf_d] = mt::gradient(weighted_sum(y_direct, 3), x, f);
    const auto [gx_p, gf_p] = mt::gradient(weighted_sum(y_portable, 3), x, f);
    require_close(mt::gather_all(gx_d), mt::gather_all(gx_p), 2e-5);
    require_close(mt::gather_all(gf_d), mt::gather_all(gf_p), 2e-5);

    // conv_transpose (conv's backward data on each slice) against fold(einsum(z, f)).
    auto z = mt::random_normal<Y>(g, y_direct.extents(), 11);
    z.requires_grad();
    g.reset_counters();
    const X t_direct = mt::nn::conv_transpose<sh, sw>(z, f, {H, W}, wh, ww);
    const auto transpose_calls = calls_of(g);
    g.reset_counters();
    const X t_portable =
        mt::fold<sh, sw>(mt::detail::einsum_to(mt::detail::transpose_cols_dims_t<Y, F, sh, sw>{}, z, f), {H, W}, wh, ww);
    REQUIRE(transpose_calls == calls_of(g));
    require_close(mt::gather_all(t_direct), mt::gather_all(t_portable), 2e-5);
    const auto [gz_d, gtf_d] = mt::gradient(weighted_sum(t_direct, 12), z, f);
    const auto [gz_p, gtf_p] = mt::gradient(weighted_sum(t_portable, 12), z, f);
    require_close(mt::gather_all(gz_d), mt::gather_all(gz_p), 2e-5);
    require_close(mt::gather_all(gtf_d), mt::gather_all(gtf_p), 2e-5);
  }
}

template <class L, class M>
void check_bf16(const M& g) {
  INFO(layout_name<L>());
  using XF = mt::tensor<float, L, b_, h_, w_, c_in>;
  using FF = mt::tensor<float, L, kh_, kw_, c_in, co_>;
  const mt::window wh{.size = 3, .pad = mt::padding::same}, ww{.size = 3, .stride = 2, .pad = mt::padding::same};
  // Inputs exactly representable in bf16, so that both sides multiply the same numbers.
  const auto xf = mt::cast<float>(mt::cast<mt::bf16>(mt::random_normal<XF>(g, {B, H, W, C}, 4)));
  const auto ff = mt::cast<float>(mt::cast<mt::bf16>(mt::random_normal<FF>(g, {3, 3, C, CO}, 5)));
  const auto yb = mt::nn::conv<sh, sw>(mt::cast<mt::bf16>(xf), mt::cast<mt::bf16>(ff), wh, ww);
  const auto yf = mt::nn::conv<sh, sw>(xf, ff, wh, ww);
  // Float accumulation, one rounding to bf16 at the end: within bf16's half-ulp (2^-9) of the
  // float result, relative to the largest value.
  require_close(mt::gather_all(mt::cast<float>(yb)), mt::gather_all(yf), 1.0 / 256);
}

// conv1d over a split length and conv3d over a split depth, against the portable path.
template <class L, class M>
void check_1d_3d(const M& g) {
  INFO(layout_name<L>());
  using X1 = mt::tensor<float, L, b_, h_, c_in>;
  using F1 = mt::tensor<float, L, kh_, c_in, co_>;
  const mt::window w1{.size = 3, .stride = 2, .pad = mt::padding::same};
  auto x1 = mt::random_normal<X1>(g, {B, H, C}, 6);
  const auto f1 = mt::random_normal<F1>(g, {3, C, CO}, 7);
  require_close(mt::gather_all(mt::nn::conv1d<h_, kh_>(x1, f1, w1)),
                mt::gather_all(mt::einsum<b_, h_, co_>(mt::unfold<sh>(x1, w1), f1)), 2e-5);

  using X3 = mt::tensor<float, L, b_, h_, w_, o_, c_in>;
  using F3 = mt::tensor<float, L, kh_, kw_, kd_, c_in, co_>;
  using sd = mt::spatial<o_, kd_>;
  const mt::window wd{.size = 2, .pad = mt::padding::valid}, ws{.size = 3, .pad = mt::padding::same};
  auto x3 = mt::random_normal<X3>(g, {2, 5, 4, 6, C}, 8);
  auto f3 = mt::random_normal<F3>(g, {3, 3, 2, C, CO}, 9);
  x3.requires_grad();
  f3.requires_grad();
  const auto y3 = mt::nn::conv<sh, sw, sd>(x3, f3, ws, ws, wd);
  const auto y3p = mt::einsum<b_, h_, w_, o_, co_>(mt::unfold<sh, sw, sd>(x3, ws, ws, wd), f3);
  require_close(mt::gather_all(y3), mt::gather_all(y3p), 2e-5);
  const auto [gx, gf] = mt::gradient(weighted_sum(y3, 10), x3, f3);
  const auto [gxp, gfp] = mt::gradient(weighted_sum(y3p, 10), x3, f3);
  require_close(mt::gather_all(gx), mt::gather_all(gxp), 2e-5);
  require_close(mt::gather_all(gf), mt::gather_all(gfp), 2e-5);
}
}  // namespace

TEST_CASE("conv's and conv_transpose's direct paths equal unfold + einsum, values, gradients and collectives",
          "[equivalence]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_layout<mt::layout<line>>(g);
    check_layout<mt::layout<line, mt::split<h_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<w_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<b_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<c_in, x_>>>(g);
    check_layout<mt::layout<line, mt::split<co_, x_>>>(g);
    check_1d_3d<mt::layout<line, mt::split<h_, x_>>>(g);
    check_1d_3d<mt::layout<line, mt::split<o_, x_>>>(g);
  }
  SECTION("mesh [2x2] ([2x3] at 6 ranks, [P x 1] otherwise)") {
    auto g = world_grid();
    check_layout<mt::layout<grid, mt::split<h_, r_>, mt::split<w_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<h_, r_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<b_, r_>, mt::split<w_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<co_, c_>, mt::split<h_, r_>>>(g);
  }
}

TEST_CASE("bf16 conv: float accumulation, one rounding", "[equivalence]") {
  auto g = world_line();
  check_bf16<mt::layout<line>>(g);
  check_bf16<mt::layout<line, mt::split<h_, x_>>>(g);
}

TEST_CASE("conv's direct path is taken where the build has a provider", "[equivalence]") {
  auto g = world_line();
  using X = mt::tensor<float, mt::layout<line, mt::split<h_, x_>>, b_, h_, w_, c_in>;
  using F = mt::tensor<float, mt::layout<line, mt::split<h_, x_>>, kh_, kw_, c_in, co_>;
  const mt::window w{.size = 3, .pad = mt::padding::same};
  const std::size_t before = provider_convolutions();
  (void)mt::nn::conv<sh, sw>(mt::random_normal<X>(g, {B, 17, 13, C}, 1), mt::random_normal<F>(g, {3, 3, C, CO}, 2), w, w);
  const char* kernels = std::getenv("MESHTENSOR_KERNELS");
  const bool portable = kernels && std::string_view(kernels) == "portable";
  REQUIRE((provider_convolutions() > before) == (MESHTENSOR_HAVE_DNNL && !portable));
  // conv_transpose too (a shape no conv above made a primitive for).
  using Y = mt::tensor<float, mt::layout<line, mt::split<h_, x_>>, b_, h_, w_, co_>;
  const mt::window up{.size = 2, .stride = 2};
  const std::size_t before_transpose = provider_convolutions();
  (void)mt::nn::conv_transpose<sh, sw>(mt::random_normal<Y>(g, {B, 8, 6, CO}, 3), mt::random_normal<F>(g, {2, 2, C, CO}, 4),
                                       {16, 12}, up, up);
  REQUIRE((provider_convolutions() > before_transpose) == (MESHTENSOR_HAVE_DNNL && !portable));
}
