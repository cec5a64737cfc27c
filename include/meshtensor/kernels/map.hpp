#pragma once
// A broadcasting elementwise kernel instantiated per (space, functor, element types) only, not per
// tensor type: operands carry their broadcast strides as values. The tensor-typed wrapper (map_to,
// ops/detail/map_to.hpp) is host glue, so an op instantiated for many layouts emits one Kokkos kernel, not one per layout.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../runtime/cpu_isa.hpp"
#include "indexing.hpp"
#include "launch.hpp"
#include "walk.hpp"

// Host builds by g++ with optimisation compile the common case of a map (every operand laid out as
// the output) three times: for the x86-64 baseline (SSE2), AVX2 and AVX-512, picked per kernel from
// the job's agreed ISA (runtime/cpu_isa.hpp), as PyTorch's kernels are picked from the CPU's. A
// header-only library is compiled for the baseline unless its user says otherwise, so without this
// an elementwise op ran 4 floats at a time on a CPU that takes 16. Contraction into FMA is off in
// the clones: each operation rounds as the baseline's does, so every ISA gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__) && \
    !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL)
#define MESHTENSOR_MAP_ISA_CLONES 1
#else
#define MESHTENSOR_MAP_ISA_CLONES 0
#endif

namespace meshtensor::detail {

// Whether broadcast strides s over local extents ext (rank r) are ext's own row-major strides: the
// operand has the output's shape, and its offset is the output's flat index.
inline bool same_as_out(const kidx& ext, const kidx& s, int r) {
  std::int64_t stride = 1;
  for (int i = r - 1; i >= 0; --i) {
    if (ext[i] != 1 && s[i] != stride) return false;
    stride *= ext[i];
  }
  return true;
}

template <class T, class Mem>
struct map_operand {
  Kokkos::View<T*, Mem> v;
  kidx stride;
  bool contiguous;  // same shape as the output: skip the per-dim division of operand_offset
};

// Where an operand's elements for one run of the output's last dim start, and their stride.
template <class T>
struct map_cursor {
  const T* p;
  std::int64_t off, step;
};
template <class T, class Mem>
KOKKOS_INLINE_FUNCTION map_cursor<T> cursor_at(const map_operand<T, Mem>& op, std::int64_t o, const kidx& ext, int r) {
  if (op.contiguous) return {op.v.data(), o, 1};
  return {op.v.data(), operand_offset(o, ext, op.stride, r), r > 0 ? op.stride[r - 1] : 0};
}
// The ISA a map's contiguous runs are compiled for (MESHTENSOR_MAP_ISA_CLONES; else baseline only).
enum class map_isa : int { baseline, avx2, avx512 };
inline map_isa map_isa_of_job() {
  if constexpr (!MESHTENSOR_MAP_ISA_CLONES) return map_isa::baseline;
  const cpu_isa_level job = cpu_isa().job;
  return job >= cpu_isa_level::avx512_core ? map_isa::avx512 : job >= cpu_isa_level::avx2 ? map_isa::avx2 : map_isa::baseline;
}

#if MESHTENSOR_MAP_ISA_CLONES
template <class F>
__attribute__((target("avx2"), optimize("fp-contract=off"), flatten)) void with_avx2(const F& f) {
  f();
}
template <class F>
__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"), optimize("fp-contract=off"), flatten)) void with_avx512(
    const F& f) {
  f();
}
#endif

// f() compiled for the ISA given (a map's contiguous runs, softmax's rows): f and what it calls are
// inlined into a clone per ISA, each rounding as the baseline does.
template <class F>
KOKKOS_INLINE_FUNCTION void with_isa([[maybe_unused]] map_isa isa, const F& f) {
#if MESHTENSOR_MAP_ISA_CLONES
  if (isa == map_isa::avx512) return with_avx512(f);
  if (isa == map_isa::avx2) return with_avx2(f);
#endif
  f();
}

