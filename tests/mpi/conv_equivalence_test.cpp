// unfold, fold, conv, conv_transpose, max_pool, avg_pool and batch_norm over spatially split images:
// - unfold equals a host im2col written from the definition (taps o * stride - pad + k * dilation),
//   under every layout of [P] and [2x2] ([2x3] at 6 ranks) that splits height, width, both, batch or
//   channels, on extents that split unevenly, for windows with stride, dilation and both paddings;
// - its collectives equal unfold_plan where every halo comes from the neighbours, else
//   unfold_gather_plan, and the halo bytes are exact: the elements each processor's windows read
//   outside its part, counted on the host (summed over processors, since a processor's send count
//   is its neighbour's need);
// - fold is unfold's adjoint (<unfold(x), c> = <x, fold(c)>), conv_transpose conv's;
// - conv, the pools and batch_norm equal host sums over the reference windows.
#include <test_support.hpp>

using namespace tst;
namespace mt = meshtensor;

namespace {
struct co_ : mt::dim<"co"> {};
using b_ = i_;   // batch
using h_ = j_;   // height
using w_ = k_;   // width
using c_in = l_; // channels in
using kh_ = m_;
using kw_ = n_;
using sh = mt::spatial<h_, kh_>;
using sw = mt::spatial<w_, kw_>;

constexpr std::int64_t B = 2, H = 9, W = 7, C = 3, CO = 2;

struct geometry {
  std::int64_t extent, out, size, stride, dilation, pad_lo;
  std::int64_t at(std::int64_t o, std::int64_t k) const { return o * stride - pad_lo + k * dilation; }
};
// From the definitions: TensorFlow's "same" (ceil(n / s) positions, the smaller half of the padding
// first) and "valid".
geometry geometry_of(std::int64_t n, const mt::window& w) {
  const std::int64_t span = (w.size - 1) * w.dilation + 1;
  if (w.pad == mt::padding::valid) return {n, (n - span) / w.stride + 1, w.size, w.stride, w.dilation, 0};
  const std::int64_t out = (n + w.stride - 1) / w.stride;
  return {n, out, w.size, w.stride, w.dilation, std::max<std::int64_t>(0, (out - 1) * w.stride + span - n) / 2};
}

// Host im2col of x [B, H, W, C] into [B, OH, OW, KH, KW, C] (the window dims after the last spatial one).
std::vector<double> unfold_ref(const std::vector<double>& x, const geometry& gh, const geometry& gw, double fill) {
  std::vector<double> r;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t oh = 0; oh < gh.out; ++oh)
      for (std::int64_t ow = 0; ow < gw.out; ++ow)
        for (std::int64_t kh = 0; kh < gh.size; ++kh)
          for (std::int64_t kw = 0; kw < gw.size; ++kw)
            for (std::int64_t c = 0; c < C; ++c) {
              const std::int64_t ih = gh.at(oh, kh), iw = gw.at(ow, kw);
              const bool in = ih >= 0 && ih < H && iw >= 0 && iw < W;
              r.push_back(in ? x[((b * H + ih) * W + iw) * C + c] : fill);
            }
  return r;
}

