#pragma once
// basic_tensor<T, Layout, ExecSpace, Dims...>: a distributed tensor. Global extents are run-time
// values; each processor holds its slice as a flat row-major Kokkos View in ExecSpace's memory.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "../error.hpp"
#include "../layout/layout.hpp"
#include "../runtime/mesh.hpp"
#include "../element/bf16.hpp"
#include "../kernels/pool.hpp"
#include "../kernels/launch.hpp"

namespace meshtensor {

namespace detail {
struct tape_node;
template <class T, std::size_t R, class ExecSpace>
struct grad_node;

// Checks the extents and gives this processor's local extents and offsets, from the placement
// algebra. Not a template on the tensor type: the same code serves every tensor (compile time);
// errors name the tensor's dims.
template <std::size_t R>
void place_slice(const communicator& comm, const std::array<dim_split, R>& splits, const std::array<std::int64_t, R>& extents,
                 const std::string_view* names, std::string (*type_name)(), std::array<std::int64_t, R>& local_extents,
                 std::array<std::int64_t, R>& offsets) {
  for (std::size_t i = 0; i != R; ++i)
    if (extents[i] < 0)
      throw shape_error(cat(type_name(), ": dim '", names[i], "' has negative extent ", extents[i]));
  const placement<R> p(splits, comm.shape(), extents);
  local_extents = p.local_extents(comm.coords());
  // A zigzag dim's slice starts twice (placement's pieces); offsets() is refused for such tensors,
  // and the first piece's start kept here only so that the storage is the same for every layout.
  const auto pieces = p.pieces_at(comm.coords());
  offsets = pieces.empty() ? std::array<std::int64_t, R>{} : pieces.front().held.offset;
}

// "tensor<i, j>" and "[i=4, j=8]", for error messages: not templates, so that they are compiled
// once, not once per tensor type.
inline std::string tensor_type_name(std::span<const std::string_view> names) {
  std::string s = "tensor<";
  for (std::size_t i = 0; i < names.size(); ++i) s += detail::cat(i ? ", " : "", names[i]);
  return s + ">";
}
inline std::string tensor_shape_string(std::span<const std::string_view> names, std::span<const std::int64_t> extents) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size(); ++i) s += detail::cat(i ? ", " : "", names[i], "=", extents[i]);
  return s + "]";
}

// What a tensor holds besides its mesh, and the work of making it: they depend on the element
// type, rank and space only, so they are compiled once for all the tensor types that share them,
// not once per layout and dim list (compile time). basic_tensor is a typed shell around it.
template <class T, std::size_t R, class ExecSpace>
struct tensor_storage;

// A way to make a tensor's slice again from a smaller one that it keeps (relayout_regathered's
// source: the slices gathered), so that a product's gradient rule keeps that instead of the slice
// (autodiff/saved_operand.hpp). Made once for all the rules that keep it: `users` counts them, and
// the made slice is cached until the last of them has asked for it.
template <class T, std::size_t R, class ExecSpace>
struct slice_source {
  int users = 0;
  std::shared_ptr<tensor_storage<T, R, ExecSpace>> made;
  virtual ~slice_source() = default;
  virtual tensor_storage<T, R, ExecSpace> make() const = 0;
};

template <class T, std::size_t R, class ExecSpace>
struct tensor_storage {
  using memory_space = typename ExecSpace::memory_space;
  using view_type = Kokkos::View<T*, memory_space>;
  using extents_type = std::array<std::int64_t, R>;
  static constexpr std::size_t rank = R;

  extents_type extents{}, local_extents{}, offsets{};
  view_type data{};
  std::shared_ptr<tape_node> node{};  // a grad_node of the tensor's (T, R, ExecSpace), when it tracks gradients
  std::shared_ptr<void> planned_bytes{};
  // Where the slice can be made again from (slice_source), or none: most tensors have none.
  std::shared_ptr<slice_source<T, R, ExecSpace>> source{};

