#pragma once
// The safetensors format without the transport: dtype names and sizes, the header's length and its
// JSON checked entry by entry, and what a file holds (tensor_info, file_info). Pure functions of a
// file's bytes (no MPI, no Kokkos): every rank runs them alike on the broadcast header, and the
// fuzzer drives them directly (tests/fuzz). safetensors.hpp moves the bytes (MPI-IO) and the boxes.
#include <bit>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../element/bf16.hpp"
#include "../element/complex.hpp"
#include "../error.hpp"

namespace meshtensor::io {

static_assert(std::endian::native == std::endian::little,
              "meshtensor: safetensors files are little-endian; this host is not");

// The header's "__metadata__": a map of strings (safetensors allows nothing else there).
using metadata = std::map<std::string, std::string>;

namespace detail {
using meshtensor::detail::cat;

// safetensors' dtype names.
template <class T>
constexpr const char* dtype_of() {
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "I32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "I64";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "U8";
  else if constexpr (std::is_same_v<T, std::int8_t>) return "I8";
  else if constexpr (std::is_same_v<T, bool>) return "BOOL";
  else if constexpr (std::is_same_v<T, bf16>) return "BF16";  // the same 16 bits, little-endian
  // Real part then imaginary part, each little-endian. C64 is safetensors' own (0.6); safetensors has
  // no complex of doubles: C128 is meshtensor's, and safetensors' own readers refuse a file with it.
  else if constexpr (std::is_same_v<T, complex<float>>) return "C64";
  else if constexpr (std::is_same_v<T, complex<double>>) return "C128";
  else static_assert(sizeof(T) == 0, "meshtensor: no safetensors dtype for this element type");
}
inline std::int64_t dtype_size(const std::string& d) {
  if (d == "C128") return 16;
  if (d == "F64" || d == "I64" || d == "U64" || d == "C64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += cat(s.empty() ? "" : ", ", x);
  return s;
}
// A JSON value of a file in an error message: its text, cut at 100 bytes, when flat; only its kind
// when nested (dump() recurses, and a hostile header nests a million deep: a stack overflow, found
// by tests/fuzz).
inline std::string json_text(const nlohmann::json& v) {
  if (v.is_structured())
    for (const auto& x : v)
      if (x.is_structured()) return cat("(a nested ", v.type_name(), ")");
  std::string s = v.dump();
  if (s.size() > 100) s = s.substr(0, 100) + "...";
  return s;
}
// A JSON parser's message, cut at 200 bytes: nlohmann's quotes the token it failed on whole, and a
// hostile header's token can be 100 MB.
inline std::string parse_error_text(const std::exception& e) {
  const std::string_view what = e.what();
  return what.size() > 200 ? cat(what.substr(0, 200), "...") : std::string(what);
}
inline std::string shape_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += cat(i ? ", " : "", v[i]);
  return s + "]";
}

}  // namespace detail

namespace detail {
// The header of path, read by rank 0 and broadcast, parsed and checked the same way on every rank:
// its JSON, and the size of the data that follows it.
struct parsed_header {
  nlohmann::json json;
  std::int64_t data_start = 0, data_size = 0;
};

// The checks on a file's bytes are pure functions of those bytes (no MPI, no I/O): every rank makes
// them alike on the broadcast header, and a fuzzer drives them directly (tests/fuzz).

// The header's length from the first 8 bytes of a file of file_size bytes (len is not read when
// the file is shorter), or 0 with problem set when the file cannot hold that header.
inline std::uint64_t header_length(const unsigned char* len, std::int64_t file_size, const std::string& path,
                                   std::string& problem) {
  if (file_size < 8) {
    problem = cat("'", path, "' is truncated: ", file_size, " bytes, fewer than the 8 of the header length");
    return 0;
  }
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  constexpr std::uint64_t max_header = 100'000'000;  // safetensors' own limit
  if (n > max_header)
    problem = cat("'", path, "' is not a safetensors file: its header length ", n, " is above the format's limit of ",
                  max_header, " bytes");
  else if (n > static_cast<std::uint64_t>(file_size) - 8)
    problem = cat("'", path, "' is truncated: its header length is ", n, " bytes, but only ", file_size - 8,
                  " bytes follow the length");
  else
    return n;
  return 0;
}

// The header (the JSON after the length) of a file of file_size bytes, parsed and checked: every
// tensor entry, requested or not (a corrupt entry means a corrupt file). io_error naming path.
inline parsed_header parse_header(std::string_view header, std::int64_t file_size, const std::string& path) {
  parsed_header h;
  h.data_start = 8 + static_cast<std::int64_t>(header.size());
  h.data_size = file_size - h.data_start;
  try {
    h.json = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw io_error(cat("'", path, "': the header is not valid JSON (", parse_error_text(e), ")"));
  }
  if (!h.json.is_object()) throw io_error(cat("'", path, "': the header is not a JSON object"));
  // Named, not a structured binding: clang before 16 cannot capture one in `bad` (the fuzzer's compiler).
  for (const auto& item : h.json.items()) {
    const std::string& name = item.key();
    const nlohmann::json& t = item.value();
    if (name == "__metadata__") {
      if (!t.is_object()) throw io_error(cat("'", path, "': __metadata__ is not an object"));
      for (const auto& [k, v] : t.items())
        if (!v.is_string()) throw io_error(cat("'", path, "': __metadata__ value of '", k, "' is not a string"));
      continue;
    }
    const auto bad = [&](const std::string& why) { return io_error(cat("'", path, "': tensor '", name, "': ", why)); };
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      throw bad("its entry lacks dtype, shape or data_offsets");
    if (!t["dtype"].is_string() || dtype_size(t["dtype"].get<std::string>()) == 0)
      throw bad(cat("unknown dtype ", json_text(t["dtype"])));
    if (!t["shape"].is_array()) throw bad("shape is not an array");
    std::int64_t bytes = dtype_size(t["dtype"].get<std::string>());
    for (const auto& x : t["shape"]) {
      if (!x.is_number_unsigned() || x.get<std::uint64_t>() > (std::uint64_t{1} << 40))
        throw bad(cat("shape ", json_text(t["shape"]), " holds something other than an extent"));
      const auto ext = x.get<std::int64_t>();
      if (ext != 0 && bytes > (std::int64_t{1} << 60) / ext) throw bad(cat("shape ", json_text(t["shape"]), " is too large"));
      bytes *= ext;
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad(cat("data_offsets ", json_text(off), " are not two offsets"));
    const auto b = off[0].get<std::uint64_t>(), en = off[1].get<std::uint64_t>();
    if (b > en || en > static_cast<std::uint64_t>(h.data_size))
      throw bad(cat("data_offsets [", b, ", ", en, "] lie outside the ", h.data_size, " bytes of data in the file",
                    en > static_cast<std::uint64_t>(h.data_size) ? " (truncated?)" : ""));
    if (static_cast<std::int64_t>(en - b) != bytes)
      throw bad(cat("data_offsets [", b, ", ", en, "] hold ", en - b, " bytes, but dtype ", t["dtype"].get<std::string>(),
                    " and shape ", json_text(t["shape"]), " need ", bytes));
  }
  return h;
}

}  // namespace detail

// What a safetensors file holds: its tensors' dtypes, global shapes and (where meshtensor wrote
// it) dim names, and its metadata (without meshtensor's own key).
struct tensor_info {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::string> dims;  // empty where the file does not record them
};
struct file_info {
  std::map<std::string, tensor_info> tensors;
  metadata meta;
};

namespace detail {
inline file_info info_of(const parsed_header& h, const std::string& path) {
  file_info info;
  nlohmann::json dims = nlohmann::json::object();
  if (h.json.contains("__metadata__"))
    for (const auto& [k, v] : h.json["__metadata__"].items()) {
      if (k != "meshtensor.dims") {
        info.meta[k] = v.get<std::string>();
        continue;
      }
      try {
        dims = nlohmann::json::parse(v.get<std::string>());
      } catch (const nlohmann::json::exception& e) {
        throw io_error(cat("'", path, "': metadata 'meshtensor.dims' is not valid JSON (", parse_error_text(e), ")"));
      }
      if (!dims.is_object()) throw io_error(cat("'", path, "': metadata 'meshtensor.dims' is not a JSON object"));
    }
  for (const auto& [name, t] : h.json.items()) {
    if (name == "__metadata__") continue;
    tensor_info ti;
    ti.dtype = t["dtype"].get<std::string>();
    ti.shape = t["shape"].get<std::vector<std::int64_t>>();
    if (dims.contains(name)) {
      const auto& d = dims[name];
      if (!d.is_array() || d.size() != ti.shape.size())
        throw io_error(cat("'", path, "': tensor '", name, "': recorded dims ", json_text(d), " do not fit shape ",
                           shape_text(ti.shape)));
      for (const auto& x : d) {
        if (!x.is_string()) throw io_error(cat("'", path, "': tensor '", name, "': recorded dims ", json_text(d), " are not names"));
        ti.dims.push_back(x.get<std::string>());
      }
    }
    info.tensors.emplace(name, std::move(ti));
  }
  return info;
}
}  // namespace detail


}  // namespace meshtensor::io
