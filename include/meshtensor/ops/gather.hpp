#pragma once
// gather<V>(table, indices): embedding lookup, out[indices' dims..., table's other dims...] =
// table[.., indices[...], ..] along the table's dim V (e.g. table[vocab, d_model], ids[batch, seq]
// -> out[batch, seq, d_model]).
// Communication: one allreduce of a 1-element error count over the axes that split the indices
// (so that every rank throws alike on an id outside [0, extent of V)); then, when V is split, each
// processor looks up the ids in its range of V (zeros elsewhere) and one allreduce over V's axes
// sums the parts. The gradient (to the table only) scatter-adds into the local table slice, ids
// outside the local range skipped, then allreduces over the axes that split the indices, which
// hold different ids (none when the indices are replicated, whether or not V is split).
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../plan/comm_plan.hpp"
#include "../runtime/collectives.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "sum_broadcast.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace diagnostic {
template <class VocabDim, class Indices>
struct gather_vocab_axes_split_indices {
  static_assert(sizeof(VocabDim) == 0,
                "meshtensor: gather<V>: an axis that splits the table's dim V also splits a dim of the indices; "
                "the processors along it hold different ids, so summing their lookups would mix them; split V "
                "and the indices' dims over different axes");
};
template <class Table, class Indices>
struct gather_operands_differ_in_layout {
  static_assert(sizeof(Table) == 0, "meshtensor: gather's table and indices must share layout and execution space");
};
}  // namespace diagnostic

namespace detail {
template <class A, class B>
struct join_lists;
template <class... A, class... B>
struct join_lists<type_list<A...>, type_list<B...>> {
  using type = type_list<A..., B...>;
};
template <class V, class Table, class Idx>
using gather_result_t = with_dims_t<Table, typename join_lists<typename Idx::dims, difference_t<typename Table::dims, type_list<V>>>::type>;

template <class V, class Table, class Idx>
constexpr void check_gather_types() {
  if constexpr (!std::is_same_v<typename Table::layout_type, typename Idx::layout_type> ||
                !std::is_same_v<typename Table::execution_space, typename Idx::execution_space>)
    (void)sizeof(diagnostic::gather_operands_differ_in_layout<Table, Idx>);
  static_assert(contains_v<V, typename Table::dims>, "meshtensor: gather<V>: the table has no dim V");
  constexpr unsigned vocab_axes = Table::layout_type::template split_of<V>().mask();
  if constexpr ((vocab_axes & axes_mask_of<Idx, typename Idx::dims>()) != 0)
    (void)sizeof(diagnostic::gather_vocab_axes_split_indices<V, Idx>);
}

// Every rank learns whether any id anywhere is outside [0, n) or not whole, then all throw alike.
template <class V, Tensor Idx>
void check_ids(const Idx& ids, std::int64_t n) {
  using IT = typename Idx::value_type;
  auto iv = ids.view();
  std::int64_t bad = 0;
  kernels::parallel_reduce(
      "meshtensor::check_ids", kernels::range<typename Idx::execution_space>(0, ids.local_size()),
      KOKKOS_LAMBDA(std::int64_t k, std::int64_t & acc) {
        const IT v = iv(k);
        bool ok = v >= IT(0) && v < static_cast<IT>(n);
        if constexpr (is_real_v<IT>) ok = ok && v == static_cast<IT>(static_cast<std::int64_t>(v));
        acc += ok ? 0 : 1;
      },
      bad);
  constexpr unsigned axes = axes_mask_of<Idx, typename Idx::dims>();
  if constexpr (axes != 0) allreduce(ids.mesh().communicator(), axes, &bad, 1);
  if (bad != 0)
    throw error(cat("gather: ", bad, " id(s) in ", Idx::type_name(), ids.shape_string(),
                    " are not whole numbers in [0, ", n, "), the extent of the table's dim '", V::name(), "'"));
}

// The lookup (forward) and the scatter-add of its gradient, as a named functor (one kernel per
// element and id type, not per layout). One work item per (id, outer index) copies or adds a run
// of `inner` contiguous elements: per element, the index arithmetic (four 64-bit divisions) cost
// more than the copy. The scatter-add is atomic only where work items run concurrently: on one
// thread a locked add per element cost more than the rest of the kernel.
template <class T, class I, class Mem>
struct gather_rows_fn {
  along_view<Kokkos::View<T*, Mem>> tab;  // the table's local slice as [outer, n, inner]
  Kokkos::View<I*, Mem> iv;
  Kokkos::View<T*, Mem> rows;  // [ids..., outer, inner]: the lookup's result, or its gradient
  bool grad, atomic;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t o = item % tab.outer;
    const std::int64_t r = static_cast<std::int64_t>(iv(item / tab.outer)) - tab.begin;
    const bool mine = r >= 0 && r < tab.n;
    T* row = rows.data() + item * tab.inner;
    if (!grad) {
      for (std::int64_t i = 0; i < tab.inner; ++i) row[i] = mine ? tab.v(tab.at(o, r, i)) : T(0);
    } else if (mine) {
      for (std::int64_t i = 0; i < tab.inner; ++i) {
        if (atomic) {
          if constexpr (std::is_same_v<T, bf16>)
            atomic_add(&tab.v(tab.at(o, r, i)), row[i]);
          else
            Kokkos::atomic_add(&tab.v(tab.at(o, r, i)), row[i]);
        }
        else
          tab.v(tab.at(o, r, i)) += row[i];
      }
    }
  }
};