  tensor_storage() = default;
  // Checks the extents and places this processor's slice, unallocated; names and type_name are the
  // tensor's, for its errors.
  tensor_storage(const communicator& comm, bool mesh_planned, const std::array<dim_split, R>& splits,
                 const extents_type& e, const std::string_view* names, std::string (*type_name)())
      : extents(e) {
    // While a planned mesh exists no kernel runs (plan/ledger.hpp): a real tensor made
    // then would silently hold garbage.
    if (planning() && !mesh_planned)
      throw error(cat(type_name(), ": made on a real mesh while a planned mesh exists; while one exists every "
                                   "op is planned and no kernel runs: plan in a scope of its own, then run"));
    place_slice<R>(comm, splits, extents, names, type_name, local_extents, offsets);
  }
  // The same, with the slice allocated, zero-filled or not.
  tensor_storage(const communicator& comm, bool mesh_planned, const std::array<dim_split, R>& splits,
                 const extents_type& e, const std::string_view* names, std::string (*type_name)(), bool zero_fill)
      : tensor_storage(comm, mesh_planned, splits, e, names, type_name) {
    allocate(zero_fill);
  }
  // The same, over an existing local slice.
  tensor_storage(const communicator& comm, bool mesh_planned, const std::array<dim_split, R>& splits,
                 const extents_type& e, const std::string_view* names, std::string (*type_name)(), view_type local)
      : tensor_storage(comm, mesh_planned, splits, e, names, type_name) {
    adopt(std::move(local), names, type_name);
  }
  std::int64_t local_size() const {
    std::int64_t n = 1;
    for (auto e : local_extents) n *= e;
    return n;
  }
  // A new slice with the same extents and values, off the tape.
  tensor_storage copy() const {
    tensor_storage c;
    c.extents = extents, c.local_extents = local_extents, c.offsets = offsets;
    c.allocate(false);
    kernels::deep_copy(c.data, data);
    return c;
  }
  // Allocates the slice, zero-filled or not (for kernels that write every element).
  void allocate(bool zero_fill) {
    data = view_pool<T, memory_space>::get().allocate(static_cast<std::size_t>(local_size()));
    claim_planned();
    if (zero_fill) kernels::deep_copy(ExecSpace{}, data, T{});
  }
  // Takes an existing local slice, which must have the slice's size.
  void adopt(view_type local, const std::string_view* names, std::string (*type_name)()) {
    if (static_cast<std::int64_t>(local.extent(0)) != local_size())
      throw shape_error(cat(type_name(), tensor_shape_string({names, R}, extents), ": a local view of ",
                            local.extent(0), " elements was given for a slice of ", local_size()));
    data = std::move(local);
    claim_planned();
  }
  // Planning (plan/ledger.hpp): the slice has a fake address and no memory; the claim counts
  // its bytes while a tensor of that address is alive. Returns whether this is a planned run.
  bool claim_planned() {
    if (!planning()) return false;
    planned_bytes = plan_ledger::get().claim(data.data(), local_size() * static_cast<std::int64_t>(sizeof(T)));
    return true;
  }
};
}  // namespace detail

// Tag of the constructor that leaves the local slice unfilled.
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

namespace detail {
struct from_storage_t {
  explicit from_storage_t() = default;
};
inline constexpr from_storage_t from_storage{};
}  // namespace detail

template <class T, Layout L, class ExecSpace, Dim... Ds>
class basic_tensor {
  using checked = detail::placement_check<L, Ds...>;
  static_assert(checked::checked);

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
  using storage_type = detail::tensor_storage<T, rank, ExecSpace>;
  // A copy, not a reference to checked::splits: nvcc rejects an in-class constexpr reference member.
  static constexpr std::array<dim_split, rank> splits = checked::splits;

  // Same dims, layout and space, other element type.
  template <class U>
  using rebind = basic_tensor<U, L, ExecSpace, Ds...>;

  basic_tensor() = default;

  // Allocates a zero-filled slice. An extent need not divide by the processors its dim is split
  // over: parts follow placement's balanced-block rule (geometry/placement.hpp). Throws shape_error
  // (on every rank alike: extents and mesh sizes are the same everywhere) on a negative extent.
  // The constructors only pass the type's names and splits on: the work is the storage's, compiled
  // once per (element type, rank, space) (compile time).
  basic_tensor(const mesh_type& m, const extents_type& extents)
      : mesh_(m), st_(m.communicator(), m.is_planned(), splits, extents, dim_name_views.data(), &type_name, true) {}

