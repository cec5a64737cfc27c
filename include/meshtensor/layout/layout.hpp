#pragma once
// Layout rules: which tensor dim is split over which mesh axes. Checked when the layout type and
// when each tensor type are formed; a broken rule is a compile error naming the dims and axes.
#include <array>
#include <cstddef>
#include <type_traits>

#include "../names/names.hpp"
#include "mesh_axes.hpp"
#include "../geometry/placement.hpp"

namespace meshtensor {

// split<batch, rows>: batch is cut into size(rows) parts. split<batch, rows, cols>: into
// size(rows) * size(cols) parts, numbered row-major over the axes in the order written.
template <Dim D, Axis... As>
struct split {
  static_assert(sizeof...(As) > 0, "meshtensor: split<Dim, Axes...> needs at least one axis");
  using dim = D;
  using axes = type_list<As...>;
  static constexpr dim_order order = dim_order::contiguous;
};

// zigzag<length, ctx>: length cut into 2P chunks (P = size(ctx), or the product of the axes'
// sizes, parts numbered as split's), part q holding chunk q then chunk 2P - 1 - q: under a causal
// mask every part does the same work (geometry/placement.hpp). The chunk count is derived, always
// two per part, so an odd count cannot be written. Ops that need a part to be one range along the
// dim (cumsum, shift, slices, halos, top_k, ...) refuse it at compile time; relayout it to split<>
// first.
template <Dim D, Axis... As>
struct zigzag {
  static_assert(sizeof...(As) > 0, "meshtensor: zigzag<Dim, Axes...> needs at least one axis");
  using dim = D;
  using axes = type_list<As...>;
  static constexpr dim_order order = dim_order::zigzag;
};

// The compile errors. Each is a template whose arguments are the offending names, so the compiler
// prints them in "required from" lines, next to one sentence that says what to change.
namespace diagnostic {
template <class Dim, class Axis, class Mesh>
struct axis_not_in_mesh {
  static_assert(sizeof(Dim) == 0,
                "meshtensor: a layout rule splits a dim over an axis that the mesh does not have; "
                "use one of the mesh's axes");
};
template <class Dim>
struct dim_has_two_rules {
  static_assert(sizeof(Dim) == 0,
                "meshtensor: a layout has two rules for one dim; merge them into one "
                "split<Dim, Axes...> (or zigzag<Dim, Axes...>)");
};
template <class Dim, class Axis>
struct axis_repeated_in_rule {
  static_assert(sizeof(Dim) == 0, "meshtensor: a layout rule names one axis twice; name each axis once");
};
template <class Dim1, class Dim2, class Axis>
struct axis_used_twice {
  static_assert(sizeof(Dim1) == 0,
                "meshtensor: a tensor would split two of its dims over one mesh axis; change the "
                "layout so that each axis splits at most one dim of the tensor");
};
template <class Dim>
struct dim_repeated {
  static_assert(sizeof(Dim) == 0, "meshtensor: a tensor type names one dim twice; name each dim once");
};
}  // namespace diagnostic

namespace detail {
template <class D, class... Rules>
struct rule_for {
  using type = void;
};
template <class D, class R, class... Rules>
struct rule_for<D, R, Rules...> {
  using type = std::conditional_t<std::is_same_v<D, typename R::dim>, R, typename rule_for<D, Rules...>::type>;
};
template <class Rule>
struct axes_of_rule {
  using type = typename Rule::axes;
};
template <>
struct axes_of_rule<void> {
  using type = type_list<>;
};
template <class Rule>
inline constexpr dim_order order_of_rule = Rule::order;
template <>
inline constexpr dim_order order_of_rule<void> = dim_order::contiguous;
}  // namespace detail

template <class Mesh, class... Rules>
struct layout {
  static_assert(is_mesh_v<Mesh>, "meshtensor: layout<Mesh, split<...>...> needs a mesh<Axes...> first");
  using mesh_type = Mesh;
  using rules = type_list<Rules...>;
  using split_dims = type_list<typename Rules::dim...>;

