#pragma once
// save / load of named distributed tensors as one safetensors file, by every rank in parallel.
//
//   mt::io::tensor_set set;
//   set.add("embedding", emb).add("w_in", w_in);     // any tensors of one mesh, any layouts
//   mt::io::save("model.safetensors", set, {{"step", "20"}});
//   auto meta = mt::io::load("model.safetensors", set); // into the tensors, under their layouts
//
// The format is safetensors (Hugging Face): a little-endian u64 header length n, n bytes of JSON
// ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, padded with spaces to a multiple of 8), then each tensor's
// global array, row-major, at its offsets. Python's safetensors and PyTorch read it with no
// meshtensor code. meshtensor adds one metadata key, "meshtensor.dims": a JSON string mapping each
// tensor's name to its dim names, checked on load.
//
// Writing: rank 0 writes the header; then every processor writes its box of each tensor, as the
// contiguous runs the box makes in the file's row-major global array (one run when the box spans
// every dim after its first; otherwise one per row), with MPI-IO at explicit offsets
// (MPI_File_write_at). Of the processors holding the same box (replicas over the axes that split
// none of the tensor's dims) only the one at coordinate 0 of those axes writes, so every byte is
// written once and no tensor is ever gathered anywhere. MPI_File_sync and a barrier end the save
// (the data is on disk when save returns, on every rank).
// Why explicit offsets and not a subarray file view with a collective write: Debian bookworm's
// Open MPI 4.1.4 corrupts collective writes now and then (OMPIO's default fcoll component,
// open-mpi/ompi#12718, fixed in 4.1.7; seen here at 4 ranks in about one run in ten) and its read
// data sieving loses values under some views (open-mpi/ompi#10546). Contiguous runs at offsets
// need no derived datatype, so no MPI-IO version mishandles them, and a row-split tensor is one
// run per processor.
// Reading: rank 0 reads and broadcasts the header, every rank checks it alike, then every processor
// reads only its own box under the tensor's current layout, run by run (MPI_File_read_at): a file
// written under any layout and rank count loads under any other. All reads land in host buffers
// first and are copied into the tensors only when every read on every rank succeeded, so a failed
// load leaves every tensor as it was.
// Errors are io_error naming the file and the tensor, raised on every rank alike (checks on the
// header are made on the same bytes everywhere; MPI-IO results are agreed by one allreduce).
//
// The set of tensors is io/tensor_set.hpp (type erasure), the MPI-IO transport io/mpi_file.hpp.
// Needs nlohmann-json (Debian's nlohmann-json3-dev; CMake target meshtensor::io). This header is
// not part of meshtensor.hpp, so the core stays free of it.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <bit>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../error.hpp"
#include "../runtime/agreement.hpp"
#include "mpi_file.hpp"
#include "safetensors_format.hpp"
#include "tensor_set.hpp"

namespace meshtensor::io {

namespace detail {
// The header's JSON for the set, in the set's order, with metadata, and every tensor's offset.
inline std::string header_for(const tensor_set& set, const metadata& meta, std::vector<std::int64_t>& begins) {
  nlohmann::json h = nlohmann::json::object(), dims = nlohmann::json::object();
  std::int64_t at = 0;
  begins.clear();
  for (const auto& e : set.entries()) {
    begins.push_back(at);
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.file_shape.empty() ? e.shape : e.file_shape},
                 {"data_offsets", {at, at + e.global_bytes()}}};
    if (e.file_shape.empty()) dims[e.name] = e.dims;  // a merged shape has other dims than the tensor's
    at += e.global_bytes();
  }
  nlohmann::json m(meta);
  m["meshtensor.dims"] = dims.dump();
  h["__metadata__"] = m;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

inline void check_same_mesh(const tensor_set& set, const std::string& path) {
  for (const auto& e : set.entries()) {
    int result = MPI_UNEQUAL;
    MPI_Comm_compare(set.comm(), e.comm, &result);
    if (result != MPI_IDENT && result != MPI_CONGRUENT)
      throw io_error(cat("'", path, "': tensor '", e.name, "' lives on other processes than tensor '",
                         set.entries().front().name, "'; a file holds the tensors of one mesh"));
  }
}
}  // namespace detail

