// Optimizers: three steps of sgd (momentum, nesterov, weight decay), adam, adamw and adafactor
// (factored for a matrix, unfactored for a vector, with momentum) equal the update computed here on
// the host from the published formulas, under replicated and split layouts; Adam's step updates
// every parameter in one kernel, bit for bit as update() does each. And a training step in
// steady state allocates nothing: the second of two identical steps makes no Kokkos allocation.
#include <meshtensor/optim/adafactor.hpp>
#include <meshtensor/optim/adam.hpp>
#include <meshtensor/optim/sgd.hpp>
#include <test_support.hpp>

#include "kernel_launches.hpp"

#include "planned_run.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

using namespace tst;
namespace mt = meshtensor;
namespace optim = meshtensor::optim;

namespace {
using vec = std::vector<double>;
// Even extents (4, 8), and uneven ones (3, 7): 7 over 2, 4 and 6 parts, 3 over 4 and 6 parts (some
// processors hold no rows), so the factored moments' means must count globally.
constexpr std::int64_t max_r = 4, max_c = 8;
std::int64_t R = max_r, C = max_c;

struct host_adafactor {
  double vr[max_r] = {}, vc[max_c] = {}, v1[max_c] = {}, m[max_r * max_c] = {}, m1[max_c] = {};
};
double rms(const vec& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s / x.size());
}

// The gradient fed at step t: fixed random values that change with t.
template <class TT, class M>
TT grad_at(const M& g, const typename TT::extents_type& e, int t) {
  return mt::random_normal<TT>(g, e, 100 + t);
}

