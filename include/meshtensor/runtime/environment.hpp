#pragma once
// RAII for MPI and Kokkos: initialises what the host program has not, finalises only what it started.
//
// No rank is ever left waiting. An SPMD job hangs when one rank stops taking part in collectives
// (it threw, caught, and returned from main) while the others wait in one. The rule:
//  1. An error meshtensor raises is raised on every rank alike, so all ranks leave together. Checks
//     on data all ranks share (types, extents, mesh sizes) fail alike by themselves; a check on
//     data each rank holds for itself (a host array's size) is first agreed with one collective,
//     detail::agree_or_throw (agreement.hpp), so every rank throws the same error.
//  2. An error only some ranks see ends the whole job, with its message, within seconds:
//     - uncaught: the std::terminate handler installed here prints "meshtensor: rank R: uncaught
//       exception: <what>" and calls MPI_Abort;
//     - caught in main: `catch (const std::exception& e) { return env.fail(e, "prog: "); }`. fail
//       waits up to MESHTENSOR_FAIL_TIMEOUT seconds (default 5) for the other ranks to stop too. If
//       every rank failed (rule 1), rank 0 prints "prog: <what>" once and every rank returns the
//       exit code, a clean exit. If some ranks finished normally, each failed rank prints
//       "meshtensor: rank R: <what>" and returns it. If the others do not arrive (they wait in a
//       collective this rank left), it prints "meshtensor: rank R: <what>" and MPI_Aborts.
//       env.abort(e) prints the same line and MPI_Aborts at once, without waiting;
//     - the environment's own start failing (MPI's thread support, ONEDNN_MAX_CPU_ISA; agreed, so
//       on every rank): its constructor throws environment_start_error, and a program that
//       constructs it inside a try returns e.report("prog: "): one line from rank 0, exit code 1
//       (MPI is finalised after that line, so no rank exits before it is out);
//     - an exception unwinding through ~environment is treated as fail, without the message (the
//       handler that catches it prints that);
//     - a rank that catches an error, prints it itself and returns from main without fail reaches
//       ~environment, which meets the other ranks in a non-blocking barrier (MPI_Iallreduce polled
//       with MPI_Test) before finalising. If they do not arrive within MESHTENSOR_FINALIZE_TIMEOUT
//       seconds (default 60; 0 waits forever, as MPI_Finalize would), it prints that it gave up and
//       MPI_Aborts the job instead of hanging in MPI_Finalize.
//  The rendezvous runs on a private duplicate of MPI_COMM_WORLD, so it never matches a collective
//  of the program's own.
//
// MPI is initialised with MPI_Init_thread(MPI_THREAD_FUNNELED) (Kokkos' host threads run while the
// main thread calls MPI); a library that provides less is an error naming both levels. With
// MESHTENSOR_PROGRESS_THREAD=US (progress_thread.hpp) it asks for MPI_THREAD_MULTIPLE and runs a
// thread that moves MPI on every US microseconds until the environment ends; the setting is agreed
// (a bad value, one that differs between ranks, or an MPI without MPI_THREAD_MULTIPLE is an
// environment_start_error on every rank).
//
// Kokkos gets a copy of argv without --help and -h (Kokkos 3.4 would print its whole help before
// the program's own; --kokkos-help still shows it), plus --kokkos-disable-warnings unless the
// environment variable KOKKOS_DISABLE_WARNINGS is set (KOKKOS_DISABLE_WARNINGS=0 brings back its
// per-rank OMP_PROC_BIND and oversubscription advice). The --kokkos-* arguments Kokkos consumes
// are removed from the program's argv, as Kokkos::initialize does; everything else stays, in order.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "cpu_isa.hpp"
#include "node.hpp"
#include "progress_thread.hpp"

