// einsum_gathered and einsum_scattered (ops/einsum_gathered.hpp, ops/einsum_scattered.hpp), the
// tensor-parallel products whose allgather and reduce_scatter run part by part around a ring:
// equal to the relayout and the product they replace (forward and gradients, 1e-12 in double),
// gradients against central differences, the ring's shifts counted (P - 1 a ring), and the
// gathered input not kept between the passes. Sequence parallelism's shapes: i the sequence,
// m the model's width, j the split product dim (heads or d_ff), k a batch split over a data axis.
// Extents 7 and 3 along i: uneven over 2 and 4 parts, and at 4 parts one part empty.
#include <array>
#include <catch2/catch_test_macros.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
constexpr std::int64_t M = 3, J = 4, K = 2;

// cuda_build (MESHTENSOR_TEST_KERNEL_KINDS_ONLY) compiles the bf16 case alone for the GPU: it holds
// both ring passes and their gradient rules (the widened sums and their rounding back too), the
// kinds of kernel the other cases instantiate in float and double.
#ifndef MESHTENSOR_TEST_KERNEL_KINDS_ONLY
// The shifts a ring over `axes` of `parts` processors counts per pass.
mt::comm_counters ring_counts(mt::axis_set axes, std::int64_t parts, std::int64_t passes) {
  mt::comm_counters c;
  if (parts > 1) c[{mt::collective::shift, axes}].calls = passes * (parts - 1);
  return c;
}

// L: the products' layout (j split over A, the stream i whole); LS: the stream split along i over A.
template <class L, class LS>
void check_gathered(const grid& g, std::int64_t I) {
  INFO(layout_name<L>() << " and its stream " << layout_name<LS>() << ", i of " << I);
  using X = ten<L, k_, i_, m_>;
  using XS = ten<LS, k_, i_, m_>;
  using W = ten<L, m_, j_>;
  constexpr mt::axis_set A = mt::detail::axes_mask_of<XS, mt::type_list<i_>>();
  const auto parts = g.communicator().size_over(A);
  const auto w = mt::random_normal<W>(g, {M, J}, 2);
  const auto reference = [&](const XS& v, const W& u) { return mt::einsum<k_, i_, j_>(mt::relayout<X>(v), u); };

  auto xs = mt::random_normal<XS>(g, {K, I, M}, 1);
  g.reset_counters();
  const auto y = mt::einsum_gathered<X, k_, i_, j_>(xs, w);
  require_counts(g.counters(), ring_counts(A, parts, 1));
  require_close(mt::gather_all(y), mt::gather_all(reference(xs, w)), 1e-12);

  // Gradients: equal to the reference path's, and the backward's two rings.
  auto wg = mt::random_normal<W>(g, {M, J}, 2);
  xs.requires_grad();
  wg.requires_grad();
  auto loss = weighted_sum(mt::einsum_gathered<X, k_, i_, j_>(xs, wg), 3);
  g.reset_counters();
  const auto [dx, dw] = mt::gradient(std::move(loss), xs, wg);
  const auto counted = g.counters();
  const auto [dx_ref, dw_ref] = mt::gradient(weighted_sum(reference(xs, wg), 3), xs, wg);
  require_close(mt::gather_all(dx), mt::gather_all(dx_ref), 1e-12);
  require_close(mt::gather_all(dw), mt::gather_all(dw_ref), 1e-12);
  // The weight's partial sum over the data axis is reduced as gradient() hands it out.
  mt::comm_counters shifts;
  for (const auto& [key, count] : counted)
    if (key.first == mt::collective::shift) shifts[key].calls = count.calls;
  require_counts(shifts, ring_counts(A, parts, 2));

  check_grad_at_normal<XS>("einsum_gathered, x", g, {K, I, M}, 4,
                           [&](const XS& v) { return weighted_sum(mt::einsum_gathered<X, k_, i_, j_>(v, w), 5); });
  const auto x0 = mt::random_normal<XS>(g, {K, I, M}, 6);
  check_grad_at_normal<W>("einsum_gathered, w", g, {M, J}, 7,
                          [&](const W& v) { return weighted_sum(mt::einsum_gathered<X, k_, i_, j_>(x0, v), 8); });
}

