// libFuzzer target for the safetensors reader (issue 33: bad checkpoints from elsewhere). An input
// is a whole file: the 8-byte header length, the header's JSON, the data. Each goes through what
// io::load and io::inspect do to a file's bytes, without MPI-IO:
//   header_length and parse_header (the checks every rank makes on the header), info_of (dtypes,
//   shapes, metadata, meshtensor.dims), then, for every tensor the header holds, a box of it read
//   the way load reads a processor's box: for_each_run's runs at the tensor's data_offsets, copied
//   out of the input (AddressSanitizer sees any read outside it), each run checked against the
//   row-major index of its first and last element.
// A rejection must be an io_error whose what() names the file; any other exception, a crash or a
// sanitizer report is a finding (the process aborts, libFuzzer keeps the input).
// With MESHTENSOR_FUZZ_MPIIO=1 each input is also written to a file and read by io::inspect over
// MPI_COMM_SELF (the real rank-0 read and broadcast): a few hundred inputs a second instead of tens
// of thousands, so not the default.
//
// Built by tests/fuzz/CMakeLists.txt with clang++ -fsanitize=fuzzer,address,undefined (ctest
// label fuzz) and by scripts/dev/fuzz.sh for long runs. It includes the whole safetensors.hpp (MPI's
// and Kokkos's headers too) but uses nothing that needs Kokkos's library.
#include <meshtensor/io/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unistd.h>
#include <vector>

namespace {
namespace io = meshtensor::io;
namespace iod = meshtensor::io::detail;

std::string file_name = "fuzz-input.safetensors";  // every io_error must name it
bool through_mpiio = false;

[[noreturn]] void finding(const char* what, const std::string& text) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, text.c_str());
  std::abort();
}

void check_names_file(const std::string& what) {
  if (what.find(file_name) == std::string::npos) finding("an io_error that does not name the file", what);
}

// A box of shape chosen from the input, as a layout might give one processor: per dim, part i of
// p in {1, 2, 3} parts (uneven where p does not divide the extent).
// One piece, read through its own box as frame (a contiguous layout's).
void box_of(iod::entry& e, std::uint64_t seed) {
  const std::size_t R = e.shape.size();
  iod::entry::held_piece box{std::vector<std::int64_t>(R, 0), std::vector<std::int64_t>(R, 0), {}};
  for (std::size_t d = 0; d < R; ++d) {
    const std::int64_t p = 1 + static_cast<std::int64_t>(seed % 3), i = static_cast<std::int64_t>((seed / 3) % p);
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::int64_t s = e.shape[d];  // at most 2^40 (parse_header)
    box.offset[d] = s * i / p;
    box.extent[d] = s * (i + 1) / p - box.offset[d];
  }
  box.frame_offset = box.offset;
  e.extent = box.extent;
  e.pieces = {box};
}

// Reads e's box from the file's bytes as load does (runs at data_start + begin + file * size) and
// checks every run against the row-major global index of its ends.
void read_box(const iod::parsed_header& h, const iod::entry& e, const std::uint8_t* file, std::size_t file_size) {
  // Real tensors hold their elements: skip boxes whose element count overflows (possible only
  // with a zero extent; such a box is empty, and load reads nothing of it).
  std::int64_t count = 1;
  for (auto x : e.extent)
    if (__builtin_mul_overflow(count, x, &count)) return;
  // load checks a header's shape against its tensor's, whose rank is at most max_rank.
  if (e.shape.size() > static_cast<std::size_t>(meshtensor::detail::max_rank)) return;
  std::vector<char> buffer(static_cast<std::size_t>(count * e.elem_size));
  const auto begin = h.json[e.name]["data_offsets"][0].get<std::int64_t>();  // as load takes it
  const auto end = h.json[e.name]["data_offsets"][1].get<std::int64_t>();
  const std::size_t R = e.shape.size();
  std::int64_t next_local = 0;
  const auto global_index = [&](std::int64_t local) {  // of the box's local element, row-major
    std::int64_t g = 0, stride = 1;
    for (std::size_t d = R; d-- > 0;) {
      g += (e.pieces[0].offset[d] + local % e.extent[d]) * stride;
      local /= e.extent[d];
      stride *= e.shape[d];
    }
    return g;
  };
  iod::for_each_run(e, [&](std::int64_t at_file, std::int64_t local, std::int64_t n) {
    if (local != next_local || n <= 0 || local + n > count)
      finding("for_each_run", iod::cat(e.name, ": run at local ", local, " of ", n, " after ", next_local, " of ", count));
    next_local = local + n;
    if (global_index(local) != at_file || global_index(local + n - 1) != at_file + n - 1)
      finding("for_each_run", iod::cat(e.name, ": run of ", n, " at file element ", at_file, " is not the box's"));
    const std::int64_t from = h.data_start + begin + at_file * e.elem_size, bytes = n * e.elem_size;
    if (from < h.data_start + begin || from + bytes > h.data_start + end || from + bytes > static_cast<std::int64_t>(file_size))
      finding("offsets", iod::cat(e.name, ": run [", from, ", ", from + bytes, ") outside its data"));
    std::memcpy(buffer.data() + local * e.elem_size, file + from, static_cast<std::size_t>(bytes));
  });
  if (next_local != count) finding("for_each_run", iod::cat(e.name, ": runs cover ", next_local, " of ", count));
}

