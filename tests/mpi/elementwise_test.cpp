// Layout transparency of elementwise ops: under every layout of meshes [P] and [2x2], the gathered
// result equals the replicated (single-processor) result. float64 throughout: tolerance 1e-12
// relative. This TU sweeps the unary ops; the program's other TUs, which compile in parallel, sweep
// the binary ops (elementwise_test.binary.cpp) and check the gradients (elementwise_test.gradient.cpp).
#include "op_family_sweep.hpp"

using namespace tst;
using namespace tst::op_family;
namespace mt = meshtensor;

namespace {
template <class Exec, class M, class Layouts>
void run_unary(const M& g, Layouts layouts) {
  check_all_layouts<Exec>(g, layouts, []<class L, class E>(const M& g) {
    using T = mt::basic_tensor<double, L, E, i_, j_, k_>;
    auto x = mt::random_normal<T>(g, ext, 1);
    auto p = mt::random_uniform<T>(g, ext, 2, 0.5, 2.0);
    auto y = mt::exp(mt::tanh(x)) + mt::sigmoid(x) * mt::gelu(x) - mt::relu(x) + mt::abs(x) + mt::square(x) +
             mt::log(p) + mt::sqrt(p) + mt::rsqrt(p) + mt::negative(x) + mt::reciprocal(p) + mt::sin(x) +
             mt::cos(x);
    return mt::gather_all(y);
  });
}
}  // namespace

MESHTENSOR_OP_FAMILY_SWEEP("unary ops", run_unary)