template <class L>
void run_layout(const grid& g) {
  using W = mt::tensor<double, L, i_, j_>;
  using B = mt::tensor<double, L, j_>;
  const vec w0 = mt::gather_all(mt::random_normal<W>(g, {R, C}, 1));
  const vec b0 = mt::gather_all(mt::random_normal<B>(g, {C}, 2));
  std::vector<vec> gw, gb;
  for (int t = 1; t <= 3; ++t) {
    gw.push_back(mt::gather_all(grad_at<W>(g, {R, C}, t)));
    gb.push_back(mt::gather_all(grad_at<B>(g, {C}, t + 10)));
  }
  // Runs 3 steps of opt on (w, b) and returns the final params.
  auto run = [&](auto opt) {
    auto w = mt::from_host<W>(g, {R, C}, w0);
    auto b = mt::from_host<B>(g, {C}, b0);
    for (int t = 1; t <= 3; ++t)
      opt.step(std::tie(w, b), std::tuple{grad_at<W>(g, {R, C}, t), grad_at<B>(g, {C}, t + 10)});
    REQUIRE(opt.steps() == 3);
    return std::pair{mt::gather_all(w), mt::gather_all(b)};
  };
  auto check = [&](const std::pair<vec, vec>& got, const vec& w, const vec& b) {
    REQUIRE(max_rel_error(got.first, w) < 1e-12);
    REQUIRE(max_rel_error(got.second, b) < 1e-12);
    REQUIRE(max_rel_error(got.first, w0) > 1e-4);  // the update did something
  };

  SECTION("sgd with momentum and weight decay") {
    const double lr = 0.1, mu = 0.9, wd = 0.01;
    for (bool nesterov : {false, true}) {
      vec w = w0, b = b0, vw(w.size()), vb(b.size());
      for (int t = 0; t < 3; ++t) {
        auto upd = [&](vec& p, vec& v, const vec& gr) {
          for (std::size_t n = 0; n < p.size(); ++n) {
            const double gi = gr[n] + wd * p[n];
            v[n] = t == 0 ? gi : mu * v[n] + gi;
            p[n] -= lr * (nesterov ? gi + mu * v[n] : v[n]);
          }
        };
        upd(w, vw, gw[t]);
        upd(b, vb, gb[t]);
      }
      check(run(optim::sgd({.lr = lr, .momentum = mu, .weight_decay = wd, .nesterov = nesterov})), w, b);
    }
  }
  SECTION("adam and adamw") {
    const double lr = 0.01, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
    for (bool decoupled : {false, true}) {
      vec w = w0, b = b0, mw(w.size()), vw(w.size()), mb(b.size()), vb(b.size());
      for (int t = 1; t <= 3; ++t) {
        auto upd = [&](vec& p, vec& m, vec& v, const vec& gr) {
          for (std::size_t n = 0; n < p.size(); ++n) {
            const double gi = decoupled ? gr[n] : gr[n] + wd * p[n];
            m[n] = b1 * m[n] + (1 - b1) * gi;
            v[n] = b2 * v[n] + (1 - b2) * gi * gi;
            const double mh = m[n] / (1 - std::pow(b1, t)), vh = v[n] / (1 - std::pow(b2, t));
            p[n] -= lr * (mh / (std::sqrt(vh) + eps) + (decoupled ? wd * p[n] : 0.0));
          }
        };
        upd(w, mw, vw, gw[t - 1]);
        upd(b, mb, vb, gb[t - 1]);
      }
      if (decoupled)
        check(run(optim::adamw({.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd})), w, b);
      else
        check(run(optim::adam({.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd})), w, b);
    }
  }
  SECTION("adafactor: factored matrix, unfactored vector, relative step, clipping, momentum") {
    for (double beta1 : {0.0, 0.5}) {
      vec w = w0, b = b0;
      host_adafactor s;
      for (int t = 1; t <= 3; ++t) {
        const double beta2 = 1 - std::pow(t, -0.8), eps1 = 1e-30;
        const double rho = std::min(1e-2, 1 / std::sqrt(double(t)));
        // Matrix: row and column means of g^2 + eps1.
        vec u(R * C);
        for (std::int64_t i = 0; i < R; ++i) {
          double mean = 0;
          for (std::int64_t j = 0; j < C; ++j) mean += (gw[t - 1][i * C + j] * gw[t - 1][i * C + j] + eps1) / C;
          s.vr[i] = beta2 * s.vr[i] + (1 - beta2) * mean;
        }
        for (std::int64_t j = 0; j < C; ++j) {
          double mean = 0;
          for (std::int64_t i = 0; i < R; ++i) mean += (gw[t - 1][i * C + j] * gw[t - 1][i * C + j] + eps1) / R;
          s.vc[j] = beta2 * s.vc[j] + (1 - beta2) * mean;
        }
        double row_mean = 0;
        for (std::int64_t i = 0; i < R; ++i) row_mean += s.vr[i] / R;
        for (std::int64_t i = 0; i < R; ++i)
          for (std::int64_t j = 0; j < C; ++j) u[i * C + j] = gw[t - 1][i * C + j] / std::sqrt(s.vr[i] * s.vc[j] / row_mean);
        // Vector: unfactored.
        vec ub(C);
        for (std::int64_t j = 0; j < C; ++j) {
          s.v1[j] = beta2 * s.v1[j] + (1 - beta2) * (gb[t - 1][j] * gb[t - 1][j] + eps1);
          ub[j] = gb[t - 1][j] / std::sqrt(s.v1[j]);
        }
        auto apply = [&](vec& p, vec& uu, double* m) {
          const double clip = std::max(1.0, rms(uu) / 1.0);
          const double alpha = std::max(1e-3, rms(p)) * rho;
          for (std::size_t n = 0; n < p.size(); ++n) {
            double un = uu[n] / clip;
            if (beta1 > 0) un = m[n] = beta1 * m[n] + (1 - beta1) * un;
            p[n] -= alpha * un;
          }
        };
        apply(w, u, s.m);
        apply(b, ub, s.m1);
      }
      check(run(optim::adafactor({.beta1 = beta1})), w, b);
    }
  }
  SECTION("per-param interface and a mismatched step") {
    optim::adam opt;
    auto w = mt::from_host<W>(g, {R, C}, w0);
    auto st = opt.init(w);
    opt.update(w, grad_at<W>(g, {R, C}, 1), st, 1);
    // Adam's first step moves each element by lr * sign(g) (up to eps).
    const auto got = mt::gather_all(w);
    for (std::size_t n = 0; n < got.size(); ++n)
      REQUIRE(std::abs(got[n] - (w0[n] - 1e-3 * (gw[0][n] > 0 ? 1 : -1))) < 1e-9);
    auto b = mt::from_host<B>(g, {C}, b0);
    optim::sgd s2;
    s2.step(std::tie(w, b), std::tuple{grad_at<W>(g, {R, C}, 1), grad_at<B>(g, {C}, 2)});
    REQUIRE_THROWS_AS(s2.step(std::tie(b), std::tuple{grad_at<B>(g, {C}, 2)}), mt::error);
  }
}
}  // namespace

