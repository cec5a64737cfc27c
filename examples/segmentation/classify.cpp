// The segmentation example's smaller companion: one Fashion-MNIST item (Debian's
// dataset-fashion-mnist) at a random offset in each 32 x 32 image, classified by a CNN under the
// same split as the U-Net's (h over the mesh's rows, w over its cols):
//
//   x[batch, h, w, ink] -> conv 3x3 -> max_pool 2x2 -> conv 3x3 -> max_pool 2x2 -> dense over h, w
//   and channels to the 10 classes -> softmax cross-entropy
//
// The convolutions exchange halos with their neighbours; the last product contracts the split h and
// w: one allreduce over both axes. Layout "data" splits the batch instead, for comparison.
//
//   mpiexec -n 4 segmentation_classify [--batch 32] [--steps 500]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fmt/core.h>
#include <meshtensor/meshtensor.hpp>
#include <numeric>
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
struct classes : mt::dim<"classes"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;
using layout_spatial = mt::layout<grid, mt::split<h, rows>, mt::split<w, cols>>;
using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using over_h = mt::spatial<h, kh>;
using over_w = mt::spatial<w, kw>;

constexpr std::int64_t side = 32;

struct options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", layout = "spatial";
  std::vector<int> mesh{2, 2};
  std::int64_t batch_size = 32, steps = 500, test_images = 1024;
  std::int64_t width = 8;  // channels of the first convolution; 2x of the second
  double lr = 2e-3;
  int log_every = 25;
  std::uint64_t seed = 1;
};

