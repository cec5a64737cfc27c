#pragma once
// A thread that moves MPI on while the main thread computes (MESHTENSOR_PROGRESS_THREAD).
//
// Most MPIs (Open MPI without its async progress, MPICH by default) advance a nonblocking
// collective only inside an MPI call. meshtensor polls by default: the backward pass calls MPI_Test
// on what is in flight between its rules, and the layers that overlap call progress() between their
// products (arriving gradients, started relayouts, the gradient buckets). Between two polls a
// product runs with nothing moving, and a peer waiting on this rank's part of a collective waits
// too. With MESHTENSOR_PROGRESS_THREAD=US set (microseconds between polls; 0 polls without
// pausing) the environment asks MPI for MPI_THREAD_MULTIPLE and runs this thread, which calls
// MPI_Iprobe on a communicator of its own every US microseconds: any MPI call runs the library's
// progress engine, which advances every request of the process (the probe itself matches nothing).
// The polling stays. The price is a core's share: on a machine whose cores are all computing, the thread's wake-ups take
// from the products (docs/performance.md measures both ways).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace meshtensor {

namespace detail {

inline std::atomic<bool>& progress_thread_flag() {
  static std::atomic<bool> on{false};
  return on;
}

// MESHTENSOR_PROGRESS_THREAD as microseconds: -1 unset (or empty), -2 not a whole number >= 0.
inline long progress_thread_setting() {
  const char* s = std::getenv("MESHTENSOR_PROGRESS_THREAD");
  if (s == nullptr || *s == '\0') return -1;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return (*end != '\0' || v < 0 || v > 1000000) ? -2 : v;
}

class progress_thread {
 public:
  // Collective over MPI_COMM_WORLD (the communicator's duplicate); MPI at MPI_THREAD_MULTIPLE.
  explicit progress_thread(long interval_us) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    thread_ = std::thread([this, interval_us] {
      while (!stopping_.load()) {
        int matched = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &matched, MPI_STATUS_IGNORE);
        if (interval_us == 0) continue;
        // Woken at once by stop(): an environment's end does not wait out a long interval.
        std::unique_lock lock(mutex_);
        woken_.wait_for(lock, std::chrono::microseconds(interval_us), [this] { return stopping_.load(); });
      }
    });
    progress_thread_flag() = true;
  }
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;
  // Ends the thread: no MPI call of its own after this (before MPI's last calls or an abort).
  void stop() {
    if (!thread_.joinable()) return;
    progress_thread_flag() = false;
    {
      const std::lock_guard lock(mutex_);  // a wait between its check and its sleep still sees it
      stopping_ = true;
    }
    woken_.notify_all();
    thread_.join();
  }
  // The communicator is freed where MPI still lives (the environment frees it after its rendezvous).
  ~progress_thread() {
    stop();
    int started = 0, finished = 0;
    MPI_Initialized(&started);
    MPI_Finalized(&finished);
    if (started && !finished) MPI_Comm_free(&comm_);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::mutex mutex_;
  std::condition_variable woken_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace detail

// Whether the environment runs the progress thread (MESHTENSOR_PROGRESS_THREAD).
inline bool progress_thread_running() { return detail::progress_thread_flag().load(); }

}  // namespace meshtensor
