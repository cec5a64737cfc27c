// Tensors under zigzag<Dim, Axes...> (geometry/placement.hpp) at 1, 2, 3, 4 and 6 ranks: from_host
// stores chunk q then chunk 2P - 1 - q (checked against the chunk rule written out here, not the
// placement's pieces), gather_all gives the host array back, relayout to split<> and to replicated
// and back is exact with the counted collectives equal to the plan, random_normal draws the same
// values as under any other layout, and an elementwise op, a broadcast and a sum over the zigzag dim
// (with its gradient) are the replicated tensor's, and so are softmax and layer_norm along the other
// dim, dropout (its mask by global index) and an embedding of zigzag ids. Lengths even over 2P,
// uneven, and below 2P.
#include "comm_counts.hpp"

using namespace tst;
namespace mt = meshtensor;

namespace {
using Exec = Kokkos::DefaultExecutionSpace;

std::vector<double> values(std::int64_t n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) v[k] = 0.25 * static_cast<double>(k) - 3.0;
  return v;
}

// The rows of dim 0 that part q holds, in local order: chunk q, then chunk 2P - 1 - q, of n rows
// cut into 2P chunks, the first n % 2P one longer.
std::vector<std::int64_t> zigzag_rows(std::int64_t n, std::int64_t P, std::int64_t q) {
  const std::int64_t chunks = 2 * P, base = n / chunks, extra = n % chunks;
  std::vector<std::int64_t> rows;
  for (const std::int64_t c : {q, chunks - 1 - q}) {
    const std::int64_t start = c * base + std::min(c, extra), size = base + (c < extra ? 1 : 0);
    for (std::int64_t i = start; i < start + size; ++i) rows.push_back(i);
  }
  return rows;
}

template <class T>
std::vector<double> local_values(const T& t) {
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, t.view());
  return {h.data(), h.data() + h.extent(0)};
}

// Z: i zigzag over `part`'s axes, C: i split over the same axes, R: replicated; all over (i, j).
template <class M, class Z, class C, class R>
void check_zigzag(const M& m, std::int64_t part, std::int64_t P, const std::array<std::int64_t, 2>& ext) {
  INFO("extents " << ext[0] << " x " << ext[1] << ", part " << part << " of " << P);
  const auto host = values(ext[0] * ext[1]);
  const auto z = mt::from_host<Z>(m, ext, host);

  // The local array: the rows of chunks q and 2P - 1 - q, in that order, whole along j.
  std::vector<double> expect;
  for (const std::int64_t i : zigzag_rows(ext[0], P, part))
    for (std::int64_t j = 0; j < ext[1]; ++j) expect.push_back(host[static_cast<std::size_t>(i * ext[1] + j)]);
  REQUIRE(local_values(z) == expect);
  REQUIRE(z.template local_extent<i_>() * ext[1] == static_cast<std::int64_t>(expect.size()));
  REQUIRE(mt::gather_all(z) == host);
  REQUIRE(mt::gather(z, 0) == (m.rank() == 0 ? host : std::vector<double>{}));
  REQUIRE(mt::scatter<Z>(m, ext, std::span<const double>(host)).view().extent(0) == expect.size());
  REQUIRE(local_values(mt::scatter<Z>(m, ext, std::span<const double>(host))) == expect);

  // Relayouts there and back: exact, their collectives the plan's.
  m.reset_counters();
  const auto c = mt::relayout<C>(z);
  require_counts(m.communicator(), mt::relayout_plan<C, Z>());
  REQUIRE(mt::gather_all(c) == host);
  m.reset_counters();
  REQUIRE(local_values(mt::relayout<Z>(c)) == expect);
  require_counts(m.communicator(), mt::relayout_plan<Z, C>());
  const auto r = mt::relayout<R>(z);
  REQUIRE(local_values(r) == host);
  // From replicated, each processor keeps its own pieces: it sends only to itself (replicas do not
  // all send one element), its slice's bytes.
  m.reset_counters();
  REQUIRE(local_values(mt::relayout<Z>(r)) == expect);
  std::int64_t sent = 0;
  for (const auto& [key, count] : m.communicator().counters()) sent += count.bytes;
  REQUIRE(sent == static_cast<std::int64_t>(expect.size() * sizeof(double)));

  // Drawn by global index: the same values as under the replicated layout.
  REQUIRE(mt::gather_all(mt::random_normal<Z>(m, ext, 7)) == local_values(mt::random_normal<R>(m, ext, 7)));

  // Elementwise, broadcast and a sum over the zigzag dim (order-free), with its gradient.
  using B = mt::basic_tensor<double, typename Z::layout_type, Exec, j_>;
  const auto b = mt::from_host<B>(m, {ext[1]}, values(ext[1]));
  auto zg = mt::from_host<Z>(m, ext, host);
  zg.requires_grad();
  const auto y = mt::square(zg) * b + zg;
  const auto br = mt::from_host<mt::basic_tensor<double, mt::layout<M>, Exec, j_>>(m, {ext[1]}, values(ext[1]));
  const auto yr = mt::square(r) * br + r;
  REQUIRE(mt::gather_all(y) == local_values(yr));
  const auto s = mt::reduce_sum<i_>(y);
  const auto sr = mt::gather_all(mt::reduce_sum<i_>(yr));
  const auto sz = mt::gather_all(s);
  REQUIRE(sz.size() == sr.size());
  for (std::size_t k = 0; k < sz.size(); ++k) REQUIRE(std::abs(sz[k] - sr[k]) <= 1e-12 * (1.0 + std::abs(sr[k])));
  auto loss = mt::reduce_sum<j_>(s);
  const auto [gz] = mt::gradient(loss, zg);
  // d/dx (x^2 b + x) = 2 x b + 1.
  std::vector<double> want(host.size());
  const auto bh = values(ext[1]);
  for (std::size_t k = 0; k < host.size(); ++k) want[k] = 2.0 * host[k] * bh[k % static_cast<std::size_t>(ext[1])] + 1.0;
  const auto got = mt::gather_all(gz);
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) REQUIRE(std::abs(got[k] - want[k]) <= 1e-12 * (1.0 + std::abs(want[k])));
}
}  // namespace

