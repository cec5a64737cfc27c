// The Fourier transforms of fft/fft.hpp over distributed tensors, against FFTW's serial transform
// of the gathered array (fftw_plan_dft_3d, fftw_plan_dft_r2c_1d): 3-D transforms over slabs
// (a line: a 2-D transform, a relayout, a 1-D one) and pencils (a grid: three 1-D transforms, two
// relayouts) with uneven extents, the inverse back to the input, real
// transforms of odd and even lengths, and gradients against central differences.
#include <fftw3.h>

#include <catch2/matchers/catch_matchers_string.hpp>

#include <complex>
#include <memory>
#include <meshtensor/fft/fft.hpp>
#include <random>
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;
using zd = mt::complex<double>;

namespace {
struct x_d : mt::dim<"x"> {};
struct y_d : mt::dim<"y"> {};
struct z_d : mt::dim<"z"> {};
constexpr std::int64_t NX = 5, NY = 6, NZ = 7;  // uneven over 2 and 4 processors

std::vector<zd> random_field(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<zd> v(n);
  for (auto& z : v) z = zd(u(rng), u(rng));
  return v;
}

// FFTW's serial 3-D transform of the whole array (row-major x, y, z).
std::vector<zd> serial_fft3(std::vector<zd> v, int sign) {
  std::vector<zd> out(v.size());
  const fftw_plan p = fftw_plan_dft_3d(NX, NY, NZ, reinterpret_cast<fftw_complex*>(v.data()),
                                       reinterpret_cast<fftw_complex*>(out.data()), sign, FFTW_ESTIMATE);
  fftw_execute(p);
  fftw_destroy_plan(p);
  return out;
}

double largest_difference(const std::vector<zd>& a, const std::vector<zd>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t n = 0; n < a.size(); ++n) d = std::max(d, Kokkos::abs(a[n] - b[n]));
  return d;
}

// Transforms along z, then y, then x, with a relayout before each step that needs one: Lz keeps z
// whole, Ly y, Lx x.
template <class Lz, class Ly, class Lx, class M>
void check_3d(const M& g, const char* what) {
  INFO(what);
  using Uz = mt::tensor<zd, Lz, x_d, y_d, z_d>;
  using Uy = mt::tensor<zd, Ly, x_d, y_d, z_d>;
  using Ux = mt::tensor<zd, Lx, x_d, y_d, z_d>;
  const auto h = random_field(NX * NY * NZ, 11);
  const auto u = mt::from_host<Uz>(g, {NX, NY, NZ}, std::span<const zd>(h));
  const auto want = serial_fft3(h, FFTW_FORWARD);
  if constexpr (std::is_same_v<Lz, Ly>) {  // y and z whole: one 2-D transform, one relayout
    const auto spectrum = mt::fft<x_d>(mt::relayout<Ux>(mt::fft<y_d, z_d>(u)));
    CHECK(largest_difference(mt::gather_all(spectrum), want) < 1e-12 * NX * NY * NZ);
    const auto back = mt::ifft<y_d, z_d>(mt::relayout<Uz>(mt::ifft<x_d>(spectrum)));
    CHECK(largest_difference(mt::gather_all(back), h) < 1e-13);
  } else {
    const auto spectrum = mt::fft<x_d>(mt::relayout<Ux>(mt::fft<y_d>(mt::relayout<Uy>(mt::fft<z_d>(u)))));
    CHECK(largest_difference(mt::gather_all(spectrum), want) < 1e-12 * NX * NY * NZ);
    // And back: ifft in the reverse order returns the input.
    const auto back = mt::ifft<z_d>(mt::relayout<Uz>(mt::ifft<y_d>(mt::relayout<Uy>(mt::ifft<x_d>(spectrum)))));
    CHECK(largest_difference(mt::gather_all(back), h) < 1e-13);
  }
}