// The input range [lo, hi) that outputs [ob, oe) read along a dim (empty when no output).
std::pair<std::int64_t, std::int64_t> read_range(const geometry& g, std::int64_t ob, std::int64_t oe) {
  std::int64_t lo = g.extent, hi = 0;
  for (std::int64_t o = ob; o < oe; ++o)
    for (std::int64_t k = 0; k < g.size; ++k) {
      const std::int64_t i = g.at(o, k);
      if (i >= 0 && i < g.extent) {
        lo = std::min(lo, i);
        hi = std::max(hi, i + 1);
      }
    }
  return lo < hi ? std::pair{lo, hi} : std::pair{std::int64_t{0}, std::int64_t{0}};
}
std::int64_t overlap(std::pair<std::int64_t, std::int64_t> a, std::int64_t lo, std::int64_t hi) {
  return std::max<std::int64_t>(0, std::min(a.second, hi) - std::max(a.first, lo));
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

bool all_ranks(bool mine) {
  int v = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}
std::int64_t sum_ranks(std::int64_t mine) {
  std::int64_t all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

const std::vector<mt::window> windows{
    {.size = 3, .pad = mt::padding::same},
    {.size = 3, .stride = 2, .pad = mt::padding::same},
    {.size = 2, .stride = 2, .pad = mt::padding::valid},
    {.size = 3, .dilation = 2, .pad = mt::padding::same},
    {.size = 4, .pad = mt::padding::valid},
    {.size = 7, .pad = mt::padding::same},
};

template <class L, class M>
void check_layout(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, b_, h_, w_, c_in>;
  using F = mt::tensor<double, L, kh_, kw_, c_in, co_>;
  const auto x = mt::random_normal<X>(g, {B, H, W, C}, 1);
  const auto x_host = mt::gather_all(x);
  for (std::size_t a = 0; a < windows.size(); ++a)
    for (std::size_t e = 0; e < windows.size(); e += 2) {
      const mt::window wh = windows[a], ww = windows[(a + e) % windows.size()];
      if ((ww.size - 1) * ww.dilation + 1 > W && ww.pad == mt::padding::valid) continue;
      INFO("window h: size " << wh.size << " stride " << wh.stride << " dilation " << wh.dilation << " same "
                             << (wh.pad == mt::padding::same) << "; w: size " << ww.size << " stride " << ww.stride
                             << " dilation " << ww.dilation << " same " << (ww.pad == mt::padding::same));
      const geometry gh = geometry_of(H, wh), gw = geometry_of(W, ww);

      g.reset_counters();
      const auto cols = mt::unfold<sh, sw>(x, wh, ww);
      const auto counted = calls_of(g);
      const std::int64_t sent = sum_ranks(bytes_of(g, mt::collective::shift));
      STATIC_REQUIRE(std::is_same_v<typename decltype(cols)::dims, mt::type_list<b_, h_, w_, kh_, kw_, c_in>>);
      REQUIRE(cols.extents() == std::array<std::int64_t, 6>{B, gh.out, gw.out, wh.size, ww.size, C});
      require_close(mt::gather_all(cols), unfold_ref(x_host, gh, gw, 0.0), 0.0);

      // Which path per dim: every processor's read range within its neighbours' parts (decided
      // here from the placement, independently of the library's halo plan).
      const auto p = x.placement();
      auto near_along = [&](std::size_t d, const geometry& geo) {
        const std::int64_t own_lo = x.offsets()[d], own_hi = own_lo + x.local_extents()[d];
        const auto need = read_range(geo, cols.offsets()[d], cols.offsets()[d] + cols.local_extents()[d]);
        const std::int64_t q = p.part_of(d, own_lo < p.extents()[d] ? own_lo : 0);
        const std::int64_t prev_lo = q == 0 ? own_lo : p.part_offset(d, q - 1);
        const std::int64_t next_hi = q + 1 >= p.parts(d) ? own_hi : p.part_offset(d, q + 1) + p.part_extent(d, q + 1);
        return need.first == need.second || (need.first >= prev_lo && need.second <= next_hi);
      };
      constexpr auto hs = L::template split_of<h_>(), ws = L::template split_of<w_>();
      const bool near_h = hs.count == 1 && all_ranks(near_along(1, gh));
      const bool near_w = ws.count == 1 && all_ranks(near_along(2, gw));
      INFO("neighbours along h: " << near_h << ", along w: " << near_w);
      mt::comm_plan want_unfold{}, want_fold{};
      if (hs.count > 0) want_unfold.then(near_h ? mt::collective::shift : mt::collective::allgather, hs.mask());
      if (near_h) want_unfold.then(mt::collective::shift, hs.mask());
      if (ws.count > 0) want_unfold.then(near_w ? mt::collective::shift : mt::collective::allgather, ws.mask());
      if (near_w) want_unfold.then(mt::collective::shift, ws.mask());
      if (ws.count > 0) want_fold.then(near_w ? mt::collective::shift : mt::collective::allreduce, ws.mask());
      if (near_w) want_fold.then(mt::collective::shift, ws.mask());
      if (hs.count > 0) want_fold.then(near_h ? mt::collective::shift : mt::collective::allreduce, hs.mask());
      if (near_h) want_fold.then(mt::collective::shift, hs.mask());
      REQUIRE(counted == want_unfold.as_counts());
      // The library's static plans are the two extremes.
      if ((hs.count == 0 || near_h) && (ws.count == 0 || near_w))
        REQUIRE(counted == mt::unfold_plan<X, sh, sw>().as_counts());
      if (!near_h && !near_w) REQUIRE(counted == mt::unfold_gather_plan<X, sh, sw>().as_counts());
      // The halo received: rows read outside the own part (times the own columns), then columns
      // read outside the own part, times the rows now held: the read range with its halo, or the
      // own part where nothing was received (rows no window reads stay; documented in ops.md).
      const auto nh = read_range(gh, cols.offsets()[1], cols.offsets()[1] + cols.local_extents()[1]);
      const auto nw = read_range(gw, cols.offsets()[2], cols.offsets()[2] + cols.local_extents()[2]);
      const std::int64_t other = x.local_extents()[0] * x.local_extents()[3];
      const std::int64_t halo_rows = nh.second - nh.first - overlap(nh, x.offsets()[1], x.offsets()[1] + x.local_extents()[1]);
      std::int64_t rows = hs.count == 0 || hs.count > 1 || !near_h ? H : halo_rows > 0 ? nh.second - nh.first : x.local_extents()[1];
      std::int64_t got = 0;
      if (near_h) got += halo_rows * x.local_extents()[2] * other;
      if (near_w)
        got += (nw.second - nw.first - overlap(nw, x.offsets()[2], x.offsets()[2] + x.local_extents()[2])) * rows * other;
      REQUIRE(sent == sum_ranks(got) * static_cast<std::int64_t>(sizeof(double)));

      // fold is the adjoint of unfold, with its own plan.
      using Cols = std::remove_cvref_t<decltype(cols)>;
      const auto c = mt::random_normal<Cols>(g, cols.extents(), 2);
      g.reset_counters();
      const auto folded = mt::fold<sh, sw>(c, {H, W}, wh, ww);
      REQUIRE(calls_of(g) == want_fold.as_counts());
      if ((hs.count == 0 || near_h) && (ws.count == 0 || near_w))
        REQUIRE(calls_of(g) == mt::fold_plan<X, sh, sw>().as_counts());
      if (!near_h && !near_w) REQUIRE(calls_of(g) == mt::fold_gather_plan<X, sh, sw>().as_counts());
      const double lhs = dot(mt::gather_all(cols), mt::gather_all(c)), rhs = dot(x_host, mt::gather_all(folded));
      REQUIRE(std::abs(lhs - rhs) <= 1e-10 * std::max(1.0, std::abs(lhs)));

      if (e != 0) continue;  // the layers once per height window
      // conv: sum over channels in and taps of the reference windows times the filter.
      const auto f = mt::random_normal<F>(g, {wh.size, ww.size, C, CO}, 3);
      const auto f_host = mt::gather_all(f);
      const auto y = mt::nn::conv<sh, sw>(x, f, wh, ww);
      STATIC_REQUIRE(std::is_same_v<typename decltype(y)::dims, mt::type_list<b_, h_, w_, co_>>);
      const auto ref = unfold_ref(x_host, gh, gw, 0.0);
      const std::int64_t taps = C * wh.size * ww.size;
      std::vector<double> y_ref;
      for (std::int64_t r = 0; r < B * gh.out * gw.out; ++r)
        for (std::int64_t o = 0; o < CO; ++o) {
          double s = 0;
          // ref's taps and the filter's rows both run (kh, kw, c).
          for (std::int64_t t = 0; t < taps; ++t) s += ref[r * taps + t] * f_host[t * CO + o];
          y_ref.push_back(s);
        }
      require_close(mt::gather_all(y), y_ref, 1e-12);

      // conv_transpose: <conv(x, f), z> = <x, conv_transpose(z, f)>.
      using Y = std::remove_cvref_t<decltype(y)>;
      const auto z = mt::random_normal<Y>(g, y.extents(), 4);
      const auto xt = mt::nn::conv_transpose<sh, sw>(z, f, {H, W}, wh, ww);
      STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(xt)>, X>);
      const double cl = dot(mt::gather_all(y), mt::gather_all(z)), cr = dot(x_host, mt::gather_all(xt));
      REQUIRE(std::abs(cl - cr) <= 1e-10 * std::max(1.0, std::abs(cl)));

      // Pools: the max (padding -inf) and the mean (padding counted) of each window.
      const auto mx = mt::gather_all(mt::nn::max_pool<sh, sw>(x, wh, ww));
      const auto av = mt::gather_all(mt::nn::avg_pool<sh, sw>(x, wh, ww));
      const auto inf_ref = unfold_ref(x_host, gh, gw, -INFINITY);
      const std::int64_t win = wh.size * ww.size;
      std::vector<double> mx_ref, av_ref;
      for (std::int64_t r = 0; r < B * gh.out * gw.out; ++r)
        for (std::int64_t c = 0; c < C; ++c) {
          double m = -INFINITY, s = 0;
          for (std::int64_t t = 0; t < win; ++t) {
            m = std::max(m, inf_ref[(r * win + t) * C + c]);
            s += ref[(r * win + t) * C + c];
          }
          mx_ref.push_back(m);
          av_ref.push_back(s / static_cast<double>(win));
        }
      require_close(mx, mx_ref, 0.0);
      require_close(av, av_ref, 1e-12);
    }

  // batch_norm over batch, height and width: per channel, (x - mean) / sqrt(var + eps) * scale + bias.
  using P = mt::tensor<double, L, c_in>;
  const auto scale = mt::random_normal<P>(g, {C}, 5), bias = mt::random_normal<P>(g, {C}, 6);
  const auto bn = mt::gather_all(mt::nn::batch_norm<b_, h_, w_>(x, scale, bias, 1e-5));
  const auto sc = mt::gather_all(scale), bi = mt::gather_all(bias);
  const std::int64_t n = B * H * W;
  std::vector<double> bn_ref(x_host.size());
  for (std::int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (std::int64_t i = 0; i < n; ++i) mean += x_host[i * C + c] / n;
    for (std::int64_t i = 0; i < n; ++i) var += (x_host[i * C + c] - mean) * (x_host[i * C + c] - mean) / n;
    for (std::int64_t i = 0; i < n; ++i) bn_ref[i * C + c] = (x_host[i * C + c] - mean) / std::sqrt(var + 1e-5) * sc[c] + bi[c];
  }
  require_close(bn, bn_ref, 1e-12);
}
}  // namespace

