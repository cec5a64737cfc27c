// The spectral example's peer (examples/spectral, scripts/dev/bench_fft.sh): the same periodic
// Poisson solve on FFTW-MPI's 3-D transform of complex doubles. FFTW-MPI splits x into slabs; the
// forward transform leaves its output transposed (FFTW_MPI_TRANSPOSED_OUT: y split, one transpose)
// and the backward one reads it so (FFTW_MPI_TRANSPOSED_IN): its fastest form, one alltoall each
// way, as meshtensor's slabs. FFTW_ESTIMATE, as meshtensor's plans.
//
//   fftw_mpi_poisson NX NY NZ REPEAT
//
// Prints the line the example prints. The bytes are a model, not a count: the blocks its two
// transposes exchange, which FFTW-MPI's own algorithms (several steps for some shapes) may exceed.
#include <fftw3-mpi.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>

namespace {
double wavenumber(std::ptrdiff_t k, std::ptrdiff_t n) { return double(k <= n / 2 ? k : k - n); }
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  fftw_mpi_init();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 5) {
    if (rank == 0) std::fprintf(stderr, "usage: fftw_mpi_poisson NX NY NZ REPEAT\n");
    MPI_Finalize();
    return 1;
  }
  const std::ptrdiff_t nx = std::atol(argv[1]), ny = std::atol(argv[2]), nz = std::atol(argv[3]);
  const int repeat = std::atoi(argv[4]);
  std::ptrdiff_t n0, x0, n1, y0;
  const std::ptrdiff_t count = fftw_mpi_local_size_3d_transposed(nx, ny, nz, MPI_COMM_WORLD, &n0, &x0, &n1, &y0);
  fftw_complex* f = fftw_alloc_complex(count);
  fftw_complex* u = fftw_alloc_complex(count);
  fftw_complex* spectrum = fftw_alloc_complex(count);
  const fftw_plan forward = fftw_mpi_plan_dft_3d(nx, ny, nz, u, spectrum, MPI_COMM_WORLD, FFTW_FORWARD,
                                                 FFTW_ESTIMATE | FFTW_MPI_TRANSPOSED_OUT);
  const fftw_plan backward = fftw_mpi_plan_dft_3d(nx, ny, nz, spectrum, u, MPI_COMM_WORLD, FFTW_BACKWARD,
                                                  FFTW_ESTIMATE | FFTW_MPI_TRANSPOSED_IN);
  const double two_pi = 2 * std::numbers::pi;
  const auto exact = [&](std::ptrdiff_t i, std::ptrdiff_t j, std::ptrdiff_t k, bool source) {
    const double x = two_pi * double(i) / double(nx), y = two_pi * double(j) / double(ny), z = two_pi * double(k) / double(nz);
    const double a = std::sin(x) * std::cos(2 * y) * std::sin(3 * z), b = 0.5 * std::cos(2 * x + z);
    return source ? 14 * a + 5 * b : a + b;
  };
  for (std::ptrdiff_t i = 0; i < n0; ++i)
    for (std::ptrdiff_t j = 0; j < ny; ++j)
      for (std::ptrdiff_t k = 0; k < nz; ++k) {
        const std::ptrdiff_t e = (i * ny + j) * nz + k;
        f[e][0] = exact(x0 + i, j, k, true);
        f[e][1] = 0;
      }

  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeat; ++r) {
    for (std::ptrdiff_t e = 0; e < n0 * ny * nz; ++e) u[e][0] = f[e][0], u[e][1] = f[e][1];  // FFTW may overwrite its input
    fftw_execute(forward);
    // Transposed: y is split, then x, then z. Divided by |k|^2 and by the n^3 of the unnormalised pair.
    const double norm = 1.0 / double(nx * ny * nz);
    for (std::ptrdiff_t j = 0; j < n1; ++j)
      for (std::ptrdiff_t i = 0; i < nx; ++i)
        for (std::ptrdiff_t k = 0; k < nz; ++k) {
          const double kx = wavenumber(i, nx), ky = wavenumber(y0 + j, ny), kz = wavenumber(k, nz);
          const double k2 = kx * kx + ky * ky + kz * kz;
          const double s = k2 == 0 ? 0.0 : norm / k2;
          const std::ptrdiff_t e = (j * nx + i) * nz + k;
          spectrum[e][0] *= s;
          spectrum[e][1] *= s;
        }
    fftw_execute(backward);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double error = 0;
  for (std::ptrdiff_t i = 0; i < n0; ++i)
    for (std::ptrdiff_t j = 0; j < ny; ++j)
      for (std::ptrdiff_t k = 0; k < nz; ++k)
        error = std::fmax(error, std::fabs(u[(i * ny + j) * nz + k][0] - exact(x0 + i, j, k, false)));
  MPI_Allreduce(MPI_IN_PLACE, &error, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // One transpose each way, x slabs to y slabs and back, each handing its whole local block to the
  // exchange (the part that stays on this rank included, as meshtensor's communicator counts an
  // alltoall); on one process FFTW-MPI transposes nothing.
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const long long bytes = ranks == 1 ? 0 : 16LL * nz * (n0 * ny + n1 * nx);
  if (rank == 0)
    std::printf("%d solves in %.4f s (%.3f ms per solve); bytes sent per rank per solve %lld (model); largest error "
                "against the exact solution %.3e\n",
                repeat, seconds, seconds / repeat * 1e3, bytes, error);
  fftw_destroy_plan(forward);
  fftw_destroy_plan(backward);
  fftw_free(f);
  fftw_free(u);
  fftw_free(spectrum);
  fftw_mpi_cleanup();
  MPI_Finalize();
  return error <= 1e-10 ? 0 : 2;
}