  // Allocates the slice without the zero fill, for kernels that write every element of their
  // result (the fill would be a full pass over memory for nothing).
  basic_tensor(const mesh_type& m, const extents_type& extents, uninitialized_t)
      : mesh_(m), st_(m.communicator(), m.is_planned(), splits, extents, dim_name_views.data(), &type_name, false) {}

  // Wraps an existing local slice (its size must match this processor's slice).
  basic_tensor(const mesh_type& m, const extents_type& extents, view_type local)
      : mesh_(m),
        st_(m.communicator(), m.is_planned(), splits, extents, dim_name_views.data(), &type_name, std::move(local)) {}

  // A tensor over a storage the tape kept, on the mesh of its communicator (autodiff/tape.hpp).
  basic_tensor(detail::from_storage_t, const std::shared_ptr<detail::communicator>& comm, const storage_type& st)
      : mesh_(detail::adopt_communicator_t{}, comm), st_(st) {}

  const mesh_type& mesh() const { return mesh_; }
  const extents_type& extents() const { return st_.extents; }
  const extents_type& local_extents() const { return st_.local_extents; }
  // Whether a dim is cut zigzag (layout's zigzag<Dim, Axes...>): the slice is then two ranges of
  // it, and offsets() does not describe it.
  static constexpr bool has_zigzag = [] {
    for (const auto& s : splits)
      if (s.zigzag()) return true;
    return false;
  }();
  // Where this processor's slice starts, dim by dim (contiguous layouts: a zigzag dim's slice
  // starts twice; placement().pieces_at gives its pieces).
  const extents_type& offsets() const {
    static_assert(!has_zigzag,
                  "meshtensor: this op reads where the processor's slice starts along each dim, but a dim "
                  "of the tensor is cut zigzag (two ranges per processor); relayout it to split<Dim, "
                  "Axes...> for this op");
    return st_.offsets;
  }
  // Where this processor's slice of D starts. Only D must be contiguous: a kernel along one dim (a
  // row statistic over d_model, a one-hot's depth) works on a tensor cut zigzag along another.
  template <Dim D>
  std::int64_t offset() const {
    static_assert(!layout_type::template split_of<D>().zigzag(),
                  "meshtensor: this op reads where the processor's slice of a dim starts, and the tensor's "
                  "layout cuts that dim zigzag (two ranges per processor); relayout it to split<Dim, "
                  "Axes...> for this op");
    return st_.offsets[index_of<D>()];
  }
  // Extents, slice, View and tape node, untyped by layout and dims: what the tape keeps.
  const storage_type& storage() const& { return st_; }
  storage_type storage() && { return std::move(st_); }
  template <Dim D>
  std::int64_t extent() const {
    return st_.extents[index_of<D>()];
  }
  template <Dim D>
  std::int64_t local_extent() const {
    return st_.local_extents[index_of<D>()];
  }
  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : st_.extents) n *= e;
    return n;
  }
  std::int64_t local_size() const { return st_.local_size(); }
  const view_type& view() const { return st_.data; }

  template <Dim D>
  static constexpr std::size_t index_of() {
    static_assert(contains_v<D, dims>, "meshtensor: the tensor does not have this dim");
    return index_of_v<D, dims>;
  }

  // Which processor holds which box of this tensor (no communication).
  meshtensor::placement<rank> placement() const { return {splits, mesh_.shape(), st_.extents}; }
  // The slice held by the processor of this mesh rank (contiguous layouts; placement().pieces_of
  // under zigzag).
  box<rank> slice_of(int mesh_rank) const { return placement().box_of(mesh_rank); }

  static constexpr std::array<std::string_view, rank> dim_name_views{Ds::name()...};
  static std::array<std::string, rank> dim_names() { return {std::string(Ds::name())...}; }
  static std::string type_name() { return detail::tensor_type_name(dim_name_views); }
  std::string shape_string() const { return detail::tensor_shape_string(dim_name_views, st_.extents); }
  // "rows(2) x cols(2)" for dim i, or "no axis".
  std::string split_string(std::size_t i) const { return meshtensor::split_string(splits[i], mesh_.shape()); }

  // Autodiff: a tensor that requires gradients records the ops applied to it on the tape.
  basic_tensor& requires_grad();
  bool tracks_grad() const { return st_.node != nullptr; }
  // The tape's node (null when the tensor does not track gradients), and the same as the tape's
  // own pointer type; node_slot holds a grad_node<T, rank, ExecSpace> (the tape sets it).
  detail::grad_node<T, rank, ExecSpace>* node() const {
    return static_cast<detail::grad_node<T, rank, ExecSpace>*>(st_.node.get());
  }
  const std::shared_ptr<detail::tape_node>& shared_node() const { return st_.node; }
  std::shared_ptr<detail::tape_node>& node_slot() { return st_.node; }
  // The same values, off the tape.
  basic_tensor detached() const {
    basic_tensor t = *this;
    t.st_.node.reset();
    return t;
  }

 private:
  mesh_type mesh_{};
  storage_type st_{};
};

