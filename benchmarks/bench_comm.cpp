// Communication through meshtensor against raw MPI on MPI_COMM_WORLD, on a 1-D mesh of all ranks.
// Size = bytes of each rank's buffer (allreduce: the reduced buffer; allgather: the gathered
// result; alltoall: the send buffer; relayout: the local slice).
//   allreduce/<side>/<bytes>     meshtensor::allreduce over the mesh axis  vs MPI_Allreduce
//   allgather/<side>/<bytes>     meshtensor::allgather                     vs MPI_Allgather
//   alltoall/<side>/<bytes>      meshtensor::alltoall                      vs MPI_Alltoall
//   reduce_sum/<side>/<bytes>    reduce_sum over a dim split over the axis (a local sum of one
//                                element per output, then the allreduce)   vs MPI_Allreduce
//   gather_relayout/<side>/<bytes>  relayout from e:x to replicated (allgather route) vs MPI_Allgather
//   relayout/<side>/<bytes>      relayout of [a, c] from a:x to c:x (a split moving between dims:
//                                one alltoall, with packing)               vs MPI_Alltoall
#include <meshtensor/meshtensor.hpp>
#include <thread>
#include <vector>

#include "common.hpp"

namespace mt = meshtensor;

struct r : mt::dim<"r"> {};
struct e : mt::dim<"e"> {};
struct a : mt::dim<"a"> {};
struct c : mt::dim<"c"> {};
struct x : mt::axis<"x"> {};

using line = mt::mesh<x>;
template <class... S>
using L = mt::layout<line, S...>;

namespace {

mt::environment* env_ptr = nullptr;

// About 256 MiB moved per benchmark; a tenth of that when the ranks outnumber the cores, where
// every collective waits for the scheduler (milliseconds) whatever its size.
int comm_iters(std::int64_t bytes) {
  const bool oversubscribed = bench::world_size() > static_cast<int>(std::thread::hardware_concurrency());
  const std::int64_t n = ((std::int64_t{256} << 20) / bytes) / (oversubscribed ? 10 : 1);
  return bench::iters(static_cast<int>(std::clamp<std::int64_t>(n, 3, 1000)));
}

void set_bytes(benchmark::State& state, std::int64_t bytes, const std::string& label) {
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
  state.SetLabel(label);
}

enum class what { allreduce, allgather, alltoall, reduce_sum, gather_relayout, relayout };

void ours(benchmark::State& state, what w) {
  const std::int64_t bytes = state.range(0), nf = bytes / 4;
  const int p = bench::world_size();
  line g(*env_ptr, {p});
  auto& comm = g.communicator();
  const unsigned mask = 1u;
  switch (w) {
    case what::allreduce: {
      std::vector<float> buf(nf, 1.0f);
      bench::run(state, [&] { mt::allreduce(comm, mask, buf.data(), nf); });
      break;
    }
    case what::allgather: {
      std::vector<float> send(nf / p, 1.0f), recv(nf);
      bench::run(state, [&] { mt::allgather(comm, mask, send.data(), nf / p, recv.data()); });
      break;
    }
    case what::alltoall: {
      std::vector<float> send(nf, 1.0f), recv(nf);
      bench::run(state, [&] { mt::alltoall(comm, mask, send.data(), nf / p, recv.data()); });
      break;
    }
    case what::reduce_sum: {
      auto t = mt::full<mt::tensor<float, L<mt::split<r, x>>, r, e>>(g, {p, nf}, 1.0f);
      mt::tensor<float, L<mt::split<r, x>>, e> out;
      bench::run(state, [&] {
        out = mt::reduce_sum<r>(t);
        benchmark::DoNotOptimize(out.view().data());
        Kokkos::fence();  // kernels are asynchronous on a GPU
      });
      break;
    }
    case what::gather_relayout: {
      auto t = mt::full<mt::tensor<float, L<mt::split<e, x>>, e>>(g, {nf}, 1.0f);
      mt::tensor<float, L<>, e> out;
      bench::run(state, [&] {
        out = mt::relayout<mt::tensor<float, L<>, e>>(t);
        benchmark::DoNotOptimize(out.view().data());
        Kokkos::fence();  // kernels are asynchronous on a GPU
      });
      break;
    }
    case what::relayout: {
      const std::int64_t nc = 64 * p, na = p * (nf / nc);
      auto t = mt::full<mt::tensor<float, L<mt::split<a, x>>, a, c>>(g, {na, nc}, 1.0f);
      using To = mt::tensor<float, L<mt::split<c, x>>, a, c>;
      To out;
      bench::run(state, [&] {
        out = mt::relayout<To>(t);
        benchmark::DoNotOptimize(out.view().data());
        Kokkos::fence();  // kernels are asynchronous on a GPU
      });
      break;
    }
  }
  set_bytes(state, bytes, "meshtensor");
}

void raw(benchmark::State& state, what w) {
  const std::int64_t bytes = state.range(0), nf = bytes / 4;
  const int p = bench::world_size();
  const int n = static_cast<int>(nf);
  std::string label;
  switch (w) {
    case what::allreduce:
    case what::reduce_sum: {
      std::vector<float> buf(nf, 1.0f);
      bench::run(state, [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
      label = "MPI_Allreduce";
      break;
    }
    case what::allgather:
    case what::gather_relayout: {
      std::vector<float> send(nf / p, 1.0f), recv(nf);
      bench::run(state, [&] {
        MPI_Allgather(send.data(), n / p, MPI_FLOAT, recv.data(), n / p, MPI_FLOAT, MPI_COMM_WORLD);
      });
      label = "MPI_Allgather";
      break;
    }
    case what::alltoall:
    case what::relayout: {
      std::vector<float> send(nf, 1.0f), recv(nf);
      bench::run(state, [&] {
        MPI_Alltoall(send.data(), n / p, MPI_FLOAT, recv.data(), n / p, MPI_FLOAT, MPI_COMM_WORLD);
      });
      label = "MPI_Alltoall";
      break;
    }
  }
  set_bytes(state, bytes, label);
}

void register_all() {
  const bool smoke = bench::smoke();
  std::vector<std::int64_t> sizes;
  if (smoke)
    sizes = {std::int64_t{64} << 10};
  else
    for (std::int64_t s = std::int64_t{64} << 10; s <= (std::int64_t{64} << 20); s *= 4) sizes.push_back(s);
  const std::pair<what, const char*> all[] = {{what::allreduce, "allreduce"},   {what::allgather, "allgather"},
                                              {what::alltoall, "alltoall"},     {what::reduce_sum, "reduce_sum"},
                                              {what::gather_relayout, "gather_relayout"}, {what::relayout, "relayout"}};
  for (auto [w, name] : all)
    for (auto s : sizes) {
      const auto sz = std::to_string(s);
      benchmark::RegisterBenchmark((std::string(name) + "/ours/" + sz).c_str(), [w = w](benchmark::State& st) { ours(st, w); })
          ->Arg(s)->Iterations(comm_iters(s))->UseManualTime()->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((std::string(name) + "/mpi/" + sz).c_str(), [w = w](benchmark::State& st) { raw(st, w); })
          ->Arg(s)->Iterations(comm_iters(s))->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
}

}  // namespace

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  env_ptr = &env;
  register_all();
  return bench::main(argc, argv);
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_comm: error: ");
}
