#pragma once
// Shared pieces of op kernels: result types, extent checks, broadcasting index maps.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "../../autodiff/tape.hpp"
#include "../../kernels/indexing.hpp"
#include "../../tensor/tensor.hpp"
#include "../op_call.hpp"

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
template <class Out, class In>
inline constexpr auto positions_in_v = positions_in<Out, In>();

// Two operands of one op must agree on the extent of every dim they share (dim i of a at pos[i] of
// b); the message names it. The check is compiled once; the wrapper below passes positions.
inline void check_shared_extents_at(const char* op, std::span<const std::size_t> pos, std::span<const std::int64_t> a_ext,
                                    std::span<const std::int64_t> b_ext, std::span<const std::string_view> a_dims,
                                    std::string (*a_type)(), std::string (*b_type)()) {
  for (std::size_t i = 0; i != pos.size(); ++i)
    if (found_at(pos[i], b_ext.size()) && a_ext[i] != b_ext[pos[i]])
      throw shape_error(cat(op, ": dim '", a_dims[i], "' has extent ", a_ext[i], " in ", a_type(), " but ",
                            b_ext[pos[i]], " in ", b_type()));
}
template <Tensor A, Tensor B>
void check_shared_extents(const char* op, const A& a, const B& b) {
  check_shared_extents_at(op, positions_in_v<A, B>, a.extents(), b.extents(), A::dim_name_views, &A::type_name,
                          &B::type_name);
}

// Where each of Out's dims is first found among the operands Ops: {operand, position in it}, or
// {sizeof...(Ops), 0} where none has it (its extent stays 0).
struct extent_source {
  std::uint32_t operand, position;
};
template <class Out, class... Ops>
constexpr std::array<extent_source, Out::rank> extent_sources() {
  std::array<extent_source, Out::rank> src{};
  src.fill({sizeof...(Ops), 0});
  std::size_t k = 0;
  (
      [&] {
        constexpr auto pos = positions_in_v<Out, Ops>;
        for (std::size_t i = 0; i != Out::rank; ++i)
          if (src[i].operand == sizeof...(Ops) && pos[i] != Ops::rank)
            src[i] = {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(pos[i])};
        ++k;
      }(),
      ...);
  return src;
}
template <class Out, class... Ops>
inline constexpr auto extent_sources_v = extent_sources<Out, Ops...>();

// e[i] = the extent src[i] names; operand extents by pointer (the typed wrapper below only passes
// them and the table, so the loop is compiled once: compile time).
inline void gather_extents(std::int64_t* e, std::size_t rank, const extent_source* src,
                           const std::int64_t* const* operand_extents, std::size_t n_operands) {
  for (std::size_t i = 0; i != rank; ++i)
    if (src[i].operand != n_operands) e[i] = operand_extents[src[i].operand][src[i].position];
}

// Extents of Out's dims, each taken from the first operand that has it.
template <Tensor Out, Tensor... Ops>
typename Out::extents_type result_extents(const Ops&... ops) {
  typename Out::extents_type e{};
  const std::int64_t* const operand_extents[] = {ops.extents().data()..., nullptr};
  gather_extents(e.data(), Out::rank, extent_sources_v<Out, Ops...>.data(), operand_extents, sizeof...(Ops));
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
