// bf16 (element/bf16.hpp): the rounding, checked against a reference computed in double; tensors of
// it under every layout of a line and a 2x2 grid (moved bit for bit, reduced in float); products,
// sums, softmax and layer norm accumulated in float (a sum of 300 ones is 300, where bf16
// accumulation stops at 256); NaN-propagating max across processors; the gradient through cast
// from float master weights to bf16 and back (gated on std::is_floating_point_v before, which a
// class fails: the tape was cut and gradient() found nothing to differentiate).
#include <catch2/catch_template_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <test_support.hpp>

#include "kernel_launches.hpp"

using namespace tst;
namespace mt = meshtensor;
namespace nn = meshtensor::nn;
using mt::bf16;

namespace {
float from_bits(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The bf16 nearest to v, ties to the even bit pattern, from the two candidates around it compared
// in double (exact for floats): independent of bf16's integer trick.
std::uint16_t nearest_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  const auto down = static_cast<std::uint16_t>(u >> 16), up = static_cast<std::uint16_t>(down + 1);
  const double d_down = std::abs(double(v) - double(from_bits(down)));
  // Above the largest finite value the next step is 2^128, which rounds to infinity.
  const double up_value = std::isinf(from_bits(up)) ? std::copysign(0x1p128, double(v)) : double(from_bits(up));
  const double d_up = std::abs(up_value - double(v));
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1) ? up : down;
}
}  // namespace

