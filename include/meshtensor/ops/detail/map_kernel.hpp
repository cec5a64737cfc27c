#pragma once
// A broadcasting elementwise kernel instantiated per (space, functor, element types) only, not per
// tensor type: operands carry their broadcast strides as values. The tensor-typed wrapper is host
// glue, so an op instantiated for many layouts emits one Kokkos kernel, not one per layout.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kernels.hpp"

namespace meshtensor::detail {

// Whether broadcast strides s over local extents ext (rank r) are ext's own row-major strides: the
// operand has the output's shape, and its offset is the output's flat index.
inline bool same_as_out(const kidx& ext, const kidx& s, int r) {
  std::int64_t stride = 1;
  for (int i = r - 1; i >= 0; --i) {
    if (ext[i] != 1 && s[i] != stride) return false;
    stride *= ext[i];
  }
  return true;
}

template <class T, class Mem>
struct map_operand {
  Kokkos::View<T*, Mem> v;
  kidx stride;
  bool contiguous;  // same shape as the output: skip the per-dim division of operand_offset
  KOKKOS_INLINE_FUNCTION T at(std::int64_t o, const kidx& ext, int r) const {
    return v(contiguous ? o : operand_offset(o, ext, stride, r));
  }
};

template <class Exec, class F, class TO, class... TI>
void map_kernel(const Kokkos::View<TO*, typename Exec::memory_space>& out, const kidx& ext, int r, std::int64_t n, F f,
                const map_operand<TI, typename Exec::memory_space>&... ops) {
  Kokkos::parallel_for(
      "meshtensor::map", Kokkos::RangePolicy<Exec>(0, n),
      KOKKOS_LAMBDA(std::int64_t o) { out(o) = f(ops.at(o, ext, r)...); });
  Exec{}.fence();
}

struct identity_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T v) const {
    return v;
  }
};

// Out (of the given extents) with out(o) = f(ops(o)...), each operand broadcast along the dims it
// lacks. f is a named functor, not a lambda, so that every layout shares one kernel.
template <Tensor Out, class F, Tensor... Ops>
Out map_to(const typename Out::extents_type& extents, F f, const Ops&... ops) {
  using mem = typename Out::memory_space;
  Out out((ops.mesh(), ...), extents);
  const kidx ext = to_kidx<Out::rank>(out.local_extents());
  constexpr int r = static_cast<int>(Out::rank);
  auto operand = [&](const auto& op) {
    const kidx s = broadcast_strides<Out>(op);
    return map_operand<typename std::remove_cvref_t<decltype(op)>::value_type, mem>{op.view(), s, same_as_out(ext, s, r)};
  };
  map_kernel<typename Out::execution_space>(out.view(), ext, r, out.local_size(), f, operand(ops)...);
  return out;
}

}  // namespace meshtensor::detail
