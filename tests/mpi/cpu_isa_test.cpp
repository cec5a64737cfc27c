// The ISA agreement (runtime/cpu_isa.hpp) and the provider rule it sets (kernels/dnnl.hpp): every
// rank runs under the least ISA of the job, oneDNN is capped at it, the products' provider is the
// same on every rank, and replicas of a bf16 product are bit for bit alike. tests/CMakeLists.txt
// also runs it with the last rank alone under ONEDNN_MAX_CPU_ISA=AVX2 (mpi.cpu_isa_test.mixed):
// one rank reporting a lesser ISA lowers the whole job's; and with the ranks' OpenBLAS told different
// kernels (mpi.cpu_isa_test.openblas_mixed): float products then run on oneDNN, alike on every rank.
#include <cstdlib>
#include <cstring>
#include <string>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
int all_min(int v) {
  int out = v;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return out;
}
int all_max(int v) {
  int out = v;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out;
}
bool capped_at_avx2_here() {
  const char* v = std::getenv("ONEDNN_MAX_CPU_ISA");
  return v && (std::string(v) == "AVX2" || std::string(v) == "avx2");
}
}  // namespace

TEST_CASE("every rank runs under the least ISA of the job") {
  const auto& isa = mt::cpu_isa();
  REQUIRE(isa.agreed);
  REQUIRE(isa.ranks == world_size());
  const int job = static_cast<int>(isa.job), here = static_cast<int>(isa.this_cpu);
  INFO("this CPU: " << mt::name_of(isa.this_cpu) << ", the job: " << mt::name_of(isa.job));
  REQUIRE(job <= here);
  REQUIRE(all_min(job) == all_max(job));  // one level for everyone
  REQUIRE(job == all_min(here));          // the least any rank reported
  if (capped_at_avx2_here()) REQUIRE(isa.this_cpu <= mt::cpu_isa_level::avx2);
  if (all_max(capped_at_avx2_here() ? 1 : 0) == 1) REQUIRE(isa.job <= mt::cpu_isa_level::avx2);
#if MESHTENSOR_HAVE_DNNL
  if (isa.job != mt::cpu_isa_level::other) {
    REQUIRE(isa.onednn_capped);
    // oneDNN dispatches to the agreed level itself (its own reading of this CPU agrees with ours),
    // not to what this rank's CPU could do.
    REQUIRE(std::string(mt::kernels::dnnl_provider::isa_name()) == mt::name_of(isa.job));
  }
  const bool onednn_products = mt::kernels::dnnl_provider::has_bf16();
  const char* kernels = std::getenv("MESHTENSOR_KERNELS");
  const bool portable = kernels && std::string(kernels) == "portable";
  REQUIRE(onednn_products == (!portable && isa.job >= mt::cpu_isa_level::avx512_core));
  REQUIRE(all_min(onednn_products) == all_max(onednn_products));
  // The report says which provider runs bf16 products and why.
  const std::string words = mt::kernels::describe();
  INFO(words);
  if (!portable) {
    REQUIRE(words.find(std::string(mt::name_of(isa.this_cpu))) != std::string::npos);
    REQUIRE(words.find(onednn_products ? "float and bf16 products" : "bf16 products and convolutions portable") !=
            std::string::npos);
  }
#endif
}

