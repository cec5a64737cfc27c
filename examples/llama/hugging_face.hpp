#pragma once
// examples/llama and Hugging Face's Llama checkpoints, in one place: config.json into the options
// (what the model cannot compute refused, naming the key), the weights loaded from save_pretrained's
// files (model.safetensors or its shards; F32 or BF16) into any layout, and written back in its
// layout. The names and the orientation of each weight are model::names and the dims' order in
// model.hpp: [out, in] as a Linear stores it, q's and k's heads as RoPE's rotate-half expects.
#include <fmt/core.h>
#include <meshtensor/io/pretrained.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model.hpp"

// --config FILE (or --from-pretrained DIR's config.json): the architecture into the options
// (Hugging Face's LlamaConfig keys); anything this model does not compute is refused, naming the key.
inline void read_config(options& o, const std::string& path) {
  nlohmann::json c;
  try {
    o.config_text = mt::io::read_text(path, MPI_COMM_WORLD);
    c = nlohmann::json::parse(o.config_text);
  } catch (const nlohmann::json::exception& e) {
    throw mt::io_error(fmt::format("'{}' is not JSON: {}", path, e.what()));
  }
  const auto need = [&](const char* key) -> const nlohmann::json& {
    if (!c.contains(key) || c[key].is_null()) throw mt::io_error(fmt::format("'{}' has no '{}'", path, key));
    return c[key];
  };
  const auto refuse = [&](const char* key, const std::string& value, const char* why) {
    throw mt::io_error(fmt::format("'{}': {} is {}; {}", path, key, value, why));
  };
  if (c.value("model_type", std::string()) != "llama") refuse("model_type", c.value("model_type", std::string("(none)")), "this model reads llama");
  if (c.value("hidden_act", std::string("silu")) != "silu") refuse("hidden_act", c["hidden_act"].dump(), "Llama's feed-forward is SwiGLU (silu)");
  if (c.value("attention_bias", false) || c.value("mlp_bias", false)) refuse("attention_bias or mlp_bias", "true", "this model has no biases");
  try {
    o.d_model = need("hidden_size").get<std::int64_t>();
    o.layers = need("num_hidden_layers").get<std::int64_t>();
    const auto heads = need("num_attention_heads").get<std::int64_t>();
    o.kv_heads = c.value("num_key_value_heads", heads);
    if (o.kv_heads <= 0 || heads % o.kv_heads != 0)
      refuse("num_key_value_heads", std::to_string(o.kv_heads), fmt::format("it must divide num_attention_heads ({})", heads).c_str());
    o.group = heads / o.kv_heads;
    o.d_kv = c.contains("head_dim") && !c["head_dim"].is_null() ? c["head_dim"].get<std::int64_t>() : o.d_model / heads;
    o.d_ff = need("intermediate_size").get<std::int64_t>();
    o.vocab = need("vocab_size").get<std::int64_t>();
    o.rms_eps = c.value("rms_norm_eps", 1e-6);
    o.rope_theta = c.value("rope_theta", 10000.0);
    o.tie_embeddings = c.value("tie_word_embeddings", false);
    if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
      const auto& r = c["rope_scaling"];
      const std::string type = r.value("rope_type", r.value("type", std::string()));
      if (type != "llama3") refuse("rope_scaling's rope_type", type, "the default and llama3 are read");
      o.rope_llama3 = nn::rope_llama3_scaling{r.at("factor").get<double>(), r.at("low_freq_factor").get<double>(),
                                              r.at("high_freq_factor").get<double>(),
                                              r.at("original_max_position_embeddings").get<double>()};
    }
  } catch (const nlohmann::json::exception& e) {
    throw mt::io_error(fmt::format("'{}': {}", path, e.what()));
  }
}