template <class L>
void train(const grid& g, const options& o, const idx::dataset& tr, const idx::dataset& te) {
  using X = mt::tensor<float, L, batch, h, w, ink>;
  using Labels = mt::tensor<int, L, batch>;
  using W1 = mt::tensor<float, L, kh, kw, ink, f1>;
  using W2 = mt::tensor<float, L, kh, kw, f1, f2>;
  using WD = mt::tensor<float, L, h, w, f2, classes>;
  const bool root = g.rank() == 0;
  const std::int64_t nb = o.batch_size, c1 = o.width, c2 = 2 * o.width;
  const mt::window k3{.size = 3, .pad = mt::padding::same}, k2s2{.size = 2, .stride = 2};
  auto w1 = nn::normal_fan_in<W1, kh, kw, ink>(g, {3, 3, 1, c1}, o.seed);
  auto w2 = nn::normal_fan_in<W2, kh, kw, f1>(g, {3, 3, c1, c2}, o.seed + 1);
  auto wd = nn::normal_fan_in<WD, h, w, f2>(g, {side / 4, side / 4, c2, 10}, o.seed + 2);
  auto b1 = mt::zeros<mt::tensor<float, L, f1>>(g, {c1});
  auto b2 = mt::zeros<mt::tensor<float, L, f2>>(g, {c2});
  auto bd = mt::zeros<mt::tensor<float, L, classes>>(g, {10});
  auto params = std::tie(w1, w2, wd, b1, b2, bd);
  std::apply([](auto&... p) { (p.requires_grad(), ...); }, params);
  auto logits_of = [&](const X& x) {
    const auto a1 = nn::max_pool<over_h, over_w>(mt::relu(nn::conv<over_h, over_w>(x, w1, k3, k3) + b1), k2s2, k2s2);
    const auto a2 = nn::max_pool<over_h, over_w>(mt::relu(nn::conv<over_h, over_w>(a1, w2, k3, k3) + b2), k2s2, k2s2);
    return mt::einsum<batch, classes>(a2, wd) + bd;
  };
  // A batch of items at random offsets in 32 x 32 images (the stream's generator decides, alike on all ranks).
  std::vector<float> hx(static_cast<std::size_t>(nb * side * side));
  std::vector<int> hy(static_cast<std::size_t>(nb));
  auto fill_batch = [&](const idx::dataset& d, std::mt19937_64& rng) {
    std::fill(hx.begin(), hx.end(), 0.0f);
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t e = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(d.n));
      const std::int64_t oy = static_cast<std::int64_t>(rng() % 5), ox = static_cast<std::int64_t>(rng() % 5);
      for (std::int64_t r = 0; r < 28; ++r)
        for (std::int64_t c = 0; c < 28; ++c)
          hx[(b * side + oy + r) * side + ox + c] = d.images[e * 784 + r * 28 + c] * (1.0f / 255.0f);
      hy[b] = d.labels[e];
    }
  };
  if (root)
    fmt::print("classify: Fashion-MNIST items in 32 x 32 images, batch {}, layout {} on mesh [rows={} x cols={}]; "
               "CNN widths {}/{}, adam lr {:g}, {} steps\n", nb, o.layout, g.size<rows>(), g.size<cols>(), c1, c2, o.lr, o.steps);
  mt::optim::adam adam({.lr = o.lr});
  std::mt19937_64 rng(o.seed);
  std::vector<double> losses;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < o.steps; ++step) {
    fill_batch(tr, rng);
    const auto x = mt::from_host<X>(g, {nb, side, side, 1}, hx);
    const auto y = mt::from_host<Labels>(g, {nb}, hy);
    const auto loss = mt::reduce_mean<batch>(nn::softmax_cross_entropy<classes>(logits_of(x), y));
    auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
    adam.step(params, grads);
    losses.push_back(mt::item(loss));
    if (root && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      const std::size_t k = std::min<std::size_t>(losses.size(), static_cast<std::size_t>(o.log_every));
      const double recent = std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(k), losses.end(), 0.0) / double(k);
      fmt::print("step {:5d}/{}  loss {:.4f}\n", step + 1, o.steps, recent);
      std::fflush(stdout);
    }
  }
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  mt::no_grad inference;  // no tape recorded
  std::mt19937_64 test_rng(o.seed + 7777);
  std::int64_t correct = 0, total = 0;
  for (std::int64_t first = 0; first + nb <= o.test_images; first += nb) {
    fill_batch(te, test_rng);
    const auto logits = mt::gather(logits_of(mt::from_host<X>(g, {nb, side, side, 1}, hx)));
    if (!root) continue;
    for (std::int64_t b = 0; b < nb; ++b) {
      const float* row = logits.data() + b * 10;
      correct += (std::max_element(row, row + 10) - row) == hy[b];
      ++total;
    }
  }
  if (root) {
    fmt::print("trained {} steps in {:.1f} s ({:.3f} s/step)\n", o.steps, train_s, train_s / double(o.steps));
    fmt::print("test accuracy: {:.2f}% ({} of {})\n", 100.0 * correct / std::max<std::int64_t>(1, total), correct, total);
  }
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor: a CNN classifying Fashion-MNIST items, each image split over a 2-D mesh"};
  app.add_option("--data-dir", o.data_dir, "directory of the gzip'd Fashion-MNIST idx files")->capture_default_str();
  app.add_option("--layout", o.layout, "spatial: h over rows, w over cols; data: batch over rows and cols")
      ->check(CLI::IsMember({"spatial", "data"}))
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product must be the number of ranks)")->expected(2);
  app.add_option("--batch", o.batch_size)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--width", o.width, "channels of the first convolution (2x of the second)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--log-every", o.log_every, "steps between printed losses (their mean)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--test-images", o.test_images, "held-out images to evaluate")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    const grid g(env, {o.mesh[0], o.mesh[1]});
    const auto tr = idx::load_fashion_mnist(o.data_dir, "train", MPI_COMM_WORLD);
    const auto te = idx::load_fashion_mnist(o.data_dir, "t10k", MPI_COMM_WORLD);
    if (o.layout == "data") train<layout_data>(g, o, tr, te);
    else train<layout_spatial>(g, o, tr, te);
    return 0;
  } catch (const std::exception& e) {
    return env.fail(e, "segmentation_classify: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("segmentation_classify: error: ");
}
