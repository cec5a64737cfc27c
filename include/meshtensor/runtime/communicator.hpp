#pragma once
// The run-time half of a mesh: a Cartesian communicator, the sub-communicator of every subset of
// axes (created on first use, then cached), and counters of calls and bytes per collective and
// axis set, which tests compare with each op's static plan.
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../geometry/mesh_shape.hpp"
#include "agreement.hpp"
#include "../plan/collective.hpp"
#include "../plan/ledger.hpp"
#include "watchdog.hpp"

namespace meshtensor {

// A collective as its door (communicator::run, start) takes it: which, over which axes, the bytes
// this rank sends, and whether it does nothing over a group of one (an allreduce, a reduce_scatter
// or an exscan whose result is its input; an allgather still copies into its receive buffer).
struct collective_call {
  collective kind;
  axis_set axes;
  std::int64_t bytes;
  bool alone_is_noop = false;
};

// A collective started through the door (communicator::start): MPI's request, MPI_REQUEST_NULL
// where nothing is sent (a plan, a group of one where that is a no-op); in a plan, the ledger's
// ticket, so that its wait (communicator::await_started) takes its place in the plan's order and
// the cost model can credit the work done while it was in flight (plan/timeline.hpp).
struct started_collective {
  MPI_Request request = MPI_REQUEST_NULL;
  std::int64_t plan_ticket = -1;
};

class communicator {
 public:
  communicator(MPI_Comm parent, std::vector<std::string> axis_names, std::vector<int> sizes)
      : shape_(std::move(axis_names), std::move(sizes)) {
    int world = 0;
    MPI_Comm_size(parent, &world);
    if (shape_.nprocs() != world)
      throw mesh_error(detail::cat("mesh ", shape_.to_string(), " needs ", shape_.nprocs(), " processes, but the communicator has ",
                           world, "; run with mpiexec -n ", shape_.nprocs(), " or choose sizes whose product is ",
                           world));
    const auto& axis_sizes = shape_.sizes();
    std::vector<int> periods(axis_sizes.size(), 1);
    // reorder = 0: rank order stays row-major over the axes, last axis fastest (Mesh-TensorFlow's
    // order, and mesh_shape's).
    MPI_Cart_create(parent, static_cast<int>(axis_sizes.size()), axis_sizes.data(), periods.data(), 0, &cart_);
    MPI_Comm_rank(cart_, &rank_);
    coords_ = shape_.coords_of(rank_);
    // The watchdog's notices travel apart from every collective of the program's (watchdog.hpp),
    // and every sub-communicator is made now: made on first use, inside an op, its creation would
    // be a collective the watchdog cannot watch.
    if (detail::collective_timeout() > 0) {
      MPI_Comm_dup(cart_, &watch_);
      for (unsigned mask = 1; mask < (1u << axis_sizes.size()); ++mask) over(mask);
    }
  }
  // A planned communicator: the processor at coords of a mesh of these sizes, with no processes
  // behind it (detail::plan_ledger.hpp). Collectives are counted as a real run counts them, and not sent.
  communicator(std::vector<std::string> axis_names, std::vector<int> sizes, const std::vector<int>& coords)
      : shape_(std::move(axis_names), std::move(sizes)), planned_(true) {
    const auto& axis_sizes = shape_.sizes();
    if (coords.size() != axis_sizes.size())
      throw mesh_error(detail::cat("planned mesh ", shape_.to_string(), ": ", coords.size(), " coordinates given for ",
                           axis_sizes.size(), " axes"));
    for (std::size_t i = 0; i < coords.size(); ++i)
      if (coords[i] < 0 || coords[i] >= axis_sizes[i])
        throw mesh_error(detail::cat("planned mesh ", shape_.to_string(), ": coordinate ", coords[i], " is outside axis '",
                             shape_.axis_names()[i], "' of size ", axis_sizes[i]));
    coords_ = coords;
    rank_ = static_cast<int>(shape_.rank_of(coords_));
    if (detail::plan_ledger::get().planned_meshes++ == 0) detail::plan_ledger::get().reset();
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() {
    if (planned_) {
      --detail::plan_ledger::get().planned_meshes;
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& [mask, comm] : subs_) MPI_Comm_free(&comm);
    if (watch_ != MPI_COMM_NULL) MPI_Comm_free(&watch_);
    MPI_Comm_free(&cart_);
  }

  MPI_Comm cart() const { return cart_; }
  int rank() const { return rank_; }
  int nprocs() const { return static_cast<int>(shape_.nprocs()); }
  const mesh_shape& shape() const { return shape_; }
  const std::vector<int>& sizes() const { return shape_.sizes(); }
  const std::vector<int>& coords() const { return coords_; }
  const std::vector<std::string>& axis_names() const { return shape_.axis_names(); }
  std::vector<int> coords_of(int rank) const { return shape_.coords_of(rank); }
  // Number of processors along the axes of a mask.
  int size_over(axis_set mask) const { return shape_.size_over(mask); }

  // The communicator of the processors that differ only in the axes of mask. Its ranks run
  // row-major over those axes in mesh order (MPI_Cart_sub keeps the Cartesian order).
  MPI_Comm over(axis_set mask) {
    if (planned_)
      throw error(detail::cat("meshtensor: an MPI call over axes ", shape_.axes_string(mask), " of the planned mesh ",
                      shape_.to_string(), " (a planned run sends nothing; this call site should be skipped)"));
    auto it = subs_.find(mask.mask());
    if (it != subs_.end()) return it->second;
    const auto& axis_sizes = shape_.sizes();
    std::vector<int> keep(axis_sizes.size());
    for (std::size_t i = 0; i < axis_sizes.size(); ++i) keep[i] = mask.contains(static_cast<int>(i));
    MPI_Comm sub = MPI_COMM_NULL;
    if (axis_sizes.empty())
      MPI_Comm_dup(cart_, &sub);
    else
      MPI_Cart_sub(cart_, keep.data(), &sub);
    subs_.emplace(mask.mask(), sub);
    return sub;
  }

  std::string axes_string(axis_set mask) const { return shape_.axes_string(mask); }

  // Every counted collective, in order, while an op's plan is being checked (ops/op_call.hpp);
  // null otherwise.
  std::vector<comm_key>* call_log() const { return call_log_; }
  void set_call_log(std::vector<comm_key>* log) { call_log_ = log; }
  // The one door of a collective (runtime/collectives.hpp's entry points, host_io's scatter and
  // gather): described once, then counted (the ledger of a plan, an op's plan check, the
  // watchdog's tickets), skipped in a plan, skipped over a group of one where that is a no-op, and
  // run: blocking() is MPI's blocking form; under the watchdog (MESHTENSOR_COLLECTIVE_TIMEOUT)
  // start(MPI_Request* two) starts its nonblocking form (one or two requests; the second stays
  // MPI_REQUEST_NULL if unused) and the door waits for it with a time limit, or start() runs an
  // exchange of its own that waits through await() (the allreduce's recursive doubling). Returns
  // false in a plan: the caller's buffers then hold nothing received.
  template <class Blocking, class Start>
  bool run(const collective_call& c, Blocking blocking, Start start) {
    count(c.kind, c.axes, c.bytes, plan_event_kind::blocking);
    if (planned_) return false;
    if (c.alone_is_noop && size_over(c.axes) == 1) return true;
    const timed_wait waiting(*this);
    if (watch_ == MPI_COMM_NULL) {
      blocking();
    } else if constexpr (std::is_invocable_v<Start>) {
      start();
    } else {
      MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      start(requests);
      await(requests, 2, c.kind, c.axes, c.bytes);
    }
    return true;
  }
  // The door of a started collective: counted and skipped as run() is; begin(MPI_Request*) starts
  // it, and what is returned is awaited later (await_started, under the watchdog).
  template <class Begin>
  started_collective start(const collective_call& c, Begin begin) {
    started_collective s;
    s.plan_ticket = count(c.kind, c.axes, c.bytes, plan_event_kind::started);
    if (planned_ || (c.alone_is_noop && size_over(c.axes) == 1)) return s;
    begin(&s.request);
    return s;
  }
  // Waits for a started collective (nothing where nothing was sent); in a plan, marks its wait.
  void await_started(started_collective& s, collective kind, axis_set mask, std::int64_t bytes) {
    if (planned_) {
      if (s.plan_ticket >= 0) detail::plan_ledger::get().add_event(plan_event_kind::waited, kind, mask, bytes, s.plan_ticket);
    } else if (s.request != MPI_REQUEST_NULL) {
      await(&s.request, 1, kind, mask, bytes);
    }
    s.plan_ticket = -1;
  }
  // Waits for requests of a collective started elsewhere (a started allreduce), under the watchdog
  // when it is on.
  void await(MPI_Request* requests, int n, collective kind, axis_set mask, std::int64_t bytes) {
    const timed_wait waiting(*this);
    if (watch_ == MPI_COMM_NULL) {
      MPI_Waitall(n, requests, MPI_STATUSES_IGNORE);
      return;
    }
    detail::await_collective(
        requests, n, over(mask), watch_, detail::watch_ticket{mask.mask(), sequence_[mask.mask()]},
        [&] { return detail::cat(to_string(kind), " of ", bytes, " bytes over mesh axes ", axes_string(mask)); },
        [&](const detail::watch_ticket& other) {
          return other.mask == detail::pipeline_message_mask
                     ? std::string("for a pipeline message to or from another stage")
                     : detail::cat("in another collective, over mesh axes ",
                                   axes_string(axis_set(static_cast<unsigned>(other.mask))));
        },
        detail::pipeline_watch());
  }
  // Runs wait() as a wait for others, counted in collective_seconds (a pipeline's messages between
  // stages, which are awaited outside this communicator).
  template <class Wait>
  void timed(Wait wait) {
    const timed_wait waiting(*this);
    wait();
  }
  // The communicator the watchdog's notices travel on (MPI_COMM_NULL without a watchdog).
  MPI_Comm watch_comm() const { return watch_; }
  // agree_or_throw (agreement.hpp) over the whole mesh, its allreduce watched like a collective
  // under the watchdog: the checks made at a step's start (from_host's) come before its first
  // collective, and ranks blocked there would neither see a stopped rank nor answer a timed-out
  // one's notice.
  template <class E = shape_error>
  void agree_or_throw(bool ok_here, const std::string& message_if_not) {
    const timed_wait waiting(*this);  // a step's first wait for the others is often this one
    if (watch_ == MPI_COMM_NULL) return detail::agree_or_throw<E>(cart_, ok_here, message_if_not);
    const unsigned all = (1u << shape_.sizes().size()) - 1u;
    ++sequence_[all];  // every rank agrees in the same order: the tickets stay comparable
    int me = 0;
    MPI_Comm_rank(over(all), &me);
    int mine = ok_here ? INT_MAX : me, first = INT_MAX;
    MPI_Request requests[1];
    MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, over(all), &requests[0]);
    await(requests, 1, collective::allreduce, all, sizeof(int));
    detail::throw_if_agreed_failure<E>(over(all), me, first, message_if_not);
  }
  // The largest of the ranks' values over the whole mesh: one MPI_Allreduce (MPI_MAX) of one int.
  // Like agree_or_throw, a program's bookkeeping (stop_request.hpp's agreed stop), not an op's:
  // not counted, so plans and counters are unchanged; watched under the watchdog, since a rank
  // that never arrives must not leave the others waiting here either. A planned mesh has no one
  // to agree with: mine.
  int agree_max(int mine) {
    if (planned_) return mine;
    const timed_wait waiting(*this);
    int largest = mine;
    if (watch_ == MPI_COMM_NULL) {
      MPI_Allreduce(&mine, &largest, 1, MPI_INT, MPI_MAX, cart_);
      return largest;
    }
    const unsigned all = (1u << shape_.sizes().size()) - 1u;
    ++sequence_[all];  // as agree_or_throw: every rank agrees in the same order
    MPI_Request requests[1];
    MPI_Iallreduce(&mine, &largest, 1, MPI_INT, MPI_MAX, over(all), &requests[0]);
    await(requests, 1, collective::allreduce, all, sizeof(int));
    return largest;
  }
  // Every rank's values, n per rank, rank by rank (in the mesh's rank order): one MPI_Allgather of
  // doubles over the whole mesh. Bookkeeping, as agree_max (runtime/straggler.hpp's report): not
  // counted, watched under the watchdog. A planned mesh: mine.
  std::vector<double> gather_bookkeeping(const std::vector<double>& mine) {
    if (planned_) return mine;
    const int n = static_cast<int>(mine.size());
    std::vector<double> all(mine.size() * static_cast<std::size_t>(shape_.nprocs()));
    if (watch_ == MPI_COMM_NULL) {
      MPI_Allgather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, cart_);
      return all;
    }
    const unsigned whole = (1u << shape_.sizes().size()) - 1u;
    ++sequence_[whole];  // as agree_or_throw: every rank gathers in the same order
    MPI_Request requests[1];
    MPI_Iallgather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, over(whole), &requests[0]);
    await(requests, 1, collective::allgather, whole, static_cast<std::int64_t>(mine.size() * sizeof(double)));
    return all;
  }
  // Seconds this processor has spent inside collectives (their blocking calls and their waits, and
  // the agreements) since the communicator was made: the time it waited for others, and moved data.
  double collective_seconds() const { return collective_seconds_; }
  // True under the collective watchdog (MESHTENSOR_COLLECTIVE_TIMEOUT).
  bool watched() const { return watch_ != MPI_COMM_NULL; }
  // True for a planned communicator (no processes, no MPI).
  bool planned() const { return planned_; }
  // While a routed_bytes scope (below) lives, the bytes counted are the data's: comm_count::routed_bytes.
  void begin_routed() { ++routed_depth_; }
  void end_routed() { --routed_depth_; }
  const comm_counters& counters() const { return counters_; }
  void reset_counters() { counters_.clear(); }

 private:
  // Only the door counts: a collective that skips it has nothing to count with.
  // In a plan, the event's place in the step's order too: its ticket where started, else -1.
  std::int64_t count(collective kind, axis_set mask, std::int64_t bytes, plan_event_kind how) {
    auto& c = counters_[{kind, mask}];
    c.calls += 1;
    c.bytes += bytes;
    if (routed_depth_ > 0) c.routed_bytes += bytes;
    if (watch_ != MPI_COMM_NULL) ++sequence_[mask.mask()];
    if (call_log_) call_log_->push_back({kind, mask});
    if (!planned_) return -1;
    detail::plan_ledger::get().count(to_string(kind), mask, bytes);
    return detail::plan_ledger::get().add_event(how, kind, mask, bytes);
  }

  // Times a collective's call or wait into collective_seconds_; a wait inside another (the
  // allreduce's recursive doubling awaits its steps) is not counted twice.
  class timed_wait {
   public:
    explicit timed_wait(communicator& c) : c_(c), outer_(c.waiting_depth_++ == 0) {
      if (outer_) t0_ = std::chrono::steady_clock::now();
    }
    timed_wait(const timed_wait&) = delete;
    timed_wait& operator=(const timed_wait&) = delete;
    ~timed_wait() {
      --c_.waiting_depth_;
      if (outer_) c_.collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }

   private:
    communicator& c_;
    bool outer_;
    std::chrono::steady_clock::time_point t0_;
  };

  mesh_shape shape_;
  std::vector<int> coords_;
  MPI_Comm cart_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::map<unsigned, MPI_Comm> subs_;
  comm_counters counters_;
  std::vector<comm_key>* call_log_ = nullptr;
  int routed_depth_ = 0;
  bool planned_ = false;
  MPI_Comm watch_ = MPI_COMM_NULL;
  std::map<unsigned, std::int64_t> sequence_;  // collectives called per axis set: the watchdog's tickets
  double collective_seconds_ = 0;
  int waiting_depth_ = 0;
};

namespace detail {
// The name the library's own code has used for it; the class is public (the collectives take it).
using communicator = meshtensor::communicator;
}  // namespace detail
// The collectives counted while it lives move as many bytes as the data decides (a ragged
// dispatch's rows going back to the tokens the router sent): counted apart, as comm_count's
// routed_bytes, which a plan can predict only summed over the processors.
class routed_bytes {
 public:
  explicit routed_bytes(communicator& c) : c_(c) { c_.begin_routed(); }
  routed_bytes(const routed_bytes&) = delete;
  routed_bytes& operator=(const routed_bytes&) = delete;
  ~routed_bytes() { c_.end_routed(); }

 private:
  communicator& c_;
};

}  // namespace meshtensor
