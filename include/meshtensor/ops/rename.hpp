#pragma once
// rename<Old, New>(x) and replace_dimensions<OldList, NewList>(x): the same values with dims renamed
// in place (New takes Old's position and extent); reshape<New...>(x, extents) and
// replace_dimensions<OldList, NewList>(x, extents): the global tensor's row-major elements read
// under other dims and extents.
// Communication: rename/replace_dimensions as relayout from x's placement to the result's (none
// when the layout splits Old and New alike); reshape allgathers over the axes of x's split dims
// that the result lacks (none when there are none), then slices locally for the result's new split
// dims. A split dim kept by name must keep its extent and its row-major position (the product of the
// extents before it), else layout_error: its slices would not stay contiguous.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>

#include "../autodiff/saved_operand.hpp"
#include "../plan/comm_plan.hpp"
#include "detail/op_support.hpp"
#include "relayout.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Old>
struct rename_source_not_in_tensor {
  static_assert(sizeof(Old) == 0,
                "meshtensor: rename names a dim to replace that the tensor does not have; rename one of "
                "the tensor's dims");
};
template <class New>
struct rename_target_already_in_tensor {
  static_assert(sizeof(New) == 0,
                "meshtensor: rename's new dim is already a dim of the tensor; choose a name the tensor "
                "does not have");
};
template <std::size_t N>
struct extents_expected {};
template <std::size_t N>
struct extents_given {};
template <class NewDims, class Expected, class Given>
struct reshape_extent_count_differs {
  static_assert(sizeof(NewDims) == 0,
                "meshtensor: reshape needs exactly one extent per new dim (extents_expected<N> of them), "
                "in the new dims' order");
};
template <class Dim>
struct reshape_dim_repeated {
  static_assert(sizeof(Dim) == 0, "meshtensor: reshape's result names one dim twice; name each dim once");
};
template <class OldList, class NewList>
struct replace_dimensions_counts_differ {
  static_assert(sizeof(OldList) == 0,
                "meshtensor: replace_dimensions without extents renames dim by dim, so it needs as many "
                "new dims as old ones; pass the new extents to reshape instead");
};
template <class Old>
struct replaced_dims_not_adjacent {
  static_assert(sizeof(Old) == 0,
                "meshtensor: replace_dimensions with extents needs the old dims adjacent in the tensor, "
                "in the order given");
};
}  // namespace diagnostic