// The common case of a run, written so that the compiler can vectorise it.
template <class TO, class F, class... TI>
KOKKOS_INLINE_FUNCTION void map_contiguous(TO* out, std::int64_t len, const F& f, const TI*... p) {
  for (std::int64_t j = 0; j < len; ++j) out[j] = f(p[j]...);
}

template <class TO, class F, class... TI>
KOKKOS_INLINE_FUNCTION void map_run(TO* out, std::int64_t len, const F& f, [[maybe_unused]] map_isa isa,
                                    const map_cursor<TI>&... c) {
  if ((... && (c.step == 1))) {
#if MESHTENSOR_MAP_ISA_CLONES  // (device builds: no lambda over the cursors' pack, which nvcc refuses)
    with_isa(isa, [&] { map_contiguous(out, len, f, (c.p + c.off)...); });
#else
    map_contiguous(out, len, f, (c.p + c.off)...);
#endif
  } else {
    for (std::int64_t j = 0; j < len; ++j) out[j] = f(c.p[c.off + j * c.step]...);
  }
}

// The operands of one map, held by index: a device lambda may not capture a parameter pack's
// elements (nvcc), and std::tuple is not usable in device code everywhere.
template <std::size_t I, class Operand>
struct map_operand_slot {
  Operand operand;
};
template <class Seq, class... Operands>
struct map_operand_pack;
template <std::size_t... I, class... Operands>
struct map_operand_pack<std::index_sequence<I...>, Operands...> : map_operand_slot<I, Operands>... {};

struct identity_fn {
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T v) const {
    return v;
  }
};

template <class F, class... TI>
inline constexpr bool map_tiles_copy = std::is_same_v<F, identity_fn> && sizeof...(TI) == 1;

// Runs of a transposing map taken together: as many as fill 128 bytes of the input (8 complex
// doubles, 32 floats), at least 8.
template <class T>
inline constexpr std::int64_t map_tile_runs = sizeof(T) >= 16 ? 8 : static_cast<std::int64_t>(128 / sizeof(T));

// One work item per run of the output's last dim on a host (per element on a GPU: len 1, walk.hpp's
// elements_per_item): the operands' offsets (a 64-bit division per dim) are computed once per run, not once per element, which made broadcasts and the
// permutations before and after einsum's products several times slower than a copy.
// A transpose (a copy of one operand, strided along the output's last dim, unit-strided along another of the
// output's dims: the tile dim) takes map_tile_runs runs per work item, neighbours along the tile
// dim, and walks them side by side, so each cache line it reads is used whole at once. A run
// alone reads one element per line, and at a power-of-two stride (a 128^3 grid's 256 KiB) every
// line falls in one cache set, so the line is evicted before the next runs use the rest of it:
// each was read from memory 4 times for complex doubles. Copies only (transpose, einsum's
// permutations, broadcasts), so that the other functors' kernels do not carry it.
template <class F, class TO, class Mem, class... TI>
struct map_runs {
  TO* out;
  std::int64_t len;
  kidx ext;
  int r;
  map_isa isa;
  F f;
  map_operand_pack<std::index_sequence_for<TI...>, map_operand<TI, Mem>...> ops;
  // Tiled (copies only, map_tiles_copy): the tile dim's extent, its tiles, and the runs between neighbours
  // along it (the product of the extents of the output's dims after it, the last excepted).
  bool tiled = false;
  std::int64_t tile_extent = 0, tiles = 0, tile_gap = 0;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    if constexpr (map_tiles_copy<F, TI...>) {
      if (tiled) return apply_tiled(item);
    }
    apply(item, std::index_sequence_for<TI...>{});
  }
  template <std::size_t... I>
  KOKKOS_INLINE_FUNCTION void apply(std::int64_t run, std::index_sequence<I...>) const {
    const std::int64_t o = run * len;
    map_run(out + o, len, f, isa,
            cursor_at(static_cast<const map_operand_slot<I, map_operand<TI, Mem>>&>(ops).operand, o, ext, r)...);
  }
  KOKKOS_INLINE_FUNCTION void apply_tiled(std::int64_t item) const {
    using T = std::tuple_element_t<0, std::tuple<TI...>>;
    constexpr std::int64_t tile = map_tile_runs<T>;
    const auto& op = static_cast<const map_operand_slot<0, map_operand<T, Mem>>&>(ops).operand;
    // item = (the runs' index outside the tile dim, the tile): outer and inner of the tile dim.
    const std::int64_t tile_at = item % tiles, rest = item / tiles;
    const std::int64_t outer = rest / tile_gap, inner = rest % tile_gap;
    const std::int64_t first = tile_at * tile, count = tile_extent - first < tile ? tile_extent - first : tile;
    const std::int64_t first_run = (outer * tile_extent + first) * tile_gap + inner;
    std::int64_t start[tile];
    for (std::int64_t t = 0; t < count; ++t) start[t] = cursor_at(op, (first_run + t * tile_gap) * len, ext, r).off;
    const T* in = op.v.data();
    const std::int64_t step = op.stride[r - 1], gap = tile_gap * len;
    TO* o = out + first_run * len;
    for (std::int64_t j = 0; j < len; ++j)
      for (std::int64_t t = 0; t < count; ++t) o[t * gap + j] = f(in[start[t] + j * step]);
  }
};

