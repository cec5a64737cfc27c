#pragma once
// RAII for MPI and Kokkos: initialises what the host program has not, finalises only what it started.
#include <mpi.h>

#include <Kokkos_Core.hpp>

namespace meshtensor {

class environment {
 public:
  environment(int& argc, char**& argv) {
    int mpi_ready = 0;
    MPI_Initialized(&mpi_ready);
    if (!mpi_ready) {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
      owns_mpi_ = true;
    }
    if (!Kokkos::is_initialized()) {
      Kokkos::initialize(argc, argv);
      owns_kokkos_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (owns_kokkos_) Kokkos::finalize();
    if (owns_mpi_) {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    }
  }

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }

 private:
  bool owns_mpi_ = false;
  bool owns_kokkos_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace meshtensor
