#pragma once
// A tensor's local data seen as rows [outer, n, inner] around one dim (kernels/rows.hpp's shape):
// rows begin .. begin + count of each of the outer runs copied out into a contiguous
// [outer, count, inner], or a contiguous [outer, count, inner] copied in over them. The parts of a
// sequence that a ring passes around (ring attention's query chunks, einsum_gathered's and
// einsum_scattered's parts) are these.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "launch.hpp"

namespace meshtensor::detail {

template <class Exec, class V>
void copy_rows_out(const V& x, std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t begin,
                   std::int64_t count, const V& to) {
  const std::int64_t per = count * inner;
  kernels::parallel_for(
      "meshtensor::copy_rows_out", kernels::range<Exec>(0, outer * per),
      KOKKOS_LAMBDA(std::int64_t e) { to(e) = x((e / per * n + begin) * inner + e % per); });
}

template <class Exec, class V>
void copy_rows_in(const V& chunk, std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t begin,
                  std::int64_t count, const V& dst) {
  const std::int64_t per = count * inner;
  kernels::parallel_for(
      "meshtensor::copy_rows_in", kernels::range<Exec>(0, outer * per),
      KOKKOS_LAMBDA(std::int64_t e) { dst((e / per * n + begin) * inner + e % per) = chunk(e); });
}

}  // namespace meshtensor::detail
