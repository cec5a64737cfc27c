#pragma once
// fuse(f, x0, x1, ...): an elementwise expression of tensors evaluated by one kernel, with its
// gradient by one kernel.
//
//   auto y = mt::fuse([](auto x, auto b) { return mt::gelu(x + b); }, h, bias);
//   auto a = mt::fuse([&](auto x, auto s) { return x + nn::dropout(s, rate, seed, step); }, in, sub);
//
// f is called once, on the host, with placeholders for the tensors; the ops it applies to them
// (the unary and binary ops of elementwise.hpp and their operators, scalars, where, nn::dropout)
// build the expression as a type, whose nodes are the op tables' own f, df, da and db. The result
// holds the union of the tensors' dims (broadcasting by name, as the binary ops), under their
// layout. Forward: one kernel writes the result; no intermediate is stored. Backward: one kernel
// computes every tensor's gradient element from the result's gradient (the chain rule of the
// expression, derived at compile time, evaluated per element); a tensor that lacks some of the
// result's dims then has its gradient summed over them (an allreduce where they are split, as a
// binary op's broadcast operand). The tape keeps only the tensors whose values the backward reads
// (x * 2 + y keeps none; gelu(x + b) keeps x and b, not x + b; the others as detail::node_only); a dropout mask is drawn again from
// its counter in the backward kernel, never stored. Complex tensors take the ops that take complex
// values unfused (the holomorphic ones: arithmetic, exp, log, sqrt, sin, cos, square, reciprocal), with
// gradients in the same conjugate Wirtinger convention; an op that refuses them refuses them here.
//
// Why an explicit fuse and not operators that return lazy expressions (Eigen, xtensor): the point
// where memory is written stays visible, no expression outlives the tensors it refers to (Eigen's
// dangling `auto`), and every other op keeps taking tensors, not expressions. docs/design/ops.md,
// "Fused elementwise expressions".
//
// Communication: none forward; the gradient's sums over broadcast dims as above.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../element/complex.hpp"
#include "elementwise.hpp"
#include "../kernels/indexing.hpp"
#include "../kernels/walk.hpp"
#include "../tensor/init.hpp"

