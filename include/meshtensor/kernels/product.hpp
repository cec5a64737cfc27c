#pragma once
// kernels::product: C[b] (m x n) = op(A[b]) * op(B[b]) for every batch b, all row-major and
// contiguous, for einsum (ops/einsum.hpp). The provider is chosen at build time per execution space
// and element type:
//   host, bf16      oneDNN's matmul (bf16 in and out, float accumulation; AVX512_BF16 or AMX where
//                   the CPU has them) when built with it (MESHTENSOR_DNNL) and the job's agreed ISA
//                   is AVX-512 (runtime/cpu_isa.hpp), else the portable path: the operands widened
//                   to float, OpenBLAS's sgemm, the product rounded once
//   host, float     oneDNN's matmul on AVX-512 cores when built with it (dnnl_provider::
//                   float_products: faster there at every measured shape), else OpenBLAS's sgemm
//   A shape oneDNN cannot make a primitive for takes the other path, decided when it is first asked
//   for and cached (dnnl_provider::matmul), never tried and caught per call.
//   host, double    OpenBLAS (cblas dgemm)
//   host, complex   OpenBLAS (cblas cgemm, zgemm): element/complex.hpp's layout is BLAS's
//   CUDA            cuBLAS's strided batched gemm (kernels/cublas.hpp)
//   elsewhere       a Kokkos loop
// MESHTENSOR_KERNELS=portable (read once) turns oneDNN off at run time, for comparisons and tests.
// While planning, the product's multiply-adds are counted instead (plan/ledger.hpp).
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <mutex>
#include <type_traits>

#include "../element/bf16.hpp"
#include "../element/complex.hpp"
#include "../error.hpp"
#include "pool.hpp"
#include "cublas.hpp"
#include "dnnl.hpp"
#include "launch.hpp"

namespace meshtensor::kernels {

template <class T>
constexpr bool blas_type_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                              std::is_same_v<T, complex<float>> || std::is_same_v<T, complex<double>>;

template <class Exec>
constexpr bool host_space_v = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;

namespace detail {
template <class Exec, class From, class To>
void convert(const Kokkos::View<From*, typename Exec::memory_space>& from, const Kokkos::View<To*, typename Exec::memory_space>& to) {
  Kokkos::parallel_for("meshtensor::product_convert", kernels::range<Exec>(0, static_cast<std::int64_t>(from.extent(0))),
                       KOKKOS_LAMBDA(std::int64_t i) { to(i) = from(i); });
}
}  // namespace detail

// Whether a bf16 product on Exec widens its operands to float (the portable path below): on the
// host without oneDNN's bf16 kernels (a CPU without AVX512_BF16 or AMX, or a build without oneDNN).
template <class Exec, class T>
bool widens_to_float() {
  if constexpr (host_space_v<Exec> && std::is_same_v<T, bf16>) {
#if MESHTENSOR_HAVE_DNNL
    return !dnnl_provider::has_bf16();
#else
    return true;
#endif
  } else {
    return false;
  }
}

template <class Exec, class T>
void product(std::int64_t nb, std::int64_t m, std::int64_t n, std::int64_t k, bool trans_a, bool trans_b,
             const Kokkos::View<T*, typename Exec::memory_space>& a, const Kokkos::View<T*, typename Exec::memory_space>& b,
             const Kokkos::View<T*, typename Exec::memory_space>& c) {
  // A plan of this machine's run counts the widened operands and result while the product runs,
  // as the run holds them.
  if (meshtensor::detail::planning() && widens_to_float<Exec, T>() &&
      meshtensor::detail::plan_ledger::get().counts_host_scratch) {
    using Mem = typename Exec::memory_space;
    const meshtensor::detail::temporary_view<float, Mem> wa(a.extent(0)), wb(b.extent(0)), wc(c.extent(0));
    planned_away({{nb, m, n, k, true}});
    return;
  }
  // a multiply and an add per (batch, row, column, contracted index)
  if (planned_away({{nb, m, n, k, std::is_same_v<T, bf16>}})) return;
  if (nb == 0 || m == 0 || n == 0) return;
  if constexpr (host_space_v<Exec> && std::is_same_v<T, bf16>) {
#if MESHTENSOR_HAVE_DNNL
    if (dnnl_provider::has_bf16()) {
      Exec().fence();  // oneDNN runs on its own threads: Kokkos's writes to a and b come first
      if (dnnl_provider::matmul(nb, m, n, k, trans_a, trans_b, a.data(), b.data(), c.data())) return;
    }
#endif
    // Debian's OpenBLAS 0.3.21 declares cblas_sbgemm but is built without it: the operands widened
    // to float, sgemm, the product rounded once (the arithmetic of a bf16 GEMM with float
    // accumulation, at float's speed plus the conversions).
    using F = Kokkos::View<float*, typename Exec::memory_space>;
    auto& pool = meshtensor::detail::view_pool<float, typename Exec::memory_space>::get();
    const F wa = pool.allocate(a.extent(0)), wb = pool.allocate(b.extent(0)), wc = pool.allocate(c.extent(0));
    detail::convert<Exec>(a, wa);
    detail::convert<Exec>(b, wb);
    product<Exec, float>(nb, m, n, k, trans_a, trans_b, wa, wb, wc);
    detail::convert<Exec>(wc, c);
  } else if constexpr (host_space_v<Exec> && blas_type_v<T>) {
#if MESHTENSOR_HAVE_DNNL
    if (std::is_same_v<T, float> && k > 0 && dnnl_provider::float_products()) {
      Exec().fence();
      if (dnnl_provider::matmul(nb, m, n, k, trans_a, trans_b, a.data(), b.data(), c.data())) return;
    }
#endif
    if (k == 0) {
      Kokkos::deep_copy(c, T(0));
      return;
    }
    const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
    for (std::int64_t i = 0; i < nb; ++i) {
      const T* pa = a.data() + i * m * k;
      const T* pb = b.data() + i * k * n;
      T* pc = c.data() + i * m * n;
      if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, pa,
                    lda, pb, ldb, 0.0f, pc, static_cast<int>(n));
      else if constexpr (std::is_same_v<T, double>)
        cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, pa,
                    lda, pb, ldb, 0.0, pc, static_cast<int>(n));
      else {  // complex: alpha and beta by address
        const T one(1), zero(0);
        if constexpr (std::is_same_v<T, complex<float>>)
          cblas_cgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, pa,
                      lda, pb, ldb, &zero, pc, static_cast<int>(n));
        else
          cblas_zgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, pa,
                      lda, pb, ldb, &zero, pc, static_cast<int>(n));
      }
    }
  }
