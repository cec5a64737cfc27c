#pragma once
// describe(t): a readable table of which processor holds which slice.
#include <iomanip>
#include <sstream>
#include <string>

#include "tensor.hpp"

namespace meshtensor {

template <Tensor TT>
std::string describe(const TT& t) {
  const auto& comm = t.mesh().communicator();
  const auto names = TT::dim_names();
  std::ostringstream out;
  out << TT::type_name() << ' ' << t.shape_string() << " on mesh [";
  for (std::size_t a = 0; a < comm.sizes().size(); ++a)
    out << (a ? ", " : "") << comm.axis_names()[a] << '=' << comm.sizes()[a];
  out << "]\n  layout:";
  for (std::size_t i = 0; i < TT::rank; ++i)
    out << (i ? "," : "") << ' ' << names[i] << " -> " << (TT::splits[i].count ? t.split_string(i) : "replicated");
  out << "\n  " << std::setw(5) << "rank";
  for (const auto& a : comm.axis_names()) out << ' ' << std::setw(5) << a;
  out << "  |";
  for (const auto& n : names) out << ' ' << std::setw(18) << n;
  out << '\n';
  for (int r = 0; r < comm.nprocs(); ++r) {
    const auto coords = comm.coords_of(r);
    const auto b = t.slice_of(r);
    out << "  " << std::setw(5) << r;
    for (int c : coords) out << ' ' << std::setw(5) << c;
    out << "  |";
    for (std::size_t i = 0; i < TT::rank; ++i) {
      std::ostringstream range;
      range << '[' << b.offset[i] << ", " << b.offset[i] + b.extent[i] << ')';
      out << ' ' << std::setw(18) << range.str();
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace meshtensor
