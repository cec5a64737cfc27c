#pragma once
// describe(t): a readable table of which processor holds which slice. describe<T>(shape, extents)
// gives the same table for a mesh given only by its shape (a [16 x 32] mesh in a one-process
// program): it needs no processes and no data.
#include <iomanip>
#include <sstream>
#include <string>

#include "tensor.hpp"

namespace meshtensor {

template <Tensor TT>
std::string describe(const mesh_shape& shape, const typename TT::extents_type& extents) {
  const meshtensor::placement<TT::rank> p(TT::splits, shape, extents);
  const auto names = TT::dim_names();
  std::ostringstream out;
  out << TT::type_name() << " [";
  for (std::size_t i = 0; i < TT::rank; ++i) out << (i ? ", " : "") << names[i] << '=' << extents[i];
  out << "] on mesh " << shape.to_string() << "\n  layout:";
  for (std::size_t i = 0; i < TT::rank; ++i) {
    out << (i ? "," : "") << ' ' << names[i] << " -> ";
    if (TT::splits[i].count == 0) {
      out << "replicated";
      continue;
    }
    out << split_string(TT::splits[i], shape);
    if (p.max_part_extent(i) != p.min_part_extent(i)) out << " (uneven: " << p.max_part_extent(i) << " or " << p.min_part_extent(i) << " per part)";
  }
  out << "\n  " << std::setw(5) << "rank";
  for (const auto& a : shape.axis_names()) out << ' ' << std::setw(5) << a;
  out << "  |";
  for (const auto& n : names) out << ' ' << std::setw(18) << n;
  out << '\n';
  for (std::int64_t r = 0; r < shape.nprocs(); ++r) {
    const auto coords = shape.coords_of(r);
    out << "  " << std::setw(5) << r;
    for (int c : coords) out << ' ' << std::setw(5) << c;
    out << "  |";
    for (std::size_t i = 0; i < TT::rank; ++i) {
      // A zigzag dim's two ranges, in the order the processor stores them.
      const auto ranges = p.ranges(i, p.part_at(i, coords));
      std::ostringstream range;
      range << '[' << ranges[0].offset[0] << ", " << ranges[0].offset[0] + ranges[0].extent[0] << ')';
      if (p.zigzag(i))
        range << "+[" << ranges[1].offset[0] << ", " << ranges[1].offset[0] + ranges[1].extent[0] << ')';
      out << ' ' << std::setw(18) << range.str();
    }
    out << '\n';
  }
  return out.str();
}

template <Tensor TT>
std::string describe(const TT& t) {
  return describe<TT>(t.mesh().shape(), t.extents());
}

}  // namespace meshtensor
