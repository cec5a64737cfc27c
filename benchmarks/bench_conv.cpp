// A 3x3 convolution (padding same), forward and backward (gradients of input and filter), float32:
//   conv2d/ours/<b>x<hw>x<c>   at 1 rank: the image whole; at P ranks: its height split over P
//                               (halos from the neighbours), time of the slowest rank
// Local work: oneDNN's direct convolution where the build has it (the label names the
// implementations oneDNN chose), else unfold + sgemm.
// The peer is PyTorch's conv2d on one thread (benchmarks/peers/torch_conv.py, the same shapes;
// scripts/dev/bench_conv.sh runs both in interleaved rounds and prints medians and ratios).
#include <meshtensor/meshtensor.hpp>

#include "common.hpp"

namespace {
namespace mt = meshtensor;
struct b : mt::dim<"b"> {};
struct h : mt::dim<"h"> {};
struct w : mt::dim<"w"> {};
struct c : mt::dim<"c"> {};
struct co : mt::dim<"co"> {};
struct kh : mt::dim<"kh"> {};
struct kw : mt::dim<"kw"> {};
struct x_ : mt::axis<"x"> {};
using line = mt::mesh<x_>;
using layout = mt::layout<line, mt::split<h, x_>>;
using X = mt::tensor<float, layout, b, h, w, c>;
using F = mt::tensor<float, layout, kh, kw, c, co>;
using sh = mt::spatial<h, kh>;
using sw = mt::spatial<w, kw>;

struct shape {
  std::int64_t batch, hw, channels;
};

void conv_ours(benchmark::State& state, shape s) {
  line g(MPI_COMM_WORLD, {bench::world_size()});
  const mt::window k3{.size = 3, .pad = mt::padding::same};
  auto x = mt::random_normal<X>(g, {s.batch, s.hw, s.hw, s.channels}, 1);
  auto f = mt::random_normal<F>(g, {3, 3, s.channels, s.channels}, 2, 0.0, 0.1);
  const auto gy = mt::random_normal<mt::tensor<float, layout, b, h, w, co>>(g, {s.batch, s.hw, s.hw, s.channels}, 3);
  x.requires_grad();
  f.requires_grad();
  bench::run(state, [&] {
    const auto y = mt::nn::conv<sh, sw>(x, f, k3, k3);
    const auto [gx, gf] = mt::gradient(mt::reduce_sum<b, h, w, co>(y * gy), x, f);
    Kokkos::fence();
    benchmark::DoNotOptimize(gx.view().data());
    benchmark::DoNotOptimize(gf.view().data());
  });
  // multiply-adds: forward, input gradient and filter gradient, 2 FLOPs each
  const double flops = 3.0 * 2 * s.batch * s.hw * s.hw * 9.0 * s.channels * s.channels;
  state.counters["GFLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  std::string label = "unfold + sgemm, fold";
#if MESHTENSOR_HAVE_DNNL
  if (mt::kernels::has_convolution<X::execution_space, float>()) {
    label = "oneDNN direct:";
    for (const auto& name : mt::kernels::dnnl_provider::convolution_implementations()) label += " " + name;
  }
#endif
  state.SetLabel(label);
}

}  // namespace

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  const std::vector<shape> shapes = bench::smoke() ? std::vector<shape>{{1, 8, 2}}
                                                   : std::vector<shape>{{8, 32, 16}, {8, 64, 32}, {4, 128, 16}};
  for (const auto& s : shapes) {
    const std::string name = "conv2d/ours/" + std::to_string(s.batch) + "x" + std::to_string(s.hw) + "x" +
                             std::to_string(s.channels);
    benchmark::RegisterBenchmark(name.c_str(), [s](benchmark::State& st) { conv_ours(st, s); })
        ->Iterations(bench::iters(10))
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return bench::main(argc, argv);
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("bench_conv: error: ");
}
