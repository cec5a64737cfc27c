// Measures what the cost model (include/meshtensor/plan/cost_model.hpp) needs, on this machine,
// with every rank of the run busy at once (so 4 ranks on 2 cores are measured as they will run):
//   - the float32 product rate (einsum, m = n = k = 32 to 512, 2 m n k FLOPs per product);
//   - the bytes per second of results an elementwise op writes (4 Mi elements), of parameters an
//     Adam step updates in place (4 Mi), and of a host array from_host copies into a tensor (4 Mi);
//   - a kernel's fixed cost: the time of a small training step (dense, relu, cross-entropy, its
//     gradient and an Adam step, on 4 x 16 tensors: no time in arithmetic), less what its plan's
//     bytes and FLOPs cost at the rates above, over the kernels its plan counts;
//   - alpha (seconds per call) and beta (seconds per byte) of each collective over groups of every
//     size that divides the rank count (groups run at once, as a mesh's sub-communicators do),
//     from 8-byte and 4 MiB messages.
// Medians over repetitions; rank 0 writes the file (default calibration-<ranks>.txt). Each timed
// region lasts tens of milliseconds, several of the scheduler's time slices: with more ranks than
// cores, a shorter one can run while the other ranks wait, and measure a whole core's rate.
//
//   mpiexec -n 4 bench_calibrate [--out FILE] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <meshtensor/plan/cost_model.hpp>
#include <meshtensor/meshtensor.hpp>
#include <string>
#include <vector>

namespace mt = meshtensor;