namespace detail {

template <std::size_t I, class List>
struct nth;
template <std::size_t I, class... Ts>
struct nth<I, type_list<Ts...>> {
  using type = std::tuple_element_t<I, std::tuple<Ts...>>;
};

// Each dim of List that is the k-th of OldList becomes the k-th of NewList.
template <class OldList, class NewList, class D>
struct replaced_one {
  static constexpr std::size_t k = index_of_v<D, OldList>;
  using type = typename std::conditional_t<(k < OldList::size), nth<(k < OldList::size ? k : 0), NewList>,
                                           std::type_identity<D>>::type;
};
template <class OldList, class NewList, class List>
struct replaced;
template <class OldList, class NewList, class... Ds>
struct replaced<OldList, NewList, type_list<Ds...>> {
  using type = type_list<typename replaced_one<OldList, NewList, Ds>::type...>;
};
template <class OldList, class NewList, class List>
using replaced_t = typename replaced<OldList, NewList, List>::type;

// Elements [B, E) of a list.
template <class List, std::size_t B, class Seq>
struct sub_list_impl;
template <class List, std::size_t B, std::size_t... I>
struct sub_list_impl<List, B, std::index_sequence<I...>> {
  using type = type_list<typename nth<B + I, List>::type...>;
};
template <class List, std::size_t B, std::size_t E>
using sub_list_t = typename sub_list_impl<List, B, std::make_index_sequence<E - B>>::type;

template <class A, class B, class C>
struct join3;
template <class... A, class... B, class... C>
struct join3<type_list<A...>, type_list<B...>, type_list<C...>> {
  using type = type_list<A..., B..., C...>;
};

// X's dims with the adjacent run OldList replaced by NewList.
template <class X, class OldList, class NewList>
struct spliced {
  static constexpr std::size_t at = index_of_v<typename nth<0, OldList>::type, typename X::dims>;
  using type = typename join3<sub_list_t<typename X::dims, 0, at>, NewList,
                              sub_list_t<typename X::dims, at + OldList::size, X::rank>>::type;
};

template <class... Ds>
constexpr bool check_rename_sources(type_list<Ds...>, auto dims) {
  bool ok = true;
  (
      [&] {
        if constexpr (!contains_v<Ds, decltype(dims)>) {
          (void)sizeof(diagnostic::rename_source_not_in_tensor<Ds>);
          ok = false;
        }
      }(),
      ...);
  return ok;
}
// New dims must not clash with dims of x that stay.
template <class Kept, class... Ns>
constexpr bool check_rename_targets(type_list<Ns...>) {
  bool ok = true;
  (
      [&] {
        if constexpr (contains_v<Ns, Kept>) {
          (void)sizeof(diagnostic::rename_target_already_in_tensor<Ns>);
          ok = false;
        }
      }(),
      ...);
  return ok;
}
template <class... Ds>
constexpr bool check_distinct_result(type_list<Ds...>) {
  bool ok = true;
  (
      [&] {
        if constexpr (count_v<Ds, type_list<Ds...>> > 1) {
          (void)sizeof(diagnostic::reshape_dim_repeated<Ds>);
          ok = false;
        }
      }(),
      ...);
  return ok;
}

// Splits of T's dims, with those of dims Other lacks cleared (replicated).
template <Tensor T, Tensor Other>
constexpr std::array<dim_split, T::rank> shared_dim_splits() {
  constexpr auto in_other = positions_in<T, Other>();
  std::array<bool, T::rank> lacked{};
  for (std::size_t i = 0; i < T::rank; ++i) lacked[i] = in_other[i] >= Other::rank;
  return kept_splits<T::rank>(T::splits, lacked);
}

// reshape's steps: gather x's split dims that Out lacks, reinterpret the local slice (the kept
// split dims cut both the same way), then slice Out's split dims that x lacks.
template <Tensor Out, Tensor X>
struct reshape_steps {
  static constexpr auto x_kept = shared_dim_splits<X, Out>();
  static constexpr auto out_kept = shared_dim_splits<Out, X>();
  static constexpr relayout_step gather = analyze_relayout<X::rank>(X::splits, x_kept);
  static constexpr relayout_step slice = analyze_relayout<Out::rank>(out_kept, Out::splits);
};

template <std::size_t R>
std::int64_t product(const std::array<std::int64_t, R>& e, std::size_t n = R) {
  std::int64_t p = 1;
  for (std::size_t i = 0; i < n; ++i) p *= e[i];
  return p;
}

// Runs on extents and types only, so every rank throws alike.
template <Tensor Out, Tensor X>
void check_reshape(const X& x, const typename Out::extents_type& out_ext, const char* op) {
  auto shape = [](const auto& names, const auto& e) {
    std::string s = "[";
    for (std::size_t i = 0; i < e.size(); ++i) s += cat(i ? ", " : "", names[i], "=", e[i]);
    return s + "]";
  };
  const auto xs = shape(X::dim_names(), x.extents()), os = shape(Out::dim_names(), out_ext);
  for (std::size_t i = 0; i < Out::rank; ++i)
    if (out_ext[i] < 0) throw shape_error(cat(op, ": dim '", Out::dim_names()[i], "' of ", Out::type_name(), os,
                                              " has negative extent ", out_ext[i]));
  if (product(x.extents()) != product(out_ext))
    throw shape_error(cat(op, ": ", X::type_name(), xs, " has ", product(x.extents()), " elements, but ",
                          Out::type_name(), os, " has ", product(out_ext)));
  constexpr auto in_out = positions_in<X, Out>();
  constexpr auto splits = X::splits;
  for (std::size_t i = 0; i < X::rank; ++i) {
    if (splits[i].count == 0 || in_out[i] >= Out::rank) continue;
    const std::size_t j = in_out[i];
    const std::int64_t before_x = product(x.extents(), i), before_o = product(out_ext, j);
    if (x.extents()[i] != out_ext[j] || before_x != before_o)
      throw layout_error(cat(op, ": dim '", X::dim_names()[i], "' is split over ", x.split_string(i), " in both ",
                             X::type_name(), xs, " and ", Out::type_name(), os, ", but its extent (", x.extents()[i],
                             " -> ", out_ext[j], ") or the product of the extents before it (", before_x, " -> ",
                             before_o, ") changes, so its slices would not stay contiguous; rename it, or "
                             "relayout it unsplit first"));
  }
}

// Not recorded.
template <Tensor Out, Tensor X>
Out reshape_kernel(const X& x, const typename Out::extents_type& out_ext, const char* op) {
  using steps = reshape_steps<Out, X>;
  using E = typename X::execution_space;
  using T = typename X::value_type;
  check_reshape<Out>(x, out_ext, op);
  auto& comm = x.mesh().communicator();
  auto gathered = move_slices<E, T, X::rank>(comm, x.view(), x.extents(), X::splits, steps::x_kept, steps::gather);
  auto sliced = move_slices<E, T, Out::rank>(comm, gathered, out_ext, steps::out_kept, Out::splits, steps::slice);
  return Out(x.mesh(), out_ext, std::move(sliced));
}

// The rename of a tensor whose slice a source makes again (relayout_regathered's result, renamed
// for attention's keys): renamed from that source's slice, so a product keeps neither whole.
template <Tensor Out, Tensor X>
struct renamed_source final : slice_source<typename Out::value_type, Out::rank, typename Out::execution_space> {
  X kept;
  explicit renamed_source(const X& x) : kept(kept_for_backward(x)) {}
  typename Out::storage_type make() const override { return relayout_kernel<Out>(made_again(kept), "rename").storage(); }
};

// rename / replace_dimensions without extents: Out's dims are X's, renamed in place.
template <Tensor Out, Tensor X>
Out renamed(const X& x) {
  Out out = relayout_kernel<Out>(x, "rename");
  record<Out>(out, relayout_rule<Out, X>{node_only(x)}, x);
  if (!x.storage().source || !out.tracks_grad()) return out;
  auto st = std::move(out).storage();
  st.source = std::make_shared<renamed_source<Out, X>>(x);
  return Out(from_storage, x.mesh().shared_communicator(), st);
}

template <Tensor X, class OldList, class NewList>
using renamed_t = with_dims_t<X, replaced_t<OldList, NewList, typename X::dims>>;

}  // namespace detail

