// kernels::parallel_for gives a kernel Kokkos's light-weight launch hint when its functor is small
// enough to travel as a CUDA kernel argument (kernels/launch.hpp): on a GPU such a launch does not
// wait for the previous one, as a launch through constant memory does. A large functor keeps the
// policy as it was (with the hint it would go through global memory), and both run alike here.
// And the door's policies and copies are made on the library's one execution space instance
// (kernels/instance.hpp): on a host space its default, on CUDA a stream of the library's own.
#include <catch2/catch_test_macros.hpp>

#include <array>
#include <cstdint>
#include <meshtensor/kernels/launch.hpp>
#include <type_traits>

namespace mt = meshtensor;
namespace kernels = meshtensor::kernels;

namespace {
using exec = Kokkos::DefaultExecutionSpace;
using view = Kokkos::View<std::int64_t*, exec::memory_space>;

// Writes i + its offset table's sum at i; Bytes of table make the functor large or small.
template <std::size_t Bytes>
struct fill {
  view out;
  std::array<char, Bytes> table{};
  KOKKOS_FUNCTION void operator()(std::int64_t i) const {
    std::int64_t sum = 0;
    for (char c : table) sum += c;
    out(i) = i + sum;
  }
};

template <class Functor, class Policy>
constexpr bool hinted() {
  using P = decltype(kernels::light_weight<Functor>(Policy{}));
  return std::is_same_v<typename P::work_item_property, Kokkos::Experimental::WorkItemProperty::HintLightWeight_t>;
}
}  // namespace

TEST_CASE("a small functor gets the light-weight launch hint, a large one keeps its policy", "[kernels]") {
  using range = Kokkos::RangePolicy<exec>;
  static_assert(hinted<fill<64>, range>());
  static_assert(hinted<fill<2048>, range>());
  static_assert(!hinted<fill<8192>, range>());  // past CUDA's 4 KiB of kernel arguments
  static_assert(hinted<fill<64>, Kokkos::MDRangePolicy<exec, Kokkos::Rank<2>>>());
  // A count in place of a policy is passed on as it is.
  static_assert(std::is_same_v<decltype(kernels::light_weight<fill<64>>(std::int64_t{5})), std::int64_t>);

  const std::int64_t n = 100;
  fill<64> small{view("small", n)};
  small.table[3] = 2;
  fill<8192> large{view("large", n)};
  large.table[8000] = 5;
  kernels::parallel_for("small", range(0, n), small);
  kernels::parallel_for("large", range(0, n), large);
  const auto s = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, small.out);
  const auto l = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, large.out);
  for (std::int64_t i = 0; i < n; ++i) {
    CHECK(s(i) == i + 2);
    CHECK(l(i) == i + 5);
  }
}

TEST_CASE("policies are made on the library's instance; copies the host takes part in stay blocking", "[kernels]") {
  const auto r = kernels::range<exec>(2, 7);
  static_assert(std::is_same_v<std::remove_const_t<decltype(r)>, Kokkos::RangePolicy<exec>>);
  CHECK(r.begin() == 2);
  CHECK(r.end() == 7);
  const auto wide = kernels::range<exec, Kokkos::IndexType<std::int64_t>>(0, std::int64_t{1} << 40);
  CHECK(wide.end() == std::int64_t{1} << 40);
  const auto team = kernels::policy<Kokkos::TeamPolicy<exec>>(3, 1);
  CHECK(team.league_size() == 3);
  // Host memory takes part: Kokkos's blocking copy, never one queued on an instance.
  static_assert(!kernels::device_only_copy_v<Kokkos::View<float*, Kokkos::HostSpace>>);
  static_assert(!kernels::device_only_copy_on_instance<Kokkos::View<float*, Kokkos::HostSpace>, float>());
  static_assert(!kernels::device_only_copy_on_instance<exec, Kokkos::View<float*, exec::memory_space>>());
#if defined(KOKKOS_ENABLE_CUDA)
  using device = Kokkos::View<float*, Kokkos::CudaSpace>;
  static_assert(kernels::device_only_copy_on_instance<device, device>());
  static_assert(kernels::device_only_copy_on_instance<device, float>());
  static_assert(!kernels::device_only_copy_on_instance<device, Kokkos::View<float*, Kokkos::CudaHostPinnedSpace>>());
  static_assert(!kernels::device_only_copy_on_instance<Kokkos::View<float*, Kokkos::CudaUVMSpace>, device>());
  CHECK(kernels::range<Kokkos::Cuda>(0, 1).space().cuda_stream() == kernels::instance<Kokkos::Cuda>().cuda_stream());
  CHECK(kernels::instance<Kokkos::Cuda>().cuda_stream() != nullptr);  // not CUDA's legacy stream
#endif

  // A fill and a copy through the door, counted waits unchanged by either.
  const std::int64_t n = 16;
  Kokkos::View<float*, exec::memory_space> a("a", n), b("b", n);
  const std::int64_t waits = mt::host_waits();
  kernels::deep_copy(a, 1.5f);
  kernels::deep_copy(b, a);
  CHECK(mt::host_waits() == waits);
  kernels::fence(exec{});
  CHECK(mt::host_waits() == waits + 1);
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
  for (std::int64_t i = 0; i < n; ++i) CHECK(h(i) == 1.5f);
}
