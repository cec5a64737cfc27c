#pragma once
// FFTW plans for the local transforms of fft/fft.hpp: every 1-D transform along one dim of a
// row-major slice [outer, n, inner], as one guru plan (a loop of outer x inner transforms of length
// n, stride inner). Plans are made once per (kind, precision, n, outer, inner, direction) with
// FFTW_ESTIMATE (no timing runs: the same plan on every rank and every run, so results are
// reproducible) and FFTW_UNALIGNED, then executed on any arrays by FFTW's new-array interface.
// FFTW's planner is not thread-safe: plans are made under a mutex. The plans live until exit.
#include <fftw3.h>

#include <complex>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "../element/complex.hpp"
#include "../error.hpp"

namespace meshtensor::detail::fftw {

enum class kind { forward, backward, real_to_complex, complex_to_real };

// FFTW's API per precision: fftw_* for double, fftwf_* for float.
template <class R>
struct api;
template <>
struct api<double> {
  using plan = fftw_plan;
  using cpx = fftw_complex;
  static constexpr auto guru_dft = fftw_plan_guru64_dft;
  static constexpr auto guru_r2c = fftw_plan_guru64_dft_r2c;
  static constexpr auto guru_c2r = fftw_plan_guru64_dft_c2r;
  static constexpr auto execute_dft = fftw_execute_dft;
  static constexpr auto execute_r2c = fftw_execute_dft_r2c;
  static constexpr auto execute_c2r = fftw_execute_dft_c2r;
  using iodim = fftw_iodim64;
};
template <>
struct api<float> {
  using plan = fftwf_plan;
  using cpx = fftwf_complex;
  static constexpr auto guru_dft = fftwf_plan_guru64_dft;
  static constexpr auto guru_r2c = fftwf_plan_guru64_dft_r2c;
  static constexpr auto guru_c2r = fftwf_plan_guru64_dft_c2r;
  static constexpr auto execute_dft = fftwf_execute_dft;
  static constexpr auto execute_r2c = fftwf_execute_dft_r2c;
  static constexpr auto execute_c2r = fftwf_execute_dft_c2r;
  using iodim = fftwf_iodim64;
};

// The plan for transforms of length n (the logical length: a real signal's for real_to_complex
// and complex_to_real, whose complex side holds n / 2 + 1 values) along the middle of
// [outer, n, inner].
template <class R>
typename api<R>::plan plan_for(kind k, std::int64_t n, std::int64_t outer, std::int64_t inner) {
  using A = api<R>;
  static std::mutex mu;
  static std::map<std::tuple<kind, std::int64_t, std::int64_t, std::int64_t>, typename A::plan> plans;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(k, n, outer, inner);
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  const std::int64_t half = n / 2 + 1;
  // Element strides: a transform's elements lie `inner` apart; the outer blocks n * inner apart on
  // the real or full side and half * inner on the half-spectrum side.
  const std::int64_t in_block = (k == kind::complex_to_real ? half : n) * inner;
  const std::int64_t out_block = (k == kind::real_to_complex ? half : n) * inner;
  typename A::iodim dims{n, inner, inner};
  typename A::iodim loops[2] = {{outer, in_block, out_block}, {inner, 1, 1}};
  const unsigned flags = FFTW_ESTIMATE | FFTW_UNALIGNED | (k == kind::complex_to_real ? FFTW_DESTROY_INPUT : 0u);
  // The planner reads no data under FFTW_ESTIMATE; it needs non-null arrays of the right kind.
  alignas(64) static typename A::cpx probe[2];
  typename A::plan p{};
  switch (k) {
    case kind::forward:
    case kind::backward:
      p = A::guru_dft(1, &dims, 2, loops, probe, probe + 1, k == kind::forward ? FFTW_FORWARD : FFTW_BACKWARD, flags);
      break;
    case kind::real_to_complex:
      p = A::guru_r2c(1, &dims, 2, loops, reinterpret_cast<R*>(probe), probe + 1, flags);
      break;
    case kind::complex_to_real:
      p = A::guru_c2r(1, &dims, 2, loops, probe, reinterpret_cast<R*>(probe + 1), flags);
      break;
  }
  if (!p)
    throw error(cat("meshtensor: FFTW made no plan for ", outer * inner, " transforms of length ", n,
                    " (stride ", inner, ")"));
  plans.emplace(key, p);
  return p;
}

// Runs the plan's transforms from `in` into `out` (host arrays; distinct for complex_to_real,
// whose input FFTW overwrites).
template <class R>
void execute(kind k, std::int64_t n, std::int64_t outer, std::int64_t inner, const void* in, void* out) {
  if (n == 0 || outer == 0 || inner == 0) return;
  using A = api<R>;
  const auto p = plan_for<R>(k, n, outer, inner);
  auto* ci = reinterpret_cast<typename A::cpx*>(const_cast<void*>(in));  // FFTW's signature is not const
  auto* co = reinterpret_cast<typename A::cpx*>(out);
  switch (k) {
    case kind::forward:
    case kind::backward: A::execute_dft(p, ci, co); break;
    case kind::real_to_complex: A::execute_r2c(p, reinterpret_cast<R*>(ci), co); break;
    case kind::complex_to_real: A::execute_c2r(p, ci, reinterpret_cast<R*>(co)); break;
  }
}

}  // namespace meshtensor::detail::fftw
