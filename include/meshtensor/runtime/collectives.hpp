#pragma once
// Collectives over any set of mesh axes, on the cached sub-communicator of exactly those axes.
// Each describes itself once (collective_call) and goes through the communicator's door (run,
// start), which counts it (calls and bytes this rank sends, per collective and axis set), skips it
// in a plan, and runs it, watched under the watchdog.
// Buffers are host-accessible pointers; tensor code stages device memory through host mirrors.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../element/bf16.hpp"
#include "../element/complex.hpp"
#include "../geometry/exchange.hpp"
#include "communicator.hpp"

namespace meshtensor {

enum class reduce_op { sum, max, min };

namespace detail {
template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  else if constexpr (std::is_same_v<T, bool>) return MPI_CXX_BOOL;
  else if constexpr (std::is_same_v<T, bf16>) return MPI_UINT16_T;  // moved as bits; never reduced as such
  else if constexpr (std::is_same_v<T, complex<float>>) return MPI_C_FLOAT_COMPLEX;  // re, im: as Kokkos::complex
  else if constexpr (std::is_same_v<T, complex<double>>) return MPI_C_DOUBLE_COMPLEX;
  else static_assert(sizeof(T) == 0, "meshtensor: no MPI datatype for this element type");
}
inline MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
    default: return MPI_SUM;
  }
}

// bf16 reductions run in float: widened, reduced, rounded back once. Summing in bf16 at every step
// of MPI's tree would round log2(P) to P - 1 times; this sends twice the bytes (counted as sent)
// for one rounding, as a float accumulator would give.
inline std::vector<float> widened(const bf16* in, std::int64_t n) {
  return std::vector<float>(in, in + n);
}
inline void narrow_into(const std::vector<float>& wide, bf16* out) {
  for (std::size_t i = 0; i < wide.size(); ++i) out[i] = wide[i];
}
// Sends to `to` and receives from `from` (MPI_PROC_NULL: none) in one exchange: one hop of a shift.
// Returns false in a plan.
template <class T>
bool sendrecv(communicator& c, axis_set axes, const T* send, std::int64_t send_n, int to, T* recv,
              std::int64_t recv_n, int from) {
  return c.run(
      {collective::shift, axes, send_n * static_cast<std::int64_t>(sizeof(T))},
      [&] {
        MPI_Sendrecv(send, checked_count(send_n), mpi_type<T>(), to, 0, recv, checked_count(recv_n), mpi_type<T>(),
                     from, 0, c.over(axes), MPI_STATUS_IGNORE);
      },
      [&](MPI_Request* r) {
        MPI_Irecv(recv, checked_count(recv_n), mpi_type<T>(), from, 0, c.over(axes), &r[0]);
        MPI_Isend(send, checked_count(send_n), mpi_type<T>(), to, 0, c.over(axes), &r[1]);
      });
}

// In place over the axes: MPI_Allreduce, or under the watchdog its nonblocking form. Where the
// group's size is a power of two, that form is recursive doubling over point-to-point messages
// (log2 P exchanges with a partner, each reduced locally): Open MPI's MPI_Iallreduce (libnbc) took
// twice the blocking call's time on 2 ranks from 4 bytes to 64 KB, and this takes the same as the
// blocking call (docs/design/faults.md, "Faults"). Partners add the same two values
// (a + b == b + a), so every rank ends with the same bits.
template <class T>
void allreduce_in_place(communicator& c, axis_set axes, T* data, std::int64_t n, MPI_Op op) {
  const collective_call call{collective::allreduce, axes, n * static_cast<std::int64_t>(sizeof(T)), true};
  const auto blocking = [&] { MPI_Allreduce(MPI_IN_PLACE, data, checked_count(n), mpi_type<T>(), op, c.over(axes)); };
  const int p = c.size_over(axes);
  if ((p & (p - 1)) != 0) {
    c.run(call, blocking, [&](MPI_Request* r) {
      MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(n), mpi_type<T>(), op, c.over(axes), r);
    });
    return;
  }
  c.run(call, blocking, [&] {
    constexpr int tag = 0x6172;  // apart from shift's messages on the same communicator
    MPI_Comm sub = c.over(axes);
    const int count = checked_count(n);
    int me = 0;
    MPI_Comm_rank(sub, &me);
    static thread_local std::vector<std::byte> scratch;  // bytes: std::vector<bool> has no data()
    scratch.resize(static_cast<std::size_t>(call.bytes));
    T* theirs = reinterpret_cast<T*>(scratch.data());
    for (int bit = 1; bit < p; bit <<= 1) {
      const int partner = me ^ bit;
      MPI_Request r[2];
      MPI_Irecv(theirs, count, mpi_type<T>(), partner, tag, sub, &r[0]);
      MPI_Isend(data, count, mpi_type<T>(), partner, tag, sub, &r[1]);
      c.await(r, 2, collective::allreduce, axes, call.bytes);
      MPI_Reduce_local(theirs, data, count, mpi_type<T>(), op);
    }
  });
}