// Writes the set to path (created or replaced), every rank its own boxes, in parallel. Collective
// over the set's mesh. The data is synced to disk when it returns. For a checkpoint that must
// survive a crash mid-write, use checkpoints::save (io/checkpoint.hpp), which writes beside the
// last one and switches only when complete.
namespace detail {
// What every safetensors file of set begins with, as save and the asynchronous writer both write
// it: the 8-byte little-endian length of the JSON header, then the header; begins receives each
// tensor's offset in the data that follows. Checks the set's mesh and the reserved metadata key.
inline std::string file_preamble(const tensor_set& set, const metadata& meta, const std::string& path,
                                 std::vector<std::int64_t>& begins) {
  check_same_mesh(set, path);
  if (meta.count("meshtensor.dims"))
    throw io_error(cat("'", path, "': the metadata key 'meshtensor.dims' is meshtensor's own"));
  const std::string header = header_for(set, meta, begins);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(static_cast<unsigned char>(std::uint64_t{header.size()} >> (8 * i)));
  return out + header;
}
}  // namespace detail

inline void save(const std::string& path, const tensor_set& set, const metadata& meta = {}) {
  using detail::cat;
  const MPI_Comm comm = set.comm();
  std::vector<std::int64_t> begins;
  const std::string preamble = detail::file_preamble(set, meta, path, begins);
  const MPI_Offset data_start = static_cast<MPI_Offset>(preamble.size());

  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // Truncate: a longer file of the same name would otherwise keep its tail.
  int rc = MPI_SUCCESS;
  if (rank == 0) {
    rc = MPI_File_delete(path.c_str(), MPI_INFO_NULL);
    if (rc != MPI_SUCCESS) {
      int cls = 0;
      MPI_Error_class(rc, &cls);
      if (cls == MPI_ERR_NO_SUCH_FILE) rc = MPI_SUCCESS;
    }
  }
  detail::agree_mpi(comm, rc, cat("cannot replace '", path, "'"));
  detail::mpi_file f;
  rc = MPI_File_open(comm, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &f.fh);
  detail::agree_mpi(comm, rc, cat("cannot create '", path, "'"));

  if (rank == 0) {
    MPI_Status st;
    rc = MPI_File_write_at(f.fh, 0, preamble.data(), static_cast<int>(preamble.size()), MPI_BYTE, &st);
  }
  detail::agree_mpi(comm, rc, cat("cannot write the header of '", path, "'"));

  // Each writer its runs, independently; the first failure's message is agreed after all.
  std::string problem;
  for (std::size_t i = 0; i < set.entries().size() && problem.empty(); ++i) {
    const auto& e = set.entries()[i];
    if (!e.writes || e.local_elements() == 0) continue;
    e.with_host_bytes([&](const char* local) {
      detail::for_each_run(e, [&](std::int64_t file, std::int64_t at, std::int64_t n) {
        if (rc != MPI_SUCCESS) return;
        rc = detail::write_bytes(f.fh, data_start + begins[i] + file * e.elem_size, local + at * e.elem_size,
                                 n * e.elem_size);
      });
    });
    if (rc != MPI_SUCCESS) problem = cat("cannot write tensor '", e.name, "' to '", path, "': ", detail::mpi_error_text(rc));
  }
  meshtensor::detail::agree_or_throw<io_error>(comm, problem.empty(), problem);
  rc = MPI_File_sync(f.fh);
  // The agreement is also the barrier after the sync: when save returns on any rank, every rank's
  // data is on disk.
  detail::agree_mpi(comm, rc, cat("cannot sync '", path, "' to disk"));
  rc = MPI_File_close(&f.fh);
  detail::agree_mpi(comm, rc, cat("cannot close '", path, "'"));
}

