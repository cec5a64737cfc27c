#pragma once
// Tensors written as NumPy .npy files (--dump: tools/lm/torch_reference.py reads them).
#include <fmt/core.h>

#include <cstdint>
#include <fstream>
#include <meshtensor/meshtensor.hpp>
#include <string>
#include <vector>

namespace mt = meshtensor;

// A float32 array in NumPy's .npy format (version 1.0, little-endian, C order).
inline void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<std::int64_t>& shape) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (auto e : shape) header += std::to_string(e) + ", ";
  header += "), }";
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw mt::io_error(fmt::format("cannot write '{}'", path));
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const unsigned char le[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  out.write(reinterpret_cast<const char*>(le), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) throw mt::io_error(fmt::format("cannot write '{}'", path));
}

// Gathers t to rank 0, which writes it to path. Collective.
template <class T>
void dump_tensor(const T& t, const std::string& path) {
  const auto full = mt::gather(t);
  if (t.mesh().rank() != 0) return;
  const auto ext = t.extents();
  write_npy(path, full, std::vector<std::int64_t>(ext.begin(), ext.end()));
}
