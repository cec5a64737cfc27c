#pragma once
// The mesh as a type: mesh<Axes...> and its axis names, in order. Layouts, their rules and checks,
// placements and the candidate layouts read only this, so layout/ holds values and no MPI (unit
// tests build layouts of a mesh no process runs); the running mesh (sizes, processes,
// communicators) is the template's definition in runtime/mesh.hpp.
#include "../names/names.hpp"

namespace meshtensor {

template <Axis... As>
class mesh;

template <class T>
inline constexpr bool is_mesh_v = false;
template <class... As>
inline constexpr bool is_mesh_v<mesh<As...>> = true;

template <class T>
concept Mesh = is_mesh_v<T>;

namespace detail {
template <class M>
struct mesh_axes;
template <class... As>
struct mesh_axes<mesh<As...>> {
  using type = type_list<As...>;
};
}  // namespace detail

// The axes of a mesh type, whether or not runtime/mesh.hpp (MPI) is included.
template <class M>
using mesh_axes_t = typename detail::mesh_axes<M>::type;

}  // namespace meshtensor
