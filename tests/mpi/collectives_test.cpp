// The collectives on a mesh's sub-communicators: calls and bytes counted per axis set, the right
// data moved, an op's stated plan compared with what it ran where plans are checked, and the
// sub-communicators cached and sized by their axes; under MESHTENSOR_PROGRESS_THREAD, a transfer
// moving while its rank makes no MPI call.
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstdlib>
#include <test_support.hpp>
#include <thread>
#include <vector>

using namespace tst;
namespace mt = meshtensor;

TEST_CASE("collectives count calls and bytes per axis set", "[comm_plan]") {
  auto g = world_grid();
  auto& comm = g.communicator();
  g.reset_counters();
  std::vector<double> v(10, 1.0);
  mt::allreduce(comm, grid::mask<r_>(), v.data(), 10);
  mt::allreduce(comm, grid::mask<r_>(), v.data(), 10, mt::reduce_op::max);
  REQUIRE(v[0] == double(g.size<r_>()));
  std::vector<double> all(10 * g.nprocs());
  mt::allgather(comm, grid::mask<r_, c_>(), v.data(), 10, all.data());
  const auto& counters = g.counters();
  REQUIRE(counters.at({mt::collective::allreduce, grid::mask<r_>()}) == mt::comm_count{2, 160});
  REQUIRE(counters.at({mt::collective::allgather, grid::mask<r_, c_>()}) == mt::comm_count{1, 80});
  REQUIRE(counters.size() == 2);
}

TEST_CASE("collectives move the right data", "[comm_plan]") {
  auto g = world_grid();
  auto& comm = g.communicator();
  const int p = g.nprocs(), me = g.rank();
  // allgather in sub-communicator order: rank order over (r, c), last axis fastest.
  std::vector<int> mine{me}, all(p);
  mt::allgather(comm, grid::mask<r_, c_>(), mine.data(), 1, all.data());
  for (int q = 0; q < p; ++q) REQUIRE(all[q] == q);
  // alltoall: block q goes to rank q.
  std::vector<int> send(p), recv(p);
  for (int q = 0; q < p; ++q) send[q] = me * 100 + q;
  mt::alltoall(comm, grid::mask<r_, c_>(), send.data(), 1, recv.data());
  for (int q = 0; q < p; ++q) REQUIRE(recv[q] == q * 100 + me);
  // reduce_scatter: each rank gets the sum of its block.
  std::vector<double> rs(p, 1.0), out(1);
  mt::reduce_scatter(comm, grid::mask<r_, c_>(), rs.data(), out.data(), 1);
  REQUIRE(out[0] == double(p));
  // shift along r by +1 with wrap: receive from the processor above.
  const int rsize = g.size<r_>(), rc = g.coord<r_>();
  std::vector<int> s{rc}, rcv{-1};
  mt::shift(comm, 0, s.data(), rcv.data(), 1, 1, true);
  REQUIRE(rcv[0] == (rc - 1 + rsize) % rsize);
  mt::shift(comm, 0, s.data(), rcv.data(), 1, 1, false);
  REQUIRE(rcv[0] == (rc == 0 ? 0 : rc - 1));
  // broadcast from sub-rank 0 along c.
  std::vector<int> bc{g.coord<c_>() + 7};
  mt::broadcast(comm, grid::mask<c_>(), bc.data(), 1, 0);
  REQUIRE(bc[0] == 7);
}

// The door every op goes through (ops/op_call.hpp) compares what an op ran with the plan its
// step states where plans are checked (the suite sets MESHTENSOR_CHECK_PLANS): a stand-in op that
// runs reduce_sum under a step stating another plan fails, naming itself, what it ran and its plan;
// stating reduce_sum's plan it passes; a composite step checks nothing.
TEST_CASE("an op whose step states another plan than it runs fails where plans are checked", "[comm_plan]") {
  using L = mt::layout<grid, mt::split<i_, r_>>;
  using X = mt::tensor<double, L, i_, j_>;
  const auto g = world_grid();
  const auto x = mt::random_normal<X>(g, {4, 6}, 1);
  bool& checked = mt::detail::plans_checked_switch();
  const bool before = checked;
  checked = true;
  const auto stand_in = [&](mt::comm_plan stated) {
    const mt::detail::op_call call(mt::detail::planned_op{"stand_in", stated}, x);
    return mt::reduce_sum<i_>(x);
  };
  CHECK_THROWS_WITH(stand_in(mt::comm_plan{}),
                    Catch::Matchers::ContainsSubstring("stand_in ran 1 x allreduce over r") &&
                        Catch::Matchers::ContainsSubstring("but its plan says no collective"));
  CHECK_THROWS_WITH(stand_in(mt::comm_plan{}.then(mt::collective::allgather, 1u)),
                    Catch::Matchers::ContainsSubstring("its plan says 1 x allgather over r"));
  CHECK_NOTHROW(stand_in(mt::reduce_plan<mt::tensor<double, L, j_>, X>()));
  CHECK_NOTHROW([&] {
    const mt::detail::op_call call(mt::detail::composite_op{"layer"});
    return mt::reduce_sum<i_>(x);
  }());
  // Unchecked, the drifting step passes unnoticed: the suite's setting is what catches it.
  checked = false;
  CHECK_NOTHROW(stand_in(mt::comm_plan{}));
  checked = before;
}

TEST_CASE("sub-communicators are cached and sized by their axes", "[collectives]") {
  auto g = world_grid();
  MPI_Comm rows = g.comm_over<r_>();
  REQUIRE(rows == g.comm_over<r_>());
  int n = 0;
  MPI_Comm_size(rows, &n);
  REQUIRE(n == g.size<r_>());
  MPI_Comm both = g.comm_over<r_, c_>();
  MPI_Comm_size(both, &n);
  REQUIRE(n == g.nprocs());
}

// The run mpi.collectives_test.progress_thread (MESHTENSOR_PROGRESS_THREAD=100): rank 1 sends rank
// 0 a message past any eager limit (8 MiB: the sender waits until the receiver's MPI matches it and
// copies it) while rank 0, its receive posted, sleeps a second without an MPI call. With the thread
// the send ends long before rank 0 wakes; without it, it would end after. Skipped where the
// variable is unset; where it is set, the thread must be running.
TEST_CASE("the progress thread moves MPI on while a rank makes no MPI call", "[progress_thread]") {
  if (std::getenv("MESHTENSOR_PROGRESS_THREAD") == nullptr) SKIP("MESHTENSOR_PROGRESS_THREAD is unset");
  REQUIRE(mt::progress_thread_running());
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) SKIP("one rank: nothing to send");
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  std::vector<char> message(8 << 20, 'm');
  const int n = static_cast<int>(message.size());
  double send_seconds = 0;
  MPI_Barrier(comm);
  if (rank == 0) {
    MPI_Request received;
    MPI_Irecv(message.data(), n, MPI_CHAR, 1, 7, comm, &received);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    MPI_Wait(&received, MPI_STATUS_IGNORE);
  } else if (rank == 1) {
    const auto start = std::chrono::steady_clock::now();
    MPI_Send(message.data(), n, MPI_CHAR, 0, 7, comm);
    send_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  MPI_Bcast(&send_seconds, 1, MPI_DOUBLE, 1, comm);  // every rank checks alike
  MPI_Comm_free(&comm);
  INFO("rank 1's send of 8 MiB took " << send_seconds << " s while rank 0 slept 1 s");
  REQUIRE(send_seconds < 0.5);
}
