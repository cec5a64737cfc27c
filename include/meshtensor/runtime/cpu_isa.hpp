#pragma once
// The CPU instruction set that the local kernels of a job may use, agreed by every rank once, when
// meshtensor::environment starts (docs/design/devices.md, "One provider rule for every rank").
//
// Why agree: replicas of a tensor must round alike. oneDNN picks its kernels (and with them the
// order of its sums) from the CPU it runs on, and has bf16 products only on AVX-512 cores; a job
// whose nodes differ in ISA would otherwise compute one product two ways. So each rank reads what
// its CPU can run (cpuid, capped by ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA as oneDNN would be), the
// job takes the least of them (one MPI_Allreduce), and oneDNN is capped at it on every rank
// (dnnl::set_max_cpu_isa) before it makes its first kernel. The kernel providers
// (kernels/dnnl.hpp) decide from the agreed level, never from the local one.
//
// This rank's level is read from cpuid here, not asked of oneDNN: asking fixes oneDNN's ISA for the
// life of the process, which would leave nothing to cap.
#include <mpi.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#ifndef MESHTENSOR_HAVE_DNNL
#define MESHTENSOR_HAVE_DNNL 0
#endif
#if MESHTENSOR_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "../error.hpp"

namespace meshtensor {

// oneDNN's x86 levels in the order each includes the one before (other: not x86, or below SSE4.1).
enum class cpu_isa_level : int {
  other,
  sse41,
  avx,
  avx2,
  avx2_vnni,
  avx512_core,
  avx512_core_vnni,
  avx512_core_bf16,
  avx512_core_amx
};

inline constexpr std::string_view name_of(cpu_isa_level l) {
  constexpr std::string_view names[] = {"other",       "sse41",           "avx",
                                        "avx2",        "avx2_vnni",       "avx512_core",
                                        "avx512_core_vnni", "avx512_core_bf16", "avx512_core_amx"};
  return names[static_cast<int>(l)];
}

// What the local kernels of this process may use, and how that was decided.
struct cpu_isa_agreement {
  cpu_isa_level this_cpu = cpu_isa_level::other;  // cpuid, capped by ONEDNN_MAX_CPU_ISA
  cpu_isa_level job = cpu_isa_level::other;       // the least over the job's ranks
  int ranks = 1;                                  // how many ranks agreed (1: not agreed, this process alone)
  bool agreed = false;                            // by meshtensor::environment
  bool onednn_capped = false;                     // dnnl::set_max_cpu_isa(job) took effect
  // OpenBLAS picks its kernels per CPU by itself (or by OPENBLAS_CORETYPE): where ranks' picks differ,
  // replicas of an OpenBLAS product round differently, so float products go to oneDNN under the
  // agreed ISA instead (kernels/dnnl.hpp). Empty where the BLAS linked is not OpenBLAS.
  std::string openblas_core;         // this rank's, as openblas_get_corename() names it
  bool openblas_cores_agree = true;  // every rank's is the same
};

namespace detail {

// OpenBLAS's name for the kernels it picked, where the BLAS linked is OpenBLAS (a weak reference: any
// other BLAS leaves it null).
extern "C" char* openblas_get_corename(void) __attribute__((weak));
inline std::string openblas_core_name() {
  if (openblas_get_corename == nullptr) return {};
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string();
}
// FNV-1a: ranks compare their cores' names by a number.
inline int name_hash(std::string_view s) {
  unsigned h = 2166136261u;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return static_cast<int>(h & 0x7fffffffu);
}

#if defined(__x86_64__) || defined(__i386__)
struct cpuid_regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
inline cpuid_regs cpuid(unsigned leaf, unsigned sub) {
  cpuid_regs r;
  if (leaf <= __get_cpuid_max(0, nullptr)) __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}
inline cpu_isa_level cpuid_isa_level() {
  const auto l1 = cpuid(1, 0), l7 = cpuid(7, 0), l71 = cpuid(7, 1);
  const bool sse41 = l1.c & (1u << 19), osxsave = l1.c & (1u << 27), avx = l1.c & (1u << 28);
  if (!sse41) return cpu_isa_level::other;
  if (!osxsave || !avx) return cpu_isa_level::sse41;
  unsigned xcr0 = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  (void)xcr0_high;
  if ((xcr0 & 0x6u) != 0x6u) return cpu_isa_level::sse41;  // the OS saves no ymm state
  const bool avx2 = (l7.b & (1u << 5)) && (l1.c & (1u << 12));  // AVX2 and FMA, as oneDNN asks
  if (!avx2) return cpu_isa_level::avx;
  const bool zmm_state = (xcr0 & 0xe0u) == 0xe0u;
  const bool avx512_core =
      zmm_state && (l7.b & (1u << 16)) && (l7.b & (1u << 17)) && (l7.b & (1u << 30)) && (l7.b & (1u << 31));
  if (!avx512_core) return (l71.a & (1u << 4)) ? cpu_isa_level::avx2_vnni : cpu_isa_level::avx2;
  if (!(l7.c & (1u << 11))) return cpu_isa_level::avx512_core;
  if (!(l71.a & (1u << 5))) return cpu_isa_level::avx512_core_vnni;
  const bool amx = (l7.d & (1u << 22)) && (l7.d & (1u << 24)) && (l7.d & (1u << 25)) && (xcr0 & 0x60000u) == 0x60000u;
  return amx ? cpu_isa_level::avx512_core_amx : cpu_isa_level::avx512_core_bf16;
}
#else
inline cpu_isa_level cpuid_isa_level() { return cpu_isa_level::other; }
#endif

// ONEDNN_MAX_CPU_ISA (else DNNL_MAX_CPU_ISA), as oneDNN reads it: a level name in any case, or ALL.
// Returns false where the variable holds something else (its value in `bad`).
inline bool isa_cap_from_environment(cpu_isa_level& cap, std::string& bad) {
  cap = cpu_isa_level::avx512_core_amx;
  const char* v = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!v || !*v) v = std::getenv("DNNL_MAX_CPU_ISA");
  if (!v || !*v) return true;
  std::string s(v);
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s == "all") return true;
  for (int l = static_cast<int>(cpu_isa_level::sse41); l <= static_cast<int>(cpu_isa_level::avx512_core_amx); ++l)
    if (s == name_of(static_cast<cpu_isa_level>(l))) {
      cap = static_cast<cpu_isa_level>(l);
      return true;
    }
  bad = v;
  return false;
}

