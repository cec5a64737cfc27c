// What one op costs on tiny tensors, where the fixed cost of an op (the door's checks and plan
// bookkeeping, allocation, launch, waits) is all there is: issue 59's item 1. One rank, replicated
// 64 x 64 float tensors, each op run `chain` times in a row and the device waited for once at the
// end, so the figure is the op's cost in a step (not a round trip). Reported as microseconds per
// op (real_time, manual timing).
//   op/<name>/fwd        the op alone: add, exp, exp(x * 0.5), einsum 64^3, softmax, layer_norm
//   op/<name>/fwd_bwd    y = op(x); the gradient of sum(y) for x (the peer does the same)
//   op/adam/1024         an Adam update of a 1 K tensor
//   parts/...            what an op is made of, measured alone: a fresh Kokkos allocation (and its
//                        free), the pool's, an empty kernel's launch, a fence
// The peer is benchmarks/peers/torch_op_overhead.py: the same ops, the same chain, PyTorch eager,
// on the same device (scripts/dev/bench_op_overhead.sh runs both and prints the ratios).
#include <meshtensor/meshtensor.hpp>

#include <chrono>
#include <string>

#include "common.hpp"

namespace mt = meshtensor;

struct r : mt::dim<"r"> {};
struct c : mt::dim<"c"> {};
struct k : mt::dim<"k"> {};
struct e : mt::dim<"e"> {};
struct x_axis : mt::axis<"x"> {};

using one = mt::mesh<x_axis>;
using plain = mt::layout<one>;
using rc = mt::tensor<float, plain, r, c>;

namespace bench_overhead {

mt::environment* env_ptr = nullptr;
constexpr std::int64_t side = 64;
int chain() { return bench::smoke() ? 2 : 200; }

// Times `chain` calls of f and one fence; the iteration's time is per call.
template <class F>
void per_op(benchmark::State& state, F&& f) {
  const int n = chain();
  for (int i = 0; i < n; ++i) f();  // warm: the pool holds its blocks, caches are set
  Kokkos::fence();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    Kokkos::fence();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n);
  }
}

// The sum of every element of y (of dims r and Y2): the loss whose gradient the benchmark takes.
template <class Y2 = c, class Y>
auto sum_all(const Y& y) {
  return mt::reduce_sum<r, Y2>(y);
}

// The op named, forward alone or with its gradient (Y2: the second dim of its result).
template <class Y2 = c, class Op>
void unary(benchmark::State& state, Op op, bool backward) {
  one g(*env_ptr, {1});
  auto x = mt::random_normal<rc>(g, {side, side}, 1);
  if (!backward) {
    per_op(state, [&] {
      auto y = op(x);
      benchmark::DoNotOptimize(y.view().data());
    });
    return;
  }
  x.requires_grad();
  per_op(state, [&] {
    const auto loss = sum_all<Y2>(op(x));
    auto grads = mt::gradient(loss, x);
    benchmark::DoNotOptimize(&grads);
  });
}

struct add_op {
  rc other;
  rc operator()(const rc& x) const { return x + other; }
};

void add(benchmark::State& state, bool backward) {
  one g(*env_ptr, {1});
  unary(state, add_op{mt::random_normal<rc>(g, {side, side}, 2)}, backward);
}

void einsum(benchmark::State& state, bool backward) {
  one g(*env_ptr, {1});
  const auto w = mt::random_normal<mt::tensor<float, plain, c, k>>(g, {side, side}, 2);
  unary<k>(state, [&](const rc& x) { return mt::einsum<r, k>(x, w); }, backward);
}

void layer_norm(benchmark::State& state, bool backward) {
  one g(*env_ptr, {1});
  const auto scale = mt::full<mt::tensor<float, plain, c>>(g, {side}, 1.0f);
  const auto bias = mt::zeros<mt::tensor<float, plain, c>>(g, {side});
  unary(state, [&](const rc& x) { return mt::nn::layer_norm<c>(x, scale, bias); }, backward);
}

void adam(benchmark::State& state) {
  using W = mt::tensor<float, plain, e>;
  one g(*env_ptr, {1});
  auto w = mt::random_normal<W>(g, {1024}, 1);
  const auto grad = mt::random_normal<W>(g, {1024}, 2);
  mt::optim::adam opt;
  auto st = opt.init(w);
  std::int64_t t = 0;
  per_op(state, [&] { opt.update(w, grad, st, ++t); });
}

// The parts.
using mem = Kokkos::DefaultExecutionSpace::memory_space;
void kokkos_allocation(benchmark::State& state) {
  per_op(state, [] {
    Kokkos::View<float*, mem> v(Kokkos::view_alloc(std::string("bench"), Kokkos::WithoutInitializing), side * side);
    benchmark::DoNotOptimize(v.data());
  });
}
void pool_allocation(benchmark::State& state) {
  per_op(state, [] {
    auto v = mt::detail::view_pool<float, mem>::get().allocate(side * side);
    benchmark::DoNotOptimize(v.data());
  });
}
struct touch_one {
  Kokkos::View<float*, mem> v;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { v(i) += 1.0f; }
};
void launch(benchmark::State& state) {
  touch_one f{Kokkos::View<float*, mem>("bench", 1)};
  per_op(state, [&] { Kokkos::parallel_for("bench::launch", Kokkos::RangePolicy<>(0, 1), f); });
}
void fence(benchmark::State& state) {
  per_op(state, [] { Kokkos::fence(); });
}

void register_all() {
  const auto add_bench = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Iterations(bench::iters(25))->UseManualTime()->Unit(benchmark::kMicrosecond);
  };
  for (bool bwd : {false, true}) {
    const std::string pass = bwd ? "/fwd_bwd" : "/fwd";
    add_bench("op/add" + pass, [bwd](benchmark::State& s) { add(s, bwd); });
    add_bench("op/exp" + pass, [bwd](benchmark::State& s) { unary(s, [](const rc& x) { return mt::exp(x); }, bwd); });
    add_bench("op/exp_half" + pass,
              [bwd](benchmark::State& s) { unary(s, [](const rc& x) { return mt::exp(x * 0.5f); }, bwd); });
    add_bench("op/einsum64" + pass, [bwd](benchmark::State& s) { einsum(s, bwd); });
    add_bench("op/softmax" + pass,
              [bwd](benchmark::State& s) { unary(s, [](const rc& x) { return mt::softmax<c>(x); }, bwd); });
    add_bench("op/layer_norm" + pass, [bwd](benchmark::State& s) { layer_norm(s, bwd); });
  }
  add_bench("op/adam/1024", adam);
  add_bench("parts/kokkos_allocation", kokkos_allocation);
  add_bench("parts/pool_allocation", pool_allocation);
  add_bench("parts/launch", launch);
  add_bench("parts/fence", fence);
}

}  // namespace bench_overhead

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  bench_overhead::env_ptr = &env;
  bench_overhead::register_all();
  return bench::main(argc, argv);
}
