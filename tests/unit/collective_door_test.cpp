// The one door of collectives (communicator::run and start, runtime/communicator.hpp), on a planned
// communicator: a collective is counted as a real run counts it (kind, axes, the bytes this rank
// sends) and none of its MPI calls runs; a started one gives no request. No processes: a planned
// communicator makes no MPI call.
#include <catch2/catch_test_macros.hpp>

#include <meshtensor/runtime/collectives.hpp>
#include <meshtensor/runtime/nan_allreduce.hpp>
#include <vector>

namespace mt = meshtensor;

namespace {
mt::comm_count counted(const mt::communicator& c, mt::collective kind, mt::axis_set axes) {
  const auto it = c.counters().find({kind, axes});
  return it == c.counters().end() ? mt::comm_count{} : it->second;
}
}  // namespace

TEST_CASE("the collective door counts a planned collective and runs none of it", "[collectives]") {
  mt::communicator c({"rows", "cols"}, {2, 3}, {1, 2});
  bool ran = false;
  const bool here = c.run({mt::collective::allreduce, mt::axis_set(2u), 96, true}, [&] { ran = true; },
                          [&](MPI_Request*) { ran = true; });
  CHECK_FALSE(here);
  CHECK_FALSE(ran);
  CHECK(c.counters().size() == 1);
  CHECK(counted(c, mt::collective::allreduce, 2u) == mt::comm_count{1, 96});

  const auto r = c.start({mt::collective::allgather, mt::axis_set(1u), 8}, [&](MPI_Request*) { ran = true; });
  CHECK(r.request == MPI_REQUEST_NULL);
  CHECK(r.plan_ticket >= 0);  // its wait's place in the plan's order
  CHECK_FALSE(ran);
  CHECK(counted(c, mt::collective::allgather, 1u) == mt::comm_count{1, 8});
}

TEST_CASE("every collective entry point counts through the door in a plan", "[collectives]") {
  mt::communicator c({"rows", "cols"}, {2, 3}, {0, 1});  // cols: 3 processors
  const mt::axis_set cols(2u), rows(1u), both(3u);
  std::vector<float> f(64);
  std::vector<mt::bf16> h(64);
  std::vector<int> counts{2, 3, 4}, displs{0, 2, 5};

  mt::allreduce(c, cols, f.data(), 5);
  mt::allreduce(c, cols, h.data(), 5);  // bf16 reduced in float: float's bytes
  mt::nan_propagating_allreduce(c, rows, f.data(), 3, mt::reduce_op::max);
  CHECK(counted(c, mt::collective::allreduce, cols) == mt::comm_count{2, 40});
  CHECK(counted(c, mt::collective::allreduce, rows) == mt::comm_count{1, 12});

  mt::allgather(c, cols, f.data(), 4, f.data());
  mt::allgatherv(c, cols, f.data(), 3, f.data(), counts, displs);
  (void)mt::start_allgatherv(c, cols, f.data(), 3, f.data(), counts, displs);
  CHECK(counted(c, mt::collective::allgather, cols) == mt::comm_count{3, 16 + 12 + 12});

  mt::reduce_scatter(c, cols, f.data(), f.data(), 2);  // 2 per rank x 3 ranks x 4 bytes
  mt::reduce_scatter(c, cols, h.data(), h.data(), 2);  // bf16: in float
  mt::reduce_scatter_v(c, cols, f.data(), f.data(), counts);
  CHECK(counted(c, mt::collective::reduce_scatter, cols) == mt::comm_count{3, 24 + 24 + 36});

  mt::alltoall(c, both, f.data(), 2, f.data());  // 2 per peer x 6 peers x 4 bytes
  CHECK(counted(c, mt::collective::alltoall, both) == mt::comm_count{1, 48});

  f.assign(f.size(), 7.0f);
  mt::shift(c, 1, f.data(), f.data(), 4, 2, false);  // its source falls off the edge: a run fills zeros, a plan nothing
  mt::shift_v(c, 1, f.data(), 3, f.data(), 2, 1);
  CHECK(counted(c, mt::collective::shift, cols) == mt::comm_count{2, 16 + 12});
  CHECK(f[0] == 7.0f);

  mt::exscan(c, cols, f.data(), f.data(), 4);
  mt::broadcast(c, rows, f.data(), 6);
  CHECK(counted(c, mt::collective::exscan, cols) == mt::comm_count{1, 16});
  CHECK(counted(c, mt::collective::broadcast, rows) == mt::comm_count{1, 24});
  CHECK(f[0] == 7.0f);  // exscan's zeros on sub-rank 0 are written only where it ran
}
