// What one op costs on tiny tensors, where the fixed cost of an op (the door's checks and plan
// bookkeeping, allocation, launch, waits) is all there is: issue 59's item 1. One rank, replicated
// 64 x 64 float tensors, each op run `chain` times in a row and the device waited for once at the
// end, so the figure is the op's cost in a step (not a round trip). Reported as microseconds per
// op (real_time, manual timing).
//   op/<name>/fwd        the op alone: add, exp, exp(x * 0.5), einsum 64^3, softmax, layer_norm
//   op/<name>/fwd_bwd    y = op(x); the gradient of sum(y) for x (the peer does the same)
//   op/adam/1024         an Adam update of a 1 K tensor
//   op/adam_step/64x1024 an Adam step over 64 tensors of 1 K (one kernel; PyTorch: foreach=True)
//   math/<fn>/<type>/<n>[/fwd_bwd]  one transcendental op per element, where the kernel is the cost:
//                        exp, log, tanh, sigmoid, gelu (tanh form), silu over n = 4 K (64 x 64)
//                        and 1 M (1024 x 1024) floats or bf16s, forward, and for float with its
//                        gradient (issue 59, item 7); the time is per op, the peer divides by n
//   door/<name>/<pass>   the op/ benchmarks on a planned mesh (mesh::planned): every kernel and product
//                        is counted and skipped, so what is left is the door's checks, the plan's and
//                        the tape's bookkeeping, and a planned tensor's (small) allocation
//   parts/...            what an op is made of, measured alone: a fresh Kokkos allocation (and its
//                        free), the pool's, an empty kernel's launch, a fence
// The peer is benchmarks/peers/torch_op_overhead.py: the same ops, the same chain, PyTorch eager,
// on the same device (scripts/dev/bench_op_overhead.sh runs both and prints the ratios).
#include <meshtensor/meshtensor.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <type_traits>
#include <utility>

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
bool planned = false;  // the door/ benchmarks: ops on a planned mesh
constexpr std::int64_t side = 64;

// The one-processor mesh the ops run on: a real one, or a planned one for door/.
one make_mesh() { return planned ? one::planned({1}) : one(*env_ptr, {1}); }
int chain() { return bench::smoke() ? 2 : 200; }

// Times n calls of f and one fence; the iteration's time is per call.
template <class F>
void per_op(benchmark::State& state, F&& f, int n = chain()) {
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
  const one g = make_mesh();
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
  const one g = make_mesh();
  unary(state, add_op{mt::random_normal<rc>(g, {side, side}, 2)}, backward);
}

void einsum(benchmark::State& state, bool backward) {
  const one g = make_mesh();
  const auto w = mt::random_normal<mt::tensor<float, plain, c, k>>(g, {side, side}, 2);
  unary<k>(state, [&](const rc& x) { return mt::einsum<r, k>(x, w); }, backward);
}

void layer_norm(benchmark::State& state, bool backward) {
  const one g = make_mesh();
  const auto scale = mt::full<mt::tensor<float, plain, c>>(g, {side}, 1.0f);
  const auto bias = mt::zeros<mt::tensor<float, plain, c>>(g, {side});
  unary(state, [&](const rc& x) { return mt::nn::layer_norm<c>(x, scale, bias); }, backward);
}

void adam(benchmark::State& state) {
  using W = mt::tensor<float, plain, e>;
  const one g = make_mesh();
  auto w = mt::random_normal<W>(g, {1024}, 1);
  const auto grad = mt::random_normal<W>(g, {1024}, 2);
  mt::optim::adam opt;
  auto st = opt.init(w);
  std::int64_t t = 0;
  per_op(state, [&] { opt.update(w, grad, st, ++t); });
}

