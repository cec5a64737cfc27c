// partial_sum (ops/partial_sum.hpp): einsum_partial's sum equals einsum's under every layout of a
// 2x2 (or [P]) grid, with the allreduce only where sum_partials is; linear combinations and a bias
// added to a partial sum stay partial and cost nothing; a relayout that splits dims over exactly
// the partial's axes is one reduce_scatter (each processor sends its whole addend once) and equals
// the relayout of einsum's result; gradients against finite differences through every path.
// Extents 7 x 5 x 6: uneven over 2, 3, 4 and 6 parts.
#include <catch2/catch_template_test_macros.hpp>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
constexpr std::int64_t I = 7, J = 5, K = 6;

template <class L>
void check_layout(const grid& g) {
  INFO(layout_name<L>());
  using X = ten<L, i_, j_>;
  using W = ten<L, j_, k_>;
  using Y = ten<L, i_, k_>;
  constexpr unsigned A = mt::detail::axes_mask_of<X, mt::type_list<j_>>();  // the contracted dim's axes
  const auto x = mt::random_normal<X>(g, {I, J}, 1), x2 = mt::random_normal<X>(g, {I, J}, 2);
  const auto w = mt::random_normal<W>(g, {J, K}, 3);
  const auto b = mt::random_normal<Y>(g, {I, K}, 4);
  const auto e = mt::gather_all(mt::einsum<i_, k_>(x, w)), e2 = mt::gather_all(mt::einsum<i_, k_>(x2, w));
  const auto bh = mt::gather_all(b);

  g.reset_counters();
  const auto p = mt::einsum_partial<i_, k_>(x, w);
  STATIC_REQUIRE(decltype(p)::axes == A);
  REQUIRE(calls_of(g).empty());
  REQUIRE(mt::einsum_partial_plan<mt::type_list<i_, k_>, X, W>().as_counts().empty());
  const auto s = mt::sum_partials(p);
  REQUIRE(calls_of(g) == mt::sum_partials_plan<Y, A>().as_counts());
  require_close(mt::gather_all(s), e, 1e-12);

  // 2p - q/4 + (-p) + b + b: one allreduce for all of it, the bias counted once.
  g.reset_counters();
  const auto q = mt::einsum_partial<i_, k_>(x2, w);
  const auto r = b + (2.0 * p - q / 4.0 + (-p) + b);
  const auto rs = mt::sum_partials(r);
  REQUIRE(calls_of(g) == mt::sum_partials_plan<Y, A>().as_counts());
  std::vector<double> want(e.size());
  for (std::size_t n = 0; n < e.size(); ++n) want[n] = e[n] - e2[n] / 4 + 2 * bh[n];
  require_close(mt::gather_all(rs), want, 1e-12);
  require_close(mt::gather_all(p - q), [&] {
    std::vector<double> d(e.size());
    for (std::size_t n = 0; n < e.size(); ++n) d[n] = e[n] - e2[n];
    return d;
  }(), 1e-12);

  check_grad_at_normal<W>("sum_partials of a linear combination with a bias", g, {J, K}, 5, [&](const W& v) {
    return weighted_sum(mt::sum_partials(b + 3.0 * mt::einsum_partial<i_, k_>(x, v) - mt::einsum_partial<i_, k_>(x2, v)), 6);
  });
  check_grad_at_normal<Y>("the bias of a partial sum", g, {I, K}, 7,
                          [&](const Y& v) { return weighted_sum(mt::sum_partials(p + v), 8); });
}

