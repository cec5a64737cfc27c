// reduce_sum and transpose under every layout (a TU of mpi_elementwise_einsum_equivalence_test: see
// elementwise_einsum_equivalence_test.cpp).
#include "elementwise_einsum_equivalence.hpp"

using namespace tst;
using namespace tst::elementwise_einsum;

namespace {
template <class Exec, class M, class Layouts>
void run_reductions(const M& g, Layouts layouts) {
  check_all_layouts<Exec>(g, layouts, []<class L, class E>(const M& g) {
    using T = mt::basic_tensor<double, L, E, i_, j_, k_>;
    auto x = mt::random_normal<T>(g, ext, 5);
    auto a = mt::gather_all(mt::reduce_sum<j_>(x));
    auto b = mt::gather_all(mt::reduce_sum<i_, k_>(x));
    auto c = mt::gather_all(mt::reduce_sum<i_, j_, k_>(x));
    auto d = mt::gather_all(mt::transpose<k_, i_, j_>(x));
    a.insert(a.end(), b.begin(), b.end());
    a.insert(a.end(), c.begin(), c.end());
    a.insert(a.end(), d.begin(), d.end());
    return a;
  });
}
}  // namespace

MESHTENSOR_OPS_CORE_SWEEP("reduce_sum and transpose", run_reductions)
