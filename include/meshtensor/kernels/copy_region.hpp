#pragma once
// Copies a box-shaped region between two row-major buffers, in contiguous runs: the packing and
// unpacking around relayout's collectives. The runs are geometry's (runs_between in
// geometry/box.hpp: the innermost dims merged with every dim along which the region covers both
// buffers whole). One work item copies (a chunk of) one run, on a host; the index division is paid
// once per run, not per element. On a GPU one work item copies one element. The kernel is a named functor templated on (execution space,
// element type) only, so every rank and layout shares it (see docs/design/devices.md, kernels).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>

#include "../geometry/box.hpp"
#include "indexing.hpp"
#include "launch.hpp"
#include "walk.hpp"

namespace meshtensor::detail {

template <class T>
struct copy_runs_functor {
  const T* src;
  T* dst;
  std::int64_t s0, d0;       // offsets of the region's first element
  std::int64_t run;          // elements per run (contiguous in both buffers)
  std::int64_t chunk;        // elements per work item (<= run)
  std::int64_t chunks;       // work items per run
  int outer;                 // dims outside the run (after dropping extent-1 dims)
  kidx ext, sstride, dstride;  // of those dims

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    std::int64_t row = item, begin = 0;
    if (chunks > 1) {
      row = item / chunks;
      begin = (item - row * chunks) * chunk;
    }
    std::int64_t s = s0 + begin, d = d0 + begin;
    for (int i = outer - 1; i >= 0; --i) {
      const std::int64_t q = row / ext[i];
      const std::int64_t m = row - q * ext[i];
      row = q;
      s += m * sstride[i];
      d += m * dstride[i];
    }
    const std::int64_t n = run - begin < chunk ? run - begin : chunk;
    const T* __restrict__ sp = src + s;
    T* __restrict__ dp = dst + d;
    for (std::int64_t e = 0; e < n; ++e) dp[e] = sp[e];
  }
};

// Copies the elements of `region` (global coordinates) from a row-major buffer holding box sb at
// src[soff...] to one holding box db at dst[doff...]. Both buffers live in Exec's memory space.
// Does not fence.
template <class Exec, class T, std::size_t R>
void copy_region(const T* src, std::int64_t soff, const box<R>& sb, T* dst, std::int64_t doff, const box<R>& db,
                 const box<R>& region) {
  const std::int64_t n = region.size();
  if (n == 0) return;
  // The runs (geometry/box.hpp): the kernel only walks what they say.
  const box_runs runs = runs_between(region, sb, db);
  copy_runs_functor<T> f{src, dst, soff + runs.first_a, doff + runs.first_b, runs.length, 1, 1, runs.outer, {}, {}, {}};
  for (int i = 0; i < runs.outer; ++i) {
    f.ext[i] = runs.extent[i];
    f.sstride[i] = runs.stride_a[i];
    f.dstride[i] = runs.stride_b[i];
  }
  // Few long runs: cut them into chunks so that every thread gets work. On a GPU a chunk is one
  // element (walk.hpp): neighbouring threads copy neighbouring elements, as the map's do.
  const std::int64_t rows = runs.count;
  constexpr std::int64_t min_chunk = 1 << 14;
  const std::int64_t threads = Exec().concurrency();
  f.chunk = elements_per_item<typename Exec::memory_space>(f.run);
  if (f.chunk == f.run && rows < 4 * threads && f.run > min_chunk) {
    const std::int64_t want = (4 * threads + rows - 1) / rows;
    f.chunk = std::max<std::int64_t>(min_chunk, (f.run + want - 1) / want);
  }
  f.chunks = (f.run + f.chunk - 1) / f.chunk;
  kernels::parallel_for("meshtensor::copy_region", kernels::range<Exec>(0, rows * f.chunks), f);
}

}  // namespace meshtensor::detail
