#pragma once
// update_slice<D>(into, x, offset): writes x into `into` in place at [offset, offset + x's extent)
// along D; every other dim must agree. For buffers filled piece by piece (a decoder's key-value
// cache): concat would copy the whole buffer for every piece.
// Communication: none when D is not split (each processor writes from its own slice of x, which
// covers the same part of the other dims). When it is, one allgather of x (not of `into`) over
// D's axes, after which only the processors whose part of D meets the written range write.
// No gradient: it overwrites its operand, which the tape may have kept for a backward pass; it
// throws on tensors that are on the tape (use it under no_grad, as generation does).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../plan/comm_plan.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "slice.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace detail {

// dst(o, g - dst.begin, i) = src(o, g - start - src.begin, i) for g in [lo, hi), a range within
// both (global indices along D): only the written positions, not the whole of dst.
template <class Exec, class View>
void write_along(const along_view<View>& dst, const along_view<View>& src, std::int64_t start, std::int64_t lo,
                 std::int64_t hi) {
  const std::int64_t count = hi - lo;
  if (count <= 0) return;
  kernels::parallel_for(
      "meshtensor::update_slice", kernels::range<Exec>(0, dst.outer * count * dst.inner),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (count * dst.inner), l = (idx / dst.inner) % count, i = idx % dst.inner;
        dst.v(dst.at(o, lo + l - dst.begin, i)) = src.v(src.at(o, lo + l - start - src.begin, i));
      });
}

}  // namespace detail

// ---- plan -------------------------------------------------------------------------------------
// One allgather of x over D's axes (none when D is not split).
template <Tensor X, Dim D>
constexpr comm_plan update_slice_plan() {
  return comm_plan{}.then(collective::allgather, X::layout_type::template split_of<D>().mask());
}

// ---- op ---------------------------------------------------------------------------------------
// into[.., offset + l, ..] = x[.., l, ..] along D for l in [0, x's extent); the rest of `into` is
// left as it is. Tensors that share into's data (copies of it) see the change.
template <Dim D, Tensor X, Tensor B>
void update_slice(X& into, const B& x, std::int64_t offset) {
  const detail::op_call call(detail::planned_op{"update_slice", update_slice_plan<X, D>()}, into);
  if constexpr (!std::is_same_v<X, B>) {
    (void)sizeof(diagnostic::operands_differ_in_layout<X, B>);
  } else {
    const std::int64_t n = into.template extent<D>(), s = x.template extent<D>();
    if (offset < 0 || offset + s > n)
      throw shape_error(detail::cat("update_slice: ", s, " elements along dim '", D::name(), "' at offset ", offset,
                                    " do not fit within its extent ", n, " in ", X::type_name(), into.shape_string()));
    detail::check_other_extents<D>("update_slice", into, x);
    // A tensor on the tape: its old values may be read by the backward pass, and x would get no
    // gradient. All ranks see the same flags, so all throw alike.
    if (into.tracks_grad() || (x.tracks_grad() && !detail::recording_paused()))
      throw error(detail::cat("update_slice along dim '", D::name(), "' has no gradient: it overwrites its operand in ",
                              "place; call it under no_grad on tensors that do not require gradients"));
    // Gathered only where D is split; then every processor holds x's whole extent along D.
    const auto src = detail::full_along<D>(x);
    const auto dst = detail::local_along<D>(into);
    const std::int64_t lo = std::max(dst.begin, offset), hi = std::min(dst.begin + dst.n, offset + s);
    detail::write_along<typename X::execution_space>(dst, src, offset, lo, hi);
  }
}

}  // namespace meshtensor