TEST_CASE("bf16 rounds to nearest even and keeps infinities and NaN") {
  CHECK(bf16(1.0f).bits() == 0x3f80);
  CHECK(bf16(1.0f + 0x1p-8f).bits() == 0x3f80);            // half an ulp above 1: ties to even (down)
  CHECK(bf16(1.0f + 3 * 0x1p-8f).bits() == 0x3f82);        // one and a half ulps: ties to even (up)
  CHECK(bf16(1.0f + 0x1p-8f + 0x1p-20f).bits() == 0x3f81);  // above the tie
  CHECK(bf16(-2.5f).bits() == 0xc020);
  CHECK(bf16(std::numeric_limits<float>::max()).bits() == 0x7f80);  // past bf16's largest: inf
  CHECK(bf16(std::numeric_limits<float>::infinity()).bits() == 0x7f80);
  CHECK(bf16(-std::numeric_limits<float>::infinity()).bits() == 0xff80);
  CHECK(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  const std::uint32_t low_nan = 0x7f800001u;  // a NaN whose payload is only in the low bits
  float f_low;
  std::memcpy(&f_low, &low_nan, 4);
  CHECK(std::isnan(float(bf16(f_low))));  // truncating would make it inf
  CHECK(float(std::numeric_limits<bf16>::max()) == 0x1.fep127f);
  CHECK(float(std::numeric_limits<bf16>::epsilon()) == 0x1p-7f);

  // Every bf16 converts to float and back to itself.
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = from_bits(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) continue;
    REQUIRE(bf16(f).bits() == b);
  }
  // Random floats of every magnitude round as the reference says.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0xffffffffu);
  for (int n = 0; n < 200000; ++n) {
    std::uint32_t u = bits(rng);
    if (n % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    INFO("float bits " << u);
    REQUIRE(bf16(f).bits() == nearest_bits(f));
  }
}

namespace {
constexpr std::int64_t I = 6, J = 300, K = 5;

template <class M, class L>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<bf16, L, i_, j_>;
  using Y = mt::tensor<bf16, L, j_, k_>;
  using XF = mt::tensor<float, L, i_, j_>;
  // Values exact in bf16: small multiples of 1/8, and a row of ones.
  std::vector<bf16> xh(I * J), yh(J * K);
  for (std::int64_t n = 0; n < I * J; ++n) xh[n] = n / J == 0 ? 1.0f : float((n * 7) % 17 - 8) / 8;
  for (std::int64_t n = 0; n < J * K; ++n) yh[n] = n % K == 0 ? 1.0f : float((n * 5) % 13 - 6) / 8;
  const auto x = mt::from_host<X>(g, {I, J}, std::span<const bf16>(xh));
  const auto y = mt::from_host<Y>(g, {J, K}, std::span<const bf16>(yh));

  {
    INFO("moved bit for bit, at half float's bytes");
    const auto back = mt::gather_all(x);
    for (std::int64_t n = 0; n < I * J; ++n) REQUIRE(back[n].bits() == xh[n].bits());
    using Replicated = mt::tensor<bf16, mt::layout<M>, i_, j_>;
    using ReplicatedF = mt::tensor<float, mt::layout<M>, i_, j_>;
    g.reset_counters();
    const auto r = mt::relayout<Replicated>(x);
    std::int64_t bytes16 = 0;
    for (const auto& [key, c] : g.counters()) bytes16 += c.bytes;
    g.reset_counters();
    (void)mt::relayout<ReplicatedF>(mt::cast<float>(x));
    std::int64_t bytes32 = 0;
    for (const auto& [key, c] : g.counters()) bytes32 += c.bytes;
    REQUIRE(2 * bytes16 == bytes32);
    const auto rh = mt::gather_all(r);
    for (std::int64_t n = 0; n < I * J; ++n) REQUIRE(rh[n].bits() == xh[n].bits());
  }

  {
    INFO("sums and products accumulate in float");
    // Host sums in double: exact here (multiples of 1/64, far below 2^24), then rounded once.
    const auto sums = mt::gather_all(mt::reduce_sum<j_>(x));
    for (std::int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (std::int64_t j = 0; j < J; ++j) s += float(xh[i * J + j]);
      INFO("row " << i);
      REQUIRE(sums[i].bits() == bf16(float(s)).bits());
    }
    REQUIRE(float(sums[0]) == 300.0f);  // bf16 accumulation would stop at 256
    const auto total = mt::item(mt::reduce_sum<i_, j_>(x));
    double all = 0;
    for (auto v : xh) all += float(v);
    REQUIRE(total.bits() == bf16(float(all)).bits());

    const auto p = mt::gather_all(mt::einsum<i_, k_>(x, y));
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (std::int64_t j = 0; j < J; ++j) s += double(float(xh[i * J + j])) * float(yh[j * K + k]);
        INFO("product at " << i << ", " << k);
        REQUIRE(p[i * K + k].bits() == bf16(float(s)).bits());
      }
    REQUIRE(float(p[0]) == 300.0f);
  }

  {
    INFO("softmax and layer norm within bf16's rounding of float's");
    using S = mt::tensor<bf16, L, j_>;
    const auto xf = mt::cast<float>(x);
    const auto sm = mt::gather_all(mt::softmax<j_>(x));
    const auto smf = mt::gather_all(mt::softmax<j_>(xf));
    // Three roundings to bf16 (each exponential kept, the row's sum, the quotient), each within
    // 2^-8 of the value.
    for (std::size_t n = 0; n < sm.size(); ++n) REQUIRE(std::abs(float(sm[n]) - smf[n]) <= 3 * 0x1p-8f * smf[n] + 1e-30f);
    const auto scale = mt::full<S>(g, {J}, bf16(1.5f)), bias = mt::full<S>(g, {J}, bf16(0.25f));
    if constexpr (L::template split_of<j_>().count == 0) {
      const auto ln = mt::gather_all(nn::layer_norm<j_>(x, scale, bias));
      const auto lnf = mt::gather_all(nn::layer_norm<j_>(xf, mt::cast<float>(scale), mt::cast<float>(bias)));
      for (std::size_t n = 0; n < ln.size(); ++n)
        REQUIRE(std::abs(float(ln[n]) - lnf[n]) <= 0x1p-7f * std::abs(lnf[n]) + 1e-3f);
    }
  }

  {
    INFO("max propagates NaN across processors");
    std::vector<bf16> h = xh;
    h[2 * J + J - 1] = std::numeric_limits<bf16>::quiet_NaN();  // the last processor's part of j
    h[3 * J + 0] = std::numeric_limits<float>::infinity();
    const auto m = mt::gather_all(mt::reduce_max<j_>(mt::from_host<X>(g, {I, J}, std::span<const bf16>(h))));
    REQUIRE(std::isnan(float(m[2])));
    REQUIRE(std::isinf(float(m[3])));
    REQUIRE(float(m[0]) == 1.0f);
  }

  {
    INFO("gradients reach float master weights through cast, written into the float gradient by the product");
    // loss = sum(cast<float>(einsum(cast<bf16>(w), y2))): d loss / d w[i][j] = sum_k y2[j][k]. Each
    // row of y2 sums to a value exact in float that bf16 would round (1 + 2^-8 is a tie, rounded
    // to 1): the product writes the gradient into w's float buffer, never a bf16 gradient on the
    // way. A second microbatch's product adds into it (beta = 1), with no add kernel.
    std::vector<bf16> y2h(J * K, bf16(0.0f));
    for (std::int64_t j = 0; j < J; ++j) {
      y2h[j * K + 0] = 1.0f + float(j % 4) / 128;
      y2h[j * K + 1] = 0x1p-8f;
      y2h[j * K + 2] = float(j % 3) * 0x1p-10f;
    }
    const auto y2 = mt::from_host<Y>(g, {J, K}, std::span<const bf16>(y2h));
    auto w = mt::cast<float>(x);
    w.requires_grad();
    const auto loss_of = [&] { return mt::reduce_sum<i_, k_>(mt::cast<float>(mt::einsum<i_, k_>(mt::cast<bf16>(w), y2))); };
    const auto row_sum = [&](std::int64_t j) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k) s += float(y2h[j * K + k]);
      return float(s);
    };
    REQUIRE(row_sum(0) == 1.0f + 0x1p-8f);
    REQUIRE(float(bf16(row_sum(0))) == 1.0f);
    const auto [dw] = mt::gradient(loss_of(), w);
    STATIC_REQUIRE(std::is_same_v<typename std::remove_cvref_t<decltype(dw)>::value_type, float>);
    const auto dh = mt::gather_all(dw);
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t j = 0; j < J; ++j) {
        INFO("dw at " << i << ", " << j);
        REQUIRE(dh[i * J + j] == row_sum(j));
      }
    {
      const kernel_launches seen;
      mt::accumulate_gradient(loss_of(), w);
      mt::accumulate_gradient(loss_of(), w);
      CHECK(kernel_launches::count("meshtensor::grad_accumulate") == 0);
      CHECK(!kernel_launches::names.empty());  // the callback saw the passes' kernels
    }
    const auto [dw2] = mt::take_gradients(w);
    const auto dh2 = mt::gather_all(dw2);
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t j = 0; j < J; ++j) {
        INFO("two microbatches' dw at " << i << ", " << j);
        REQUIRE(dh2[i * J + j] == 2 * row_sum(j));
      }
    // A copy whose own gradient is asked for gets it (the product is not written past it into w's):
    // rounded to bf16 there, and w's through the cast.
    const auto wb = mt::cast<bf16>(w);
    const auto [dwb, dw_through] =
        mt::gradient(mt::reduce_sum<i_, k_>(mt::cast<float>(mt::einsum<i_, k_>(wb, y2))), wb, w);
    const auto dbh = mt::gather_all(dwb), dth = mt::gather_all(dw_through);
    for (std::int64_t i = 0; i < I; ++i)
      for (std::int64_t j = 0; j < J; ++j) {
        INFO("the copy's and w's gradients at " << i << ", " << j);
        REQUIRE(dbh[i * J + j].bits() == bf16(row_sum(j)).bits());
        REQUIRE(dth[i * J + j] == float(bf16(row_sum(j))));
      }
  }
}
}  // namespace