  // Axes of D (type_list<> when D is not split).
  template <class D>
  using axes_of = typename detail::axes_of_rule<typename detail::rule_for<D, Rules...>::type>::type;

  template <class D>
  static constexpr dim_split split_of() {
    dim_split s = make_split(axes_of<D>{});
    s.order = detail::order_of_rule<typename detail::rule_for<D, Rules...>::type>;
    return s;
  }

  template <class... As>
  static constexpr dim_split make_split(type_list<As...>) {
    dim_split s{};
    s.count = sizeof...(As);
    int i = 0;
    ((s.axes[i++] = static_cast<int>(index_of_v<As, mesh_axes_t<Mesh>>)), ...);
    return s;
  }
  template <class R>
  static constexpr void check_rule() {
    using D = typename R::dim;
    [&]<class... As>(type_list<As...>) {
      (check_axis<D, As>(), ...);
      if constexpr (!distinct_v<type_list<As...>>) (check_repeat<D, As, As...>(), ...);
    }(typename R::axes{});
    if constexpr (count_v<D, split_dims> > 1)
      (void)sizeof(diagnostic::dim_has_two_rules<D>);
  }
  template <class D, class A>
  static constexpr void check_axis() {
    if constexpr (!contains_v<A, mesh_axes_t<Mesh>>) (void)sizeof(diagnostic::axis_not_in_mesh<D, A, Mesh>);
  }
  template <class D, class A, class... As>
  static constexpr void check_repeat() {
    if constexpr (count_v<A, type_list<As...>> > 1) (void)sizeof(diagnostic::axis_repeated_in_rule<D, A>);
  }
  static constexpr bool check() {
    (check_rule<Rules>(), ...);
    return true;
  }

 public:
  static constexpr bool checked = check();
};

template <class T>
inline constexpr bool is_layout_v = false;
template <class M, class... R>
inline constexpr bool is_layout_v<layout<M, R...>> = true;
template <class T>
concept Layout = is_layout_v<T>;

// A layout with no rules: every tensor is replicated on every processor.
template <class Mesh>
using replicated = layout<Mesh>;

namespace detail {
// The splits of a tensor of dims Ds under layout L, checked once per tensor type.
template <class L, class... Ds>
struct placement_check {
  static constexpr std::size_t rank = sizeof...(Ds);
  static constexpr std::array<dim_split, rank> splits{L::template split_of<Ds>()...};

  template <class D1, class D2>
  static constexpr void check_pair() {
    if constexpr (!std::is_same_v<D1, D2>) {
      using shared = intersection_t<typename L::template axes_of<D1>, typename L::template axes_of<D2>>;
      if constexpr (shared::size > 0) {
        [&]<class A, class... Rest>(type_list<A, Rest...>) {
          (void)sizeof(diagnostic::axis_used_twice<D1, D2, A>);
        }(shared{});
      }
    }
  }
  template <class D>
  static constexpr void check_dim() {
    if constexpr (count_v<D, type_list<Ds...>> > 1) (void)sizeof(diagnostic::dim_repeated<D>);
  }
  static constexpr bool check() {
    static_assert(L::checked);
    (check_dim<Ds>(), ...);
    if constexpr (distinct_v<type_list<Ds...>>) {
      // Each unordered pair once: D1 before D2 in the tensor's order.
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        using list = type_list<Ds...>;
        (check_row<I, Ds>(list{}), ...);
      }(std::index_sequence_for<Ds...>{});
    }
    return true;
  }
  template <std::size_t I, class D1, class... All>
  static constexpr void check_row(type_list<All...>) {
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      ([] {
        if constexpr (J > I) check_pair<D1, All>();
      }(), ...);
    }(std::index_sequence_for<All...>{});
  }
  static constexpr bool checked = check();
};
}  // namespace detail

}  // namespace meshtensor