// rfft along Along (z, the innermost dim, or x, the outer one) of a real [nx, nz] tensor, against
// FFTW's 1-D r2c of each gathered line, and irfft back.
template <class Along, class L, class M>
void check_real(const M& g, std::int64_t nx, std::int64_t nz) {
  constexpr bool along_z = std::is_same_v<Along, z_d>;
  const std::int64_t n = along_z ? nz : nx, lines = along_z ? nx : nz, half = n / 2 + 1;
  INFO("real transforms of length " << n << " along " << Along::name() << ", " << nx << " x " << nz << " under "
                                    << layout_name<L>());
  using X = mt::tensor<double, L, x_d, z_d>;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> h(nx * nz);
  for (auto& v : h) v = u(rng);
  const auto x = mt::from_host<X>(g, {nx, nz}, std::span<const double>(h));
  const auto s = mt::rfft<Along>(x);
  REQUIRE(s.extents()[along_z ? 1 : 0] == half);
  const auto got = mt::gather_all(s);
  // Element j of line l, in the gathered arrays of extent n (h) or half (got) along Along.
  const auto at = [&](std::int64_t l, std::int64_t j, std::int64_t extent) { return along_z ? l * extent + j : j * nz + l; };
  for (std::int64_t l = 0; l < lines; ++l) {
    std::vector<double> line(n);
    for (std::int64_t j = 0; j < n; ++j) line[j] = h[at(l, j, n)];
    std::vector<zd> want(half);
    const fftw_plan p = fftw_plan_dft_r2c_1d(static_cast<int>(n), line.data(), reinterpret_cast<fftw_complex*>(want.data()),
                                             FFTW_ESTIMATE);
    fftw_execute(p);
    fftw_destroy_plan(p);
    for (std::int64_t k = 0; k < half; ++k) REQUIRE(Kokkos::abs(got[at(l, k, half)] - want[k]) < 1e-13 * n);
  }
  const auto back = mt::gather_all(mt::irfft<Along>(s, n));
  for (std::size_t e = 0; e < h.size(); ++e) REQUIRE(std::abs(back[e] - h[e]) < 1e-14);
  REQUIRE_THROWS_WITH(mt::irfft<Along>(s, n + 2),
                      Catch::Matchers::ContainsSubstring(std::string("irfft<") + std::string(Along::name()) + "> to a length of"));
}

// A real loss through every transform (a rank-0 tensor); its gradient against central differences.
template <class Z, class X>
auto loss(const Z& z, const X& x, const Z& half, std::int64_t nz) {
  using R = typename Z::template rebind<double>;
  const auto w = mt::make_complex(mt::cos(mt::real(z)), mt::sin(mt::imag(z)));  // weights that vary
  // Both dims at once where x is whole.
  const auto transformed = [](const auto& v, auto inverse) {
    if constexpr (Z::layout_type::template split_of<x_d>().count == 0)
      return decltype(inverse)::value ? mt::ifft<x_d, z_d>(v) : mt::fft<x_d, z_d>(v);
    else
      return decltype(inverse)::value ? mt::ifft<z_d>(v) : mt::fft<z_d>(v);
  };
  const auto a = mt::reduce_sum<x_d, z_d>(mt::real(transformed(z, std::false_type{}) * w));
  const auto b = mt::reduce_sum<x_d, z_d>(mt::imag(transformed(z * z, std::true_type{}) * w));
  const auto c = mt::reduce_sum<x_d, z_d>(mt::real(mt::rfft<z_d>(x * x)) + mt::imag(mt::rfft<z_d>(x)));
  const R r = mt::irfft<z_d>(half, nz);
  const auto d = mt::reduce_sum<x_d, z_d>(r * r * mt::real(z));
  if constexpr (Z::layout_type::template split_of<x_d>().count == 0) {
    // Real transforms along the outer dim too (lines nz apart), of an odd length: irfft of a
    // product of half spectra, weighted.
    const auto e = mt::irfft<x_d>(mt::rfft<x_d>(x) * mt::rfft<x_d>(x * x), NX);
    return a + b + c + d + mt::reduce_sum<x_d, z_d>(e * x);
  } else {
    return a + b + c + d;
  }
}

