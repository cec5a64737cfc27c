#pragma once
// one_hot<NewDim>(indices, depth, on, off): a tensor over the indices' dims followed by NewDim of
// extent depth, holding `on` where NewDim's index equals the index value and `off` elsewhere.
// Communication: none, also when NewDim is split (each processor compares against its offset).
// As in tf.one_hot (which Mesh-TensorFlow uses), an index outside [0, depth), or a floating
// index that is not a whole number, gives a row of `off` values rather than an error.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "../plan/comm_plan.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "op_call.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace detail {
// The result's element type: V if given, else a floating index type itself, else float.
template <class V, class I>
using one_hot_value_t =
    std::conditional_t<!std::is_void_v<V>, V, std::conditional_t<is_real_v<I>, I, float>>;

template <class NewDim, class V, Tensor I>
using one_hot_result_t = typename with_dims_t<I, union_t<typename I::dims, type_list<NewDim>>>::template rebind<
    one_hot_value_t<V, typename I::value_type>>;
}  // namespace detail

// No communication in any layout.
template <Tensor I, Dim NewDim>
constexpr comm_plan one_hot_plan() {
  return comm_plan{};
}

// Gradient: none (the indices are not differentiable; the result is not on the tape).
template <Dim NewDim, class V = void, Tensor I>
detail::one_hot_result_t<NewDim, V, I> one_hot(const I& indices, std::int64_t depth,
                                               detail::one_hot_value_t<V, typename I::value_type> on = 1,
                                               detail::one_hot_value_t<V, typename I::value_type> off = 0) {
  using Out = detail::one_hot_result_t<NewDim, V, I>;
  using IT = typename I::value_type;
  static_assert(!contains_v<NewDim, typename I::dims>, "meshtensor: one_hot's new dim is already a dim of the indices");
  static_assert(std::is_arithmetic_v<IT>, "meshtensor: one_hot needs integer (or whole floating) indices");
  auto ext = typename Out::extents_type{};
  for (std::size_t i = 0; i < I::rank; ++i) ext[i] = indices.extents()[i];
  ext[I::rank] = depth;
  detail::check_parts<NewDim, Out>("one_hot", indices.mesh(), depth);
  const detail::op_call call(detail::planned_op{"one_hot", one_hot_plan<I, NewDim>()}, indices);
  Out out(indices.mesh(), ext, uninitialized);  // the kernel writes every element
  const std::int64_t n = out.local_extents()[I::rank], begin = out.template offset<NewDim>();
  auto iv = indices.view();
  auto ov = out.view();
  kernels::parallel_for(
      "meshtensor::one_hot", kernels::range<typename Out::execution_space>(0, out.local_size()),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const IT id = iv(idx / n);
        ov(idx) = (id == static_cast<IT>(begin + idx % n)) ? on : off;
      });
  return out;
}

}  // namespace meshtensor