// A bf16 reduction as float: f(float in, float out) on the widened buffers, the result rounded
// once into out (n_out elements). In a plan nothing is widened: f gets null buffers and counts
// the float collective.
template <class F>
void reduce_widened(communicator& c, const bf16* in, std::int64_t n_in, bf16* out, std::int64_t n_out, F f) {
  if (c.planned()) return f(static_cast<const float*>(nullptr), static_cast<float*>(nullptr));
  auto wide_in = widened(in, n_in);
  std::vector<float> wide_out(static_cast<std::size_t>(n_out));
  f(static_cast<const float*>(wide_in.data()), wide_out.data());
  narrow_into(wide_out, out);
}
}  // namespace detail

// In place: every processor along the axes ends with the reduction of all of them.
template <class T>
void allreduce(communicator& c, axis_set axes, T* data, std::int64_t n, reduce_op op = reduce_op::sum) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (c.planned() || c.size_over(axes) == 1) return allreduce(c, axes, static_cast<float*>(nullptr), n, op);
    auto wide = detail::widened(data, n);
    allreduce(c, axes, wide.data(), n, op);
    return detail::narrow_into(wide, data);
  } else {
    detail::allreduce_in_place(c, axes, data, n, detail::mpi_op(op));
  }
}

// allreduce, started: data holds the result once the communicator's await_started has returned
// (started_collective: its request is MPI_REQUEST_NULL where nothing is sent). Counted as
// an allreduce. Every processor of the group must start its nonblocking collectives in one order.
template <class T>
started_collective start_allreduce(communicator& c, axis_set axes, T* data, std::int64_t n, reduce_op op = reduce_op::sum) {
  static_assert(!std::is_same_v<T, bf16>, "meshtensor: a started allreduce of bf16 would need its float copy kept alive; use allreduce");
  return c.start({collective::allreduce, axes, n * static_cast<std::int64_t>(sizeof(T)), true}, [&](MPI_Request* r) {
    MPI_Iallreduce(MPI_IN_PLACE, data, detail::checked_count(n), detail::mpi_type<T>(), detail::mpi_op(op), c.over(axes), r);
  });
}

// recv holds n elements from each processor along the axes, in sub-communicator rank order
// (row-major over the axes in mesh order).
template <class T>
void allgather(communicator& c, axis_set axes, const T* send, std::int64_t n, T* recv) {
  const auto type = detail::mpi_type<T>();
  c.run(
      {collective::allgather, axes, n * static_cast<std::int64_t>(sizeof(T))},
      [&] { MPI_Allgather(send, detail::checked_count(n), type, recv, detail::checked_count(n), type, c.over(axes)); },
      [&](MPI_Request* r) {
        MPI_Iallgather(send, detail::checked_count(n), type, recv, detail::checked_count(n), type, c.over(axes), r);
      });
}

// Block p of send (n_per_peer elements) goes to sub-rank p; block p of recv comes from it.
template <class T>
void alltoall(communicator& c, axis_set axes, const T* send, std::int64_t n_per_peer, T* recv) {
  const auto type = detail::mpi_type<T>();
  c.run(
      {collective::alltoall, axes, n_per_peer * c.size_over(axes) * static_cast<std::int64_t>(sizeof(T))},
      [&] {
        const int count = detail::checked_count(n_per_peer);
        MPI_Alltoall(send, count, type, recv, count, type, c.over(axes));
      },
      [&](MPI_Request* r) {
        const int count = detail::checked_count(n_per_peer);
        MPI_Ialltoall(send, count, type, recv, count, type, c.over(axes), r);
      });
}

