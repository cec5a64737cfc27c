#pragma once
// Device-callable math from whichever Kokkos is in use. Kokkos 3.4 (Debian's) has these only in
// Kokkos::Experimental; 3.6 added them to Kokkos:: and 4.3 removed the Experimental ones. The
// numeric traits (infinity) stay in Kokkos::Experimental in every version.
// kmath::vectorised holds exp, log and tanh for the elementwise maps: float on the host is
// meshtensor's own there (element/vector_math.hpp: a loop of them vectorises, libm's calls do not),
// and bf16 reaches it through its conversion to float. The row kernels keep libm's (a scalar loop,
// where its expf is the faster), except softmax's float rows on the host, whose exponentials are
// taken as a map's run (kernels/rows.hpp, shifted_exp).
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "bf16.hpp"
#include "vector_math.hpp"

namespace meshtensor::kmath {
#if KOKKOS_VERSION >= 30600
namespace kokkos_math = Kokkos;
#else
namespace kokkos_math = Kokkos::Experimental;
#endif
using kokkos_math::cos;
using kokkos_math::exp;
using kokkos_math::fabs;
using kokkos_math::log;
using kokkos_math::pow;
using kokkos_math::sin;
using kokkos_math::sqrt;
using kokkos_math::tanh;

namespace vectorised {

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
#define MESHTENSOR_KMATH_FLOAT(NAME) \
  KOKKOS_INLINE_FUNCTION float NAME(float x) { return kokkos_math::NAME(x); }
#else
#define MESHTENSOR_KMATH_FLOAT(NAME) \
  KOKKOS_FORCEINLINE_FUNCTION float NAME(float x) { return detail::vector_math::NAME##_float(x); }
#endif
#define MESHTENSOR_KMATH(NAME)                                                                   \
  MESHTENSOR_KMATH_FLOAT(NAME)                                                                   \
  template <class T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, float>, int> = 0> \
  KOKKOS_INLINE_FUNCTION auto NAME(T x) {                                                        \
    return kokkos_math::NAME(x);                                                                 \
  }
MESHTENSOR_KMATH(exp)
MESHTENSOR_KMATH(log)
MESHTENSOR_KMATH(tanh)
#undef MESHTENSOR_KMATH
#undef MESHTENSOR_KMATH_FLOAT
}  // namespace vectorised

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16::from_bits(0x7f80);
  else
    return Kokkos::Experimental::infinity<T>::value;
}
}  // namespace meshtensor::kmath
