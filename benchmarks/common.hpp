#pragma once
// Shared by the benchmark binaries: Google Benchmark under MPI.
//
// Google Benchmark picks its iteration count adaptively, differently on each rank, which would
// deadlock collectives. So every MPI benchmark here runs a fixed ->Iterations(n), untimed warm-up
// first, with UseManualTime: the time of each iteration is the max over ranks (MPI_Allreduce MAX)
// of its wall-clock time between two barriers-free points, the time the slowest rank needed.
// Only rank 0 reports: the others get a reporter that prints nothing and no --benchmark_out.
#include <benchmark/benchmark.h>
#include <meshtensor/kernels/dnnl.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace bench {

// Times one iteration of f on every rank, then the max over ranks, set as the manual time.
// A barrier before starting puts the ranks at one line, so no rank's time holds another's wait.
template <class F>
void timed(benchmark::State& state, F&& f, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Barrier(comm);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
  state.SetIterationTime(t);
}

// Runs f untimed `warm` times, then the state's fixed iterations timed by `timed`.
template <class F>
void run(benchmark::State& state, F&& f, int warm = 1) {
  for (int i = 0; i < warm; ++i) f();
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) timed(state, f);
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

class null_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// The binary's main after MPI and Kokkos are up: rank 0 runs Google Benchmark with the command
// line as given; the other ranks run the same benchmarks, silently, without --benchmark_out.
inline int main(int argc, char** argv) {
  const int rank = world_rank();
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (rank == 0 || std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  char** av = args.data();
  benchmark::Initialize(&n, av);
  if (benchmark::ReportUnrecognizedArguments(n, av)) return 1;
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
  benchmark::AddCustomContext("OMP_NUM_THREADS", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "(unset)");
  benchmark::AddCustomContext("OPENBLAS_NUM_THREADS",
                              std::getenv("OPENBLAS_NUM_THREADS") ? std::getenv("OPENBLAS_NUM_THREADS") : "(unset)");
  benchmark::AddCustomContext("mpi_ranks", std::to_string(world_size()));
  // The local kernels of this build and run, and why (kernels::describe: the provider of each kind
  // of work, the ISA the job agreed on and this CPU's).
  benchmark::AddCustomContext("kernels", meshtensor::kernels::describe());
  benchmark::AddCustomContext("cpu_isa_job", std::string(meshtensor::name_of(meshtensor::cpu_isa().job)));
  benchmark::AddCustomContext("cpu_isa_this_cpu", std::string(meshtensor::name_of(meshtensor::cpu_isa().this_cpu)));
#if MESHTENSOR_HAVE_DNNL
  const auto v = dnnl::version();
  benchmark::AddCustomContext("onednn_version", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                                                    std::to_string(v->patch));
  benchmark::AddCustomContext("onednn_isa", meshtensor::kernels::dnnl_provider::isa_name());
  benchmark::AddCustomContext("bf16_products", meshtensor::kernels::dnnl_provider::has_bf16() ? "oneDNN" : "portable (widened to float, OpenBLAS)");
#endif
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    null_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}

// Iterations: the environment's MESHTENSOR_BENCH_ITERS scales them (the smoke tests set 1).
inline int iters(int n) {
  if (const char* s = std::getenv("MESHTENSOR_BENCH_ITERS")) return std::max(1, std::atoi(s));
  return n;
}

// Sizes: MESHTENSOR_BENCH_SMOKE=1 replaces every size by a tiny one, so the smoke tests stay fast.
inline bool smoke() {
  const char* s = std::getenv("MESHTENSOR_BENCH_SMOKE");
  return s && std::string(s) == "1";
}

}  // namespace bench
