#pragma once
// The layouts a model could run under, as types: every candidate of some dims on a mesh, and a
// layout spelled as code. With plan/cost_model.hpp's rank_layouts, a program plans each candidate
// and ranks them (docs/plan-mode.md).
#include <cstddef>
#include <string>
#include <utility>

#include "../plan/cost_model.hpp"
#include "layout.hpp"
#include "mesh_axes.hpp"

namespace meshtensor {

// "layout<mesh<rows, cols>, split<batch, rows>, split<vocab, cols>>": a layout type as code to paste
// (the mesh spelled by its axes; a user's alias for it is not known here).
template <class L>
std::string layout_string() {
  return []<class... As, class... Rules>(layout<mesh<As...>, Rules...>*) {
    std::string s = "layout<mesh<";
    ((s += detail::cat(std::string(As::name()), ", ")), ...);
    if constexpr (sizeof...(As) > 0) s.resize(s.size() - 2);
    s += ">";
    const auto rule = []<class D, class... Axes>(split<D, Axes...>*) {
      std::string r = detail::cat(", split<", std::string(D::name()));
      ((r += detail::cat(", ", std::string(Axes::name()))), ...);
      return r + ">";
    };
    ((s += rule(static_cast<Rules*>(nullptr))), ...);
    return s + ">";
  }(static_cast<L*>(nullptr));
}

// Every layout of Dims on Mesh in which each mesh axis splits one of the dims or none: (D + 1)^A
// candidates, the replicated layout among them. A dim given several axes takes them in mesh order
// (the order changes which processor holds which part, not what any of them holds or sends).
// Every candidate is accepted by the compiler, since no axis serves two dims.
namespace detail {
template <class... Lists>
struct candidates_concat {
  using type = type_list<>;
};
template <class... A>
struct candidates_concat<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct candidates_concat<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename candidates_concat<type_list<A..., B...>, Rest...>::type;
};
template <class M, class Rules>
struct layout_of_rules;
template <class M, class... Rules>
struct layout_of_rules<M, type_list<Rules...>> {
  using type = layout<M, Rules...>;
};
template <class D, class Axes>
struct rule_of_axes {
  using type = type_list<>;  // no axis: no rule
};
template <class D, class A, class... As>
struct rule_of_axes<D, type_list<A, As...>> {
  using type = type_list<split<D, A, As...>>;
};

template <class Mesh, class Dims, std::size_t I>
struct candidate_at;
template <class... As, class... Ds, std::size_t I>
struct candidate_at<mesh<As...>, type_list<Ds...>, I> {
  static constexpr std::size_t base = sizeof...(Ds) + 1;
  // 0: axis j splits nothing; k > 0: it splits the k-th dim.
  static constexpr std::size_t choice(std::size_t j) {
    std::size_t v = I;
    for (std::size_t n = 0; n < j; ++n) v /= base;
    return v % base;
  }
  template <std::size_t K, std::size_t... J>
  static auto axes_of(std::index_sequence<J...>)
      -> typename candidates_concat<std::conditional_t<choice(J) == K, type_list<As>, type_list<>>...>::type;
  template <std::size_t... K>
  static auto rules(std::index_sequence<K...>) -> typename candidates_concat<typename rule_of_axes<
      Ds, decltype(axes_of<K + 1>(std::index_sequence_for<As...>{}))>::type...>::type;
  using type = typename layout_of_rules<mesh<As...>, decltype(rules(std::index_sequence_for<Ds...>{}))>::type;
};
template <class Mesh, class Dims, class Seq>
struct candidates_of;
template <class Mesh, class Dims, std::size_t... I>
struct candidates_of<Mesh, Dims, std::index_sequence<I...>> {
  using type = type_list<typename candidate_at<Mesh, Dims, I>::type...>;
};
constexpr std::size_t power(std::size_t b, std::size_t e) { return e == 0 ? 1 : b * power(b, e - 1); }
}  // namespace detail

template <Mesh M, Dim... Ds>
using candidate_layouts =
    typename detail::candidates_of<M, type_list<Ds...>, std::make_index_sequence<detail::power(sizeof...(Ds) + 1, mesh_axes_t<M>::size)>>::type;

// f.template operator()<L>() for every layout L of a type_list.
template <class... Ls, class F>
void for_each_layout(type_list<Ls...>, F&& f) {
  (f.template operator()<Ls>(), ...);
}

}  // namespace meshtensor
