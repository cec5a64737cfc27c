#pragma once
// Eigen Tensor contractions of the attention shapes, in a translation unit of their own (built
// with -march=native, as Eigen users do, so its kernels use the machine's vector units).
namespace peers {
// out[i] (s x s) = q[i] (s x d) . k[i]^T, for i < bh; all row-major and contiguous.
void eigen_attn_qk(const float* q, const float* k, float* out, int bh, int s, int d);
// out[i] (s x d) = p[i] (s x s) . v[i] (s x d), for i < bh.
void eigen_attn_av(const float* p, const float* v, float* out, int bh, int s, int d);
}  // namespace peers
