// One rank fails while the others wait in a collective: the job must end, with the message, and
// never hang (the rule in runtime/environment.hpp). tests/CMakeLists.txt runs each mode under
// mpiexec at 2 and 4 ranks (labels mpi, failure) through cmake/RunExpectFailure.cmake, which passes
// only when the job ends non-zero in time and its output holds the expected lines.
//
//   uncaught   rank 1 throws out of main: the terminate handler prints the message and MPI_Aborts.
//   caught     rank 1 catches in main, prints, and returns 1 (what the examples used to do):
//              ~environment gives up waiting after MESHTENSOR_FINALIZE_TIMEOUT s and MPI_Aborts.
//   fail       rank 1 catches and returns env.fail(e): MPI_Abort after MESHTENSOR_FAIL_TIMEOUT s.
//   abort      rank 1 catches and calls env.abort(e): MPI_Abort at once.
//   unwind     rank 1's exception leaves the environment's scope (caught outside it): as fail.
//   from_host  the last rank passes a host array of the wrong size: every rank throws the same
//              shape_error, prints it, and returns env.fail(e); a clean exit with code 1.
//   stalls     the last rank sleeps 60 s (alive, outside any collective) before a reduce_sum the
//              others wait in: with MESHTENSOR_COLLECTIVE_TIMEOUT set, the collective watchdog
//              (runtime/watchdog.hpp) ends the job, naming the op, the tensor, the axes and that
//              rank; with a timeout that is not a number, every rank fails alike at the mesh.
//   stalls_before_from_host  as stalls, before from_host's agreement on the array's size (a step's
//              first check, before its first collective): the watchdog ends that wait too.
//   stalls_unpolled  every rank sleeps 60 s inside an unpolled_region_deadline (what a checkpoint's
//              MPI-IO is under): its thread ends each process past the limit, naming the region.
//   stage_stalls  a pipeline of one stage per rank (1F1B, 2 microbatches); the last stage sleeps
//              60 s in its first forward. The stages before it wait for a gradient it never sends:
//              the watchdog ends the job, naming the stage, the message and the peer.
#include <cstdio>
#include <cstring>
#include <chrono>
#include <thread>
#include <meshtensor/meshtensor.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt = meshtensor;

struct procs : mt::axis<"procs"> {};
struct i_ : mt::dim<"i"> {};
using line = mt::mesh<procs>;
using vec = mt::tensor<float, mt::layout<line, mt::split<i_, procs>>, i_>;
using whole = mt::tensor<float, mt::layout<line>, i_>;

namespace {

constexpr std::int64_t n = 64;

// Rank 1 fails before the collective the other ranks then wait in (an allgather over the mesh).
void one_rank_fails(const line& g, int rank) {
  const auto t = mt::iota<vec>(g, {n});
  if (rank == 1) throw std::runtime_error("one_rank_throws: rank 1 failed on purpose");
  const auto all = mt::gather_all(t);
  std::printf("rank %d: gathered %zu elements (must not be reached)\n", rank, all.size());
}

// A stage of y = x * w (the first stage's x = w); the last stage stalls in its first forward.
struct stalling_stage {
  using activation = whole;
  const mt::pipeline::stages<line>& st;
  whole w;
  explicit stalling_stage(const mt::pipeline::stages<line>& s) : st(s), w(mt::iota<whole>(s.mesh(), {n})) {
    w.requires_grad();
  }
  activation::extents_type extents(int) const { return {n}; }
  whole forward(int, const whole* in) const {
    if (st.last()) std::this_thread::sleep_for(std::chrono::seconds(60));
    return in ? whole(*in * w) : whole(w * 1.0);
  }
  auto loss(int, const whole& y) const { return mt::reduce_sum<i_>(y); }
  auto params() { return std::tie(w); }
  void step_gradients(auto&&) {}
};

int run(int argc, char** argv, const std::string& mode) {
  mt::environment env(argc, argv);
  line g(env);
  const int rank = env.world_rank();
  if (mode == "uncaught") {
    one_rank_fails(g, rank);
    return 0;
  }
  if (mode == "unwind") {  // the caller catches, outside the environment's scope
    one_rank_fails(g, rank);
    return 0;
  }
  if (mode == "stalls") {
    const auto t = mt::iota<vec>(g, {n});
    if (rank == env.world_size() - 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    std::printf("rank %d: sum %g (must not be reached)\n", rank, static_cast<double>(mt::item(mt::reduce_sum<i_>(t))));
    return 0;
  }
  if (mode == "stalls_before_from_host") {
    if (rank == env.world_size() - 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    const auto t = mt::from_host<vec>(g, {n}, std::vector<float>(n, 1.0f));
    std::printf("rank %d: from_host returned (must not be reached)\n", rank);
    return 0;
  }
  if (mode == "stalls_unpolled") {
    const mt::detail::unpolled_region_deadline deadline("a region of one_rank_throws");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::printf("rank %d: left the region (must not be reached)\n", rank);
    return 0;
  }
  if (mode == "stage_stalls") {
    mt::pipeline::stages<line> st(env.world(), env.world_size(), {1});
    stalling_stage stage(st);
    (void)mt::pipeline::run(mt::pipeline::one_f_one_b_schedule(env.world_size(), 2), st, stage);
    std::printf("rank %d: the pipeline's step ended (must not be reached)\n", rank);
    return 0;
  }
  if (mode == "from_host") {
    const int last = env.world_size() - 1;
    std::vector<float> host(static_cast<std::size_t>(rank == last ? n - 1 : n), 1.0f);
    try {
      const auto t = mt::from_host<vec>(g, {n}, host);
      std::printf("rank %d: from_host returned (must not be reached)\n", rank);
      return 0;
    } catch (const mt::shape_error& e) {
      std::printf("one_rank_throws: rank %d threw shape_error: %s\n", rank, e.what());
      return env.fail(e, "one_rank_throws: ");
    }
  }
  try {
    one_rank_fails(g, rank);
  } catch (const std::exception& e) {
    if (mode == "caught") {
      std::fprintf(stderr, "one_rank_throws: caught on rank %d: %s\n", rank, e.what());
      return 1;
    }
    if (mode == "fail") return env.fail(e, "one_rank_throws: ");
    if (mode == "abort") env.abort(e);
  }
  std::fprintf(stderr, "one_rank_throws: unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "unwind") return run(argc, argv, mode);
  try {
    return run(argc, argv, mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "one_rank_throws: caught outside the environment: %s\n", e.what());
    return 1;
  }
}
