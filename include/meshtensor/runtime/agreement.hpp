#pragma once
// Agreement: a check on data only this rank sees becomes an error on every rank of a communicator.
//
// meshtensor's rule is that no rank is ever left waiting (see environment.hpp): an error raised on
// one rank only would leave the others blocked in their next collective. Checks on data every rank
// shares (types, extents, mesh sizes) fail alike everywhere without help; a check on data each rank
// holds for itself (the size of a host array, the contents of a file it read) goes through
// agree_or_throw, which makes its outcome the same on all ranks.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <span>
#include <string>

#include "../error.hpp"

namespace meshtensor::detail {

// The rank in MPI_COMM_WORLD of rank r of comm (r itself when comm is not part of the world).
inline int world_rank_of(MPI_Comm comm, int r) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int w = MPI_UNDEFINED;
  MPI_Group_translate_ranks(group, 1, &r, world, &w);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return w == MPI_UNDEFINED ? r : w;
}

// The verdict of the ranks' MPI_MIN (first: the lowest failing rank of comm, INT_MAX if none)
// carried out: nothing, or the failing rank's message on every rank.
template <class E = shape_error>
void throw_if_agreed_failure(MPI_Comm comm, int me, int first, const std::string& message_if_not) {
  if (first == INT_MAX) return;
  std::string text = me == first ? message_if_not : std::string();
  long long n = static_cast<long long>(text.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, first, comm);
  text.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(text.data(), static_cast<int>(n), MPI_CHAR, first, comm);
  throw E("rank " + std::to_string(world_rank_of(comm, first)) + ": " + text);
}

// Every rank of comm calls it, with its own verdict. One MPI_Allreduce (MPI_MIN over the ranks whose
// ok_here is false) decides. If no rank failed, it returns on every rank. If some did, the lowest
// of them broadcasts its message_if_not, and every rank throws E("rank R: <that message>"), R being
// that rank's number in MPI_COMM_WORLD: all ranks throw the same type with the same what(), and
// leave together. Costs one allreduce of one int when all agree (message_if_not is only read on
// the failing rank, so callers may pass an empty string where the check passed).
template <class E = shape_error>
void agree_or_throw(MPI_Comm comm, bool ok_here, const std::string& message_if_not) {
  if (comm == MPI_COMM_NULL) {  // a planned mesh: one processor, nobody to agree with
    if (!ok_here) throw E(message_if_not);
    return;
  }
  int me = 0;
  MPI_Comm_rank(comm, &me);
  int mine = ok_here ? INT_MAX : me, first = INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  throw_if_agreed_failure<E>(comm, me, first, message_if_not);
}

// Whether `values` (a host value every rank must hold alike: an op's index, a slice's begin) is the
// same on every rank of comm: one allreduce of two 64-bit words (the largest hash and the largest
// complement, i.e. the smallest hash), so every rank reaches the same verdict. A hash, not the
// values: the cost does not grow with them (a collision could hide a difference; a check, not a proof).
inline bool same_on_every_rank(MPI_Comm comm, std::span<const std::int64_t> values) {
  if (comm == MPI_COMM_NULL) return true;
  std::uint64_t h = 1469598103934665603ull ^ values.size();  // FNV-1a over the size and the values
  for (const std::int64_t v : values)
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<std::uint64_t>(v) >> (8 * b)) & 0xffu)) * 1099511628211ull;
  unsigned long long mine[2] = {h, ~h}, extremes[2] = {0, 0};
  MPI_Allreduce(mine, extremes, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  return extremes[0] == ~extremes[1];
}


}  // namespace meshtensor::detail