// The lookup of the ids that fall in this processor's range of V; zeros for the others.
template <class V, Tensor Table, Tensor Idx>
auto gather_local(const Table& table, const Idx& ids) {
  using Out = gather_result_t<V, Table, Idx>;
  using Exec = typename Out::execution_space;
  typename Out::extents_type ext{};
  for (std::size_t k = 0; k < Idx::rank; ++k) ext[k] = ids.extents()[k];
  for (std::size_t k = 0, j = Idx::rank; k < Table::rank; ++k)
    if (k != Table::template index_of<V>()) ext[j++] = table.extents()[k];
  Out out(table.mesh(), ext, uninitialized);  // every element is written below
  const auto tab = local_along<V>(table);
  const gather_rows_fn<typename Table::value_type, typename Idx::value_type, typename Table::memory_space> f{
      tab, ids.view(), out.view(), false, false};
  kernels::parallel_for("meshtensor::gather", kernels::range<Exec>(0, ids.local_size() * tab.outer), f);
  return out;
}

// Gradient kernel: scatter-add g into a zero table slice: a partial sum over the indices' axes,
// reduced by the tape (autodiff/tape.hpp).
template <class V, Tensor Table, Tensor Idx, Tensor G>
Table gather_grad(const Table& table, const Idx& ids, const G& g) {
  using Exec = typename Table::execution_space;
  Table gt(table.mesh(), table.extents());
  auto tab = local_along<V>(table);
  tab.v = gt.view();
  const gather_rows_fn<typename Table::value_type, typename Idx::value_type, typename Table::memory_space> f{
      tab, ids.view(), g.view(), true, Exec{}.concurrency() > 1};
  kernels::parallel_for("meshtensor::gather_grad", kernels::range<Exec>(0, ids.local_size() * tab.outer), f);
  return gt;
}
}  // namespace detail

// The id check's allreduce over the indices' split axes, then the allreduce over V's axes.
template <Tensor Table, Tensor Idx, Dim V>
constexpr comm_plan gather_plan() {
  return comm_plan{}
      .then(collective::allreduce, detail::axes_mask_of<Idx, typename Idx::dims>())
      .then(collective::allreduce, Table::layout_type::template split_of<V>().mask());
}

// Throws meshtensor::error on every rank when any id is outside [0, extent of V) or not whole.
template <Dim V, Tensor Table, Tensor Idx>
detail::gather_result_t<V, Table, Idx> gather(const Table& table, const Idx& ids) {
  using Out = detail::gather_result_t<V, Table, Idx>;
  detail::check_gather_types<V, Table, Idx>();
  const detail::op_call call(detail::planned_op{"gather", gather_plan<Table, Idx, V>()}, table);
  detail::check_ids<V>(ids, table.template extent<V>());
  Out out = detail::gather_local<V>(table, ids);
  detail::allreduce_slice(out, Table::layout_type::template split_of<V>().mask(), reduce_op::sum);
  detail::record<Out>(
      out,
      // The table's node and extents only: a table made for this lookup (a bf16 copy of a float
      // weight, one gathered by FSDP) is then freed after the forward pass, not held to the backward.
      [table = detail::node_only(table), ids](const Out& g) {
        detail::push_weight_grad(table, [table, ids = detail::without_node(ids), g = detail::without_node(g)] {
          detail::push_partial_grad(table, detail::gather_grad<V>(table, ids, g), detail::axes_mask_of<Idx, typename Idx::dims>());
        });
      },
      table);
  return out;
}

}  // namespace meshtensor
