#pragma once
// Dimension and axis names as types, and the type-level set algebra the layout rules need.
#include <boost/hana/concat.hpp>
#include <boost/hana/contains.hpp>
#include <boost/hana/filter.hpp>
#include <boost/hana/not.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "fixed_string.hpp"

namespace meshtensor {

// Users derive strong types from these so that compiler messages print `batch`, not the string:
//   struct batch : meshtensor::dim<"batch"> {};
template <fixed_string Name>
struct dim {
  static constexpr std::string_view name() { return Name.view(); }
  using meshtensor_dim_tag = void;
};

template <fixed_string Name>
struct axis {
  static constexpr std::string_view name() { return Name.view(); }
  using meshtensor_axis_tag = void;
};

template <class T>
concept Dim = requires { typename T::meshtensor_dim_tag; T::name(); };
template <class T>
concept Axis = requires { typename T::meshtensor_axis_tag; T::name(); };

namespace diagnostic {
template <class Name>
struct axis_used_as_dim {
  static_assert(sizeof(Name) == 0,
                "meshtensor: a mesh axis (declared with axis<>) is used as a tensor dim; declare the dim "
                "with dim<\"name\"> and split it over the axis in the layout");
};
template <class Name>
struct not_a_dim {
  static_assert(sizeof(Name) == 0,
                "meshtensor: a tensor dim must derive from dim<\"name\">, as in "
                "struct batch : meshtensor::dim<\"batch\"> {};");
};
}  // namespace diagnostic

namespace detail {
// Dim<T>, but a type that is not a dim is a compile error naming it, where a bare concept failure
// would not say what to change. For tensor type heads (TensorDim), never for overloads.
template <class T>
consteval bool dim_or_diagnose() {
  if constexpr (Axis<T>)
    (void)sizeof(diagnostic::axis_used_as_dim<T>);
  else if constexpr (!Dim<T>)
    (void)sizeof(diagnostic::not_a_dim<T>);
  return Dim<T>;
}
}  // namespace detail
template <class T>
concept TensorDim = detail::dim_or_diagnose<T>();

// A pack of names. Membership and position use fold expressions (cheap); union and difference use
// Hana once per op type, where order matters and readability wins.
template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

template <class T, class List>
inline constexpr bool contains_v = false;
template <class T, class... Ts>
inline constexpr bool contains_v<T, type_list<Ts...>> = (std::is_same_v<T, Ts> || ...);

// How many times T appears in the list.
template <class T, class List>
inline constexpr std::size_t count_v = 0;
template <class T, class... Ts>
inline constexpr std::size_t count_v<T, type_list<Ts...>> = (std::size_t{std::is_same_v<T, Ts>} + ... + 0);

namespace detail {
template <class T, class... Ts>
consteval std::size_t index_of_impl() {
  constexpr bool hits[] = {std::is_same_v<T, Ts>..., false};
  for (std::size_t i = 0; i != sizeof...(Ts); ++i)
    if (hits[i]) return i;
  return sizeof...(Ts);
}
template <class List>
struct as_hana;
template <class... Ts>
struct as_hana<type_list<Ts...>> {
  static constexpr auto value = boost::hana::tuple_t<Ts...>;
};
template <class... Ts>
constexpr type_list<typename Ts::type...> to_list(boost::hana::tuple<Ts...>) {
  return {};
}
template <class HanaTuple>
using from_hana = decltype(to_list(HanaTuple{}));
// Predicate for hana::filter: true for types absent from List. A named function object, not a
// lambda: lambdas in alias templates make g++ 12 crash.
template <class List>
struct absent_from {
  template <class T>
  constexpr auto operator()(T t) const {
    return boost::hana::not_(boost::hana::contains(as_hana<List>::value, t));
  }
};
}  // namespace detail

// Position of T in the list, or the list's size when absent.
template <class T, class List>
inline constexpr std::size_t index_of_v = 0;
template <class T, class... Ts>
inline constexpr std::size_t index_of_v<T, type_list<Ts...>> = detail::index_of_impl<T, Ts...>();

// Whether an index_of_v result is a position in a list of `size` elements. A function rather than an
// inline `position < size`: with a rank-0 list that comparison is constant and nvcc warns (#186).
constexpr bool found_at(std::size_t position, std::size_t size) { return position < size; }

// Elements of A, then the elements of B that A lacks, in their order.
template <class A, class B>
using union_t = detail::from_hana<decltype(boost::hana::concat(
    detail::as_hana<A>::value, boost::hana::filter(detail::as_hana<B>::value, detail::absent_from<A>{})))>;

// Elements of A that B lacks, in A's order.
template <class A, class B>
using difference_t =
    detail::from_hana<decltype(boost::hana::filter(detail::as_hana<A>::value, detail::absent_from<B>{}))>;

// Elements of A that B has too, in A's order.
template <class A, class B>
using intersection_t = difference_t<A, difference_t<A, B>>;

// True when no name appears twice (each name's first position is its own position).
template <class List>
inline constexpr bool distinct_v = false;
template <class... Ts>
inline constexpr bool distinct_v<type_list<Ts...>> = [] {
  constexpr std::size_t firsts[] = {index_of_v<Ts, type_list<Ts...>>..., 0};
  for (std::size_t i = 0; i != sizeof...(Ts); ++i)
    if (firsts[i] != i) return false;
  return true;
}();

}  // namespace meshtensor
