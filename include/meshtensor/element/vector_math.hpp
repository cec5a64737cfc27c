#pragma once
// float exp, log and tanh on the host as straight-line arithmetic: no call, no branch, so that a
// loop of them vectorises (kernels/map.hpp's runs, softmax's rows), where a call to libm's expf per
// element keeps a loop scalar (PyTorch's SLEEF kernels are vectorised).
//
// Cody and Waite's range reduction with Cephes's minimax polynomials (Moshier, "Methods and
// Programs for Mathematical Functions", 1989): within 1 ulp of the correctly rounded result over
// every float (tests/unit/vector_math_test.cpp checks that against double precision), with IEEE's
// special values (inf, NaN, signed zeros, subnormal inputs and results). Every operation is one
// IEEE operation, so a vectorised loop rounds as the scalar one does, on every ISA: the job's ranks
// agree bit for bit (kernels/map.hpp keeps contraction into FMA off where it picks a wider ISA).
// Device code keeps the GPU's own functions (element/kokkos_math.hpp).
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>

namespace meshtensor::detail::vector_math {

KOKKOS_FORCEINLINE_FUNCTION std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
KOKKOS_FORCEINLINE_FUNCTION float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// c ? a : b with both computed: a select on the bits, not a branch. g++ under -ftrapping-math (its
// default) keeps a conditional floating-point operation behind a branch, and a loop with a branch in
// it is not vectorised.
KOKKOS_FORCEINLINE_FUNCTION float select(bool c, float a, float b) {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return float_of((bits_of(a) & m) | (bits_of(b) & ~m));
}
// 2^n for n in [-126, 127], from its exponent bits.
KOKKOS_FORCEINLINE_FUNCTION float pow2(std::int32_t n) { return float_of(static_cast<std::uint32_t>(n + 127) << 23); }

KOKKOS_FORCEINLINE_FUNCTION float exp_float(float x) {
  constexpr float overflow = 88.72283935546875f;  // above: inf
  constexpr float underflow = -103.97208f;        // below: 0 (under half the smallest subnormal, 2^-150)
  const float xc = select(x > overflow, overflow, select(x >= underflow, x, underflow));  // NaN: a number (replaced below)
  // n = round(x / ln 2), x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts: n ln2_hi is exact).
  const float t = xc * 1.44269504088896341f;
  const std::int32_t n = static_cast<std::int32_t>(t + (t < 0.0f ? -0.5f : 0.5f));
  const float nf = static_cast<float>(n);
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * (r * r) + r) + 1.0f;
  // 2^n in two factors, so that n from -150 (subnormal results) to 128 stays representable.
  const std::int32_t half = n / 2;
  const float y = er * pow2(half) * pow2(n - half);
  return select(x != x, x, select(x > overflow, float_of(0x7f800000u), select(x < underflow, 0.0f, y)));
}

KOKKOS_FORCEINLINE_FUNCTION float log_float(float x) {
  // Subnormals scaled into the normal range first (2^23), the exponent corrected after.
  const bool tiny = x < 1.17549435e-38f;
  const float xs = select(tiny, x * 8388608.0f, x);
  const std::uint32_t u = bits_of(xs);
  std::int32_t e = static_cast<std::int32_t>((u >> 23) & 0xffu) - 127 - (tiny ? 23 : 0);
  float m = float_of((u & 0x007fffffu) | 0x3f800000u);  // in [1, 2)
  const bool high = m > 1.41421356f;                    // m in [sqrt(1/2), sqrt(2)) after this
  m = select(high, m * 0.5f, m);
  e += high ? 1 : 0;
  const float f = m - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float ef = static_cast<float>(e);
  float y = f * z * p;
  y = y + ef * -2.12194440e-4f;
  y = y - 0.5f * z;
  const float result = (f + y) + ef * 0.693359375f;
  const float nan = float_of(0x7fc00000u);
  return select(x != x, x,
                select(x < 0.0f, nan, select(x == 0.0f, float_of(0xff800000u), select(x == float_of(0x7f800000u), x, result))));
}

KOKKOS_FORCEINLINE_FUNCTION float tanh_float(float x) {
  const float ax = float_of(bits_of(x) & 0x7fffffffu);
  // Small |x|: an odd polynomial (1 - 2 / (e^2x + 1) would lose the low bits to cancellation).
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = select(x == 0.0f, x, p * z * x + x);  // tanh(-0) is -0
  const float large = 1.0f - 2.0f / (exp_float(ax + ax) + 1.0f);  // e^2|x| = inf past 44: gives 1
  const float signed_large = float_of(bits_of(large) | (bits_of(x) & 0x80000000u));
  return select(ax < 0.625f, small, signed_large);  // NaN: the large form, NaN through exp
}

}  // namespace meshtensor::detail::vector_math
