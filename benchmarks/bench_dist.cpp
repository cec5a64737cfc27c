// Distributed products on 1, 2 or 4 ranks (the mesh follows the world size: [1], [2] or [2x2]).
//   dist_matmul_<layout>/ours/<n>     C[m,n] = A[m,k] B[k,n], n^3, float, with meshtensor's einsum
//   dist_matmul_<layout>/psgemm/<n>   ScaLAPACK psgemm on a 2x1 or 2x2 BLACS grid, block 64, same ranks
//   dist_matmul_<layout>/ours_f64/<n>, .../pdgemm/<n>: the same in double
//   mlp/ours/<batch>                  two-layer MLP (relu), forward and backward, batch over rows,
//                                     hidden over cols (4 ranks only); JAX and Mesh-TensorFlow run
//                                     the same step in benchmarks/peers/
// Layouts: on [1] "local" (the products alone, beside ScaLAPACK's on a 1 x 1 grid); on [2] "msplit"
// (m:x, no communication; B replicated) and "ksplit" (k:x, one allreduce of C); on [2x2] "2d"
// (m:rows, k:cols, one allreduce over cols: examples/matmul).
// Each reports "bytes/rank": what each rank hands to collectives per product, as meshtensor's
// communicator counts it, and for ScaLAPACK SUMMA's panels (a model: each rank receives the row
// panels of A and the column panels of B that it does not hold).
// Sizes: 1024 and 2048, or MESHTENSOR_BENCH_SIZES (e.g. "1024 2048 4096 8192").
#include <meshtensor/meshtensor.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"

namespace mt = meshtensor;

struct m : mt::dim<"m"> {};
struct k : mt::dim<"k"> {};
struct n : mt::dim<"n"> {};
struct x : mt::axis<"x"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};

struct batch : mt::dim<"batch"> {};
struct din : mt::dim<"din"> {};
struct hidden : mt::dim<"hidden"> {};
struct dout : mt::dim<"dout"> {};

using line = mt::mesh<x>;
using grid = mt::mesh<rows, cols>;

#ifndef MESHTENSOR_BENCH_SCALAPACK
#define MESHTENSOR_BENCH_SCALAPACK 0
#endif

#if MESHTENSOR_BENCH_SCALAPACK
extern "C" {
void Cblacs_pinfo(int* mypnum, int* nprocs);
void Cblacs_get(int context, int request, int* value);
void Cblacs_gridinit(int* context, const char* order, int nprow, int npcol);
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int context);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc,
               const int* icsrc, const int* ictxt, const int* lld, int* info);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
             const float* a, const int* ia, const int* ja, const int* desca, const float* b, const int* ib,
             const int* jb, const int* descb, const float* beta, float* c, const int* ic, const int* jc,
             const int* descc);
void pdgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
             const double* a, const int* ia, const int* ja, const int* desca, const double* b, const int* ib,
             const int* jb, const int* descb, const double* beta, double* c, const int* ic, const int* jc,
             const int* descc);
}
#endif

namespace {

mt::environment* env_ptr = nullptr;

int mm_iters(std::int64_t s) { return bench::iters(s <= 1024 ? 6 : 2); }

void set_flops(benchmark::State& state, double flops, const char* label) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.SetLabel(label);
}

template <class Mesh, class Layout, class T = float>
void matmul_ours(benchmark::State& state, Mesh g) {
  const std::int64_t s = state.range(0);
  using A = mt::tensor<T, Layout, m, k>;
  using Bm = mt::tensor<T, Layout, k, n>;
  auto a = mt::random_normal<A>(g, {s, s}, 1);
  auto bm = mt::random_normal<Bm>(g, {s, s}, 2);
  mt::tensor<T, Layout, m, n> c;
  const auto product = [&] {
    c = mt::einsum<m, n>(a, bm);
    benchmark::DoNotOptimize(c.view().data());
    Kokkos::fence();  // kernels are asynchronous on a GPU
  };
  product();
  g.reset_counters();
  product();
  std::int64_t bytes = 0;
  for (const auto& [key, counted] : g.counters()) bytes += counted.bytes;
  bench::run(state, product);
  set_flops(state, 2.0 * s * s * s, "meshtensor einsum");
  state.counters["bytes/rank"] = double(bytes);
}