template <class L, class M>
void check_gradients(const M& g, std::int64_t nz) {
  INFO("gradients, length " << nz << " under " << layout_name<L>());
  using Z = mt::tensor<zd, L, x_d, z_d>;
  using X = mt::tensor<double, L, x_d, z_d>;
  const std::int64_t nh = nz / 2 + 1;
  auto zh = random_field(NX * nz, 21), hh = random_field(NX * nh, 22);
  std::vector<double> xh(NX * nz);
  for (std::size_t n = 0; n < xh.size(); ++n) xh[n] = zh[n].real() - zh[n].imag();
  const auto make = [&](const std::vector<zd>& zv, const std::vector<double>& xv, const std::vector<zd>& hv) {
    return std::make_tuple(mt::from_host<Z>(g, {NX, nz}, std::span<const zd>(zv)),
                           mt::from_host<X>(g, {NX, nz}, std::span<const double>(xv)),
                           mt::from_host<Z>(g, {NX, nh}, std::span<const zd>(hv)));
  };
  auto [z, x, half] = make(zh, xh, hh);
  z.requires_grad();
  x.requires_grad();
  half.requires_grad();
  const auto total = loss(z, x, half, nz);
  const auto [dz, dx, dhalf] = mt::gradient(total, z, x, half);
  const auto dzh = mt::gather_all(dz), dhh = mt::gather_all(dhalf);
  const auto dxh = mt::gather_all(dx);
  const double h = 1e-6;
  const auto at = [&](auto zv, auto xv, auto hv) {
    const auto [a, b, c] = make(zv, xv, hv);
    return mt::item(loss(a, b, c, nz));
  };
  const auto complex_difference = [&](int which, std::int64_t n) {
    double parts[2];
    for (int part = 0; part < 2; ++part) {
      double f[2];
      for (int side = 0; side < 2; ++side) {
        auto zv = zh, hv = hh;
        auto& v = which == 0 ? zv[n] : hv[n];
        const double step = side == 0 ? h : -h;
        v = part == 0 ? zd(v.real() + step, v.imag()) : zd(v.real(), v.imag() + step);
        f[side] = at(zv, xh, hv);
      }
      parts[part] = (f[0] - f[1]) / (2 * h);
    }
    return zd(parts[0], parts[1]);
  };
  for (const std::int64_t n : {std::int64_t{0}, nz + 2, NX * nz - 1}) {
    INFO("dz at " << n);
    CHECK(Kokkos::abs(dzh[n] - complex_difference(0, n)) < 1e-5);
  }
  // The first bin, the middle one (n even: it stands for itself alone) and one between.
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, nh - 1, 2 * nh + 1}) {
    INFO("d half at " << n);
    CHECK(Kokkos::abs(dhh[n] - complex_difference(1, n)) < 1e-5);
  }
  for (const std::int64_t n : {std::int64_t{1}, NX * nz - 2}) {
    INFO("dx at " << n);
    auto up = xh, down = xh;
    up[n] += h;
    down[n] -= h;
    CHECK(std::abs(dxh[n] - (at(zh, up, hh) - at(zh, down, hh)) / (2 * h)) < 1e-5);
  }
}
}  // namespace

TEST_CASE("3-D transforms over slabs and pencils equal FFTW's serial transform", "[equivalence]") {
  {
    const auto g = world_line();
    using slab_x = mt::layout<line, mt::split<x_d, x_>>;  // y and z whole
    using slab_y = mt::layout<line, mt::split<y_d, x_>>;  // x whole
    check_3d<slab_x, slab_x, slab_y>(g, "slabs over a line");
  }
  {
    const auto g = world_grid();
    using pencil_z = mt::layout<grid, mt::split<x_d, r_>, mt::split<y_d, c_>>;
    using pencil_y = mt::layout<grid, mt::split<x_d, r_>, mt::split<z_d, c_>>;
    using pencil_x = mt::layout<grid, mt::split<y_d, r_>, mt::split<z_d, c_>>;
    check_3d<pencil_z, pencil_y, pencil_x>(g, "pencils over a grid");
  }
}

