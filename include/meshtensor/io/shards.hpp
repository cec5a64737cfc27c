#pragma once
// Sharded safetensors, as Hugging Face's save_pretrained writes them: the tensors spread over
// model-00001-of-0000n.safetensors ... and model.safetensors.index.json, which maps each tensor's
// name to its file: {"metadata": {...}, "weight_map": {"name": "file", ...}}. A pipelined run's
// checkpoint is one shard per stage (the stage's tensors, written by its own processors), so it
// resumes under another stage count or none, and readers of the published format read it.
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error.hpp"
#include "safetensors.hpp"

namespace meshtensor::io {

inline constexpr const char* shard_index_name = "model.safetensors.index.json";

// Hugging Face's name of shard `shard` (from 0) of `shards`: model-00001-of-00002.safetensors.
inline std::string shard_file_name(int shard, int shards) {
  if (shards < 1 || shard < 0 || shard >= shards)
    throw io_error(detail::cat("shard ", shard, " of ", shards, ": shards count from 0 to ", shards, " - 1"));
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, shards);
  return name;
}

// The index's text: the file of every tensor, and metadata (strings, as a safetensors header's).
inline std::string shard_index_text(const std::map<std::string, std::string>& weight_map, const metadata& meta) {
  nlohmann::json index;
  index["metadata"] = nlohmann::json::object();
  for (const auto& [k, v] : meta) index["metadata"][k] = v;
  index["weight_map"] = nlohmann::json::object();
  for (const auto& [name, file] : weight_map) index["weight_map"][name] = file;
  return index.dump(2) + "\n";
}

// The weight map of an index's text; io_error naming path and what is wrong with it. A file
// named there must be a plain name in the index's directory (no path).
inline std::map<std::string, std::string> parse_shard_index(const std::string& text, const std::string& path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw io_error(detail::cat("'", path, "' is not JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw io_error(detail::cat("'", path, "' has no \"weight_map\" object (a sharded safetensors index maps each "
                               "tensor's name to its file)"));
  std::map<std::string, std::string> out;
  for (const auto& item : index["weight_map"].items()) {
    if (!item.value().is_string())
      throw io_error(detail::cat("'", path, "': the file of tensor '", item.key(), "' is not a string"));
    const std::string file = item.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw io_error(detail::cat("'", path, "': tensor '", item.key(), "' is in '", file,
                                 "', which is not a file name in the index's directory"));
    out.emplace(item.key(), file);
  }
  return out;
}

// The metadata an index carries (its "metadata" object's string values; meshtensor writes the
// checkpoint's there as in each shard's header).
inline metadata shard_index_metadata(const std::string& text, const std::string& path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw io_error(detail::cat("'", path, "' is not JSON: ", e.what()));
  }
  metadata out;
  if (index.is_object() && index.contains("metadata") && index["metadata"].is_object())
    for (const auto& item : index["metadata"].items())
      if (item.value().is_string()) out.emplace(item.key(), item.value().get<std::string>());
  return out;
}

// Loads the set's tensors from the shards an index names (index_text: dir's
// model.safetensors.index.json, read by the caller), each tensor from its file, every processor
// reading only its own slices (io::load). Returns the metadata of the first file read. Collective
// over the set's mesh. A tensor the index does not map is an error naming it; on an error in one
// shard's file, the tensors of the shards read before it are already loaded.
inline metadata load_sharded(const std::filesystem::path& dir, const std::string& index_text, tensor_set& set,
                             const load_options& options = {}) {
  const std::string index_path = (dir / shard_index_name).string();
  const auto weight_map = parse_shard_index(index_text, index_path);
  std::map<std::string, std::vector<std::string>> by_file;  // the same order on every processor
  for (const auto& e : set.entries()) {
    const auto it = weight_map.find(e.name);
    if (it == weight_map.end())
      throw io_error(detail::cat("'", index_path, "' maps no file to tensor '", e.name, "' (it maps ", weight_map.size(),
                                 " tensors)"));
    by_file[it->second].push_back(e.name);
  }
  metadata meta;
  bool first = true;
  for (const auto& [file, names] : by_file) {
    tensor_set part = set.only(names);
    metadata m = load((dir / file).string(), part, options);
    if (first) meta = std::move(m);
    first = false;
  }
  return meta;
}

}  // namespace meshtensor::io
