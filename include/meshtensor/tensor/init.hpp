#pragma once
// Initialisers. Every value is a function of the global index (and the seed), never of the slice,
// so a tensor is the same global tensor under every layout and every number of processors.
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>

#include "../kernels/indexing.hpp"
#include "tensor.hpp"
#include "../element/kokkos_math.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace detail {
// splitmix64: a counter-based generator, cheap and well mixed, usable inside kernels.
KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) with 53 random bits.
KOKKOS_INLINE_FUNCTION double uniform01(std::uint64_t seed, std::uint64_t index, std::uint64_t stream) {
  const std::uint64_t h = mix64(mix64(seed * 0x100000001B3ull + stream) ^ index);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

// The kernel depends on the space, element type, rank and functor, not on the layout, so that
// initialisers under many layouts share it (compile time).
template <class Exec, class T, std::size_t R, class F>
void fill_kernel(const Kokkos::View<T*, typename Exec::memory_space>& v, std::int64_t n, const local_to_global<R>& map,
                 F f) {
  kernels::parallel_for(
      "meshtensor::init", kernels::range<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t l) { v(l) = f(map(l)); });
}

// The map from t's local flat index to its global one, under any layout: each dim's ranges from
// the placement (a zigzag dim's two: the map jumps from the first to the second), so that a
// function of the global index (an initialiser, dropout's mask) is the same under every layout.
template <Tensor TT>
local_to_global<TT::rank> global_index_map_of(const TT& t) {
  const auto p = t.placement();
  const auto& coords = t.mesh().communicator().coords();
  std::array<std::int64_t, TT::rank> first{}, second{}, jump{};
  for (std::size_t d = 0; d < TT::rank; ++d) {
    const auto r = p.ranges(d, p.part_at(d, coords));
    first[d] = r[0].offset[0];
    second[d] = r[0].extent[0];
    jump[d] = r[1].offset[0] - (r[0].offset[0] + r[0].extent[0]);
  }
  return local_to_global<TT::rank>(t.local_extents(), first, t.extents(), second, jump);
}

template <Tensor TT, class F>
TT fill_by_global_index(const typename TT::mesh_type& m, const typename TT::extents_type& extents, F f) {
  TT t(m, extents, uninitialized);  // the kernel writes every element
  fill_kernel<typename TT::execution_space>(t.view(), t.local_size(), global_index_map_of(t), f);
  return t;
}

template <class T>
struct iota_fn {
  T start, step;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t g) const { return static_cast<T>(start + static_cast<T>(g) * step); }
};
template <class T>
struct uniform_fn {
  std::uint64_t seed;
  double low, high;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t g) const {
    return static_cast<T>(low + (high - low) * uniform01(seed, static_cast<std::uint64_t>(g), 0));
  }
};
// Box-Muller on two independent uniform streams of the same index.
template <class T>
struct normal_fn {
  std::uint64_t seed;
  double mean, stddev;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t g) const {
    const double u1 = 1.0 - uniform01(seed, static_cast<std::uint64_t>(g), 1);
    const double u2 = uniform01(seed, static_cast<std::uint64_t>(g), 2);
    return static_cast<T>(mean + stddev * kmath::sqrt(-2.0 * kmath::log(u1)) *
                                     kmath::cos(6.283185307179586 * u2));
  }
};
// f of the global multi-index, from the global row-major index (Kokkos::Array: std::array's
// operator[] is not callable on the device without nvcc's relaxed constexpr).
template <std::size_t R, class F>
struct at_multi_index {
  Kokkos::Array<std::int64_t, R> extents;
  F f;
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t g) const {
    Kokkos::Array<std::int64_t, R> index;
    for (std::size_t d = R; d-- > 0;) {
      index[d] = g % extents[d];
      g /= extents[d];
    }
    return f(index);
  }
};
}  // namespace detail

template <Tensor TT>
TT zeros(const typename TT::mesh_type& m, const typename TT::extents_type& extents) {
  return TT(m, extents);
}

template <Tensor TT>
TT full(const typename TT::mesh_type& m, const typename TT::extents_type& extents, typename TT::value_type value) {
  TT t(m, extents, uninitialized);
  kernels::deep_copy(typename TT::execution_space{}, t.view(), value);
  return t;
}

// Element i (global row-major index) holds start + i * step.
template <Tensor TT>
TT iota(const typename TT::mesh_type& m, const typename TT::extents_type& extents,
        typename TT::value_type start = 0, typename TT::value_type step = 1) {
  return detail::fill_by_global_index<TT>(m, extents, detail::iota_fn<typename TT::value_type>{start, step});
}

// Element (i0, i1, ...) holds f(index), index a Kokkos::Array of the global indices in the tensor's
// dims' order: a field from its coordinates (a simulation's initial state or source term), the same
// global tensor under every layout. f runs in the tensor's execution space: a functor whose call
// operator is KOKKOS_INLINE_FUNCTION, or a KOKKOS_LAMBDA.
//   auto f = mt::generate<field>(g, {nx, ny}, KOKKOS_LAMBDA(const Kokkos::Array<std::int64_t, 2>& i) {
//     return std::sin(pi * double(i[0]) / nx) * std::sin(pi * double(i[1]) / ny); });
template <Tensor TT, class F>
TT generate(const typename TT::mesh_type& m, const typename TT::extents_type& extents, F f) {
  detail::at_multi_index<TT::rank, F> at{{}, f};
  for (std::size_t d = 0; d < TT::rank; ++d) at.extents[d] = extents[d];
  return detail::fill_by_global_index<TT>(m, extents, at);
}

template <Tensor TT>
TT random_uniform(const typename TT::mesh_type& m, const typename TT::extents_type& extents, std::uint64_t seed,
                  double low = 0.0, double high = 1.0) {
  return detail::fill_by_global_index<TT>(m, extents, detail::uniform_fn<typename TT::value_type>{seed, low, high});
}

template <Tensor TT>
TT random_normal(const typename TT::mesh_type& m, const typename TT::extents_type& extents, std::uint64_t seed,
                 double mean = 0.0, double stddev = 1.0) {
  return detail::fill_by_global_index<TT>(m, extents, detail::normal_fn<typename TT::value_type>{seed, mean, stddev});
}

}  // namespace meshtensor
