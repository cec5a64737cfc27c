#pragma once
// tensor_set: named distributed tensors of one mesh, type-erased to what a file needs of each
// (dtype, dim names, global shape, this processor's box, whether it writes it, its bytes on the
// host and a way back into the slice). save and load (io/safetensors.hpp) and the checkpoints
// (io/checkpoint.hpp) take a set; the transport (io/mpi_file.hpp) sees only its entries.
#include <algorithm>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "../error.hpp"
#include "../kernels/launch.hpp"
#include "../tensor/mpi_buffer.hpp"
#include "../tensor/tensor.hpp"
#include "safetensors_format.hpp"

namespace meshtensor::io {

namespace detail {
using meshtensor::detail::cat;

// One tensor of a set, type-erased: what save and load need to know of it.
struct entry {
  std::string name;
  std::string dtype;
  std::int64_t elem_size = 0;
  std::vector<std::string> dims;
  std::vector<std::int64_t> shape, extent;  // global extents; this processor's local extents
  std::vector<std::int64_t> file_shape;     // what a file records, if not shape (merged dims)
  // What this processor holds: its box, or under a zigzag layout several pieces (placement's
  // pieces_at), each a global box and the frame its local array is read through.
  struct held_piece {
    std::vector<std::int64_t> offset, extent, frame_offset;
  };
  std::vector<held_piece> pieces;
  bool writes = false;                                // this processor writes its box (the first replica)
  MPI_Comm comm = MPI_COMM_NULL;                      // the mesh's communicator
  meshtensor::detail::communicator* mesh_communicator = nullptr;  // and the object (the watchdog's)
  // Calls its argument with the local slice's bytes (row-major) in host memory: the slice itself
  // where the host can read it, else a host copy.
  std::function<void(const std::function<void(const char*)>&)> with_host_bytes;
  bool host_resident = false;  // with_host_bytes passes the slice itself, valid while the tensor lives
  std::function<void(const char*)> copy_in;           // host bytes to the local slice; empty if const
  std::int64_t local_elements() const {
    std::int64_t n = 1;
    for (auto e : extent) n *= e;
    return n;
  }
  std::int64_t global_bytes() const {
    std::int64_t n = elem_size;
    for (auto e : shape) n *= e;
    return n;
  }
};

// Whether `file` is `ours` with runs of consecutive extents merged (each file extent the product
// of the next run of ours, every extent of ours used once).
inline bool merges_of(const std::vector<std::int64_t>& file, const std::vector<std::int64_t>& ours) {
  std::size_t i = 0;
  for (const std::int64_t want : file) {
    std::int64_t product = 1;
    const std::size_t run_start = i;
    while (i < ours.size() && (i == run_start || product < want)) product *= ours[i++];
    if (product != want) return false;
  }
  while (i < ours.size() && ours[i] == 1) ++i;  // trailing dims of extent 1 merge into the last
  return i == ours.size();
}

}  // namespace detail

// Named tensors to save or load: references to the caller's tensors (load writes into them).
// Every tensor must live on the same mesh (the same processes, in the same order).
class tensor_set {
 public:
  // Adds t under name. A const tensor can be saved but not loaded into. Names are unique and
  // must not be "__metadata__" (shape_error otherwise, on every rank alike).
  template <class T>
    requires Tensor<T>
  tensor_set& add(std::string name, T& t) {
    using TT = std::remove_const_t<T>;
    using V = typename TT::value_type;
    if (name.empty() || name == "__metadata__")
      throw shape_error(detail::cat("tensor_set::add: '", name, "' cannot name a tensor in a safetensors file"));
    for (const auto& e : entries_)
      if (e.name == name) throw shape_error(detail::cat("tensor_set::add: the name '", name, "' is already taken"));
    detail::entry e;
    e.name = std::move(name);
    e.dtype = detail::dtype_of<V>();
    e.elem_size = static_cast<std::int64_t>(sizeof(V));
    const auto names = TT::dim_names();
    e.dims.assign(names.begin(), names.end());
    e.shape.assign(t.extents().begin(), t.extents().end());
    e.extent.assign(t.local_extents().begin(), t.local_extents().end());
    auto& comm = t.mesh().communicator();
    for (const auto& pc : t.placement().pieces_at(comm.coords()))
      e.pieces.push_back({{pc.held.offset.begin(), pc.held.offset.end()},
                          {pc.held.extent.begin(), pc.held.extent.end()},
                          {pc.frame.offset.begin(), pc.frame.offset.end()}});
    e.comm = comm.cart();
    e.mesh_communicator = &comm;
    // The first replica writes: coordinate 0 on every axis that splits none of t's dims.
    unsigned used = 0;
    for (const auto& s : TT::splits) used |= s.mask();
    e.writes = true;
    for (std::size_t a = 0; a < comm.coords().size(); ++a)
      if (!(used & (1u << a)) && comm.coords()[a] != 0) e.writes = false;
    auto view = t.view();
    [[maybe_unused]] const std::size_t bytes = static_cast<std::size_t>(t.local_size()) * sizeof(V);
    e.host_resident = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename TT::memory_space>::accessible;
    bind_host_read<typename TT::execution_space>(e, view);
    if constexpr (!std::is_const_v<T>) bind_host_write<typename TT::execution_space>(e, view, bytes);
    entries_.push_back(std::move(e));
    return *this;
  }