// TensorDim, not Dim: a non-dim is an error that names it and says what to change.
template <class T, Layout L, TensorDim... Ds>
using tensor = basic_tensor<T, L, Kokkos::DefaultExecutionSpace, Ds...>;

// For users who want every split even (the rule before uneven splits were allowed): throws
// shape_error naming the first dim whose extent does not divide by its parts. Same on every rank.
template <class T, class L, class E, class... Ds>
void require_even(const basic_tensor<T, L, E, Ds...>& t) {
  const auto p = t.placement();
  for (std::size_t i = 0; i < sizeof...(Ds); ++i)
    if (!p.even(i))
      throw shape_error(detail::cat(t.type_name(), t.shape_string(), ": dim '", t.dim_names()[i], "' of extent ",
                                    t.extents()[i], " is split over ", t.split_string(i), " = ", p.parts(i),
                                    " parts; ", t.extents()[i], " is not divisible by ", p.parts(i)));
}

template <class T>
inline constexpr bool is_tensor_v = false;
template <class T, class L, class E, class... Ds>
inline constexpr bool is_tensor_v<basic_tensor<T, L, E, Ds...>> = true;
template <class T>
concept Tensor = is_tensor_v<std::remove_cvref_t<T>>;

// What gradient() and the optimizers take as one parameter: a tensor, or a std::vector of tensors
// of one type (a stack of layers whose number is known only at run time).
template <class T>
inline constexpr bool is_tensor_vector_v = false;
template <Tensor T, class A>
inline constexpr bool is_tensor_vector_v<std::vector<T, A>> = true;
template <class T>
concept Parameter = Tensor<T> || is_tensor_vector_v<std::remove_cvref_t<T>>;

// f(t) for the tensor p, or for each tensor of the vector p. Public: code that names, saves or
// initializes parameters walks them in the order gradient() and the optimizers do.
template <Parameter P, class F>
void for_each_tensor(P& p, F&& f) {
  if constexpr (Tensor<P>) f(p);
  else
    for (auto& t : p) f(t);
}

namespace detail {
template <class P>
std::size_t tensor_count(const P& p) {
  if constexpr (Tensor<P>) return 1;
  else return p.size();
}
}  // namespace detail

// The bytes of this processor's slices of the params (tensors or vectors of them).
template <Parameter... Ps>
std::int64_t local_bytes(const Ps&... params) {
  std::int64_t n = 0;
  const auto add = [&](const auto& t) {
    n += t.local_size() * static_cast<std::int64_t>(sizeof(typename std::remove_cvref_t<decltype(t)>::value_type));
  };
  (for_each_tensor(params, add), ...);
  return n;
}
template <Parameter... Ps>
std::int64_t local_bytes(const std::tuple<Ps&...>& params) {
  return std::apply([](const auto&... p) { return local_bytes(p...); }, params);
}

}  // namespace meshtensor
