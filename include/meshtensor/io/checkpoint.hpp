#pragma once
// checkpoints: a directory of safetensors checkpoints, saved atomically, with training state.
//
//   mt::io::checkpoints ckpt("run1");                    // a directory (created on first save)
//   mt::io::tensor_set set;
//   set.add("w", w).add("b", b);
//   mt::io::add_optimizer_state(set, adam, std::tie(w, b), {"w", "b"});
//   ckpt.save(set, step, {{"step", std::to_string(step)}}); // every rank, collective
//   ...
//   if (ckpt.current(comm)) auto meta = ckpt.load(set);  // resume, under any layout / rank count
//
// Layout on disk:
//   run1/step-00000020/model.safetensors     a complete checkpoint (io/safetensors.hpp), or
//   run1/step-00000020/model-00001-of-00002.safetensors ... and model.safetensors.index.json
//                                            a sharded one (save_shard: a pipeline's, a shard per
//                                            stage; io/shards.hpp), which load() reads alike
//   run1/latest                              the name of the current one ("step-00000020\n")
//   run1/.tmp-step-00000040/                 a save in progress (or one a crash interrupted)
// A save writes into .tmp-<name>/, syncs the file (MPI_File_sync) and the directory, renames it
// to <name>/ and syncs run1/, then writes latest.tmp, syncs it and renames it over latest (POSIX
// rename is atomic) and syncs run1/ again; only then are checkpoints beyond the newest `keep`
// removed, never the current one. A job killed at any moment leaves `latest` naming a complete
// checkpoint: the previous one until the final rename, the new one after. Leftover .tmp-* are
// removed by the next save.
// File system work is rank 0's; its outcome is broadcast and agreed, so errors (io_error naming
// the path) are raised on every rank alike.
// MESHTENSOR_CHECKPOINT_TRACE=1 makes rank 0 print each phase of a save on stderr (begin, written,
// renamed, current, pruned); with it, MESHTENSOR_CHECKPOINT_PAUSE_AT=<phase> makes rank 0 stop 30 s
// after printing that phase (the kill test kills saves there).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <sstream>

#include "safetensors.hpp"
#include "shards.hpp"

