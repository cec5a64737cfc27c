#pragma once
// Halo transport: an input's local data with the halos its windows read (halo_buffer), brought in
// from the neighbours along one dim (take_halo: two sendrecvs, or an allgather on the gather path)
// and sent back and added where they came from (return_halo, the adjoint). What the halos are is
// geometry's (geometry/window.hpp: schedule_halo); unfold/fold (ops/unfold.hpp) and the direct
// convolutions (nn/conv.hpp) move them through here, so both run the same collectives.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>

#include "../geometry/window.hpp"
#include "../runtime/collectives.hpp"
#include "detail/along.hpp"
#include "detail/op_support.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor::detail {

// An input's local data with halos: row-major over ext, element l along dim d at global begin[d] + l.
template <class T, class Mem, std::size_t R>
struct halo_buffer {
  Kokkos::View<T*, Mem> v;
  std::array<std::int64_t, R> ext{}, begin{};
};

// A buffer, from the pool and not filled, shaped as the one take_halo leaves once every halo of `halos`
// is in: a slice's extents and offsets (ext, begin) along the other dims; along each spatial dim
// this processor's part, widened to the range its windows read where halos are exchanged. What
// fold and conv_transpose's direct path add into before return_halo.
template <class T, class Mem, std::size_t R, std::size_t N>
halo_buffer<T, Mem, R> halo_buffer_for(const std::array<std::int64_t, R>& ext, const std::array<std::int64_t, R>& begin,
                                       const std::array<halo_dim, N>& halos) {
  halo_buffer<T, Mem, R> b{{}, ext, begin};
  for (const auto& h : halos) {
    b.ext[h.index] = h.path == halo_path::local ? h.own_hi - h.own_lo : h.buf_hi - h.buf_lo;
    b.begin[h.index] = h.path == halo_path::local ? h.own_lo : h.buf_lo;
  }
  std::int64_t n = 1;
  for (auto e : b.ext) n *= e;
  b.v = view_pool<T, Mem>::get().allocate(static_cast<std::size_t>(n));
  return b;
}

// b's data seen as [outer, n, inner] around its dim d.
template <class T, class Mem, std::size_t R>
along_view<Kokkos::View<T*, Mem>> along_dim(const halo_buffer<T, Mem, R>& b, std::size_t d) {
  const auto around = outer_inner<R>(b.ext, d);
  return {b.v, around.first, b.ext[d], around.second, b.begin[d]};
}

// Brings dim h's halo into b (forward: unfold). The kernels run over (outer, position) pairs and
// copy `inner` contiguous elements each.
template <class Exec, class T, std::size_t R>
void take_halo(communicator& comm, halo_buffer<T, typename Exec::memory_space, R>& b, const halo_dim& h) {
  using View = Kokkos::View<T*, typename Exec::memory_space>;
  if (h.path == halo_path::local) return;
  // Plain copies: a device lambda captures no structured binding under nvcc.
  const along_view<View> cur = along_dim(b, h.index);
  const std::int64_t outer = cur.outer, inner = cur.inner;
  if (h.path == halo_path::gather) {
    b.v = allgather_along<Exec>(comm, h.split, b.v, outer, cur.n, inner, h.geo.extent);
  } else {
    using buffer = mpi_buffer<Exec, T>;
    const int axis = h.split.axes[0];
    const auto right = buffer::reading(pack_along<Exec>(cur, h.to_right_at - h.own_lo, h.to_right));
    const auto left = buffer::reading(pack_along<Exec>(cur, h.to_left_at - h.own_lo, h.to_left));
    const auto got_left = buffer::writing(static_cast<std::size_t>(outer * h.from_left * inner));
    const auto got_right = buffer::writing(static_cast<std::size_t>(outer * h.from_right * inner));
    shift_v(comm, axis, right.data(), outer * h.to_right * inner, got_left.data(), outer * h.from_left * inner, 1);
    shift_v(comm, axis, left.data(), outer * h.to_left * inner, got_right.data(), outer * h.from_right * inner, -1);
    if (h.from_left + h.from_right > 0) {
      const View lv = got_left.view(), rv = got_right.view();
      const std::int64_t n = h.buf_hi - h.buf_lo, lo = h.buf_lo, own_lo = h.own_lo, own_hi = h.own_hi;
      const std::int64_t nl = h.from_left, nr = h.from_right, right_lo = std::max(lo, own_hi);
      View next = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(outer * n * inner));
      kernels::parallel_for(
          "meshtensor::unfold_halo", kernels::range<Exec>(0, outer * n), KOKKOS_LAMBDA(std::int64_t ol) {
            const std::int64_t o = ol / n, g = lo + ol % n;
            const T* from = g < own_lo   ? &lv((o * nl + g - lo) * inner)
                            : g < own_hi ? &cur.v(cur.at(o, g - own_lo, 0))
                                         : &rv((o * nr + g - right_lo) * inner);
            T* to = &next(ol * inner);
            for (std::int64_t i = 0; i < inner; ++i) to[i] = from[i];
          });
      b.v = next;
    }
  }
  b.ext[h.index] = h.buf_hi - h.buf_lo;
  b.begin[h.index] = h.buf_lo;
}

