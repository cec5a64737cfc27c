#pragma once
// The transport of tensor files: MPI-IO at explicit offsets, each processor its box's contiguous
// runs (geometry's runs_of), in pieces MPI's int counts take, with every rank's result agreed
// (io/safetensors.hpp says why explicit offsets and not file views).
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <string>

#include "../error.hpp"
#include "../geometry/box.hpp"
#include "../runtime/agreement.hpp"
#include "tensor_set.hpp"

namespace meshtensor::io::detail {

inline std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

// Every rank passes its own MPI return code; all throw the same io_error if any failed.
inline void agree_mpi(MPI_Comm comm, int rc, const std::string& what) {
  meshtensor::detail::agree_or_throw<io_error>(comm, rc == MPI_SUCCESS,
                                               rc == MPI_SUCCESS ? std::string() : cat(what, ": ", mpi_error_text(rc)));
}

// An open MPI file, closed (collectively) when it goes.
struct mpi_file {
  MPI_File fh = MPI_FILE_NULL;
  mpi_file() = default;
  mpi_file(const mpi_file&) = delete;
  mpi_file& operator=(const mpi_file&) = delete;
  ~mpi_file() {
    if (fh != MPI_FILE_NULL) MPI_File_close(&fh);
  }
};

// Calls f(file_element, local_element, count) for each contiguous run of e's pieces (its box, or a
// zigzag layout's pieces) in the row-major global array (file_element) and in the row-major local
// slice (local_element, read through the piece's frame): geometry's runs_between.
template <class F>
void for_each_run(const entry& e, F&& f) {
  const std::vector<std::int64_t> origin(e.shape.size(), 0);
  for (const auto& pc : e.pieces) {
    const auto runs = runs_between(pc.offset, pc.extent, origin, e.shape, pc.frame_offset, e.extent);
    for (std::int64_t k = 0; k < runs.count; ++k) {
      const auto [file, local] = runs.at(k);
      f(file, local, runs.length);
    }
  }
}

// count bytes at offset of fh, through op (MPI_File_write_at or MPI_File_read_at), in pieces MPI's
// int counts take; a short transfer is short_error.
template <class Byte, class Op>
int transfer_bytes(Op op, MPI_File fh, MPI_Offset offset, Byte* data, std::int64_t count, int short_error) {
  constexpr std::int64_t piece = std::int64_t{1} << 30;
  for (std::int64_t done = 0; done < count; done += piece) {
    const int n = static_cast<int>(std::min(piece, count - done));
    MPI_Status st;
    int rc = op(fh, offset + done, data + done, n, MPI_BYTE, &st);
    int got = 0;
    if (rc == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &got);
    if (rc == MPI_SUCCESS && got != n) rc = short_error;
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}
inline int write_bytes(MPI_File fh, MPI_Offset offset, const char* data, std::int64_t count) {
  return transfer_bytes(MPI_File_write_at, fh, offset, data, count, MPI_ERR_IO);
}
inline int read_bytes(MPI_File fh, MPI_Offset offset, char* data, std::int64_t count) {
  return transfer_bytes(MPI_File_read_at, fh, offset, data, count, MPI_ERR_TRUNCATE);
}

}  // namespace meshtensor::io::detail