TEST_CASE("real transforms of odd and even lengths", "[equivalence]") {
  const auto g = world_line();
  for (const std::int64_t nz : {std::int64_t{8}, std::int64_t{9}}) {
    check_real<z_d, mt::layout<line, mt::split<x_d, x_>>>(g, NX, nz);
    check_real<z_d, mt::layout<line>>(g, NX, nz);
    check_real<x_d, mt::layout<line, mt::split<z_d, x_>>>(g, nz, 5);  // lines along the outer dim, 5 apart
  }
  // Three lines over up to four processors: one holds none (an empty slice, nothing to transform).
  for (const std::int64_t nz : {std::int64_t{8}, std::int64_t{9}}) {
    check_real<z_d, mt::layout<line, mt::split<x_d, x_>>>(g, 3, nz);
    check_real<x_d, mt::layout<line, mt::split<z_d, x_>>>(g, nz, 3);
  }
}

TEST_CASE("gradients of fft, ifft, rfft and irfft against central differences", "[gradient]") {
  const auto g = world_line();
  for (const std::int64_t nz : {std::int64_t{6}, std::int64_t{7}}) check_gradients<mt::layout<line, mt::split<x_d, x_>>>(g, nz);
  check_gradients<mt::layout<line>>(g, 6);  // x whole: 2-D transforms
}

namespace {
// FFTW's new-array execution needs the arrays' SIMD alignment to be the plan's: arrays at it take a
// plan with SIMD codelets, others one made with FFTW_UNALIGNED. Both against a direct DFT.
template <class R>
void check_local_alignment(std::size_t offset_reals, const char* what) {
  INFO(what);
  namespace fw = mt::detail::fftw;
  constexpr std::int64_t A = 6, B = 7, L = 3;  // a 2-D transform of 6 x 7 at 3 loop positions
  const std::int64_t n = A * B * L;
  // The arrays `offset_reals` reals past a 64-byte boundary (FFTW's widest SIMD).
  std::vector<R> in_store(2 * n + 64), out_store(2 * n + 64);
  const auto at_boundary = [&](std::vector<R>& v) {
    void* p = v.data();
    std::size_t space = v.size() * sizeof(R);
    return static_cast<R*>(std::align(64, sizeof(R), p, space)) + offset_reals;
  };
  R* in = at_boundary(in_store);
  R* out = at_boundary(out_store);
  REQUIRE((fw::api<R>::alignment_of(in) != 0) == (offset_reals != 0));  // an off case is off FFTW's alignment
  std::mt19937 rng(5);
  std::uniform_real_distribution<R> u(-1, 1);
  for (std::int64_t k = 0; k < 2 * n; ++k) in[k] = u(rng);
  const std::vector<fw::dim> dims{{A, B, B}, {B, 1, 1}}, loops{{L, A * B, A * B}};
  fw::execute<R>(fw::kind::forward, dims, loops, in, out);
  const double pi = std::acos(-1.0);
  double worst = 0;
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t b = 0; b < B; ++b) {
        std::complex<double> want = 0;
        for (std::int64_t j = 0; j < A; ++j)
          for (std::int64_t k = 0; k < B; ++k) {
            const std::int64_t at = 2 * (l * A * B + j * B + k);
            want += std::complex<double>(in[at], in[at + 1]) *
                    std::polar(1.0, -2 * pi * (double(a * j) / A + double(b * k) / B));
          }
        const std::int64_t at = 2 * (l * A * B + a * B + b);
        worst = std::max(worst, std::abs(std::complex<double>(out[at], out[at + 1]) - want));
      }
  REQUIRE(worst < (std::is_same_v<R, double> ? 1e-12 : 1e-4));
}
}  // namespace

TEST_CASE("local transforms of arrays at and off FFTW's SIMD alignment equal a direct DFT", "[equivalence]") {
  check_local_alignment<double>(0, "double, aligned");
  check_local_alignment<double>(1, "double, 8 bytes off");
  check_local_alignment<float>(0, "float, aligned");
  check_local_alignment<float>(1, "float, 4 bytes off");
}
