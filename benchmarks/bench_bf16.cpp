// Local products, bf16 against float32, one rank: einsum<m, n>(a[m, k], b[k, n]) at square sizes
// and a Transformer's feed-forward shape.
//   product/<type>/<m>x<k>x<n>
// bf16 goes to oneDNN's matmul where the build has it (float accumulation, AVX512_BF16 or AMX
// where the CPU has them), else it is widened to float for sgemm; float32 goes to OpenBLAS. The
// peer is PyTorch's matmul on one thread (benchmarks/peers/torch_matmul.py, the same shapes;
// scripts/bench_bf16.sh runs both in interleaved rounds). The JSON's context names oneDNN's ISA.
#include <meshtensor/meshtensor.hpp>

#include "common.hpp"

namespace {
namespace mt = meshtensor;
struct m : mt::dim<"m"> {};
struct k : mt::dim<"k"> {};
struct n : mt::dim<"n"> {};
struct x_ : mt::axis<"x"> {};
using line = mt::mesh<x_>;
using layout = mt::layout<line>;

struct shape {
  std::int64_t m, k, n;
};

template <class T>
void product(benchmark::State& state, shape s) {
  line g(MPI_COMM_WORLD, {bench::world_size()});
  using F = mt::tensor<float, layout, m, k>;
  using G = mt::tensor<float, layout, k, n>;
  const auto a = mt::cast<T>(mt::random_normal<F>(g, {s.m, s.k}, 1));
  const auto b = mt::cast<T>(mt::random_normal<G>(g, {s.k, s.n}, 2));
  bench::run(state, [&] {
    const auto c = mt::einsum<m, n>(a, b);
    Kokkos::fence();
    benchmark::DoNotOptimize(c.view().data());
  });
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.m * s.k * s.n, benchmark::Counter::kIsIterationInvariantRate);
#if MESHTENSOR_HAVE_DNNL
  if (std::is_same_v<T, mt::bf16> && mt::kernels::dnnl_provider::enabled())
    state.SetLabel("oneDNN " + mt::kernels::dnnl_provider::matmul_implementation<T>(s.m, s.n, s.k));
  else
#endif
    state.SetLabel(std::is_same_v<T, float> ? "OpenBLAS sgemm" : "widened to float, sgemm");
}
}  // namespace

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  const std::vector<shape> shapes = bench::smoke() ? std::vector<shape>{{8, 8, 8}}
                                                   : std::vector<shape>{{512, 512, 512}, {1024, 1024, 1024}, {1024, 256, 1024}};
  for (const auto& s : shapes) {
    const std::string dims = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    for (const bool bf : {false, true}) {
      const std::string name = std::string("product/") + (bf ? "bf16/" : "float32/") + dims;
      auto* b = bf ? benchmark::RegisterBenchmark(name.c_str(), [s](benchmark::State& st) { product<mt::bf16>(st, s); })
                   : benchmark::RegisterBenchmark(name.c_str(), [s](benchmark::State& st) { product<float>(st, s); });
      b->Iterations(bench::iters(20))->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
  return bench::main(argc, argv);
}
