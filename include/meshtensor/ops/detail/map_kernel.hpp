#pragma once
// A broadcasting elementwise kernel instantiated per (space, functor, element types) only, not per
// tensor type: operands carry their broadcast strides as values. The tensor-typed wrapper is host
// glue, so an op instantiated for many layouts emits one Kokkos kernel, not one per layout.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <utility>

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
};

// Where an operand's elements for one run of the output's last dim start, and their stride.
template <class T>
struct map_cursor {
  const T* p;
  std::int64_t off, step;
};
template <class T, class Mem>
KOKKOS_INLINE_FUNCTION map_cursor<T> cursor_at(const map_operand<T, Mem>& op, std::int64_t o, const kidx& ext, int r) {
  if (op.contiguous) return {op.v.data(), o, 1};
  return {op.v.data(), operand_offset(o, ext, op.stride, r), r > 0 ? op.stride[r - 1] : 0};
}
template <class TO, class F, class... TI>
KOKKOS_INLINE_FUNCTION void map_run(TO* out, std::int64_t len, const F& f, const map_cursor<TI>&... c) {
  if ((... && (c.step == 1)))  // the common case, written so that the compiler can vectorise it
    for (std::int64_t j = 0; j < len; ++j) out[j] = f(c.p[c.off + j]...);
  else
    for (std::int64_t j = 0; j < len; ++j) out[j] = f(c.p[c.off + j * c.step]...);
}

// The operands of one map, held by index: a device lambda may not capture a parameter pack's
// elements (nvcc), and std::tuple is not usable in device code everywhere.
template <std::size_t I, class Operand>
struct map_operand_slot {
  Operand operand;
};
template <class Seq, class... Operands>
struct map_operand_pack;
template <std::size_t... I, class... Operands>
struct map_operand_pack<std::index_sequence<I...>, Operands...> : map_operand_slot<I, Operands>... {};

// One work item per run of the output's last dim: the operands' offsets (a 64-bit division per
// dim) are computed once per run, not once per element, which made broadcasts and the
// permutations before and after einsum's products several times slower than a copy.
template <class F, class TO, class Mem, class... TI>
struct map_runs {
  TO* out;
  std::int64_t len;
  kidx ext;
  int r;
  F f;
  map_operand_pack<std::index_sequence_for<TI...>, map_operand<TI, Mem>...> ops;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t run) const { apply(run, std::index_sequence_for<TI...>{}); }
  template <std::size_t... I>
  KOKKOS_INLINE_FUNCTION void apply(std::int64_t run, std::index_sequence<I...>) const {
    const std::int64_t o = run * len;
    map_run(out + o, len, f,
            cursor_at(static_cast<const map_operand_slot<I, map_operand<TI, Mem>>&>(ops).operand, o, ext, r)...);
  }
};

template <class Exec, class F, class TO, class... TI>
void map_kernel(const Kokkos::View<TO*, typename Exec::memory_space>& out, const kidx& ext, int r, std::int64_t n, F f,
                const map_operand<TI, typename Exec::memory_space>&... ops) {
  if (n == 0 || skip_kernel()) return;
  using mem = typename Exec::memory_space;
  const std::int64_t len = r > 0 ? ext[r - 1] : 1;
  const map_runs<F, TO, mem, TI...> runs{out.data(), len, ext, r, f, {{ops}...}};
  Kokkos::parallel_for("meshtensor::map", Kokkos::RangePolicy<Exec>(0, n / len), runs);
}

struct identity_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T v) const {
    return v;
  }
};

// An operand of a map to Out, broadcast to Out's local extents ext. A function per (Out, Op), not
// a lambda inside map_to, which would be compiled again for every functor (compile time).
template <Tensor Out, Tensor Op>
map_operand<typename Op::value_type, typename Out::memory_space> map_operand_of(const Op& op, const kidx& ext) {
  const kidx s = broadcast_strides<Out>(op);
  return {op.view(), s, same_as_out(ext, s, static_cast<int>(Out::rank))};
}

// Out (of the given extents) with out(o) = f(ops(o)...), each operand broadcast along the dims it
// lacks. f is a named functor, not a lambda, so that every layout shares one kernel.
template <Tensor Out, class F, Tensor... Ops>
Out map_to(const typename Out::extents_type& extents, F f, const Ops&... ops) {
  Out out((ops.mesh(), ...), extents, uninitialized);
  const kidx ext = to_kidx<Out::rank>(out.local_extents());
  map_kernel<typename Out::execution_space>(out.view(), ext, static_cast<int>(Out::rank), out.local_size(), f,
                                            map_operand_of<Out>(ops, ext)...);
  return out;
}

}  // namespace meshtensor::detail
