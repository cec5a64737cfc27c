// A distributed matrix product on a 2x2 mesh of 4 ranks: C[m, n] = sum_k A[m, k] B[k, n].
// m is split over the mesh's rows and k over its cols, so each processor multiplies one block of
// A by one block of B, and the partial products are summed by one allreduce over cols.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <meshtensor/meshtensor.hpp>

namespace mt = meshtensor;

// [names]
struct m : mt::dim<"m"> {};
struct k : mt::dim<"k"> {};
struct n : mt::dim<"n"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};

using grid = mt::mesh<rows, cols>;
using layout = mt::layout<grid, mt::split<m, rows>, mt::split<k, cols>>;
template <class... Dims>
using matrix = mt::tensor<float, layout, Dims...>;
// [names]

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  CLI::App app{"meshtensor: distributed matrix product on a 2-D mesh"};
  std::int64_t size = 1024;
  // a vector, not std::array: nvcc cannot compile CLI11 2.1's std::array overloads
  std::vector<int> shape{2, 2};
  app.add_option("--size", size, "extent of m, k and n")->check(CLI::PositiveNumber);
  app.add_option("--mesh", shape, "mesh sizes rows cols (their product must be the number of ranks)")->expected(2);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  try {
    // [compute]
    grid g(env, {shape[0], shape[1]});  // throws mt::mesh_error, naming the sizes, if world size != rows * cols
    auto a = mt::random_normal<matrix<m, k>>(g, {size, size}, /*seed=*/1);
    auto b = mt::random_normal<matrix<k, n>>(g, {size, size}, /*seed=*/2);
    auto c = mt::einsum<m, n>(a, b);  // k is contracted and split over cols: allreduce over cols
    // [compute]

    if (env.world_rank() == 0) std::printf("%s\n%s\n", mt::describe(a).c_str(), mt::describe(c).c_str());

    // Timed run, after the warm-up above.
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    c = mt::einsum<m, n>(a, b);
    MPI_Barrier(MPI_COMM_WORLD);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Check against one processor's product of the gathered operands.
    const auto ha = mt::gather(a), hb = mt::gather(b), hc = mt::gather(c);
    if (env.world_rank() == 0) {
      std::vector<double> ref(static_cast<std::size_t>(size * size), 0.0);
      for (std::int64_t i = 0; i < size; ++i)
        for (std::int64_t p = 0; p < size; ++p) {
          const double aip = ha[i * size + p];
          for (std::int64_t j = 0; j < size; ++j) ref[i * size + j] += aip * hb[p * size + j];
        }
      double worst = 0;
      for (std::size_t e = 0; e < ref.size(); ++e)
        worst = std::max(worst, std::abs(hc[e] - ref[e]) / std::max(1.0, std::abs(ref[e])));
      const double gflops = 2.0 * double(size) * size * size / seconds * 1e-9;
      std::printf("C[m, n] = A[m, k] B[k, n], %lld^3 on %d ranks: %.3f ms, %.1f GFLOP/s\n",
                  static_cast<long long>(size), g.nprocs(), seconds * 1e3, gflops);
      const bool ok = worst < 1e-4;
      std::printf("%s the single-processor product (max relative error %.2e)\n", ok ? "matches" : "DIFFERS FROM",
                  worst);
      if (!ok) MPI_Abort(MPI_COMM_WORLD, 2);
    }
  } catch (const std::exception& e) {
    // Every rank failed alike: rank 0 prints it once and all return 1. This rank alone: the job ends
    // with its message instead of leaving the others waiting in a collective.
    return env.fail(e, "matmul: ");
  }
  return 0;
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("matmul: ");
}