// tests/CMakeLists.txt runs this under ONEDNN_MAX_CPU_ISA=AVX2 with each rank's OpenBLAS told another
// kernel (OPENBLAS_CORETYPE Haswell and Sandybridge: FMA or not, so their sgemms round apart), as a
// job over unlike nodes would pick them (mpi.cpu_isa_test.openblas_mixed).
TEST_CASE("replicas of a float product are bit for bit alike, whatever kernels each rank's OpenBLAS picked") {
  const auto& isa = mt::cpu_isa();
  const int agree = isa.openblas_cores_agree ? 1 : 0;
  REQUIRE(all_min(agree) == all_max(agree));  // one verdict for everyone
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  const int told = asked ? mt::detail::name_hash(asked) : 0;
  const int told_least = all_min(told), told_most = all_max(told);  // collectives first, on every rank
  if (!isa.openblas_core.empty() && told_least != told_most && told_least != 0)
    REQUIRE(!isa.openblas_cores_agree);  // ranks told different kernels see that they differ
#if MESHTENSOR_HAVE_DNNL
  const char* kernels = std::getenv("MESHTENSOR_KERNELS");
  const bool portable = kernels && std::string(kernels) == "portable";
  const bool avx512 = isa.job >= mt::cpu_isa_level::avx512_core;
  REQUIRE(mt::kernels::dnnl_provider::float_products() == (!portable && (avx512 || !isa.openblas_cores_agree)));
  if (!isa.openblas_core.empty() && !portable) {
    const std::string words = mt::kernels::describe();
    INFO(words);
    REQUIRE(words.find(isa.openblas_cores_agree ? " on every rank" : "differ between ranks (this rank's: " +
                                                                         isa.openblas_core) != std::string::npos);
  }
  if (portable) return;  // OpenBLAS on every rank, by request: replicas round as their kernels do
#endif
  auto g = world_line();
  using X = mt::tensor<float, mt::layout<line>, i_, j_>;
  using Y = mt::tensor<float, mt::layout<line>, j_, k_>;
  constexpr std::int64_t I = 48, J = 384, K = 40;
  const auto x = mt::random_normal<X>(g, {I, J}, 7);
  const auto y = mt::random_normal<Y>(g, {J, K}, 8);
  // Every rank computes the whole product: compared as each rank holds it (gather_all would read
  // one replica for all).
  const auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, mt::einsum<i_, k_>(x, y).view());
  std::vector<std::uint32_t> mine(p.size()), rank0(p.size());
  for (std::size_t e = 0; e < p.size(); ++e) std::memcpy(&mine[e], &p(e), sizeof(float));
  rank0 = mine;
  MPI_Bcast(rank0.data(), static_cast<int>(rank0.size()), MPI_UINT32_T, 0, MPI_COMM_WORLD);
  int differ = 0;
  for (std::size_t e = 0; e < p.size(); ++e) differ += mine[e] != rank0[e];
  INFO("elements that differ from rank 0's: " << differ << "; this rank's OpenBLAS kernels: " << isa.openblas_core);
  REQUIRE(all_max(differ) == 0);
}

TEST_CASE("replicas of a bf16 product are bit for bit alike") {
  auto g = world_line();
  using X = mt::tensor<mt::bf16, mt::layout<line>, i_, j_>;
  using Y = mt::tensor<mt::bf16, mt::layout<line>, j_, k_>;
  constexpr std::int64_t I = 48, J = 384, K = 40;
  const auto x = mt::cast<mt::bf16>(mt::random_normal<mt::tensor<float, mt::layout<line>, i_, j_>>(g, {I, J}, 7));
  const auto y = mt::cast<mt::bf16>(mt::random_normal<mt::tensor<float, mt::layout<line>, j_, k_>>(g, {J, K}, 8));
  static_assert(std::is_same_v<std::decay_t<decltype(x)>, X> && std::is_same_v<std::decay_t<decltype(y)>, Y>);
  const auto z = mt::einsum<i_, k_>(x, y);  // every rank computes the whole product
  const auto local = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, z.view());  // this rank's replica
  const auto p = mt::gather_all(z);
  std::vector<std::uint16_t> mine(p.size()), rank0(p.size());
  for (std::size_t e = 0; e < p.size(); ++e) mine[e] = local(e).bits();
  rank0 = mine;
  MPI_Bcast(rank0.data(), static_cast<int>(rank0.size()), MPI_UINT16_T, 0, MPI_COMM_WORLD);
  int differ = 0;
  for (std::size_t e = 0; e < p.size(); ++e) differ += mine[e] != rank0[e];
  INFO("elements that differ from rank 0's: " << differ);
  REQUIRE(all_max(differ) == 0);
  // And the product is a product: within bf16's rounding of a float-accumulated reference.
  const auto xh = mt::gather_all(x), yh = mt::gather_all(y);
  for (std::int64_t i = 0; i < I; i += 7)
    for (std::int64_t k = 0; k < K; k += 3) {
      double s = 0, mag = 0;
      for (std::int64_t j = 0; j < J; ++j) {
        s += double(float(xh[i * J + j])) * float(yh[j * K + k]);
        mag += std::abs(double(float(xh[i * J + j])) * float(yh[j * K + k]));
      }
      INFO("at " << i << ", " << k);
      REQUIRE(std::abs(float(p[i * K + k]) - s) <= std::abs(s) * 0x1p-8 + mag * 1e-6);
    }
}

