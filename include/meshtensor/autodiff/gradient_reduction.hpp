#pragma once
// How the backward pass reduces the weight gradients that are still partial sums over processors:
// buckets, in place, nonblocking (gradient.hpp's buckets, and relayout's reduce_scatter for a
// sharded parameter). Read once from the environment; set_gradient_reduction changes it.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../error.hpp"

namespace meshtensor {
// How gradient() reduces the weight gradients that are still partial sums (docs/ops.md,
// "Autodiff"; docs/performance.md has the measurements behind the defaults). Must be the same on
// every processor.
struct gradient_reduction {
  // Gradients of at least this many bytes are reduced alone, in place, as soon as they are final:
  // copying them into a bucket and back costs more than the call it saves.
  std::int64_t in_place_bytes = std::int64_t{64} << 10;
  // Smaller ones are copied into buckets of up to this many bytes, one allreduce per bucket
  // (MESHTENSOR_GRADIENT_BUCKET_MB). 0: each alone.
  std::int64_t bucket_bytes = std::int64_t{32} << 20;
  // MPI_Iallreduce, progressed while the backward pass goes on, instead of MPI_Allreduce
  // (MESHTENSOR_GRADIENT_OVERLAP=1); and a sharded parameter's reduce_scatter (gather_for_use's
  // gradient) started nonblocking too, landing in the parameter's gradient before it is read.
  // Off by default: on the machine measured, Open MPI's nonblocking allreduce cost more than the
  // overlap saved.
  bool overlap = false;
  // Under overlap, how many sharded parameters' sums may be on their way at once: starting one
  // more first lands the oldest. Each holds its packed addend (the gathered weight's gradient,
  // whole) until it lands, so without a bound a pass would hold every layer's at its end, the
  // memory that sharding saves (planned: 29.8 GiB against 6.4 for a 32-layer, d_model 4096 model
  // on [64 x 1]). Two: one moving while the pass makes the next.
  int sums_in_flight = 2;
};

namespace detail {
inline gradient_reduction& gradient_reduction_setting() {
  static gradient_reduction r = [] {
    gradient_reduction d;
    if (const char* v = std::getenv("MESHTENSOR_GRADIENT_BUCKET_MB"); v && *v)
      d.bucket_bytes = static_cast<std::int64_t>(std::max(std::atof(v), 0.0) * 1048576.0);
    if (const char* v = std::getenv("MESHTENSOR_GRADIENT_OVERLAP"); v && *v) d.overlap = std::string(v) != "0";
    return d;
  }();
  return r;
}
}  // namespace detail

inline const gradient_reduction& gradient_reduction_settings() { return detail::gradient_reduction_setting(); }
inline void set_gradient_reduction(const gradient_reduction& r) {
  if (r.in_place_bytes < 0 || r.bucket_bytes < 0)
    throw error(detail::cat("set_gradient_reduction: in_place_bytes ", r.in_place_bytes, " and bucket_bytes ",
                            r.bucket_bytes, " must not be negative"));
  if (r.sums_in_flight < 1)
    throw error(detail::cat("set_gradient_reduction: sums_in_flight ", r.sums_in_flight,
                            " must be at least 1 (the sum just started)"));
  detail::gradient_reduction_setting() = r;
}

}  // namespace meshtensor
