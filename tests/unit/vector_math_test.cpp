// The host's float exp, log and tanh (element/vector_math.hpp): within 1 ulp of the correctly
// rounded value over a sweep of every float range, IEEE's special values kept; and the map kernel's
// ISA clones (kernels/map.hpp) giving the baseline's bits, for the plain functions and for those
// built from them (sigmoid, GeLU, SiLU and their gradients). Compiled with optimisation
// (tests/CMakeLists.txt), where the clones exist; at -O0 there is only the baseline.
#include <catch2/catch_test_macros.hpp>
#include <meshtensor/element/vector_math.hpp>
#include <meshtensor/kernels/map.hpp>
#include <meshtensor/ops/elementwise.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace mt = meshtensor;
namespace vm = meshtensor::detail::vector_math;

namespace {

// Floats ordered as integers, so that the difference of two is their distance in ulp.
std::int64_t ordered(float x) {
  const auto u = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(x));
  return u < 0 ? std::int64_t{std::numeric_limits<std::int32_t>::min()} - u : u;
}
std::int64_t ulp_distance(float a, float b) {
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Every 2003rd float bit pattern of both signs (about 2.1 million values), NaNs left out.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 2003) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    if (!std::isnan(x)) xs.push_back(x);
  }
  return xs;
}

template <class F, class Reference>
void within_1_ulp(const char* name, F f, Reference reference) {
  std::int64_t worst = 0;
  float worst_at = 0;
  for (const float x : sweep()) {
    const double want = reference(static_cast<double>(x));
    if (std::isnan(want)) {
      if (!std::isnan(f(x))) FAIL(name << "(" << x << ") = " << f(x) << ", not NaN");
      continue;
    }
    const std::int64_t d = ulp_distance(f(x), static_cast<float>(want));
    if (d > worst) worst = d, worst_at = x;
  }
  INFO(name << ": worst " << worst << " ulp, at " << worst_at);
  CHECK(worst <= 1);
}

}  // namespace

TEST_CASE("vector_math: exp, log and tanh within 1 ulp of the correctly rounded value", "[vector_math]") {
  within_1_ulp("exp", [](float x) { return vm::exp_float(x); }, [](double x) { return std::exp(x); });
  within_1_ulp("log", [](float x) { return vm::log_float(x); }, [](double x) { return std::log(x); });
  within_1_ulp("tanh", [](float x) { return vm::tanh_float(x); }, [](double x) { return std::tanh(x); });
}

TEST_CASE("vector_math: IEEE's special values", "[vector_math]") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(vm::exp_float(inf) == inf);
  CHECK(vm::exp_float(-inf) == 0.0f);
  CHECK(vm::exp_float(88.8f) == inf);
  CHECK(vm::exp_float(0.0f) == 1.0f);
  CHECK(vm::exp_float(-0.0f) == 1.0f);
  CHECK(std::isnan(vm::exp_float(nan)));
  CHECK(vm::exp_float(-100.0f) > 0.0f);  // a subnormal result, not flushed
  CHECK(vm::exp_float(-104.0f) == 0.0f);
  CHECK(vm::log_float(1.0f) == 0.0f);
  CHECK(vm::log_float(0.0f) == -inf);
  CHECK(vm::log_float(-0.0f) == -inf);
  CHECK(std::isnan(vm::log_float(-1.0f)));
  CHECK(std::isnan(vm::log_float(-inf)));
  CHECK(std::isnan(vm::log_float(nan)));
  CHECK(vm::log_float(inf) == inf);
  CHECK(vm::log_float(std::numeric_limits<float>::denorm_min()) == std::log(std::numeric_limits<float>::denorm_min()));
  CHECK(vm::tanh_float(inf) == 1.0f);
  CHECK(vm::tanh_float(-inf) == -1.0f);
  CHECK(vm::tanh_float(50.0f) == 1.0f);
  CHECK(std::signbit(vm::tanh_float(-0.0f)));
  CHECK(std::isnan(vm::tanh_float(nan)));
}

namespace {

// The map kernel's run at one ISA: out = f(x) over every x.
template <class T, class F>
std::vector<T> run_at(mt::detail::map_isa isa, F f, const std::vector<T>& xs) {
  std::vector<T> out(xs.size());
  const mt::detail::map_cursor<T> c{xs.data(), 0, 1};
  mt::detail::map_run(out.data(), static_cast<std::int64_t>(xs.size()), f, isa, c);
  return out;
}

template <class T, class F>
void clones_agree(const std::string& name, F f) {
  std::vector<T> xs;
  for (const float x : sweep())
    if (std::abs(x) < 200.0f) xs.push_back(static_cast<T>(x));
  const auto baseline = run_at(mt::detail::map_isa::baseline, f, xs);
  const mt::cpu_isa_level here = mt::cpu_isa().this_cpu;
  for (const auto isa : {mt::detail::map_isa::avx2, mt::detail::map_isa::avx512}) {
    if (isa == mt::detail::map_isa::avx2 && here < mt::cpu_isa_level::avx2) continue;
    if (isa == mt::detail::map_isa::avx512 && here < mt::cpu_isa_level::avx512_core) continue;
    const auto wide = run_at(isa, f, xs);
    std::size_t differ = 0, first = 0;
    for (std::size_t i = 0; i < xs.size(); ++i)
      if (std::bit_cast<std::uint32_t>(static_cast<float>(wide[i])) !=
          std::bit_cast<std::uint32_t>(static_cast<float>(baseline[i])))
        if (differ++ == 0) first = i;
    INFO(name << " at " << (isa == mt::detail::map_isa::avx2 ? "AVX2" : "AVX-512") << ": " << differ << " of "
              << xs.size() << " differ from the baseline, first at x = " << static_cast<float>(xs[first]));
    CHECK(differ == 0);
  }
}

template <class Fn>
struct forward {
  template <class T>
  T operator()(T x) const {
    return Fn::f(x);
  }
};
template <class Fn>
struct derivative {  // df(x, f(x)): what the gradient rules multiply by
  template <class T>
  T operator()(T x) const {
    return Fn::df(x, Fn::f(x));
  }
};

template <class T>
void every_function_agrees() {
  namespace fn = mt::fn;
  clones_agree<T>("exp", forward<fn::exp_fn>{});
  clones_agree<T>("log", forward<fn::log_fn>{});
  clones_agree<T>("tanh", forward<fn::tanh_fn>{});
  clones_agree<T>("sigmoid", forward<fn::sigmoid_fn>{});
  clones_agree<T>("gelu", forward<fn::gelu_fn>{});
  clones_agree<T>("silu", forward<fn::silu_fn>{});
  clones_agree<T>("gelu'", derivative<fn::gelu_fn>{});
  clones_agree<T>("silu'", derivative<fn::silu_fn>{});
  clones_agree<T>("x * y + 1", [](T x) { return static_cast<T>(static_cast<float>(x) * 1.5f + 1.0f); });
}

}  // namespace

TEST_CASE("map: every ISA's clone gives the baseline's bits (float and bf16)", "[vector_math]") {
  every_function_agrees<float>();
  every_function_agrees<mt::bf16>();
}
