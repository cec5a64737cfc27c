#pragma once
// Run-time errors. Each message names the dims, extents, axes and sizes involved. Every check that
// raises one runs on data all ranks share (types, extents, mesh sizes), so all ranks throw alike.
#include <sstream>
#include <stdexcept>
#include <string>

namespace meshtensor {

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The mesh does not fit the processes (world size, axis sizes).
struct mesh_error : error {
  using error::error;
};
// Extents disagree or do not divide.
struct shape_error : error {
  using error::error;
};
// A layout cannot place a tensor at run time.
struct layout_error : error {
  using error::error;
};
// Reading or writing files.
struct io_error : error {
  using error::error;
};

namespace detail {
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace meshtensor
