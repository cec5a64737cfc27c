// Compile-time benchmark: 50 ops through meshtensor (10 groups of einsum, add, multiply, relu and
// reduce_sum, each group on dims of its own, so every op is a new instantiation). Its twin
// ops50_plain.cpp does the same work by hand with Kokkos, cblas and MPI. scripts/dev/bench.sh times
// the compile of each; they are built, never run.
#include <meshtensor/meshtensor.hpp>

namespace mt = meshtensor;

struct k : mt::dim<"k"> {};
struct n : mt::dim<"n"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

#define GROUP(I)                                                                 \
  struct m##I : mt::dim<"m" #I> {};                                              \
  float group##I(const grid& g, std::int64_t s) {                                \
    using L = mt::layout<grid, mt::split<m##I, rows>, mt::split<k, cols>>;       \
    auto a = mt::random_normal<mt::tensor<float, L, m##I, k>>(g, {s, s}, I);     \
    auto b = mt::random_normal<mt::tensor<float, L, k, n>>(g, {s, s}, I + 100);  \
    auto c = mt::einsum<m##I, n>(a, b);                                          \
    auto d = c + c;                                                              \
    auto e = d * c;                                                              \
    auto f = mt::relu(e);                                                        \
    auto r = mt::reduce_sum<m##I>(f);                                            \
    return mt::gather(r)[0];                                                     \
  }

GROUP(0)
GROUP(1)
GROUP(2)
GROUP(3)
GROUP(4)
GROUP(5)
GROUP(6)
GROUP(7)
GROUP(8)
GROUP(9)

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  grid g(env, {1, 1});
  float t = 0;
  t += group0(g, 64) + group1(g, 64) + group2(g, 64) + group3(g, 64) + group4(g, 64);
  t += group5(g, 64) + group6(g, 64) + group7(g, 64) + group8(g, 64) + group9(g, 64);
  return t == 0 ? 1 : 0;
}
