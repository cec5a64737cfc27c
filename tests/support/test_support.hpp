#pragma once
// Names, meshes, layout enumerations and comparisons shared by the tests.
#include <mpi.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <meshtensor/meshtensor.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tst {
namespace mt = meshtensor;

struct i_ : mt::dim<"i"> {};
struct j_ : mt::dim<"j"> {};
struct k_ : mt::dim<"k"> {};
struct l_ : mt::dim<"l"> {};
struct m_ : mt::dim<"m"> {};
struct n_ : mt::dim<"n"> {};
struct x_ : mt::axis<"x"> {};
struct r_ : mt::axis<"r"> {};
struct c_ : mt::axis<"c"> {};

using line = mt::mesh<x_>;
using grid = mt::mesh<r_, c_>;

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &n);
  return n;
}
// Meshes [P] and [2x2] at 4 ranks, [2x3] at 6, [P x 1] otherwise.
inline line world_line() { return line(MPI_COMM_WORLD, {world_size()}); }
inline grid world_grid() {
  const int p = world_size();
  // Square at 4 ranks, unequal axes above 1 at 6 ([2x3]; tests that want [3x2] build it).
  if (p == 4) return grid(MPI_COMM_WORLD, {2, 2});
  if (p == 6) return grid(MPI_COMM_WORLD, {2, 3});
  return grid(MPI_COMM_WORLD, {p, 1});
}

// Every execution space this Kokkos has on the host; each test runs once per space.
#if defined(KOKKOS_ENABLE_OPENMP) && defined(KOKKOS_ENABLE_SERIAL)
#define MESHTENSOR_TEST_SPACES Kokkos::Serial, Kokkos::OpenMP
#elif defined(KOKKOS_ENABLE_OPENMP)
#define MESHTENSOR_TEST_SPACES Kokkos::OpenMP
#else
#define MESHTENSOR_TEST_SPACES Kokkos::DefaultExecutionSpace
#endif

template <class... Ts>
using list = mt::type_list<Ts...>;

// float64 tensors on the default space: what the layout sweeps and gradient checks use.
template <class L, class... Ds>
using ten = mt::basic_tensor<double, L, Kokkos::DefaultExecutionSpace, Ds...>;

// Layouts of a mesh with one axis over dims Ds: replicated, or one dim split over the axis.
template <class M, class... Ds>
using line_layouts = list<mt::layout<M>, mt::layout<M, mt::split<Ds, x_>>...>;

