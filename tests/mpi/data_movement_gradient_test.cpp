// Gradients of slice, pad, concat, split_along, shift, cumsum, gather (to the table) and top_k
// equal central finite differences, under the replicated layout and layouts that split the op's
// dim (over one axis, over two in either order) or other dims. float64; loss = sum over all dims
// of op(x) * fixed random weights; eps 1e-6; tolerance 1e-6 relative to max(1, |fd|) (the ops are
// linear, or piecewise linear away from ties, so the differences are exact up to rounding).
// one_hot has no gradient (indices are not differentiable), halo_exchange returns no tensor.
// gather's and top_k's rules hold their input's node, not its data.
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
constexpr std::int64_t I = 4, J = 8, K = 2;

template <class L, class M>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, i_, j_, k_>;
  const typename X::extents_type e{I, J, K};
  const auto y = mt::random_normal<X>(g, {I, 4, K}, 21);
  check_grad_at_normal<X>("slice", g, e, 1, [](const X& x) { return weighted_sum(mt::slice<j_>(x, 1, 4), 2); });
  check_grad_at_normal<X>("pad", g, e, 3, [](const X& x) { return weighted_sum(mt::pad<j_>(x, 1, 3), 4); });
  check_grad_at_normal<X>("concat (first)", g, e, 5, [&](const X& x) { return weighted_sum(mt::concat<j_>(x, y), 6); });
  check_grad_at_normal<X>("concat (second)", g, {I, 4, K}, 7, [&](const X& x) {
    return weighted_sum(mt::concat<j_>(mt::random_normal<X>(g, {I, J, K}, 8), x), 9);
  });
  check_grad_at_normal<X>("split_along", g, e, 10, [](const X& x) {
    auto [a, b] = mt::split_along<j_>(x, 4, 4);
    return weighted_sum(a, 11) + weighted_sum(b, 12);
  });
  for (std::int64_t off : {1, -5})
    for (auto b : {mt::boundary::zero_fill, mt::boundary::wrap}) {
      INFO("offset " << off << (b == mt::boundary::wrap ? " wrap" : " zero_fill"));
      check_grad_at_normal<X>("shift", g, e, 13, [=](const X& x) { return weighted_sum(mt::shift<j_>(x, off, b), 14); });
    }
  check_grad_at_normal<X>("cumsum", g, e, 15, [](const X& x) { return weighted_sum(mt::cumsum<j_>(x), 16); });
  check_grad_at_normal<X>("top_k", g, e, 17, [](const X& x) { return weighted_sum(mt::top_k<j_, l_>(x, 4).values, 18); });
  // Repeated ids: their gradients must add up in the table.
  using Table = mt::tensor<double, L, j_, k_>;
  using Ids = mt::tensor<std::int32_t, L, i_>;
  const auto ids = mt::from_host<Ids>(g, {I}, std::vector<std::int32_t>{1, 7, 1, 3});
  check_grad_at_normal<Table>("gather", g, {J, K}, 19, [&](const Table& t) { return weighted_sum(mt::gather<j_>(t, ids), 20); });
}
}  // namespace

TEST_CASE("data movement gradients equal central finite differences", "[gradient]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_layout<mt::layout<line>>(g);
    check_layout<mt::layout<line, mt::split<j_, x_>>>(g);
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    auto g = world_grid();
    check_layout<mt::layout<grid, mt::split<i_, r_>, mt::split<l_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<j_, r_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<j_, c_, r_>, mt::split<l_, r_>>>(g);
    check_layout<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>>(g);
  }
}

// A table made for one lookup (a bf16 copy of a float weight, one gathered by FSDP) and top_k's
// scores are read by no gradient rule: the tape holds their nodes, not their data, so they go when
// the forward pass drops them (a pipeline's first stage had held a table copy per microbatch in
// flight). Their gradients, from the nodes alone, are the central-difference checks above.
TEST_CASE("gather's and top_k's rules do not hold their input's data", "[gradient]") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>>;
  using Table = mt::tensor<double, L, j_, k_>;
  using Ids = mt::tensor<std::int32_t, L, i_>;
  using X = mt::tensor<double, L, i_, j_, k_>;
  auto table = mt::random_normal<Table>(g, {J, K}, 1);
  auto x = mt::random_normal<X>(g, {I, J, K}, 2);
  table.requires_grad();
  x.requires_grad();
  const auto held = [](const auto& t) { return t.view().use_count(); };
  const auto table_held = held(table), x_held = held(x);
  const auto looked_up = mt::gather<j_>(table, mt::from_host<Ids>(g, {I}, std::vector<std::int32_t>{3, 0, 3, 7}));
  const auto best = mt::top_k<j_, l_>(x, 4);
  CHECK(held(table) == table_held);
  CHECK(held(x) == x_held);
  CHECK(looked_up.tracks_grad());
  CHECK(best.values.tracks_grad());
}