#if MESHTENSOR_HAVE_DNNL
TEST_CASE("what oneDNN refuses runs portable (products) or is an error in meshtensor's words (convolutions)") {
  if (!mt::kernels::dnnl_provider::enabled()) return;  // MESHTENSOR_KERNELS=portable: nothing reaches oneDNN
  const bool avx512 = mt::cpu_isa().job >= mt::cpu_isa_level::avx512_core;
  // A bf16 product asked of oneDNN directly: made and run on AVX-512 cores; below, refused once and
  // reported (kernels::product then takes the portable path; the tests above check its values).
  std::vector<mt::bf16> a(4 * 5, mt::bf16(1.0f)), b(5 * 3, mt::bf16(2.0f)), c(4 * 3, mt::bf16(0.0f));
  const bool ran = mt::kernels::dnnl_provider::matmul<mt::bf16>(1, 4, 3, 5, false, false, a.data(), b.data(), c.data());
  REQUIRE(ran == avx512);
  REQUIRE(float(c[0]) == (avx512 ? 10.0f : 0.0f));
  if (!avx512) {
    const std::string words = mt::kernels::describe();
    INFO(words);
    REQUIRE(words.find("product shape oneDNN refused ran portable (first: bf16 [1 x 4 x 5] . [5 x 3]") != std::string::npos);
  }
  // A bf16 convolution asked of oneDNN below AVX-512 (nn::conv never does: has_convolution says no):
  // the error names the pass, the element type, the shapes, the ISA and what to do.
  mt::kernels::conv_problem p;
  p.spatial = 1;
  p.n = 2, p.ic = 3, p.oc = 4;
  p.in = {5}, p.out = {5}, p.taps = {3}, p.stride = {1}, p.dilation = {1}, p.pad_lo = {1}, p.pad_hi = {1};
  p.src_strides = {15, 5, 1}, p.weights_strides = {9, 3, 1}, p.dst_strides = {20, 5, 1};
  std::vector<mt::bf16> src(30, mt::bf16(1.0f)), w(36, mt::bf16(1.0f)), dst(40, mt::bf16(0.0f));
  REQUIRE(mt::kernels::has_convolution<Kokkos::DefaultHostExecutionSpace, mt::bf16>() == avx512);
  if (avx512) {
    mt::kernels::convolution_forward<Kokkos::DefaultHostExecutionSpace, mt::bf16>(p, src.data(), w.data(), dst.data());
    REQUIRE(float(dst[1]) == 9.0f);  // 3 channels x 3 taps of ones, inside the padding
  } else {
    try {
      mt::kernels::convolution_forward<Kokkos::DefaultHostExecutionSpace, mt::bf16>(p, src.data(), w.data(), dst.data());
      FAIL("oneDNN made a bf16 convolution below AVX-512");
    } catch (const mt::error& e) {
      const std::string what = e.what();
      INFO(what);
      REQUIRE(what.find("conv's local forward pass (bf16, batch 2, 3 channels in, 4 out, spatial 5, taps 3, output 5)") !=
              std::string::npos);
      REQUIRE(what.find(std::string("the job's agreed ISA ") + std::string(mt::name_of(mt::cpu_isa().job))) !=
              std::string::npos);
      REQUIRE(what.find("MESHTENSOR_KERNELS=portable") != std::string::npos);
    }
  }
}
#endif