// ---- plans ------------------------------------------------------------------------------------
template <Tensor X, Dim Old, Dim New>
constexpr comm_plan rename_plan() {
  return relayout_plan<detail::renamed_t<X, type_list<Old>, type_list<New>>, X>();
}
template <Tensor X, class OldList, class NewList>
constexpr comm_plan replace_dimensions_plan() {
  return relayout_plan<detail::renamed_t<X, OldList, NewList>, X>();
}
// Of reshape from X to Out (and of replace_dimensions with extents, Out being its result).
template <Tensor Out, Tensor X>
constexpr comm_plan reshape_plan() {
  return detail::plan_of(detail::reshape_steps<Out, X>::gather);
}

// ---- ops --------------------------------------------------------------------------------------
// Gradient: renamed back (relayout semantics).
template <Dim Old, Dim New, Tensor X>
auto rename(const X& x) {
  if constexpr (!contains_v<Old, typename X::dims>) {
    (void)sizeof(diagnostic::rename_source_not_in_tensor<Old>);
    return x;
  } else if constexpr (std::is_same_v<Old, New>) {
    return x;
  } else if constexpr (contains_v<New, typename X::dims>) {
    (void)sizeof(diagnostic::rename_target_already_in_tensor<New>);
    return x;
  } else {
    const detail::op_call call(detail::planned_op{"rename", rename_plan<X, Old, New>()}, x);
    return detail::renamed<detail::renamed_t<X, type_list<Old>, type_list<New>>>(x);
  }
}

// Renames OldList's k-th dim to NewList's k-th, all at once (so dims may swap names).
template <class OldList, class NewList, Tensor X>
auto replace_dimensions(const X& x) {
  if constexpr (OldList::size != NewList::size) {
    (void)sizeof(diagnostic::replace_dimensions_counts_differ<OldList, NewList>);
    return x;
  } else if constexpr (!detail::check_rename_sources(OldList{}, typename X::dims{}) ||
                       !detail::check_rename_targets<difference_t<typename X::dims, OldList>>(NewList{}) ||
                       !detail::check_distinct_result(detail::replaced_t<OldList, NewList, typename X::dims>{})) {
    return x;
  } else {
    const detail::op_call call(detail::planned_op{"replace_dimensions", replace_dimensions_plan<X, OldList, NewList>()}, x);
    return detail::renamed<detail::renamed_t<X, OldList, NewList>>(x);
  }
}