namespace meshtensor {

namespace fused {

// A bit per tensor of the expression (x0 is bit 0).
using leaf_set = std::uint64_t;

template <class E>
concept expression = requires { E::is_fused_expression; };

// A value and its partial derivatives with respect to the N tensors.
template <class C, std::size_t N>
struct dual {
  C v;
  Kokkos::Array<C, N> d;
};
template <class C, std::size_t N>
KOKKOS_INLINE_FUNCTION dual<C, N> scaled(C v, const dual<C, N>& a, C s) {
  dual<C, N> r{v, {}};
  for (std::size_t k = 0; k != N; ++k) r.d[k] = a.d[k] * s;
  return r;
}

// Each node: value(v, g) and with_partials(v, g) from the tensors' values v at the element whose
// global index is g (only dropout reads g); the tensors it contains (leaves), those whose values
// its partials read (reads), and whether it reads g (uses_index).

// The I-th tensor.
template <std::size_t I>
struct leaf {
  static constexpr bool is_fused_expression = true;
  static constexpr leaf_set leaves = leaf_set{1} << I, reads = 0;
  static constexpr bool uses_index = false;
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION C value(const Kokkos::Array<C, N>& v, std::int64_t) const {
    return v[I];
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION dual<C, N> with_partials(const Kokkos::Array<C, N>& v, std::int64_t) const {
    dual<C, N> r{v[I], {}};
    for (std::size_t k = 0; k != N; ++k) r.d[k] = C(0);
    r.d[I] = C(1);
    return r;
  }
  static std::string describe() { return "x" + std::to_string(I); }
};

// A scalar, held as double and taken in the compute type.
struct constant {
  static constexpr bool is_fused_expression = true;
  static constexpr leaf_set leaves = 0, reads = 0;
  static constexpr bool uses_index = false;
  double c;
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION C value(const Kokkos::Array<C, N>&, std::int64_t) const {
    return static_cast<C>(c);
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION dual<C, N> with_partials(const Kokkos::Array<C, N>&, std::int64_t) const {
    dual<C, N> r{static_cast<C>(c), {}};
    for (std::size_t k = 0; k != N; ++k) r.d[k] = C(0);
    return r;
  }
  static std::string describe() { return "scalar"; }
};

template <class Fn>
inline constexpr bool linear_unary = std::is_same_v<Fn, meshtensor::fn::negative_fn>;

template <class Fn, expression A>
struct unary_node {
  static constexpr bool is_fused_expression = true;
  static constexpr leaf_set leaves = A::leaves;
  // A partial of a nonlinear f reads its operand's value, so every tensor under it.
  static constexpr leaf_set reads = A::reads | (linear_unary<Fn> ? 0 : A::leaves);
  static constexpr bool uses_index = A::uses_index;
  A a;
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION C value(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    return Fn::f(a.value(v, g));
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION dual<C, N> with_partials(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    const dual<C, N> x = a.with_partials(v, g);
    const C y = Fn::f(x.v);
    return scaled(y, x, Fn::df(x.v, y));
  }
  static std::string describe() { return std::string(Fn::name) + "(" + A::describe() + ")"; }
};

// What a binary op's partials read: da reads B (multiply, divide) or both operands (the rest);
// db likewise. Each is needed only where its operand holds a tensor.
template <class Fn, class A, class B>
constexpr leaf_set binary_reads() {
  using namespace meshtensor::fn;
  constexpr leaf_set both = A::leaves | B::leaves;
  if constexpr (std::is_same_v<Fn, add_fn> || std::is_same_v<Fn, subtract_fn>)
    return 0;
  else if constexpr (std::is_same_v<Fn, equal_fn> || std::is_same_v<Fn, not_equal_fn> || std::is_same_v<Fn, less_fn> ||
                     std::is_same_v<Fn, less_equal_fn> || std::is_same_v<Fn, greater_fn> ||
                     std::is_same_v<Fn, greater_equal_fn>)
    return 0;  // no gradient passes
  else if constexpr (std::is_same_v<Fn, multiply_fn>)
    return (A::leaves ? B::leaves : 0) | (B::leaves ? A::leaves : 0);
  else if constexpr (std::is_same_v<Fn, divide_fn>)
    return (A::leaves ? B::leaves : 0) | (B::leaves ? both : 0);
  else
    return both;
}

template <class Fn, expression A, expression B>
struct binary_node {
  static constexpr bool is_fused_expression = true;
  static constexpr leaf_set leaves = A::leaves | B::leaves;
  static constexpr leaf_set reads = A::reads | B::reads | binary_reads<Fn, A, B>();
  static constexpr bool uses_index = A::uses_index || B::uses_index;
  A a;
  B b;
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION C value(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    return Fn::f(a.value(v, g), b.value(v, g));
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION dual<C, N> with_partials(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    const dual<C, N> x = a.with_partials(v, g), y = b.with_partials(v, g);
    const C da = Fn::da(x.v, y.v), db = Fn::db(x.v, y.v);
    dual<C, N> r{Fn::f(x.v, y.v), {}};
    for (std::size_t k = 0; k != N; ++k) r.d[k] = x.d[k] * da + y.d[k] * db;
    return r;
  }
  static std::string describe() { return std::string(Fn::name) + "(" + A::describe() + ", " + B::describe() + ")"; }
};

// where(c, a, b): a where c != 0, else b; no gradient to c.
template <expression Cond, expression A, expression B>
struct select_node {
  static constexpr bool is_fused_expression = true;
  static constexpr leaf_set leaves = Cond::leaves | A::leaves | B::leaves;
  static constexpr leaf_set reads = Cond::leaves | A::reads | B::reads;
  static constexpr bool uses_index = Cond::uses_index || A::uses_index || B::uses_index;
  Cond c;
  A a;
  B b;
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION C value(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    return c.value(v, g) != C(0) ? a.value(v, g) : b.value(v, g);
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION dual<C, N> with_partials(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    return c.value(v, g) != C(0) ? a.with_partials(v, g) : b.with_partials(v, g);
  }
  static std::string describe() { return "where(" + Cond::describe() + ", " + A::describe() + ", " + B::describe() + ")"; }
};

// nn::dropout of an expression: kept with probability 1 - rate and scaled by 1 / (1 - rate). The
// mask is nn::dropout_mask's, a function of (seed, step, the element's global index in the
// result), so the fused form equals x * dropout_mask where the dropped operand has the result's
// dims; the backward kernel draws it again.
template <expression A>
struct dropout_node {
  static constexpr bool is_fused_expression = true;
  static constexpr leaf_set leaves = A::leaves, reads = A::reads;
  static constexpr bool uses_index = true;
  A a;
  double rate, keep_scale;
  std::uint64_t seed, stream;
  template <class C>
  KOKKOS_INLINE_FUNCTION C mask(std::int64_t g) const {
    if (rate <= 0) return C(1);
    return meshtensor::detail::uniform01(seed, static_cast<std::uint64_t>(g), stream) >= rate ? static_cast<C>(keep_scale)
                                                                                               : C(0);
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION C value(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    return a.value(v, g) * mask<C>(g);
  }
  template <class C, std::size_t N>
  KOKKOS_INLINE_FUNCTION dual<C, N> with_partials(const Kokkos::Array<C, N>& v, std::int64_t g) const {
    const dual<C, N> x = a.with_partials(v, g);
    const C m = mask<C>(g);
    return scaled(x.v * m, x, m);
  }
  static std::string describe() { return "dropout(" + A::describe() + ")"; }
};

template <class X>
constexpr auto node_of(const X& x) {
  if constexpr (expression<X>)
    return x;
  else
    return constant{static_cast<double>(x)};
}
template <class X>
using node_t = decltype(node_of(std::declval<X>()));

// An operand of an expression's operator: an expression or a number.
template <class X>
concept operand = expression<X> || std::is_arithmetic_v<X>;
template <class A, class B>
concept operands = operand<A> && operand<B> && (expression<A> || expression<B>);

template <class Fn, class A, class B>
constexpr binary_node<Fn, node_t<A>, node_t<B>> make_binary(const A& a, const B& b) {
  return {node_of(a), node_of(b)};
}

template <class A, class B>
  requires operands<A, B>
constexpr auto operator+(const A& a, const B& b) { return make_binary<meshtensor::fn::add_fn>(a, b); }
template <class A, class B>
  requires operands<A, B>
constexpr auto operator-(const A& a, const B& b) { return make_binary<meshtensor::fn::subtract_fn>(a, b); }
template <class A, class B>
  requires operands<A, B>
constexpr auto operator*(const A& a, const B& b) { return make_binary<meshtensor::fn::multiply_fn>(a, b); }
template <class A, class B>
  requires operands<A, B>
constexpr auto operator/(const A& a, const B& b) { return make_binary<meshtensor::fn::divide_fn>(a, b); }
template <expression A>
constexpr auto operator-(const A& a) { return unary_node<meshtensor::fn::negative_fn, A>{a}; }

}  // namespace fused

// The named ops on expressions, beside their tensor forms (which take Tensors only).
#define MESHTENSOR_FUSED_UNARY(NAME) \
  template <fused::expression A>     \
  constexpr auto NAME(const A& a) {  \
    return fused::unary_node<fn::NAME##_fn, A>{a}; \
  }
MESHTENSOR_FUSED_UNARY(negative)
MESHTENSOR_FUSED_UNARY(abs)
MESHTENSOR_FUSED_UNARY(exp)
MESHTENSOR_FUSED_UNARY(log)
MESHTENSOR_FUSED_UNARY(sqrt)
MESHTENSOR_FUSED_UNARY(rsqrt)
MESHTENSOR_FUSED_UNARY(square)
MESHTENSOR_FUSED_UNARY(reciprocal)
MESHTENSOR_FUSED_UNARY(sigmoid)
MESHTENSOR_FUSED_UNARY(tanh)
MESHTENSOR_FUSED_UNARY(relu)
MESHTENSOR_FUSED_UNARY(sin)
MESHTENSOR_FUSED_UNARY(cos)
MESHTENSOR_FUSED_UNARY(gelu)
MESHTENSOR_FUSED_UNARY(silu)
#undef MESHTENSOR_FUSED_UNARY

#define MESHTENSOR_FUSED_BINARY(NAME)                       \
  template <class A, class B>                               \
    requires fused::operands<A, B>                          \
  constexpr auto NAME(const A& a, const B& b) {             \
    return fused::make_binary<fn::NAME##_fn>(a, b);         \
  }
MESHTENSOR_FUSED_BINARY(add)
MESHTENSOR_FUSED_BINARY(subtract)
MESHTENSOR_FUSED_BINARY(multiply)
MESHTENSOR_FUSED_BINARY(divide)
MESHTENSOR_FUSED_BINARY(minimum)
MESHTENSOR_FUSED_BINARY(maximum)
MESHTENSOR_FUSED_BINARY(pow)
MESHTENSOR_FUSED_BINARY(equal)
MESHTENSOR_FUSED_BINARY(not_equal)
MESHTENSOR_FUSED_BINARY(less)
MESHTENSOR_FUSED_BINARY(less_equal)
MESHTENSOR_FUSED_BINARY(greater)
MESHTENSOR_FUSED_BINARY(greater_equal)
#undef MESHTENSOR_FUSED_BINARY

template <class Cond, class A, class B>
  requires fused::operand<Cond> && fused::operand<A> && fused::operand<B> &&
           (fused::expression<Cond> || fused::expression<A> || fused::expression<B>)
constexpr auto where(const Cond& c, const A& a, const B& b) {
  return fused::select_node<fused::node_t<Cond>, fused::node_t<A>, fused::node_t<B>>{
      fused::node_of(c), fused::node_of(a), fused::node_of(b)};
}

namespace nn {
// nn::dropout (nn/dropout.hpp) of an expression: see fused::dropout_node.
template <fused::expression A>
auto dropout(const A& a, double rate, std::uint64_t seed, std::uint64_t step) {
  if (rate >= 1) throw error(meshtensor::detail::cat("dropout: rate ", rate, " must be below 1"));
  // As nn::dropout_mask: stream numbers above 2^32 keep clear of the initialisers' streams.
  return fused::dropout_node<A>{a, rate, rate > 0 ? 1.0 / (1.0 - rate) : 1.0, seed,
                                meshtensor::detail::mix64(step) | (std::uint64_t{1} << 32)};
}
}  // namespace nn

namespace detail {

// The tensors' values at one element, for a run of the output's last dim.
template <class T, class Mem, std::size_t N>
using fused_operands = Kokkos::Array<map_operand<T, Mem>, N>;

// The values of the tensors in `used` at element j of a run; the others are 0 (the backward's
// partials do not read them: fused::*::reads).
// Unit: every such tensor has step 1 along the run, written apart so that the compiler can
// vectorise the common case (map_run's reason).
template <class C, bool Unit, fused::leaf_set Used, class T, std::size_t N>
KOKKOS_INLINE_FUNCTION Kokkos::Array<C, N> fused_values(const Kokkos::Array<map_cursor<T>, N>& c, std::int64_t j) {
  Kokkos::Array<C, N> v;
  for (std::size_t k = 0; k != N; ++k)
    v[k] = (Used >> k) & 1 ? static_cast<C>(c[k].p[c[k].off + (Unit ? j : j * c[k].step)]) : C(0);
  return v;
}
template <fused::leaf_set Used, class T, std::size_t N>
KOKKOS_INLINE_FUNCTION bool unit_steps(const Kokkos::Array<map_cursor<T>, N>& c) {
  for (std::size_t k = 0; k != N; ++k)
    if ((Used >> k) & 1 && c[k].step != 1) return false;
  return true;
}

// One work item per run of the result's last dim on a host, per element on a GPU (len 1), as the
// map kernel's (kernels/map.hpp): the tensors' cursors and the run's global index once per item,
// then each(i, values, global index) per element, with the values of the tensors in Used.
template <class Expr, class T, class Mem, std::size_t N, std::size_t R>
struct fused_runs {
  using C = compute_t<T>;
  std::int64_t len;
  kidx ext;
  Expr e;
  fused_operands<T, Mem, N> ops;
  local_to_global<R> global;  // a run's first element's global index (the run's dim has global stride 1)

