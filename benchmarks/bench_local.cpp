// One rank: meshtensor's einsum against the kernels one would call by hand.
//   matmul/<side>/<n>       C[m,n] = A[m,k] B[k,n], n^3, float: ours vs cblas_sgemm
//   attn_qk/<side>/<s>      S[b,h,q,k] = Q[b,h,q,d] K[b,h,k,d]: ours vs Eigen Tensor contraction,
//                           and vs a loop of cblas_sgemm (what einsum itself calls)
//   attn_av/<side>/<s>      O[b,h,q,d] = P[b,h,q,k] V[b,h,k,d]: the same three
// Names are <comparison>/<side>/<size>; side is "ours" or the peer; the label names the peer.
// PyTorch's einsum on the same shapes is benchmarks/peers/torch_einsum.py.
// Built for a GPU (the default execution space's memory not host-accessible), the peer is cuBLAS
// called directly on the same device buffers (cublasSgemm, cublasSgemmStridedBatched over b*h),
// at the sizes that fill a GPU (matmul 1024 to 8192, attention sequences 512 and 2048).
#include <cblas.h>

#include <meshtensor/meshtensor.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#if MESHTENSOR_BENCH_EIGEN
#include "peers/eigen_contract.hpp"
#endif
#ifdef KOKKOS_ENABLE_CUDA
#include <cublas_v2.h>
#endif

namespace mt = meshtensor;

#ifndef MESHTENSOR_BENCH_EIGEN
#define MESHTENSOR_BENCH_EIGEN 0
#endif

struct m : mt::dim<"m"> {};
struct k : mt::dim<"k"> {};
struct n : mt::dim<"n"> {};
struct b : mt::dim<"b"> {};
struct h : mt::dim<"h"> {};
struct q : mt::dim<"q"> {};
struct kv : mt::dim<"kv"> {};
struct d : mt::dim<"d"> {};
struct x : mt::axis<"x"> {};

using one = mt::mesh<x>;
using plain = mt::layout<one>;
template <class... Ds>
using ftensor = mt::tensor<float, plain, Ds...>;

namespace {

mt::environment* env_ptr = nullptr;

// Iterations so that one run takes roughly a fixed time at the expected speed.
int matmul_iters(std::int64_t s) { return bench::iters(s <= 512 ? 40 : s <= 1024 ? 8 : 2); }

void matmul_ours(benchmark::State& state) {
  const std::int64_t s = state.range(0);
  one g(*env_ptr, {1});
  auto a = mt::random_normal<ftensor<m, k>>(g, {s, s}, 1);
  auto bb = mt::random_normal<ftensor<k, n>>(g, {s, s}, 2);
  ftensor<m, n> c;
  bench::run(state, [&] {
    c = mt::einsum<m, n>(a, bb);
    benchmark::DoNotOptimize(c.view().data());
    Kokkos::fence();  // kernels are asynchronous on a GPU
  });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * s * s * s, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel("meshtensor einsum");
}

void matmul_sgemm(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0));
  one g(*env_ptr, {1});
  auto a = mt::random_normal<ftensor<m, k>>(g, {s, s}, 1);
  auto bb = mt::random_normal<ftensor<k, n>>(g, {s, s}, 2);
  std::vector<float> c(static_cast<std::size_t>(s) * s);
  bench::run(state, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, s, s, 1.0f, a.view().data(), s, bb.view().data(), s,
                0.0f, c.data(), s);
    benchmark::DoNotOptimize(c.data());
  });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * s * s * s, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel("cblas_sgemm");
}

constexpr bool on_device =
    !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible;

#ifdef KOKKOS_ENABLE_CUDA
// A handle of the benchmark's own: the peer shares nothing with meshtensor's cuBLAS path.
struct cublas_handle {
  cublasHandle_t h = nullptr;
  cublas_handle() {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("bench_local: cublasCreate failed");
  }
  ~cublas_handle() { cublasDestroy(h); }
};
#endif