void parse(const std::uint8_t* data, std::size_t size) {
  std::string problem;
  const auto n = iod::header_length(data, static_cast<std::int64_t>(size), file_name, problem);
  if (!problem.empty()) return check_names_file(problem);
  const auto h = iod::parse_header(std::string_view(reinterpret_cast<const char*>(data) + 8, n),
                                   static_cast<std::int64_t>(size), file_name);
  const auto info = iod::info_of(h, file_name);
  std::uint64_t seed = size;
  for (const auto& [name, t] : info.tensors) {
    iod::entry e;
    e.name = name;
    e.dtype = t.dtype;
    e.elem_size = iod::dtype_size(t.dtype);
    e.shape = t.shape;
    box_of(e, seed += 0x9e3779b97f4a7c15ULL);
    read_box(h, e, data, size);
  }
}

// Inputs the fuzzer cannot reach within its 4 KB inputs, run once at start: values nested 200000
// deep wherever an error message quotes one. The reader used to quote them with dump(), which
// recurses: a stack overflow from a 400 KB file (a segmentation fault in the -O2 build too).
void regressions() {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string dims = "{\\\"a\\\":" + deep + "}";  // inside a JSON string: {\"a\":[[...]]}
  const std::string headers[] = {
      R"({"a":{"dtype":)" + deep + R"(,"shape":[],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":[1,)" + deep + R"(],"data_offsets":[0,1]}})",
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,)" + deep + R"(]}})",
      R"({"a":{"dtype":"U8","shape":[1,1],"data_offsets":[0,1]},"__metadata__":{"meshtensor.dims":")" + dims + R"("}})"};
  for (const auto& h : headers) {
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(static_cast<std::uint64_t>(h.size()) >> (8 * i));
    file += h + "x";
    try {
      parse(reinterpret_cast<const std::uint8_t*>(file.data()), file.size());
      finding("a regression", "a deeply nested header was accepted");
    } catch (const meshtensor::io_error& e) {
      check_names_file(e.what());
    }
  }
}

void inspect_file(const std::uint8_t* data, std::size_t size) {
  FILE* f = std::fopen(file_name.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) finding("cannot write", file_name);
  io::inspect(file_name, MPI_COMM_SELF);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  regressions();
  if (const char* e = std::getenv("MESHTENSOR_FUZZ_MPIIO"); e && std::string(e) == "1") {
    through_mpiio = true;
    file_name = iod::cat("/tmp/meshtensor-fuzz-", getpid(), ".safetensors");
    MPI_Init(nullptr, nullptr);
    std::atexit([] { std::remove(file_name.c_str()); });
    // MPI-IO's errors come back as return codes (the default handler on files), as the library
    // expects; nothing else of MPI is used.
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  for (int pass = 0; pass < (through_mpiio ? 2 : 1); ++pass) {
    try {
      pass == 0 ? parse(data, size) : inspect_file(data, size);
    } catch (const meshtensor::io_error& e) {
      check_names_file(e.what());
    } catch (const std::exception& e) {
      finding(iod::cat("an exception other than io_error (", typeid(e).name(), ")").c_str(), e.what());
    } catch (...) {
      finding("an exception other than io_error", "(not a std::exception)");
    }
  }
  return 0;
}