// Layouts of the 2-D mesh over dims Ds, a cover of every kind of split rather than every
// assignment of r and c (those were 19 for three dims, and half again the sweeps' compile time
// for no kind more): replicated; each dim over r; each dim over both axes; the first over both
// in the other order; each dim over r with the next (cyclically) over c, so that every dim is split
// over c and every dim pair is split over both axes.
namespace detail {
template <class D1, class D2>
struct grid_layout {
  using type = mt::layout<grid, mt::split<D1, r_>, mt::split<D2, c_>>;
};
template <class D>
struct grid_layout<D, D> {
  using type = mt::layout<grid, mt::split<D, r_, c_>>;
};
template <class D>
struct grid_layout<D, void> {
  using type = mt::layout<grid, mt::split<D, r_>>;
};
template <class... L>
struct concat;
template <class... A>
struct concat<list<A...>> {
  using type = list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat<list<A...>, list<B...>, Rest...> {
  using type = typename concat<list<A..., B...>, Rest...>::type;
};
template <class Tuple, class Positions>
struct cyclic_pairs;
template <class Tuple, std::size_t... K>
struct cyclic_pairs<Tuple, std::index_sequence<K...>> {
  using type = list<typename grid_layout<std::tuple_element_t<K, Tuple>,
                                         std::tuple_element_t<(K + 1) % sizeof...(K), Tuple>>::type...>;
};
template <class First, class... Ds>
struct first_over_c_then_r {
  using type = list<mt::layout<grid, mt::split<First, c_, r_>>>;
};
}  // namespace detail
#ifdef MESHTENSOR_TEST_KERNEL_KINDS_ONLY
// cuda_build compiles the sweeps for the GPU to check that their kernels compile there, and runs
// nothing. A kernel's device code depends on which dims are split, not over which axes or how many
// (those change the communicator and the local extents, on the host): [P]'s layouts hold every kind,
// so [2x2]'s sweep is one layout, the first dim over both axes. scripts/gpu_check.sh builds the whole
// sweep and runs it.
template <class... Ds>
using grid_layouts = typename detail::first_over_c_then_r<Ds...>::type;
#else
template <class... Ds>
using grid_layouts =
    typename detail::concat<list<mt::layout<grid>>, list<typename detail::grid_layout<Ds, void>::type...>,
                            list<typename detail::grid_layout<Ds, Ds>::type...>, typename detail::first_over_c_then_r<Ds...>::type,
                            typename detail::cyclic_pairs<std::tuple<Ds...>,
                                                          std::make_index_sequence<sizeof...(Ds)>>::type>::type;
#endif

template <class... Ts, class F>
void for_each_type(list<Ts...>, F&& f) {
  (f.template operator()<Ts>(), ...);
}

template <class L>
std::string layout_name() {
  std::ostringstream s;
  s << "layout";
  [&]<class M, class... Rules>(mt::layout<M, Rules...>*) {
    ((s << ' ' << Rules::dim::name() << (Rules::order == mt::dim_order::zigzag ? "~zigzag->" : "->") << [] {
        std::string a;
        [&]<class... As>(list<As...>) { ((a += std::string(As::name())), ...); }(typename Rules::axes{});
        return a;
      }()), ...);
  }(static_cast<L*>(nullptr));
  return s.str();
}

// Largest elementwise difference, relative to max(1, |expected|).
template <class T>
double max_rel_error(const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t n = 0; n < got.size(); ++n) {
    const double e = std::abs(double(got[n]) - double(want[n])) / std::max(1.0, std::abs(double(want[n])));
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

template <class T>
void require_close(const std::vector<T>& got, const std::vector<T>& want, double tol) {
  REQUIRE(got.size() == want.size());
  REQUIRE(max_rel_error(got, want) <= tol);
}

// ---- communication counters ----------------------------------------------------------------
inline std::string show(const mt::comm_counters& c) {
  std::string s;
  for (const auto& [k, v] : c)
    s += mt::detail::cat(mt::to_string(k.first), " over mask ", k.second.mask(), ": ", v.calls, " calls, ", v.bytes, " bytes; ");
  return s.empty() ? "nothing" : s;
}
// The calls counted on g's communicator per (collective, axes), without their bytes (as a plan's).
template <class M>
mt::comm_counters calls_of(const M& g) {
  mt::comm_counters calls;
  for (const auto& [key, count] : g.counters()) calls[key].calls = count.calls;
  return calls;
}
// The bytes this processor sent in collectives of kind c, over any axes.
template <class M>
std::int64_t bytes_of(const M& g, mt::collective c) {
  std::int64_t n = 0;
  for (const auto& [key, count] : g.counters())
    if (key.first == c) n += count.bytes;
  return n;
}
// The counted calls per (collective, axes) equal want's (a plan has no bytes, so bytes are not compared).
inline void require_counts(const mt::comm_counters& counted, const mt::comm_counters& want) {
  mt::comm_counters got;
  for (const auto& [k, v] : counted) got[k].calls = v.calls;
  INFO("counted: " << show(counted) << " expected: " << show(want));
  REQUIRE(got == want);
}

// ---- gradients against central finite differences -------------------------------------------
// sum over every dim of t: a rank-0 loss.
template <class T>
auto sum_all(const T& t) {
  return [&]<class... Ds>(list<Ds...>) { return mt::reduce_sum<Ds...>(t); }(typename T::dims{});
}
// sum(y * w), w random normal fixed by the seed (layout-independent, as all initialisers are):
// every element of y weighs differently, so every gradient element matters.
template <class Y>
auto weighted_sum(const Y& y, std::uint64_t seed) {
  return sum_all(y * mt::random_normal<Y>(y.mesh(), y.extents(), seed));
}

struct gradient_check_options {
  double h = 1e-6;         // the central difference's step
  double tol = 1e-6;       // on |analytic - numeric| / max(1, |numeric|), every checked element or direction
  std::size_t stride = 1;  // at one processor: check elements 0, stride, 2 stride, ... (1: all)
  // At more than one processor: at most this many elements (an odd stride, widened to reach it) and
  // this many random directions (gradient_error).
  std::size_t spread_elements = 8, spread_directions = 2;
};
struct gradient_check_result {
  double worst = 0;  // largest relative error (INFINITY for a NaN)
  std::size_t element = 0, checked = 0;  // element: the worst's index, or x's size + d for direction d
  std::size_t directions = 0;            // random directions checked
  double analytic = 0, numeric = 0;      // at the worst element or direction
  double norm2 = 0;                      // sum of squares of the whole analytic gradient
};

// d loss / d x from mt::gradient against (loss(x + h v) - loss(x - h v)) / 2h, float64, on the
// gathered tensor; x is rebuilt from host values x0 (perturbed) for every evaluation, under X's layout.
// At one processor every layout holds the whole tensor and v is each checked element's unit vector:
// that proves the op's local rule element by element. At more, what can go wrong is the
// distribution (a missing reduction, a shard's offset or halo), and each evaluation is a distributed
// run whose collectives wait for their peers' turn on a shared core: there a sample of elements (an
// odd stride, so that it does not fall on every shard's first element) and a few random directions
// v of entries +-1/sqrt(N) (the same on every rank and standard library), where one element's
// gradient off by e moves the directional derivative by exactly e / sqrt(N).
template <class X, class F>
gradient_check_result gradient_error(const typename X::mesh_type& m, const typename X::extents_type& ext,
                                     const std::vector<double>& x0, F loss_of, gradient_check_options o = {}) {
  static_assert(std::is_same_v<typename X::value_type, double>, "finite differences need float64");
  auto x = mt::from_host<X>(m, ext, x0);
  x.requires_grad();
  const auto [gx] = mt::gradient(loss_of(x), x);
  const auto analytic = mt::gather_all(gx);
  REQUIRE(analytic.size() == x0.size());
  auto loss_at = [&](const std::vector<double>& h) {
    const auto l = mt::gather_all(loss_of(mt::from_host<X>(m, ext, h)));
    REQUIRE(l.size() == 1);
    return l[0];
  };
  gradient_check_result r;
  auto record = [&](std::size_t where, double want, double numeric) {
    const double e = std::abs(want - numeric) / std::max(1.0, std::abs(numeric));
    if (!(e <= r.worst)) {
      r.worst = std::isnan(e) ? INFINITY : e;
      r.element = where;
      r.analytic = want;
      r.numeric = numeric;
    }
  };
  for (double v : analytic) r.norm2 += v * v;
  const bool spread = m.nprocs() > 1;
  std::size_t stride = std::max<std::size_t>(o.stride, 1);
  if (spread) {
    const std::size_t k = std::max<std::size_t>(o.spread_elements, 1);
    stride = std::max(stride, (x0.size() + k - 1) / k) | 1;
  }
  for (std::size_t n = 0; n < x0.size(); n += stride) {
    auto plus = x0, minus = x0;
    plus[n] += o.h;
    minus[n] -= o.h;
    record(n, analytic[n], (loss_at(plus) - loss_at(minus)) / (2 * o.h));
    ++r.checked;
  }
  std::mt19937_64 signs(0x5eed);  // its sequence is the standard's: the same on every rank and library
  const double entry = 1 / std::sqrt(static_cast<double>(x0.size()));
  for (std::size_t d = 0; spread && d < o.spread_directions; ++d) {
    std::vector<double> v(x0.size());
    auto plus = x0, minus = x0;
    for (std::size_t n = 0; n < v.size(); ++n) {
      v[n] = (signs() >> 63) ? entry : -entry;
      plus[n] += o.h * v[n];
      minus[n] -= o.h * v[n];
    }
    record(x0.size() + d, std::inner_product(analytic.begin(), analytic.end(), v.begin(), 0.0),
           (loss_at(plus) - loss_at(minus)) / (2 * o.h));
    ++r.directions;
  }
  return r;
}

// gradient_error within o.tol at every checked element and direction, and a gradient that is not
// zero everywhere (a loss that ignored x would pass the comparison trivially).
template <class X, class F>
void check_gradient(const typename X::mesh_type& m, const typename X::extents_type& ext,
                    const std::vector<double>& x0, F loss_of, gradient_check_options o = {}) {
  const auto r = gradient_error<X>(m, ext, x0, std::move(loss_of), o);
  const auto worst = r.element < x0.size() ? mt::detail::cat("element ", r.element)
                                           : mt::detail::cat("random direction ", r.element - x0.size());
  INFO("worst: " << worst << " of " << x0.size() << " elements (" << r.checked << " elements and "
                 << r.directions << " directions checked): analytic " << r.analytic << ", numeric "
                 << r.numeric << ", relative error " << r.worst);
  REQUIRE(r.checked > 0);
  REQUIRE(r.worst <= o.tol);
  REQUIRE(r.norm2 > 1e-8);
}

// check_gradient at x = random normals (seed), every element, h = 1e-6, tolerance 1e-6: for ops that
// are linear or piecewise linear away from ties, where the differences are exact up to rounding.
template <class X, class F>
void check_grad_at_normal(const char* what, const typename X::mesh_type& g, const typename X::extents_type& e,
                          std::uint64_t seed, F loss_of) {
  INFO(what);
  check_gradient<X>(g, e, mt::gather_all(mt::random_normal<X>(g, e, seed)), loss_of, {.h = 1e-6, .tol = 1e-6});
}

}  // namespace tst
