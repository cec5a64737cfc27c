// A program outside the project that uses the installed package.
#include <cstdio>
#include <meshtensor/meshtensor.hpp>

namespace mt = meshtensor;
struct rows : mt::axis<"rows"> {};
struct n : mt::dim<"n"> {};

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  mt::mesh<rows> g(env);
  using t = mt::tensor<double, mt::layout<mt::mesh<rows>, mt::split<n, rows>>, n>;
  auto x = mt::iota<t>(g, {8});
  auto total = mt::gather_all(mt::reduce_sum<n>(x));
  if (total.size() != 1 || total[0] != 28.0) {
    std::printf("consumer: wrong sum %f\n", total.empty() ? -1.0 : total[0]);
    return 1;
  }
  if (env.world_rank() == 0) std::printf("consumer ok\n");
  return 0;
}