namespace {
struct i_ : mt::dim<"i"> {};
struct j_ : mt::dim<"j"> {};
struct k_ : mt::dim<"k"> {};
struct c_ : mt::dim<"c"> {};
struct x_ : mt::axis<"x"> {};
struct g_ : mt::axis<"group"> {};
struct p_ : mt::axis<"peer"> {};
using line = mt::mesh<x_>;
using grouped = mt::mesh<g_, p_>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median over ranks' medians of f's time, f run `repeats` times after one warm-up, all ranks
// starting together (a barrier before each run).
template <class F>
double median_time(MPI_Comm comm, int repeats, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  double mine = t[t.size() / 2], slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}
}  // namespace

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  const int ranks = env.world_size();
  std::string out = "calibration-" + std::to_string(ranks) + ".txt";
  int repeats = 15;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string flag = argv[a];
    if (flag == "--out") out = argv[a + 1];
    else if (flag == "--repeats") repeats = std::atoi(argv[a + 1]);
  }
  if (std::getenv("MESHTENSOR_BENCH_SMOKE")) repeats = 1;
  const bool smoke = std::getenv("MESHTENSOR_BENCH_SMOKE") != nullptr;
  try {
    mt::machine_calibration c;
    c.ranks = ranks;
    MPI_Comm world = MPI_COMM_WORLD;
    // Local work: a one-processor mesh per rank (MPI_COMM_SELF), every rank at once.
    const line self(MPI_COMM_SELF, {1});
    using L = mt::layout<line>;
    for (const std::int64_t n : {32, 64, 128, 256, 512}) {
      if (smoke && n > 64) break;
      const auto a = mt::random_normal<mt::tensor<float, L, i_, k_>>(self, {n, n}, 1);
      const auto b = mt::random_normal<mt::tensor<float, L, k_, j_>>(self, {n, n}, 2);
      const int products = static_cast<int>(std::max<std::int64_t>(1, (std::int64_t{1} << (smoke ? 20 : 29)) / (n * n * n)));
      const double t = median_time(world, repeats, [&] {
        for (int r = 0; r < products; ++r) (void)mt::einsum<i_, j_>(a, b);
        Kokkos::fence();
      });
      c.gemm_rates[static_cast<double>(n * n * n)] = 2.0 * n * n * n * products / t;
      c.gemm_flops_per_s = c.gemm_rates.rbegin()->second;
    }
    {
      const std::int64_t n = smoke ? 4096 : std::int64_t{1} << 22;
      const auto a = mt::random_normal<mt::tensor<float, L, i_>>(self, {n}, 5);
      const auto b = mt::random_normal<mt::tensor<float, L, i_>>(self, {n}, 6);
      const int products = smoke ? 1 : 16;
      const double t = median_time(world, repeats, [&] {
        for (int r = 0; r < products; ++r) (void)(a * b);
        Kokkos::fence();
      });
      c.bytes_per_s = static_cast<double>(n) * sizeof(float) * products / t;
      auto w = mt::random_normal<mt::tensor<float, L, i_>>(self, {n}, 9);
      mt::optim::adam adam({.lr = 1e-3});
      const int steps = smoke ? 1 : 4;
      const double t_adam = median_time(world, repeats, [&] {
        for (int r = 0; r < steps; ++r) adam.step(std::tie(w), std::tuple{a});
        Kokkos::fence();
      });
      c.optimizer_bytes_per_s = static_cast<double>(n) * sizeof(float) * steps / t_adam;
      const std::vector<float> host(static_cast<std::size_t>(n), 0.5f);
      const double t_host = median_time(world, repeats, [&] {
        for (int r = 0; r < steps; ++r) (void)mt::from_host<mt::tensor<float, L, i_>>(self, {n}, host);
        Kokkos::fence();
      });
      c.host_bytes_per_s = static_cast<double>(n) * sizeof(float) * steps / t_host;
    }
    {
      // A small training step, timed for real, then planned on a planned [1] mesh for its kernels.
      const auto step = [smoke](const line& m, mt::optim::adam& adam) {
        auto w = mt::random_normal<mt::tensor<float, L, k_, c_>>(m, {16, 16}, 7);
        w.requires_grad();
        const auto x = mt::random_normal<mt::tensor<float, L, i_, k_>>(m, {4, 16}, 8);
        const auto y = mt::zeros<mt::tensor<float, L, i_>>(m, {4});
        for (int r = 0; r < (smoke ? 2 : 200); ++r) {
          const auto loss = mt::reduce_mean<i_>(mt::nn::softmax_cross_entropy<c_>(mt::relu(mt::nn::dense<k_, c_>(x, w)), y));
          auto g = mt::gradient(loss, w);
          adam.step(std::tie(w), g);
        }
      };
      mt::optim::adam adam({.lr = 1e-3});
      const double t = median_time(world, repeats, [&] {
        step(self, adam);
        Kokkos::fence();
      });
      mt::plan_report r;
      {
        const line planned = line::planned({1});
        mt::optim::adam planned_adam({.lr = 1e-3});
        step(planned, planned_adam);
        r = mt::plan_report_of(planned);
      }
      c.seconds_per_kernel = 0;
      const double rest = mt::predict(r, c).total();
      c.seconds_per_kernel = std::max(0.0, t - rest) / static_cast<double>(std::max<std::int64_t>(1, r.kernels));
    }
    c.bf16_products_widened = mt::kernels::widens_to_float<Kokkos::DefaultExecutionSpace, mt::bf16>();
    // Collectives over groups of q ranks (q dividing the rank count, q > 1): a [ranks/q x q] mesh,
    // over its second axis, so every group runs at once.
    for (int q = 2; q <= ranks; ++q) {
      if (ranks % q) continue;
      const grouped m(world, {ranks / q, q});
      auto& comm = m.communicator();
      const unsigned axes = grouped::mask<p_>();
      for (int k = 0; k <= static_cast<int>(mt::collective::exscan); ++k) {
        const auto kind = static_cast<mt::collective>(k);
        if (kind == mt::collective::gather) continue;  // host I/O's, not a step's
        // t(bytes) for 2 elements and for 1 Mi elements per processor (floats).
        double t_at[2] = {0, 0};
        std::int64_t bytes_at[2] = {0, 0};
        const std::int64_t sizes[2] = {2, smoke ? 1024 : std::int64_t{1} << 20};
        for (int s = 0; s < 2; ++s) {
          const std::int64_t n = sizes[s];
          std::vector<float> send(static_cast<std::size_t>(n * q), 1.0f), recv(send.size());
          const auto before = comm.counters();
          auto call = [&] {
            switch (kind) {
              case mt::collective::allreduce: mt::allreduce(comm, axes, send.data(), n); break;
              case mt::collective::allgather: mt::allgather(comm, axes, send.data(), n, recv.data()); break;
              case mt::collective::alltoall: mt::alltoall(comm, axes, send.data(), n / q > 0 ? n / q : 1, recv.data()); break;
              case mt::collective::reduce_scatter:
                mt::reduce_scatter(comm, axes, send.data(), recv.data(), n / q > 0 ? n / q : 1);
                break;
              case mt::collective::shift: mt::shift(comm, 1, send.data(), recv.data(), n, 1, true); break;
              case mt::collective::broadcast: mt::broadcast(comm, axes, send.data(), n); break;
              case mt::collective::exscan: mt::exscan(comm, axes, send.data(), recv.data(), n); break;
              default: break;
            }
          };
          t_at[s] = median_time(world, repeats, call);
          // The bytes a call counts (what a plan's report holds), from the counters themselves.
          const auto& after = comm.counters().at({kind, axes});
          const auto it = before.find({kind, axes});
          const std::int64_t calls = after.calls - (it == before.end() ? 0 : it->second.calls);
          const std::int64_t bytes = after.bytes - (it == before.end() ? 0 : it->second.bytes);
          bytes_at[s] = bytes / std::max<std::int64_t>(calls, 1);
        }
        mt::machine_calibration::alpha_beta ab;
        ab.beta = std::max(0.0, (t_at[1] - t_at[0]) / static_cast<double>(std::max<std::int64_t>(1, bytes_at[1] - bytes_at[0])));
        ab.alpha = std::max(0.0, t_at[0] - ab.beta * static_cast<double>(bytes_at[0]));
        c.collectives[{kind, q}] = ab;
      }
    }
    if (env.world_rank() == 0) {
      c.save(out);
      std::printf("calibration at %d ranks: product %.3g FLOP/s, elementwise %.3g B/s, %.3g s per op", ranks,
                  c.gemm_flops_per_s, c.bytes_per_s, c.seconds_per_kernel);
      for (const auto& [key, ab] : c.collectives)
        std::printf("; %s over %d: alpha %.3g s, beta %.3g s/B", mt::to_string(key.first), key.second, ab.alpha, ab.beta);
      std::printf("\nwritten to %s\n", out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    return env.fail(e, "bench_calibrate: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_calibrate: error: ");
}
