#pragma once
// einsum<OutDims...>(a, b[, c]): products summed over the dims the output lacks, by name.
// Communication: one allreduce over exactly the axes of the contracted dims that are split (none
// when none is); dims that only one operand has and the output lacks are summed first, with the
// allreduce of reduce_sum. Local kernel: a batched matrix product after permutation
// (kernels::product: oneDNN, OpenBLAS, cuBLAS or a Kokkos loop, kernels/product.hpp).
#include <Kokkos_Core.hpp>
#include <memory>
#include <optional>

#include "../autodiff/saved_operand.hpp"
#include "../element/complex.hpp"
#include "../kernels/product.hpp"
#include "../kernels/product_into_float.hpp"
#include "detail/map_to.hpp"
#include "elementwise.hpp"
#include "sum_broadcast.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Dim>
struct einsum_output_dim_not_in_inputs {
  static_assert(sizeof(Dim) == 0,
                "meshtensor: einsum's output names a dim that no input has; an output dim must come "
                "from an input");
};
template <class Dim>
struct einsum_output_dim_repeated {
  static_assert(sizeof(Dim) == 0, "meshtensor: einsum's output names a dim twice");
};
}  // namespace diagnostic

namespace detail {

template <class... Lists>
struct concat_lists;
template <class... A>
struct concat_lists<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat_lists<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat_lists<type_list<A..., B...>, Rest...>::type;
};
template <class... Lists>
using concat_t = typename concat_lists<Lists...>::type;

// einsum's type checks. Called in an if constexpr condition, so that they are instantiated, and
// report, before anything else of einsum (a called function's body would be instantiated after
// einsum's own, and the gradient rule's errors would come first).
template <class OutList, class A, class B>
constexpr bool einsum_types_ok() {
  if constexpr (!std::is_same_v<with_dims_t<A, type_list<>>, with_dims_t<B, type_list<>>>) {
    (void)sizeof(diagnostic::operands_differ_in_layout<A, B>);
    return false;
  } else {
    return []<class... Ds>(type_list<Ds...>) {
      bool ok = true;
      (
          [&] {
            if constexpr (!contains_v<Ds, union_t<typename A::dims, typename B::dims>>) {
              (void)sizeof(diagnostic::einsum_output_dim_not_in_inputs<Ds>);
              ok = false;
            }
            if constexpr (count_v<Ds, OutList> > 1) {
              (void)sizeof(diagnostic::einsum_output_dim_repeated<Ds>);
              ok = false;
            }
          }(),
          ...);
      return ok;
    }(OutList{});
  }
}

// The axes that split the dims a product of A and B into OutList contracts: its local results
// are partial sums over them.
template <class OutList, Tensor A, Tensor B>
constexpr unsigned contracted_axes() {
  return axes_mask_of<A, difference_t<intersection_t<typename A::dims, typename B::dims>, OutList>>();
}

// A product's shape, from the types alone: A's dims in [batch, m, k] order and B's in
// [batch, k, n] order (their positions in A and B), whether A and B are in that order or its
// transpose already, and where each of Out's dims sits in the product [batch, m, n]. Not a
// template, so that the product's host code is compiled once per (space, element type).
struct contract_shape {
  std::size_t nb = 0, nm = 0, nk = 0, nn = 0;  // numbers of batch, m, k and n dims
  std::array<std::size_t, max_rank> a_order{}, b_order{}, out_order{};
  std::size_t a_rank = 0, b_rank = 0, out_rank = 0;
  bool a_plain = false, a_trans = false, b_plain = false, b_trans = false, out_plain = false;
};
template <class OutList, class A, class B>
constexpr contract_shape contract_shape_of() {
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  using Bt = intersection_t<intersection_t<Ad, Bd>, OutList>;
  using Mt = difference_t<intersection_t<Ad, OutList>, Bd>;
  using Nt = difference_t<intersection_t<Bd, OutList>, Ad>;
  using Kt = difference_t<intersection_t<Ad, Bd>, OutList>;
  using Ap = concat_t<Bt, Mt, Kt>;
  using Bp = concat_t<Bt, Kt, Nt>;
  using Cp = concat_t<Bt, Mt, Nt>;
  static_assert(Ap::size == A::rank && Bp::size == B::rank,
                "meshtensor: contract's operands must have only dims that the other or the output has");
  contract_shape s;
  s.nb = Bt::size, s.nm = Mt::size, s.nk = Kt::size, s.nn = Nt::size;
  s.a_rank = A::rank, s.b_rank = B::rank, s.out_rank = OutList::size;
  [&]<class... Ds>(type_list<Ds...>) { s.a_order = {index_of_v<Ds, Ad>...}; }(Ap{});
  [&]<class... Ds>(type_list<Ds...>) { s.b_order = {index_of_v<Ds, Bd>...}; }(Bp{});
  [&]<class... Ds>(type_list<Ds...>) { s.out_order = {index_of_v<Ds, Cp>...}; }(OutList{});
  s.a_plain = std::is_same_v<Ad, Ap>;
  s.a_trans = !s.a_plain && std::is_same_v<Ad, concat_t<Bt, Kt, Mt>>;
  s.b_plain = std::is_same_v<Bd, Bp>;
  s.b_trans = !s.b_plain && std::is_same_v<Bd, concat_t<Bt, Nt, Kt>>;
  s.out_plain = std::is_same_v<OutList, Cp>;
  return s;
}
template <class OutList, class A, class B>
inline constexpr contract_shape contract_shape_v = contract_shape_of<OutList, A, B>();

