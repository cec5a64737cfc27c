#pragma once
// einsum<OutDims...>(a, b[, c]): products summed over the dims the output lacks, by name.
// Communication: one allreduce over exactly the axes of the contracted dims that are split (none
// when none is); dims that only one operand has and the output lacks are summed first, with the
// allreduce of reduce_sum. Local kernel: a batched matrix product after permutation, by cblas
// sgemm/dgemm on host spaces, cuBLAS's strided batched gemm on CUDA, a Kokkos kernel elsewhere.
#include <cblas.h>

#include <Kokkos_Core.hpp>

#include "detail/cublas.hpp"
#include "elementwise.hpp"
#include "reduce.hpp"

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

template <class T>
constexpr bool blas_type_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class Exec, class T>
void widen_kernel(const Kokkos::View<T*, typename Exec::memory_space>& from,
                  const Kokkos::View<float*, typename Exec::memory_space>& to) {
  Kokkos::parallel_for("meshtensor::einsum_widen", Kokkos::RangePolicy<Exec>(0, static_cast<std::int64_t>(from.extent(0))),
                       KOKKOS_LAMBDA(std::int64_t i) { to(i) = from(i); });
}

// C[b] (m x n) = op(A[b]) * op(B[b]) for every batch b, all row-major and contiguous.
template <class Exec, class T>
void batched_gemm(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                  const Kokkos::View<T*, typename Exec::memory_space>& a,
                  const Kokkos::View<T*, typename Exec::memory_space>& b,
                  const Kokkos::View<T*, typename Exec::memory_space>& c) {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  if (planning()) {  // a multiply and an add per (batch, row, column, contracted index)
    plan_ledger::get().add_product(nb, m, n, k);
    plan_ledger::get().add_kernel();
    return;
  }
  if constexpr (host && std::is_same_v<T, bf16>) {
    // No bf16 GEMM on this host's BLAS (Debian's OpenBLAS 0.3.21 declares cblas_sbgemm but is
    // built without it): the operands widened to float, sgemm, the product rounded once. The same
    // arithmetic as a bf16 GEMM with float accumulation, at float's speed plus the conversions.
    using F = Kokkos::View<float*, typename Exec::memory_space>;
    auto& pool = view_pool<float, typename Exec::memory_space>::get();
    const F wa = pool.allocate(a.extent(0)), wb = pool.allocate(b.extent(0)), wc = pool.allocate(c.extent(0));
    widen_kernel<Exec>(a, wa);
    widen_kernel<Exec>(b, wb);
    batched_gemm<Exec, float>(nb, m, n, k, trans_a, trans_b, wa, wb, wc);
    Kokkos::parallel_for("meshtensor::einsum_narrow", Kokkos::RangePolicy<Exec>(0, static_cast<std::int64_t>(c.extent(0))),
                         KOKKOS_LAMBDA(std::int64_t i) { c(i) = wc(i); });
  } else if constexpr (host && blas_type_v<T>) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      Kokkos::deep_copy(c, T(0));
      return;
    }
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
    for (std::int64_t i = 0; i < nb; ++i) {
      const T* pa = a.data() + i * m * k;
      const T* pb = b.data() + i * k * n;
      T* pc = c.data() + i * m * n;
      if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, pa,
                    lda, pb, ldb, 0.0f, pc, static_cast<int>(n));
      else
        cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, pa,
                    lda, pb, ldb, 0.0, pc, static_cast<int>(n));
    }
  }
#if defined(KOKKOS_ENABLE_CUDA)
  else if constexpr (std::is_same_v<Exec, Kokkos::Cuda> && cublas_type_v<T>) {
    if (nb == 0 || m == 0 || n == 0) return;  // cuBLAS scales C by beta = 0 when k is 0
    cublas_batched_gemm<T>(Exec{}.cuda_stream(), nb, m, n, k, trans_a, trans_b, a.data(), b.data(), c.data());
  }
#endif
  else {
    Kokkos::parallel_for(
        "meshtensor::einsum_kernel", Kokkos::RangePolicy<Exec>(0, nb * m * n), KOKKOS_LAMBDA(std::int64_t idx) {
          const std::int64_t j = idx % n, i = (idx / n) % m, bi = idx / (m * n);
          compute_t<T> acc = 0;
          for (std::int64_t p = 0; p < k; ++p) {
            const compute_t<T> x = trans_a ? a(bi * m * k + p * m + i) : a(bi * m * k + i * k + p);
            const compute_t<T> y = trans_b ? b(bi * k * n + j * k + p) : b(bi * k * n + p * n + j);
            acc += x * y;
          }
          c(idx) = acc;
        });
  }
}

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

template <class TT, class... Ds>
std::int64_t local_product(const TT& t, type_list<Ds...>) {
  return (std::int64_t{1} * ... * t.local_extents()[index_of_v<Ds, typename TT::dims>]);
}

