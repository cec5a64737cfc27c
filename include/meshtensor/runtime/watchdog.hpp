#pragma once
// The collective watchdog (docs/design/faults.md, "Faults"). A rank that stops answering (stopped,
// swapping, a deadlocked thread) leaves the others waiting in MPI forever: nothing fails, nothing
// ends. With MESHTENSOR_COLLECTIVE_TIMEOUT=S (seconds, > 0) every collective of collectives.hpp is
// started nonblocking and polled; one still incomplete after S seconds ends the job (MPI_Abort with
// exit code 75, EX_TEMPFAIL: worth a restart) with a line on every rank that waited, e.g.
//
//   meshtensor: collective watchdog: rank 0 waited 3.0 s in allreduce of 2048 bytes over mesh axes
//   rows (ranks 0, 2), in op 'einsum' (backward) on tensor<batch, d_model>; did not arrive: rank 2
//   (waiting in another collective, over mesh axes cols); not answering at all: rank 3 (stopped,
//   dead, or busy outside any collective); MESHTENSOR_COLLECTIVE_TIMEOUT=3 s; ending the job
//
// Who did not arrive cannot be read from a collective that has not completed. So a rank that times
// out sends a small notice to every rank of the mesh, on a private duplicate of the mesh's
// communicator, and listens for a grace period; a rank waiting in any collective answers with the
// axes and number of the collective it waits in (it looks for notices once a collective has waited
// 100 ms). The line then says, for each member that did not arrive, whether it waits elsewhere, and
// which ranks of the mesh do not answer at all: stopped, dead, or busy outside any collective.
// Nothing is sent while collectives complete in time: the cost of the watchdog on is the
// nonblocking start and the polling (docs/performance.md measures it).
// A pipeline's messages between stages (pipeline/stages.hpp) are awaited the same way over a
// communicator of the whole pipeline (pipeline_watch()); a rank waiting in either kind answers the
// notices of both, so a stage's rank waiting inside its own stage is not reported as silent.
// Unset or 0: MPI's blocking calls, as without a watchdog (one branch per collective).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../plan/collective_context.hpp"
#include "../plan/ledger.hpp"

namespace meshtensor::detail {

inline constexpr int watchdog_exit_code = 75;
inline constexpr int watchdog_notice_tag = 0x7761;

// MESHTENSOR_COLLECTIVE_TIMEOUT in seconds, read once; 0 when unset (off). A value that is not a
// non-negative number is an error naming it (every rank reads the same environment from mpiexec).
inline double collective_timeout() {
  static const double seconds = [] {
    const char* text = std::getenv("MESHTENSOR_COLLECTIVE_TIMEOUT");
    if (!text || !*text) return 0.0;
    char* end = nullptr;
    const double s = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(s >= 0) || s > 1e9)
      throw error(cat("MESHTENSOR_COLLECTIVE_TIMEOUT='", text,
                      "' is not a number of seconds (a collective's time limit; 0 or unset: no limit)"));
    return s;
  }();
  return seconds;
}

inline std::vector<int> translate_ranks(MPI_Comm from, const std::vector<int>& ranks, MPI_Comm to) {
  MPI_Group a, b;
  MPI_Comm_group(from, &a);
  MPI_Comm_group(to, &b);
  std::vector<int> out(ranks.size(), MPI_UNDEFINED);
  MPI_Group_translate_ranks(a, static_cast<int>(ranks.size()), ranks.data(), b, out.data());
  MPI_Group_free(&a);
  MPI_Group_free(&b);
  return out;
}

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// What a waiting rank says about itself: the axes of the collective it waits in and how many
// collectives over those axes it had called before (the same on every member of a group, since they
// call the same collectives in the same order).
struct watch_ticket {
  std::int64_t mask = -1;
  std::int64_t sequence = -1;
  friend bool operator==(const watch_ticket&, const watch_ticket&) = default;
};
// The mask of a ticket of a rank waiting for a pipeline message (no mesh axes: between stages).
inline constexpr std::int64_t pipeline_message_mask = -2;

