// Catch2 main for meshtensor tests: MPI and Kokkos live for the whole run. Only rank 0 reports,
// so that a run at 4 ranks prints one report; every rank's result decides the exit code.
#include <mpi.h>

#include <catch2/catch_session.hpp>
#include <meshtensor/runtime/environment.hpp>

#include <cstdlib>

int main(int argc, char** argv) {
  // Kokkos' OpenMP backend prints advice on stdout when this is unset, which test discovery would
  // read as test names.
  setenv("OMP_PROC_BIND", "false", 0);
  meshtensor::environment env(argc, argv);
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (env.world_rank() != 0) session.configData().defaultOutputFilename = "%debug";
  if (env.world_rank() != 0) session.configData().showDurations = Catch::ShowDurations::Never;
  int failed = session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed ? 1 : 0;
}
