#pragma once
// async_checkpoints: checkpoints (io/checkpoint.hpp) whose files are written while training goes on.
//
//   mt::io::async_checkpoints ckpt("run1", 3);           // keep the newest 3
//   for (step...) {
//     train_step();
//     ckpt.poll();                                         // every step: publishes a finished save
//     if (step % 100 == 0) ckpt.save(set, step, meta);     // blocks only to copy this rank's boxes
//   }
//   ckpt.wait();                                           // the last save current before exit
//
// save() copies what this rank writes of every tensor (its boxes, as io::save would write them)
// into host buffers, with the node's cores its ranks leave free (up to 8 threads), and returns:
// the tensors may change at once. A thread of this rank then writes the buffers into .tmp-<name>/model.safetensors with pwrite at the file's offsets (rank 0 also the
// header) and fsyncs it. The file is byte for byte the one io::save writes. The thread makes no MPI
// or Kokkos call, so the main thread stays MPI's only caller (MPI_THREAD_FUNNELED, which
// meshtensor::environment requests: the process has other threads, so SINGLE would not do) and
// training's collectives are never interleaved with the save's. poll() asks every rank (one small watched agreement) whether its write is done;
// when all are, it publishes as checkpoints::save does (rename, `latest`, prune). So `latest`
// moves only after every rank's bytes are on disk, and a job killed during a write resumes from the
// previous checkpoint (.tmp-* are removed by the next save). At most one save is in flight: save()
// first waits for and publishes the previous one.
// Memory: a host buffer of the bytes this rank writes (buffered_bytes()), kept from one save to the
// next: a fresh buffer's page faults would double the time save() blocks.
// Errors of the write (io_error naming the file) are raised by the poll(), wait() or save() that
// finishes it, on every rank alike; `latest` then stays on the previous checkpoint.
// save_shard writes a pipeline stage's shard likewise (checkpoints::save_shard's files); the
// publish then also writes the shards' index.
// The destructor waits for a write still running (its file may be complete) but does not
// publish: that needs every rank; call wait() before the end.
// MESHTENSOR_CHECKPOINT_TRACE=1 prints, besides the phases of checkpoints::save, "copied" (save
// returns) and "writing" (rank 0's thread starts); MESHTENSOR_CHECKPOINT_PAUSE_AT=writing holds
// rank 0's thread there 30 s while training goes on (the kill test kills it there).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../runtime/node.hpp"
#include "checkpoint.hpp"