// The pipeline's watch communicator (all its stages), while a pipeline::stages under the watchdog
// lives: a rank waiting in a collective of its own stage answers notices there too.
inline MPI_Comm& pipeline_watch() {
  static MPI_Comm comm = MPI_COMM_NULL;
  return comm;
}

// Sends this rank's ticket to rank `to` of watch, never waited on: the job ends, or it is delivered.
inline void send_ticket(const watch_ticket& mine, int to, MPI_Comm watch) {
  static std::deque<watch_ticket> in_flight;  // stable addresses until MPI has sent them
  in_flight.push_back(mine);
  MPI_Request req;
  MPI_Isend(&in_flight.back(), 2, MPI_INT64_T, to, watchdog_notice_tag, watch, &req);
  MPI_Request_free(&req);
}

// The notices that arrived, received: (sender, its ticket).
inline std::vector<std::pair<int, watch_ticket>> receive_notices(MPI_Comm watch) {
  std::vector<std::pair<int, watch_ticket>> got;
  for (;;) {
    int seen = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, watchdog_notice_tag, watch, &seen, &st);
    if (!seen) return got;
    watch_ticket t;
    MPI_Recv(&t, 2, MPI_INT64_T, st.MPI_SOURCE, watchdog_notice_tag, watch, MPI_STATUS_IGNORE);
    got.emplace_back(st.MPI_SOURCE, t);
  }
}

