#pragma once
// rope<Position, Feature>(x, config): rotary position embeddings (Su et al. 2021, RoFormer), in the
// rotate-half convention of Llama and Hugging Face transformers: with d the extent of Feature and
// h = d / 2, the features (i, i + h) of the element at global position p are rotated by the angle
// p * f_i, f_i = theta^(-2i/d) (rope_config::theta), optionally rescaled as Llama 3.1 does
// (rope_llama3_scaling). Positions are global: each processor rotates its elements at the indices
// the placement gives them (split, uneven, zigzag), plus rope_config::position_offset (the tokens
// before this call's first, a decoder's cache). Angles and their cosines and sines are computed in
// double; transformers computes them in float32, which differs from them by up to about 1e-7 of the
// position (6e-3 radians at position 131072).
// Feature must not be split (a pair's two halves on one processor); Position may be split in any
// way. Communication: none. Gradient: the rotation by the opposite angle (the rotation is
// orthogonal), nothing kept for it.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <type_traits>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../element/bf16.hpp"
#include "../element/kokkos_math.hpp"
#include "../geometry/box.hpp"
#include "../kernels/launch.hpp"
#include "../kernels/pool.hpp"
#include "../ops/op_call.hpp"
#include "../tensor/tensor.hpp"

namespace meshtensor {
namespace diagnostic {
template <class Feature>
struct rope_feature_dim_is_split {
  static_assert(sizeof(Feature) == 0,
                "meshtensor::nn::rope: the layout splits the rotated (Feature) dim, whose halves (i, i + d/2) "
                "are rotated together; keep it whole (split the heads, the batch or the positions instead)");
};
}  // namespace diagnostic

namespace nn {

// Llama 3.1's frequency scaling (transformers' rope_scaling of rope_type "llama3"): wavelengths
// above original_max_position / low_freq_factor are divided by factor, those below
// original_max_position / high_freq_factor are kept, and those between are interpolated.
struct rope_llama3_scaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192;
};

struct rope_config {
  double theta = 10000.0;  // transformers' rope_theta (Llama 3: 500000)
  std::optional<rope_llama3_scaling> llama3;
  std::int64_t position_offset = 0;  // the global position of index 0 of Position
};

// f_i for i < d / 2: the angle per position of features i and i + d / 2.
inline std::vector<double> rope_frequencies(std::int64_t d, const rope_config& c) {
  if (d <= 0 || d % 2 != 0)
    throw error(meshtensor::detail::cat("rope: the rotated dim's extent is ", d, "; it must be even and positive"));
  if (!(c.theta > 0)) throw error(meshtensor::detail::cat("rope: theta ", c.theta, " must be positive"));
  std::vector<double> f(static_cast<std::size_t>(d / 2));
  for (std::int64_t i = 0; i < d / 2; ++i)
    f[static_cast<std::size_t>(i)] = std::pow(c.theta, -static_cast<double>(2 * i) / static_cast<double>(d));
  if (c.llama3) {
    const auto& s = *c.llama3;
    if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0) ||
        !(s.original_max_position > 0))
      throw error(meshtensor::detail::cat("rope: llama3 scaling with factor ", s.factor, ", low_freq_factor ",
                                          s.low_freq_factor, ", high_freq_factor ", s.high_freq_factor,
                                          ", original_max_position ", s.original_max_position,
                                          ": needs factor > 0 and high_freq_factor > low_freq_factor > 0"));
    const double low_wavelength = s.original_max_position / s.low_freq_factor;
    const double high_wavelength = s.original_max_position / s.high_freq_factor;
    for (double& fi : f) {
      const double wavelength = 2 * std::numbers::pi / fi;
      if (wavelength > low_wavelength) {
        fi /= s.factor;
      } else if (wavelength >= high_wavelength) {
        const double smooth =
            (s.original_max_position / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        fi = (1 - smooth) * fi / s.factor + smooth * fi;
      }
    }
  }
  return f;
}

}  // namespace nn

