#pragma once
// Device-callable math from whichever Kokkos is in use. Kokkos 3.4 (Debian's) has these only in
// Kokkos::Experimental; 3.6 added them to Kokkos:: and 4.3 removed the Experimental ones. The
// numeric traits (infinity) stay in Kokkos::Experimental in every version.
#include <Kokkos_Core.hpp>

#include "bf16.hpp"

namespace meshtensor::kmath {
#if KOKKOS_VERSION >= 30600
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T infinity() {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16::from_bits(0x7f80);
  else
    return Kokkos::Experimental::infinity<T>::value;
}
}  // namespace meshtensor::kmath