namespace meshtensor {

namespace detail {

inline bool mpi_is_live() {
  int started = 0, finished = 0;
  MPI_Initialized(&started);
  MPI_Finalized(&finished);
  return started && !finished;
}

// "meshtensor: rank R: <text>" on stderr, in one write, after whatever stdout holds.
inline void report_on_rank(std::string_view text) {
  std::string line = "meshtensor: ";
  if (mpi_is_live()) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    line += "rank " + std::to_string(r) + ": ";
  }
  line.append(text);
  line += '\n';
  std::fflush(stdout);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// Prints the line and ends every rank of the job.
[[noreturn]] inline void abort_job(std::string_view text, int exit_code = 1) {
  report_on_rank(text);
  if (mpi_is_live()) MPI_Abort(MPI_COMM_WORLD, exit_code == 0 ? 1 : exit_code);
  std::abort();
}

// The std::terminate handler while an environment lives.
[[noreturn]] inline void terminate_job() {
  std::string what = "std::terminate was called without an exception";
  if (const auto p = std::current_exception()) {
    try {
      std::rethrow_exception(p);
    } catch (const std::exception& e) {
      what = std::string("uncaught exception: ") + e.what();
    } catch (...) {
      what = "uncaught exception not derived from std::exception";
    }
  }
  abort_job(what + "; aborting the job");
}

inline double seconds_from_env(const char* name, double fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  return end == s ? fallback : v;
}

inline const char* thread_level_name(int level) {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "an unknown level";
}

inline bool is_help_flag(const char* a) { return std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0; }

}  // namespace detail

// The environment did not start, alike on every rank (MPI's thread support, ONEDNN_MAX_CPU_ISA).
// There is no environment to fail() through: a program constructs its environment inside a try and
// returns report(prefix) from the catch, which prints "<prefix><what>" once (rank 0) and gives every
// rank exit_code. MPI, where the environment started it, is finalised by report() after rank 0 has
// printed (or when the last copy of the error dies), after a barrier: no rank exits non-zero, and
// has mpiexec kill the job, before rank 0's line is out.
struct environment_start_error : error {
  environment_start_error(const std::string& what, int world_rank, bool finalize_mpi)
      : error(what), rank(world_rank), mpi_(finalize_mpi ? std::shared_ptr<void>(nullptr, &finalize) : nullptr) {}
  int rank;
  int report(std::string_view prefix = "error: ", int exit_code = 1) const {
    if (rank == 0) {
      std::fflush(stdout);
      std::fprintf(stderr, "%.*s%s\n", static_cast<int>(prefix.size()), prefix.data(), what());
      std::fflush(stderr);
    }
    mpi_.reset();
    return exit_code;
  }

 private:
  static void finalize(void*) {
    if (!detail::mpi_is_live()) return;
    MPI_Barrier(MPI_COMM_WORLD);  // MPI_Finalize need not wait for the other ranks; this does
    MPI_Finalize();
  }
  mutable std::shared_ptr<void> mpi_;  // shared by the error's copies; its deleter finalises MPI
};

class environment {
 public:
  environment(int& argc, char**& argv) {
    int mpi_ready = 0;
    MPI_Initialized(&mpi_ready);
    const long progress_us = detail::progress_thread_setting();
    if (!mpi_ready) {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, progress_us >= 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
      owns_mpi_ = true;
    }
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      throw environment_start_error(detail::cat("meshtensor::environment: the MPI library provides thread support ",
                              detail::thread_level_name(provided), ", but meshtensor needs ",
                              "MPI_THREAD_FUNNELED (Kokkos' host threads run while the main thread calls MPI); "
                              "use an MPI built with thread support"), rank_, owns_mpi_);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    try {
      detail::agree_cpu_isa(MPI_COMM_WORLD);  // before any kernel: every rank rounds alike
    } catch (const std::exception& e) {
      throw environment_start_error(e.what(), rank_, owns_mpi_);
    }
    check_progress_setting(progress_us, provided);
    MPI_Comm_dup(MPI_COMM_WORLD, &end_comm_);
    uncaught_at_start_ = std::uncaught_exceptions();
    previous_terminate_ = std::set_terminate(&detail::terminate_job);
    if (!Kokkos::is_initialized()) {
      initialize_kokkos(argc, argv);
      owns_kokkos_ = true;
    }
    if (progress_us >= 0) progress_ = std::make_unique<detail::progress_thread>(progress_us);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (progress_) progress_->stop();  // no MPI call of its own past here; its communicator goes below
    if (detail::mpi_is_live()) {
      if (!met_) {
        if (std::uncaught_exceptions() > uncaught_at_start_) {
          if (rendezvous(true, fail_timeout()) < 0)
            detail::abort_job(detail::cat("an exception is leaving the scope of meshtensor::environment on this rank, "
                                          "and the other ranks did not stop within ", fail_timeout(),
                                          " s (MESHTENSOR_FAIL_TIMEOUT); aborting the job"));
        } else if (rendezvous(false, finalize_timeout()) < 0) {
          detail::abort_job(detail::cat("gave up waiting for the other ranks to finish: they did not arrive within ",
                                        finalize_timeout(), " s (MESHTENSOR_FINALIZE_TIMEOUT); one may have failed "
                                        "and left the others waiting in a collective; aborting the job"));
        }
      }
      progress_.reset();
      MPI_Comm_free(&end_comm_);
    }
    if (owns_kokkos_) Kokkos::finalize();
    if (owns_mpi_ && detail::mpi_is_live()) MPI_Finalize();
    std::set_terminate(previous_terminate_);
  }

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }

  // Ends the job over an error this rank caught, typically `return env.fail(e, "prog: ");` in main.
  // Waits up to MESHTENSOR_FAIL_TIMEOUT s (default 5) for the other ranks to stop too. All ranks
  // failed: rank 0 prints "<prefix><what>" and fail returns exit_code on every rank. Some ranks
  // finished normally: each failed rank prints "meshtensor: rank R: <what>" and returns exit_code.
  // The others did not arrive (they wait in a collective): prints that line and MPI_Aborts the job.
  int fail(std::string_view what, std::string_view prefix = "error: ", int exit_code = 1) {
    const int failed = met_ ? -2 : rendezvous(true, fail_timeout());
    if (failed == -1)
      detail::abort_job(detail::cat(what, "\nmeshtensor: rank ", rank_, ": the other ranks did not stop within ",
                                    fail_timeout(), " s (MESHTENSOR_FAIL_TIMEOUT); aborting the job"),
                        exit_code);
    if (failed == size_) {
      if (rank_ == 0) {
        std::fflush(stdout);
        std::fprintf(stderr, "%.*s%.*s\n", static_cast<int>(prefix.size()), prefix.data(), static_cast<int>(what.size()),
                     what.data());
        std::fflush(stderr);
      }
    } else {
      detail::report_on_rank(what);
    }
    return exit_code;
  }
  int fail(const std::exception& e, std::string_view prefix = "error: ", int exit_code = 1) {
    return fail(std::string_view(e.what()), prefix, exit_code);
  }

  // Prints "meshtensor: rank R: <what>" and ends every rank of the job now (MPI_Abort), for an
  // error this rank knows the others do not share.
  [[noreturn]] void abort(std::string_view what, int exit_code = 1) const { detail::abort_job(what, exit_code); }
  [[noreturn]] void abort(const std::exception& e, int exit_code = 1) const { detail::abort_job(e.what(), exit_code); }

  // Seconds a rank waits for the others at the end (MESHTENSOR_FINALIZE_TIMEOUT; <= 0: forever) and
  // after it failed (MESHTENSOR_FAIL_TIMEOUT; <= 0: forever).
  static double finalize_timeout() { return detail::seconds_from_env("MESHTENSOR_FINALIZE_TIMEOUT", 60.0); }
  static double fail_timeout() { return detail::seconds_from_env("MESHTENSOR_FAIL_TIMEOUT", 5.0); }