inline std::int64_t product_of(const std::int64_t* ext, const std::size_t* pos, std::size_t n) {
  std::int64_t p = 1;
  for (std::size_t i = 0; i != n; ++i) p *= ext[pos[i]];
  return p;
}

// An operand's local slice in the order `order` (its positions), as the product wants it.
template <class Exec, class T>
temporary_view<T, typename Exec::memory_space> permuted_slice(const Kokkos::View<T*, typename Exec::memory_space>& v,
                                                              const std::int64_t* ext, const std::size_t* order,
                                                              std::size_t rank) {
  using mem = typename Exec::memory_space;
  kidx out_ext{};
  for (std::size_t i = 0; i != rank; ++i) out_ext[i] = ext[order[i]];
  temporary_view<T, mem> out(v.extent(0));
  map_kernel<Exec>(out.v, out_ext.data(), static_cast<int>(rank), identity_fn{}, map_input<T, mem>{v, order, ext, rank});
  return out;
}

// Calls f(nb, m, n, k, a', b') with the local slices of a and b (local extents a_ext, b_ext) of
// shape s as the product reads them: as they are, or permuted into pool buffers.
template <class Exec, class T, class F>
void with_product_operands(const contract_shape& s, const Kokkos::View<T*, typename Exec::memory_space>& a,
                           const std::int64_t* a_ext, const Kokkos::View<T*, typename Exec::memory_space>& b,
                           const std::int64_t* b_ext, F&& f) {
  using mem = typename Exec::memory_space;
  const std::size_t* ao = s.a_order.data();
  const std::size_t* bo = s.b_order.data();
  const std::int64_t nb = product_of(a_ext, ao, s.nb), m = product_of(a_ext, ao + s.nb, s.nm),
                     k = product_of(a_ext, ao + s.nb + s.nm, s.nk), n = product_of(b_ext, bo + s.nb + s.nk, s.nn);
  std::optional<temporary_view<T, mem>> ap, bp;
  if (!s.a_plain && !s.a_trans) ap.emplace(permuted_slice<Exec, T>(a, a_ext, ao, s.a_rank));
  if (!s.b_plain && !s.b_trans) bp.emplace(permuted_slice<Exec, T>(b, b_ext, bo, s.b_rank));
  f(nb, m, n, k, ap ? ap->v : a, bp ? bp->v : b);
}

// out = the product of the local slices of a and b (local extents a_ext, b_ext) of shape s, out's
// local extents out_ext. The product writes every element of its result (beta = 0; zeros when
// k == 0), so out needs no zero fill. TOut float with bf16 operands: float accumulation and output
// (kernels::product_into_float), for a partial sum that is reduced before it is rounded.
template <class Exec, class T, class TOut = T>
void contract_slices(const contract_shape& s, const Kokkos::View<T*, typename Exec::memory_space>& a,
                     const std::int64_t* a_ext, const Kokkos::View<T*, typename Exec::memory_space>& b,
                     const std::int64_t* b_ext, const Kokkos::View<TOut*, typename Exec::memory_space>& out,
                     const std::int64_t* out_ext) {
  using mem = typename Exec::memory_space;
  with_product_operands<Exec, T>(s, a, a_ext, b, b_ext, [&](std::int64_t nb, std::int64_t m, std::int64_t n,
                                                            std::int64_t k, const auto& av, const auto& bv) {
    if (s.out_plain) return kernels::product_to<Exec, T, TOut>(nb, m, n, k, s.a_trans, s.b_trans, av, bv, out);
    const temporary_view<TOut, mem> c(static_cast<std::size_t>(nb * m * n));
    kernels::product_to<Exec, T, TOut>(nb, m, n, k, s.a_trans, s.b_trans, av, bv, c.v);
    // c's local extents: [batch, m] from a, [n] from b; then c permuted into out's order.
    kidx c_ext{};
    std::size_t i = 0;
    for (std::size_t j = 0; j != s.nb + s.nm; ++j) c_ext[i++] = a_ext[s.a_order[j]];
    for (std::size_t j = 0; j != s.nn; ++j) c_ext[i++] = b_ext[s.b_order[s.nb + s.nk + j]];
    map_kernel<Exec>(out, out_ext, static_cast<int>(s.out_rank), identity_fn{},
                     map_input<TOut, mem>{c.v, s.out_order.data(), c_ext.data(), i});
  });
}

