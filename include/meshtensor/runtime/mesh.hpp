#pragma once
// mesh<Axes...>, the running mesh: axis names at compile time (layout/mesh_axes.hpp, where layouts
// see the type without MPI), sizes, processes and communicators at run time.
#include <mpi.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "../geometry/mesh_shape.hpp"
#include "../layout/mesh_axes.hpp"
#include "../names/names.hpp"
#include "communicator.hpp"
#include "environment.hpp"

namespace meshtensor {

namespace diagnostic {
template <class Axis>
struct mesh_repeats_axis {
  static_assert(sizeof(Axis) == 0,
                "meshtensor: a mesh names an axis twice; give each mesh axis its own name");
};
}  // namespace diagnostic

namespace detail {
struct adopt_communicator_t {
  explicit adopt_communicator_t() = default;
};
}  // namespace detail

template <Axis... As>
class mesh {
 public:
  using axes = type_list<As...>;
  static constexpr std::size_t ndims = sizeof...(As);

  // An unattached mesh (no processes); tensors built on it are placeholders.
  mesh() = default;
  // Sizes given in axis order; throws mesh_error (on every rank) when their product is not the
  // number of processes.
  mesh(const environment& env, std::array<int, ndims> sizes) : mesh(env.world(), sizes) {}
  // Sizes factored from the number of processes, as evenly as MPI_Dims_create can.
  explicit mesh(const environment& env) : mesh(env.world(), factor(env.world())) {}
  mesh(MPI_Comm comm, std::array<int, ndims> sizes)
      : comm_(std::make_shared<detail::communicator>(
            comm, std::vector<std::string>{std::string(As::name())...},
            std::vector<int>(sizes.begin(), sizes.end()))) {
    check_distinct();
  }

  // The mesh behind a communicator that one of this mesh type made (the tape keeps gradients with
  // the communicator alone and rebuilds their tensors from it: autodiff/tape.hpp).
  mesh(detail::adopt_communicator_t, const std::shared_ptr<detail::communicator>& c) : comm_(c) {}

  // A planned mesh of these sizes (docs/plan-mode.md): no processes behind it; this process stands for
  // the processor at `coords` (the first by default, which holds the largest part of every uneven
  // split). While it (or a tensor on it) exists, every op runs as a plan: tensors carry shapes and
  // placement and no data, kernels are skipped, and collectives are counted as a real run on that
  // processor counts them (counters()), without being sent. plan_report() reads the rest.
  static mesh planned(std::array<int, ndims> sizes, std::array<int, ndims> coords = {}) {
    mesh m;
    m.comm_ = std::make_shared<detail::communicator>(std::vector<std::string>{std::string(As::name())...},
                                                     std::vector<int>(sizes.begin(), sizes.end()),
                                                     std::vector<int>(coords.begin(), coords.end()));
    check_distinct();
    return m;
  }
  bool is_planned() const { return comm_ && comm_->planned(); }

  template <Axis A>
  int size() const {
    return comm_->sizes()[index<A>()];
  }
  template <Axis A>
  int coord() const {
    return comm_->coords()[index<A>()];
  }
  std::array<int, ndims> sizes() const {
    std::array<int, ndims> s{};
    for (std::size_t i = 0; i < ndims; ++i) s[i] = comm_->sizes()[i];
    return s;
  }
  int nprocs() const { return comm_->nprocs(); }
  // The axis names and sizes alone: what placements, describe() and plans need.
  const mesh_shape& shape() const { return comm_->shape(); }
  // A shape of this mesh's axes with the given sizes and no processes behind it (for example a
  // [16 x 32] mesh described or planned in one process).
  static mesh_shape shape_of(std::array<int, ndims> sizes) {
    return mesh_shape({std::string(As::name())...}, std::vector<int>(sizes.begin(), sizes.end()));
  }
  int rank() const { return comm_->rank(); }

  // Bit mask of the given axes, the key of sub-communicators and counters.
  template <Axis... Sub>
  static constexpr unsigned mask() {
    return ((1u << index<Sub>()) | ... | 0u);
  }
  template <Axis... Sub>
  MPI_Comm comm_over() const {
    return comm_->over(mask<Sub...>());
  }

  const comm_counters& counters() const { return comm_->counters(); }
  void reset_counters() const { comm_->reset_counters(); }
  std::string axes_string(axis_set m) const { return comm_->axes_string(m); }

  detail::communicator& communicator() const { return *comm_; }
  const std::shared_ptr<detail::communicator>& shared_communicator() const { return comm_; }

  template <Axis A>
  static constexpr std::size_t index() {
    static_assert(contains_v<A, axes>, "meshtensor: this axis is not an axis of the mesh");
    return index_of_v<A, axes>;
  }

 private:
  static constexpr void check_distinct() {
    if constexpr (!distinct_v<axes>) {
      (repeated_check<As>(), ...);
    }
  }
  template <class A>
  static constexpr void repeated_check() {
    if constexpr (count_v<A, axes> > 1) (void)sizeof(diagnostic::mesh_repeats_axis<A>);
  }
  static std::array<int, ndims> factor(MPI_Comm comm) {
    int world = 1;
    MPI_Comm_size(comm, &world);
    std::array<int, ndims> dims{};
    if constexpr (ndims > 0) MPI_Dims_create(world, static_cast<int>(ndims), dims.data());
    return dims;
  }
  std::shared_ptr<detail::communicator> comm_;
};

}  // namespace meshtensor
