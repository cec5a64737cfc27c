// Semantic segmentation of large canvases, each image's height and width split over a 2-D mesh:
// Mesh-TensorFlow's "examples too large for one processor". A canvas is a grid of 32 x 32 cells, each
// holding a Fashion-MNIST item (Debian's dataset-fashion-mnist) at a random offset, or nothing; every
// pixel is labelled with its item's class where the item's ink is (intensity above 0.3), else
// "background". A small U-Net labels every pixel:
//
//   x[batch, h, w, ink] -> conv 3x3 -> conv 3x3 (skip 1) -> max_pool 2x2 -> conv 3x3 + batch_norm
//   (skip 2) -> max_pool 2x2 -> conv 3x3 -> conv_transpose 2x2/2 + skip 2 -> conv_transpose 2x2/2 +
//   skip 1 -> dense to 11 classes per pixel -> softmax cross-entropy
//
// Layout "spatial" (the default) splits h over the mesh's rows and w over its cols: each processor
// holds a quarter of every activation, the convolutions exchange halos with their neighbours (two
// shifts per split dim, of the rows or columns their 3x3 windows read), batch_norm's statistics and
// the weight gradients are allreduced. Layout "data" splits the batch instead, for comparison.
// classify.cpp is the smaller companion: a CNN classifying one item per image under the same split.
//
//   mpiexec -n 4 segmentation [--canvas 8] [--batch 4] [--steps 300] [--memory-budget MiB]
//
// --memory-budget plans the step first (no data, no processes) on one processor and on the mesh, and
// trains only if the mesh's peak per processor fits: a canvas whose activations need 4x one
// processor's budget trains on [2 x 2]. The run reports each rank's measured peak resident memory.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fmt/core.h>
#include <meshtensor/meshtensor.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "../fashion_mnist/idx.hpp"

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct h : mt::dim<"h"> {};
struct w : mt::dim<"w"> {};
struct kh : mt::dim<"kh"> {};
struct kw : mt::dim<"kw"> {};
struct ink : mt::dim<"ink"> {};  // the input's one channel
struct f1 : mt::dim<"f1"> {};
struct f2 : mt::dim<"f2"> {};
struct f3 : mt::dim<"f3"> {};
struct f4 : mt::dim<"f4"> {};
struct classes : mt::dim<"classes"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;
using layout_spatial = mt::layout<grid, mt::split<h, rows>, mt::split<w, cols>>;
using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using over_h = mt::spatial<h, kh>;
using over_w = mt::spatial<w, kw>;

constexpr std::int64_t cell = 32, n_classes = 11, background = 10;

struct options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", layout = "spatial";
  std::vector<int> mesh{2, 2};
  std::int64_t canvas_cells = 8;  // cells per side: an 8 x 8 canvas is 256 x 256 pixels
  std::int64_t batch_size = 4, steps = 300, test_canvases = 16;
  std::int64_t width = 8;  // channels of the first level; 2x and 4x below
  double lr = 2e-3, memory_budget_mib = 0;
  int log_every = 25;
  std::uint64_t seed = 1;
};

// Canvas number `index` of a stream (the same on every rank): pixels in [0, 1] and per-pixel classes.
void make_canvas(const idx::dataset& d, std::int64_t cells, std::uint64_t seed, std::int64_t index, float* x, int* y) {
  const std::int64_t side = cells * cell;
  std::mt19937_64 rng(seed * 1000003 + static_cast<std::uint64_t>(index));
  std::fill(x, x + side * side, 0.0f);
  std::fill(y, y + side * side, static_cast<int>(background));
  for (std::int64_t cy = 0; cy < cells; ++cy)
    for (std::int64_t cx = 0; cx < cells; ++cx) {
      if (rng() % 4 == 0) continue;  // a quarter of the cells stay empty
      const std::int64_t e = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(d.n));
      const std::int64_t oy = cy * cell + static_cast<std::int64_t>(rng() % 5), ox = cx * cell + static_cast<std::int64_t>(rng() % 5);
      for (std::int64_t r = 0; r < 28; ++r)
        for (std::int64_t c = 0; c < 28; ++c) {
          const float v = d.images[e * 784 + r * 28 + c] * (1.0f / 255.0f);
          x[(oy + r) * side + ox + c] = v;
          if (v > 0.3f) y[(oy + r) * side + ox + c] = d.labels[e];
        }
    }
}