#if MESHTENSOR_BENCH_SCALAPACK
void pgemm(const int* s, const float* alpha, const float* a, const int* one, const int* desc, const float* b,
           const float* beta, float* c) {
  psgemm_("N", "N", s, s, s, alpha, a, one, one, desc, b, one, one, desc, beta, c, one, one, desc);
}
void pgemm(const int* s, const double* alpha, const double* a, const int* one, const int* desc, const double* b,
           const double* beta, double* c) {
  pdgemm_("N", "N", s, s, s, alpha, a, one, one, desc, b, one, one, desc, beta, c, one, one, desc);
}

template <class T = float>
void matmul_psgemm(benchmark::State& state, int prow, int pcol) {
  const int s = static_cast<int>(state.range(0)), nb = 64, zero = 0, one_i = 1;
  int ctxt = 0, me = 0, np = 0, nprow = 0, npcol = 0, myrow = 0, mycol = 0, info = 0;
  Cblacs_pinfo(&me, &np);
  Cblacs_get(-1, 0, &ctxt);
  Cblacs_gridinit(&ctxt, "Row", prow, pcol);
  Cblacs_gridinfo(ctxt, &nprow, &npcol, &myrow, &mycol);
  const int lr = numroc_(&s, &nb, &myrow, &zero, &nprow), lc = numroc_(&s, &nb, &mycol, &zero, &npcol);
  const int lld = std::max(1, lr);
  int desc[9];
  descinit_(desc, &s, &s, &nb, &nb, &zero, &zero, &ctxt, &lld, &info);
  std::vector<T> a(static_cast<std::size_t>(lr) * lc), b(a.size()), c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<T>((i * 7919 + me) % 1000) * T(1e-3) - T(0.5);
    b[i] = static_cast<T>((i * 104729 + me) % 1000) * T(1e-3) - T(0.5);
  }
  const T alpha = 1, beta = 0;
  bench::run(state, [&] {
    pgemm(&s, &alpha, a.data(), &one_i, desc, b.data(), &beta, c.data());
    benchmark::DoNotOptimize(c.data());
  });
  Cblacs_gridexit(ctxt);
  set_flops(state, 2.0 * s * s * s, std::is_same_v<T, double> ? "ScaLAPACK pdgemm" : "ScaLAPACK psgemm");
  // SUMMA: A's row panels (s / prow x s) and B's column panels (s x s / pcol), less this rank's blocks.
  const double rows_part = double(s) / prow, cols_part = double(s) / pcol;
  state.counters["bytes/rank"] =
      double(sizeof(T)) * (rows_part * (s - cols_part) + cols_part * (s - rows_part));
}
#else
template <class T = float>
void matmul_psgemm(benchmark::State& state, int, int) { state.SkipWithError("built without ScaLAPACK"); }
#endif