  // Files record tensor `name` with runs of its consecutive dims merged into file_shape (Hugging
  // Face's [heads x d_kv, d_model] for a [kv_heads, group, d_kv, d_model] tensor): the row-major
  // bytes are the same. shape_error naming the tensor and both shapes where file_shape is not
  // such a merge, or no tensor has the name.
  tensor_set& merge_dims_in_files(const std::string& name, const std::vector<std::int64_t>& file_shape) {
    for (auto& e : entries_)
      if (e.name == name) {
        if (!detail::merges_of(file_shape, e.shape))
          throw shape_error(detail::cat("tensor_set::merge_dims_in_files: '", name, "' of shape ",
                                        detail::shape_text(e.shape), " cannot be written as ",
                                        detail::shape_text(file_shape), " (not its consecutive dims merged)"));
        e.file_shape = file_shape;
        return *this;
      }
    throw shape_error(detail::cat("tensor_set::merge_dims_in_files: no tensor '", name, "' in the set"));
  }

  const std::vector<detail::entry>& entries() const { return entries_; }
  // The entries of these names, in this set's order (the part of a set one file holds).
  tensor_set only(const std::vector<std::string>& names) const {
    tensor_set out;
    for (const auto& e : entries_)
      if (std::find(names.begin(), names.end(), e.name) != names.end()) out.entries_.push_back(e);
    return out;
  }
  bool empty() const { return entries_.empty(); }
  std::size_t size() const { return entries_.size(); }
  // The communicator the set's tensors live on.
  MPI_Comm comm() const {
    if (entries_.empty()) throw io_error("tensor_set: the set is empty; add a tensor first");
    return entries_.front().comm;
  }
  // The mesh's communicator object of the set's tensors (its watchdog, agreements).
  meshtensor::detail::communicator& mesh_communicator() const {
    if (entries_.empty()) throw io_error("tensor_set: the set is empty; add a tensor first");
    return *entries_.front().mesh_communicator;
  }
  // Bytes of every tensor's global array.
  std::int64_t global_bytes() const {
    std::int64_t n = 0;
    for (const auto& e : entries_) n += e.global_bytes();
    return n;
  }

 private:
  // The entry's host access to a slice, per View type rather than per tensor type: the tensors of
  // every layout and dims that share a View share these std::functions' code (compile time).
  template <class Exec, class View>
  static void bind_host_read(detail::entry& e, const View& view) {
    e.with_host_bytes = [view](const std::function<void(const char*)>& use) {
      auto host = meshtensor::detail::host_copy<Exec>(view);  // view itself on the host
      use(reinterpret_cast<const char*>(host.data()));
    };
  }
  template <class Exec, class View>
  static void bind_host_write(detail::entry& e, const View& view, std::size_t bytes) {
    e.copy_in = [view, bytes](const char* src) {
      kernels::fence(Exec{});  // kernels that use view, before the host writes it
      auto host = kernels::host_mirror(view);
      if (bytes) std::memcpy(host.data(), src, bytes);
      kernels::deep_copy(view, host);
    };
  }

  std::vector<detail::entry> entries_;
};

}  // namespace meshtensor::io