// The axes that split the dims a product of A and B into OutList contracts: its local results
// are partial sums over them.
template <class OutList, Tensor A, Tensor B>
constexpr unsigned contracted_axes() {
  return axes_mask_of<A, difference_t<intersection_t<typename A::dims, typename B::dims>, OutList>>();
}

// Two operands whose dims all appear in the other operand or the output. With sum_partials false,
// the result is this processor's partial sum over contracted_axes() (gradient rules hand it to
// the tape, which reduces it once: autodiff/tape.hpp).
template <class OutList, bool sum_partials = true, Tensor A, Tensor B>
auto contract(const A& a, const B& b) {
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  using Bt = intersection_t<intersection_t<Ad, Bd>, OutList>;
  using Mt = difference_t<intersection_t<Ad, OutList>, Bd>;
  using Nt = difference_t<intersection_t<Bd, OutList>, Ad>;
  using Kt = difference_t<intersection_t<Ad, Bd>, OutList>;
  using Out = with_dims_t<A, OutList>;
  using Exec = typename A::execution_space;
  using T = typename A::value_type;
  if constexpr (sum_partials && std::is_same_v<T, bf16> && axes_mask_of<A, Kt>() != 0) {
    // Partial products rounded to bf16 before the allreduce would be rounded twice: in float,
    // reduced, rounded once (on a host the bf16 product widens its operands anyway).
    return cast_local<bf16>(contract<OutList, true>(cast_local<float>(a), cast_local<float>(b)));
  }
  // Operands in [batch, m, k] / [batch, k, n] order, transposed by BLAS where that suffices.
  constexpr bool a_plain = std::is_same_v<Ad, concat_t<Bt, Mt, Kt>>;
  constexpr bool a_trans = !a_plain && std::is_same_v<Ad, concat_t<Bt, Kt, Mt>>;
  constexpr bool b_plain = std::is_same_v<Bd, concat_t<Bt, Kt, Nt>>;
  constexpr bool b_trans = !b_plain && std::is_same_v<Bd, concat_t<Bt, Nt, Kt>>;
  using Ap = with_dims_t<A, concat_t<Bt, Mt, Kt>>;
  using Bp = with_dims_t<B, concat_t<Bt, Kt, Nt>>;
  using Cp = with_dims_t<A, concat_t<Bt, Mt, Nt>>;

  const auto out_extents = result_extents<Out>(a, b);
  const std::int64_t nb = local_product(a, Bt{}), m = local_product(a, Mt{}), n = local_product(b, Nt{}),
                     k = local_product(a, Kt{});
  typename A::view_type av, bv;
  if constexpr (a_plain || a_trans)
    av = a.view();
  else
    av = broadcast_local<Ap>(a, result_extents<Ap>(a)).view();
  if constexpr (b_plain || b_trans)
    bv = b.view();
  else
    bv = broadcast_local<Bp>(b, result_extents<Bp>(b)).view();

  // The product writes every element of its result (beta = 0; zeros when k == 0), so the result
  // is allocated without the zero-fill of the tensor constructor: for a product with a small k
  // that fill costs as much as the product.
  const auto product_view = [&] {
    return view_pool<T, typename Out::memory_space>::get().allocate(static_cast<std::size_t>(nb * m * n));
  };
  Out out;
  if constexpr (std::is_same_v<OutList, concat_t<Bt, Mt, Nt>>) {
    out = Out(a.mesh(), out_extents, product_view());
    batched_gemm<Exec, T>(nb, m, n, k, a_trans, b_trans, av, bv, out.view());
  } else {
    Cp c(a.mesh(), result_extents<Cp>(a, b), product_view());
    batched_gemm<Exec, T>(nb, m, n, k, a_trans, b_trans, av, bv, c.view());
    out = broadcast_local<Out>(c, out_extents);
  }
  if constexpr (sum_partials) allreduce_local(out, axes_mask_of<A, Kt>(), reduce_op::sum);
  return out;
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
      [a, b](const R& g) {
        // Rules call the kernel, not einsum, so no gradient-of-gradient code is instantiated.
        // Partial sums over the contracted dims' axes: the tape reduces them (autodiff/tape.hpp).
        if (a.tracks_grad()) push_partial_grad(a, contract<Ad, false>(g, b), contracted_axes<Ad, R, B>());
        if (b.tracks_grad()) push_partial_grad(b, contract<Bd, false>(a, g), contracted_axes<Bd, A, R>());
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
  meshtensor::detail::plan_op_scope plan_scope("einsum");
  using OutList = type_list<Out...>;
  using Ad = typename A::dims;
  using Bd = typename B::dims;
  using Ak = intersection_t<Ad, union_t<Bd, OutList>>;
  using Bk = intersection_t<Bd, union_t<Ad, OutList>>;
  if constexpr (!detail::einsum_types_ok<OutList, A, B>()) {
    return {};
  } else {
    detail::check_shared_extents("einsum", a, b);
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