// Waits for the n requests of one collective over group (a communicator, or the ranks of watch
// that take part: a pipeline message's two); past the time limit, finds out who did not arrive and
// ends the job. A rank that times out sends its ticket to every rank of watch (and of also_answer)
// and listens for a grace period; every rank waiting in any collective answers the first notice from each sender
// with its own ticket. So the rank that timed out learns, for each member of its group, whether it
// waits elsewhere (waiting(ticket) says where: "in another collective, over mesh axes rows") or
// does not answer at all, and which ranks of watch do not answer: the ones to look at. what()
// describes the collective; both are used only then. Notices arriving on also_answer (the other
// kind of watch communicator this rank belongs to) are answered with this rank's ticket too.
template <class Group, class What, class Waiting>
void await_collective(MPI_Request* requests, int n, const Group& group, MPI_Comm watch, watch_ticket mine, What what,
                      Waiting waiting, MPI_Comm also_answer = MPI_COMM_NULL) {
  using clock = std::chrono::steady_clock;
  const double limit = collective_timeout();
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(limit));
  auto next_look = start + std::chrono::milliseconds(100);
  int done = 0;
  int size = 0, me = 0;
  std::vector<char> answered;
  std::vector<std::pair<int, watch_ticket>> heard;
  const auto answer = [&](const std::vector<std::pair<int, watch_ticket>>& notices) {
    if (answered.empty()) answered.assign(static_cast<std::size_t>(size), 0);
    for (const auto& [from, ticket] : notices) {
      heard.emplace_back(from, ticket);
      if (!answered[static_cast<std::size_t>(from)]) send_ticket(mine, from, watch);
      answered[static_cast<std::size_t>(from)] = 1;
    }
  };
  // Notices on also_answer: answered once per sender, and the sender noted as alive (it waits too:
  // after it has timed out it answers no second notice, so its first is what says it is there).
  const bool ask_also = also_answer != MPI_COMM_NULL && also_answer != watch;
  std::vector<char> also_heard;
  const auto answer_elsewhere = [&] {
    if (!ask_also) return;
    if (also_heard.empty()) {
      int n = 0;
      MPI_Comm_size(also_answer, &n);
      also_heard.assign(static_cast<std::size_t>(n), 0);
    }
    for (const auto& notice : receive_notices(also_answer)) {
      if (!also_heard[static_cast<std::size_t>(notice.first)]) send_ticket(mine, notice.first, also_answer);
      also_heard[static_cast<std::size_t>(notice.first)] = 1;
    }
  };
  for (unsigned spins = 1;; ++spins) {
    MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    // Most collectives complete within the first 256 tests (microseconds), which read no clock: a
    // clock read at each took a quarter of those short waits (perf) and slowed MPI's progress. A
    // longer wait reads it every 16 tests: on oversubscribed cores a test can yield the core for a
    // time slice, and 256 of those could delay the answer to a timed-out rank's notice (1.5 s of
    // grace); 16 cannot.
    if (spins < 256 || spins % 16) continue;
    const auto now = clock::now();
    if (now >= deadline) break;
    if (now >= next_look) {  // someone may have timed out and be asking who is here
      next_look = now + std::chrono::milliseconds(10);
      if (!size) {
        MPI_Comm_size(watch, &size);
        MPI_Comm_rank(watch, &me);
      }
      answer(receive_notices(watch));
      answer_elsewhere();
    }
  }
  const double waited = std::chrono::duration<double>(clock::now() - start).count();
  if (!size) {
    MPI_Comm_size(watch, &size);
    MPI_Comm_rank(watch, &me);
  }
  answered.assign(static_cast<std::size_t>(size), 1);  // everyone gets this notice: no answers needed
  for (int r = 0; r < size; ++r)
    if (r != me) send_ticket(mine, r, watch);
  // The other watch communicator (a pipeline's: every stage) is asked too, so that the silent ranks
  // are found over the whole job, not only over this collective's mesh.
  int also_size = 0, also_me = 0;
  if (ask_also) {
    answer_elsewhere();  // sizes also_heard
    MPI_Comm_size(also_answer, &also_size);
    MPI_Comm_rank(also_answer, &also_me);
    for (int r = 0; r < also_size; ++r)
      if (r != also_me && !also_heard[static_cast<std::size_t>(r)]) send_ticket(mine, r, also_answer);
  }
  const auto grace_end = clock::now() + std::chrono::milliseconds(1500);
  while (clock::now() < grace_end) {
    answer(receive_notices(watch));
    answer_elsewhere();  // an answer, or another's notice
  }

  // Each rank's last word (none: not answering), in ranks of watch.
  std::vector<std::optional<watch_ticket>> said(static_cast<std::size_t>(size));
  for (const auto& [from, ticket] : heard) said[static_cast<std::size_t>(from)] = ticket;
  said[static_cast<std::size_t>(me)] = mine;
  std::vector<int> members;
  if constexpr (std::is_same_v<Group, MPI_Comm>) {
    int group_size = 0;
    MPI_Comm_size(group, &group_size);
    std::vector<int> group_ranks(static_cast<std::size_t>(group_size));
    for (int i = 0; i < group_size; ++i) group_ranks[static_cast<std::size_t>(i)] = i;
    members = translate_ranks(group, group_ranks, watch);
  } else {
    members = group;
  }
  std::vector<int> all(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) all[static_cast<std::size_t>(i)] = i;
  const auto world = translate_ranks(watch, all, MPI_COMM_WORLD);
  const auto world_of = [&](int r) { return world[static_cast<std::size_t>(r)] == MPI_UNDEFINED ? r : world[static_cast<std::size_t>(r)]; };

  std::string absent;
  for (const int r : members) {
    const auto& t = said[static_cast<std::size_t>(r)];
    if (t && *t == mine) continue;  // waits in this very collective
    absent += cat(absent.empty() ? "" : ", ", "rank ", world_of(r),
                  t ? cat(" (waiting ", waiting(*t), ")")
                    : std::string(" (not answering)"));
  }
  std::vector<int> silent;
  if (!ask_also) {
    for (int r = 0; r < size; ++r)
      if (!said[static_cast<std::size_t>(r)]) silent.push_back(world_of(r));
  } else {  // silent on both: in world ranks, over the ranks of either communicator
    std::vector<int> spoke;
    for (int r = 0; r < size; ++r)
      if (said[static_cast<std::size_t>(r)]) spoke.push_back(world_of(r));
    std::vector<int> also_all(static_cast<std::size_t>(also_size));
    for (int i = 0; i < also_size; ++i) also_all[static_cast<std::size_t>(i)] = i;
    const auto also_world = translate_ranks(also_answer, also_all, MPI_COMM_WORLD);
    std::vector<int> everyone(world.begin(), world.end());
    for (int r = 0; r < also_size; ++r) {
      everyone.push_back(also_world[static_cast<std::size_t>(r)]);
      if (r == also_me || also_heard[static_cast<std::size_t>(r)]) spoke.push_back(also_world[static_cast<std::size_t>(r)]);
    }
    std::sort(everyone.begin(), everyone.end());
    everyone.erase(std::unique(everyone.begin(), everyone.end()), everyone.end());
    for (const int w : everyone)
      if (w != MPI_UNDEFINED && std::find(spoke.begin(), spoke.end(), w) == spoke.end()) silent.push_back(w);
  }
  std::vector<int> member_world;
  for (const int r : members) member_world.push_back(world_of(r));

  const auto& running = collective_context::get();
  const plan_phase phase = plan_ledger::get().phase();
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", waited);
  std::string line = cat("meshtensor: collective watchdog: rank ", world_of(me), " waited ", seconds, " s in ", what(),
                         " (ranks ", rank_list(member_world), ")");
  if (running.op) {
    const std::string base(running.op), label = plan_ledger::label_of(running.op, phase);
    line += cat(", in op '", base, "'", label.substr(base.size()));
  }
  if (running.tensor) line += cat(" on ", running.tensor());
  line += absent.empty() ? std::string("; every rank of the group waits in it too (collectives called in different orders?)")
                         : cat("; did not arrive: ", absent);
  if (!silent.empty())
    line += cat("; not answering at all: rank", silent.size() > 1 ? "s " : " ", rank_list(silent),
                " (stopped, dead, or busy outside any collective)");
  line += cat("; MESHTENSOR_COLLECTIVE_TIMEOUT=", limit, " s; ending the job\n");
  std::fflush(stdout);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  // The others that waited print theirs too before the abort's kill reaches them: they heard this
  // rank's notice, and their own grace periods end within moments of this one.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  MPI_Abort(MPI_COMM_WORLD, watchdog_exit_code);
  std::abort();
}