  template <fused::leaf_set Used, class Each>
  KOKKOS_INLINE_FUNCTION void walk(std::int64_t run, const Each& each) const {
    const std::int64_t o = run * len;
    Kokkos::Array<map_cursor<T>, N> c;
    for (std::size_t k = 0; k != N; ++k) c[k] = cursor_at(ops[k], o, ext, static_cast<int>(R));
    const std::int64_t g = Expr::uses_index ? global(o) : 0;
    if (unit_steps<Used>(c))
      for (std::int64_t j = 0; j < len; ++j) each(o + j, fused_values<C, true, Used>(c, j), g + j);
    else
      for (std::int64_t j = 0; j < len; ++j) each(o + j, fused_values<C, false, Used>(c, j), g + j);
  }
};

template <class Expr, class T, class Mem, std::size_t N, std::size_t R>
struct fused_forward_runs {
  fused_runs<Expr, T, Mem, N, R> runs;
  T* out;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t run) const {
    runs.template walk<Expr::leaves>(run, [&](std::int64_t i, const auto& v, std::int64_t g) {
      out[i] = static_cast<T>(runs.e.value(v, g));
    });
  }
};

// grads[k] (of the result's shape; null where the tensor needs none) = g * d(result)/d(x_k).
template <class Expr, class T, class Mem, std::size_t N, std::size_t R>
struct fused_backward_runs {
  using C = compute_t<T>;
  fused_runs<Expr, T, Mem, N, R> runs;
  Kokkos::Array<T*, N> grads;
  const T* g;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t run) const {
    runs.template walk<Expr::reads>(run, [&](std::int64_t i, const auto& v, std::int64_t gi) {
      const auto d = runs.e.with_partials(v, gi);
      const C gv = static_cast<C>(g[i]);
      // times the partial's conjugate: the conjugate Wirtinger convention of the unfused ops'
      // rules (element/complex.hpp); the partial itself for real types. The chain rule above is
      // the plain one, right for complex values because fuse admits only holomorphic ops on them
      // (the others refuse complex values by name, as the unfused ops do).
      for (std::size_t k = 0; k != N; ++k)
        if (grads[k] != nullptr) grads[k][i] = static_cast<T>(gv * conj_value(d.d[k]));
    });
  }
};

// Local to global indices for an expression that reads them (dropout's mask: the placement's
// ranges, so a zigzag dim's two, global_index_map_of); others get a map of no offsets, never read.
template <class Expr, Tensor Out>
local_to_global<Out::rank> global_index_map(const Out& out) {
  if constexpr (Expr::uses_index) return global_index_map_of(out);
  else return {out.local_extents(), typename Out::extents_type{}, out.extents()};
}

// The walker of expression e over out's local slice, with the tensors xs broadcast to it.
template <class Expr, Tensor Out, Tensor... Xs>
auto fused_runs_over(const Out& out, const Expr& e, const Xs&... xs) {
  using mem = typename Out::memory_space;
  constexpr int r = static_cast<int>(Out::rank);
  kidx ext{};
  for (int i = 0; i != r; ++i) ext[i] = out.local_extents()[i];
  return fused_runs<Expr, typename Out::value_type, mem, sizeof...(Xs), Out::rank>{
      elements_per_item<mem>(r > 0 ? ext[r - 1] : 1), ext, e,
      {map_operand_at(map_input<typename Xs::value_type, mem>{xs.view(), positions_in_v<Out, Xs>.data(),
                                                              xs.local_extents().data(), Xs::rank},
                      ext, r)...},
      global_index_map<Expr>(out)};
}

template <class Functor, Tensor Out>
void launch_fused_runs(const Out& out, const Functor& f) {
  const std::int64_t n = out.local_size();
  if (n == 0) return;
  kernels::parallel_for("meshtensor::fuse", kernels::range<typename Out::execution_space>(0, n / f.runs.len), f);
}

// The union of the tensors' dims: the first's in order, then each next one's that are new.
template <class... Lists>
struct dims_union;
template <class L>
struct dims_union<L> {
  using type = L;
};
template <class A, class B, class... Rest>
struct dims_union<A, B, Rest...> : dims_union<union_t<A, B>, Rest...> {};

// The gradient rule: the tensors (without data where the backward reads no value of them).
template <class Expr, Tensor Out, Tensor... Xs>
struct fused_rule {
  Expr e;
  std::tuple<Xs...> xs;
  void operator()(const Out& g) const {
    constexpr std::size_t N = sizeof...(Xs);
    // Gradients only for the tensors on the tape that the expression contains.
    std::array<Out, N> grads;
    Kokkos::Array<typename Out::value_type*, N> ptrs;
    std::size_t k = 0;
    auto allocate = [&](const auto& x) {
      ptrs[k] = nullptr;
      if (x.tracks_grad() && ((Expr::leaves >> k) & 1)) {
        grads[k] = Out(g.mesh(), g.extents(), uninitialized);
        ptrs[k] = grads[k].view().data();
      }
      ++k;
    };
    std::apply([&](const auto&... x) { (allocate(x), ...); }, xs);
    launch_fused_runs(g, fused_backward_runs<Expr, typename Out::value_type, typename Out::memory_space, N, Out::rank>{
                             std::apply([&](const auto&... x) { return fused_runs_over(g, e, x...); }, xs), ptrs,
                             g.view().data()});
    k = 0;
    std::apply(
        [&](const auto&... x) {
          (
              [&] {
                using X = std::remove_cvref_t<decltype(x)>;
                if (ptrs[k] != nullptr) {
                  if constexpr (std::is_same_v<X, Out>)
                    push_fresh_grad(x, std::move(grads[k]));
                  else
                    push_summed_grad(x, grads[k]);
                }
                ++k;
              }(),
              ...);
        },
        xs);
  }
};

// Whether every operand shares X0's element type, layout and space; else false, after the
// diagnostic for the first that does not. Read in an if constexpr, so that fuse stops there and
// the sentence is the first error (not followed by the body's).
template <Tensor X0, Tensor... Xs>
constexpr bool fuse_operands_agree() {
  bool ok = true;
  (
      [&] {
        if constexpr (!std::is_same_v<with_dims_t<X0, type_list<>>, with_dims_t<Xs, type_list<>>>) {
          (void)sizeof(diagnostic::operands_differ_in_layout<X0, Xs>);
          ok = false;
        }
      }(),
      ...);
  return ok;
}
}  // namespace detail

// The fused expression f of the tensors xs (see the top of this file).
template <class F, Tensor X0, Tensor... Xs>
auto fuse(F f, const X0& x0, const Xs&... xs) {
  constexpr std::size_t N = 1 + sizeof...(Xs);
  static_assert(N <= 64, "meshtensor::fuse: at most 64 tensors");
  if constexpr (!detail::fuse_operands_agree<X0, Xs...>()) {
    return x0;
  } else {
    const auto e = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return f(fused::leaf<I>{}...);
    }(std::make_index_sequence<N>{});
    using Expr = std::remove_cvref_t<decltype(e)>;
    static_assert(fused::expression<Expr>,
                  "meshtensor::fuse: f must return an expression of its arguments (elementwise ops, scalars, where, "
                  "nn::dropout), not a tensor or a number");
    using R = detail::with_dims_t<X0, typename detail::dims_union<typename X0::dims, typename Xs::dims...>::type>;
    const detail::op_call call(detail::planned_op{"fuse", elementwise_plan()}, x0);
    (detail::check_shared_extents("fuse", x0, xs), ...);
    const auto extents = detail::result_extents<R>(x0, xs...);
    R out(x0.mesh(), extents, uninitialized);
    detail::launch_fused_runs(out, detail::fused_forward_runs<Expr, typename R::value_type, typename R::memory_space, N, R::rank>{
                                       detail::fused_runs_over(out, e, x0, xs...), out.view().data()});
    if (!detail::recording_paused() && (x0.tracks_grad() || ... || xs.tracks_grad())) {
      std::size_t k = 0;
      auto kept = [&](const auto& x) {
        const bool read = (Expr::reads >> k++) & 1;
        return read ? x : detail::node_only(x);
      };
      auto x0_kept = kept(x0);
      detail::record<R>(out, detail::fused_rule<Expr, R, X0, Xs...>{e, std::tuple<X0, Xs...>{x0_kept, kept(xs)...}}, x0,
                        xs...);
    }
    return out;
  }
}

}  // namespace meshtensor