// As allgather with a count per processor (uneven slices): recv holds counts[p] elements from
// sub-rank p at displs[p]. Falls back to MPI_Allgather when every count is the same.
template <class T>
void allgatherv(communicator& c, axis_set axes, const T* send, std::int64_t n, T* recv,
                const std::vector<int>& counts, const std::vector<int>& displs) {
  bool same = true;
  for (std::size_t p = 0; p < counts.size(); ++p) same = same && counts[p] == counts[0] && displs[p] == counts[0] * static_cast<int>(p);
  if (same) return allgather(c, axes, send, n, recv);
  const auto type = detail::mpi_type<T>();
  c.run(
      {collective::allgather, axes, n * static_cast<std::int64_t>(sizeof(T))},
      [&] {
        MPI_Allgatherv(send, detail::checked_count(n), type, recv, counts.data(), displs.data(), type, c.over(axes));
      },
      [&](MPI_Request* r) {
        MPI_Iallgatherv(send, detail::checked_count(n), type, recv, counts.data(), displs.data(), type, c.over(axes), r);
      });
}

// allgatherv, started: recv holds every part once the communicator's await_started has returned
// (under the watchdog; in a plan it marks the wait). Counted as an allgather, as allgatherv is.
// Every processor of the group must start its nonblocking collectives in one order, among its
// blocking ones.
template <class T>
started_collective start_allgatherv(communicator& c, axis_set axes, const T* send, std::int64_t n, T* recv,
                                    const std::vector<int>& counts, const std::vector<int>& displs) {
  const auto type = detail::mpi_type<T>();
  return c.start({collective::allgather, axes, n * static_cast<std::int64_t>(sizeof(T))}, [&](MPI_Request* r) {
    MPI_Iallgatherv(send, detail::checked_count(n), type, recv, counts.data(), displs.data(), type, c.over(axes), r);
  });
}

// As alltoall with a count per peer each way (uneven blocks). `uniform` says that every block
// between every pair of the sub-communicator has one size and lies back to back: then it is an
// MPI_Alltoall. It must be the same on every rank of the sub-communicator (derive it from data
// they share, such as placements), never from this rank's counts alone: a rank whose blocks
// happen to be equal (all empty, say) must not call MPI_Alltoall while its peers call
// MPI_Alltoallv.
template <class T>
void alltoallv(communicator& c, axis_set axes, bool uniform, const T* send, const std::vector<int>& send_counts,
               const std::vector<int>& send_displs, T* recv, const std::vector<int>& recv_counts,
               const std::vector<int>& recv_displs) {
  const int n = static_cast<int>(send_counts.size());
  if (uniform) return alltoall(c, axes, send, n > 0 ? send_counts[0] : 0, recv);
  std::int64_t sent = 0;
  for (int q = 0; q < n; ++q) sent += send_counts[q];
  const auto type = detail::mpi_type<T>();
  c.run(
      {collective::alltoall, axes, sent * static_cast<std::int64_t>(sizeof(T))},
      [&] {
        MPI_Alltoallv(send, send_counts.data(), send_displs.data(), type, recv, recv_counts.data(), recv_displs.data(),
                      type, c.over(axes));
      },
      [&](MPI_Request* r) {
        MPI_Ialltoallv(send, send_counts.data(), send_displs.data(), type, recv, recv_counts.data(),
                       recv_displs.data(), type, c.over(axes), r);
      });
}

// alltoallv, started: recv holds every block once the communicator's await_started has returned.
// Counted as an alltoall, as alltoallv is; `uniform` as there.
template <class T>
started_collective start_alltoallv(communicator& c, axis_set axes, bool uniform, const T* send,
                                   const std::vector<int>& send_counts, const std::vector<int>& send_displs, T* recv,
                                   const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) {
  std::int64_t sent = 0;
  for (const int k : send_counts) sent += k;
  const auto type = detail::mpi_type<T>();
  return c.start({collective::alltoall, axes, sent * static_cast<std::int64_t>(sizeof(T))}, [&](MPI_Request* r) {
    if (uniform) {
      const int count = send_counts.empty() ? 0 : send_counts[0];
      MPI_Ialltoall(send, count, type, recv, count, type, c.over(axes), r);
    } else {
      MPI_Ialltoallv(send, send_counts.data(), send_displs.data(), type, recv, recv_counts.data(), recv_displs.data(),
                     type, c.over(axes), r);
    }
  });
}

