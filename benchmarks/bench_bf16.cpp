// Local products, bf16 against float32, one rank: einsum<m, n>(a[m, k], b[k, n]) at square sizes
// and a Transformer's feed-forward shape.
//   product/<type>/<m>x<k>x<n>
// bf16 goes to oneDNN's matmul where the build has it (float accumulation, AVX512_BF16 or AMX
// where the CPU has them), else it is widened to float for sgemm; float32 goes to oneDNN's matmul
// on AVX-512 cores, else to OpenBLAS (kernels/product.hpp says why). The peer is PyTorch's matmul on
// one thread (benchmarks/peers/torch_matmul.py, the same shapes; scripts/dev/bench_bf16.sh runs both in
// interleaved rounds). The JSON's context names oneDNN's ISA.
//   float_provider/<nb>x<m>x<k>x<n>/<op(a)><op(b)>/{openblas,onednn}
// float32 products at the shapes of the Transformer step (scripts/dev/bench_training.sh's model: 1024
// tokens, d_model 256, d_ff 1024, vocab 1024, 32 attention matrices of 128 x 128 over d_kv 64),
// each through both providers directly: the measurement behind kernels::product's choice.
#include <cblas.h>

#include <meshtensor/meshtensor.hpp>
#include <vector>

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
  if (std::is_same_v<T, mt::bf16> ? mt::kernels::dnnl_provider::has_bf16()
                                   : mt::kernels::dnnl_provider::float_products())
    state.SetLabel("oneDNN " + mt::kernels::dnnl_provider::matmul_implementation<T>(s.m, s.n, s.k));
  else
#endif
    state.SetLabel(std::is_same_v<T, float> ? "OpenBLAS sgemm" : "widened to float, sgemm");
}

struct batched_shape {
  std::int64_t nb, m, k, n;
  bool trans_a, trans_b;
};

// One provider's float product C[b] = op(A[b]) op(B[b]), called directly (no einsum around it).
void float_provider(benchmark::State& state, batched_shape s, bool onednn) {
  std::vector<float> a(s.nb * s.m * s.k), b(s.nb * s.k * s.n), c(s.nb * s.m * s.n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.125f - 0.25f;
  const int lda = static_cast<int>(s.trans_a ? s.m : s.k), ldb = static_cast<int>(s.trans_b ? s.k : s.n);
  bench::run(state, [&] {
    if (onednn) {
#if MESHTENSOR_HAVE_DNNL
      mt::kernels::dnnl_provider::matmul<float>(s.nb, s.m, s.n, s.k, s.trans_a, s.trans_b, a.data(), b.data(), c.data());
#endif
    } else {
      for (std::int64_t i = 0; i < s.nb; ++i)
        cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data() + i * s.m * s.k,
                    lda, b.data() + i * s.k * s.n, ldb, 0.0f, c.data() + i * s.m * s.n, static_cast<int>(s.n));
    }
    benchmark::DoNotOptimize(c.data());
  });
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.nb * s.m * s.k * s.n, benchmark::Counter::kIsIterationInvariantRate);
#if MESHTENSOR_HAVE_DNNL
  if (onednn) state.SetLabel(mt::kernels::dnnl_provider::matmul_implementation<float>(s.m, s.n, s.k));
#endif
}
}  // namespace

int main(int argc, char** argv) try {
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
  const std::vector<batched_shape> step_shapes =
      bench::smoke() ? std::vector<batched_shape>{{2, 8, 8, 8, false, true}}
                     : std::vector<batched_shape>{{1, 1024, 256, 256, false, false},   {1, 1024, 256, 256, false, true},
                                                  {1, 256, 1024, 256, true, false},    {32, 128, 64, 128, false, true},
                                                  {32, 128, 128, 64, false, false},    {32, 128, 128, 64, true, false},
                                                  {1, 1024, 256, 1024, false, false},  {1, 1024, 1024, 256, false, false},
                                                  {1, 1024, 1024, 256, false, true},   {1, 256, 1024, 1024, true, false}};
#if MESHTENSOR_HAVE_DNNL
  const bool have_onednn = true;
#else
  const bool have_onednn = false;
#endif
  for (const auto& s : step_shapes)
    for (const bool onednn : {false, true}) {
      if (onednn && !have_onednn) continue;
      const std::string name = "float_provider/" + std::to_string(s.nb) + "x" + std::to_string(s.m) + "x" +
                               std::to_string(s.k) + "x" + std::to_string(s.n) + "/" + (s.trans_a ? "T" : "N") +
                               (s.trans_b ? "T" : "N") + (onednn ? "/onednn" : "/openblas");
      benchmark::RegisterBenchmark(name.c_str(), [s, onednn](benchmark::State& st) { float_provider(st, s, onednn); })
          ->Iterations(bench::iters(30))
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  return bench::main(argc, argv);
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_bf16: error: ");
}
