#pragma once
// local_chunk<D>(x, c, chunks): piece c of `chunks` equal pieces of every processor's part of D,
// as a tensor of x's type whose D has 1/chunks of x's extent. No communication, whatever the
// layout: each processor keeps rows of its own part. Where D is whole it is slice<D>(x, c * n /
// chunks, n / chunks). Where D is split, the result's global order is not x's (processor q's rows
// of piece c are the result's part q): the pieces c = 0 .. chunks - 1 hold every element of x
// once, which is what work that treats D's positions alike needs (a per-token loss summed or
// averaged, Llama's loss in chunks: nn/chunked_cross_entropy.hpp), without the allgather a slice
// of a split dim makes. Under zigzag<D, ...> each of a part's two ranges is cut alike, so the
// result is zigzag again. Every part (every range, under zigzag) must have the same extent, a
// multiple of `chunks`: D's extent a multiple of parts x chunks (2 x parts x chunks under zigzag).
// Gradient: put back into its rows of a zero tensor of x's shape (each piece's gradient is x-sized:
// summed over the pieces, `chunks` times x's bytes written).
#include <cstdint>
#include <string>

#include "../plan/comm_plan.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"

namespace meshtensor {
namespace detail {

// Where piece c of a part's rows lies: the part's ranges (2 under zigzag), each of `range` rows,
// cut into pieces of `piece` rows; a piece's local row l is range l / piece's row
// c * piece + l % piece.
struct chunk_rows {
  std::int64_t range = 0, piece = 0, c = 0;
  KOKKOS_INLINE_FUNCTION std::int64_t source(std::int64_t l) const {
    return (l / piece) * range + c * piece + l % piece;
  }
};

// The piece's rows copied out of x's local data (to_piece) or into a zeroed x-shaped tensor (back).
template <Dim D, Tensor X>
void copy_chunk_rows(const X& from, X& to, const chunk_rows& rows, bool to_piece) {
  const auto src = local_along<D>(from);
  const auto dst = local_along<D>(to);
  const auto piece_view = to_piece ? dst : src;  // the side indexed by the piece's rows
  const auto whole_view = to_piece ? src : dst;
  auto pv = piece_view.v;
  auto wv = whole_view.v;
  kernels::parallel_for(
      "meshtensor::local_chunk", kernels::range<typename X::execution_space>(0, piece_view.outer * piece_view.n * piece_view.inner),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t o = idx / (piece_view.n * piece_view.inner), l = (idx / piece_view.inner) % piece_view.n,
                           i = idx % piece_view.inner;
        const std::int64_t w = whole_view.at(o, rows.source(l), i);
        if (to_piece)
          pv(idx) = wv(w);
        else
          wv(w) = pv(idx);
      });
}

}  // namespace detail

// ---- plans ------------------------------------------------------------------------------------
// local_chunk: none, whatever the layout.
template <Tensor X, Dim D>
constexpr comm_plan local_chunk_plan() {
  return comm_plan{};
}

// ---- ops --------------------------------------------------------------------------------------
template <Dim D, Tensor X>
X local_chunk(const X& x, std::int64_t c, std::int64_t chunks) {
  const detail::op_call call(detail::planned_op{"local_chunk", local_chunk_plan<X, D>()}, x);
  constexpr auto s = X::layout_type::template split_of<D>();
  const std::int64_t n = x.template extent<D>();
  const std::int64_t parts = s.parts(x.mesh().communicator().shape().sizes());
  const std::int64_t ranges = s.zigzag() ? 2 : 1;
  // Extents and the mesh are the same on every rank: every rank refuses alike.
  if (chunks < 1 || c < 0 || c >= chunks)
    throw shape_error(detail::cat("local_chunk: piece ", c, " of ", chunks, " along dim '", D::name(),
                                  "': the pieces are numbered 0 to chunks - 1, and there is at least one"));
  if (n % (parts * ranges * chunks) != 0) {
    const std::string each = parts * ranges == 1 ? std::string()
                             : detail::cat(" in each of its ", parts * ranges, s.zigzag() ? " zigzag ranges" : " parts");
    throw shape_error(detail::cat("local_chunk: dim '", D::name(), "' of extent ", n, " in ", X::type_name(),
                                  x.shape_string(), " is to be cut into ", chunks, " equal pieces", each,
                                  ": its extent must be a multiple of ", parts * ranges * chunks));
  }
  const std::int64_t range = n / (parts * ranges);
  const detail::chunk_rows rows{range, range / chunks, c};
  X out(x.mesh(), detail::with_extent<D>(x, n / chunks), uninitialized);  // every row written
  detail::copy_chunk_rows<D>(x, out, rows, true);
  detail::record<X>(
      out,
      [x = detail::node_only(x), rows](const X& g) {
        X back(x.mesh(), x.extents());  // zeros outside the piece
        detail::copy_chunk_rows<D>(g, back, rows, false);
        detail::push_fresh_grad(x, std::move(back));
      },
      x);
  return out;
}

}  // namespace meshtensor
