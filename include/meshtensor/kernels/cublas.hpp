#pragma once
// einsum's batched products on a CUDA Kokkos: cuBLAS's strided batched gemm, in one call for every
// batch, on the stream of the execution space instance, so that nothing waits for the GPU between
// kernels. The handle is one per process, made on first use and destroyed as Kokkos finalizes
// (before the CUDA context goes). Without CUDA this header declares nothing.
#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>

#include <cstdint>
#include <type_traits>

#include "../element/bf16.hpp"
#include "../element/complex.hpp"
#include "../error.hpp"

namespace meshtensor::detail {

inline void check_cublas(cublasStatus_t status, const char* call, std::int64_t nb, std::int64_t m, std::int64_t n,
                         std::int64_t k) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw error(cat("meshtensor: einsum's ", call, " failed with cuBLAS status ", static_cast<int>(status),
                    " for ", nb, " products of (", m, " x ", k, ") by (", k, " x ", n, ")"));
}

inline cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h), "cublasCreate", 0, 0, 0, 0);
    Kokkos::push_finalize_hook([h] { cublasDestroy(h); });
    return h;
  }();
  return handle;
}

// cuBLAS takes int sizes.
inline void check_int_range(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t ld_a,
                            std::int64_t ld_b) {
  for (const std::int64_t v : {nb, m, n, k, ld_a, ld_b})
    if (v > INT32_MAX)
      throw error(cat("meshtensor: einsum's product has a size of ", v, ", past cuBLAS's int range, for ", nb,
                      " products of (", m, " x ", k, ") by (", k, " x ", n, ")"));
}

template <class T>
constexpr bool cublas_type_v = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> ||
                                std::is_same_v<T, complex<float>> || std::is_same_v<T, complex<double>>;

// C[b] (m x n) = op(A[b]) * op(B[b]) for every batch b, all row-major and contiguous in device
// memory. cuBLAS is column-major: a row-major buffer read column-major is its transpose, so this
// computes C^T = op(B)^T op(A)^T with the operands swapped.
template <class T>
void cublas_batched_gemm(cudaStream_t stream, std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k,
                         bool trans_a, bool trans_b, const T* a, const T* b, T* c) {
  const cublasHandle_t h = cublas_handle();
  check_cublas(cublasSetStream(h, stream), "cublasSetStream", nb, m, n, k);
  const auto op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::int64_t ld_b = trans_b ? k : n, ld_a = trans_a ? m : k;
  check_int_range(nb, m, n, k, ld_a, ld_b);
  const compute_t<T> one = 1, zero = 0;
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, bf16>)  // bf16 in and out, float accumulation (tensor cores)
    check_cublas(cublasGemmStridedBatchedEx(h, op_b, op_a, i(n), i(m), i(k), &one, b, CUDA_R_16BF, i(ld_b), k * n, a,
                                            CUDA_R_16BF, i(ld_a), m * k, &zero, c, CUDA_R_16BF, i(n), m * n, i(nb),
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx (bf16)", nb, m, n, k);
  else if constexpr (std::is_same_v<T, float>)
    check_cublas(cublasSgemmStridedBatched(h, op_b, op_a, i(n), i(m), i(k), &one, b, i(ld_b), k * n, a, i(ld_a),
                                           m * k, &zero, c, i(n), m * n, i(nb)),
                 "cublasSgemmStridedBatched", nb, m, n, k);
  else if constexpr (std::is_same_v<T, double>)
    check_cublas(cublasDgemmStridedBatched(h, op_b, op_a, i(n), i(m), i(k), &one, b, i(ld_b), k * n, a, i(ld_a),
                                           m * k, &zero, c, i(n), m * n, i(nb)),
                 "cublasDgemmStridedBatched", nb, m, n, k);
  else if constexpr (std::is_same_v<T, complex<float>>)  // cuComplex: re, im, as Kokkos::complex
    check_cublas(cublasCgemmStridedBatched(h, op_b, op_a, i(n), i(m), i(k), reinterpret_cast<const cuComplex*>(&one),
                                           reinterpret_cast<const cuComplex*>(b), i(ld_b), k * n,
                                           reinterpret_cast<const cuComplex*>(a), i(ld_a), m * k,
                                           reinterpret_cast<const cuComplex*>(&zero), reinterpret_cast<cuComplex*>(c),
                                           i(n), m * n, i(nb)),
                 "cublasCgemmStridedBatched", nb, m, n, k);
  else
    check_cublas(cublasZgemmStridedBatched(
                     h, op_b, op_a, i(n), i(m), i(k), reinterpret_cast<const cuDoubleComplex*>(&one),
                     reinterpret_cast<const cuDoubleComplex*>(b), i(ld_b), k * n, reinterpret_cast<const cuDoubleComplex*>(a),
                     i(ld_a), m * k, reinterpret_cast<const cuDoubleComplex*>(&zero), reinterpret_cast<cuDoubleComplex*>(c),
                     i(n), m * n, i(nb)),
                 "cublasZgemmStridedBatched", nb, m, n, k);
}


// The same into float C, for float or bf16 A and B (float compute; tensor cores for bf16), with
// beta = 1 where accumulate: a weight's gradient added into its float buffer by the product itself.
template <class T>
void cublas_batched_gemm_into_float(cudaStream_t stream, std::int64_t nb, std::int64_t m, std::int64_t n,
                                    std::int64_t k, bool trans_a, bool trans_b, const T* a, const T* b, float* c,
                                    bool accumulate) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>);
  const cublasHandle_t h = cublas_handle();
  check_cublas(cublasSetStream(h, stream), "cublasSetStream", nb, m, n, k);
  const auto op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::int64_t ld_b = trans_b ? k : n, ld_a = trans_a ? m : k;
  check_int_range(nb, m, n, k, ld_a, ld_b);
  const float one = 1, beta = accumulate ? 1.0f : 0.0f;
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  constexpr cudaDataType_t in = std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_32F;
  check_cublas(cublasGemmStridedBatchedEx(h, op_b, op_a, i(n), i(m), i(k), &one, b, in, i(ld_b), k * n, a, in, i(ld_a),
                                          m * k, &beta, c, CUDA_R_32F, i(n), m * n, i(nb), CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx (into float)", nb, m, n, k);
}

}  // namespace meshtensor::detail
#endif