TEST_CASE("zigzag: host I/O, relayouts, elementwise and a sum over the zigzag dim", "[zigzag][equivalence]") {
  // Even over 2P (P up to 6), uneven, and fewer rows than 2P chunks.
  const auto ext = GENERATE(std::array<std::int64_t, 2>{24, 3}, std::array<std::int64_t, 2>{13, 2},
                            std::array<std::int64_t, 2>{3, 2});
  SECTION("mesh [P]: i zigzag over x") {
    const auto m = world_line();
    check_zigzag<line, ten<mt::layout<line, mt::zigzag<i_, x_>>, i_, j_>,
                 ten<mt::layout<line, mt::split<i_, x_>>, i_, j_>, ten<mt::layout<line>, i_, j_>>(
        m, m.communicator().coords()[0], world_size(), ext);
  }
  SECTION("mesh [2x2] (or [P x 1], [2x3]): i zigzag over (c, r), j replicated") {
    const auto m = world_grid();
    const auto& co = m.communicator().coords();
    const auto& sz = m.communicator().sizes();
    check_zigzag<grid, ten<mt::layout<grid, mt::zigzag<i_, c_, r_>>, i_, j_>,
                 ten<mt::layout<grid, mt::split<i_, c_, r_>>, i_, j_>, ten<mt::layout<grid>, i_, j_>>(
        m, co[1] * sz[0] + co[0], world_size(), ext);
  }
}