// --from-pretrained DIR: the model's weights from a Hugging Face checkpoint (save_pretrained's
// model.safetensors or shards), each processor reading its own slices; F32 files loaded as they
// are, BF16 ones into bf16 copies then cast to the float weights.
template <class L, class PL>
void load_pretrained(model<L, PL>& m, const std::string& dir) {
  const mt::no_grad loading;  // the casts below are no steps of the model
  const std::string dtype = mt::io::pretrained_dtype(dir, MPI_COMM_WORLD);
  mt::io::tensor_set set;
  std::vector<std::function<void()>> cast_back;
  m.each_named([&]<class W>(const std::string& name, W& w) {
    if (dtype == "F32") {
      set.add(name, w);
    } else if (dtype == "BF16") {
      auto copy = mt::cast<mt::bf16>(w);  // its values come from the file
      set.add(name, copy);
      cast_back.push_back([&w, copy] {
        w = mt::cast<float>(copy);
        w.requires_grad();
      });
    } else {
      throw mt::io_error(fmt::format("'{}' holds {} tensors; F32 and BF16 are read", dir, dtype));
    }
  });
  MPI_Barrier(MPI_COMM_WORLD);  // the time of the slowest rank's read, from a common start
  const auto start = std::chrono::steady_clock::now();
  mt::io::load_pretrained(dir, set);
  for (const auto& f : cast_back) f();
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::uintmax_t bytes = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir))
      if (f.path().extension() == ".safetensors") bytes += f.file_size();
    fmt::print("loaded {}: {:.3f} GiB of {} weights in {:.2f} s ({:.2f} GiB/s)\n", dir, bytes / 1073741824.0, dtype,
               seconds, bytes / 1073741824.0 / seconds);
  }
}

// The config.json --save-pretrained writes: the one read (its other keys kept), or one made from
// the options, its torch_dtype the weights'.
inline std::string config_json(const options& o) {
  nlohmann::json c = o.config_text.empty() ? nlohmann::json::object() : nlohmann::json::parse(o.config_text);
  if (o.config_text.empty()) {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["hidden_size"] = o.d_model;
    c["intermediate_size"] = o.d_ff;
    c["num_hidden_layers"] = o.layers;
    c["num_attention_heads"] = o.kv_heads * o.group;
    c["num_key_value_heads"] = o.kv_heads;
    c["head_dim"] = o.d_kv;
    c["vocab_size"] = o.vocab;
    c["max_position_embeddings"] = o.length;
    c["rms_norm_eps"] = o.rms_eps;
    c["rope_theta"] = o.rope_theta;
    c["tie_word_embeddings"] = o.tie_embeddings;
  }
  c["torch_dtype"] = o.save_dtype == "bf16" ? "bfloat16" : "float32";
  return c.dump(2) + "\n";
}

// --save-pretrained DIR: the weights and config.json as transformers' save_pretrained writes them
// (q, k, v and o as [out, in] matrices, their heads merged), in --save-dtype, sharded past
// --max-shard-bytes; every processor writes its own slices.
template <class L, class PL>
void save_pretrained(model<L, PL>& m, const options& o) {
  const mt::no_grad saving;  // the bf16 copies are no steps of the model
  const std::int64_t heads = o.kv_heads * o.group;
  const auto file_shape = [&](const std::string& name) -> std::vector<std::int64_t> {
    if (name.ends_with("q_proj.weight")) return {heads * o.d_kv, o.d_model};
    if (name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight")) return {o.kv_heads * o.d_kv, o.d_model};
    if (name.ends_with("o_proj.weight")) return {o.d_model, heads * o.d_kv};
    return {};
  };
  mt::io::tensor_set set;
  m.each_named([&](const std::string& name, auto& w) {
    if (o.save_dtype == "bf16") {
      auto copy = mt::cast<mt::bf16>(w);  // the set keeps its data alive
      set.add(name, copy);
    } else {
      set.add(name, w);
    }
    if (const auto merged = file_shape(name); !merged.empty()) set.merge_dims_in_files(name, merged);
  });
  mt::io::save_pretrained(o.save_pretrained, set, config_json(o), o.max_shard_bytes);
}