#if defined(KOKKOS_ENABLE_CUDA)
  else if constexpr (std::is_same_v<Exec, Kokkos::Cuda> && meshtensor::detail::cublas_type_v<T>) {
    // cuBLAS scales C by beta = 0 when k is 0.
    meshtensor::detail::cublas_batched_gemm<T>(kernels::instance<Exec>().cuda_stream(), nb, m, n, k, trans_a, trans_b, a.data(), b.data(),
                                               c.data());
  }
#endif
  else {
    Kokkos::parallel_for(
        "meshtensor::product", kernels::range<Exec>(0, nb * m * n), KOKKOS_LAMBDA(std::int64_t idx) {
          const std::int64_t j = idx % n, i = (idx / n) % m, bi = idx / (m * n);
          compute_t<T> acc = 0;
          for (std::int64_t p = 0; p < k; ++p) {
            const compute_t<T> x = trans_a ? a(bi * m * k + p * m + i) : a(bi * m * k + i * k + p);
            const compute_t<T> y = trans_b ? b(bi * k * n + j * k + p) : b(bi * k * n + p * n + j);
            acc += x * y;
          }
          c(idx) = acc;
        });
  }
}

// What runs the local work of host execution spaces in this build and run, and why, in words (for
// programs' and benchmarks' reports), e.g. "oneDNN 2.6.3 on avx512_core_amx (the ISA 4 ranks agreed
// on; this rank's: avx512_core_amx): float and bf16 products, float and bf16 convolutions".
inline std::string describe() {
#if MESHTENSOR_HAVE_DNNL
  if (!dnnl_provider::enabled()) return "portable (MESHTENSOR_KERNELS=portable): OpenBLAS products, unfold convolutions";
  const auto& isa = meshtensor::cpu_isa();
  const auto* v = dnnl::version();
  std::string why = isa.agreed ? meshtensor::detail::cat("the ISA ", isa.ranks, isa.ranks == 1 ? " rank" : " ranks",
                                                         " agreed on; this rank's: ", name_of(isa.this_cpu))
                               : std::string("this process's ISA, not agreed: no meshtensor::environment");
  std::string s = meshtensor::detail::cat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " on ", dnnl_provider::isa_name(),
                                          " (", why, "): ");
  if (dnnl_provider::avx512())
    s += "float and bf16 products, float and bf16 convolutions";
  else
    s += meshtensor::detail::cat(
        "float convolutions; float products on ", dnnl_provider::float_products() ? "oneDNN" : "OpenBLAS",
        ", bf16 products and convolutions portable (widened to float, one rounding): oneDNN 2.x has no bf16 kernels "
        "and no brgemm matmul below avx512_core");
  if (!isa.openblas_core.empty())
    s += isa.openblas_cores_agree
             ? meshtensor::detail::cat("; OpenBLAS's kernels: ", isa.openblas_core, " on every rank")
             : meshtensor::detail::cat("; OpenBLAS's kernels differ between ranks (this rank's: ", isa.openblas_core,
                                       "), so float products run on oneDNN (replicas round alike); double and "
                                       "complex products stay on OpenBLAS and may round differently per rank");
  auto& r = dnnl_provider::matmul_refusals();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.shapes > 0)
    s += meshtensor::detail::cat("; ", r.shapes, r.shapes == 1 ? " product shape" : " product shapes",
                                 " oneDNN refused ran portable (first: ", r.first, ")");
  return s;
#else
  return "portable (built without oneDNN): OpenBLAS products, unfold convolutions";
#endif
}

}  // namespace meshtensor::kernels
