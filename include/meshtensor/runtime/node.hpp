#pragma once
// This process's place among the processes of its node (those that share its memory: MPI's
// MPI_COMM_TYPE_SHARED): which GPU a rank takes, how many cores a rank's helper threads may use.
#include <mpi.h>

namespace meshtensor {

struct node_place {
  int rank = 0;  // among the node's processes of comm
  int size = 1;  // the node's processes of comm
};

inline node_place node_place_of(MPI_Comm comm) {
  MPI_Comm node;
  node_place p;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &p.rank);
  MPI_Comm_size(node, &p.size);
  MPI_Comm_free(&node);
  return p;
}

}  // namespace meshtensor
