// The peer of examples/jacobi: the same 3-D Poisson problem and Jacobi sweep, written as PETSc users
// write it (a DMDA with a star stencil of width 1, DMGlobalToLocal for the halos, the sweep over
// the owned box). Built where PETSc is installed (Debian: libpetsc-real-dev); run side by side with
// the example by scripts/dev/bench_jacobi.sh.
//
//   petsc_jacobi NX NY NZ ITERATIONS PX PY   (PX x PY x 1 processes, as the example's pencils)
//
// Prints the time of the iterations and the residual's root mean square after them, which equals
// the example's (the same arithmetic per point, in the same order).
#include <petscdmda.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>

int main(int argc, char** argv) {
  PetscCall(PetscInitialize(&argc, &argv, nullptr, nullptr));
  if (argc < 7) {
    PetscCall(PetscPrintf(PETSC_COMM_WORLD, "usage: petsc_jacobi NX NY NZ ITERATIONS PX PY\n"));
    PetscCall(PetscFinalize());
    return 1;
  }
  const PetscInt nx = std::atoi(argv[1]), ny = std::atoi(argv[2]), nz = std::atoi(argv[3]);
  const long iterations = std::atol(argv[4]);
  const PetscInt px = std::atoi(argv[5]), py = std::atoi(argv[6]);
  DM da;
  PetscCall(DMDACreate3d(PETSC_COMM_WORLD, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DMDA_STENCIL_STAR, nx, ny,
                         nz, px, py, 1, 1, 1, nullptr, nullptr, nullptr, &da));
  PetscCall(DMSetUp(da));
  Vec u, next, f, local;
  PetscCall(DMCreateGlobalVector(da, &u));
  PetscCall(VecDuplicate(u, &next));
  PetscCall(VecDuplicate(u, &f));
  PetscCall(DMCreateLocalVector(da, &local));
  PetscCall(VecSet(u, 0.0));

  const double ax = double((nx + 1) * (nx + 1)), ay = double((ny + 1) * (ny + 1)), az = double((nz + 1) * (nz + 1));
  const double inv_diagonal = 1.0 / (2.0 * (ax + ay + az)), pi = std::numbers::pi;
  PetscInt xs, ys, zs, xm, ym, zm;
  PetscCall(DMDAGetCorners(da, &xs, &ys, &zs, &xm, &ym, &zm));
  {
    PetscScalar*** fa;
    PetscCall(DMDAVecGetArray(da, f, &fa));
    for (PetscInt i = xs; i < xs + xm; ++i)
      for (PetscInt j = ys; j < ys + ym; ++j)
        for (PetscInt k = zs; k < zs + zm; ++k)
          fa[k][j][i] = 3 * pi * pi * std::sin(pi * double(i + 1) / double(nx + 1)) *
                        std::sin(pi * double(j + 1) / double(ny + 1)) * std::sin(pi * double(k + 1) / double(nz + 1));
    PetscCall(DMDAVecRestoreArray(da, f, &fa));
  }
  // The example's x is its slowest dim and PETSc's the fastest: index [k][j][i] with i along x, so
  // that the decomposition over x and y is the same; the values do not depend on the storage order.
  // PetscCallAbort in the lambda: PetscCall returns an error code, which a lambda returning the
  // residual cannot.
  const auto sweep = [&](Vec from, Vec to, bool residual) -> double {
    PetscCallAbort(PETSC_COMM_WORLD, DMGlobalToLocalBegin(da, from, INSERT_VALUES, local));
    PetscCallAbort(PETSC_COMM_WORLD, DMGlobalToLocalEnd(da, from, INSERT_VALUES, local));
    const PetscScalar*** ua;
    const PetscScalar*** fa;
    PetscScalar*** ta = nullptr;
    PetscCallAbort(PETSC_COMM_WORLD, DMDAVecGetArrayRead(da, local, &ua));
    PetscCallAbort(PETSC_COMM_WORLD, DMDAVecGetArrayRead(da, f, &fa));
    if (!residual) PetscCallAbort(PETSC_COMM_WORLD, DMDAVecGetArray(da, to, &ta));
    const auto at = [&](PetscInt i, PetscInt j, PetscInt k) {
      return i < 0 || i >= nx || j < 0 || j >= ny || k < 0 || k >= nz ? 0.0 : ua[k][j][i];
    };
    double sum = 0;
    for (PetscInt k = zs; k < zs + zm; ++k)
      for (PetscInt j = ys; j < ys + ym; ++j)
        for (PetscInt i = xs; i < xs + xm; ++i) {
          const double s = (at(i - 1, j, k) + at(i + 1, j, k)) * ax + (at(i, j - 1, k) + at(i, j + 1, k)) * ay +
                           (at(i, j, k - 1) + at(i, j, k + 1)) * az;
          if (residual) {
            const double r = s - ua[k][j][i] * (2.0 * (ax + ay + az)) + fa[k][j][i];
            sum += r * r;
          } else {
            ta[k][j][i] = (s + fa[k][j][i]) * inv_diagonal;
          }
        }
    PetscCallAbort(PETSC_COMM_WORLD, DMDAVecRestoreArrayRead(da, local, &ua));
    PetscCallAbort(PETSC_COMM_WORLD, DMDAVecRestoreArrayRead(da, f, &fa));
    if (!residual) PetscCallAbort(PETSC_COMM_WORLD, DMDAVecRestoreArray(da, to, &ta));
    return sum;
  };

  PetscCall(PetscBarrier(nullptr));
  const auto t0 = std::chrono::steady_clock::now();
  for (long t = 0; t < iterations; ++t) {
    sweep(u, next, false);
    PetscCall(VecSwap(u, next));
  }
  PetscCall(PetscBarrier(nullptr));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double mine = sweep(u, nullptr, true), sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, PETSC_COMM_WORLD);
  const double points = double(nx) * double(ny) * double(nz);
  PetscCall(PetscPrintf(PETSC_COMM_WORLD,
                        "petsc_jacobi: %ld iterations in %.3f s (%.1f million point updates/s); residual %.6e\n",
                        iterations, seconds, points * double(iterations) / seconds * 1e-6, std::sqrt(sum / points)));
  PetscCall(VecDestroy(&u));
  PetscCall(VecDestroy(&next));
  PetscCall(VecDestroy(&f));
  PetscCall(VecDestroy(&local));
  PetscCall(DMDestroy(&da));
  PetscCall(PetscFinalize());
  return 0;
}