namespace meshtensor::io {

namespace detail {
inline void trace_phase(int rank, const char* phase, const std::string& name) {
  if (rank != 0) return;
  const char* t = std::getenv("MESHTENSOR_CHECKPOINT_TRACE");
  if (t == nullptr || *t == '\0' || *t == '0') return;
  std::fprintf(stderr, "checkpoint: %s %s\n", phase, name.c_str());
  std::fflush(stderr);
  // The kill test stops a save here, to kill it at a chosen point of its narrow phases.
  const char* pause = std::getenv("MESHTENSOR_CHECKPOINT_PAUSE_AT");
  if (pause != nullptr && std::strcmp(pause, phase) == 0) ::sleep(30);
}

// fsync of a file or directory; throws io_error naming it.
inline void sync_path(const std::filesystem::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw io_error(cat("cannot open '", p.string(), "' to sync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw io_error(cat("cannot sync '", p.string(), "': ", std::strerror(err)));
}

// Runs f on rank 0 of comm; its io_error or filesystem error becomes an io_error on every rank.
// Returns what f wrote into `out` on rank 0, broadcast.
template <class F>
std::string on_root(MPI_Comm comm, F&& f) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string out, problem;
  if (rank == 0) {
    try {
      out = f();
    } catch (const std::filesystem::filesystem_error& e) {
      problem = e.what();
      if (problem.empty()) problem = "file system error";
    } catch (const std::exception& e) {
      problem = e.what();
      if (problem.empty()) problem = "error";
    }
  }
  meshtensor::detail::agree_or_throw<io_error>(comm, problem.empty(), problem);
  long long n = static_cast<long long>(out.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
  out.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  return out;
}

inline bool is_checkpoint_name(const std::string& n) { return n.rfind("step-", 0) == 0; }

// A checkpoint name's order, "step-<step>[-<k>]" as (step, k), k = 1 without a suffix; nullopt for
// a name of another form. By number: past 8 digits the names' text order is not the steps'.
inline std::optional<std::pair<long long, long long>> checkpoint_order(const std::string& n) {
  if (!is_checkpoint_name(n)) return std::nullopt;
  const auto number = [&](std::size_t from, std::size_t to) -> std::optional<long long> {
    if (from >= to || to - from > 18) return std::nullopt;
    long long v = 0;
    for (std::size_t i = from; i < to; ++i) {
      if (n[i] < '0' || n[i] > '9') return std::nullopt;
      v = v * 10 + (n[i] - '0');
    }
    return v;
  };
  const std::size_t dash = n.find('-', 5);
  const auto step = number(5, dash == std::string::npos ? n.size() : dash);
  const auto k = dash == std::string::npos ? std::optional<long long>(1) : number(dash + 1, n.size());
  if (!step || !k) return std::nullopt;
  return std::pair{*step, *k};
}
}  // namespace detail

class checkpoints {
 public:
  // dir: the checkpoint directory. keep: how many complete checkpoints to keep (>= 1).
  explicit checkpoints(std::string dir, int keep = 2) : dir_(std::move(dir)), keep_(keep) {
    if (keep_ < 1) throw io_error(detail::cat("checkpoints: keep = ", keep_, "; at least the current one is kept"));
  }
  const std::string& directory() const { return dir_; }

  // Saves the set as checkpoint "step-<step>" (8 digits; "-2", "-3", ... if that name is taken) and
  // makes it current once it is complete and synced. Returns its name. Collective.
  std::string save(const tensor_set& set, std::int64_t step, const metadata& meta = {}) const {
    const MPI_Comm comm = set.comm();
    // A watched rendezvous first (a no-op without MESHTENSOR_COLLECTIVE_TIMEOUT): the save's
    // file-system agreements and MPI-IO are not watched, and ranks that reached them while another
    // is stopped would wait there forever.
    if (auto& c = set.mesh_communicator(); c.watched()) c.agree_or_throw<io_error>(true, {});
    const meshtensor::detail::unpolled_region_deadline deadline(meshtensor::detail::cat("checkpoint save to '", dir_, "'"));
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    const std::string name = begin(comm, step);
    detail::trace_phase(rank, "begin", name);
    io::save((std::filesystem::path(dir_) / (".tmp-" + name) / file_name).string(), set, meta);
    detail::trace_phase(rank, "written", name);
    publish(comm, name);
    return name;
  }

  // The current checkpoint's name, if there is one. Collective over comm.
  std::optional<std::string> current(MPI_Comm comm) const {
    const std::string name = detail::on_root(comm, [&] {
      namespace fs = std::filesystem;
      const fs::path pointer = fs::path(dir_) / "latest";
      if (!fs::exists(pointer)) return std::string();
      std::ifstream in(pointer);
      std::string n;
      std::getline(in, n);
      if (!in || !detail::is_checkpoint_name(n) || n.find('/') != std::string::npos)
        throw io_error(detail::cat("'", pointer.string(), "' does not name a checkpoint"));
      if (!fs::exists(fs::path(dir_) / n / file_name) && !fs::exists(fs::path(dir_) / n / shard_index_name))
        throw io_error(detail::cat("'", pointer.string(), "' names '", n, "', but '",
                                   (fs::path(dir_) / n / file_name).string(), "' does not exist (nor a sharded "
                                   "checkpoint's '", shard_index_name, "')"));
      return n;
    });
    if (name.empty()) return std::nullopt;
    return name;
  }

  // The path of a checkpoint's safetensors file.
  std::string file_of(const std::string& name) const { return (std::filesystem::path(dir_) / name / file_name).string(); }

  // Loads the current checkpoint into the set (under the tensors' own layouts); returns its
  // metadata. io_error on every rank if there is none or it does not match. Collective.
  metadata load(tensor_set& set) const { return load(set, set.comm()); }
  // The same for a set that may be empty (a pipeline stage that holds no tensors), whose
  // processors are comm's: only the metadata is read then.
  metadata load(tensor_set& set, MPI_Comm comm) const {
    const meshtensor::detail::unpolled_region_deadline deadline(meshtensor::detail::cat("checkpoint load from '", dir_, "'"));
    const auto name = current(comm);
    if (!name)
      throw io_error(detail::cat("no checkpoint in '", dir_, "' (no '", (std::filesystem::path(dir_) / "latest").string(),
                                 "')"));
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(dir_) / *name, index = dir / shard_index_name;
    const std::string index_text = detail::on_root(comm, [&] {
      if (!fs::exists(index)) return std::string();
      std::ifstream in(index);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) throw io_error(detail::cat("cannot read '", index.string(), "' (or it is empty)"));
      return text.str();
    });
    if (index_text.empty()) return set.empty() ? inspect(file_of(*name), comm).meta : io::load(file_of(*name), set);
    if (set.empty()) return shard_index_metadata(index_text, index.string());
    return load_sharded(dir, index_text, set);
  }

  // A sharded save: the set is shard `shard` of `shards` (a pipeline stage's tensors, on its own
  // processors), and `whole` holds every processor of every shard. Each shard's processors write
  // its file (model-0000k-of-0000n.safetensors; none for an empty set: a stage holding no tensors);
  // the first processor of each sends its tensors' names to whole's rank 0, which writes
  // model.safetensors.index.json; then the checkpoint is published as save() publishes. A tensor
  // name in two shards is an error naming it. Returns the checkpoint's name. Collective over whole.
  std::string save_shard(const tensor_set& set, int shard, int shards, MPI_Comm whole, std::int64_t step,
                         const metadata& meta = {}) const {
    if (!set.empty())
      if (auto& c = set.mesh_communicator(); c.watched()) c.agree_or_throw<io_error>(true, {});
    const meshtensor::detail::unpolled_region_deadline deadline(meshtensor::detail::cat("checkpoint save to '", dir_, "'"));
    namespace fs = std::filesystem;
    int rank = 0;
    MPI_Comm_rank(whole, &rank);
    const std::string name = begin(whole, step), file = shard_file_name(shard, shards);
    detail::trace_phase(rank, "begin", name);
    const fs::path tmp = fs::path(dir_) / (".tmp-" + name);
    if (!set.empty()) io::save((tmp / file).string(), set, meta);  // a stage holding nothing writes no file
    detail::trace_phase(rank, "written", name);
    publish_shards(whole, name, shard_listing(set, file), meta);
    return name;
  }

 protected:
  // What a shard's first processor tells the index: "file\n" then a line per tensor ("" elsewhere,
  // and for an empty set).
  static std::string shard_listing(const tensor_set& set, const std::string& file) {
    if (set.empty()) return {};
    int set_rank = 0;
    MPI_Comm_rank(set.comm(), &set_rank);
    if (set_rank != 0) return {};
    std::string out = file + "\n";
    for (const auto& e : set.entries()) out += e.name + "\n";
    return out;
  }
  // Every shard's listing to whole's rank 0, which writes model.safetensors.index.json into the
  // save's .tmp-<name>/ (a tensor in two shards is an error naming it); then publish(). Every
  // shard's file must be on disk. Collective over whole.
  void publish_shards(MPI_Comm whole, const std::string& name, const std::string& mine, const metadata& meta) const {
    namespace fs = std::filesystem;
    int rank = 0, size = 0;
    MPI_Comm_rank(whole, &rank);
    MPI_Comm_size(whole, &size);
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(static_cast<std::size_t>(size)), starts(static_cast<std::size_t>(size));
    MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, whole);
    std::string all;
    if (rank == 0) {
      long long total = 0;
      for (int r = 0; r < size; ++r) {
        starts[static_cast<std::size_t>(r)] = static_cast<int>(total);
        total += lengths[static_cast<std::size_t>(r)];
      }
      all.resize(static_cast<std::size_t>(total));
    }
    MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), starts.data(), MPI_CHAR, 0, whole);
    const fs::path tmp = fs::path(dir_) / (".tmp-" + name);
    detail::on_root(whole, [&] {
      std::map<std::string, std::string> weight_map;
      std::string line, in_file;
      for (int r = 0; r < size; ++r) {
        if (lengths[static_cast<std::size_t>(r)] == 0) continue;
        std::istringstream part(all.substr(static_cast<std::size_t>(starts[static_cast<std::size_t>(r)]),
                                           static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
        std::getline(part, in_file);
        while (std::getline(part, line))
          if (!weight_map.emplace(line, in_file).second)
            throw io_error(detail::cat("checkpoint save to '", dir_, "': tensor '", line, "' is in two shards ('",
                                       weight_map.at(line), "' and '", in_file, "')"));
      }
      const fs::path index = tmp / shard_index_name;
      std::ofstream out(index, std::ios::trunc);
      out << shard_index_text(weight_map, meta);
      out.close();
      if (!out) throw io_error(detail::cat("cannot write '", index.string(), "'"));
      detail::sync_path(index, false);
      return std::string();
    });
    publish(whole, name);
  }

 public:
  static constexpr const char* file_name = "model.safetensors";

 protected:
  // Names the checkpoint of this step and makes its .tmp-<name>/ directory (removing saves a crash
  // interrupted); with create_file, an empty .tmp-<name>/model.safetensors too. Collective.
  std::string begin(MPI_Comm comm, std::int64_t step, bool create_file = false) const {
    namespace fs = std::filesystem;
    char base[32];
    std::snprintf(base, sizeof base, "step-%08lld", static_cast<long long>(step));
    return detail::on_root(comm, [&] {
      fs::create_directories(dir_);
      for (const auto& d : fs::directory_iterator(dir_))  // saves a crash interrupted
        if (d.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(d.path());
      std::string n = base;
      for (int k = 2; fs::exists(fs::path(dir_) / n); ++k) n = detail::cat(base, "-", k);
      fs::create_directory(fs::path(dir_) / (".tmp-" + n));
      if (create_file) {
        const fs::path file = fs::path(dir_) / (".tmp-" + n) / file_name;
        std::ofstream out(file, std::ios::trunc | std::ios::binary);
        if (!out) throw io_error(detail::cat("cannot create '", file.string(), "'"));
      }
      return n;
    });
  }

  // Makes the complete .tmp-<name>/ checkpoint current: syncs it, renames it to <name>/, moves
  // `latest`, prunes beyond `keep`. Every rank's file must be written and synced. Collective.
  void publish(MPI_Comm comm, const std::string& name) const {
    namespace fs = std::filesystem;
    const fs::path tmp = fs::path(dir_) / (".tmp-" + name), final_dir = fs::path(dir_) / name;
    detail::on_root(comm, [&] {
      detail::sync_path(tmp, true);
      fs::rename(tmp, final_dir);
      detail::sync_path(dir_, true);
      detail::trace_phase(0, "renamed", name);
      const fs::path pointer_tmp = fs::path(dir_) / "latest.tmp";
      {
        std::ofstream out(pointer_tmp, std::ios::trunc);
        out << name << '\n';
        out.close();
        if (!out) throw io_error(detail::cat("cannot write '", pointer_tmp.string(), "'"));
      }
      detail::sync_path(pointer_tmp, false);
      fs::rename(pointer_tmp, fs::path(dir_) / "latest");
      detail::sync_path(dir_, true);
      detail::trace_phase(0, "current", name);
      // Beyond the newest `keep`, complete checkpoints go, ordered by step (and suffix); a
      // directory named otherwise is not ours to remove.
      std::vector<std::pair<std::pair<long long, long long>, std::string>> all;
      for (const auto& d : fs::directory_iterator(dir_))
        if (const auto order = detail::checkpoint_order(d.path().filename().string()); order && d.is_directory())
          all.emplace_back(*order, d.path().filename().string());
      std::sort(all.begin(), all.end());
      for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i)
        if (all[i].second != name) fs::remove_all(fs::path(dir_) / all[i].second);
      detail::trace_phase(0, "pruned", name);
      return std::string();
    });
  }

 private:
  std::string dir_;
  int keep_;
};

// Adds the optimizer's state tensors of these params to the set, as "<prefix><param name>/<state
// name>" (e.g. "optimizer/w/m"), making the states first where no step has run yet (so a resumed
// run can load into them before its first step). The step count goes in the metadata separately
// (optimizer.steps() / set_steps()).
template <class Opt, Parameter... Ps>
void add_optimizer_state(tensor_set& set, Opt& opt, std::tuple<Ps&...> params, const std::vector<std::string>& names,
                         const std::string& prefix = "optimizer/") {
  std::size_t n = 0;  // a vector param has a name per tensor
  std::apply([&](const auto&... p) { ((n += meshtensor::detail::tensor_count(p)), ...); }, params);
  if (names.size() != n)
    throw io_error(detail::cat("add_optimizer_state: ", names.size(), " names for ", n, " param tensors"));
  opt.for_each_state(params, [&](std::size_t i, const char* state, auto& tensor) {
    set.add(detail::cat(prefix, names[i], "/", state), tensor);
  });
}

}  // namespace meshtensor::io