namespace detail {
inline parsed_header read_header(MPI_File fh, MPI_Comm comm, const std::string& path) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Offset file_size = 0;
  int rc = MPI_File_get_size(fh, &file_size);
  agree_mpi(comm, rc, cat("cannot read the size of '", path, "'"));
  // Rank 0 reads; problem is its message when the file cannot hold a header.
  std::string header, problem;
  if (rank == 0) {
    MPI_Status st;
    unsigned char len[8] = {};
    if (file_size >= 8 && (rc = MPI_File_read_at(fh, 0, len, 8, MPI_BYTE, &st)) != MPI_SUCCESS) {
      problem = cat("cannot read '", path, "': ", mpi_error_text(rc));
    } else if (const auto n = header_length(len, file_size, path, problem); problem.empty()) {
      header.resize(n);
      if (n && (rc = MPI_File_read_at(fh, 8, header.data(), static_cast<int>(n), MPI_BYTE, &st)) != MPI_SUCCESS)
        problem = cat("cannot read the header of '", path, "': ", mpi_error_text(rc));
    }
  }
  meshtensor::detail::agree_or_throw<io_error>(comm, problem.empty(), problem);
  long long n = static_cast<long long>(header.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
  header.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(header.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  return parse_header(header, static_cast<std::int64_t>(file_size), path);
}
}  // namespace detail

// Reads path's header (rank 0 reads, all check alike). Collective over comm.
inline file_info inspect(const std::string& path, MPI_Comm comm) {
  detail::mpi_file f;
  const int rc = MPI_File_open(comm, path.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &f.fh);
  detail::agree_mpi(comm, rc, detail::cat("cannot open '", path, "'"));
  return detail::info_of(detail::read_header(f.fh, comm, path), path);
}

// How strictly load compares a file's shapes with the tensors'. merged_dims: a file that records
// no dim names may hold a tensor with runs of its consecutive dims merged into one (row-major, the
// bytes are the same): Hugging Face's Linear weights [heads x d_kv, d_model] load into a tensor
// [kv_heads, group, d_kv, d_model].
struct load_options {
  bool merged_dims = false;
};


// Reads the set's tensors from path into the tensors, each processor only its own box under the
// tensor's layout (any layout and rank count may have written it). Checks, for every tensor of
// the set, that the file holds it with the same dtype, global extents (or, with
// load_options::merged_dims, merged ones) and (where recorded) dim names; returns the file's
// metadata (without meshtensor's own key). Collective over the set's mesh. On any error no tensor
// is changed.
inline metadata load(const std::string& path, tensor_set& set, const load_options& options = {}) {
  using detail::cat;
  const MPI_Comm comm = set.comm();
  detail::check_same_mesh(set, path);
  for (const auto& e : set.entries()) {
    if (!e.copy_in) throw io_error(cat("'", path, "': tensor '", e.name, "' was added as const; it cannot be loaded into"));
  }
  detail::mpi_file f;
  int rc = MPI_File_open(comm, path.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &f.fh);
  detail::agree_mpi(comm, rc, cat("cannot open '", path, "'"));
  const auto h = detail::read_header(f.fh, comm, path);

  const auto info = detail::info_of(h, path);
  std::vector<std::string> in_file;
  for (const auto& [name, t] : info.tensors) in_file.push_back(name);
  const auto& entries = set.entries();
  for (const auto& e : entries) {
    const auto it = info.tensors.find(e.name);
    if (it == info.tensors.end())
      throw io_error(cat("'", path, "' holds no tensor '", e.name, "' (it holds: ", detail::join(in_file), ")"));
    const auto& t = it->second;
    if (t.dtype != e.dtype)
      throw io_error(cat("'", path, "': tensor '", e.name, "' is ", t.dtype, " in the file, but the tensor loaded into is ",
                         e.dtype));
    if (t.shape != e.shape && !(options.merged_dims && t.dims.empty() && detail::merges_of(t.shape, e.shape)))
      throw io_error(cat("'", path, "': tensor '", e.name, "' has shape ", detail::shape_text(t.shape),
                         " in the file, but the tensor loaded into has ", detail::shape_text(e.shape), " (dims ",
                         detail::join(e.dims), ")"));
    if (!t.dims.empty() && t.dims != e.dims)
      throw io_error(cat("'", path, "': tensor '", e.name, "' has dims [", detail::join(t.dims),
                         "] in the file, but the tensor loaded into has [", detail::join(e.dims), "]"));
  }

  // Read every box into host buffers; copy into the tensors only when all reads succeeded.
  // Not zero-filled: every byte is read into (a pass over the memory saved).
  std::vector<std::unique_ptr<char[]>> buffers(entries.size());
  std::string problem;
  for (std::size_t i = 0; i < entries.size() && problem.empty(); ++i) {
    const auto& e = entries[i];
    buffers[i].reset(new char[static_cast<std::size_t>(e.local_elements() * e.elem_size)]);
    const auto begin = h.json[e.name]["data_offsets"][0].get<std::int64_t>();
    detail::for_each_run(e, [&](std::int64_t file, std::int64_t at, std::int64_t n) {
      if (rc != MPI_SUCCESS) return;
      rc = detail::read_bytes(f.fh, h.data_start + begin + file * e.elem_size, buffers[i].get() + at * e.elem_size,
                              n * e.elem_size);
    });
    if (rc != MPI_SUCCESS) problem = cat("cannot read tensor '", e.name, "' from '", path, "': ", detail::mpi_error_text(rc));
  }
  meshtensor::detail::agree_or_throw<io_error>(comm, problem.empty(), problem);
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].copy_in(buffers[i].get());
  return info.meta;
}

}  // namespace meshtensor::io
