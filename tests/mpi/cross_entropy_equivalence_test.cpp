// softmax_cross_entropy in float, on whichever path the build and layout give it (the row-softmax
// provider's log_softmax and softmax with the vocab whole and last, kernels/softmax.hpp; the row
// kernels' phases with the vocab split; the row kernels everywhere under
// MESHTENSOR_KERNELS=portable), against a host loop in double (the loss) and against the composed
// ops (logsumexp - sum(logits * one_hot)) for the gradient, under replicated, batch-split,
// length-split and vocab-split layouts at 1, 2 and 4 ranks; label smoothing 0 and 0.1, a label
// outside the vocab, and uneven extents. Where the build has a provider it must be the one that ran
// (a test of its own).
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
using b_ = i_;
using l_len = j_;
using v_ = k_;
constexpr std::int64_t B = 3, L = 5, V = 11;

// Row r's loss: lse - sum_v t_v x_v, t = on at the label (none outside [0, V)), off elsewhere.
std::vector<double> host_loss(const std::vector<float>& x, const std::vector<float>& ids, double smoothing) {
  const double on = 1 - smoothing + smoothing / V, off = smoothing / V;
  std::vector<double> out;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    double mx = -1e300, s = 0, dot = 0;
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, double(x[r * V + v]));
    for (std::int64_t v = 0; v < V; ++v) {
      s += std::exp(double(x[r * V + v]) - mx);
      dot += (ids[r] == float(v) ? on : off) * double(x[r * V + v]);
    }
    out.push_back(mx + std::log(s) - dot);
  }
  return out;
}

std::size_t provider_softmaxes() {
#if MESHTENSOR_HAVE_DNNL
  return mt::kernels::dnnl_provider::softmax_cache().size();
#else
  return 0;
#endif
}

template <class Lay, class M>
void check_layout(const M& g) {
  INFO(layout_name<Lay>());
  using Z = mt::tensor<float, Lay, b_, l_len, v_>;
  using Y = mt::tensor<float, Lay, b_, l_len>;
  std::vector<float> ids;
  for (std::int64_t r = 0; r < B * L; ++r) ids.push_back(static_cast<float>((r * 7) % V));
  ids[4] = -1;  // outside the vocab: no target
  const auto labels = mt::from_host<Y>(g, {B, L}, ids);
  for (const double smoothing : {0.0, 0.1}) {
    INFO("label smoothing " << smoothing);
    auto z = mt::random_normal<Z>(g, {B, L, V}, 3, 0, 3);
    z.requires_grad();
    const auto loss = mt::nn::softmax_cross_entropy<v_>(z, labels, smoothing);
    const auto got = mt::gather_all(loss);
    require_close(std::vector<double>(got.begin(), got.end()), host_loss(mt::gather_all(z), ids, smoothing), 2e-5);

    const float on = static_cast<float>(1 - smoothing + smoothing / V), off = static_cast<float>(smoothing / V);
    const auto composed = mt::logsumexp<v_>(z) - mt::reduce_sum<v_>(z * mt::one_hot<v_, float>(labels, V, on, off));
    require_close(mt::gather_all(loss), mt::gather_all(composed), 2e-5);
    const auto [gz] = mt::gradient(weighted_sum(loss, 9), z);
    const auto [gz_composed] = mt::gradient(weighted_sum(composed, 9), z);
    require_close(mt::gather_all(gz), mt::gather_all(gz_composed), 2e-5);
  }
}
}  // namespace

TEST_CASE("softmax_cross_entropy in float equals a host loop and the composed ops, every path", "[equivalence]") {
  auto g = world_line();
  check_layout<mt::layout<line>>(g);
  check_layout<mt::layout<line, mt::split<b_, x_>>>(g);
  check_layout<mt::layout<line, mt::split<l_len, x_>>>(g);
  check_layout<mt::layout<line, mt::split<v_, x_>>>(g);
  auto m = world_grid();
  check_layout<mt::layout<grid, mt::split<b_, r_>, mt::split<v_, c_>>>(m);
  check_layout<mt::layout<grid, mt::split<l_len, r_, c_>>>(m);
}

TEST_CASE("the whole-vocab cross-entropy takes the row-softmax provider where the build has one", "[equivalence]") {
  auto g = world_line();
  using Z = mt::tensor<float, mt::layout<line, mt::split<b_, x_>>, b_, l_len, v_>;
  using Y = mt::tensor<float, mt::layout<line, mt::split<b_, x_>>, b_, l_len>;
  const std::size_t before = provider_softmaxes();
  (void)mt::nn::softmax_cross_entropy<v_>(mt::random_normal<Z>(g, {12, 3, 13}, 1), mt::zeros<Y>(g, {12, 3}));
  const char* kernels = std::getenv("MESHTENSOR_KERNELS");
  const bool portable = kernels && std::string_view(kernels) == "portable";
  REQUIRE((provider_softmaxes() > before) == (MESHTENSOR_HAVE_DNNL && !portable));
}