template <class L, class LS>
void check_scattered(const grid& g, std::int64_t I) {
  INFO(layout_name<L>() << " to its stream " << layout_name<LS>() << ", i of " << I);
  using H = ten<L, k_, i_, j_>;
  using W = ten<L, j_, m_>;
  using YS = ten<LS, k_, i_, m_>;
  constexpr mt::axis_set A = mt::detail::axes_mask_of<YS, mt::type_list<i_>>();
  const auto parts = g.communicator().size_over(A);
  const auto reference = [&](const H& h, const W& u) { return mt::relayout<YS>(mt::einsum_partial<k_, i_, m_>(h, u)); };

  auto h = mt::random_normal<H>(g, {K, I, J}, 11);
  auto w = mt::random_normal<W>(g, {J, M}, 12);
  g.reset_counters();
  const YS y = mt::einsum_scattered<YS>(h, w);
  require_counts(g.counters(), ring_counts(A, parts, 1));
  require_close(mt::gather_all(y), mt::gather_all(reference(h, w)), 1e-12);
  REQUIRE(y.local_extents() == YS(g, {K, I, M}).local_extents());

  h.requires_grad();
  w.requires_grad();
  auto loss = weighted_sum(mt::einsum_scattered<YS>(h, w), 13);
  g.reset_counters();
  const auto [dh, dw] = mt::gradient(std::move(loss), h, w);
  mt::comm_counters shifts;
  for (const auto& [key, count] : g.counters())
    if (key.first == mt::collective::shift) shifts[key].calls = count.calls;
  require_counts(shifts, ring_counts(A, parts, 1));
  const auto [dh_ref, dw_ref] = mt::gradient(weighted_sum(reference(h, w), 13), h, w);
  require_close(mt::gather_all(dh), mt::gather_all(dh_ref), 1e-12);
  require_close(mt::gather_all(dw), mt::gather_all(dw_ref), 1e-12);

  const auto w0 = mt::random_normal<W>(g, {J, M}, 14);
  check_grad_at_normal<H>("einsum_scattered, a", g, {K, I, J}, 15,
                          [&](const H& v) { return weighted_sum(mt::einsum_scattered<YS>(v, w0), 16); });
  const auto h0 = mt::random_normal<H>(g, {K, I, J}, 17);
  check_grad_at_normal<W>("einsum_scattered, w", g, {J, M}, 18,
                          [&](const W& v) { return weighted_sum(mt::einsum_scattered<YS>(h0, v), 19); });
}

#endif

using mt::layout;
using mt::split;
// j and the stream's i over both axes (tensor and sequence parallelism over the whole mesh).
using both = layout<grid, split<j_, r_, c_>>;
using both_stream = layout<grid, split<j_, r_, c_>, split<i_, r_, c_>>;
// A data axis (k over rows) beside the tensor axis (cols): the weight's gradient is a partial sum
// over rows, the ring runs over cols.
using data_model = layout<grid, split<k_, r_>, split<j_, c_>>;
using data_model_stream = layout<grid, split<k_, r_>, split<j_, c_>, split<i_, c_>>;
}  // namespace

#ifndef MESHTENSOR_TEST_KERNEL_KINDS_ONLY  // (above)
TEST_CASE("einsum_gathered: the allgather before a product, part by part around the ring") {
  const auto g = world_grid();
  for (const std::int64_t I : {7, 3}) {
    check_gathered<both, both_stream>(g, I);
    check_gathered<data_model, data_model_stream>(g, I);
  }
}

TEST_CASE("einsum_scattered: the reduce_scatter after a product, part by part around the ring") {
  const auto g = world_grid();
  for (const std::int64_t I : {7, 3}) {
    check_scattered<both, both_stream>(g, I);
    check_scattered<data_model, data_model_stream>(g, I);
  }
}

