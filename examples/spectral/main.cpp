// A Poisson problem on a periodic box solved by distributed FFTs, in complex double:
//
//   -laplacian(u) = f on [0, 2 pi)^3, periodic, on an nx x ny x nz grid,
//
// solved in Fourier space: u's coefficient at wavenumber k is f's divided by |k|^2 (0 at k = 0).
// A 3-D transform is one 1-D transform per dim (mt::fft, include/meshtensor/fft/fft.hpp) with a
// relayout before each dim that the layout splits:
//   pencils  x over rows, y over cols:  fft z; relayout (z over cols, y whole); fft y;
//            relayout (y over rows, x whole); fft x: two alltoalls, each over one axis
//   slabs    x over rows and cols:      fft y and z (one 2-D transform); relayout (y over both, x
//            whole); fft x: one alltoall over the whole mesh (FFTW-MPI's decomposition)
// and the inverse the same way back. Extents need not divide the mesh. u is compared with the
// exact solution, u = sin(x) cos(2y) sin(3z) + cos(2x + z) / 2 (exit 2 beyond 1e-10).
// --repeat N times N solves and prints the bytes each rank sent per solve, as counted by the
// communicator (scripts/dev/bench_fft.sh puts them beside FFTW-MPI's).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <meshtensor/fft/fft.hpp>
#include <meshtensor/meshtensor.hpp>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

namespace mt = meshtensor;
using zd = mt::complex<double>;

// [names]
struct x_ : mt::dim<"x"> {};
struct y_ : mt::dim<"y"> {};
struct z_ : mt::dim<"z"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;
// Each decomposition as the three layouts a transform passes through: one keeps z whole, one y,
// one x.
struct pencils {
  using z_whole = mt::layout<grid, mt::split<x_, rows>, mt::split<y_, cols>>;
  using y_whole = mt::layout<grid, mt::split<x_, rows>, mt::split<z_, cols>>;
  using x_whole = mt::layout<grid, mt::split<y_, rows>, mt::split<z_, cols>>;
};
struct slabs {
  using z_whole = mt::layout<grid, mt::split<x_, rows, cols>>;
  using y_whole = z_whole;
  using x_whole = mt::layout<grid, mt::split<y_, rows, cols>>;
};
template <class L>
using field = mt::tensor<zd, L, x_, y_, z_>;
// The spectrum with x innermost, where its transform reads contiguous lines (as FFTW-MPI's
// transposed output): transpose<y_, z_, x_> is a local copy.
template <class L>
using spectrum = mt::tensor<zd, L, y_, z_, x_>;
// [names]

struct options {
  std::vector<std::int64_t> size{32, 32, 32};
  std::vector<int> mesh{2, 2};
  std::string layout = "pencils";
  int repeat = 1;
};

// [transform]
// The 3-D transform: z, then y, then x, each where the layout keeps it whole (y and z in one 2-D
// transform where one layout keeps both); the spectrum comes out in the x-whole layout.
template <class D>
spectrum<typename D::x_whole> forward(const field<typename D::z_whole>& u) {
  using X = field<typename D::x_whole>;
  if constexpr (std::is_same_v<typename D::z_whole, typename D::y_whole>) {
    return mt::fft<x_>(mt::transpose<y_, z_, x_>(mt::relayout<X>(mt::fft<y_, z_>(u))));
  } else {
    const auto along_z = mt::fft<z_>(u);
    const auto along_y = mt::fft<y_>(mt::relayout<field<typename D::y_whole>>(along_z));
    return mt::fft<x_>(mt::transpose<y_, z_, x_>(mt::relayout<X>(along_y)));
  }
}
// Its inverse, back to the z-whole layout.
template <class D>
field<typename D::z_whole> inverse(const spectrum<typename D::x_whole>& s) {
  using Z = field<typename D::z_whole>;
  if constexpr (std::is_same_v<typename D::z_whole, typename D::y_whole>) {
    return mt::ifft<y_, z_>(mt::relayout<Z>(mt::transpose<x_, y_, z_>(mt::ifft<x_>(s))));
  } else {
    const auto along_x = mt::transpose<x_, y_, z_>(mt::ifft<x_>(s));
    const auto along_y = mt::ifft<y_>(mt::relayout<field<typename D::y_whole>>(along_x));
    return mt::ifft<z_>(mt::relayout<Z>(along_y));
  }
}
// [transform]

// The signed wavenumber of bin k of n.
KOKKOS_INLINE_FUNCTION double wavenumber(std::int64_t k, std::int64_t n) { return double(k <= n / 2 ? k : k - n); }