TEST_CASE("optimizer steps equal hand-computed updates", "[optim]") {
  const bool uneven = GENERATE(false, true);
  R = uneven ? 3 : max_r;
  C = uneven ? 7 : max_c;
  INFO("extents " << R << " x " << C);
  const auto g = world_grid();
  SECTION("replicated") { run_layout<mt::layout<grid>>(g); }
  SECTION("i over r, j over c") { run_layout<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>>(g); }
  SECTION("j over c and r") { run_layout<mt::layout<grid, mt::split<j_, c_, r_>>>(g); }
}

namespace {
// Every Kokkos allocation, pooled or not, seen through Kokkos Tools' allocation callback: an
// independent count (the pool's own counter would miss allocations that bypass it).
struct kokkos_allocations {
  static inline std::atomic<long> count{0};
  static inline std::mutex mu;
  static inline std::vector<std::string> labels;  // what was allocated, for the failure's message
  static void on_allocate(Kokkos_Profiling_SpaceHandle space, const char* label, const void*, std::uint64_t bytes) {
    ++count;
    std::lock_guard lock(mu);
    labels.push_back(std::string(space.name) + " " + label + " (" + std::to_string(bytes) + " bytes)");
  }
  kokkos_allocations() { Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate); }
  ~kokkos_allocations() { Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr); }
  long since(long before) const { return count.load() - before; }
  static std::string list(long from) {
    std::lock_guard lock(mu);
    std::string s;
    for (std::size_t i = static_cast<std::size_t>(from); i < labels.size(); ++i) s += labels[i] + "\n";
    return s;
  }
};

struct batch : mt::dim<"batch"> {};
struct d_in : mt::dim<"d_in"> {};
struct hidden : mt::dim<"hidden"> {};
struct classes : mt::dim<"classes"> {};
}  // namespace

// Runs step twice and requires the second to make no Kokkos allocation, and the pool's peak to
// count at least `lasting` bytes (what lives through the step: params, optimizer states).
template <class Step, class Lasting>
void check_steady_state(Step step, Lasting lasting) {
  const kokkos_allocations seen;
  long before = seen.count.load();
  { Kokkos::View<float*> probe("meshtensor::test_probe", 1); }
  REQUIRE(seen.since(before) == 1);  // the callback sees allocations, so a zero below means something

  const auto cold = mt::memory_stats();
  before = seen.count.load();
  const double first = step();
  // Every Kokkos allocation of the first step is the pool's: none bypasses it.
  CHECK(seen.since(before) == mt::memory_stats().system_allocations - cold.system_allocations);
  mt::reset_peak_memory();
  const auto held_before = mt::memory_stats();
  before = seen.count.load();
  const double second = step();
  const long made = seen.since(before);
  INFO("Kokkos allocations in the second step:\n" << kokkos_allocations::list(before));
  CHECK(made == 0);
  CHECK(second < first);  // the update did something, the same loss was not read twice
  const auto s = mt::memory_stats();
  CHECK(s.system_allocations == held_before.system_allocations);
  CHECK(s.peak_bytes_in_use >= lasting());
  CHECK(s.peak_bytes_in_use <= s.bytes_held);
  CHECK(s.bytes_in_use <= s.peak_bytes_in_use);
}

