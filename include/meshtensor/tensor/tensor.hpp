#pragma once
// basic_tensor<T, Layout, ExecSpace, Dims...>: a distributed tensor. Global extents are run-time
// values; each processor holds its slice as a flat row-major Kokkos View in ExecSpace's memory.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/layout.hpp"
#include "pool.hpp"

namespace meshtensor {

namespace detail {
struct tape_node;
template <class Tensor>
struct typed_node;

// Number of parts a dim is cut into, and which part a processor with these coords holds
// (row-major over the rule's axes, in the order the rule names them).
inline std::int64_t parts_of(const dim_split& s, const std::vector<int>& sizes) {
  std::int64_t n = 1;
  for (int i = 0; i < s.count; ++i) n *= sizes[s.axes[i]];
  return n;
}
inline std::int64_t part_index(const dim_split& s, const std::vector<int>& sizes, const std::vector<int>& coords) {
  std::int64_t p = 0;
  for (int i = 0; i < s.count; ++i) p = p * sizes[s.axes[i]] + coords[s.axes[i]];
  return p;
}

// Checks extents against the splits and gives this processor's local extents and offsets. Not a
// template: the same code serves every tensor type (compile time), errors name the tensor's dims.
inline void place_slice(const communicator& comm, std::size_t rank, const dim_split* splits,
                        const std::int64_t* extents, const std::string_view* names, std::string (*type_name)(),
                        std::int64_t* local_extents, std::int64_t* offsets) {
  for (std::size_t i = 0; i < rank; ++i) {
    if (extents[i] < 0)
      throw shape_error(cat(type_name(), ": dim '", names[i], "' has negative extent ", extents[i]));
    const auto parts = parts_of(splits[i], comm.sizes());
    if (extents[i] % parts != 0) {
      std::string axes;
      for (int k = 0; k < splits[i].count; ++k) {
        const int a = splits[i].axes[k];
        axes += cat(k ? " x " : "", comm.axis_names()[a], "(", comm.sizes()[a], ")");
      }
      throw shape_error(cat(type_name(), ": dim '", names[i], "' of extent ", extents[i], " is split over ", axes,
                            " = ", parts, " parts; ", extents[i], " is not divisible by ", parts,
                            " (choose a multiple of ", parts, ")"));
    }
  }
  const auto& coords = comm.coords();
  for (std::size_t i = 0; i < rank; ++i) {
    local_extents[i] = extents[i] / parts_of(splits[i], comm.sizes());
    offsets[i] = part_index(splits[i], comm.sizes(), coords) * local_extents[i];
  }
}

template <std::size_t R>
struct box {
  std::array<std::int64_t, R> offset{};
  std::array<std::int64_t, R> extent{};
  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : extent) n *= e;
    return n;
  }
};
}  // namespace detail

// Tag of the constructor that leaves the local slice unfilled.
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

template <class T, Layout L, class ExecSpace, Dim... Ds>
class basic_tensor {
  using placement = detail::placement<L, Ds...>;
  static_assert(placement::checked);

 public:
  using value_type = T;
  using layout_type = L;
  using mesh_type = typename L::mesh_type;
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using dims = type_list<Ds...>;
  using view_type = Kokkos::View<T*, memory_space>;
  static constexpr std::size_t rank = sizeof...(Ds);
  using extents_type = std::array<std::int64_t, rank>;
  static constexpr const std::array<detail::dim_split, rank>& splits = placement::splits;

  // Same dims, layout and space, other element type.
  template <class U>
  using rebind = basic_tensor<U, L, ExecSpace, Ds...>;

  basic_tensor() = default;

  // Allocates a zero-filled slice. Throws shape_error (on every rank alike: extents and mesh sizes
  // are the same everywhere) when an extent does not divide by the processors it is split over.
  basic_tensor(const mesh_type& m, const extents_type& extents) : basic_tensor(m, extents, no_alloc{}) {
    data_ = detail::view_pool<T, memory_space>::get().allocate(static_cast<std::size_t>(local_size()));
    Kokkos::deep_copy(execution_space{}, data_, T{});
    execution_space{}.fence();
  }

  // Allocates the slice without the zero fill, for kernels that write every element of their
  // result (the fill would be a full pass over memory for nothing).
  basic_tensor(const mesh_type& m, const extents_type& extents, uninitialized_t) : basic_tensor(m, extents, no_alloc{}) {
    data_ = detail::view_pool<T, memory_space>::get().allocate(static_cast<std::size_t>(local_size()));
  }

