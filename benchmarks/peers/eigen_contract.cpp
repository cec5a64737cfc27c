// Eigen's Tensor module has no batch dims in contract(), so the batched contraction is one
// contract() per (b, h) slice, each over TensorMaps of the caller's buffers (no copies), on
// Eigen's default (single-threaded) device.
#include "eigen_contract.hpp"

#include <unsupported/Eigen/CXX11/Tensor>

namespace peers {

using cmap2 = Eigen::TensorMap<const Eigen::Tensor<float, 2, Eigen::RowMajor>>;
using map2 = Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>>;

void eigen_attn_qk(const float* q, const float* k, float* out, int bh, int s, int d) {
  const Eigen::array<Eigen::IndexPair<int>, 1> dims{Eigen::IndexPair<int>(1, 1)};
  for (int i = 0; i < bh; ++i) {
    cmap2 qm(q + static_cast<long>(i) * s * d, s, d), km(k + static_cast<long>(i) * s * d, s, d);
    map2 om(out + static_cast<long>(i) * s * s, s, s);
    om = qm.contract(km, dims);
  }
}

void eigen_attn_av(const float* p, const float* v, float* out, int bh, int s, int d) {
  const Eigen::array<Eigen::IndexPair<int>, 1> dims{Eigen::IndexPair<int>(1, 0)};
  for (int i = 0; i < bh; ++i) {
    cmap2 pm(p + static_cast<long>(i) * s * s, s, s), vm(v + static_cast<long>(i) * s * d, s, d);
    map2 om(out + static_cast<long>(i) * s * d, s, d);
    om = pm.contract(vm, dims);
  }
}

}  // namespace peers
