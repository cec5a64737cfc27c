// A 3-D Poisson problem solved by Jacobi iteration, in double, on a grid split over a 2-D mesh:
//
//   -laplacian(u) = f on the unit cube, u = 0 on its boundary,
//
// on nx x ny x nz interior points (spacing 1 / (n + 1) along each dim). Two layouts: pencils (x over
// the mesh's rows, y over its cols, z whole) and slabs (x over rows and cols). An iteration is one
// stencil: u's box copied with a ghost layer on each side (along a split dim a face comes from the
// neighbour on that axis, a sendrecv each way; zero_fill past the ends is the boundary's zeros),
// and one kernel for the update. The residual's norm takes one allreduce, every --log-every iterations (every iteration
// with --csv). f = 3 pi^2 sin(pi x) sin(pi y) sin(pi z), whose solution sin(pi x) sin(pi y)
// sin(pi z) the discrete one approaches as h^2: the error against it is printed too.
//
// --check: rank 0 repeats the iterations on the whole grid with plain loops and compares (1e-12).
// Checkpoints (docs/checkpoints.md): --checkpoint DIR --save-every N saves u and the iteration;
// --resume DIR continues from DIR's current checkpoint, under either layout and any rank count.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <numbers>
#include <string>
#include <vector>

namespace mt = meshtensor;

// [names]
struct x_ : mt::dim<"x"> {};
struct y_ : mt::dim<"y"> {};
struct z_ : mt::dim<"z"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;
using pencils = mt::layout<grid, mt::split<x_, rows>, mt::split<y_, cols>>;
using slabs = mt::layout<grid, mt::split<x_, rows, cols>>;
template <class L>
using field = mt::tensor<double, L, x_, y_, z_>;
// What a stencil over x, y and z reads u's neighbours through (a device lambda's parameter types
// are spelled out: nvcc takes no generic one).
using neighbours = mt::stencil_neighbours<double, 3>;
// [names]

struct options {
  std::vector<std::int64_t> size{48, 48, 48};
  std::vector<int> mesh{2, 2};
  std::string layout = "pencils", checkpoint, resume, csv;
  std::int64_t iterations = 200, log_every = 50, save_every = 0;
  bool check = false;
};

// The coefficients of the 7-point Laplacian: 1 / h^2 along each dim.
struct spacing {
  double ax, ay, az;
  explicit spacing(const std::vector<std::int64_t>& n)
      : ax(double((n[0] + 1) * (n[0] + 1))), ay(double((n[1] + 1) * (n[1] + 1))), az(double((n[2] + 1) * (n[2] + 1))) {}
};

// scale * sin(pi x) sin(pi y) sin(pi z) at the interior point (i, j, k): called on the device by
// mt::generate, and on the host by the reference loops.
struct product_of_sines {
  std::int64_t nx, ny, nz;
  double scale;
  KOKKOS_INLINE_FUNCTION double operator()(const Kokkos::Array<std::int64_t, 3>& p) const {
    const double pi = 3.14159265358979323846;
    return scale * mt::kmath::sin(pi * double(p[0] + 1) / double(nx + 1)) *
           mt::kmath::sin(pi * double(p[1] + 1) / double(ny + 1)) * mt::kmath::sin(pi * double(p[2] + 1) / double(nz + 1));
  }
};

// [sweep]
// One Jacobi sweep: u' = (ax (u[x-1] + u[x+1]) + ay (..) + az (..) + f) / (2 (ax + ay + az)). The
// neighbours are read in place from u's box and its ghost cells (one face from each neighbour along
// a split dim; zeros past the ends, the boundary's), one kernel for the update.
template <class F>
F jacobi_sweep(const F& u, const F& f, const spacing& s) {
  const double ax = s.ax, ay = s.ay, az = s.az, inv_diagonal = 1.0 / (2.0 * (ax + ay + az));
  return mt::stencil<x_, y_, z_>(
      u, 1, mt::boundary::zero_fill,
      KOKKOS_LAMBDA(const neighbours& at, double rhs) {
        return ((at(-1, 0, 0) + at(1, 0, 0)) * ax + (at(0, -1, 0) + at(0, 1, 0)) * ay + (at(0, 0, -1) + at(0, 0, 1)) * az +
                rhs) * inv_diagonal;
      },
      f);
}
// [sweep]