// The row-major elements of x's global tensor, read as a tensor of dims New... and the given
// extents (their product must equal x's size). Gradient: reshaped back.
// N is deduced, not sizeof...(New): a std::array<.., sizeof...(New)> parameter would take a short
// braced list and make the missing extents 0.
template <Dim... New, Tensor X, std::size_t N>
auto reshape(const X& x, const std::array<std::int64_t, N>& extents) {
  if constexpr (N != sizeof...(New)) {
    (void)sizeof(diagnostic::reshape_extent_count_differs<type_list<New...>, diagnostic::extents_expected<sizeof...(New)>,
                                                          diagnostic::extents_given<N>>);
    return x;
  } else if constexpr (!detail::check_distinct_result(type_list<New...>{})) {
    return x;
  } else {
    using Out = detail::with_dims_t<X, type_list<New...>>;
    const detail::op_call call(detail::planned_op{"reshape", reshape_plan<Out, X>()}, x);
    Out out = detail::reshape_kernel<Out>(x, extents, "reshape");
    detail::record<Out>(
        out, [x = detail::node_only(x)](const Out& g) { detail::push_grad(x, detail::reshape_kernel<X>(g, x.extents(), "reshape (gradient)")); },
        x);
    return out;
  }
}
// reshape<New...>(x, {e0, e1, ...}): N from the braced list.
template <Dim... New, Tensor X, std::size_t N>
auto reshape(const X& x, const std::int64_t (&extents)[N]) {
  return reshape<New...>(x, std::to_array(extents));
}

// x with its adjacent dims OldList (in that order) replaced by NewList of the given extents: a
// reshape that keeps the other dims where they are. N deduced, as for reshape.
template <class OldList, class NewList, Tensor X, std::size_t N>
auto replace_dimensions(const X& x, const std::array<std::int64_t, N>& extents) {
  static_assert(OldList::size > 0, "meshtensor: replace_dimensions needs at least one old dim");
  if constexpr (N != NewList::size) {
    (void)sizeof(diagnostic::reshape_extent_count_differs<NewList, diagnostic::extents_expected<NewList::size>,
                                                          diagnostic::extents_given<N>>);
    return x;
  } else if constexpr (!detail::check_rename_sources(OldList{}, typename X::dims{})) {
    return x;
  } else {
    constexpr std::size_t at = index_of_v<typename detail::nth<0, OldList>::type, typename X::dims>;
    constexpr bool adjacent = [&]<class... Os>(type_list<Os...>) {
      std::size_t k = 0;
      return ((index_of_v<Os, typename X::dims> == at + k++) && ...);
    }(OldList{});
    if constexpr (!adjacent) {
      (void)sizeof(diagnostic::replaced_dims_not_adjacent<OldList>);
      return x;
    } else {
      using Dims = typename detail::spliced<X, OldList, NewList>::type;
      // Outermost: reshape's collectives are credited here.
      const detail::op_call call(detail::planned_op{"replace_dimensions", reshape_plan<detail::with_dims_t<X, Dims>, X>()}, x);
      return [&]<class... Ds>(type_list<Ds...>) {
        typename detail::with_dims_t<X, Dims>::extents_type e{};
        for (std::size_t i = 0; i < at; ++i) e[i] = x.extents()[i];
        for (std::size_t i = 0; i < NewList::size; ++i) e[at + i] = extents[i];
        for (std::size_t i = at + OldList::size; i < X::rank; ++i) e[i - OldList::size + NewList::size] = x.extents()[i];
        return reshape<Ds...>(x, e);
      }(Dims{});
    }
  }
}
template <class OldList, class NewList, Tensor X, std::size_t N>
auto replace_dimensions(const X& x, const std::int64_t (&extents)[N]) {
  return replace_dimensions<OldList, NewList>(x, std::to_array(extents));
}

}  // namespace meshtensor