// Two-layer MLP step on [2x2]: loss = sum((relu(x w1) w2)^2), gradients of w1 and w2.
void mlp_ours(benchmark::State& state) {
  const std::int64_t nb = state.range(0), ni = state.range(1), nh = state.range(2), no = state.range(3);
  grid g(*env_ptr, {2, 2});
  using L = mt::layout<grid, mt::split<batch, rows>, mt::split<hidden, cols>>;
  auto xx = mt::random_normal<mt::tensor<float, L, batch, din>>(g, {nb, ni}, 1);
  auto w1 = mt::random_normal<mt::tensor<float, L, din, hidden>>(g, {ni, nh}, 2, 0.0, 0.05);
  auto w2 = mt::random_normal<mt::tensor<float, L, hidden, dout>>(g, {nh, no}, 3, 0.0, 0.05);
  w1.requires_grad();
  w2.requires_grad();
  bench::run(state, [&] {
    auto hh = mt::relu(mt::einsum<batch, hidden>(xx, w1));
    auto y = mt::einsum<batch, dout>(hh, w2);
    auto loss = mt::reduce_sum<batch, dout>(y * y);
    auto [g1, g2] = mt::gradient(loss, w1, w2);
    benchmark::DoNotOptimize(g1.view().data());
    benchmark::DoNotOptimize(g2.view().data());
    Kokkos::fence();  // kernels are asynchronous on a GPU
  });
  // Forward 2 products, backward 3 (dw2, dh, dw1).
  set_flops(state, 2.0 * nb * (ni * nh + nh * no) * 2.5, "meshtensor einsum + gradient");
}

void register_all() {
  const int p = bench::world_size();
  const bool smoke = bench::smoke();
  std::vector<std::int64_t> sizes = smoke ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{1024, 2048};
  if (const char* chosen = std::getenv("MESHTENSOR_BENCH_SIZES"); chosen && !smoke) {
    sizes.clear();
    std::istringstream in(chosen);
    for (std::int64_t v; in >> v;) sizes.push_back(v);
  }
  // One product of each layout and element type, with ScaLAPACK's beside it where it is built in.
  const auto add = [](const std::string& name, std::int64_t s, int it, auto&& f) {
    benchmark::RegisterBenchmark(name.c_str(), f)->Arg(s)->Iterations(it)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  for (auto s : sizes) {
    const auto name = std::to_string(s);
    const int it = mm_iters(s);
    if (p == 1) {
      add("dist_matmul_local/ours/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<line, mt::layout<line>>(st, line(*env_ptr, {1}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_local/psgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm(st, 1, 1); });
      add("dist_matmul_local/ours_f64/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<line, mt::layout<line>, double>(st, line(*env_ptr, {1}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_local/pdgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm<double>(st, 1, 1); });
    } else if (p == 2) {
      add("dist_matmul_msplit/ours/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<line, mt::layout<line, mt::split<m, x>>>(st, line(*env_ptr, {2}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_msplit/psgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm(st, 2, 1); });
      add("dist_matmul_ksplit/ours/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<line, mt::layout<line, mt::split<k, x>>>(st, line(*env_ptr, {2}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_ksplit/psgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm(st, 2, 1); });
      add("dist_matmul_msplit/ours_f64/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<line, mt::layout<line, mt::split<m, x>>, double>(st, line(*env_ptr, {2}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_msplit/pdgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm<double>(st, 2, 1); });
    } else if (p == 4) {
      add("dist_matmul_2d/ours/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<grid, mt::layout<grid, mt::split<m, rows>, mt::split<k, cols>>>(st, grid(*env_ptr, {2, 2}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_2d/psgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm(st, 2, 2); });
      add("dist_matmul_2d/ours_f64/" + name, s, it, [](benchmark::State& st) {
        matmul_ours<grid, mt::layout<grid, mt::split<m, rows>, mt::split<k, cols>>, double>(st, grid(*env_ptr, {2, 2}));
      });
      if (MESHTENSOR_BENCH_SCALAPACK)
        add("dist_matmul_2d/pdgemm/" + name, s, it, [](benchmark::State& st) { matmul_psgemm<double>(st, 2, 2); });
    }
  }
  if (p == 4) {
    const std::int64_t nb = smoke ? 16 : 512, ni = smoke ? 16 : 512, nh = smoke ? 32 : 2048, no = smoke ? 16 : 512;
    benchmark::RegisterBenchmark(("mlp/ours/" + std::to_string(nb)).c_str(), mlp_ours)
        ->Args({nb, ni, nh, no})->Iterations(bench::iters(5))->UseManualTime()->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  env_ptr = &env;
  register_all();
  return bench::main(argc, argv);
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_dist: error: ");
}