// Two operands whose dims all appear in the other operand or the output. With sum_partials false,
// the result is this processor's partial sum over contracted_axes() (gradient rules hand it to
// the tape, which reduces it once: autodiff/tape.hpp).
template <class OutList, bool sum_partials = true, Tensor A, Tensor B>
auto contract(const A& a, const B& b) {
  using Out = with_dims_t<A, OutList>;
  using T = typename A::value_type;
  if constexpr (sum_partials && std::is_same_v<T, bf16> && contracted_axes<OutList, A, B>() != 0) {
    // Partial products rounded to bf16 before the allreduce would be rounded twice: bf16 operands
    // into float partial sums (bf16 kernels, float accumulation), reduced in float, rounded once.
    using F = typename Out::template rebind<float>;
    F partial(a.mesh(), result_extents<F>(a, b), uninitialized);
    contract_slices<typename A::execution_space, T, float>(contract_shape_v<OutList, A, B>, a.view(),
                                                           a.local_extents().data(), b.view(),
                                                           b.local_extents().data(), partial.view(),
                                                           partial.local_extents().data());
    allreduce_slice(partial, contracted_axes<OutList, A, B>(), reduce_op::sum);
    return cast_local<bf16>(partial);
  } else {
    Out out(a.mesh(), result_extents<Out>(a, b), uninitialized);
    contract_slices<typename A::execution_space, T>(contract_shape_v<OutList, A, B>, a.view(), a.local_extents().data(),
                                                    b.view(), b.local_extents().data(), out.view(),
                                                    out.local_extents().data());
    if constexpr (sum_partials) allreduce_slice(out, contracted_axes<OutList, A, B>(), reduce_op::sum);
    return out;
  }
}

// The operand a gradient product reads: conj(x) for complex elements (the rule multiplies g by the
// conjugate partial, element/complex.hpp), x itself for real ones.
template <Tensor X>
X conjugated_for_gradient(const X& x) {
  if constexpr (is_complex_v<typename X::value_type>)
    return map_to<X>(x.extents(), conj_fn{}, x);
  else
    return x;
}

// Pushes the product of l and r into OutList's dims, a partial sum over `axes`, into input's
// gradient. Where that gradient is float (float_gradient_of) and holds nothing yet or a partial
// sum over the same axes, the product writes into it or adds to it (beta = 1): Megatron's
// gradient-accumulation fusion. A bf16 copy's gradient then never exists, nor its float cast,
// nor the add per microbatch, and the sum is rounded once, to float. Else (another element type, a
// result that needs permuting, partials over other axes) a fresh result is pushed.
template <class OutList, Tensor In, Tensor Lhs, Tensor Rhs>
void push_product_grad(const In& input, const Lhs& l, const Rhs& r, axis_set axes) {
  using T = typename In::value_type;
  using Exec = typename In::execution_space;
  constexpr contract_shape s = contract_shape_v<OutList, Lhs, Rhs>;
  if constexpr ((std::is_same_v<T, float> || std::is_same_v<T, bf16>) && s.out_plain) {
    if (!input.tracks_grad()) return;
    auto* target = float_gradient_of(input);
    if (target) target->land_arrivals();
    if (target && (!target->has_grad || target->pending_axes == axes)) {
      const bool accumulate = target->has_grad;
      using F = typename In::template rebind<float>;
      std::optional<F> fresh;
      if (!accumulate) fresh.emplace(input.mesh(), input.extents(), uninitialized);
      with_product_operands<Exec, T>(s, l.view(), l.local_extents().data(), r.view(), r.local_extents().data(),
                                     [&](std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k,
                                         const auto& lv, const auto& rv) {
                                       kernels::product_into_float<Exec, T>(nb, m, n, k, s.a_trans, s.b_trans, lv, rv,
                                                                            fresh ? fresh->view() : target->grad.data,
                                                                            accumulate);
                                     });
      if (fresh) target->accumulate_partial(std::move(*fresh).storage(), axes);
      return;
    }
  }
  push_partial_grad(input, contract<OutList, false>(l, r), axes);
}