// Row-major C[s,s] = A B: column-major C^T = B^T A^T, which is how cuBLAS reads these buffers.
void matmul_cublas(benchmark::State& state) {
#ifdef KOKKOS_ENABLE_CUDA
  const int s = static_cast<int>(state.range(0));
  one g(*env_ptr, {1});
  auto a = mt::random_normal<ftensor<m, k>>(g, {s, s}, 1);
  auto bb = mt::random_normal<ftensor<k, n>>(g, {s, s}, 2);
  ftensor<m, n> c(g, {s, s});
  cublas_handle cb;
  const float alpha = 1.0f, beta = 0.0f;
  bench::run(state, [&] {
    cublasSgemm(cb.h, CUBLAS_OP_N, CUBLAS_OP_N, s, s, s, &alpha, bb.view().data(), s, a.view().data(), s, &beta,
                c.view().data(), s);
    Kokkos::fence();
  });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * s * s * s, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
#endif
  state.SetLabel("cublasSgemm");
}

// Attention shapes: batch 4, heads 8, sequence s (queries and keys), head size 64.
constexpr std::int64_t B = 4, H = 8, D = 64;
int attn_iters(std::int64_t s) { return bench::iters(s <= 128 ? 40 : 4); }
double attn_flops(std::int64_t s) { return 2.0 * B * H * s * s * D; }

void set_attn_counters(benchmark::State& state, std::int64_t s, const char* label) {
  state.counters["GFLOP/s"] = benchmark::Counter(attn_flops(s), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel(label);
}

// kind 0: qk (bhqd,bhkd->bhqk); kind 1: av (bhqk,bhkd->bhqd).
template <int Kind>
void attn_ours(benchmark::State& state) {
  const std::int64_t s = state.range(0);
  one g(*env_ptr, {1});
  if constexpr (Kind == 0) {
    auto qt = mt::random_normal<ftensor<b, h, q, d>>(g, {B, H, s, D}, 1);
    auto kt = mt::random_normal<ftensor<b, h, kv, d>>(g, {B, H, s, D}, 2);
    ftensor<b, h, q, kv> out;
    bench::run(state, [&] {
      out = mt::einsum<b, h, q, kv>(qt, kt);
      benchmark::DoNotOptimize(out.view().data());
      Kokkos::fence();  // kernels are asynchronous on a GPU
    });
  } else {
    auto pt = mt::random_normal<ftensor<b, h, q, kv>>(g, {B, H, s, s}, 1);
    auto vt = mt::random_normal<ftensor<b, h, kv, d>>(g, {B, H, s, D}, 2);
    ftensor<b, h, q, d> out;
    bench::run(state, [&] {
      out = mt::einsum<b, h, q, d>(pt, vt);
      benchmark::DoNotOptimize(out.view().data());
      Kokkos::fence();  // kernels are asynchronous on a GPU
    });
  }
  set_attn_counters(state, s, "meshtensor einsum");
}

template <int Kind>
void attn_peer(benchmark::State& state, bool eigen) {
  const int s = static_cast<int>(state.range(0));
  const int bh = static_cast<int>(B * H), d_ = static_cast<int>(D);
  std::vector<float> x(static_cast<std::size_t>(bh) * s * (Kind == 0 ? d_ : s)), y(static_cast<std::size_t>(bh) * s * d_),
      out(static_cast<std::size_t>(bh) * s * (Kind == 0 ? s : d_));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
  bench::run(state, [&] {
    if (eigen) {
#if MESHTENSOR_BENCH_EIGEN
      if constexpr (Kind == 0)
        peers::eigen_attn_qk(x.data(), y.data(), out.data(), bh, s, d_);
      else
        peers::eigen_attn_av(x.data(), y.data(), out.data(), bh, s, d_);
#endif
    } else {
      for (int i = 0; i < bh; ++i) {
        if constexpr (Kind == 0)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, d_, 1.0f, x.data() + std::size_t(i) * s * d_, d_,
                      y.data() + std::size_t(i) * s * d_, d_, 0.0f, out.data() + std::size_t(i) * s * s, s);
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, d_, s, 1.0f, x.data() + std::size_t(i) * s * s, s,
                      y.data() + std::size_t(i) * s * d_, d_, 0.0f, out.data() + std::size_t(i) * s * d_, d_);
      }
    }
    benchmark::DoNotOptimize(out.data());
  });
  set_attn_counters(state, s, eigen ? "Eigen Tensor contraction (per b,h)" : "cblas_sgemm loop (per b,h)");
}