// Relayouts that split dims over exactly the partial's axes: one reduce_scatter.
template <class L, class Out>
void check_scatter(const grid& g) {
  INFO(layout_name<L>() << " to " << layout_name<Out>());
  using X = ten<L, i_, j_>;
  using W = ten<L, j_, k_>;
  using Y = ten<L, i_, k_>;
  using YO = ten<Out, i_, k_>;
  constexpr unsigned A = mt::detail::axes_mask_of<X, mt::type_list<j_>>();
  const auto x = mt::random_normal<X>(g, {I, J}, 11);
  const auto w = mt::random_normal<W>(g, {J, K}, 12);
  const auto p = mt::einsum_partial<i_, k_>(x, w);
  g.reset_counters();
  const auto out = mt::relayout<YO>(p);
  REQUIRE(calls_of(g) == mt::relayout_plan_of_partial<YO, Y, A>().as_counts());
  if (g.communicator().size_over(A) > 1) {
    REQUIRE(calls_of(g).size() == 1);
    REQUIRE(bytes_of(g, mt::collective::reduce_scatter) == p.addend().local_size() * 8);  // the whole addend, once
  }
  require_close(mt::gather_all(out), mt::gather_all(mt::relayout<YO>(mt::einsum<i_, k_>(x, w))), 1e-12);
  REQUIRE(out.local_extents() == YO(g, {I, K}).local_extents());
  check_grad_at_normal<W>("relayout of a partial sum", g, {J, K}, 13,
                          [&](const W& v) { return weighted_sum(mt::relayout<YO>(mt::einsum_partial<i_, k_>(x, v)), 14); });
}
}  // namespace

TEST_CASE("einsum_partial, sum_partials and linear ops under every layout") {
  const auto g = world_grid();
  for_each_type(grid_layouts<i_, j_, k_>{}, [&]<class L>() { check_layout<L>(g); });
}

TEST_CASE("a relayout of a partial sum is one reduce_scatter") {
  const auto g = world_grid();
  using mt::layout;
  using mt::split;
  // j over both axes; i takes both.
  check_scatter<layout<grid, split<j_, r_, c_>>, layout<grid, split<j_, r_, c_>, split<i_, r_, c_>>>(g);
  // j over cols, i already over rows: i takes cols after rows.
  check_scatter<layout<grid, split<j_, c_>, split<i_, r_>>, layout<grid, split<j_, c_>, split<i_, r_, c_>>>(g);
  // j over rows; k takes rows.
  check_scatter<layout<grid, split<j_, r_>>, layout<grid, split<j_, r_>, split<k_, r_>>>(g);
  // j over both; i takes rows and k cols.
  check_scatter<layout<grid, split<j_, r_, c_>>, layout<grid, split<j_, r_, c_>, split<i_, r_>, split<k_, c_>>>(g);
  // Nothing contracted is split: the partial is already the sum, and the relayout is local.
  check_scatter<layout<grid, split<i_, r_>>, layout<grid, split<i_, r_>>>(g);
}

TEST_CASE("a bf16 partial sum") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<j_, r_, c_>>;
  using X = mt::tensor<mt::bf16, L, i_, j_>;
  using W = mt::tensor<mt::bf16, L, j_, k_>;
  std::vector<mt::bf16> xh(I * J, mt::bf16(0.5f)), wh(J * K, mt::bf16(0.25f));
  const auto p = mt::einsum_partial<i_, k_>(mt::from_host<X>(g, {I, J}, xh), mt::from_host<W>(g, {J, K}, wh));
  for (const auto v : mt::gather_all(p)) REQUIRE(float(v) == 0.625f);  // 5 x 0.125, exact
}

// Sequence parallelism's shapes: the products contract j, split over both axes; the stream between
// them, x [i, m], has i split over the same axes (LS) or is whole (L).
namespace sequence_parallel {
using L = mt::layout<grid, mt::split<j_, r_, c_>>;
using LS = mt::layout<grid, mt::split<j_, r_, c_>, mt::split<i_, r_, c_>>;
using X = ten<L, i_, m_>;
using XS = ten<LS, i_, m_>;
using W = ten<L, m_, j_>;
constexpr std::int64_t M = 3;
}  // namespace sequence_parallel