namespace meshtensor::io {

namespace detail {
// What one rank writes of a file: bytes and where each run of them goes.
struct file_image {
  std::string path;
  std::vector<char> bytes;
  struct run {
    std::int64_t file_offset, at, count;  // bytes
  };
  std::vector<run> runs;
};

// Copies the pieces (destination, source, bytes) with `threads` threads, each about the same
// number of bytes: one core's copy is bounded by its own memory bandwidth, and the cores a rank
// does not use on its node would otherwise idle while training waits.
struct copy_piece {
  char* to;
  const char* from;
  std::int64_t count;
};
inline void copy_pieces(const std::vector<copy_piece>& pieces, int threads) {
  std::int64_t total = 0;
  for (const auto& p : pieces) total += p.count;
  constexpr std::int64_t min_per_thread = std::int64_t{4} << 20;
  threads = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, total / min_per_thread)));
  if (threads == 1) {
    for (const auto& p : pieces) std::memcpy(p.to, p.from, static_cast<std::size_t>(p.count));
    return;
  }
  // Thread t copies bytes [t total / threads, (t + 1) total / threads) of the pieces laid end to end.
  const auto share = [&](int t) {
    const std::int64_t lo = total * t / threads, hi = total * (t + 1) / threads;
    std::int64_t at = 0;
    for (const auto& p : pieces) {
      const std::int64_t b = std::max(lo, at), e = std::min(hi, at + p.count);
      if (b < e) std::memcpy(p.to + (b - at), p.from + (b - at), static_cast<std::size_t>(e - b));
      at += p.count;
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(share, t);
  share(0);
  for (auto& h : helpers) h.join();
}

// This rank's part of the safetensors file io::save would write for the set: the header (rank 0)
// and the boxes this rank writes, copied out of the tensors (with copy_threads threads).
// buffer: the bytes of an earlier image, reused (memory already touched copies fastest; a buffer of
// the same size is not even cleared).
inline file_image image_of(const tensor_set& set, const metadata& meta, const std::string& path,
                           std::vector<char> buffer = {}, int copy_threads = 1) {
  std::vector<std::int64_t> begins;
  const std::string preamble = file_preamble(set, meta, path, begins);
  const std::int64_t data_start = static_cast<std::int64_t>(preamble.size());
  int rank = 0;
  MPI_Comm_rank(set.comm(), &rank);
  file_image img;
  img.path = path;
  img.bytes = std::move(buffer);
  std::int64_t total = rank == 0 ? data_start : 0;
  for (const auto& e : set.entries())
    if (e.writes) total += e.local_elements() * e.elem_size;
  img.bytes.resize(static_cast<std::size_t>(total));
  std::int64_t at = 0;
  if (rank == 0) {
    std::memcpy(img.bytes.data(), preamble.data(), preamble.size());
    img.runs.push_back({0, 0, data_start});
    at = data_start;
  }
  // Slices in host memory are copied together at the end, the threads sharing all their bytes; a
  // device tensor's host copy lives only inside with_host_bytes, so its bytes are copied there.
  std::vector<copy_piece> resident;
  for (std::size_t i = 0; i < set.entries().size(); ++i) {
    const auto& e = set.entries()[i];
    if (!e.writes || e.local_elements() == 0) continue;
    e.with_host_bytes([&](const char* local) {
      std::vector<copy_piece> staged;
      for_each_run(e, [&](std::int64_t file, std::int64_t from, std::int64_t n) {
        img.runs.push_back({data_start + begins[i] + file * e.elem_size, at, n * e.elem_size});
        (e.host_resident ? resident : staged).push_back({img.bytes.data() + at, local + from * e.elem_size, n * e.elem_size});
        at += n * e.elem_size;
      });
      copy_pieces(staged, copy_threads);
    });
  }
  copy_pieces(resident, copy_threads);
  return img;
}

// Writes the image into its file (which exists) and syncs it; returns what went wrong, or "".
inline std::string write_image(const file_image& img) {
  const int fd = ::open(img.path.c_str(), O_WRONLY);
  if (fd < 0) return cat("cannot open '", img.path, "' to write it: ", std::strerror(errno));
  std::string problem;
  for (const auto& r : img.runs) {
    for (std::int64_t done = 0; done < r.count && problem.empty();) {
      const ssize_t n = ::pwrite(fd, img.bytes.data() + r.at + done, static_cast<std::size_t>(r.count - done),
                                 static_cast<off_t>(r.file_offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) problem = cat("cannot write ", r.count, " bytes at offset ", r.file_offset, " of '", img.path, "': ",
                                n < 0 ? std::strerror(errno) : "nothing written");
      else done += n;
    }
    if (!problem.empty()) break;
  }
  if (problem.empty() && ::fsync(fd) != 0) problem = cat("cannot sync '", img.path, "': ", std::strerror(errno));
  if (::close(fd) != 0 && problem.empty()) problem = cat("cannot close '", img.path, "': ", std::strerror(errno));
  return problem;
}
}  // namespace detail

class async_checkpoints : private checkpoints {
 public:
  using checkpoints::checkpoints;
  using checkpoints::current;
  using checkpoints::directory;
  using checkpoints::file_name;
  using checkpoints::file_of;
  using checkpoints::load;

  async_checkpoints(const async_checkpoints&) = delete;
  async_checkpoints& operator=(const async_checkpoints&) = delete;
  ~async_checkpoints() {
    if (flight_ && flight_->writer.joinable()) flight_->writer.join();
  }

  // Starts saving the set as checkpoint "step-<step>" and returns its name; it becomes current when
  // a later poll(), wait() or save() finds every rank's file written. Collective. The tensors may
  // change as soon as it returns.
  std::string save(const tensor_set& set, std::int64_t step, const metadata& meta = {}) {
    wait();
    const MPI_Comm comm = set.comm();
    auto& c = set.mesh_communicator();
    if (c.watched()) c.agree_or_throw<io_error>(true, {});  // as checkpoints::save: before unwatched agreements
    const meshtensor::detail::unpolled_region_deadline deadline(
        meshtensor::detail::cat("checkpoint save to '", directory(), "'"));
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    const std::string name = begin(comm, step, /*create_file=*/true);
    detail::trace_phase(rank, "begin", name);
    std::string problem;
    detail::file_image img;
    try {
      img = detail::image_of(set, meta, file_of_tmp(name), std::move(spare_), copy_threads(comm));
    } catch (const std::exception& e) {
      problem = e.what();
    }
    meshtensor::detail::agree_or_throw<io_error>(comm, problem.empty(), problem);
    auto f = std::make_unique<flight>();
    f->name = name;
    f->comm = comm;
    f->mesh = &c;
    f->image = std::move(img);
    take_off(std::move(f), rank, true);
    return name;
  }

  // A sharded save (checkpoints::save_shard: a pipeline stage's shard; the set may be empty),
  // written as save() writes: this rank's boxes copied, a thread writing them into the shard's file;
  // the poll, wait or save that finds every rank of whole done writes the index and publishes.
  // Collective over whole.
  std::string save_shard(const tensor_set& set, int shard, int shards, MPI_Comm whole, std::int64_t step,
                         const metadata& meta = {}) {
    wait();
    if (!set.empty())
      if (auto& c = set.mesh_communicator(); c.watched()) c.agree_or_throw<io_error>(true, {});
    const meshtensor::detail::unpolled_region_deadline deadline(
        meshtensor::detail::cat("checkpoint save to '", directory(), "'"));
    int rank = 0;
    MPI_Comm_rank(whole, &rank);
    const std::string name = begin(whole, step), file = shard_file_name(shard, shards);
    detail::trace_phase(rank, "begin", name);
    const std::string path = (std::filesystem::path(directory()) / (".tmp-" + name) / file).string();
    std::string problem;
    detail::file_image img;
    if (!set.empty()) {
      detail::on_root(set.comm(), [&] {  // the shard's file, before its processors' threads open it
        std::ofstream out(path, std::ios::trunc | std::ios::binary);
        if (!out) throw io_error(detail::cat("cannot create '", path, "'"));
        return std::string();
      });
      try {
        img = detail::image_of(set, meta, path, std::move(spare_), copy_threads(set.comm()));
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    meshtensor::detail::agree_or_throw<io_error>(whole, problem.empty(), problem);
    auto f = std::make_unique<flight>();
    f->name = name;
    f->comm = whole;
    f->shards = shard_listing(set, file);
    f->meta = meta;
    f->sharded = true;
    f->image = std::move(img);
    take_off(std::move(f), rank, !set.empty());
    return name;
  }

  // Publishes the save in flight if every rank's write is done; returns its name then. Collective
  // (a no-op when no save is in flight: every rank knows the same).
  std::optional<std::string> poll() {
    if (!flight_) return std::nullopt;
    int not_done = flight_->done.load(std::memory_order_acquire) ? 0 : 1;
    if (flight_->sharded) {
      // Over every stage (unwatched: a stage's own agreements and messages are, every step).
      MPI_Allreduce(MPI_IN_PLACE, &not_done, 1, MPI_INT, MPI_MAX, flight_->comm);
      if (not_done != 0) return std::nullopt;
    } else if (flight_->mesh->agree_max(not_done) != 0) {
      return std::nullopt;
    }
    return finish();
  }

  // Waits for the save in flight and publishes it; returns its name (nullopt: none in flight).
  // Collective.
  std::optional<std::string> wait() {
    if (!flight_) return std::nullopt;
    if (flight_->writer.joinable()) flight_->writer.join();  // (none for a shard of an empty set)
    return finish();
  }

  bool in_flight() const { return flight_ != nullptr; }
  // Host memory this rank holds for saves: the buffer of the last one, in flight or kept for the next.
  std::int64_t buffered_bytes() const {
    return static_cast<std::int64_t>(flight_ ? flight_->image.bytes.capacity() : spare_.capacity());
  }

 private:
  struct flight {
    std::string name;
    MPI_Comm comm = MPI_COMM_NULL;  // the set's, or a sharded save's whole
    bool sharded = false;
    std::string shards;             // a sharded save's listing (checkpoints::shard_listing)
    metadata meta;
    meshtensor::detail::communicator* mesh = nullptr;
    detail::file_image image;
    std::string problem;
    std::atomic<bool> done{false};
    std::thread writer;
  };

  // The save in flight from now: a thread writes its image (none where this rank writes nothing).
  void take_off(std::unique_ptr<flight> f, int rank, bool writes) {
    flight* raw = f.get();
    detail::trace_phase(rank, "copied", raw->name);  // before the thread's "writing": a paused write is the last line
    if (!writes) {
      raw->done.store(true, std::memory_order_release);
    } else {
      raw->writer = std::thread([raw, rank] {
        detail::trace_phase(rank, "writing", raw->name);
        raw->problem = detail::write_image(raw->image);
        raw->done.store(true, std::memory_order_release);
      });
    }
    flight_ = std::move(f);
  }

  // The copy's threads: this node's cores shared among its ranks (MPI_COMM_TYPE_SHARED; once).
  int copy_threads(MPI_Comm comm) {
    if (copy_threads_ == 0) {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      copy_threads_ = std::clamp(cores / std::max(1, node_place_of(comm).size), 1, 8);
    }
    return copy_threads_;
  }

  std::string file_of_tmp(const std::string& name) const {
    return (std::filesystem::path(directory()) / (".tmp-" + name) / file_name).string();
  }

  std::string finish() {
    if (flight_->writer.joinable()) flight_->writer.join();
    const std::unique_ptr<flight> f = std::move(flight_);  // gone whatever happens next
    spare_ = std::move(f->image.bytes);
    int rank = 0;
    MPI_Comm_rank(f->comm, &rank);
    meshtensor::detail::agree_or_throw<io_error>(f->comm, f->problem.empty(), f->problem);
    detail::trace_phase(rank, "written", f->name);
    const meshtensor::detail::unpolled_region_deadline deadline(
        meshtensor::detail::cat("checkpoint publish in '", directory(), "'"));
    if (f->sharded) publish_shards(f->comm, f->name, f->shards, f->meta);
    else publish(f->comm, f->name);
    return f->name;
  }

  std::unique_ptr<flight> flight_;
  std::vector<char> spare_;
  int copy_threads_ = 0;
};

}  // namespace meshtensor::io