 private:
  // MESHTENSOR_PROGRESS_THREAD agreed over the ranks (an environment variable may differ per rank).
  void check_progress_setting(long mine, int provided) const {
    long range[3] = {mine, -mine, -static_cast<long>(provided)};  // the largest, minus the smallest, minus the least support
    MPI_Allreduce(MPI_IN_PLACE, range, 3, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    const int least_provided = static_cast<int>(-range[2]);
    const char* value = std::getenv("MESHTENSOR_PROGRESS_THREAD");
    const std::string here = value ? detail::cat("'", value, "' on rank ", rank_) : detail::cat("unset on rank ", rank_);
    if (-range[1] == -2)
      throw environment_start_error(detail::cat("meshtensor::environment: MESHTENSOR_PROGRESS_THREAD must be the ",
                                                "microseconds between the progress thread's polls, a whole number from ",
                                                "0 to 1000000, or unset; it is not on some rank (", here, ")"),
                                    rank_, owns_mpi_);
    if (range[0] != -range[1])
      throw environment_start_error(detail::cat("meshtensor::environment: MESHTENSOR_PROGRESS_THREAD differs between ",
                                                "ranks (from ", -range[1], " to ", range[0], " microseconds, -1 unset; ",
                                                here, "): set it alike for the whole job"),
                                    rank_, owns_mpi_);
    if (mine >= 0 && least_provided < MPI_THREAD_MULTIPLE)
      throw environment_start_error(detail::cat("meshtensor::environment: MESHTENSOR_PROGRESS_THREAD needs MPI at ",
                                                "MPI_THREAD_MULTIPLE (the thread calls MPI while the main thread does), ",
                                                "but the MPI library provides ", detail::thread_level_name(least_provided),
                                                owns_mpi_ ? "" : " (MPI was initialised before the environment)",
                                                "; unset it, or use an MPI built with full thread support"),
                                    rank_, owns_mpi_);
  }

  // Every rank's environment meets here once, at its end or in fail(). Returns how many ranks
  // arrived failed, or -1 when the others did not all arrive within timeout seconds.
  int rendezvous(bool failed_here, double timeout) {
    int mine = failed_here ? 1 : 0, failed = 0, done = 0;
    MPI_Request request;
    MPI_Iallreduce(&mine, &failed, 1, MPI_INT, MPI_SUM, end_comm_, &request);
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (timeout > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout)
        return -1;  // the request stays pending: the caller aborts the job
      if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    met_ = true;
    return failed;
  }

  static void initialize_kokkos(int& argc, char** argv) {
    static char quiet[] = "--kokkos-disable-warnings";
    std::vector<char*> args;
    bool user_chose_warnings = std::getenv("KOKKOS_DISABLE_WARNINGS") != nullptr;
    for (int i = 0; i < argc; ++i) {
      if (i > 0 && detail::is_help_flag(argv[i])) continue;
      if (std::strncmp(argv[i], quiet, sizeof(quiet) - 1) == 0) user_chose_warnings = true;
      args.push_back(argv[i]);
    }
    if (!user_chose_warnings) args.push_back(quiet);
#if defined(KOKKOS_ENABLE_CUDA)
    // Kokkos alone puts every rank on GPU 0; the ranks of a node take its GPUs in turn instead,
    // unless the user chose (--kokkos-device-id, --kokkos-num-devices, or their variables).
    static std::string device_arg;
    bool user_chose_device = std::getenv("KOKKOS_DEVICE_ID") != nullptr || std::getenv("KOKKOS_NUM_DEVICES") != nullptr;
    for (int i = 1; i < argc; ++i)
      if (std::strncmp(argv[i], "--kokkos-device", 15) == 0 || std::strncmp(argv[i], "--kokkos-num-devices", 20) == 0)
        user_chose_device = true;
    if (!user_chose_device) {
      const int node_rank = node_place_of(MPI_COMM_WORLD).rank;
      int devices = 0;
      if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
        device_arg = "--kokkos-device-id=" + std::to_string(node_rank % devices);
        args.push_back(device_arg.data());
      }
    }
#endif
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    Kokkos::initialize(n, args.data());
    // Keep what Kokkos left, and the help flags it never saw, in their order.
    const auto left_begin = args.begin(), left_end = args.begin() + n;
    int kept = 0;
    for (int i = 0; i < argc; ++i)
      if (i == 0 || detail::is_help_flag(argv[i]) || std::find(left_begin, left_end, argv[i]) != left_end)
        argv[kept++] = argv[i];
    argc = kept;
    argv[argc] = nullptr;
  }

  bool owns_mpi_ = false;
  bool owns_kokkos_ = false;
  bool met_ = false;
  int rank_ = 0;
  int size_ = 1;
  int uncaught_at_start_ = 0;
  MPI_Comm end_comm_ = MPI_COMM_NULL;
  std::terminate_handler previous_terminate_ = nullptr;
  std::unique_ptr<detail::progress_thread> progress_;
};

}  // namespace meshtensor