// What this process's CPU may run, capped by the environment variable (-1 where the variable is bad).
inline int local_isa_level(std::string& bad) {
  cpu_isa_level cap{};
  if (!isa_cap_from_environment(cap, bad)) return -1;
  const auto here = cpuid_isa_level();
  return static_cast<int>(here < cap ? here : cap);
}

inline cpu_isa_agreement& cpu_isa_state() {
  static cpu_isa_agreement state = [] {
    cpu_isa_agreement s;
    std::string bad;
    const int level = local_isa_level(bad);
    s.this_cpu = s.job = level < 0 ? cpuid_isa_level() : static_cast<cpu_isa_level>(level);
    return s;
  }();
  return state;
}

#if MESHTENSOR_HAVE_DNNL
inline dnnl::cpu_isa onednn_isa(cpu_isa_level l) {
  switch (l) {
    case cpu_isa_level::sse41: return dnnl::cpu_isa::sse41;
    case cpu_isa_level::avx: return dnnl::cpu_isa::avx;
    case cpu_isa_level::avx2: return dnnl::cpu_isa::avx2;
    case cpu_isa_level::avx2_vnni: return dnnl::cpu_isa::avx2_vnni;
    case cpu_isa_level::avx512_core: return dnnl::cpu_isa::avx512_core;
    case cpu_isa_level::avx512_core_vnni: return dnnl::cpu_isa::avx512_core_vnni;
    case cpu_isa_level::avx512_core_bf16: return dnnl::cpu_isa::avx512_core_bf16;
    case cpu_isa_level::avx512_core_amx: return dnnl::cpu_isa::avx512_core_amx;
    default: return dnnl::cpu_isa::all;
  }
}
#endif

// Collective over comm: every rank reads its level, all take the least, and oneDNN is capped at it.
// A bad ONEDNN_MAX_CPU_ISA on any rank is an error on every rank (agreed first: nobody is left
// waiting).
inline void agree_cpu_isa(MPI_Comm comm) {
  std::string bad;
  const int mine = local_isa_level(bad);
  int least = mine, ranks = 1;
  MPI_Allreduce(&mine, &least, 1, MPI_INT, MPI_MIN, comm);
  MPI_Comm_size(comm, &ranks);
  if (least < 0)
    throw error(cat("meshtensor::environment: ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) names no instruction set on ",
                    bad.empty() ? "another rank" : cat("this rank ('", bad, "')"),
                    "; expected ALL or one of sse41, avx, avx2, avx2_vnni, avx512_core, avx512_core_vnni, "
                    "avx512_core_bf16, avx512_core_amx (any case)"));
  auto& s = cpu_isa_state();
  s.this_cpu = static_cast<cpu_isa_level>(mine);
  s.job = static_cast<cpu_isa_level>(least);
  s.ranks = ranks;
  s.agreed = true;
  s.openblas_core = openblas_core_name();
  const int core = name_hash(s.openblas_core);
  int bounds[2] = {core, -core}, least_most[2] = {0, 0};  // the least hash and minus the largest
  MPI_Allreduce(bounds, least_most, 2, MPI_INT, MPI_MIN, comm);
  s.openblas_cores_agree = least_most[0] == -least_most[1];
#if MESHTENSOR_HAVE_DNNL
  // Fails (and changes nothing) where oneDNN already made a kernel in this process: then the level
  // it runs at is its own, and describe() says so.
  if (s.job != cpu_isa_level::other && !s.onednn_capped)
    s.onednn_capped = dnnl::set_max_cpu_isa(onednn_isa(s.job)) == dnnl::status::success;
#endif
}

}  // namespace detail

// The agreement this process runs under (meshtensor::environment makes it; without one, this
// process's own level).
inline const cpu_isa_agreement& cpu_isa() { return detail::cpu_isa_state(); }

}  // namespace meshtensor
