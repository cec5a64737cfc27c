#pragma once
// Shared pieces of op kernels: result types, extent checks, broadcasting index maps.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <string>

#include "../../autodiff/tape.hpp"
#include "../../tensor/indexing.hpp"
#include "../../tensor/tensor.hpp"

namespace meshtensor {

namespace diagnostic {
template <class TensorA, class TensorB>
struct operands_differ_in_layout {
  static_assert(sizeof(TensorA) == 0,
                "meshtensor: the operands of an op must share element type, layout and execution space; "
                "convert one with cast<> or relayout<> first");
};
}  // namespace diagnostic

namespace detail {

inline constexpr int max_rank = 8;
using kidx = Kokkos::Array<std::int64_t, max_rank>;

// The tensor type with the same element type, layout and space as TT, over the dims of a list.
template <class TT, class DimList>
struct with_dims;
template <class T, class L, class E, class... Old, class... New>
struct with_dims<basic_tensor<T, L, E, Old...>, type_list<New...>> {
  using type = basic_tensor<T, L, E, New...>;
};
template <class TT, class DimList>
using with_dims_t = typename with_dims<TT, DimList>::type;

template <class A, class B>
constexpr void require_same_layout() {
  using a_base = with_dims_t<A, type_list<>>;
  using b_base = with_dims_t<B, type_list<>>;
  if constexpr (!std::is_same_v<a_base, b_base>) (void)sizeof(diagnostic::operands_differ_in_layout<A, B>);
}

// Where each dim of Out sits in In (In::rank when In lacks it).
template <class Out, class In>
constexpr auto positions_in() {
  return []<class... Ds>(type_list<Ds...>) {
    return std::array<std::size_t, sizeof...(Ds)>{index_of_v<Ds, typename In::dims>...};
  }(typename Out::dims{});
}

// Local strides of In, seen from the local multi-index of Out: 0 along dims In lacks (broadcast).
template <class Out, class In>
kidx broadcast_strides(const In& in) {
  constexpr auto pos = positions_in<Out, In>();
  const auto strides = row_major_strides<In::rank>(in.local_extents());
  kidx s{};
  for (std::size_t i = 0; i != Out::rank; ++i) s[i] = found_at(pos[i], In::rank) ? strides[pos[i]] : 0;
  return s;
}

template <std::size_t R>
kidx to_kidx(const std::array<std::int64_t, R>& a) {
  kidx r{};
  for (std::size_t i = 0; i != R; ++i) r[i] = a[i];
  return r;
}

// Offset of local flat index l of a tensor with local extents ext (rank r) in an operand with
// broadcast strides s.
KOKKOS_INLINE_FUNCTION std::int64_t operand_offset(std::int64_t l, const kidx& ext, const kidx& s, int r) {
  std::int64_t off = 0;
  for (int i = r - 1; i >= 0; --i) {
    off += (l % ext[i]) * s[i];
    l /= ext[i];
  }
  return off;
}

// Two operands of one op must agree on the extent of every dim they share; the message names it.
template <Tensor A, Tensor B>
void check_shared_extents(const char* op, const A& a, const B& b) {
  constexpr auto pos = positions_in<A, B>();
  const auto names = A::dim_names();
  for (std::size_t i = 0; i != A::rank; ++i)
    if (found_at(pos[i], B::rank) && a.extents()[i] != b.extents()[pos[i]])
      throw shape_error(cat(op, ": dim '", names[i], "' has extent ", a.extents()[i], " in ", A::type_name(),
                            " but ", b.extents()[pos[i]], " in ", B::type_name()));
}

// Extents of Out's dims, each taken from the first operand that has it.
template <Tensor Out, Tensor A, Tensor... More>
typename Out::extents_type result_extents(const A& a, const More&... more) {
  typename Out::extents_type e{};
  constexpr auto pa = positions_in<Out, A>();
  for (std::size_t i = 0; i != Out::rank; ++i) {
    if (found_at(pa[i], A::rank)) {
      e[i] = a.extents()[pa[i]];
      continue;
    }
    bool found = false;
    (
        [&] {
          constexpr auto pm = positions_in<Out, More>();
          if (!found && found_at(pm[i], More::rank)) {
            e[i] = more.extents()[pm[i]];
            found = true;
          }
        }(),
        ...);
  }
  return e;
}

// Mask of the mesh axes that the dims in List (those of TT that are split) are split over.
template <class TT, class List>
constexpr unsigned axes_mask_of() {
  return []<class... Ds>(type_list<Ds...>) {
    return (TT::layout_type::template split_of<Ds>().mask() | ... | 0u);
  }(List{});
}

}  // namespace detail
}  // namespace meshtensor
