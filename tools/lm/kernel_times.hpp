#pragma once
// meshtensor-lm --kernel-times: where a step's time goes on the device, by op (as plans name it:
// "einsum (backward)") and Kokkos kernel name.
// Kokkos Tools' callbacks wait for the device before and after each kernel and copy, so each is
// timed alone (the run is slower than a plain one: this is a breakdown, not a speed); the time
// between two of them is what runs outside Kokkos's kernels (cuBLAS's products, MPI, the host's own
// work and launches), counted to the op that runs when the next one begins.
#include <Kokkos_Core.hpp>
#include <meshtensor/plan/ledger.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace lm {

class kernel_times {
 public:
  static void install() {
    namespace tools = Kokkos::Tools::Experimental;
    tools::set_begin_parallel_for_callback(&begin_kernel);
    tools::set_end_parallel_for_callback(&end_kernel);
    tools::set_begin_parallel_reduce_callback(&begin_kernel);
    tools::set_end_parallel_reduce_callback(&end_kernel);
    tools::set_begin_parallel_scan_callback(&begin_kernel);
    tools::set_end_parallel_scan_callback(&end_kernel);
    tools::set_begin_deep_copy_callback(&begin_copy);
    tools::set_end_deep_copy_callback(&end_copy);
    get().last_end = clock::now();
  }

  // The rows by total time, the largest `rows`, per step of `steps`.
  static void print(std::int64_t steps, std::size_t rows = 30) {
    auto& t = get();
    std::vector<std::pair<std::string, entry>> all(t.table.begin(), t.table.end());
    double total = 0;
    for (const auto& [name, e] : all) total += e.seconds;
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::printf("kernel times (each waited for alone), per step of %lld: %.3f ms in all\n", (long long)steps,
                1e3 * total / steps);
    std::printf("%10s %7s %9s  %s\n", "ms/step", "share", "calls", "kernel");
    for (std::size_t i = 0; i < all.size() && i < rows; ++i) {
      const auto& [name, e] = all[i];
      std::printf("%10.3f %6.1f%% %9.1f  %s\n", 1e3 * e.seconds / steps, 100 * e.seconds / total,
                  static_cast<double>(e.count) / steps, name.c_str());
    }
  }

 private:
  using clock = std::chrono::steady_clock;
  struct entry {
    double seconds = 0;
    std::int64_t count = 0;
  };
  struct state {
    std::map<std::string, entry> table;
    std::map<std::uint64_t, std::pair<std::string, clock::time_point>> open;
    clock::time_point last_end;
    std::uint64_t next_id = 0;
    std::uint64_t copy_id = 0;  // copies do not nest
  };
  static state& get() {
    static state s;
    return s;
  }
  static std::uint64_t begin(std::string name) {
    Kokkos::fence();
    auto& t = get();
    const auto now = clock::now();
    auto& gap = t.table[label("(between kernels: cuBLAS, MPI, the host)")];
    gap.seconds += std::chrono::duration<double>(now - t.last_end).count();
    ++gap.count;
    t.open[t.next_id] = {std::move(name), now};
    return t.next_id++;
  }
  static void end(std::uint64_t id) {
    Kokkos::fence();
    auto& t = get();
    const auto now = clock::now();
    const auto it = t.open.find(id);
    if (it == t.open.end()) return;
    auto& e = t.table[it->second.first];
    e.seconds += std::chrono::duration<double>(now - it->second.second).count();
    ++e.count;
    t.open.erase(it);
    t.last_end = now;
  }
  // "op (phase): kernel", the op the one running (the outermost, as the watchdog names it).
  static std::string label(const std::string& kernel) {
    namespace d = meshtensor::detail;
    return d::plan_ledger::label_of(d::collective_context::get().op, d::plan_ledger::get().phase()) + ": " + kernel;
  }
  static void begin_kernel(const char* name, std::uint32_t, std::uint64_t* id) { *id = begin(label(name)); }
  static void end_kernel(std::uint64_t id) { end(id); }
  static void begin_copy(Kokkos_Profiling_SpaceHandle dst, const char*, const void*, Kokkos_Profiling_SpaceHandle src,
                         const char*, const void*, std::uint64_t) {
    get().copy_id = begin(label(std::string("deep_copy ") + dst.name + " <- " + src.name));
  }
  static void end_copy() { end(get().copy_id); }
};

}  // namespace lm
