#pragma once
// map_to: the tensor-typed wrapper of the map kernel (kernels/map.hpp). It only hands over
// pointers, extents and positions, so the kernel is compiled per (space, functor, element types)
// and not per layout.
#include "../../kernels/map.hpp"
#include "op_support.hpp"

namespace meshtensor::detail {

// Out (of the given extents) with out(o) = f(ops(o)...), each operand broadcast along the dims it
// lacks. f is a named functor, not a lambda, so that every layout shares one kernel; this wrapper
// only hands over pointers (compile time).
template <Tensor Out, class F, Tensor... Ops>
Out map_to(const typename Out::extents_type& extents, F f, const Ops&... ops) {
  using mem = typename Out::memory_space;
  Out out((ops.mesh(), ...), extents, uninitialized);
  map_kernel<typename Out::execution_space>(
      out.view(), out.local_extents().data(), static_cast<int>(Out::rank), f,
      map_input<typename Ops::value_type, mem>{ops.view(), positions_in_v<Out, Ops>.data(), ops.local_extents().data(),
                                               Ops::rank}...);
  return out;
}

}  // namespace meshtensor::detail
