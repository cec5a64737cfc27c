#pragma once
// Shared by the TUs of mpi_planned_run_test, split so that each compiles in under 2 GB:
// planned_run_test.cpp and .mlp.cpp, steps planned against real ones; .recompute.cpp, recompute
// and the gradients' allreduces. The dims and extents, a Transformer block's weights and batch, the
// Transformer and MLP steps, the check that a plan equals its run.
#include <optional>
#include <test_support.hpp>

namespace tst::planned_run {
namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct memory_length : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct hidden : mt::dim<"hidden"> {};
struct classes : mt::dim<"classes"> {};

// Extents that divide by none of 3, 4 or 6 where it matters, so uneven parts are planned too.
constexpr std::int64_t B = 5, T = 6, D = 8, H = 5, KV = 3, F = 14, V = 11, HID = 10, C = 7;

// The weights of a Transformer block LM (one block; embedding and output weights), as params.
template <class L>
struct block_weights {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  t<vocab, d_model> emb;
  t<d_model, heads, d_kv> wq, wk, wv;
  t<heads, d_kv, d_model> wo;
  t<d_model> scale, bias;
  t<d_model, d_ff> w_in;
  t<d_ff, d_model> w_out;
  t<d_model, vocab> w_logits;

  explicit block_weights(const grid& g) {
    const mt::plan_kind_scope as_params(mt::memory_kind::parameters);
    emb = mt::random_normal<t<vocab, d_model>>(g, {V, D}, 1);
    wq = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {D, H, KV}, 2);
    wk = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {D, H, KV}, 3);
    wv = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {D, H, KV}, 4);
    wo = nn::normal_fan_in<t<heads, d_kv, d_model>, heads, d_kv>(g, {H, KV, D}, 5);
    scale = mt::random_normal<t<d_model>>(g, {D}, 9, 1.0, 0.1);
    bias = mt::random_normal<t<d_model>>(g, {D}, 10, 0.0, 0.1);
    w_in = nn::normal_fan_in<t<d_model, d_ff>, d_model>(g, {D, F}, 6);
    w_out = nn::normal_fan_in<t<d_ff, d_model>, d_ff>(g, {F, D}, 7);
    w_logits = nn::normal_fan_in<t<d_model, vocab>, d_model>(g, {D, V}, 8);
    std::apply([](auto&... p) { (p.requires_grad(), ...); }, tie());
  }
  auto tie() { return std::tie(emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits); }
};

// Token ids and next-token labels of a [B x T] batch.
template <class L>
auto ids_and_labels(const grid& g) {
  std::vector<float> ids(B * T), labels(B * T);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 7) % V), labels[i] = static_cast<float>((i * 3 + 1) % V);
  using I = mt::tensor<float, L, batch, length>;
  return std::pair{mt::from_host<I>(g, {B, T}, ids), mt::from_host<I>(g, {B, T}, labels)};
}

inline std::string describe(const mt::comm_counters& c, const grid& g) {
  std::ostringstream s;
  for (const auto& [key, n] : c)
    s << mt::to_string(key.first) << " over {" << g.axes_string(key.second) << "}: " << n.calls << " calls, "
      << n.bytes << " bytes\n";
  return s.str();
}

struct measured {
  mt::comm_counters counters;
  std::int64_t param_bytes = 0, state_bytes = 0;
  std::optional<mt::plan_report> report;  // a planned run's, taken while its tensors are alive
  std::int64_t waits = 0;                 // the host's waits for the device: a real run's host_waits()
};

