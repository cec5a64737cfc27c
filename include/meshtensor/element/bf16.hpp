#pragma once
// bf16: bfloat16, float's sign and 8-bit exponent with a 7-bit mantissa, stored in 16 bits.
// Arithmetic is float's: a bf16 converts implicitly to float, so `a * b + c` on bf16 values is
// computed in float and rounded once where it is stored into a bf16. Kernels that accumulate
// (sums, products, the row kernels of softmax and layer norm) accumulate in compute_t<T>, float
// for bf16 (docs/design/training.md, "Mixed precision").
//
// Why a class of our own and not __nv_bfloat16 or OpenBLAS's bfloat16 (a uint16_t typedef): the
// same type on host and device, in every backend, with the conversion to float a shift (exact) and
// the conversion from float rounding to nearest even as every bf16 hardware unit does; its bits
// are those of __nv_bfloat16, so cuBLAS reads it in place.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace meshtensor {

class bf16 {
 public:
  bf16() = default;
  // Rounds to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinite, floats
  // above bf16's largest finite value round to infinity.
  KOKKOS_INLINE_FUNCTION bf16(float v) : bits_(round_to_bits(v)) {}  // NOLINT: implicit, as float's own conversions

  KOKKOS_INLINE_FUNCTION operator float() const {  // NOLINT: exact, so implicit
    const std::uint32_t u = static_cast<std::uint32_t>(bits_) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  KOKKOS_INLINE_FUNCTION static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 x{};
    x.bits_ = b;
    return x;
  }
  KOKKOS_INLINE_FUNCTION constexpr std::uint16_t bits() const { return bits_; }

  // Compound assignments compute in float and round once (built-in ones would need a float&).
  KOKKOS_INLINE_FUNCTION bf16& operator+=(float v) { return *this = bf16(float(*this) + v); }
  KOKKOS_INLINE_FUNCTION bf16& operator-=(float v) { return *this = bf16(float(*this) - v); }
  KOKKOS_INLINE_FUNCTION bf16& operator*=(float v) { return *this = bf16(float(*this) * v); }
  KOKKOS_INLINE_FUNCTION bf16& operator/=(float v) { return *this = bf16(float(*this) / v); }

 private:
  KOKKOS_INLINE_FUNCTION static std::uint16_t round_to_bits(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN, quieted
    u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even; carries into the exponent where it must
    return static_cast<std::uint16_t>(u >> 16);
  }
  std::uint16_t bits_;
};
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

// Floating-point element types: float, double and bf16 (std::is_floating_point_v is false for a
// class, and a gradient gated on it would be cut silently).
template <class T>
inline constexpr bool is_real_v = std::is_floating_point_v<T> || std::is_same_v<T, bf16>;

// The type kernels compute and accumulate in for elements of T.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

namespace detail {
// *p += v, atomically: Kokkos 3.4 has no 16-bit atomics, so a compare-and-swap of the aligned
// 32-bit word that holds *p (its other half written back unchanged). Kokkos's allocations are
// aligned and padded past 4 bytes, so the word lies inside the allocation.
KOKKOS_INLINE_FUNCTION void atomic_add(bf16* p, float v) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto* word = reinterpret_cast<unsigned int*>(address & ~std::uintptr_t{3});
  const unsigned shift = (address & 2u) ? 16u : 0u;  // little-endian: the upper half at +2
  unsigned int seen = *word, assumed;
  do {
    assumed = seen;
    const auto bits = static_cast<std::uint16_t>(assumed >> shift);
    const unsigned int sum = bf16(float(bf16::from_bits(bits)) + v).bits();
    seen = Kokkos::atomic_compare_exchange(word, assumed, (assumed & ~(0xffffu << shift)) | (sum << shift));
  } while (seen != assumed);
}
}  // namespace detail

}  // namespace meshtensor

template <>
class std::numeric_limits<meshtensor::bf16> {
  using bf16 = meshtensor::bf16;

 public:
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 8;
  static constexpr int radix = 2;
  static constexpr bf16 min() noexcept { return bf16::from_bits(0x0080); }
  static constexpr bf16 max() noexcept { return bf16::from_bits(0x7f7f); }
  static constexpr bf16 lowest() noexcept { return bf16::from_bits(0xff7f); }
  static constexpr bf16 epsilon() noexcept { return bf16::from_bits(0x3c00); }  // 2^-7
  static constexpr bf16 infinity() noexcept { return bf16::from_bits(0x7f80); }
  static constexpr bf16 quiet_NaN() noexcept { return bf16::from_bits(0x7fc0); }
};

// Kokkos's reductions (Kokkos::Sum, Max, Min and our NaN-propagating reducer) ask for identities.
template <>
struct Kokkos::reduction_identity<meshtensor::bf16> {
  using bf16 = meshtensor::bf16;
  KOKKOS_FORCEINLINE_FUNCTION constexpr static bf16 sum() { return bf16::from_bits(0); }
  KOKKOS_FORCEINLINE_FUNCTION constexpr static bf16 prod() { return bf16::from_bits(0x3f80); }
  KOKKOS_FORCEINLINE_FUNCTION constexpr static bf16 max() { return bf16::from_bits(0xff80); }  // -inf
  KOKKOS_FORCEINLINE_FUNCTION constexpr static bf16 min() { return bf16::from_bits(0x7f80); }  // +inf
};
