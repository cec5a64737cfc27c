#pragma once
// Stopping on the scheduler's warning (docs/cluster.md; docs/design/faults.md, "Stopping on the
// scheduler's warning").
// A batch scheduler warns a job before its time limit or a preemption with a signal (Slurm:
// `sbatch --signal=B:USR1@120`; SIGTERM when the time is up). A rank that stopped where it got it
// would leave the others waiting in their next collective, and a checkpoint needs every rank. So:
//
//   mt::stop_request stop;                      // SIGUSR1 and SIGTERM now only set a flag
//   for (step = ...; ...) {
//     ... one training step ...
//     if (int sig = stop.agreed(mesh)) {        // every rank, at the same point: one allreduce(MAX)
//       save a checkpoint; return mt::stopped_exit_code;
//     }
//   }
//
// The handler only records the signal (a sig_atomic_t; nothing else is safe in a handler). At a
// step boundary every rank asks agreed(): the largest signal number any rank received, 0 if none,
// the same answer on all ranks, so all finish the same step, save the same checkpoint and leave
// together, whichever of them the signal reached. The same signal a second time ends the process
// as it would have without the handler: a job stuck outside the step loop can still be killed.
// Node-local facts come from MPI (MPI_COMM_TYPE_SHARED), never from a launcher's variables: this
// works alike under mpiexec, srun and mpirun inside an allocation.
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "communicator.hpp"

namespace meshtensor {

// The exit status of a job that stopped on a stop signal after its checkpoint was saved: "start me
// again from it". Distinct from success (0), errors (1), the watchdog's 75, sysexits' 64-78 and the
// shell's 126 and above. scripts/supervise.sh --requeue and examples/slurm/train.sbatch turn it
// into `scontrol requeue`.
inline constexpr int stopped_exit_code = 85;

namespace detail {

inline volatile std::sig_atomic_t stop_signal_received = 0;
inline bool stop_request_installed = false;

extern "C" inline void meshtensor_on_stop_signal(int sig) {
  if (stop_signal_received == sig) {  // asked twice: end as the default action does
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (stop_signal_received == 0) stop_signal_received = sig;
}

}  // namespace detail

class stop_request {
 public:
  // Catches each of signals from now on (SIGUSR1 and SIGTERM by default); the handlers found are
  // put back by the destructor. One at a time per process (the flag is the process's).
  explicit stop_request(std::vector<int> signals = {SIGUSR1, SIGTERM}) : signals_(std::move(signals)) {
    if (detail::stop_request_installed)
      throw error("meshtensor: a stop_request is already installed in this process (one at a time: the signal flag is the process's)");
    for (int sig : signals_)
      if (sig == SIGKILL || sig == SIGSTOP || sig <= 0 || sig >= NSIG)
        throw error(detail::cat("meshtensor: stop_request cannot catch signal ", sig, " (", name(sig), ")"));
    detail::stop_signal_received = 0;
    previous_.resize(signals_.size());
    for (std::size_t i = 0; i < signals_.size(); ++i) {
      struct sigaction sa {};
      sa.sa_handler = detail::meshtensor_on_stop_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART;  // a checkpoint's writes and MPI's waits go on, not EINTR
      if (sigaction(signals_[i], &sa, &previous_[i]) != 0) {
        const int err = errno;
        for (std::size_t j = 0; j < i; ++j) sigaction(signals_[j], &previous_[j], nullptr);
        throw error(detail::cat("meshtensor: stop_request: sigaction(", name(signals_[i]), "): ", std::strerror(err)));
      }
    }
    detail::stop_request_installed = true;
  }
  stop_request(const stop_request&) = delete;
  stop_request& operator=(const stop_request&) = delete;
  ~stop_request() {
    for (std::size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
    detail::stop_request_installed = false;
  }

  const std::vector<int>& signals() const { return signals_; }
  // The signal this process received, 0 if none. This rank's alone: stop on agreed(), not on this.
  int received() const noexcept { return detail::stop_signal_received; }
  // Every rank of the mesh calls it at the same point (a step boundary). The largest signal number
  // any rank received, 0 if none: the same on every rank. One allreduce of one int (not counted in
  // the mesh's counters; watched under MESHTENSOR_COLLECTIVE_TIMEOUT).
  int agreed(detail::communicator& comm) const { return comm.agree_max(detail::stop_signal_received); }
  template <class Mesh>
    requires requires(const Mesh& m) { m.communicator(); }
  int agreed(const Mesh& m) const {
    return agreed(m.communicator());
  }

  // "SIGUSR1" for SIGUSR1; "signal N" for one without a name here.
  static std::string name(int sig) {
    for (const auto& [n, s] : known())
      if (s == sig) return std::string("SIG") + n;
    return detail::cat("signal ", sig);
  }
  // "USR1,TERM" (with or without "SIG", any case, or numbers) as signal numbers; "none" or "": none.
  // A name not known here is an error that names it and the known ones.
  static std::vector<int> parse(const std::string& list) {
    std::vector<int> out;
    std::string lower;
    for (char c : list) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    if (lower.empty() || lower == "none") return out;
    std::size_t at = 0;
    while (at <= list.size()) {
      const std::size_t end = std::min(list.find(',', at), list.size());
      std::string word = list.substr(at, end - at), upper;
      for (char c : word) upper += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
      if (upper.rfind("SIG", 0) == 0) upper = upper.substr(3);
      int sig = 0;
      for (const auto& [n, s] : known())
        if (upper == n) sig = s;
      if (sig == 0 && !upper.empty() && upper.find_first_not_of("0123456789") == std::string::npos && upper.size() < 4)
        sig = std::stoi(upper);
      if (sig <= 0 || sig >= NSIG || sig == SIGKILL || sig == SIGSTOP) {
        std::string names;
        for (const auto& [n, s] : known()) names += std::string(names.empty() ? "" : ", ") + n;
        throw error(detail::cat("meshtensor: '", word, "' in the stop signals '", list,
                                "' is not a signal that can be caught (known: ", names, ", or a number; 'none': none)"));
      }
      out.push_back(sig);
      at = end + 1;
    }
    return out;
  }

 private:
  static const std::vector<std::pair<const char*, int>>& known() {
    static const std::vector<std::pair<const char*, int>> k{{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},
                                                            {"INT", SIGINT},   {"HUP", SIGHUP},   {"QUIT", SIGQUIT},
                                                            {"XCPU", SIGXCPU}, {"ALRM", SIGALRM}};
    return k;
  }

  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

}  // namespace meshtensor