// The same products through cuBLAS's strided batched gemm over the b*h slices, on device buffers.
// qk: S = Q K^T, column-major S^T = K Q^T; av: O = P V, column-major O^T = V^T P^T.
template <int Kind>
void attn_cublas(benchmark::State& state) {
#ifdef KOKKOS_ENABLE_CUDA
  const int s = static_cast<int>(state.range(0));
  const int bh = static_cast<int>(B * H), d_ = static_cast<int>(D);
  one g(*env_ptr, {1});
  cublas_handle cb;
  const float alpha = 1.0f, beta = 0.0f;
  const long long sd = static_cast<long long>(s) * d_, ss = static_cast<long long>(s) * s;
  if constexpr (Kind == 0) {
    auto qt = mt::random_normal<ftensor<b, h, q, d>>(g, {B, H, s, D}, 1);
    auto kt = mt::random_normal<ftensor<b, h, kv, d>>(g, {B, H, s, D}, 2);
    ftensor<b, h, q, kv> out(g, {B, H, s, s});
    bench::run(state, [&] {
      cublasSgemmStridedBatched(cb.h, CUBLAS_OP_T, CUBLAS_OP_N, s, s, d_, &alpha, kt.view().data(), d_, sd,
                                qt.view().data(), d_, sd, &beta, out.view().data(), s, ss, bh);
      Kokkos::fence();
    });
  } else {
    auto pt = mt::random_normal<ftensor<b, h, q, kv>>(g, {B, H, s, s}, 1);
    auto vt = mt::random_normal<ftensor<b, h, kv, d>>(g, {B, H, s, D}, 2);
    ftensor<b, h, q, d> out(g, {B, H, s, D});
    bench::run(state, [&] {
      cublasSgemmStridedBatched(cb.h, CUBLAS_OP_N, CUBLAS_OP_N, d_, s, s, &alpha, vt.view().data(), d_, sd,
                                pt.view().data(), s, ss, &beta, out.view().data(), d_, sd, bh);
      Kokkos::fence();
    });
  }
  set_attn_counters(state, s, "cublasSgemmStridedBatched (over b*h)");
#else
  state.SetLabel("cublasSgemmStridedBatched");
#endif
}

void register_all() {
  const bool smoke = bench::smoke();
  using sizes = std::vector<std::int64_t>;
  const auto add = [](const std::string& name, auto fn, std::int64_t s, int iterations) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Arg(s)->Iterations(iterations)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  // On a GPU the peer is cuBLAS; on a host, cblas (and Eigen where it was found).
  const sizes mm = smoke ? sizes{64} : on_device ? sizes{1024, 2048, 4096, 8192} : sizes{512, 1024, 2048};
  for (auto s : mm) {
    const auto name = std::to_string(s);
    add("matmul/ours/" + name, matmul_ours, s, matmul_iters(s));
    if (on_device) add("matmul/cublas/" + name, matmul_cublas, s, matmul_iters(s));
    else add("matmul/cblas_sgemm/" + name, matmul_sgemm, s, matmul_iters(s));
  }
  const sizes as = smoke ? sizes{16} : on_device ? sizes{512, 2048} : sizes{128, 512};
  for (auto s : as) {
    const auto name = std::to_string(s);
    const int it = attn_iters(s);
    add("attn_qk/ours/" + name, attn_ours<0>, s, it);
    add("attn_av/ours/" + name, attn_ours<1>, s, it);
    if (on_device) {
      add("attn_qk/cublas/" + name, attn_cublas<0>, s, it);
      add("attn_av/cublas/" + name, attn_cublas<1>, s, it);
      continue;
    }
    if (MESHTENSOR_BENCH_EIGEN) {
      add("attn_qk/eigen/" + name, [](benchmark::State& st) { attn_peer<0>(st, true); }, s, it);
      add("attn_av/eigen/" + name, [](benchmark::State& st) { attn_peer<1>(st, true); }, s, it);
    }
    add("attn_qk/sgemm_loop/" + name, [](benchmark::State& st) { attn_peer<0>(st, false); }, s, it);
    add("attn_av/sgemm_loop/" + name, [](benchmark::State& st) { attn_peer<1>(st, false); }, s, it);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  env_ptr = &env;
  register_all();
  return bench::main(argc, argv);
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_local: error: ");
}