// A blocking MPI region the watchdog cannot poll (a checkpoint's collective MPI-IO and its
// file-system agreements): under MESHTENSOR_COLLECTIVE_TIMEOUT a thread waits for the region's end
// and, past the limit, prints the watchdog's line naming the region and ends this process with the
// watchdog's exit code (mpiexec then ends the job). The thread calls no MPI (MPI is initialised
// FUNNELED), so it cannot ask who did not arrive. Without a limit: nothing, no thread.
class unpolled_region_deadline {
 public:
  explicit unpolled_region_deadline(std::string what) {
    const double limit = collective_timeout();
    if (limit <= 0) return;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    thread_ = std::thread([this, limit, rank, what = std::move(what)] {
      std::unique_lock lock(mutex_);
      if (ended_.wait_for(lock, std::chrono::duration<double>(limit), [this] { return done_; })) return;
      std::fprintf(stderr,
                   "meshtensor: collective watchdog: rank %d waited %.1f s in %s (blocking MPI-IO, which cannot be "
                   "polled: who did not arrive is not known); MESHTENSOR_COLLECTIVE_TIMEOUT=%g s; ending the job\n",
                   rank, limit, what.c_str(), limit);
      std::fflush(stderr);
      std::_Exit(watchdog_exit_code);
    });
  }
  ~unpolled_region_deadline() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    ended_.notify_one();
    thread_.join();
  }
  unpolled_region_deadline(const unpolled_region_deadline&) = delete;
  unpolled_region_deadline& operator=(const unpolled_region_deadline&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable ended_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace meshtensor::detail