TEST_CASE("zigzag beside a split dim: i zigzag over c, j split over r", "[zigzag][equivalence]") {
  const auto m = world_grid();
  using Z = ten<mt::layout<grid, mt::zigzag<i_, c_>, mt::split<j_, r_>>, i_, j_>;
  using C = ten<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>, i_, j_>;
  const std::array<std::int64_t, 2> ext{11, 5};
  const auto host = values(ext[0] * ext[1]);
  const auto z = mt::from_host<Z>(m, ext, host);
  REQUIRE(mt::gather_all(z) == host);
  m.reset_counters();
  const auto c = mt::relayout<C>(z);
  require_counts(m.communicator(), mt::relayout_plan<C, Z>());
  REQUIRE(mt::gather_all(c) == host);
  REQUIRE(local_values(mt::relayout<Z>(c)) == local_values(z));
  const auto described = mt::describe(z);
  INFO(described);
  REQUIRE(described.find("i -> c(") != std::string::npos);
  REQUIRE(described.find(") zigzag") != std::string::npos);

  // j gaining its split beside the zigzag i is local (each processor's pieces lie in its old
  // ones): no collective, and exact; and back (j dropping r) is one exchange over r.
  using Zi = ten<mt::layout<grid, mt::zigzag<i_, c_>>, i_, j_>;
  const auto zi = mt::from_host<Zi>(m, ext, host);
  m.reset_counters();
  const auto zj = mt::relayout<Z>(zi);
  REQUIRE(m.communicator().counters().empty());
  REQUIRE(mt::relayout_plan<Z, Zi>().empty());
  REQUIRE(local_values(zj) == local_values(z));
  m.reset_counters();
  REQUIRE(local_values(mt::relayout<Zi>(zj)) == local_values(zi));
  require_counts(m.communicator(), mt::relayout_plan<Zi, Z>());
}

// Row kernels along another dim read only that dim's start (tensor::offset<D>), so softmax and
// layer_norm over j take a tensor cut zigzag along i: forward and gradient equal the replicated one's.
TEST_CASE("zigzag: softmax and layer_norm along the other dim, with their gradients", "[zigzag][equivalence]") {
  const auto m = world_line();
  using Z = ten<mt::layout<line, mt::zigzag<i_, x_>>, i_, j_>;
  using R = ten<mt::layout<line>, i_, j_>;
  const std::array<std::int64_t, 2> ext{13, 5};
  const auto host = values(ext[0] * ext[1]);
  const auto run = [&]<class X>(std::type_identity<X>) {
    using V = mt::basic_tensor<double, typename X::layout_type, Exec, j_>;
    auto x = mt::from_host<X>(m, ext, host);
    x.requires_grad();
    const auto scale = mt::from_host<V>(m, {ext[1]}, values(ext[1]));
    const auto bias = mt::from_host<V>(m, {ext[1]}, values(ext[1]));
    const auto y = mt::softmax<j_>(x) + mt::nn::layer_norm<j_>(x, scale, bias);
    auto loss = mt::reduce_sum<j_>(mt::reduce_sum<i_>(y * y));
    const auto [g] = mt::gradient(loss, x);
    return std::pair{mt::gather_all(y), mt::gather_all(g)};
  };
  const auto [yz, gz] = run(std::type_identity<Z>{});
  const auto [yr, gr] = run(std::type_identity<R>{});
  REQUIRE(yz.size() == yr.size());
  for (std::size_t k = 0; k < yz.size(); ++k) REQUIRE(std::abs(yz[k] - yr[k]) <= 1e-12 * (1.0 + std::abs(yr[k])));
  REQUIRE(gz.size() == gr.size());
  for (std::size_t k = 0; k < gz.size(); ++k) REQUIRE(std::abs(gz[k] - gr[k]) <= 1e-10 * (1.0 + std::abs(gr[k])));
}

namespace {
void require_near(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < got.size(); ++k) REQUIRE(std::abs(got[k] - want[k]) <= 1e-12 * (1.0 + std::abs(want[k])));
}
}  // namespace

