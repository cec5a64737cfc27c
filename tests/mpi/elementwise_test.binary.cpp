// Binary elementwise ops, broadcasting by name, under every layout (a TU of mpi_elementwise_test:
// see elementwise_test.cpp).
#include "op_family_sweep.hpp"

using namespace tst;
using namespace tst::op_family;

namespace {
template <class Exec, class M, class Layouts>
void run_binary(const M& g, Layouts layouts) {
  check_all_layouts<Exec>(g, layouts, []<class L, class E>(const M& g) {
    using IJ = mt::basic_tensor<double, L, E, i_, j_>;
    using KJ = mt::basic_tensor<double, L, E, k_, j_>;
    auto a = mt::random_normal<IJ>(g, {ext[0], ext[1]}, 3);
    auto b = mt::random_uniform<KJ>(g, {ext[2], ext[1]}, 4, 0.5, 1.5);
    auto y = (a + b) * (a - b) / b + mt::maximum(a, b) + mt::minimum(a, b) + mt::pow(b, a) +
             mt::where(mt::greater(a, b), a, b) + mt::less_equal(a, 0.0) + a * 2.0 + 1.0 / b;
    static_assert(std::is_same_v<typename decltype(y)::dims, list<i_, j_, k_>>);
    return mt::gather_all(y);
  });
}
}  // namespace

MESHTENSOR_OP_FAMILY_SWEEP("binary ops", run_binary)