// Sends dim h's halo back to where it came from and adds it there (the adjoint of take_halo).
template <class Exec, class T, std::size_t R>
void return_halo(communicator& comm, halo_buffer<T, typename Exec::memory_space, R>& b, const halo_dim& h) {
  using View = Kokkos::View<T*, typename Exec::memory_space>;
  if (h.path == halo_path::local) return;
  // Plain copies: a device lambda captures no structured binding under nvcc.
  const along_view<View> cur = along_dim(b, h.index);
  const std::int64_t outer = cur.outer, inner = cur.inner;
  const std::int64_t n = h.own_hi - h.own_lo, own_lo = h.own_lo, cur_lo = cur.begin, cur_n = cur.n;
  using buffer = mpi_buffer<Exec, T>;
  if (h.path == halo_path::gather) {
    // Every processor of D's axes holds the whole of D: their sums, then this processor's part.
    const auto sum = buffer::reading(b.v);
    allreduce(comm, h.split.mask(), sum.data(), outer * cur_n * inner);
    const View s = sum.view();
    View next = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(outer * n * inner));
    kernels::parallel_for(
        "meshtensor::fold_own", kernels::range<Exec>(0, outer * n), KOKKOS_LAMBDA(std::int64_t ol) {
          const std::int64_t o = ol / n, l = ol % n;
          const T* from = &s((o * cur_n + own_lo + l) * inner);
          T* to = &next(ol * inner);
          for (std::int64_t i = 0; i < inner; ++i) to[i] = from[i];
        });
    b.v = next;
  } else {
    const int axis = h.split.axes[0];
    const auto left = buffer::reading(pack_along<Exec>(cur, 0, h.from_left));
    const auto right = buffer::reading(pack_along<Exec>(cur, std::max(h.need_lo, h.own_hi) - cur_lo, h.from_right));
    const auto back_from_right = buffer::writing(static_cast<std::size_t>(outer * h.to_right * inner));
    const auto back_from_left = buffer::writing(static_cast<std::size_t>(outer * h.to_left * inner));
    shift_v(comm, axis, left.data(), outer * h.from_left * inner, back_from_right.data(), outer * h.to_right * inner, -1);
    shift_v(comm, axis, right.data(), outer * h.from_right * inner, back_from_left.data(), outer * h.to_left * inner, 1);
    const View rv = back_from_right.view(), lv = back_from_left.view();
    const std::int64_t r_at = h.to_right_at - own_lo, r_n = h.to_right, l_at = h.to_left_at - own_lo, l_n = h.to_left;
    // The own part: the buffer itself when it holds no halo (added to in place), else a copy of it.
    View next = b.v;
    if (h.from_left + h.from_right > 0) {
      next = view_pool<T, typename Exec::memory_space>::get().allocate(static_cast<std::size_t>(outer * n * inner));
      kernels::parallel_for(
          "meshtensor::fold_own", kernels::range<Exec>(0, outer * n), KOKKOS_LAMBDA(std::int64_t ol) {
            // Own positions that no window here read lie outside the buffer: zeros.
            const std::int64_t o = ol / n, c = own_lo + ol % n - cur_lo;
            T* to = &next(ol * inner);
            if (c >= 0 && c < cur_n) {
              const T* from = &cur.v(cur.at(o, c, 0));
              for (std::int64_t i = 0; i < inner; ++i) to[i] = from[i];
            } else {
              for (std::int64_t i = 0; i < inner; ++i) to[i] = T(0);
            }
          });
    }
    // What the neighbours read here comes back and is added (two ranges of positions).
    if (r_n + l_n > 0) kernels::parallel_for(
        "meshtensor::fold_halo", kernels::range<Exec>(0, outer * (r_n + l_n)), KOKKOS_LAMBDA(std::int64_t ol) {
          const std::int64_t o = ol / (r_n + l_n), q = ol % (r_n + l_n);
          const bool from_right = q < r_n;
          const std::int64_t l = from_right ? r_at + q : l_at + q - r_n;
          const T* from = from_right ? &rv((o * r_n + q) * inner) : &lv((o * l_n + q - r_n) * inner);
          T* to = &next((o * n + l) * inner);
          for (std::int64_t i = 0; i < inner; ++i) to[i] += from[i];
        });
    b.v = next;
  }
  b.ext[h.index] = n;
  b.begin[h.index] = own_lo;
}

}  // namespace meshtensor::detail