// Reduces send (n_per_rank * size elements) and leaves block r of the result on sub-rank r.
template <class T>
void reduce_scatter(communicator& c, axis_set axes, const T* send, T* recv, std::int64_t n_per_rank,
                    reduce_op op = reduce_op::sum) {
  if constexpr (std::is_same_v<T, bf16>) {
    detail::reduce_widened(c, send, n_per_rank * c.size_over(axes), recv, n_per_rank, [&](const float* in, float* out) {
      reduce_scatter(c, axes, in, out, n_per_rank, op);
    });
  } else {
    const auto type = detail::mpi_type<T>();
    c.run(
        {collective::reduce_scatter, axes, n_per_rank * c.size_over(axes) * static_cast<std::int64_t>(sizeof(T))},
        [&] {
          MPI_Reduce_scatter_block(send, recv, detail::checked_count(n_per_rank), type, detail::mpi_op(op), c.over(axes));
        },
        [&](MPI_Request* r) {
          MPI_Ireduce_scatter_block(send, recv, detail::checked_count(n_per_rank), type, detail::mpi_op(op), c.over(axes), r);
        });
  }
}

// As reduce_scatter with a count per processor (uneven parts): send holds counts[p] elements for
// sub-rank p, back to back; recv gets counts[this sub-rank] elements of the sum. Counted as the
// bytes sent.
template <class T>
void reduce_scatter_v(communicator& c, axis_set axes, const T* send, T* recv, const std::vector<int>& counts,
                      reduce_op op = reduce_op::sum) {
  std::int64_t n = 0;
  for (const int k : counts) n += k;
  if constexpr (std::is_same_v<T, bf16>) {
    int me = 0;
    if (!c.planned()) MPI_Comm_rank(c.over(axes), &me);
    detail::reduce_widened(c, send, n, recv, counts[me], [&](const float* in, float* out) {
      reduce_scatter_v(c, axes, in, out, counts, op);
    });
  } else {
    const auto type = detail::mpi_type<T>();
    c.run(
        {collective::reduce_scatter, axes, n * static_cast<std::int64_t>(sizeof(T))},
        [&] { MPI_Reduce_scatter(send, recv, counts.data(), type, detail::mpi_op(op), c.over(axes)); },
        [&](MPI_Request* r) {
          MPI_Ireduce_scatter(send, recv, counts.data(), type, detail::mpi_op(op), c.over(axes), r);
        });
  }
}

// reduce_scatter_v, started: recv holds this processor's part of the sum once the communicator's
// await_started has returned. Not for bf16, which is summed in float (reduce_widened): reduce_scatter_v.
template <class T>
started_collective start_reduce_scatter_v(communicator& c, axis_set axes, const T* send, T* recv,
                                          const std::vector<int>& counts, reduce_op op = reduce_op::sum) {
  static_assert(!std::is_same_v<T, bf16>, "meshtensor: start_reduce_scatter_v sums bf16 in float: call reduce_scatter_v");
  std::int64_t n = 0;
  for (const int k : counts) n += k;
  return c.start({collective::reduce_scatter, axes, n * static_cast<std::int64_t>(sizeof(T))}, [&](MPI_Request* r) {
    MPI_Ireduce_scatter(send, recv, counts.data(), detail::mpi_type<T>(), detail::mpi_op(op), c.over(axes), r);
  });
}

// Along one mesh axis: this processor sends to coordinate + offset and receives from
// coordinate - offset. Without wrap, processors whose source falls off the edge get zeros.
template <class T>
void shift(communicator& c, int axis, const T* send, T* recv, std::int64_t n, int offset, bool wrap) {
  const int size = c.sizes()[axis];
  const int me = c.coords()[axis];
  const int to_raw = me + offset, from_raw = me - offset;
  auto wrap_to = [size](int x) { return ((x % size) + size) % size; };
  const bool to_ok = wrap || (to_raw >= 0 && to_raw < size);
  const bool from_ok = wrap || (from_raw >= 0 && from_raw < size);
  const int to = to_ok ? wrap_to(to_raw) : MPI_PROC_NULL;
  const int from = from_ok ? wrap_to(from_raw) : MPI_PROC_NULL;
  if (detail::sendrecv(c, axis_set(1u << axis), send, n, to, recv, n, from) && !from_ok)
    for (std::int64_t i = 0; i < n; ++i) recv[i] = T{};
}

