// Choosing a layout from plans (layout/candidates.hpp and plan/cost_model.hpp, docs/plan-mode.md): the candidates enumerated
// from the dims, the cost model's arithmetic, the calibration file, and Mesh-TensorFlow's own
// auto-layout example, all planned in one process.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstdio>
#include <meshtensor/layout/candidates.hpp>
#include <meshtensor/meshtensor.hpp>
#include <set>
#include <string>

namespace mt = meshtensor;

namespace {
struct a : mt::dim<"a"> {};
struct b : mt::dim<"b"> {};
struct c : mt::dim<"c"> {};
struct m1 : mt::axis<"m1"> {};
struct m2 : mt::axis<"m2"> {};
using mesh2 = mt::mesh<m1, m2>;

// Round figures, so the expected times below are worked out by hand.
mt::machine_calibration round_machine() {
  mt::machine_calibration c;
  c.gemm_flops_per_s = 1e9;      // 1 ns per FLOP
  c.bytes_per_s = 1e9;           // 1 ns per byte allocated
  c.seconds_per_kernel = 1e-6;   // 1 us per kernel
  for (int size : {2, 4, 8})
    for (auto kind : {mt::collective::allreduce, mt::collective::allgather, mt::collective::alltoall})
      c.collectives[{kind, size}] = {1e-5 * size, 1e-9};  // 10 us per processor per call, 1 ns per byte
  return c;
}
}  // namespace

TEST_CASE("candidate layouts: every axis to one dim or none", "[planned]") {
  using all = mt::candidate_layouts<mesh2, a, b, c>;
  STATIC_REQUIRE(all::size == 16);  // (3 dims + none)^2 axes
  std::set<std::string> names;
  mt::for_each_layout(all{}, [&]<class L>() { names.insert(mt::layout_string<L>()); });
  CHECK(names.size() == 16);
  CHECK(names.count("layout<mesh<m1, m2>>") == 1);
  CHECK(names.count("layout<mesh<m1, m2>, split<a, m2>, split<c, m1>>") == 1);
  CHECK(names.count("layout<mesh<m1, m2>, split<b, m1, m2>>") == 1);
  CHECK(names.count("layout<mesh<m1, m2>, split<a, m1>, split<a, m2>>") == 0);
}

TEST_CASE("the cost model adds up what a plan recorded", "[planned]") {
  using L = mt::layout<mesh2, mt::split<b, m1>>;
  const auto pm = mesh2::planned({4, 2});
  const auto x = mt::zeros<mt::tensor<float, L, a, b>>(pm, {10, 8});
  const auto y = mt::zeros<mt::tensor<float, L, b, c>>(pm, {8, 20});
  mt::reset_plan(pm);
  (void)mt::einsum<a, c>(x, y);  // local [10 x 2] x [2 x 20], then an allreduce of 200 floats over m1
  const auto r = mt::plan_report_of(pm);
  CHECK(r.total_flops == 2 * 10 * 2 * 20);
  REQUIRE(r.totals.size() == 1);
  const auto& [key, n] = *r.totals.begin();
  CHECK(key.first == mt::collective::allreduce);
  CHECK(n.bytes == 200 * 4);
  const auto t = mt::predict(r, round_machine());
  CHECK(t.products == Catch::Approx(800e-9));
  CHECK(t.communication == Catch::Approx(4e-5 + 800e-9));  // a group of 4: alpha 40 us, 800 bytes
  CHECK(t.kernels == Catch::Approx(r.kernels * 1e-6));
  CHECK(t.memory == Catch::Approx(r.allocated_bytes * 1e-9));
  CHECK(r.allocated_bytes >= 200 * 4);  // the result at least
}

TEST_CASE("products of bf16 operands are timed at the bf16 rate where the machine has one", "[planned]") {
  // c split, the contraction whole; then b split: partial sums, whose bf16 operands are multiplied
  // into float sums (reduced in float, rounded once), bf16 products all the same.
  using L = mt::layout<mesh2, mt::split<c, m1>>;
  using LB = mt::layout<mesh2, mt::split<b, m1>>;
  const auto pm = mesh2::planned({4, 2});
  const auto x = mt::zeros<mt::tensor<float, L, a, b>>(pm, {10, 8});
  const auto y = mt::zeros<mt::tensor<float, L, b, c>>(pm, {8, 20});
  const auto xh = mt::cast<mt::bf16>(x);
  const auto yh = mt::cast<mt::bf16>(y);
  const auto xb = mt::cast<mt::bf16>(mt::zeros<mt::tensor<float, LB, a, b>>(pm, {10, 8}));
  const auto yb = mt::cast<mt::bf16>(mt::zeros<mt::tensor<float, LB, b, c>>(pm, {8, 20}));
  mt::reset_plan(pm);
  (void)mt::einsum<a, c>(x, y);    // [10 x 8] x [8 x 5] in float: 800 FLOPs
  (void)mt::einsum<a, c>(xh, yh);  // the same in bf16: 800 more
  (void)mt::einsum<a, c>(xb, yb);  // [10 x 2] x [2 x 20], a partial sum over m1, in bf16: 800 more
  const auto r = mt::plan_report_of(pm);
  CHECK(r.total_flops == 2400);
  std::int64_t in_bf16 = 0;
  for (const auto& [mnk, f] : r.bf16_product_flops_by_size) in_bf16 += f;
  CHECK(in_bf16 == 1600);
  auto machine = round_machine();
  machine.gemm_rates = {{1e2, 1e9}, {1e4, 1e9}};       // 1 ns per float FLOP at every size
  CHECK(mt::predict(r, machine).products == Catch::Approx(2400e-9));  // no bf16 figures: float's rate
  machine.bf16_gemm_rates = {{1e2, 4e9}, {1e4, 4e9}};  // bf16 four times as fast
  CHECK(mt::predict(r, machine).products == Catch::Approx(800e-9 + 400e-9));
  const std::string path = "layout_choice_test_bf16_calibration.txt";
  machine.save(path);
  const auto back = mt::machine_calibration::load(path);
  CHECK(back.bf16_gemm_rates == machine.bf16_gemm_rates);
  CHECK(back.bf16_gemm_rate(1e3) == Catch::Approx(4e9));
  CHECK(back.gemm_rate(1e3) == Catch::Approx(1e9));
  std::remove(path.c_str());
}

