#pragma once
// FFTW plans for the local transforms of fft/fft.hpp. A slice is row-major; a transform runs over
// some of its dims (each an extent and its input and output strides) for every position of the
// others (FFTW's "howmany" loops): one guru plan for the whole slice, which FFTW orders for the
// cache itself (a 2-D transform of contiguous planes, not two passes of strided 1-D ones). Plans
// are made once per (kind, transform dims, loop dims, alignment) with FFTW_ESTIMATE (no timing
// runs: the same plan on every rank and every run, so results are reproducible), then executed on
// any arrays by FFTW's new-array interface, which requires the arrays' SIMD alignment to be the
// plan's. Arrays both SIMD-aligned (every allocation of the library is: Kokkos aligns to 64 bytes)
// get a plan made on aligned arrays, with FFTW's SIMD codelets; others (a slice at an odd offset)
// one made with FFTW_UNALIGNED, which FFTW's manual says disables most SIMD. FFTW's planner is not
// thread-safe: plans are made under a mutex. They live until exit: a program that calls fftw_cleanup() itself must do so only
// after its last transform.
#include <fftw3.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "../error.hpp"

namespace meshtensor::detail::fftw {

enum class kind { forward, backward, real_to_complex, complex_to_real };

// One dim of a transform or of its loops: extent, input stride, output stride (in elements).
struct dim {
  std::int64_t n, in_stride, out_stride;
  friend auto operator<=>(const dim&, const dim&) = default;
};

// FFTW's API per precision: fftw_* for double, fftwf_* for float.
template <class R>
struct api;
template <>
struct api<double> {
  using plan = fftw_plan;
  using cpx = fftw_complex;
  using iodim = fftw_iodim64;
  static constexpr auto guru_dft = fftw_plan_guru64_dft;
  static constexpr auto guru_r2c = fftw_plan_guru64_dft_r2c;
  static constexpr auto guru_c2r = fftw_plan_guru64_dft_c2r;
  static constexpr auto execute_dft = fftw_execute_dft;
  static constexpr auto execute_r2c = fftw_execute_dft_r2c;
  static constexpr auto execute_c2r = fftw_execute_dft_c2r;
  static constexpr auto alignment_of = fftw_alignment_of;
};
template <>
struct api<float> {
  using plan = fftwf_plan;
  using cpx = fftwf_complex;
  using iodim = fftwf_iodim64;
  static constexpr auto guru_dft = fftwf_plan_guru64_dft;
  static constexpr auto guru_r2c = fftwf_plan_guru64_dft_r2c;
  static constexpr auto guru_c2r = fftwf_plan_guru64_dft_c2r;
  static constexpr auto execute_dft = fftwf_execute_dft;
  static constexpr auto execute_r2c = fftwf_execute_dft_r2c;
  static constexpr auto execute_c2r = fftwf_execute_dft_c2r;
  static constexpr auto alignment_of = fftwf_alignment_of;
};

// The plan for transforms over `dims` (logical extents: a real signal's for real_to_complex and
// complex_to_real, whose complex side holds n / 2 + 1 values along the last) at every position of
// `loops`; `aligned`: for arrays at FFTW's SIMD alignment (see above).
template <class R>
typename api<R>::plan plan_for(kind k, const std::vector<dim>& dims, const std::vector<dim>& loops, bool aligned) {
  using A = api<R>;
  static std::mutex mu;
  static std::map<std::tuple<kind, std::vector<dim>, std::vector<dim>, bool>, typename A::plan> plans;
  const std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(k, dims, loops, aligned);
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  const auto to_fftw = [](const std::vector<dim>& v) {
    std::vector<typename A::iodim> out;
    for (const dim& d : v) out.push_back({d.n, d.in_stride, d.out_stride});
    return out;
  };
  const auto fd = to_fftw(dims), fl = to_fftw(loops);
  const int rank = static_cast<int>(fd.size()), loop_rank = static_cast<int>(fl.size());
  const unsigned flags = FFTW_ESTIMATE | (aligned ? 0u : FFTW_UNALIGNED) |
                         (k == kind::complex_to_real ? FFTW_DESTROY_INPUT : 0u);
  // The planner reads no data under FFTW_ESTIMATE; it needs distinct arrays (out of place), each at
  // the SIMD alignment (64 bytes covers every x86 SIMD width) for the aligned plan.
  alignas(64) static typename A::cpx probe_in[4], probe_out[4];
  typename A::plan p{};
  switch (k) {
    case kind::forward:
    case kind::backward:
      p = A::guru_dft(rank, fd.data(), loop_rank, fl.data(), probe_in, probe_out,
                      k == kind::forward ? FFTW_FORWARD : FFTW_BACKWARD, flags);
      break;
    case kind::real_to_complex:
      p = A::guru_r2c(rank, fd.data(), loop_rank, fl.data(), reinterpret_cast<R*>(probe_in), probe_out, flags);
      break;
    case kind::complex_to_real:
      p = A::guru_c2r(rank, fd.data(), loop_rank, fl.data(), probe_in, reinterpret_cast<R*>(probe_out), flags);
      break;
  }
  if (!p) {
    std::string shape;
    for (const dim& d : dims) shape += cat(shape.empty() ? "" : " x ", d.n);
    throw error(cat("meshtensor: FFTW made no plan for a transform of ", shape, " over ", loops.size(), " loop dims"));
  }
  plans.emplace(std::move(key), p);
  return p;
}

// Runs the transforms from `in` into `out` (distinct host arrays; complex_to_real overwrites its
// input). Nothing to do where a dim is empty.
template <class R>
void execute(kind k, const std::vector<dim>& dims, const std::vector<dim>& loops, const void* in, void* out) {
  for (const auto* v : {&dims, &loops})
    for (const dim& d : *v)
      if (d.n == 0) return;
  using A = api<R>;
  auto* ci = reinterpret_cast<typename A::cpx*>(const_cast<void*>(in));  // FFTW's signature is not const
  auto* co = reinterpret_cast<typename A::cpx*>(out);
  const bool aligned = A::alignment_of(reinterpret_cast<R*>(ci)) == 0 && A::alignment_of(reinterpret_cast<R*>(co)) == 0;
  const auto p = plan_for<R>(k, dims, loops, aligned);
  switch (k) {
    case kind::forward:
    case kind::backward: A::execute_dft(p, ci, co); break;
    case kind::real_to_complex: A::execute_r2c(p, reinterpret_cast<R*>(ci), co); break;
    case kind::complex_to_real: A::execute_c2r(p, ci, reinterpret_cast<R*>(co)); break;
  }
}

}  // namespace meshtensor::detail::fftw