// Dropout's mask is a function of the global index (nn/dropout.hpp): on a tensor cut zigzag along
// i (with j split too, on the grid) the fused kernel reads each element's global index through
// the placement's two ranges, so dropout, residual_dropout and their gradients equal the
// replicated tensor's, and dropout_mask is the replicated mask. Something is dropped, and the
// mask differs from step to step.
TEST_CASE("zigzag: dropout's mask along a zigzag dim is the replicated tensor's", "[zigzag][equivalence]") {
  const auto m = world_grid();
  using Z = ten<mt::layout<grid, mt::zigzag<i_, c_, r_>>, i_, j_>;
  using ZJ = ten<mt::layout<grid, mt::zigzag<i_, c_>, mt::split<j_, r_>>, i_, j_>;
  using R = ten<mt::layout<grid>, i_, j_>;
  const auto ext = GENERATE(std::array<std::int64_t, 2>{13, 5}, std::array<std::int64_t, 2>{3, 4});
  INFO("extents " << ext[0] << " x " << ext[1]);
  const auto host = values(ext[0] * ext[1]);
  const auto run = [&]<class X>(std::type_identity<X>) {
    auto x = mt::from_host<X>(m, ext, host);
    x.requires_grad();
    const auto y = mt::nn::dropout(x, 0.5, 7, 3) + mt::nn::residual_dropout(x, x * 2.0, 0.3, 9, 1);
    auto loss = mt::reduce_sum<j_>(mt::reduce_sum<i_>(y * y));
    const auto [g] = mt::gradient(loss, x);
    return std::array<std::vector<double>, 4>{mt::gather_all(y), mt::gather_all(g),
                                              mt::gather_all(mt::nn::dropout_mask<X>(m, ext, 0.5, 7, 3)),
                                              mt::gather_all(mt::nn::dropout(mt::from_host<X>(m, ext, host), 0.5, 7, 4))};
  };
  const auto r = run(std::type_identity<R>{});
  REQUIRE(std::count(r[2].begin(), r[2].end(), 0.0) > 0);  // something dropped
  REQUIRE(r[3] != mt::gather_all(mt::nn::dropout(mt::from_host<R>(m, ext, host), 0.5, 7, 3)));  // step 4's mask differs
  for (const auto& z : {run(std::type_identity<Z>{}), run(std::type_identity<ZJ>{})})
    for (std::size_t n = 0; n < 4; ++n) {
      INFO("result " << n << " (dropout + residual_dropout, its gradient, dropout_mask, dropout at step 4)");
      require_near(z[n], r[n]);
    }
}

// nn::embedding of ids cut zigzag along their sequence dim (i), the vocabulary split over the other
// axis: the lookup reads only the table's start along the vocabulary (offset<vocab>), so it takes
// the zigzag ids; the result and the table's gradient equal the replicated ones'.
TEST_CASE("zigzag: embedding of ids along a zigzag dim", "[zigzag][equivalence]") {
  struct vocab_ : mt::dim<"vocab"> {};
  struct d_ : mt::dim<"d"> {};
  const auto m = world_grid();
  using LZ = mt::layout<grid, mt::zigzag<i_, c_>, mt::split<vocab_, r_>>;
  using LR = mt::layout<grid>;
  constexpr std::int64_t V = 7, D = 3, N = 11, J = 2;
  std::vector<double> ids(static_cast<std::size_t>(N * J));
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<double>((k * 5 + 2) % V);
  const auto run = [&]<class L>(std::type_identity<L>) {
    auto table = mt::from_host<ten<L, vocab_, d_>>(m, {V, D}, values(V * D));
    table.requires_grad();
    const auto idx = mt::from_host<ten<L, i_, j_>>(m, {N, J}, ids);
    const auto y = mt::nn::embedding<vocab_>(table, idx);
    static_assert(std::is_same_v<typename decltype(y)::dims, mt::type_list<i_, j_, d_>>);
    auto loss = mt::reduce_sum<d_>(mt::reduce_sum<j_>(mt::reduce_sum<i_>(y * y)));
    const auto [g] = mt::gradient(loss, table);
    return std::pair{mt::gather_all(y), mt::gather_all(g)};
  };
  const auto [yz, gz] = run(std::type_identity<LZ>{});
  const auto [yr, gr] = run(std::type_identity<LR>{});
  // The lookup itself, written out: row ids[k] of the table.
  const auto table = values(V * D);
  for (std::size_t k = 0; k < ids.size(); ++k)
    for (std::int64_t d = 0; d < D; ++d)
      REQUIRE(yr[k * D + static_cast<std::size_t>(d)] == table[static_cast<std::size_t>(ids[k]) * D + static_cast<std::size_t>(d)]);
  require_near(yz, yr);
  require_near(gz, gr);
}