TEST_CASE("unfold, fold, conv, pools and batch_norm are layout-independent, with exact halos", "[equivalence][comm_plan]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_layout<mt::layout<line>>(g);
    check_layout<mt::layout<line, mt::split<h_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<w_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<b_, x_>>>(g);
    check_layout<mt::layout<line, mt::split<c_in, x_>>>(g);
  }
  SECTION("mesh [2x2] ([2x3] at 6 ranks, [P x 1] otherwise)") {
    auto g = world_grid();
    check_layout<mt::layout<grid, mt::split<h_, r_>, mt::split<w_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<w_, r_>, mt::split<h_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<h_, r_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<b_, r_>, mt::split<w_, c_>>>(g);
    check_layout<mt::layout<grid, mt::split<c_in, c_>, mt::split<h_, r_>>>(g);
  }
}

TEST_CASE("unfold and fold refuse windows that do not fit, naming the dim", "[errors]") {
  auto g = world_line();
  using X = mt::tensor<double, mt::layout<line, mt::split<h_, x_>>, b_, h_, w_, c_in>;
  const auto x = mt::random_normal<X>(g, {B, H, W, C}, 1);
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const mt::shape_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto too_long = message_of([&] { (void)mt::unfold<sw>(x, mt::window{.size = 8}); });
  INFO(too_long);
  REQUIRE(too_long.find("dim 'k'") != std::string::npos);
  REQUIRE(too_long.find("extent 7") != std::string::npos);
  const auto zero_stride = message_of([&] { (void)mt::unfold<sh>(x, mt::window{.size = 3, .stride = 0}); });
  INFO(zero_stride);
  REQUIRE(zero_stride.find("dim 'j'") != std::string::npos);
  REQUIRE(zero_stride.find("stride 0") != std::string::npos);
  const auto cols = mt::unfold<sh>(x, mt::window{.size = 3});
  const auto wrong = message_of([&] { (void)mt::fold<sh>(cols, {H}, mt::window{.size = 3, .stride = 2}); });
  INFO(wrong);
  REQUIRE(wrong.find("dim 'j'") != std::string::npos);
  REQUIRE(wrong.find("window positions") != std::string::npos);
}

