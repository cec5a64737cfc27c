#pragma once
// Names, meshes, layout enumerations and comparisons shared by the tests.
#include <mpi.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <cmath>
#include <meshtensor/meshtensor.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace tst {
namespace mt = meshtensor;

struct i_ : mt::dim<"i"> {};
struct j_ : mt::dim<"j"> {};
struct k_ : mt::dim<"k"> {};
struct l_ : mt::dim<"l"> {};
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
// Meshes [P] and, where P is 4, [2x2]; [P x 1] otherwise.
inline line world_line() { return line(MPI_COMM_WORLD, {world_size()}); }
inline grid world_grid() {
  const int p = world_size();
  return p == 4 ? grid(MPI_COMM_WORLD, {2, 2}) : grid(MPI_COMM_WORLD, {p, 1});
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

// Layouts of a mesh with one axis over dims Ds: replicated, or one dim split over the axis.
template <class M, class... Ds>
using line_layouts = list<mt::layout<M>, mt::layout<M, mt::split<Ds, x_>>...>;

// Layouts of the 2-D mesh over dims Ds: every assignment of r and c to a dim or to none,
// including one dim over both axes in either order.
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
struct grid_layout<void, D> {
  using type = mt::layout<grid, mt::split<D, c_>>;
};
template <class D>
struct grid_layout<D, void> {
  using type = mt::layout<grid, mt::split<D, r_>>;
};
template <>
struct grid_layout<void, void> {
  using type = mt::layout<grid>;
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
template <class R, class... Cs>
using row = list<typename grid_layout<R, Cs>::type...>;
}  // namespace detail
template <class... Ds>
using grid_layouts = typename detail::concat<detail::row<void, void, Ds...>, detail::row<Ds, void, Ds...>...,
                                             list<mt::layout<grid, mt::split<Ds, c_, r_>>...>>::type;

template <class... Ts, class F>
void for_each_type(list<Ts...>, F&& f) {
  (f.template operator()<Ts>(), ...);
}

template <class L>
std::string layout_name() {
  std::ostringstream s;
  s << "layout";
  [&]<class M, class... Rules>(mt::layout<M, Rules...>*) {
    ((s << ' ' << Rules::dim::name() << "->" << [] {
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

}  // namespace tst