// Trains (or, on a planned mesh, plans two steps of blank canvases and returns the plan of the
// second); then scores held-out canvases from the test images.
template <class L>
mt::plan_report train(const grid& g, const options& o, const idx::dataset& tr, const idx::dataset& te) {
  using X = mt::tensor<float, L, batch, h, w, ink>;
  using Labels = mt::tensor<int, L, batch, h, w>;
  using W1 = mt::tensor<float, L, kh, kw, ink, f1>;
  using W2 = mt::tensor<float, L, kh, kw, f1, f2>;
  using W3 = mt::tensor<float, L, kh, kw, f2, f3>;
  using W4 = mt::tensor<float, L, kh, kw, f3, f4>;
  using U2 = mt::tensor<float, L, kh, kw, f3, f4>;  // conv_transpose f4 -> f3
  using U1 = mt::tensor<float, L, kh, kw, f2, f3>;  // conv_transpose f3 -> f2
  using WO = mt::tensor<float, L, f2, classes>;
  const bool root = g.rank() == 0, planned = g.is_planned();
  const std::int64_t side = o.canvas_cells * cell, nb = o.batch_size, c1 = o.width, c2 = 2 * o.width, c3 = 4 * o.width;
  const mt::window k3{.size = 3, .pad = mt::padding::same}, k2s2{.size = 2, .stride = 2};

  std::optional<mt::plan_kind_scope> as_parameters(std::in_place, mt::memory_kind::parameters);  // for a plan
  auto w1 = nn::normal_fan_in<W1, kh, kw, ink>(g, {3, 3, 1, c1}, o.seed);
  auto w2 = nn::normal_fan_in<W2, kh, kw, f1>(g, {3, 3, c1, c1}, o.seed + 1);
  auto w3 = nn::normal_fan_in<W3, kh, kw, f2>(g, {3, 3, c1, c2}, o.seed + 2);
  auto w4 = nn::normal_fan_in<W4, kh, kw, f3>(g, {3, 3, c2, c3}, o.seed + 3);
  auto u2 = nn::normal_fan_in<U2, kh, kw, f4>(g, {2, 2, c2, c3}, o.seed + 4);
  auto u1 = nn::normal_fan_in<U1, kh, kw, f3>(g, {2, 2, c1, c2}, o.seed + 5);
  auto wo = nn::normal_fan_in<WO, f2>(g, {c1, n_classes}, o.seed + 6);
  auto b1 = mt::zeros<mt::tensor<float, L, f1>>(g, {c1});
  auto b2 = mt::zeros<mt::tensor<float, L, f2>>(g, {c1});
  auto bn_scale = mt::full<mt::tensor<float, L, f3>>(g, {c2}, 1.0f);
  auto bn_bias = mt::zeros<mt::tensor<float, L, f3>>(g, {c2});
  auto b4 = mt::zeros<mt::tensor<float, L, f4>>(g, {c3});
  auto bo = mt::zeros<mt::tensor<float, L, classes>>(g, {n_classes});
  as_parameters.reset();
  auto params = std::tie(w1, w2, w3, w4, u2, u1, wo, b1, b2, bn_scale, bn_bias, b4, bo);
  std::apply([](auto&... p) { (p.requires_grad(), ...); }, params);

  auto logits_of = [&](const X& x) {
    const auto e1a = mt::relu(nn::conv<over_h, over_w>(x, w1, k3, k3) + b1);
    const auto e1 = mt::relu(nn::conv<over_h, over_w>(e1a, w2, k3, k3) + b2);
    const auto p1 = nn::max_pool<over_h, over_w>(e1, k2s2, k2s2);
    const auto e2 = mt::relu(nn::batch_norm<batch, h, w>(nn::conv<over_h, over_w>(p1, w3, k3, k3), bn_scale, bn_bias));
    const auto p2 = nn::max_pool<over_h, over_w>(e2, k2s2, k2s2);
    const auto e3 = mt::relu(nn::conv<over_h, over_w>(p2, w4, k3, k3) + b4);
    const auto d2 = mt::relu(
        nn::conv_transpose<over_h, over_w>(e3, u2, {e2.template extent<h>(), e2.template extent<w>()}, k2s2, k2s2) + e2);
    const auto d1 = mt::relu(
        nn::conv_transpose<over_h, over_w>(d2, u1, {e1.template extent<h>(), e1.template extent<w>()}, k2s2, k2s2) + e1);
    return nn::dense<f2, classes>(d1, wo, bo);
  };

  mt::optim::adam adam({.lr = o.lr});
  std::vector<float> hx(static_cast<std::size_t>(nb * side * side));
  std::vector<int> hy(hx.size());
  auto fill_batch = [&](const idx::dataset& d, std::uint64_t stream, std::int64_t first) {
    for (std::int64_t b = 0; b < nb; ++b)
      make_canvas(d, o.canvas_cells, stream, first + b, hx.data() + b * side * side, hy.data() + b * side * side);
  };
  if (root && !planned)
    fmt::print("segmentation: canvases of {} x {} pixels ({} x {} cells), batch {}, layout {} on mesh [rows={} x cols={}]; "
               "U-Net widths {}/{}/{}, adam lr {:g}, {} steps\n", side, side, o.canvas_cells, o.canvas_cells, nb, o.layout,
               g.size<rows>(), g.size<cols>(), c1, c2, c3, o.lr, o.steps);
  const std::int64_t steps = planned ? 2 : o.steps;
  std::vector<double> losses;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  auto tlog = t0;
  for (std::int64_t step = 0; step < steps; ++step) {
    if (planned) mt::reset_plan(g);  // a plan reports its last step
    else fill_batch(tr, o.seed, step * nb);
    const auto x = mt::from_host<X>(g, {nb, side, side, 1}, hx);
    const auto y = mt::from_host<Labels>(g, {nb, side, side}, hy);
    const auto loss = mt::reduce_mean<batch, h, w>(nn::softmax_cross_entropy<classes>(logits_of(x), y));
    auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
    adam.step(params, grads);
    losses.push_back(mt::item(loss));
    if (root && !planned && ((step + 1) % o.log_every == 0 || step + 1 == steps)) {
      const auto now = std::chrono::steady_clock::now();
      const std::size_t k = std::min<std::size_t>(losses.size(), static_cast<std::size_t>(o.log_every));
      const double recent = std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(k), losses.end(), 0.0) / double(k);
      fmt::print("step {:5d}/{}  loss {:.4f}  {:.2f} s/step\n", step + 1, steps, recent,
                 std::chrono::duration<double>(now - tlog).count() / double(k));
      std::fflush(stdout);
      tlog = now;
    }
  }
  if (planned) return mt::plan_report_of(g);
  MPI_Barrier(MPI_COMM_WORLD);
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Held-out canvases from the test images: pixel accuracy, accuracy on the items' pixels, mean IoU.
  mt::no_grad inference;  // no tape recorded
  std::int64_t correct = 0, total = 0, fg_correct = 0, fg_total = 0;
  std::vector<std::int64_t> inter(n_classes), uni(n_classes);
  for (std::int64_t first = 0; first + nb <= o.test_canvases; first += nb) {
    fill_batch(te, o.seed + 7777, first);
    const auto logits = mt::gather(logits_of(mt::from_host<X>(g, {nb, side, side, 1}, hx)));
    if (!root) continue;
    for (std::int64_t p = 0; p < nb * side * side; ++p) {
      const float* row = logits.data() + p * n_classes;
      const int guess = static_cast<int>(std::max_element(row, row + n_classes) - row), truth = hy[p];
      correct += guess == truth;
      ++total;
      if (truth != background) {
        fg_correct += guess == truth;
        ++fg_total;
      }
      ++uni[truth];
      if (guess != truth) ++uni[guess];
      else ++inter[truth];
    }
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  long peak_kib = ru.ru_maxrss, max_peak = 0, min_peak = 0;
  MPI_Allreduce(&peak_kib, &max_peak, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&peak_kib, &min_peak, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
  if (root) {
    double iou = 0;
    int present = 0;
    for (std::int64_t c = 0; c < n_classes; ++c)
      if (uni[c] > 0) {
        iou += double(inter[c]) / double(uni[c]);
        ++present;
      }
    fmt::print("trained {} steps in {:.1f} s ({:.2f} s/step)\n", steps, train_s, train_s / double(steps));
    fmt::print("test canvases: {}; pixel accuracy {:.2f}%, on the items' pixels {:.2f}%, mean IoU {:.3f}\n",
               o.test_canvases / nb * nb, 100.0 * correct / std::max<std::int64_t>(1, total),
               100.0 * fg_correct / std::max<std::int64_t>(1, fg_total), iou / std::max(1, present));
    fmt::print("peak resident memory per rank: {:.1f} to {:.1f} MiB\n", min_peak / 1024.0, max_peak / 1024.0);
  }
  return {};
}

mt::plan_report train_layout(const grid& g, const options& o, const idx::dataset& tr, const idx::dataset& te) {
  if (o.layout == "data") return train<layout_data>(g, o, tr, te);
  return train<layout_spatial>(g, o, tr, te);
}

// --memory-budget: the step planned on one processor and on the mesh (no data, no processes).
// Returns false (after saying why) when the mesh's peak per processor exceeds the budget.
bool plan_fits(const mt::environment& env, const options& o) {
  const idx::dataset none{1, std::vector<std::uint8_t>(784), std::vector<std::uint8_t>(1)};
  const auto one = train_layout(grid::planned({1, 1}), o, none, none);
  const auto mesh = train_layout(grid::planned({o.mesh[0], o.mesh[1]}), o, none, none);
  const double mib = 1048576.0, budget = o.memory_budget_mib;
  const bool fits = mesh.peak_bytes <= budget * mib;
  if (env.world_rank() == 0) {
    const auto needs = fmt::format("each processor of [{} x {}] needs {:.1f} MiB at its peak (activations {:.1f} MiB)",
                                   o.mesh[0], o.mesh[1], mesh.peak_bytes / mib,
                                   mesh.peak_bytes_of(mt::memory_kind::activations) / mib);
    fmt::print("memory plan (layout {}): one processor would need {:.1f} MiB at its peak (activations {:.1f} MiB), "
               "{:.2f}x the budget of {:.1f} MiB\n", o.layout, one.peak_bytes / mib,
               one.peak_bytes_of(mt::memory_kind::activations) / mib, one.peak_bytes / mib / budget, budget);
    fmt::print("memory plan: {}: {}\n", needs, fits ? "fits the budget" : "DOES NOT FIT the budget");
    std::fflush(stdout);
    if (!fits)
      fmt::print(stderr, "segmentation: error: {}: DOES NOT FIT the budget of {:.1f} MiB (--memory-budget); use a larger "
                 "mesh or a smaller --canvas or --batch\n", needs, budget);
  }
  return fits;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor: a U-Net segmenting large canvases, each image split over a 2-D mesh"};
  app.add_option("--data-dir", o.data_dir, "directory of the gzip'd Fashion-MNIST idx files")->capture_default_str();
  app.add_option("--layout", o.layout, "spatial: h over rows, w over cols; data: batch over rows and cols")
      ->check(CLI::IsMember({"spatial", "data"}))
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product must be the number of ranks)")->expected(2);
  app.add_option("--canvas", o.canvas_cells, "cells of 32 pixels per canvas side (a multiple of 4 divides by the pools)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", o.batch_size)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--width", o.width, "channels of the first level (2x and 4x below)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--log-every", o.log_every, "steps between printed losses (their mean)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--test-canvases", o.test_canvases, "held-out canvases to evaluate")->capture_default_str();
  app.add_option("--memory-budget", o.memory_budget_mib,
                 "MiB per processor: plan the step first and train only if the mesh's peak fits")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    if (o.memory_budget_mib > 0 && !plan_fits(env, o)) return 2;  // refused before any data is read
    const grid g(env, {o.mesh[0], o.mesh[1]});
    train_layout(g, o, idx::load_fashion_mnist(o.data_dir, "train", MPI_COMM_WORLD),
                 idx::load_fashion_mnist(o.data_dir, "t10k", MPI_COMM_WORLD));
    return 0;
  } catch (const std::exception& e) {
    return env.fail(e, "segmentation: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("segmentation: error: ");
}
