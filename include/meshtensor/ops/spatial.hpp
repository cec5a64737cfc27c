#pragma once
// Spatial dims: spatial<D, K> names an input's spatial dim D and the dim K of a window's taps; the
// result types of unfold and fold, the checks of a spatial pair (compile errors that name the dim),
// and the halo schedule of every spatial dim under a layout (geometry/window.hpp's schedule_halo,
// per dim). Shared by unfold/fold (ops/unfold.hpp) and the convolutions (nn/conv.hpp).
#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

#include "../geometry/window.hpp"
#include "detail/op_support.hpp"

namespace meshtensor {

// Spatial dim D of the input, and K: the dim of a window's taps in unfold's result.
template <Dim D, Dim K>
struct spatial {
  using dim = D;
  using window_dim = K;
};

namespace diagnostic {
template <class D>
struct unfold_spatial_dim_not_in_input {
  static_assert(sizeof(D) == 0, "meshtensor: unfold/fold: a spatial dim is not a dim of the input");
};
template <class K>
struct unfold_window_dim_already_in_input {
  static_assert(sizeof(K) == 0, "meshtensor: unfold: a window dim is already a dim of the input");
};
template <class K>
struct unfold_window_dim_split {
  static_assert(sizeof(K) == 0,
                "meshtensor: unfold/fold: a window dim is split by the layout; windows are a few taps: keep "
                "the window dim whole");
};
}  // namespace diagnostic

// One window per spatial dim: the type of unfold's and conv's window parameters, one per S.
template <class>
using window_for = window;

namespace detail {

template <class S>
struct is_spatial : std::false_type {};
template <class D, class K>
struct is_spatial<spatial<D, K>> : std::true_type {};

// unfold's result: x's dims up to its last spatial dim, the window dims, then x's other dims (so
// that with channels last, each tap is a contiguous run of channels and conv's product is one
// GEMM with no permutation). fold's result: the columns without the window dims.
template <class List, std::size_t From, class Seq>
struct pick_list;
template <class... Ts, std::size_t From, std::size_t... I>
struct pick_list<type_list<Ts...>, From, std::index_sequence<I...>> {
  using type = type_list<std::tuple_element_t<From + I, std::tuple<Ts...>>...>;
};
template <class A, class B, class C>
struct join3_lists;
template <class... A, class... B, class... C>
struct join3_lists<type_list<A...>, type_list<B...>, type_list<C...>> {
  using type = type_list<A..., B..., C...>;
};
// Number of x's dims up to and including its last spatial dim.
template <Tensor X, class... S>
inline constexpr std::size_t spatial_prefix_v = std::max({X::template index_of<typename S::dim>()...}) + 1;
template <Tensor X, class... S>
using unfolded_dims_t = typename join3_lists<
    typename pick_list<typename X::dims, 0, std::make_index_sequence<spatial_prefix_v<X, S...>>>::type,
    type_list<typename S::window_dim...>,
    typename pick_list<typename X::dims, spatial_prefix_v<X, S...>,
                       std::make_index_sequence<X::rank - spatial_prefix_v<X, S...>>>::type>::type;
template <Tensor X, class... S>
using unfolded_t = with_dims_t<X, unfolded_dims_t<X, S...>>;
template <Tensor Cols, class... S>
using folded_t = with_dims_t<Cols, difference_t<typename Cols::dims, type_list<typename S::window_dim...>>>;

template <Tensor X, class S>
constexpr bool check_spatial() {
  static_assert(is_spatial<S>::value, "meshtensor: unfold/fold take spatial<D, K> pairs: spatial dim, window dim");
  if constexpr (!contains_v<typename S::dim, typename X::dims>)
    (void)diagnostic::unfold_spatial_dim_not_in_input<typename S::dim>{};
  else if constexpr (contains_v<typename S::window_dim, typename X::dims>)
    (void)diagnostic::unfold_window_dim_already_in_input<typename S::window_dim>{};
  else if constexpr (X::layout_type::template split_of<typename S::window_dim>().count != 0)
    (void)diagnostic::unfold_window_dim_split<typename S::window_dim>{};
  return true;
}
// A constant, so that the check runs where it is named (a function body's instantiation may be
// deferred, and another error would come first).
template <Tensor X, class S>
inline constexpr bool spatial_checked_v = check_spatial<X, S>();

// The halo schedule of every spatial dim of an input with these extents under X's layout
// (geometry/window.hpp's schedule_halo, per dim).
template <Tensor X, class... S>
std::array<halo_dim, sizeof...(S)> schedule_halos(const char* op, const typename X::mesh_type& mesh,
                                                  const typename X::extents_type& extents,
                                                  const std::array<window, sizeof...(S)>& windows) {
  constexpr std::array<std::size_t, sizeof...(S)> index{X::template index_of<typename S::dim>()...};
  constexpr std::array<dim_split, sizeof...(S)> splits{X::layout_type::template split_of<typename S::dim>()...};
  constexpr std::array<std::string_view, sizeof...(S)> names{S::dim::name()...};
  std::array<halo_dim, sizeof...(S)> halos{};
  const auto& comm = mesh.communicator();
  for (std::size_t j = 0; j < sizeof...(S); ++j)
    halos[j] = schedule_halo(index[j], splits[j], geometry_of(op, names[j], extents[index[j]], windows[j]), comm.shape(),
                             comm.coords());
  return halos;
}

}  // namespace detail
}  // namespace meshtensor