namespace {
struct z_ : mt::dim<"z"> {};
struct kz_ : mt::dim<"kz"> {};
constexpr std::int64_t Z = 6;

// conv3d over (z, h, w) and conv1d over z against direct host loops, z split or not.
template <class L, class M>
void check_conv_1d_3d(const M& g) {
  INFO(layout_name<L>());
  using X = mt::tensor<double, L, b_, z_, h_, w_, c_in>;
  using F3 = mt::tensor<double, L, kz_, kh_, kw_, c_in, co_>;  // taps (z, h, w), then channels
  using F1 = mt::tensor<double, L, kz_, c_in, co_>;
  const mt::window wz{.size = 3, .stride = 2, .pad = mt::padding::same}, wh{.size = 3, .pad = mt::padding::same},
      ww{.size = 2, .pad = mt::padding::valid};
  const geometry gz = geometry_of(Z, wz), gh = geometry_of(H, wh), gw = geometry_of(W, ww);
  const auto x = mt::random_normal<X>(g, {B, Z, H, W, C}, 1);
  const auto f3 = mt::random_normal<F3>(g, {3, 3, 2, C, CO}, 2);
  const auto f1 = mt::random_normal<F1>(g, {3, C, CO}, 3);
  const auto xh = mt::gather_all(x), f3h = mt::gather_all(f3), f1h = mt::gather_all(f1);
  auto at = [&](std::int64_t b, std::int64_t z, std::int64_t h, std::int64_t w, std::int64_t c) {
    const bool in = z >= 0 && z < Z && h >= 0 && h < H && w >= 0 && w < W;
    return in ? xh[(((b * Z + z) * H + h) * W + w) * C + c] : 0.0;
  };
  const auto y3 = mt::nn::conv3d<z_, h_, w_, kz_, kh_, kw_>(x, f3, wz, wh, ww);
  std::vector<double> r3;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t oz = 0; oz < gz.out; ++oz)
      for (std::int64_t oh = 0; oh < gh.out; ++oh)
        for (std::int64_t ow = 0; ow < gw.out; ++ow)
          for (std::int64_t o = 0; o < CO; ++o) {
            double s = 0;
            for (std::int64_t a = 0; a < 3; ++a)
              for (std::int64_t e = 0; e < 3; ++e)
                for (std::int64_t q = 0; q < 2; ++q)
                  for (std::int64_t c = 0; c < C; ++c)
                    s += at(b, gz.at(oz, a), gh.at(oh, e), gw.at(ow, q), c) * f3h[(((a * 3 + e) * 2 + q) * C + c) * CO + o];
            r3.push_back(s);
          }
  require_close(mt::gather_all(y3), r3, 1e-12);
  const auto y1 = mt::nn::conv1d<z_, kz_>(x, f1, wz);
  std::vector<double> r1;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t oz = 0; oz < gz.out; ++oz)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t w = 0; w < W; ++w)
          for (std::int64_t o = 0; o < CO; ++o) {
            double s = 0;
            for (std::int64_t a = 0; a < 3; ++a)
              for (std::int64_t c = 0; c < C; ++c) s += at(b, gz.at(oz, a), h, w, c) * f1h[(a * C + c) * CO + o];
            r1.push_back(s);
          }
  require_close(mt::gather_all(y1), r1, 1e-12);
}
}  // namespace

TEST_CASE("conv1d and conv3d equal direct loops, depth split or not", "[equivalence]") {
  SECTION("mesh [P]") {
    auto g = world_line();
    check_conv_1d_3d<mt::layout<line>>(g);
    check_conv_1d_3d<mt::layout<line, mt::split<z_, x_>>>(g);
  }
  SECTION("mesh [2x2] ([2x3] at 6 ranks, [P x 1] otherwise)") {
    auto g = world_grid();
    check_conv_1d_3d<mt::layout<grid, mt::split<z_, r_>, mt::split<h_, c_>>>(g);
    check_conv_1d_3d<mt::layout<grid, mt::split<w_, r_>, mt::split<z_, c_>>>(g);
  }
}
