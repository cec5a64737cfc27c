#pragma once
// The Fashion-MNIST MLP (784 pixels -> hidden units -> 10 classes) and its training step, under any
// layout of a 2-D mesh [rows x cols]. main.cpp trains it; tests/examples/fashion_mnist_checks.cpp
// plans this same step and checks the plan against a real one.
#include <meshtensor/meshtensor.hpp>
#include <tuple>

namespace fashion_mnist {

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct pixels : mt::dim<"pixels"> {};
struct hidden : mt::dim<"hidden"> {};
struct classes : mt::dim<"classes"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

// 2d: data parallelism over rows, model parallelism over cols. x[batch, pixels] w1[pixels, hidden]
// needs no communication, h[batch, hidden] w2[hidden, classes] allreduces over cols, and the weight
// gradients allreduce over rows.
using layout_2d = mt::layout<grid, mt::split<batch, rows>, mt::split<hidden, cols>>;
using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using layout_model = mt::layout<grid, mt::split<hidden, rows, cols>>;

constexpr std::int64_t image_pixels = 28 * 28, n_classes = 10;

template <class L>
struct mlp {
  using images = mt::tensor<float, L, batch, pixels>;
  using labels = mt::tensor<int, L, batch>;
  mt::tensor<float, L, pixels, hidden> w1;
  mt::tensor<float, L, hidden> b1;
  mt::tensor<float, L, hidden, classes> w2;
  mt::tensor<float, L, classes> b2;

  mlp(const grid& g, std::int64_t hidden_units, std::uint64_t seed) {
    const mt::plan_kind_scope as_parameters(mt::memory_kind::parameters);  // what a plan counts them as
    w1 = nn::normal_fan_in<decltype(w1), pixels>(g, {image_pixels, hidden_units}, seed);
    b1 = mt::zeros<decltype(b1)>(g, {hidden_units});
    w2 = nn::normal_fan_in<decltype(w2), hidden>(g, {hidden_units, n_classes}, seed + 1);
    b2 = mt::zeros<decltype(b2)>(g, {n_classes});
    std::apply([](auto&... p) { (p.requires_grad(), ...); }, params());
  }

  auto params() { return std::tie(w1, b1, w2, b2); }

  mt::tensor<float, L, batch, classes> logits(const images& x) const {
    return nn::dense<hidden, classes>(mt::relu(nn::dense<pixels, hidden>(x, w1, b1)), w2, b2);
  }

  // One training step of any optimizer (adam, sgd): returns the batch's mean cross-entropy.
  template <class Optimizer>
  mt::tensor<float, L> step(Optimizer& optimizer, const images& x, const labels& y) {
    const auto loss = mt::reduce_mean<batch>(nn::softmax_cross_entropy<classes>(logits(x), y));
    optimizer.step(params(), std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params()));
    return loss;
  }
};

}  // namespace fashion_mnist