// The residual's root mean square, sqrt(mean((f + laplacian(u))^2)): one allreduce.
template <class F>
double residual_rms(const F& u, const F& f, const spacing& s) {
  const double ax = s.ax, ay = s.ay, az = s.az, diagonal = 2.0 * (ax + ay + az);
  const auto r = mt::stencil<x_, y_, z_>(
      u, 1, mt::boundary::zero_fill,
      KOKKOS_LAMBDA(const neighbours& at, double rhs) {
        const double v = (at(-1, 0, 0) + at(1, 0, 0)) * ax + (at(0, -1, 0) + at(0, 1, 0)) * ay +
                         (at(0, 0, -1) + at(0, 0, 1)) * az - at(0, 0, 0) * diagonal + rhs;
        return v * v;
      },
      f);
  return std::sqrt(mt::item(mt::reduce_mean<x_, y_, z_>(r)));
}

// The same iterations with plain loops on the whole grid (rank 0 alone, for --check).
std::vector<double> reference(const options& o, std::int64_t iterations) {
  const std::int64_t nx = o.size[0], ny = o.size[1], nz = o.size[2];
  const spacing s(o.size);
  const double inv_diagonal = 1.0 / (2.0 * (s.ax + s.ay + s.az));
  const product_of_sines rhs{nx, ny, nz, 3.0 * std::numbers::pi * std::numbers::pi};
  std::vector<double> u(std::size_t(nx * ny * nz), 0.0), next(u.size()), f;
  for (std::int64_t i = 0; i < nx; ++i)
    for (std::int64_t j = 0; j < ny; ++j)
      for (std::int64_t k = 0; k < nz; ++k) f.push_back(rhs(Kokkos::Array<std::int64_t, 3>{i, j, k}));
  const auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) {
    return i < 0 || i >= nx || j < 0 || j >= ny || k < 0 || k >= nz ? 0.0 : u[std::size_t((i * ny + j) * nz + k)];
  };
  for (std::int64_t t = 0; t < iterations; ++t) {
    for (std::int64_t i = 0; i < nx; ++i)
      for (std::int64_t j = 0; j < ny; ++j)
        for (std::int64_t k = 0; k < nz; ++k) {
          const std::size_t g = std::size_t((i * ny + j) * nz + k);
          next[g] = ((at(i - 1, j, k) + at(i + 1, j, k)) * s.ax + (at(i, j - 1, k) + at(i, j + 1, k)) * s.ay +
                     (at(i, j, k - 1) + at(i, j, k + 1)) * s.az + f[g]) * inv_diagonal;
        }
    u.swap(next);
  }
  return u;
}

