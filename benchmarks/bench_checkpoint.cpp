// Checkpoint throughput: saves and loads MB megabytes of float parameters (8 tensors [rows, 1024],
// rows split over every rank) with mt::io::save / load, ROUNDS times, and prints one line per
// round: "save_s <s> load_s <s> bytes <n>". scripts/dev/bench_checkpoint.sh runs it at 1, 2 and 4
// ranks beside a plain write + fsync of the same bytes (dd) and reports medians.
//   mpiexec -n P bench_checkpoint DIR MB ROUNDS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <meshtensor/io/safetensors.hpp>
#include <meshtensor/meshtensor.hpp>
#include <string>
#include <vector>

namespace mt = meshtensor;
struct rows_ : mt::dim<"rows"> {};
struct cols_ : mt::dim<"cols"> {};
struct x_ : mt::axis<"x"> {};
using line = mt::mesh<x_>;
using L = mt::layout<line, mt::split<rows_, x_>>;
using W = mt::tensor<float, L, rows_, cols_>;

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  try {
    if (argc < 4) throw mt::error("usage: bench_checkpoint DIR MB ROUNDS");
    const std::string dir = argv[1];
    const double mb = std::atof(argv[2]);
    const int rounds = std::atoi(argv[3]);
    line g(env, {env.world_size()});
    const std::int64_t rows = static_cast<std::int64_t>(mb * 1024 * 1024 / 4 / 1024 / 8);
    std::vector<W> ws;
    for (int k = 0; k < 8; ++k) ws.push_back(mt::random_normal<W>(g, {rows, 1024}, 10 + k));
    mt::io::tensor_set set;
    for (int k = 0; k < 8; ++k) set.add("w" + std::to_string(k), ws[k]);
    const std::string path = dir + "/bench.safetensors";
    for (int r = 0; r < rounds; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      mt::io::save(path, set);
      MPI_Barrier(MPI_COMM_WORLD);
      const double save_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Load from disk, not the page cache: scripts/dev/bench_checkpoint.sh asks for the drop (root only).
      const char* drop = std::getenv("MESHTENSOR_BENCH_DROP_CACHES");
      if (env.world_rank() == 0 && drop && *drop == '1' &&
          std::system("sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null") != 0) {
        std::fprintf(stderr, "bench_checkpoint: could not drop the page cache\n");
      }
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = std::chrono::steady_clock::now();
      mt::io::load(path, set);
      MPI_Barrier(MPI_COMM_WORLD);
      const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (env.world_rank() == 0)
        std::printf("save_s %.4f load_s %.4f bytes %lld\n", save_s, load_s, static_cast<long long>(set.global_bytes()));
    }
    if (env.world_rank() == 0) std::filesystem::remove(path);
    return 0;
  } catch (const std::exception& e) {
    return env.fail(e, "bench_checkpoint: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_checkpoint: error: ");
}
