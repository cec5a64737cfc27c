#pragma once
// kernels::product_into_float: C[b] (m x n, float) = op(A[b]) * op(B[b]), or C[b] += it with
// accumulate, for A and B of float or bf16, all row-major and contiguous. A weight's gradient is
// written straight into its float buffer this way (gradient-accumulation fusion, as Megatron's
// GEMM with beta = 1): no bf16 gradient, no float copy of it and no separate add per microbatch.
// Providers:
//   host        oneDNN's matmul (float output, a sum post-op to add) where kernels::product uses it
//               (an AVX-512 job built with oneDNN: dnnl_provider::float_products), else OpenBLAS's
//               sgemm with beta 0 or 1 (bf16 operands widened to float first, in pool buffers)
//   CUDA        cuBLAS's GemmStridedBatchedEx, float or bf16 in, float out, float compute
//   elsewhere   a Kokkos loop
// While planning, the product's multiply-adds are counted instead (plan/ledger.hpp), and on the
// host the widened operands' buffers, as the run holds them.
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "../element/bf16.hpp"
#include "cublas.hpp"
#include "launch.hpp"
#include "pool.hpp"
#include "product.hpp"

namespace meshtensor::kernels {

// Whether a host product into float of T operands runs on oneDNN in this job: where
// kernels::product's float or bf16 products do.
template <class Exec, class T>
bool on_dnnl() {
#if MESHTENSOR_HAVE_DNNL
  return host_space_v<Exec> && (std::is_same_v<T, bf16> ? dnnl_provider::has_bf16() : dnnl_provider::float_products());
#else
  return false;
#endif
}

template <class Exec, class T>
void product_into_float(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                        const Kokkos::View<T*, typename Exec::memory_space>& a,
                        const Kokkos::View<T*, typename Exec::memory_space>& b,
                        const Kokkos::View<float*, typename Exec::memory_space>& c, bool accumulate) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>,
                "meshtensor: product_into_float takes float or bf16 operands");
  using Mem = typename Exec::memory_space;
  // The sgemm path widens bf16 operands; oneDNN takes them as they are.
  const bool widened = host_space_v<Exec> && std::is_same_v<T, bf16> && !on_dnnl<Exec, T>();
  if (meshtensor::detail::planning()) {
    if (widened && meshtensor::detail::plan_ledger::get().counts_host_scratch) {
      const meshtensor::detail::temporary_view<float, Mem> wa(a.extent(0)), wb(b.extent(0));
      planned_away({{nb, m, n, k, true}});
      return;
    }
    planned_away({{nb, m, n, k, std::is_same_v<T, bf16>}});
    return;
  }
  if (nb == 0 || m == 0 || n == 0) return;
  if constexpr (host_space_v<Exec>) {
    if (k == 0) {
      if (!accumulate) Kokkos::deep_copy(c, 0.0f);
      return;
    }
#if MESHTENSOR_HAVE_DNNL
    if (on_dnnl<Exec, T>()) {
      Exec().fence();  // oneDNN runs on its own threads: Kokkos's writes to a, b and c come first
      if (dnnl_provider::matmul<T, float>(nb, m, n, k, trans_a, trans_b, a.data(), b.data(), c.data(), accumulate))
        return;
    }
#endif
    const float* pa = nullptr;
    const float* pb = nullptr;
    Kokkos::View<float*, Mem> wa, wb;  // bf16 operands widened; empty for float ones
    if constexpr (std::is_same_v<T, bf16>) {
      auto& pool = meshtensor::detail::view_pool<float, Mem>::get();
      wa = pool.allocate(a.extent(0));
      wb = pool.allocate(b.extent(0));
      detail::convert<Exec>(a, wa);
      detail::convert<Exec>(b, wb);
      pa = wa.data();
      pb = wb.data();
    } else {
      pa = a.data();
      pb = b.data();
    }
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
    const float beta = accumulate ? 1.0f : 0.0f;
    for (std::int64_t i = 0; i < nb; ++i)
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
                  pa + i * m * k, lda, pb + i * k * n, ldb, beta, c.data() + i * m * n, static_cast<int>(n));
  }
#if defined(KOKKOS_ENABLE_CUDA)
  else if constexpr (std::is_same_v<Exec, Kokkos::Cuda>) {
    meshtensor::detail::cublas_batched_gemm_into_float<T>(kernels::instance<Exec>().cuda_stream(), nb, m, n, k, trans_a, trans_b,
                                                          a.data(), b.data(), c.data(), accumulate);
  }
#endif
  else {
    Kokkos::parallel_for(
        "meshtensor::product_into_float", kernels::range<Exec>(0, nb * m * n), KOKKOS_LAMBDA(std::int64_t idx) {
          const std::int64_t j = idx % n, i = (idx / n) % m, bi = idx / (m * n);
          float acc = 0;
          for (std::int64_t p = 0; p < k; ++p) {
            const float x = trans_a ? a(bi * m * k + p * m + i) : a(bi * m * k + i * k + p);
            const float y = trans_b ? b(bi * k * n + j * k + p) : b(bi * k * n + p * n + j);
            acc += x * y;
          }
          c(idx) = accumulate ? c(idx) + acc : acc;
        });
  }
}

// c = op(a) . op(b) per batch in TOut: kernels::product where TOut is T, else bf16 operands with
// float accumulation and output (product_into_float, beta 0): a sum that is reduced or carried on
// in float before it is rounded (einsum's partial sums, ring attention's tiles).
template <class Exec, class T, class TOut>
void product_to(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
                const Kokkos::View<T*, typename Exec::memory_space>& a,
                const Kokkos::View<T*, typename Exec::memory_space>& b,
                const Kokkos::View<TOut*, typename Exec::memory_space>& c) {
  if constexpr (std::is_same_v<T, TOut>)
    product<Exec, T>(nb, m, n, k, trans_a, trans_b, a, b, c);
  else
    product_into_float<Exec, T>(nb, m, n, k, trans_a, trans_b, a, b, c, false);
}

}  // namespace meshtensor::kernels
