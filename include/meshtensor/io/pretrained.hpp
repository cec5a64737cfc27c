#pragma once
// A model's weights from a directory as Hugging Face's save_pretrained writes it: model.safetensors,
// or the shards that model.safetensors.index.json maps (io/shards.hpp), and its config.json.
//   read_text(path, comm)           a small file (config.json), read on rank 0 and broadcast
//   pretrained_dtype(dir, comm)     the dtype its tensors are stored in ("F32", "BF16", ...)
//   load_pretrained(dir, set)       the set's tensors, by name, each processor reading only its own
//                                   slices under the tensor's layout (io::load)
//   save_pretrained(dir, set, config, max_shard_bytes)
//                                   the set and config.json as save_pretrained writes them, every
//                                   processor its own byte ranges (io::save), sharded past the size
// The files record no dim names and hold Linear weights as [out, in] matrices, heads merged: a
// tensor declared with the file's dims split further (q_proj.weight [heads x d_kv, d_model] as
// [kv_heads, group, d_kv, d_model]) loads as it is (load_options::merged_dims: the row-major bytes
// are the same); saving, tensor_set::merge_dims_in_files writes them merged again. The dtypes
// must match: load a BF16 file into bf16 tensors and cast them.
// Communication: one broadcast per text read on rank 0; load's reads are MPI-IO, every processor
// its own byte ranges, so a large model never passes through one processor's memory. Collective
// over the set's mesh (or comm); every error is raised on every processor, naming the file.
#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "safetensors.hpp"
#include "shards.hpp"
#include "tensor_set.hpp"

namespace meshtensor::io {

inline std::string read_text(const std::string& path, MPI_Comm comm) {
  return detail::on_root(comm, [&] {
    std::ifstream in(path);
    if (!in) throw io_error(detail::cat("cannot open '", path, "'"));
    std::stringstream text;
    text << in.rdbuf();
    if (!in && !in.eof()) throw io_error(detail::cat("cannot read '", path, "'"));
    return text.str();
  });
}

namespace detail {
// The index's text, or "" where the directory holds a single model.safetensors; an error naming
// the directory where it holds neither.
inline std::string pretrained_index(const std::string& dir, MPI_Comm comm) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / shard_index_name, single = fs::path(dir) / "model.safetensors";
  const std::string where = on_root(comm, [&] {
    if (fs::exists(index)) return std::string("index");
    if (fs::exists(single)) return std::string("single");
    throw io_error(cat("'", dir, "' holds neither '", single.filename().string(), "' nor '", shard_index_name,
                       "' (a directory as Hugging Face's save_pretrained writes it)"));
  });
  return where == "index" ? read_text(index.string(), comm) : std::string();
}
}  // namespace detail

// The dtype of the directory's tensors; an error naming both where they differ.
inline std::string pretrained_dtype(const std::string& dir, MPI_Comm comm) {
  namespace fs = std::filesystem;
  const std::string index_text = detail::pretrained_index(dir, comm);
  std::set<std::string> files;
  if (index_text.empty()) {
    files.insert("model.safetensors");
  } else {
    for (const auto& [name, file] : parse_shard_index(index_text, (fs::path(dir) / shard_index_name).string()))
      files.insert(file);
  }
  std::string dtype, first;
  for (const auto& file : files)
    for (const auto& [name, t] : inspect((fs::path(dir) / file).string(), comm).tensors) {
      if (dtype.empty()) dtype = t.dtype, first = name;
      if (t.dtype != dtype)
        throw io_error(detail::cat("'", dir, "' holds tensors of two dtypes: '", first, "' is ", dtype, ", '", name,
                                   "' is ", t.dtype));
    }
  if (dtype.empty()) throw io_error(detail::cat("'", dir, "' holds no tensor"));
  return dtype;
}

// Loads the set's tensors from the directory (by name); returns the first file's metadata.
inline metadata load_pretrained(const std::string& dir, tensor_set& set) {
  const std::string index_text = detail::pretrained_index(dir, set.comm());
  const load_options merged{.merged_dims = true};
  if (index_text.empty()) return load((std::filesystem::path(dir) / "model.safetensors").string(), set, merged);
  return load_sharded(dir, index_text, set, merged);
}

// Writes the set into dir (created if need be) as transformers' save_pretrained does: config_json
// as config.json, the tensors into model.safetensors, or, where they come to more than
// max_shard_bytes, into model-0000k-of-0000n.safetensors (in the set's order, a new file before a
// tensor that would pass the size) with model.safetensors.index.json. Every file's metadata says
// {"format": "pt"}, which transformers requires. Collective over the set's mesh.
inline void save_pretrained(const std::string& dir, const tensor_set& set, const std::string& config_json,
                            std::int64_t max_shard_bytes = std::int64_t{5} << 30) {
  namespace fs = std::filesystem;
  const MPI_Comm comm = set.comm();
  const auto write_on_root = [&](const fs::path& path, const std::string& text) {
    (void)detail::on_root(comm, [&] {
      fs::create_directories(path.parent_path());
      std::ofstream out(path);
      out << text;
      if (!out) throw io_error(detail::cat("cannot write '", path.string(), "'"));
      return std::string();
    });
  };
  // A previous save's weights would be read instead of (model.safetensors) or beside (shards) these.
  (void)detail::on_root(comm, [&] {
    if (fs::is_directory(dir))
      for (const auto& f : fs::directory_iterator(dir)) {
        const std::string name = f.path().filename().string();
        if (name == "model.safetensors" || name == shard_index_name ||
            (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos && name.ends_with(".safetensors")))
          fs::remove(f.path());
      }
    return std::string();
  });
  write_on_root(fs::path(dir) / "config.json", config_json);
  std::vector<std::vector<std::string>> shards(1);
  std::int64_t in_shard = 0;
  for (const auto& e : set.entries()) {
    if (!shards.back().empty() && in_shard + e.global_bytes() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(e.name);
    in_shard += e.global_bytes();
  }
  const metadata pt{{"format", "pt"}};
  if (shards.size() == 1) {
    save((fs::path(dir) / "model.safetensors").string(), set, pt);
    return;
  }
  std::map<std::string, std::string> weight_map;
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shard_file_name(static_cast<int>(k), static_cast<int>(shards.size()));
    save((fs::path(dir) / file).string(), set.only(shards[k]), pt);
    for (const auto& name : shards[k]) weight_map[name] = file;
  }
  write_on_root(fs::path(dir) / shard_index_name,
                shard_index_text(weight_map, {{"total_size", std::to_string(set.global_bytes())}}));
}

}  // namespace meshtensor::io