// One transcendental function over a side x side tensor of T, forward alone or with its gradient;
// inputs in (0.5, 1.5) so that log is defined and every function works in its main range.
template <class T, class Op>
void math(benchmark::State& state, std::int64_t n_side, Op op, bool backward) {
  using X = mt::tensor<T, plain, r, c>;
  const one g = make_mesh();
  auto x = mt::random_uniform<X>(g, {n_side, n_side}, 3, 0.5, 1.5);
  const int chain_here = bench::smoke() ? 2 : std::max<int>(2, static_cast<int>(chain() * (side * side) / (n_side * n_side)));
  if (!backward) {
    per_op(state, [&] {
      X y = op(x);
      benchmark::DoNotOptimize(y.view().data());
    }, chain_here);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {  // bf16 parameters train through float masters (optim/)
    x.requires_grad();
    per_op(state, [&] {
      const auto loss = sum_all(op(x));
      auto grads = mt::gradient(loss, x);
      benchmark::DoNotOptimize(&grads);
    }, chain_here);
  }
}

template <class T>
void register_math(const auto& add_bench) {
  const std::string type = std::is_same_v<T, float> ? "float" : "bf16";
  using X = mt::tensor<T, plain, r, c>;
  const std::pair<const char*, X (*)(const X&)> fns[] = {
      {"exp", [](const X& x) { return mt::exp(x); }},         {"log", [](const X& x) { return mt::log(x); }},
      {"tanh", [](const X& x) { return mt::tanh(x); }},       {"sigmoid", [](const X& x) { return mt::sigmoid(x); }},
      {"gelu", [](const X& x) { return mt::gelu(x); }},       {"silu", [](const X& x) { return mt::silu(x); }}};
  for (const auto& [name, fn] : fns)
    for (const std::int64_t n_side : {std::int64_t{64}, std::int64_t{1024}})
      for (const bool bwd : {false, true}) {
        if (bwd && !std::is_same_v<T, float>) continue;
        add_bench("math/" + std::string(name) + "/" + type + "/" + std::to_string(n_side * n_side) + (bwd ? "/fwd_bwd" : ""),
                  [fn = fn, n_side, bwd](benchmark::State& s) { math<T>(s, n_side, fn, bwd); });
      }
}

// One Adam step over 64 tensors of 1 K (a model's parameters): one kernel for all of them.
void adam_step(benchmark::State& state) {
  using W = mt::tensor<float, plain, e>;
  const one g = make_mesh();
  std::vector<W> ws, gs;
  for (std::uint64_t k = 0; k < 64; ++k) {
    ws.push_back(mt::random_normal<W>(g, {1024}, 1 + k));
    gs.push_back(mt::random_normal<W>(g, {1024}, 100 + k));
  }
  mt::optim::adam opt;
  const std::tuple<std::vector<W>> grads{gs};
  per_op(state, [&] { opt.step(std::tie(ws), grads); }, bench::smoke() ? 2 : 20);
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
  // Each op/ benchmark also on a planned mesh (door/): its time without kernels.
  const auto add_op_bench = [&](const std::string& name, auto fn) {
    add_bench("op/" + name, [fn](benchmark::State& s) { fn(s); });
    add_bench("door/" + name, [fn](benchmark::State& s) {
      planned = true;
      fn(s);
      planned = false;
    });
  };
  for (bool bwd : {false, true}) {
    const std::string pass = bwd ? "/fwd_bwd" : "/fwd";
    add_op_bench("add" + pass, [bwd](benchmark::State& s) { add(s, bwd); });
    add_op_bench("exp" + pass, [bwd](benchmark::State& s) { unary(s, [](const rc& x) { return mt::exp(x); }, bwd); });
    add_op_bench("exp_half" + pass,
                 [bwd](benchmark::State& s) { unary(s, [](const rc& x) { return mt::exp(x * 0.5f); }, bwd); });
    add_op_bench("einsum64" + pass, [bwd](benchmark::State& s) { einsum(s, bwd); });
    add_op_bench("softmax" + pass,
                 [bwd](benchmark::State& s) { unary(s, [](const rc& x) { return mt::softmax<c>(x); }, bwd); });
    add_op_bench("layer_norm" + pass, [bwd](benchmark::State& s) { layer_norm(s, bwd); });
  }
  add_bench("op/adam/1024", adam);
  add_bench("op/adam_step/64x1024", adam_step);
  register_math<float>(add_bench);
  register_math<mt::bf16>(add_bench);
  add_bench("parts/kokkos_allocation", kokkos_allocation);
  add_bench("parts/pool_allocation", pool_allocation);
  add_bench("parts/launch", launch);
  add_bench("parts/fence", fence);
}

}  // namespace bench_overhead

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  bench_overhead::env_ptr = &env;
  bench_overhead::register_all();
  return bench::main(argc, argv);
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_op_overhead: error: ");
}