namespace detail {

// The kernel depends on the space and element type only (rank and layout enter as numbers), so
// that q and k, and every layout, share it (compile time).
template <class Exec, class T, class View, class Table, class Positions>
void rope_kernel(const View& out, const View& in, std::int64_t n, std::int64_t feature_stride, std::int64_t d,
                 std::int64_t position_stride, std::int64_t positions, const Positions& position_of,
                 const Table& frequency, double sign) {
  using C = compute_t<T>;
  const std::int64_t half = d / 2;
  kernels::parallel_for(
      "meshtensor::rope", kernels::range<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t l) {
        const std::int64_t feature = (l / feature_stride) % d;
        const std::int64_t p = position_of((l / position_stride) % positions);
        const bool first = feature < half;
        const double angle = static_cast<double>(p) * frequency(first ? feature : feature - half);
        const C c = static_cast<C>(kmath::cos(angle)), s = static_cast<C>(sign * kmath::sin(angle));
        const C self = static_cast<C>(in(l));
        const C other = static_cast<C>(in(first ? l + half * feature_stride : l - half * feature_stride));
        out(l) = static_cast<T>(first ? self * c - other * s : self * c + other * s);
      });
}

// x rotated by +angle (inverse: by -angle, the gradient), not recorded.
template <Dim Position, Dim Feature, Tensor X>
X rope_impl(const X& x, const nn::rope_config& c, bool inverse) {
  using Exec = typename X::execution_space;
  using Mem = typename X::memory_space;
  constexpr std::size_t a_position = X::template index_of<Position>(), a_feature = X::template index_of<Feature>();
  const std::int64_t d = x.extents()[a_feature];
  const auto frequencies = nn::rope_frequencies(d, c);
  auto frequency_table = host_table<double>(frequencies.size());
  for (std::size_t i = 0; i < frequencies.size(); ++i) frequency_table(i) = frequencies[i];
  // The global position of each local index of Position: the placement's one range, or a zigzag
  // part's two.
  const auto p = x.placement();
  const auto ranges = p.ranges(a_position, p.part_at(a_position, x.mesh().communicator().coords()));
  const std::int64_t local_positions = x.local_extents()[a_position];
  auto position_table = host_table<std::int64_t>(static_cast<std::size_t>(local_positions));
  for (std::int64_t i = 0; i < local_positions; ++i)
    position_table(i) = c.position_offset + (i < ranges[0].extent[0] ? ranges[0].offset[0] + i
                                                                      : ranges[1].offset[0] + i - ranges[0].extent[0]);
  const auto strides = row_major_strides<X::rank>(x.local_extents());
  X out(x.mesh(), x.extents(), uninitialized);  // the kernel writes every element
  rope_kernel<Exec, typename X::value_type>(out.view(), x.view(), x.local_size(), strides[a_feature], d,
                                            strides[a_position], std::max<std::int64_t>(local_positions, 1),
                                            kernels::copy_to(Mem{}, position_table),
                                            kernels::copy_to(Mem{}, frequency_table), inverse ? -1.0 : 1.0);
  return out;
}

}  // namespace detail

namespace nn {

template <Dim Position, Dim Feature, Tensor X>
X rope(const X& x, const rope_config& c = {}) {
  static_assert(!std::is_same_v<Position, Feature>, "meshtensor::nn::rope<Position, Feature>: two different dims");
  if constexpr (X::layout_type::template split_of<Feature>().count > 0) {
    (void)sizeof(diagnostic::rope_feature_dim_is_split<Feature>);  // the one error: nothing below is compiled
    return x;
  } else {
    const meshtensor::detail::op_call call(meshtensor::detail::planned_op{"rope", comm_plan{}}, x);
    X out = meshtensor::detail::rope_impl<Position, Feature>(x, c, false);
    meshtensor::detail::record<X>(
        out,
        [x = meshtensor::detail::node_only(x), c](const X& g) {
          meshtensor::detail::push_grad(x, meshtensor::detail::rope_impl<Position, Feature>(g, c, true));
        },
        x);
    return out;
  }
}

}  // namespace nn
}  // namespace meshtensor