// Along one mesh axis, without wrap, with counts that differ per processor (windows near uneven
// parts): sends send_n elements to coordinate + direction and receives recv_n from coordinate - direction.
// The caller computes both counts from the placement, so each sender's count is its receiver's.
// Counted as a shift of the bytes sent.
template <class T>
void shift_v(communicator& c, int axis, const T* send, std::int64_t send_n, T* recv, std::int64_t recv_n,
             int direction) {
  const int size = c.sizes()[axis], me = c.coords()[axis];
  const int to = me + direction >= 0 && me + direction < size ? me + direction : MPI_PROC_NULL;
  const int from = me - direction >= 0 && me - direction < size ? me - direction : MPI_PROC_NULL;
  detail::sendrecv(c, axis_set(1u << axis), send, send_n, to, recv, recv_n, from);
}

// One hop of a ring over the axes (sub-communicator ranks `to` and `from`), around local work:
// the receive is posted first, then the send (before compute() when send_first, after it
// otherwise: a buffer that compute() still adds to), so that the transfer overlaps the work where
// MPI progresses; then both are awaited (under the watchdog when it is on). send() gives the
// send buffer when the send is posted (a staged copy is taken then). Counted as one `shift` of
// the bytes sent; in a plan compute() runs (its kernels are skipped) and nothing is sent, and the
// transfer takes its place in the plan's order where the send is posted (plan/timeline.hpp): over
// compute() when send_first, after it otherwise.
template <class T, class Send, class Compute>
void ring_exchange(communicator& c, axis_set axes, Send send, std::int64_t send_n, int to, T* recv, std::int64_t recv_n,
                   int from, bool send_first, Compute compute) {
  constexpr int tag = 0x7269;  // apart from shift's and the allreduce's messages on the same communicator
  const std::int64_t bytes = send_n * static_cast<std::int64_t>(sizeof(T));
  const collective_call call{collective::shift, axes, bytes};
  if (c.planned()) {  // send() too: staging it is where the run waits for the device (kernels::fence)
    if (!send_first) {
      compute();
      (void)send();
    }
    auto moving = c.start(call, [](MPI_Request*) {});
    if (send_first) {
      (void)send();
      compute();
    }
    c.await_started(moving, collective::shift, axes, bytes);
    return;
  }
  MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  r[0] = c.start(call, [&](MPI_Request* q) {
          MPI_Irecv(recv, detail::checked_count(recv_n), detail::mpi_type<T>(), from, tag, c.over(axes), q);
        }).request;
  const auto post_send = [&] {
    const T* data = send();
    MPI_Isend(data, detail::checked_count(send_n), detail::mpi_type<T>(), to, tag, c.over(axes), &r[1]);
  };
  if (send_first) post_send();
  compute();
  if (!send_first) post_send();
  c.await(r, 2, collective::shift, axes, bytes);
}

// Exclusive prefix reduction in sub-communicator rank order (row-major over the axes in mesh
// order): sub-rank r receives op over the send buffers of sub-ranks 0..r-1; sub-rank 0 receives
// zeros (T{}).
template <class T>
void exscan(communicator& c, axis_set axes, const T* send, T* recv, std::int64_t n,
            reduce_op op = reduce_op::sum) {
  if constexpr (std::is_same_v<T, bf16>) {
    detail::reduce_widened(c, send, n, recv, n, [&](const float* in, float* out) { exscan(c, axes, in, out, n, op); });
  } else {
    const auto type = detail::mpi_type<T>();
    const bool ran = c.run(
        {collective::exscan, axes, n * static_cast<std::int64_t>(sizeof(T)), true},
        [&] { MPI_Exscan(send, recv, detail::checked_count(n), type, detail::mpi_op(op), c.over(axes)); },
        [&](MPI_Request* r) {
          MPI_Iexscan(send, recv, detail::checked_count(n), type, detail::mpi_op(op), c.over(axes), r);
        });
    int me = 0;
    if (ran && c.size_over(axes) > 1) MPI_Comm_rank(c.over(axes), &me);
    if (ran && me == 0)
      for (std::int64_t i = 0; i < n; ++i) recv[i] = T{};
  }
}

// From sub-rank root to every processor along the axes.
template <class T>
void broadcast(communicator& c, axis_set axes, T* data, std::int64_t n, int root = 0) {
  const auto type = detail::mpi_type<T>();
  c.run(
      {collective::broadcast, axes, n * static_cast<std::int64_t>(sizeof(T))},
      [&] { MPI_Bcast(data, detail::checked_count(n), type, root, c.over(axes)); },
      [&](MPI_Request* r) { MPI_Ibcast(data, detail::checked_count(n), type, root, c.over(axes), r); });
}

}  // namespace meshtensor