// The backward of an allgather (relayout to a replicated dim) whose incoming gradient is a partial
// sum over the axes the relayout gathers over: the tape hands the partial to relayout's rule,
// which reduce_scatters it (sequence parallelism's backward) instead of allreducing and slicing.
TEST_CASE("relayout's gradient reduce_scatters a partial gradient") {
  const auto g = world_grid();
  using namespace sequence_parallel;
  const auto w = mt::random_normal<W>(g, {M, J}, 21);
  const auto loss_of = [&](const XS& v) { return weighted_sum(mt::einsum<i_, j_>(mt::relayout<X>(v), w), 22); };
  check_grad_at_normal<XS>("relayout to replicated, then a product contracting split j", g, {I, M}, 23, loss_of);

  auto v = mt::random_normal<XS>(g, {I, M}, 24);
  v.requires_grad();
  const auto loss = loss_of(v);
  g.reset_counters();
  const auto [dv] = mt::gradient(loss, v);
  std::int64_t scatters = 0, gathers_or_sums_of_dv = 0;
  for (const auto& [key, count] : g.counters()) {
    if (key.first == mt::collective::reduce_scatter) scatters += count.calls;
    // An allreduce of the whole [i, m] gradient (I x M doubles) would be the path without the rule.
    if (key.first == mt::collective::allreduce && count.bytes >= I * M * 8) gathers_or_sums_of_dv += count.calls;
  }
  REQUIRE(scatters == 1);  // counted at one processor too, as every collective is
  REQUIRE(gathers_or_sums_of_dv == 0);
  REQUIRE(dv.local_extents() == v.local_extents());
}

// relayout_regathered (sequence parallelism's stored input): the products that read the gathered
// input, one of them through a rename (attention's keys), keep the split input instead of the
// gathered one between the passes, and the backward pass gathers it again once for both; the
// gradient is relayout's.
TEST_CASE("relayout_regathered: the products keep the split input and gather it once more") {
  const auto g = world_grid();
  using namespace sequence_parallel;
  using WN = ten<L, n_, j_>;
  const auto w = mt::random_normal<W>(g, {M, J}, 31);
  const auto wn = mt::random_normal<WN>(g, {M, J}, 32);
  const auto loss_of = [&](const XS& v, bool regathered) {
    const X h = regathered ? mt::relayout_regathered<X>(v) : mt::relayout<X>(v);
    return weighted_sum(mt::einsum<i_, j_>(h, w) + mt::einsum<i_, j_>(mt::rename<m_, n_>(h), wn), 33);
  };
  check_grad_at_normal<XS>("relayout_regathered, then two products", g, {I, M}, 34,
                           [&](const XS& v) { return loss_of(v, true); });

  const bool gathers = g.communicator().size_over(mt::detail::axes_mask_of<X, mt::type_list<j_>>()) > 1;
  const auto step = [&](bool regathered) {
    auto v = mt::random_normal<XS>(g, {I, M}, 35);
    v.requires_grad();
    const auto before = mt::memory_stats().bytes_in_use;
    auto loss = loss_of(v, regathered);
    const auto kept = mt::memory_stats().bytes_in_use - before;
    g.reset_counters();
    auto [dv] = mt::gradient(std::move(loss), v);
    std::int64_t gathers_run = 0;
    for (const auto& [key, count] : g.counters())
      if (key.first == mt::collective::allgather) gathers_run += count.calls;
    return std::tuple(kept, gathers_run, mt::gather_all(dv));
  };
  const auto [kept_whole, gathers_whole, dv_whole] = step(false);
  const auto [kept_split, gathers_split, dv_split] = step(true);
  require_close(dv_split, dv_whole, 1e-12);
  // Kept between the passes: the gathered slice less (the split one is the test's own v).
  const std::int64_t gathered_bytes = X(g, {I, M}).local_size() * 8;
  if (gathers) REQUIRE(kept_whole - kept_split >= gathered_bytes);
  REQUIRE(gathers_whole == 0);
  REQUIRE(gathers_split == 1);  // once for both products (counted at one processor too, as every collective is)
}
