#pragma once
// Reading gzip'd idx files (the MNIST / Fashion-MNIST format) with zlib. Rank 0 reads; the bytes,
// or the error, are broadcast, so every rank returns the same data or throws the same io_error.
// load_fashion_mnist reads one split of Fashion-MNIST (the examples fashion_mnist and segmentation).
#include <mpi.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fmt/core.h>
#include <meshtensor/error.hpp>
#include <string>
#include <utility>
#include <vector>

namespace idx {

struct array {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

namespace file_reading {
inline std::uint32_t big_endian(const unsigned char* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
}

// The whole decompressed content of a gzip file. Throws io_error naming the file and the problem.
inline std::vector<unsigned char> read_gz(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw meshtensor::io_error(fmt::format("cannot open '{}': {}", path,
                                           errno ? std::strerror(errno) : "zlib could not allocate"));
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const std::string msg = gzerror(f, &code);
      gzclose(f);
      throw meshtensor::io_error(fmt::format("'{}' is not a readable gzip file: {}", path, msg));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  const int rc = gzclose(f);
  if (rc != Z_OK)
    throw meshtensor::io_error(fmt::format("'{}' is not a valid gzip file ({})", path,
                                           rc == Z_BUF_ERROR ? "truncated" : "corrupt"));
  return out;
}

// Parses an idx file of unsigned bytes with `rank` dims.
inline array parse(const std::string& path, const std::vector<unsigned char>& raw, int rank) {
  if (raw.size() < 4)
    throw meshtensor::io_error(fmt::format("'{}' is not an idx file: {} bytes, too short for a header", path,
                                           raw.size()));
  const std::uint32_t magic = big_endian(raw.data()), want = 0x0800u + static_cast<std::uint32_t>(rank);
  if (magic != want)
    throw meshtensor::io_error(fmt::format("'{}' is not an idx file of unsigned bytes with {} dims: magic number 0x{:x}, "
                                           "expected 0x{:x}", path, rank, magic, want));
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (raw.size() < header)
    throw meshtensor::io_error(fmt::format("'{}' is truncated inside its header", path));
  array a;
  std::size_t n = 1;
  for (int i = 0; i < rank; ++i) {
    a.dims.push_back(big_endian(raw.data() + 4 + 4 * i));
    n *= static_cast<std::size_t>(a.dims.back());
  }
  if (raw.size() - header != n)
    throw meshtensor::io_error(fmt::format("'{}' holds {} bytes of data, but its header announces {}", path,
                                           raw.size() - header, n));
  a.data.assign(raw.begin() + static_cast<std::ptrdiff_t>(header), raw.end());
  return a;
}
}  // namespace file_reading

// Every rank gets the same array or the same io_error.
inline array read(const std::string& path, int rank, MPI_Comm comm) {
  int me = 0;
  MPI_Comm_rank(comm, &me);
  array a;
  std::string err;
  if (me == 0) {
    try {
      a = file_reading::parse(path, file_reading::read_gz(path), rank);
    } catch (const meshtensor::io_error& e) {
      err = e.what();
    }
  }
  std::int64_t sizes[2] = {static_cast<std::int64_t>(err.size()), static_cast<std::int64_t>(a.data.size())};
  MPI_Bcast(sizes, 2, MPI_INT64_T, 0, comm);
  if (sizes[0] > 0) {
    err.resize(static_cast<std::size_t>(sizes[0]));
    MPI_Bcast(err.data(), static_cast<int>(sizes[0]), MPI_CHAR, 0, comm);
    throw meshtensor::io_error(err);
  }
  a.dims.resize(static_cast<std::size_t>(rank));
  MPI_Bcast(a.dims.data(), rank, MPI_INT64_T, 0, comm);
  a.data.resize(static_cast<std::size_t>(sizes[1]));
  for (std::int64_t at = 0; at < sizes[1]; at += 1 << 30)
    MPI_Bcast(a.data.data() + at, static_cast<int>(std::min<std::int64_t>(1 << 30, sizes[1] - at)), MPI_UINT8_T, 0, comm);
  return a;
}

// One split of Fashion-MNIST ("train" or "t10k"): n images of 28 x 28 bytes and their labels 0..9.
struct dataset {
  std::int64_t n = 0;
  std::vector<std::uint8_t> images;  // n x 784
  std::vector<std::uint8_t> labels;  // n
};

inline dataset load_fashion_mnist(const std::string& dir, const std::string& split, MPI_Comm comm) {
  const std::string ip = dir + "/" + split + "-images-idx3-ubyte.gz", lp = dir + "/" + split + "-labels-idx1-ubyte.gz";
  auto im = read(ip, 3, comm);
  auto lb = read(lp, 1, comm);
  if (im.dims[1] != 28 || im.dims[2] != 28)
    throw meshtensor::io_error(fmt::format("'{}' holds images of {}x{} pixels, expected 28x28", ip, im.dims[1], im.dims[2]));
  if (im.dims[0] != lb.dims[0])
    throw meshtensor::io_error(fmt::format("'{}' holds {} images but '{}' holds {} labels", ip, im.dims[0], lp, lb.dims[0]));
  for (auto v : lb.data)
    if (v > 9) throw meshtensor::io_error(fmt::format("'{}' holds the label {}; Fashion-MNIST labels are 0..9", lp, int(v)));
  return {im.dims[0], std::move(im.data), std::move(lb.data)};
}

}  // namespace idx