// Several products of one gathered x (attention's q, k and v): one ring for all, forward and
// backward, each result and gradient equal to its own relayout then einsum; a result that takes
// no gradient (the first, here) leaves the others' gradients whole.
TEST_CASE("einsum_gathered_each: one ring for several products") {
  const auto g = world_grid();
  using X = ten<data_model, k_, i_, m_>;
  using XS = ten<data_model_stream, k_, i_, m_>;
  using W = ten<data_model, m_, j_>;
  constexpr mt::axis_set A = mt::detail::axes_mask_of<XS, mt::type_list<i_>>();
  const auto parts = g.communicator().size_over(A);
  constexpr std::int64_t I = 7;
  auto xs = mt::random_normal<XS>(g, {K, I, M}, 41);
  std::array<W, 3> w{mt::random_normal<W>(g, {M, J}, 42), mt::random_normal<W>(g, {M, J}, 43),
                     mt::random_normal<W>(g, {M, J}, 44)};
  xs.requires_grad();
  for (auto& v : w) v.requires_grad();
  g.reset_counters();
  const auto y = mt::einsum_gathered_each<X, k_, i_, j_>(xs, w);
  require_counts(g.counters(), ring_counts(A, parts, 1));
  for (std::size_t n = 0; n < 3; ++n)
    require_close(mt::gather_all(y[n]), mt::gather_all(mt::einsum<k_, i_, j_>(mt::relayout<X>(xs), w[n])), 1e-12);

  auto loss = weighted_sum(y[1], 45) + weighted_sum(y[2], 46);
  g.reset_counters();
  const auto [dx, dw0, dw1, dw2] = mt::gradient(std::move(loss), xs, w[0], w[1], w[2]);
  mt::comm_counters shifts;
  for (const auto& [key, count] : g.counters())
    if (key.first == mt::collective::shift) shifts[key].calls = count.calls;
  require_counts(shifts, ring_counts(A, parts, 2));  // one ring for x's gradient, one for the weights'
  const X xg = mt::relayout<X>(xs);
  const auto [rx, r0, r1, r2] = mt::gradient(weighted_sum(mt::einsum<k_, i_, j_>(xg, w[1]), 45) +
                                                 weighted_sum(mt::einsum<k_, i_, j_>(xg, w[2]), 46),
                                             xs, w[0], w[1], w[2]);
  require_close(mt::gather_all(dx), mt::gather_all(rx), 1e-12);
  for (const double v : mt::gather_all(dw0)) REQUIRE(v == 0);
  require_close(mt::gather_all(dw1), mt::gather_all(r1), 1e-12);
  require_close(mt::gather_all(dw2), mt::gather_all(r2), 1e-12);
  (void)r0;
}

// Between the passes einsum_gathered keeps x's own part, as relayout_regathered does, not the
// gathered x that relayout then einsum keeps.
TEST_CASE("einsum_gathered keeps the split input for the backward pass") {
  const auto g = world_grid();
  using X = ten<both, k_, i_, m_>;
  using XS = ten<both_stream, k_, i_, m_>;
  using W = ten<both, m_, j_>;
  constexpr std::int64_t I = 8;
  const auto w = mt::random_normal<W>(g, {M, J}, 21);
  const auto kept = [&](bool overlapped) {
    auto v = mt::random_normal<XS>(g, {K, I, M}, 22);
    v.requires_grad();
    const auto before = mt::memory_stats().bytes_in_use;
    const auto y = overlapped ? mt::einsum_gathered<X, k_, i_, j_>(v, w) : mt::einsum<k_, i_, j_>(mt::relayout<X>(v), w);
    return mt::memory_stats().bytes_in_use - before;
  };
  const auto whole = kept(false), split_part = kept(true);
  if (g.communicator().size_over(mt::detail::axes_mask_of<XS, mt::type_list<i_>>()) > 1)
    REQUIRE(whole - split_part >= X(g, {K, I, M}).local_size() * 8);
  else
    REQUIRE(split_part <= whole);
}

#endif

// bf16: the ring's sums run in float and are rounded once, as the reduce_scatter of bf16 partials
// does; values exact in bf16 give the exact result.
TEST_CASE("einsum_gathered and einsum_scattered in bf16") {
  const auto g = world_grid();
  using X = mt::tensor<mt::bf16, both, i_, m_>;
  using XS = mt::tensor<mt::bf16, both_stream, i_, m_>;
  using W = mt::tensor<mt::bf16, both, m_, j_>;
  using H = mt::tensor<mt::bf16, both, i_, j_>;
  using WO = mt::tensor<mt::bf16, both, j_, m_>;
  constexpr std::int64_t I = 5;
  const auto xs = mt::from_host<XS>(g, {I, M}, std::vector<mt::bf16>(I * M, mt::bf16(0.5f)));
  const auto w = mt::from_host<W>(g, {M, J}, std::vector<mt::bf16>(M * J, mt::bf16(0.25f)));
  for (const auto v : mt::gather_all(mt::einsum_gathered<X, i_, j_>(xs, w))) REQUIRE(float(v) == 0.375f);  // 3 x 0.125
  const auto h = mt::from_host<H>(g, {I, J}, std::vector<mt::bf16>(I * J, mt::bf16(0.5f)));
  const auto wo = mt::from_host<WO>(g, {J, M}, std::vector<mt::bf16>(J * M, mt::bf16(0.25f)));
  for (const auto v : mt::gather_all(mt::einsum_scattered<XS>(h, wo))) REQUIRE(float(v) == 0.5f);  // 4 x 0.125
}
