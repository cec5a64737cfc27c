#pragma once
// slice<D>, pad<D> (with zeros), concat<D> and split_along<D>: cut, widen, join and cut apart a
// tensor along one dim, which may be split (Mesh-TensorFlow refuses that; here the data moves).
// Communication: none when D is not split; when it is, one allgather over D's axes per input
// (concat: two), after which each processor keeps the part of the result it holds.
// (split_along, not split: meshtensor::split<Dim, Axes...> is the layout rule.)
#include <array>
#include <concepts>
#include <cstdint>

#include "../plan/comm_plan.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"

namespace meshtensor {

namespace diagnostic {
template <class DimsA, class DimsB>
struct concat_dims_in_different_orders {
  static_assert(sizeof(DimsA) == 0,
                "meshtensor: concat's operands have the same dims in different orders; transpose<Dims...> "
                "one of them to the other's order first");
};
template <class DimsA, class DimsB>
struct concat_dims_differ {
  static_assert(sizeof(DimsA) == 0, "meshtensor: concat's operands must have the same dims");
};
}  // namespace diagnostic

namespace detail {

// Non-recording kernels, also used by the gradient rules.
template <Dim D, Tensor X>
X slice_impl(const X& x, std::int64_t begin, std::int64_t size) {
  X out(x.mesh(), with_extent<D>(x, size), uninitialized);  // the slice lies within x: every element placed
  place_along<D>(out, full_along<D>(x), -begin);
  return out;
}
template <Dim D, Tensor X>
X pad_impl(const X& x, std::int64_t before, std::int64_t after) {
  X out(x.mesh(), with_extent<D>(x, x.template extent<D>() + before + after));
  place_along<D>(out, full_along<D>(x), before);
  return out;
}
template <Dim D, Tensor X>
X concat_impl(const X& a, const X& b) {
  const std::int64_t na = a.template extent<D>();
  X out(a.mesh(), with_extent<D>(a, na + b.template extent<D>()), uninitialized);  // a and b cover it
  place_along<D>(out, full_along<D>(a), 0);
  place_along<D>(out, full_along<D>(b), na);
  return out;
}

// Two operands of concat agree on every dim but D.
template <Dim D, Tensor X>
void check_other_extents(const char* op, const X& a, const X& b) {
  const auto names = X::dim_names();
  for (std::size_t i = 0; i < X::rank; ++i)
    if (i != X::template index_of<D>() && a.extents()[i] != b.extents()[i])
      throw shape_error(cat(op, ": dim '", names[i], "' has extent ", a.extents()[i], " in the first operand but ",
                            b.extents()[i], " in the second; only '", D::name(), "' may differ"));
}
}  // namespace detail

// ---- plans ------------------------------------------------------------------------------------
// slice, pad and split_along: one allgather over D's axes (none when D is not split).
template <Tensor X, Dim D>
constexpr comm_plan slice_plan() {
  return comm_plan{}.then(collective::allgather, X::layout_type::template split_of<D>().mask());
}
template <Tensor X, Dim D>
constexpr comm_plan pad_plan() {
  return slice_plan<X, D>();
}
template <Tensor X, Dim D>
constexpr comm_plan split_along_plan() {
  return slice_plan<X, D>();
}
// concat: one allgather over D's axes per operand.
template <Tensor X, Dim D>
constexpr comm_plan concat_plan() {
  return comm_plan{}.then(slice_plan<X, D>()).then(slice_plan<X, D>());
}

// ---- ops --------------------------------------------------------------------------------------
// Elements [begin, begin + size) of x along D. Gradient: pad back with zeros.
template <Dim D, Tensor X>
X slice(const X& x, std::int64_t begin, std::int64_t size) {
  detail::require_contiguous_along<"slice", D, X>();
  const detail::op_call call(detail::planned_op{"slice", slice_plan<X, D>()}, x);
  const std::int64_t n = x.template extent<D>();
  if (begin < 0 || size < 0 || begin + size > n)
    throw shape_error(detail::cat("slice: [", begin, ", ", begin + size, ") along dim '", D::name(),
                                  "' is not within its extent ", n, " in ", X::type_name(), x.shape_string()));
  detail::check_parts<D, X>("slice", x.mesh(), size);
  X out = detail::slice_impl<D>(x, begin, size);
  detail::record<X>(
      out, [x = detail::node_only(x), begin, size, n](const X& g) { detail::push_grad(x, detail::pad_impl<D>(g, begin, n - begin - size)); }, x);
  return out;
}

// x with `before` zeros ahead of it and `after` zeros behind it along D. Gradient: slice back.
template <Dim D, Tensor X>
X pad(const X& x, std::int64_t before, std::int64_t after) {
  const detail::op_call call(detail::planned_op{"pad", pad_plan<X, D>()}, x);
  if (before < 0 || after < 0)
    throw shape_error(detail::cat("pad: negative padding (", before, ", ", after, ") along dim '", D::name(), "'"));
  const std::int64_t n = x.template extent<D>();
  detail::check_parts<D, X>("pad", x.mesh(), n + before + after);
  X out = detail::pad_impl<D>(x, before, after);
  detail::record<X>(out, [x = detail::node_only(x), before, n](const X& g) { detail::push_grad(x, detail::slice_impl<D>(g, before, n)); }, x);
  return out;
}

// a followed by b along D; every other dim must agree. Gradient: the two slices of the gradient.
// Two tensor types, not one, so that operands that differ get a sentence, not a deduction failure.
template <Dim D, Tensor X, Tensor B>
X concat(const X& a, const B& b) {
  const detail::op_call call(detail::planned_op{"concat", concat_plan<X, D>()}, a);
  using Ad = typename X::dims;
  using Bd = typename B::dims;
  if constexpr (!std::is_same_v<X, B>) {
    if constexpr (std::is_same_v<Ad, Bd>)
      (void)sizeof(diagnostic::operands_differ_in_layout<X, B>);
    else if constexpr (Ad::size == Bd::size && difference_t<Ad, Bd>::size == 0)
      (void)sizeof(diagnostic::concat_dims_in_different_orders<Ad, Bd>);
    else
      (void)sizeof(diagnostic::concat_dims_differ<Ad, Bd>);
    return a;
  } else {
    detail::check_other_extents<D>("concat", a, b);
    const std::int64_t na = a.template extent<D>(), nb = b.template extent<D>();
    detail::check_parts<D, X>("concat", a.mesh(), na + nb);
    X out = detail::concat_impl<D>(a, b);
    detail::record<X>(
        out,
        [a = detail::node_only(a), b = detail::node_only(b), na, nb](const X& g) {
          if (a.tracks_grad()) detail::push_grad(a, detail::slice_impl<D>(g, 0, na));
          if (b.tracks_grad()) detail::push_grad(b, detail::slice_impl<D>(g, na, nb));
        },
        a, b);
    return out;
  }
}

// x cut along D into consecutive pieces of the given sizes (which must add up to D's extent).
// Gradient of each piece: padded back into place with zeros.
template <Dim D, Tensor X, std::integral... S>
std::array<X, sizeof...(S)> split_along(const X& x, S... sizes) {
  const detail::op_call call(detail::planned_op{"split_along", split_along_plan<X, D>()}, x);
  static_assert(sizeof...(S) > 0, "meshtensor: split_along<D>(x, sizes...) needs at least one size");
  const std::int64_t n = x.template extent<D>();
  const std::array<std::int64_t, sizeof...(S)> sz{static_cast<std::int64_t>(sizes)...};
  std::int64_t total = 0;
  for (auto s : sz) {
    if (s < 0) throw shape_error(detail::cat("split_along: negative size ", s, " along dim '", D::name(), "'"));
    total += s;
  }
  if (total != n)
    throw shape_error(detail::cat("split_along: sizes add up to ", total, " but dim '", D::name(), "' has extent ", n));
  for (auto s : sz) detail::check_parts<D, X>("split_along", x.mesh(), s);
  // One gather serves every piece.
  const auto full = detail::full_along<D>(x);
  std::array<X, sizeof...(S)> out;
  std::int64_t begin = 0;
  for (std::size_t p = 0; p < sz.size(); ++p) {
    out[p] = X(x.mesh(), detail::with_extent<D>(x, sz[p]));
    detail::place_along<D>(out[p], full, -begin);
    const std::int64_t size = sz[p];
    detail::record<X>(
        out[p],
        [x = detail::node_only(x), begin, size, n](const X& g) { detail::push_grad(x, detail::pad_impl<D>(g, begin, n - begin - size)); },
        x);
    begin += sz[p];
  }
  return out;
}

}  // namespace meshtensor