// One step of a Transformer block language model; the same code for a real and a planned mesh.
template <class L>
measured transformer_step(const grid& g) {
  using X = mt::tensor<float, L, batch, length, d_model>;
  const std::int64_t waits_before = mt::host_waits();
  block_weights<L> w(g);
  auto params = w.tie();
  auto& [emb, wq, wk, wv, wo, scale, bias, w_in, w_out, w_logits] = w;
  mt::optim::adam adam({.lr = 1e-3});
  mt::optim::adafactor adafactor({.lr = 1e-3});

  g.reset_counters();
  const auto [x_ids, y] = ids_and_labels<L>(g);
  X x = nn::embedding<vocab>(emb, x_ids);
  const auto h = nn::layer_norm<d_model>(x, scale, bias);
  x = x + nn::causal_attention<length, memory_length, d_model, heads, d_kv>(h, wq, wk, wv, wo);
  x = x + nn::feed_forward<d_model, d_ff>(nn::layer_norm<d_model>(x, scale, bias), w_in, w_out);
  const auto logits = nn::dense<d_model, vocab>(x, w_logits);
  const auto loss = mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(logits, y));
  auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  adam.step(params, grads);
  adafactor.step(params, grads);
  (void)mt::item(loss);
  measured m{g.counters(), mt::local_bytes(params), adam.state_bytes(params) + adafactor.state_bytes(params), {},
             mt::host_waits() - waits_before};
  if (g.is_planned()) m.report = mt::plan_report_of(g);
  return m;
}

// One step of a two-layer MLP classifier with SGD-free Adam.
template <class L>
measured mlp_step(const grid& g) {
  const std::int64_t waits_before = mt::host_waits();
  std::optional<mt::plan_kind_scope> as_params(std::in_place, mt::memory_kind::parameters);
  auto w1 = nn::normal_fan_in<mt::tensor<float, L, d_model, hidden>, d_model>(g, {D, HID}, 1);
  auto b1 = mt::zeros<mt::tensor<float, L, hidden>>(g, {HID});
  auto w2 = nn::normal_fan_in<mt::tensor<float, L, hidden, classes>, hidden>(g, {HID, C}, 2);
  as_params.reset();
  auto params = std::tie(w1, b1, w2);
  std::apply([](auto&... p) { (p.requires_grad(), ...); }, params);
  mt::optim::adam adam({.lr = 1e-3});
  g.reset_counters();
  const auto x = mt::random_normal<mt::tensor<float, L, batch, d_model>>(g, {B, D}, 3);
  std::vector<float> labels(B);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<float>(i % C);
  const auto y = mt::from_host<mt::tensor<float, L, batch>>(g, {B}, labels);
  const auto hdn = mt::relu(nn::dense<d_model, hidden>(x, w1, b1));
  const auto loss = mt::reduce_mean<batch>(nn::softmax_cross_entropy<classes>(nn::dense<hidden, classes>(hdn, w2), y));
  auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
  adam.step(params, grads);
  (void)mt::item(loss);
  measured m{g.counters(), mt::local_bytes(params), adam.state_bytes(params), {}, mt::host_waits() - waits_before};
  if (g.is_planned()) m.report = mt::plan_report_of(g);
  return m;
}

template <class Step>
void check_planned_equals_real(const grid& g, Step step) {
  const measured real = step(g);
  const auto pm = grid::planned(g.sizes(), {g.coord<r_>(), g.coord<c_>()});
  const measured planned = step(pm);
  REQUIRE(planned.report);
  const auto& report = *planned.report;
  INFO("rank " << g.rank() << "\nreal:\n" << describe(real.counters, g) << "planned:\n" << describe(planned.counters, g));
  CHECK(planned.counters == real.counters);
  CHECK(report.totals == real.counters);
  CHECK(planned.param_bytes == real.param_bytes);
  CHECK(report.bytes_of(mt::memory_kind::parameters) == real.param_bytes);
  CHECK(report.bytes_of(mt::memory_kind::optimizer_state) == real.state_bytes);
  // The gradients gradient() handed out (the tape's own, allocated in the backward pass) count as
  // gradients: one per param, alive when the report is taken.
  CHECK(report.bytes_of(mt::memory_kind::gradients) == real.param_bytes);
  CHECK(report.peak_bytes >= real.param_bytes + real.state_bytes);
  // The host waits for the device where the plan says: as many times (a planned run counts each
  // wait instead of waiting, and makes none).
  INFO("waits for the device: real " << real.waits << ", planned " << report.waits);
  CHECK(real.waits > 0);
  CHECK(planned.waits == 0);
  CHECK(report.waits == real.waits);
}
}  // namespace tst::planned_run