// An operand of a map as the typed wrapper hands it over: its View, where each of the output's
// dims sits in it (its rank where it lacks the dim), and its local extents.
template <class T, class Mem>
struct map_input {
  const Kokkos::View<T*, Mem>& v;
  const std::size_t* positions;
  const std::int64_t* local_extents;
  std::size_t rank;
};

// The operand broadcast to the output's local extents ext (rank r).
template <class T, class Mem>
map_operand<T, Mem> map_operand_at(const map_input<T, Mem>& in, const kidx& ext, int r) {
  const kidx s = broadcast_strides_at({in.positions, static_cast<std::size_t>(r)}, {in.local_extents, in.rank});
  return {in.v, s, same_as_out(ext, s, r)};
}

// out(o) = f(ins(o)...) over a local slice of rank r and local extents out_ext. Per (space,
// functor, element types): every layout and dim list shares it.
template <class Exec, class F, class TO, class... TI>
void map_kernel(const Kokkos::View<TO*, typename Exec::memory_space>& out, const std::int64_t* out_ext, int r, F f,
                const map_input<TI, typename Exec::memory_space>&... ins) {
  using mem = typename Exec::memory_space;
  kidx ext{};
  std::int64_t n = 1;
  for (int i = 0; i != r; ++i) ext[i] = out_ext[i], n *= out_ext[i];
  if (n == 0) return;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, mem>::accessible;
  const std::int64_t run = r > 0 ? ext[r - 1] : 1;
  const std::int64_t len = elements_per_item<mem>(run);  // a run on a host, an element on a GPU
  const map_isa isa = host ? map_isa_of_job() : map_isa::baseline;
  map_runs<F, TO, mem, TI...> runs{out.data(), len, ext, r, isa, f, {{map_operand_at(ins, ext, r)}...}};
  const std::int64_t all_runs = n / len;
  std::int64_t items = all_runs;
  if constexpr (host && map_tiles_copy<F, TI...>) {
    const auto& op = static_cast<const map_operand_slot<0, map_operand<TI..., mem>>&>(runs.ops).operand;
    int d = r - 2;  // the tile dim: the innermost before the last along which the operand is unit-strided
    while (d >= 0 && !(op.stride[d] == 1 && ext[d] > 1)) --d;
    runs.tiled = len == run && d >= 0 && op.stride[r - 1] > 1;  // (tiles are of whole runs)
    if (runs.tiled) {
      runs.tile_extent = ext[d];
      runs.tiles = (ext[d] + map_tile_runs<TI...> - 1) / map_tile_runs<TI...>;
      runs.tile_gap = 1;
      for (int i = d + 1; i < r - 1; ++i) runs.tile_gap *= ext[i];
      items = all_runs / ext[d] * runs.tiles;
    }
  }
  kernels::parallel_for("meshtensor::map", kernels::range<Exec>(0, items), runs);
}

}  // namespace meshtensor::detail
