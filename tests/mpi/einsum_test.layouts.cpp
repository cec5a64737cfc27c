// einsum in every shape under every layout (a TU of mpi_einsum_test: see einsum_test.cpp).
#include "op_family_sweep.hpp"

using namespace tst;
using namespace tst::op_family;

namespace {
template <class Exec, class M, class Layouts>
void run_einsum(const M& g, Layouts layouts) {
  check_all_layouts<Exec>(g, layouts, []<class L, class E>(const M& g) {
    using IJ = mt::basic_tensor<double, L, E, i_, j_>;
    using JK = mt::basic_tensor<double, L, E, j_, k_>;
    using KJ = mt::basic_tensor<double, L, E, k_, j_>;
    using IJK = mt::basic_tensor<double, L, E, i_, j_, k_>;
    using K = mt::basic_tensor<double, L, E, k_>;
    auto a = mt::random_normal<IJ>(g, {ext[0], ext[1]}, 6);
    auto b = mt::random_normal<JK>(g, {ext[1], ext[2]}, 7);
    auto bt = mt::random_normal<KJ>(g, {ext[2], ext[1]}, 8);
    auto x = mt::random_normal<IJK>(g, ext, 9);
    auto v = mt::random_normal<K>(g, {ext[2]}, 10);
    std::vector<double> all;
    auto add = [&](const auto& t) {
      auto h = mt::gather_all(t);
      all.insert(all.end(), h.begin(), h.end());
    };
    add(mt::einsum<i_, k_>(a, b));      // matrix product
    add(mt::einsum<k_, i_>(a, b));      // transposed output
    add(mt::einsum<i_, k_>(a, bt));     // transposed operand
    add(mt::einsum<i_, k_>(x, b));      // k a batch dim of both, j contracted
    add(mt::einsum<i_, j_>(x, v));      // matrix-vector
    add(mt::einsum<i_, j_, k_>(a, v));  // outer product
    add(mt::einsum<k_>(a, b));          // i summed alone in a, j contracted
    add(mt::einsum<>(a, a));            // full contraction to a scalar
    add(mt::einsum<i_, k_>(a, b, v));   // three operands
    return all;
  });
}
}  // namespace

MESHTENSOR_OP_FAMILY_SWEEP("einsum", run_einsum)