// 1 / |k|^2 at a bin of the spectrum (0 at k = 0: f has mean zero, and so has u).
struct inverse_laplacian {
  std::int64_t nx, ny, nz;
  KOKKOS_INLINE_FUNCTION zd operator()(const Kokkos::Array<std::int64_t, 3>& p) const {
    const double ky = wavenumber(p[0], ny), kz = wavenumber(p[1], nz), kx = wavenumber(p[2], nx);  // y, z, x
    const double k2 = kx * kx + ky * ky + kz * kz;
    return zd(k2 == 0 ? 0.0 : 1.0 / k2, 0.0);
  }
};

// The exact solution (scale 1) or the source term f = -laplacian(u) at a grid point.
struct solution {
  std::int64_t nx, ny, nz;
  bool source;
  KOKKOS_INLINE_FUNCTION zd operator()(const Kokkos::Array<std::int64_t, 3>& p) const {
    const double two_pi = 6.283185307179586;
    const double x = two_pi * double(p[0]) / double(nx), y = two_pi * double(p[1]) / double(ny),
                 z = two_pi * double(p[2]) / double(nz);
    // |k|^2 is 1 + 4 + 9 for the first mode, 4 + 1 for the second.
    const double a = mt::kmath::sin(x) * mt::kmath::cos(2 * y) * mt::kmath::sin(3 * z), b = 0.5 * mt::kmath::cos(2 * x + z);
    return zd(source ? 14 * a + 5 * b : a + b, 0.0);
  }
};

template <class D>
int run(mt::environment& env, const options& o) {
  using F = field<typename D::z_whole>;
  using S = spectrum<typename D::x_whole>;
  grid g(env, {o.mesh[0], o.mesh[1]});  // throws mt::mesh_error, naming the sizes, if world size != rows * cols
  const bool root = env.world_rank() == 0;
  const std::int64_t nx = o.size[0], ny = o.size[1], nz = o.size[2];
  for (std::size_t d = 0; d < 3; ++d)  // the modes of u must be resolved: |k| below n / 2 along each dim
    if (o.size[d] < std::array<std::int64_t, 3>{5, 5, 7}[d])
      throw mt::shape_error(fmt::format("--size: {} points along {} do not resolve the solution's modes (at least {})",
                                        o.size[d], "xyz"[d], std::array<int, 3>{5, 5, 7}[d]));
  const F f = mt::generate<F>(g, {nx, ny, nz}, solution{nx, ny, nz, true});
  const F exact = mt::generate<F>(g, {nx, ny, nz}, solution{nx, ny, nz, false});
  const S scale = mt::generate<S>(g, {ny, nz, nx}, inverse_laplacian{nx, ny, nz});
  if (root)
    fmt::print("spectral: -laplacian(u) = f, periodic, on {} x {} x {} points, layout {} on mesh [rows={} x cols={}]\n{}\n",
               nx, ny, nz, o.layout, g.size<rows>(), g.size<cols>(), mt::describe(f));

  F u = f;
  g.reset_counters();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < o.repeat; ++r) u = inverse<D>(forward<D>(f) * scale);
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::int64_t bytes = 0;
  for (const auto& [key, c] : g.counters()) bytes += c.bytes;
  const double error = mt::item(mt::reduce_max<x_, y_, z_>(mt::abs(mt::real(u - exact))));
  if (root)
    fmt::print("{} solves in {:.4f} s ({:.3f} ms per solve); bytes sent per rank per solve {}; largest error against "
               "the exact solution {:.3e}\n",
               o.repeat, seconds, seconds / o.repeat * 1e3, bytes / o.repeat, error);
  return error <= 1e-10 ? 0 : 2;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  CLI::App app{"meshtensor: a periodic 3-D Poisson problem by distributed FFTs on a 2-D mesh (complex double)"};
  options o;
  app.add_option("--size", o.size, "grid points along x, y and z")->expected(3)->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product: the number of ranks)")->expected(2)
      ->capture_default_str();
  app.add_option("--layout", o.layout, "pencils (x over rows, y over cols) or slabs (x over both)")
      ->check(CLI::IsMember({"pencils", "slabs"}))->capture_default_str();
  app.add_option("--repeat", o.repeat, "solves to time")->check(CLI::PositiveNumber)->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    return o.layout == "slabs" ? run<slabs>(env, o) : run<pencils>(env, o);
  } catch (const std::exception& e) {
    return env.fail(e, "spectral: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("spectral: error: ");
}