TEST_CASE("a training step in steady state makes no allocation", "[optim][memory]") {
  const auto g = world_grid();
  SECTION("MLP, Adam") {
    // Batch over r and hidden over c: the step has allreduces (and on a GPU their staging buffers).
    using L = mt::layout<grid, mt::split<batch, r_>, mt::split<hidden, c_>>;
    constexpr std::int64_t B = 6, D = 5, HID = 7, NC = 3;
    auto w1 = mt::nn::normal_fan_in<mt::tensor<float, L, d_in, hidden>, d_in>(g, {D, HID}, 1);
    auto b1 = mt::zeros<mt::tensor<float, L, hidden>>(g, {HID});
    auto w2 = mt::nn::normal_fan_in<mt::tensor<float, L, hidden, classes>, hidden>(g, {HID, NC}, 2);
    auto params = std::tie(w1, b1, w2);
    std::apply([](auto&... p) { (p.requires_grad(), ...); }, params);
    const auto x = mt::random_normal<mt::tensor<float, L, batch, d_in>>(g, {B, D}, 3);
    std::vector<float> labels(B);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<float>(i % NC);
    const auto y = mt::from_host<mt::tensor<float, L, batch>>(g, {B}, labels);
    optim::adam adam({.lr = 1e-2});
    // Forward, backward, the optimizer's update and the loss read on the host.
    check_steady_state(
        [&] {
          const auto h = mt::relu(mt::nn::dense<d_in, hidden>(x, w1, b1));
          const auto loss =
              mt::reduce_mean<batch>(mt::nn::softmax_cross_entropy<classes>(mt::nn::dense<hidden, classes>(h, w2), y));
          auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
          adam.step(params, grads);
          return mt::item(loss);
        },
        [&] { return mt::local_bytes(params) + adam.state_bytes(params); });
  }
  SECTION("Transformer block, Adam and Adafactor, the batch written from the host each step") {
    namespace pr = tst::planned_run;
    using L = mt::layout<grid, mt::split<pr::batch, r_>, mt::split<pr::vocab, c_>, mt::split<pr::heads, c_>,
                         mt::split<pr::d_ff, c_>>;
    pr::block_weights<L> w(g);
    auto params = w.tie();
    optim::adam adam({.lr = 1e-2});
    optim::adafactor adafactor({.lr = 1e-2});
    check_steady_state(
        [&] {
          using X = mt::tensor<float, L, pr::batch, pr::length, pr::d_model>;
          const auto [ids, y] = pr::ids_and_labels<L>(g);
          X x = mt::nn::embedding<pr::vocab>(w.emb, ids);
          x = x + mt::nn::causal_attention<pr::length, pr::memory_length, pr::d_model, pr::heads, pr::d_kv>(
                      mt::nn::layer_norm<pr::d_model>(x, w.scale, w.bias), w.wq, w.wk, w.wv, w.wo);
          x = x + mt::nn::feed_forward<pr::d_model, pr::d_ff>(mt::nn::layer_norm<pr::d_model>(x, w.scale, w.bias), w.w_in,
                                                             w.w_out);
          const auto loss = mt::reduce_mean<pr::batch, pr::length>(
              mt::nn::softmax_cross_entropy<pr::vocab>(mt::nn::dense<pr::d_model, pr::vocab>(x, w.w_logits), y));
          auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
          adam.step(params, grads);
          adafactor.step(params, grads);
          return mt::item(loss);
        },
        [&] { return mt::local_bytes(params) + adam.state_bytes(params) + adafactor.state_bytes(params); });
  }
}

