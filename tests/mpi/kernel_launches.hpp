#pragma once
// The Kokkos kernels launched while one is alive, by name, through Kokkos Tools' parallel_for
// callback (one at a time: the callback is process-wide).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

struct kernel_launches {
  static inline std::vector<std::string> names;
  static void on_begin(const char* name, std::uint32_t, std::uint64_t* id) {
    names.emplace_back(name);
    *id = 0;
  }
  kernel_launches() {
    names.clear();
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(&on_begin);
  }
  ~kernel_launches() { Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr); }
  kernel_launches(const kernel_launches&) = delete;
  kernel_launches& operator=(const kernel_launches&) = delete;
  static long count(const std::string& name) { return std::count(names.begin(), names.end(), name); }
};
