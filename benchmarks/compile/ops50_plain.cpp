// The work of ops50_meshtensor.cpp written by hand: a 2-D Cartesian communicator, blocks of the
// same layouts (m over rows, k over cols), cblas_sgemm, MPI_Allreduce over the right
// sub-communicators, Kokkos kernels for the elementwise ops and the sum. Compile time only.
#include <cblas.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

struct grid {
  MPI_Comm cart, row_comm, col_comm;  // col_comm: the ranks along cols (same row)
  int prow, pcol, myrow, mycol;
};

grid make_grid(int pr, int pc) {
  grid g{};
  int dims[2] = {pr, pc}, periods[2] = {1, 1}, coords[2], rank;
  MPI_Cart_create(MPI_COMM_WORLD, 2, dims, periods, 0, &g.cart);
  MPI_Comm_rank(g.cart, &rank);
  MPI_Cart_coords(g.cart, rank, 2, coords);
  int keep_rows[2] = {1, 0}, keep_cols[2] = {0, 1};
  MPI_Cart_sub(g.cart, keep_rows, &g.row_comm);
  MPI_Cart_sub(g.cart, keep_cols, &g.col_comm);
  g.prow = pr, g.pcol = pc, g.myrow = coords[0], g.mycol = coords[1];
  return g;
}

KOKKOS_INLINE_FUNCTION float noise(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<float>((z ^ (z >> 31)) >> 40) * (1.0f / 16777216.0f) - 0.5f;
}

}  // namespace

#define GROUP(I)                                                                                              \
  float group##I(const grid& g, std::int64_t s) {                                                             \
    using view = Kokkos::View<float*>;                                                                        \
    const std::int64_t lm = s / g.prow, lk = s / g.pcol, n = s;                                               \
    view a("a", lm * lk), b("b", lk * n), c("c", lm * n), d("d", lm * n), e("e", lm * n), f("f", lm * n),     \
        r("r", n);                                                                                            \
    const std::int64_t m0 = g.myrow * lm, k0 = g.mycol * lk;                                                  \
    Kokkos::parallel_for(                                                                                     \
        "init_a" #I, lm * lk, KOKKOS_LAMBDA(std::int64_t l) {                                                 \
          a(l) = noise(I, (m0 + l / lk) * s + k0 + l % lk);                                                   \
        });                                                                                                   \
    Kokkos::parallel_for(                                                                                     \
        "init_b" #I, lk * n, KOKKOS_LAMBDA(std::int64_t l) { b(l) = noise(I + 100, (k0 + l / n) * n + l % n); }); \
    Kokkos::fence();                                                                                          \
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, lm, n, lk, 1.0f, a.data(), lk, b.data(), n, 0.0f,  \
                c.data(), n);                                                                                 \
    MPI_Allreduce(MPI_IN_PLACE, c.data(), lm * n, MPI_FLOAT, MPI_SUM, g.col_comm);                            \
    Kokkos::parallel_for("add" #I, lm * n, KOKKOS_LAMBDA(std::int64_t l) { d(l) = c(l) + c(l); });           \
    Kokkos::parallel_for("mul" #I, lm * n, KOKKOS_LAMBDA(std::int64_t l) { e(l) = d(l) * c(l); });           \
    Kokkos::parallel_for("relu" #I, lm * n, KOKKOS_LAMBDA(std::int64_t l) { f(l) = e(l) > 0 ? e(l) : 0; });  \
    Kokkos::parallel_for(                                                                                     \
        "sum" #I, n, KOKKOS_LAMBDA(std::int64_t j) {                                                          \
          float acc = 0;                                                                                      \
          for (std::int64_t i = 0; i < lm; ++i) acc += f(i * n + j);                                          \
          r(j) = acc;                                                                                         \
        });                                                                                                   \
    Kokkos::fence();                                                                                          \
    MPI_Allreduce(MPI_IN_PLACE, r.data(), n, MPI_FLOAT, MPI_SUM, g.row_comm);                                 \
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, r);                                     \
    return h(0);                                                                                              \
  }

GROUP(0)
GROUP(1)
GROUP(2)
GROUP(3)
GROUP(4)
GROUP(5)
GROUP(6)
GROUP(7)
GROUP(8)
GROUP(9)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  float t = 0;
  {
    grid g = make_grid(1, 1);
    t += group0(g, 64) + group1(g, 64) + group2(g, 64) + group3(g, 64) + group4(g, 64);
    t += group5(g, 64) + group6(g, 64) + group7(g, 64) + group8(g, 64) + group9(g, 64);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return t == 0 ? 1 : 0;
}