// contract, with einsum's gradient rule. With sum_partials false, the result is this processor's
// partial sum (einsum_partial, ops/partial_sum.hpp): its gradient is the gradient of the sum, so
// the rule is the same.
template <class OutList, bool sum_partials, Tensor A, Tensor B>
with_dims_t<A, OutList> contract_recorded(const A& a, const B& b) {
  using R = with_dims_t<A, OutList>;
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  R out = contract<OutList, sum_partials>(a, b);
  record<R>(
      out,
      [a = kept_for_backward(a), b = kept_for_backward(b)](const R& g) {
        // Rules call the kernel, not einsum, so no gradient-of-gradient code is instantiated.
        // Partial sums over the contracted dims' axes: the tape reduces them (autodiff/tape.hpp).
        // Either operand may be a weight, whose product an input-gradient pass defers. An operand
        // kept as its source is made again here (autodiff/saved_operand.hpp).
        push_weight_grad(a, [a, b = without_node(made_again(b)), g = without_node(g)] {
          push_product_grad<Ad>(a, g, conjugated_for_gradient(b), contracted_axes<Ad, R, B>());
        });
        push_weight_grad(b, [b, a = without_node(made_again(a)), g = without_node(g)] {
          push_product_grad<Bd>(b, conjugated_for_gradient(a), g, contracted_axes<Bd, A, R>());
        });
      },
      a, b);
  return out;
}

}  // namespace detail

// The plan of einsum_partial<Out...>(a, b) (ops/partial_sum.hpp): the sums of dims that one
// operand alone has, each an allreduce over their split axes.
template <class OutList, Tensor A, Tensor B>
constexpr comm_plan einsum_partial_plan() {
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  using Ak = intersection_t<Ad, union_t<Bd, OutList>>;
  using Bk = intersection_t<Bd, union_t<Ad, OutList>>;
  return comm_plan{}
      .then(collective::allreduce, detail::axes_mask_of<A, difference_t<Ad, Ak>>())
      .then(collective::allreduce, detail::axes_mask_of<B, difference_t<Bd, Bk>>());
}

// The plan of einsum<Out...>(a, b): einsum_partial's, then one allreduce over the split axes of the
// contracted dims.
template <class OutList, Tensor A, Tensor B>
constexpr comm_plan einsum_plan() {
  return einsum_partial_plan<OutList, A, B>().then(collective::allreduce, detail::contracted_axes<OutList, A, B>());
}

// einsum<Out...>(a, b). Gradient: da = einsum<A's dims>(g, b), db = einsum<B's dims>(a, g), after
// the first-step sums of dims only one operand has; their allreduces are left to the tape, which
// sums partials over the same axes before reducing them once.
template <Dim... Out, Tensor A, Tensor B>
detail::with_dims_t<A, type_list<Out...>> einsum(const A& a, const B& b) {
  using OutList = type_list<Out...>;
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  using Ak = intersection_t<Ad, union_t<Bd, OutList>>;
  using Bk = intersection_t<Bd, union_t<Ad, OutList>>;
  if constexpr (!detail::einsum_types_ok<OutList, A, B>()) {
    return {};
  } else {
    detail::check_shared_extents("einsum", a, b);
    const detail::op_call call(detail::planned_op{"einsum", einsum_plan<OutList, A, B>()}, a);

    if constexpr (!std::is_same_v<Ak, Ad>) {
      return einsum<Out...>(sum_to<detail::with_dims_t<A, Ak>>(a), b);
    } else if constexpr (!std::is_same_v<Bk, Bd>) {
      return einsum<Out...>(a, sum_to<detail::with_dims_t<B, Bk>>(b));
    } else {
      return detail::contract_recorded<OutList, true>(a, b);
    }
  }
}

// Three operands: the first two are contracted first, keeping the dims the rest still needs.
template <Dim... Out, Tensor A, Tensor B, Tensor C>
auto einsum(const A& a, const B& b, const C& c) {
  using Keep = intersection_t<union_t<typename A::dims, typename B::dims>, union_t<type_list<Out...>, typename C::dims>>;
  auto ab = [&]<class... Ds>(type_list<Ds...>) { return einsum<Ds...>(a, b); }(Keep{});
  return einsum<Out...>(ab, c);
}

}  // namespace meshtensor