  // Wraps an existing local slice (its size must match this processor's slice).
  basic_tensor(const mesh_type& m, const extents_type& extents, view_type local)
      : basic_tensor(m, extents, no_alloc{}) {
    if (static_cast<std::int64_t>(local.extent(0)) != local_size())
      throw shape_error(detail::cat(type_name(), shape_string(), ": a local view of ", local.extent(0),
                                    " elements was given for a slice of ", local_size()));
    data_ = std::move(local);
  }

  const mesh_type& mesh() const { return mesh_; }
  const extents_type& extents() const { return extents_; }
  const extents_type& local_extents() const { return local_extents_; }
  const extents_type& offsets() const { return offsets_; }
  template <Dim D>
  std::int64_t extent() const {
    return extents_[index_of<D>()];
  }
  template <Dim D>
  std::int64_t local_extent() const {
    return local_extents_[index_of<D>()];
  }
  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : extents_) n *= e;
    return n;
  }
  std::int64_t local_size() const {
    std::int64_t n = 1;
    for (auto e : local_extents_) n *= e;
    return n;
  }
  const view_type& view() const { return data_; }

  template <Dim D>
  static constexpr std::size_t index_of() {
    static_assert(contains_v<D, dims>, "meshtensor: the tensor does not have this dim");
    return index_of_v<D, dims>;
  }

  // The slice held by the processor of this mesh rank.
  detail::box<rank> slice_of(int mesh_rank) const {
    const auto& comm = mesh_.communicator();
    const auto coords = comm.coords_of(mesh_rank);
    detail::box<rank> b;
    for (std::size_t i = 0; i < rank; ++i) {
      const auto parts = detail::parts_of(splits[i], comm.sizes());
      b.extent[i] = extents_[i] / parts;
      b.offset[i] = detail::part_index(splits[i], comm.sizes(), coords) * b.extent[i];
    }
    return b;
  }

  static std::array<std::string, rank> dim_names() { return {std::string(Ds::name())...}; }
  static std::string type_name() {
    std::string s = "tensor<";
    std::size_t i = 0;
    ((s += detail::cat(i++ ? ", " : "", Ds::name())), ...);
    return s + ">";
  }
  std::string shape_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < rank; ++i) s += detail::cat(i ? ", " : "", dim_names()[i], "=", extents_[i]);
    return s + "]";
  }
  // "rows(2) x cols(2)" for dim i, or "no axis".
  std::string split_string(std::size_t i) const {
    const auto& comm = mesh_.communicator();
    std::string s;
    for (int k = 0; k < splits[i].count; ++k) {
      const int a = splits[i].axes[k];
      s += detail::cat(k ? " x " : "", comm.axis_names()[a], "(", comm.sizes()[a], ")");
    }
    return s.empty() ? "no axis" : s;
  }

  // Autodiff: a tensor that requires gradients records the ops applied to it on the tape.
  basic_tensor& requires_grad();
  bool tracks_grad() const { return node_ != nullptr; }
  const std::shared_ptr<detail::typed_node<basic_tensor>>& node() const { return node_; }
  void set_node(std::shared_ptr<detail::typed_node<basic_tensor>> n) { node_ = std::move(n); }
  // The same values, off the tape.
  basic_tensor detached() const {
    basic_tensor t = *this;
    t.node_.reset();
    return t;
  }

 private:
  struct no_alloc {};
  static constexpr std::array<std::string_view, rank> dim_name_views{Ds::name()...};
  basic_tensor(const mesh_type& m, const extents_type& extents, no_alloc) : mesh_(m), extents_(extents) {
    detail::place_slice(m.communicator(), rank, splits.data(), extents_.data(), dim_name_views.data(), &type_name,
                        local_extents_.data(), offsets_.data());
  }

  mesh_type mesh_{};
  extents_type extents_{};
  extents_type local_extents_{};
  extents_type offsets_{};
  view_type data_{};
  std::shared_ptr<detail::typed_node<basic_tensor>> node_{};
};

template <class T, Layout L, Dim... Ds>
using tensor = basic_tensor<T, L, Kokkos::DefaultExecutionSpace, Ds...>;

template <class T>
inline constexpr bool is_tensor_v = false;
template <class T, class L, class E, class... Ds>
inline constexpr bool is_tensor_v<basic_tensor<T, L, E, Ds...>> = true;
template <class T>
concept Tensor = is_tensor_v<std::remove_cvref_t<T>>;

}  // namespace meshtensor