TEST_CASE("bf16 tensors under every layout of a line") {
  const auto g = world_line();
  for_each_type(line_layouts<line, i_, j_>{}, [&]<class L>() { check_layout<line, L>(g); });
}

TEST_CASE("bf16 tensors under every layout of a grid") {
  const auto g = world_grid();
  for_each_type(grid_layouts<i_, j_>{}, [&]<class L>() { check_layout<grid, L>(g); });
}

// A plan holds at a bf16 product's peak what the run holds. Where the product widens its operands
// and result to float in pool buffers (a CPU without oneDNN's bf16 kernels: this program's
// isa_avx2 run, or any AVX2 CPU), the plan counts those buffers too.
TEST_CASE("a bf16 product's planned peak is the run's") {
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<k_, c_>>;
  using A = mt::tensor<bf16, L, i_, j_>;
  using B = mt::tensor<bf16, L, j_, k_>;
  constexpr std::int64_t I = 40, J = 24, K = 36;
  std::int64_t measured = 0, planned = 0, result_bytes = 0;
  {
    const A a(g, {I, J});
    const B b(g, {J, K});
    const auto before = mt::memory_stats().bytes_in_use;
    mt::reset_peak_memory();
    const auto c = mt::einsum<i_, k_>(a, b);
    measured = mt::memory_stats().peak_bytes_in_use - before;
    result_bytes = c.local_size() * static_cast<std::int64_t>(sizeof(bf16));
  }
  {
    const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
    const A a(pm, {I, J});
    const B b(pm, {J, K});
    const auto before = mt::plan_report_of(pm).peak_bytes;
    const auto c = mt::einsum<i_, k_>(a, b);
    planned = mt::plan_report_of(pm).peak_bytes - before;
  }
  const bool widened = mt::kernels::widens_to_float<Kokkos::DefaultExecutionSpace, bf16>();
  INFO("widened to float: " << widened);
  REQUIRE(measured >= result_bytes);
  REQUIRE(planned == measured);
}