TEST_CASE("a calibration file round-trips and bad lines are named", "[planned]") {
  const std::string path = "layout_choice_test_calibration.txt";
  const auto c = round_machine();
  c.save(path);
  const auto d = mt::machine_calibration::load(path);
  CHECK(d.gemm_flops_per_s == c.gemm_flops_per_s);
  CHECK(!d.bf16_products_widened);
  auto widened = round_machine();
  widened.bf16_products_widened = true;
  widened.save(path);
  CHECK(mt::machine_calibration::load(path).bf16_products_widened);
  c.save(path);
  CHECK(d.coefficients(mt::collective::allreduce, 4).alpha == Catch::Approx(4e-5));
  CHECK(d.coefficients(mt::collective::allreduce, 3).alpha == Catch::Approx(2e-5));  // nearest measured: 2 (ties: first)
  CHECK_THROWS_WITH(d.coefficients(mt::collective::shift, 2), Catch::Matchers::ContainsSubstring("no figures for shift"));
  {
    std::FILE* f = std::fopen(path.c_str(), "a");
    std::fputs("collective allreduce two 1 2\n", f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH(mt::machine_calibration::load(path),
                    Catch::Matchers::ContainsSubstring("line 18: cannot read 'collective allreduce two 1 2'"));
  CHECK_THROWS_WITH(mt::machine_calibration::load("no-such-calibration.txt"),
                    Catch::Matchers::ContainsSubstring("cannot open the calibration 'no-such-calibration.txt'"));
  std::remove(path.c_str());
}

// Mesh-TensorFlow's auto_mtf example: z[a, c] = x[a:10, b:5] y[b:5, c:20] on a mesh m1:4 x m2:2.
// Its answer (by least peak memory): a over m2, c over m1, b not split. Ours, by predicted time
// among the candidates that fit, is the same layout: b unsplit means no allreduce, and a:10 over
// m2 (5 + 5) with c:20 over m1 (5 each) gives every processor 5 x 5 x 5 products, the fewest
// (a over m1 cuts 10 into 3, 3, 2, 2: the first processor does 3 x 5 x 10).
TEST_CASE("Mesh-TensorFlow's auto-layout example picks a:m2, c:m1", "[planned]") {
  const auto machine = round_machine();
  std::vector<mt::layout_candidate> candidates;
  mt::for_each_layout(mt::candidate_layouts<mesh2, a, b, c>{}, [&]<class L>() {
    const auto pm = mesh2::planned({4, 2});
    const auto x = mt::zeros<mt::tensor<float, L, a, b>>(pm, {10, 5});
    const auto y = mt::zeros<mt::tensor<float, L, b, c>>(pm, {5, 20});
    mt::reset_plan(pm);
    (void)mt::einsum<a, c>(x, y);
    const auto r = mt::plan_report_of(pm);
    candidates.push_back({mt::layout_string<L>(), r, mt::predict(r, machine), true});
  });
  const auto ranked = mt::rank_layouts(candidates, std::int64_t{1} << 30);
  REQUIRE(ranked.size() == 16);
  CHECK(ranked[0].name == "layout<mesh<m1, m2>, split<a, m2>, split<c, m1>>");
  CHECK(ranked[0].report.totals.empty());
  CHECK(ranked[0].report.total_flops == 2 * 5 * 5 * 5);
  // A budget below every peak: nothing fits, and the order is by peak bytes.
  const auto none_fit = mt::rank_layouts(candidates, 1);
  for (std::size_t i = 1; i < none_fit.size(); ++i) CHECK(none_fit[i - 1].report.peak_bytes <= none_fit[i].report.peak_bytes);
  CHECK_FALSE(none_fit[0].fits);
}