template <class L>
int run(mt::environment& env, const options& o) {
  using F = field<L>;
  grid g(env, {o.mesh[0], o.mesh[1]});  // throws mt::mesh_error, naming the sizes, if world size != rows * cols
  const bool root = env.world_rank() == 0;
  const typename F::extents_type extents{o.size[0], o.size[1], o.size[2]};
  const spacing s(o.size);
  const double pi = std::numbers::pi;
  const F f = mt::generate<F>(g, extents, product_of_sines{o.size[0], o.size[1], o.size[2], 3 * pi * pi});
  const F exact = mt::generate<F>(g, extents, product_of_sines{o.size[0], o.size[1], o.size[2], 1.0});
  F u(g, extents);  // zeros

  // A checkpoint holds u and the iteration; the grid's extents must be this run's.
  const mt::io::metadata config{{"nx", std::to_string(o.size[0])}, {"ny", std::to_string(o.size[1])},
                                {"nz", std::to_string(o.size[2])}};
  std::int64_t first = 0;
  if (!o.resume.empty()) {
    mt::io::tensor_set set;
    set.add("u", u);
    const auto meta = mt::io::checkpoints(o.resume).load(set);
    for (const auto& [k, v] : config)
      if (!meta.count(k) || meta.at(k) != v)
        throw mt::io_error(fmt::format("--resume {}: the checkpoint has {} = {}, this run {}", o.resume, k,
                                       meta.count(k) ? meta.at(k) : "(none)", v));
    if (!meta.count("iteration")) throw mt::io_error(fmt::format("--resume {}: the checkpoint has no 'iteration'", o.resume));
    first = std::stoll(meta.at("iteration"));
    if (root) fmt::print("resumed from {} at step {}\n", o.resume, first);
  }
  if (root)
    fmt::print("jacobi: -laplacian(u) = f on {} x {} x {} points, layout {} on mesh [rows={} x cols={}], iterations "
               "{}..{}\n{}\n", o.size[0], o.size[1], o.size[2], o.layout, g.size<rows>(), g.size<cols>(), first + 1,
               o.iterations, mt::describe(u));

  std::vector<double> residuals;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t t = first; t < o.iterations; ++t) {
    u = jacobi_sweep(u, f, s);
    const bool log = (t + 1) % o.log_every == 0 || t + 1 == o.iterations;
    if (!o.csv.empty() || log) residuals.push_back(residual_rms(u, f, s));
    if (log && root)
      fmt::print("iteration {:6d}  residual {:.6e}\n", t + 1, residuals.back());
    if (o.save_every > 0 && (t + 1) % o.save_every == 0) {
      mt::io::tensor_set set;
      set.add("u", u);
      auto meta = config;
      meta["iteration"] = std::to_string(t + 1);
      meta["layout"] = o.layout;
      const auto name = mt::io::checkpoints(o.checkpoint).save(set, t + 1, meta);
      if (root) fmt::print("saved checkpoint {}/{}\n", o.checkpoint, name);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double error = mt::item(mt::reduce_max<x_, y_, z_>(mt::abs(u - exact)));
  if (root) {
    const double points = double(o.size[0] * o.size[1] * o.size[2]) * double(o.iterations - first);
    fmt::print("{} iterations in {:.3f} s ({:.1f} million point updates/s); largest error against sin(pi x) sin(pi y) "
               "sin(pi z): {:.3e}\n", o.iterations - first, seconds, points / seconds * 1e-6, error);
  }
  if (root && !o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "step,loss\n";  // the residual under the name resume_test.sh reads, 17 digits
    std::int64_t t = first;
    for (double r : residuals) csv << fmt::format("{},{:.17g}\n", ++t, r);
    if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  }

  if (o.check) {
    const auto mine = mt::gather(u);
    bool ok = true;
    if (root) {
      const auto ref = reference(o, o.iterations);
      double worst = 0, largest = 0;
      for (std::size_t e = 0; e < ref.size(); ++e) {
        worst = std::max(worst, std::abs(mine[e] - ref[e]));
        largest = std::max(largest, std::abs(ref[e]));
      }
      ok = worst <= 1e-12 * largest;
      fmt::print("{} the plain loops' iterate on one processor (largest difference {:.3e}, {:.3e} relative)\n",
                 ok ? "equals" : "DIFFERS FROM", worst, worst / largest);
    }
    MPI_Bcast(&ok, 1, MPI_CXX_BOOL, 0, MPI_COMM_WORLD);
    if (!ok) return 2;
  }
  return 0;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  CLI::App app{"meshtensor: a 3-D Poisson problem by Jacobi iteration on a 2-D mesh (double)"};
  options o;
  app.add_option("--size", o.size, "interior points along x, y and z")->expected(3)->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product: the number of ranks)")->expected(2)
      ->capture_default_str();
  app.add_option("--layout", o.layout, "pencils (x over rows, y over cols) or slabs (x over both)")
      ->check(CLI::IsMember({"pencils", "slabs"}))->capture_default_str();
  app.add_option("--steps", o.iterations, "the iteration to stop after")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--log-every", o.log_every, "iterations between printed residuals")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint, "directory for checkpoints (with --save-every)");
  app.add_option("--save-every", o.save_every, "save a checkpoint every N iterations (needs --checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", o.resume, "continue from this directory's current checkpoint");
  app.add_option("--csv", o.csv, "write every iteration's residual (17 digits) to this file");
  app.add_flag("--check", o.check, "compare the last iterate with plain loops on one processor (1e-12)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    if (o.save_every > 0 && o.checkpoint.empty()) throw mt::error("--save-every needs --checkpoint DIR");
    return o.layout == "slabs" ? run<slabs>(env, o) : run<pencils>(env, o);
  } catch (const std::exception& e) {
    // Every rank failed alike: rank 0 prints it once and all return 1. This rank alone: the job ends
    // with its message instead of leaving the others waiting in a collective.
    return env.fail(e, "jacobi: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("jacobi: error: ");
}