TEST_CASE("adam updates every parameter of a step in one kernel, as update() does each", "[optim]") {
  // A matrix and a vector param of 5110 and 9000 elements (several runs of 4096 each, the last one
  // partial), uneven over the mesh, and a small one: step() against update() on copies, bit for bit.
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using M = mt::tensor<float, L, i_, j_>;
  using V = mt::tensor<float, L, j_>;
  const auto g = world_grid();
  const auto w0 = mt::random_normal<M>(g, {70, 73}, 1);
  const std::vector<V> v0{mt::random_normal<V>(g, {9000}, 2), mt::random_normal<V>(g, {3}, 3)};
  const bool decoupled = GENERATE(false, true);
  const optim::adam::config c{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1, .decoupled = decoupled};
  // Copies (step() and update() write in place), from the gathered values.
  const auto copy = [&]<class T>(const T& x) { return mt::from_host<T>(x.mesh(), x.extents(), mt::gather_all(x)); };
  auto w = copy(w0), w_each = copy(w0);
  std::vector<V> v{copy(v0[0]), copy(v0[1])}, v_each{copy(v0[0]), copy(v0[1])};
  optim::adam fused(c), each(c);
  auto s_w = each.init(w_each);
  std::vector<optim::adam::state<V>> s_v{each.init(v_each[0]), each.init(v_each[1])};
  for (int t = 1; t <= 3; ++t) {
    const auto gw = mt::random_normal<M>(g, {70, 73}, 10 + t);
    const std::vector<V> gv{mt::random_normal<V>(g, {9000}, 20 + t), mt::random_normal<V>(g, {3}, 30 + t)};
    {
      const kernel_launches seen;
      fused.step(std::tie(w, v), std::tuple{gw, gv});
      CHECK(kernel_launches::count("meshtensor::optim::adam") == 1);
    }
    each.update(w_each, gw, s_w, t);
    for (std::size_t k = 0; k < v.size(); ++k) each.update(v_each[k], gv[k], s_v[k], t);
  }
  const auto same = [](const auto& a, const auto& b) {
    const auto x = mt::gather_all(a), y = mt::gather_all(b);
    return std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  CHECK(same(w, w_each));
  CHECK(same(v[0], v_each[0]));
  CHECK(same(v[1], v_each[1]));
  CHECK_FALSE(same(w, w0));  // the steps did something
}

TEST_CASE("the pool reuses a block by size class, never while a View of it lives", "[memory]") {
  // The classes by their rule: powers of two from 64 bytes up to 64 KiB, then steps of a quarter
  // of the size's power of two (64 KiB + 1 byte: 80 KiB; 100000 bytes: 7 steps of 16 KiB).
  CHECK(mt::detail::size_class(1) == 64);
  CHECK(mt::detail::size_class(65) == 128);
  CHECK(mt::detail::size_class(65536) == 65536);
  CHECK(mt::detail::size_class(65537) == 81920);
  CHECK(mt::detail::size_class(100000) == 114688);
  CHECK(mt::detail::size_class(131072) == 131072);
  // A type of its own, so that no other test's blocks are in this pool.
  using pool = mt::detail::view_pool<std::int16_t, Kokkos::HostSpace>;
  const auto held = mt::memory_stats<Kokkos::HostSpace>().bytes_held;
  auto a = pool::get().allocate(3);  // 6 bytes: a block of 64
  CHECK(a.extent(0) == 3);
  const std::int16_t* where = a.data();
  auto copy = a;
  a = {};
  auto b = pool::get().allocate(20);  // the same class, but a View copy of the first block lives
  CHECK(b.data() != where);
  CHECK(b.extent(0) == 20);
  copy = {};
  auto c = pool::get().allocate(32);  // 64 bytes: the first block, free again
  CHECK(c.data() == where);
  CHECK(mt::memory_stats<Kokkos::HostSpace>().bytes_held - held == 2 * 64);
}
