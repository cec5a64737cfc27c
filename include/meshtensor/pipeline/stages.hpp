#pragma once
// Pipeline parallelism: a model's layers split over stages, microbatches flowing through them.
//
// The processors form a mesh [stages x ...M's axes]: world ranks in consecutive blocks of
// M's size, one block per stage, each block a mesh M (data and model parallelism inside a stage, as
// any layout of M says). A stage's tensors live on its block's mesh; between neighbouring stages
// each processor sends its local slice to the processor at the same coordinates of the next (or
// previous) stage, which holds the same slice of the same layout: one point-to-point send per
// processor, counted on the sending mesh as collective::send (no axes), planned like every
// collective.
//
// Why a list of blocks per stage and explicit sends, rather than GSPMD's stacked `layers` dim with a
// shift between neighbours: in a single SPMD program every stage computes every slot of every step
// (the bubble is computed on padding, not idle), and the tape differentiates the whole unrolled
// loop at once, which is GPipe and only GPipe (every microbatch's activations held). Running each
// stage's own forward and backward per microbatch, in the order a schedule value says
// (pipeline/schedules.hpp), gives 1F1B, interleaved stages and zero-bubble schedules as well,
// holds only the microbatches in flight, and lets a stage idle (and be measured idle) in the bubble.
//
//   pl::stages<grid> st(env.world(), 4, {2, 1});           // 4 stages of [2 x 1]
//   auto stats = pl::run(pl::zb_h1_schedule(4, m), st, my_stage);  // or any of schedules.hpp
//
// run() needs a Stage with: `using activation = tensor type`, `activation::extents_type
// extents(int microbatch)`, `activation forward(int microbatch, const activation* in)` (in is null
// on the first stage: it reads its own input; with several chunks per stage `forward(int chunk, int
// microbatch, const activation* in)`, in null on the model's first part), `tensor<rank 0> loss(int
// microbatch, const activation& out)` (the last part: this microbatch's share of the step's loss),
// `params()` (a tuple of references, as optimizers take: all of the stage's chunks) and
// `step_gradients(grads)` (the tuple gradient() would return for them: the step's, summed over its
// microbatches; called once per step).
#include <mpi.h>

#include <any>
#include <map>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../autodiff/gradient.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/partial_sum.hpp"
#include "../runtime/watchdog.hpp"
#include "../tensor/mpi_buffer.hpp"
#include "../autodiff/split_backward.hpp"
#include "schedules.hpp"

namespace meshtensor::pipeline {

// What a message between stages carries: named in the watchdog's line when it does not arrive.
struct message {
  int microbatch = 0;
  int part = 0;  // the part the activations enter, or the part the gradient leaves
  bool gradient = false;
};
inline std::string to_string(const message& m) {
  return m.gradient ? detail::cat("the gradient of microbatch ", m.microbatch, " leaving part ", m.part)
                    : detail::cat("the activations of microbatch ", m.microbatch, " entering part ", m.part);
}

// Under the watchdog (MESHTENSOR_COLLECTIVE_TIMEOUT, runtime/watchdog.hpp) a stage's receives and
// its sends' completions are awaited as a collective is: past the time limit the job ends with a
// line naming the stage, the message and the peer, and whether the peer waits elsewhere or does
// not answer at all. Their waits count as waiting (communicator::collective_seconds), not as work.
template <class M>
class stages {
 public:
  // count stages of `sizes` each over the ranks of world (its size must be count * product(sizes)).
  stages(MPI_Comm world, int count, std::array<int, M::ndims> sizes) : count_(count) {
    int n = 0, rank = 0;
    MPI_Comm_size(world, &n);
    MPI_Comm_rank(world, &rank);
    int per_stage = 1;
    for (int s : sizes) per_stage *= s;
    if (count < 1 || per_stage < 1 || n != count * per_stage)  // the same on every rank: no agreement needed
      throw shape_error(detail::cat("pipeline::stages: ", count, " stages of ", per_stage, " processors need ",
                                    count * per_stage, " ranks; the communicator has ", n));
    index_ = rank / per_stage;
    MPI_Comm whole = MPI_COMM_NULL;
    MPI_Comm_dup(world, &whole);
    whole_ = owned(whole);
    per_stage_ = per_stage;
    position_ = rank % per_stage;
    MPI_Comm block = MPI_COMM_NULL, across = MPI_COMM_NULL;
    MPI_Comm_split(world, index_, rank, &block);
    MPI_Comm_split(world, rank % per_stage, index_, &across);
    across_ = owned(across);
    mesh_ = M(block, sizes);
    MPI_Comm_free(&block);  // the mesh keeps its own (Cartesian) communicator
    if (meshtensor::detail::collective_timeout() > 0) {
      MPI_Comm watch = MPI_COMM_NULL;
      MPI_Comm_dup(world, &watch);
      meshtensor::detail::pipeline_watch() = watch;
      watch_ = owned(watch, true);
    }
  }
  // Stage `index` of `count`, its mesh planned at coords: no processes, sends only counted.
  static stages planned(int count, int index, std::array<int, M::ndims> sizes, std::array<int, M::ndims> coords = {}) {
    stages s;
    if (count < 1 || index < 0 || index >= count)
      throw shape_error(detail::cat("pipeline::stages::planned: stage ", index, " of ", count));
    s.count_ = count;
    s.index_ = index;
    s.mesh_ = M::planned(sizes, coords);
    return s;
  }

  int index() const { return index_; }
  int count() const { return count_; }
  bool first() const { return index_ == 0; }
  bool last() const { return index_ == count_ - 1; }
  const M& mesh() const { return mesh_; }
  // Every processor of every stage (a copy of the communicator the stages were made from): a
  // pipeline's checkpoint is saved over it (io::checkpoints::save_shard). MPI_COMM_NULL when planned.
  MPI_Comm whole() const { return whole_ ? *whole_ : MPI_COMM_NULL; }
  bool planned() const { return mesh_.is_planned(); }

  // t's local slice to the same processor of stage `to`, started now; finished by wait_sends().
  template <Tensor T>
  void send(const T& t, int to, int tag, const message& what = {}) {
    using buffer_t = meshtensor::detail::mpi_buffer<typename T::execution_space, typename T::value_type>;
    const std::int64_t n = t.local_size();
    std::shared_ptr<buffer_t> buffer;
    // A plan starts nothing below; its buffer still counts the run's wait for the device.
    if (planned()) (void)buffer_t::reading(t.view());
    // Its wait stays off the plan's timeline: the next stage's receive waits for the transfer, so
    // the cost model charges all of it (plan/timeline.hpp).
    const MPI_Request r =
        mesh_.communicator()
            .start({collective::send, axis_set{}, n * static_cast<std::int64_t>(sizeof(typename T::value_type))},
                   [&](MPI_Request* request) {
                     buffer = std::make_shared<buffer_t>(buffer_t::reading(t.view()));
                     MPI_Isend(buffer->data(), detail::checked_count(n), detail::mpi_type<typename T::value_type>(), to,
                               tag, *across_, request);
                   })
            .request;
    // Only the buffer MPI reads is kept, not t: through its tape node t holds the microbatch's
    // whole forward graph, which would stay alive until wait_sends() (every microbatch, as GPipe).
    if (buffer) pending_.push_back({r, std::move(buffer), to, what});
    reap_sends();
  }
  // Drops the buffers of the sends that have finished, so that a stage holds only those in flight.
  void reap_sends() {
    std::erase_if(pending_, [](in_flight& p) {
      int done = 0;
      MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
  }
  // The slice that stage `from` sent with `tag`, as a tensor of type T and global extents ext.
  template <Tensor T>
  T receive(int from, int tag, const typename T::extents_type& ext, const message& what = {}) {
    T out(mesh_, ext, uninitialized);
    const auto into = meshtensor::detail::mpi_buffer<typename T::execution_space, typename T::value_type>::receiving_into(out.view());
    if (planned()) return out;  // the wait for the device above counted
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Irecv(into.data(), detail::checked_count(out.local_size()), detail::mpi_type<typename T::value_type>(), from, tag,
              *across_, &request);
    await(&request, from, false, what);
    into.copy_into(out.view());
    // While this rank waited, the peers may have taken what it sent: their buffers go before the
    // pass that follows allocates.
    reap_sends();
    return out;
  }
  void wait_sends() {
    for (auto& p : pending_) await(&p.request, p.to, true, p.what);
    pending_.clear();
  }
  // The largest of the ranks' values over the whole pipeline (a step's stop request, which every
  // stage must honour after the same step): the stage's agreement (communicator::agree_max), then
  // one allreduce among the ranks at this rank's place in each stage, watched like a message.
  int agree_max(int mine) {
    int largest = mesh_.communicator().agree_max(mine);
    if (planned() || count_ == 1) return largest;
    MPI_Request request = MPI_REQUEST_NULL;
    int in = largest;
    MPI_Iallreduce(&in, &largest, 1, MPI_INT, MPI_MAX, *across_, &request);
    std::vector<int> members;
    for (int s = 0; s < count_; ++s) members.push_back(s * per_stage_ + position_);
    // Every rank agrees in the same order: one sequence for all, apart from the messages' (>= 0).
    wait_for(&request, members, -1 - agreements_++, [&] {
      return detail::cat("stage ", index_, "'s agreement with the other stages (a step's stop request)");
    });
    return largest;
  }
  // Every rank's values of the whole pipeline, n per rank in rank order (the straggler report's):
  // bookkeeping, not counted; watched like a message. A planned stage: mine.
  std::vector<double> gather_bookkeeping(const std::vector<double>& mine) {
    if (planned()) return mine;
    int size = 0;
    MPI_Comm_size(*whole_, &size);
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size));
    MPI_Request request = MPI_REQUEST_NULL;
    const int n = static_cast<int>(mine.size());
    MPI_Iallgather(mine.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, *whole_, &request);
    std::vector<int> members(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) members[static_cast<std::size_t>(r)] = r;
    wait_for(&request, members, -1 - agreements_++, [&] {
      return detail::cat("stage ", index_, "'s gathering of every stage's times (the slow-rank report)");
    });
    return all;
  }
  ~stages() {
    if (!planned()) wait_sends();
  }
  stages(stages&&) = default;
  stages& operator=(stages&&) = default;

 private:
  stages() = default;
  // c, freed with the last copy of the stages (unless MPI has finalized); the pipeline's watch
  // communicator is unregistered then too.
  static std::shared_ptr<MPI_Comm> owned(MPI_Comm c, bool pipeline_watch = false) {
    return std::shared_ptr<MPI_Comm>(new MPI_Comm(c), [pipeline_watch](MPI_Comm* p) {
      if (pipeline_watch && meshtensor::detail::pipeline_watch() == *p)
        meshtensor::detail::pipeline_watch() = MPI_COMM_NULL;
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(p);
      delete p;
    });
  }
  struct in_flight {
    MPI_Request request;
    std::any buffer;  // the mpi_buffer the send reads (the tensor's data, or a staged copy of it)
    int to = 0;
    message what;
  };
  // Waits for a receive from stage `peer` or a send to it (its rank in watch_: the same place in
  // that stage), named as the message it carries if the watchdog's limit runs out.
  void await(MPI_Request* request, int peer, bool sending, const message& what) {
    const int peer_rank = peer * per_stage_ + position_;
    int me = 0, size = 1;
    if (watch_) {
      MPI_Comm_rank(*watch_, &me);
      MPI_Comm_size(*watch_, &size);
    }
    // Unique to this rank and message: a peer's ticket never reads as "waiting in this very one".
    wait_for(request, {me, peer_rank}, messages_++ * size + me, [&] {
      const int peer_world = meshtensor::detail::translate_ranks(*watch_, {peer_rank}, MPI_COMM_WORLD)[0];
      return detail::cat("stage ", index_, "'s ", sending ? "send of " : "receive of ", to_string(what),
                         sending ? " to stage " : " from stage ", peer, " (rank ", peer_world, ")");
    });
  }
  // Waits for request, timed as waiting; under the watchdog polled with its time limit among the
  // members (ranks of watch_), what() naming the wait if it runs out (watchdog.hpp).
  template <class What>
  void wait_for(MPI_Request* request, const std::vector<int>& members, std::int64_t sequence, What what) {
    auto& comm = mesh_.communicator();
    comm.timed([&] {
      if (!watch_) {
        MPI_Wait(request, MPI_STATUS_IGNORE);
        return;
      }
      meshtensor::detail::await_collective(
          request, 1, members, *watch_, meshtensor::detail::watch_ticket{meshtensor::detail::pipeline_message_mask, sequence},
          what,
          [](const meshtensor::detail::watch_ticket& other) {
            return other.mask == meshtensor::detail::pipeline_message_mask
                       ? std::string("for another pipeline message")
                       : std::string("in a collective inside its stage");
          },
          comm.watch_comm());
    });
  }
  int count_ = 1, index_ = 0, per_stage_ = 1, position_ = 0;
  M mesh_;
  std::shared_ptr<MPI_Comm> across_, whole_, watch_;
  std::int64_t messages_ = 0, agreements_ = 0;
  std::vector<in_flight> pending_;
};

// What one stage did in a step.
struct stage_stats {
  double busy_seconds = 0;   // in its forward and backward passes
  double total_seconds = 0;  // from the step's start to its last send finished
  int max_in_flight = 0;     // microbatches whose activations it held at once
  double bubble() const { return total_seconds > 0 ? 1.0 - busy_seconds / total_seconds : 0.0; }
};

// sum(y * g): its gradient with respect to y is g, so gradient() of it carries g back through the
// stage. Only its gradient is used: each processor's own term of the sum (einsum_partial's addend)
// has the same gradient on its slice of y, without the allreduce the sum's value would cost.
template <Tensor X>
auto inner_product_objective(const X& y, const X& g) {
  return einsum_partial<>(y, g).addend();
}

// One step of stage st.index() as the schedule says (pipeline/schedules.hpp): a stage holds
// schedule.chunks parts of the model, part k = schedule.part(stage, chunk). A forward (F) of part
// k receives part k - 1's output and sends its own to part k + 1's stage; a backward receives the
// gradient of its output, differentiates the part (the loss on the last part; elsewhere the
// output's inner product with that gradient) and sends the gradient of its input back. A fused
// backward (BW) adds the weights' gradients at once (accumulate_gradient); a split one computes the
// input's gradient (B, accumulate_input_gradient), sends it at once, and leaves the weights' to the
// W the schedule places later, which holds until then only what it reads
// (autodiff/split_backward.hpp). The weights' gradients add up over the microbatches
// (data-parallel partial sums reduced once per step, not once per microbatch) and reach
// stage.step_gradients once, at the end. Under gradient_reduction's overlap the stage's last fused
// backward starts their reductions as it makes them final (accumulate_gradient_reducing), so that
// they run behind the rest of that pass and the sending of its input's gradient, and are finished
// at the end (Megatron's overlapped gradient reduction). Split backwards reduce at the end.
//
// With one chunk the Stage's forward is forward(microbatch, in) (in null on the first stage); with
// several it is forward(chunk, microbatch, in) (in null on part 0), and loss() is asked of the last
// part's holder. Tags: 2 k for the activations entering part k, 2 k + 1 for the gradients leaving
// it, whatever the microbatch: every schedule runs a chunk's forwards, and its backwards, in
// microbatch order (checked), and MPI delivers the messages of one sender and tag in the order
// they were sent, so the microbatches need no tags of their own (a tag per microbatch and part ran
// out of MPI's guaranteed 32767 at 512 microbatches of 64 parts).
template <class M, class Stage>
stage_stats run(const step_schedule& schedule, stages<M>& st, Stage& stage) {
  using X = typename Stage::activation;
  using clock = std::chrono::steady_clock;
  constexpr bool chunked = requires(Stage& s, const X* in) { s.forward(0, 0, in); };
  if (schedule.stages != st.count())
    throw error(detail::cat("pipeline::run: schedule ", schedule.name, " is laid out for ", schedule.stages,
                            " stages; the pipeline has ", st.count()));
  if (!chunked && schedule.chunks > 1)
    throw error(detail::cat("pipeline::run: schedule ", schedule.name, " gives each stage ", schedule.chunks,
                            " chunks of the model, and the stage's forward takes no chunk: give it "
                            "forward(chunk, microbatch, in)"));
  const int parts = schedule.parts();
  if (2 * parts > 32767)  // the tag bound every MPI guarantees
    throw error(detail::cat("pipeline::run: ", parts, " parts need tags up to ", 2 * parts, "; MPI guarantees 32767"));
  const auto tag = [](int part) { return 2 * part; };
  validate(schedule);  // the whole schedule, on every stage: all refuse it, or none
  const auto& items = schedule.at(st.index());
  stage_stats stats;
  stats.max_in_flight = peak_activations(items);
  struct held {
    std::optional<X> in, out;
    std::optional<weight_pass> weights;
  };
  std::map<std::pair<int, int>, held> live;  // by (microbatch, chunk)
  // The last backward, if fused (nothing adds to the weights' gradients after it), reduces as it
  // goes where the reduction is started nonblocking; blocking, it would hold the input's gradient,
  // which the stage before waits for, behind the allreduce.
  std::size_t last_fused_backward = items.size();
  for (std::size_t i = 0; i < items.size(); ++i)
    if (items[i].kind != pass::F) last_fused_backward = i;
  if (last_fused_backward < items.size() &&
      (items[last_fused_backward].kind != pass::BW || !gradient_reduction_settings().overlap))
    last_fused_backward = items.size();
  std::function<void()> finish_reductions;  // those the last fused backward started
  const auto t0 = clock::now();
  const auto busy = [&](auto&& f) {
    const auto b = clock::now();
    f();
    stats.busy_seconds += std::chrono::duration<double>(clock::now() - b).count();
  };
  for (std::size_t at = 0; at < items.size(); ++at) {
    const work_item& item = items[at];
    st.reap_sends();  // a finished send's buffer goes before the next pass allocates
    const int mb = item.microbatch, k = schedule.part(st.index(), item.chunk);
    const bool first_part = k == 0, last_part = k == parts - 1;
    auto& h = live[{mb, item.chunk}];
    const auto ext = stage.extents(mb);
    if (item.kind == pass::F) {
      if (!first_part) {
        h.in = st.template receive<X>(schedule.holder(k - 1).first, tag(k), ext, {mb, k, false});
        h.in->requires_grad();
      }
      busy([&] {
        const X* in = h.in ? &*h.in : nullptr;
        if constexpr (chunked) h.out = stage.forward(item.chunk, mb, in);
        else h.out = stage.forward(mb, in);
      });
      if (!last_part) st.send(*h.out, schedule.holder(k + 1).first, tag(k + 1), {mb, k + 1, false});
      continue;
    }
    if (item.kind == pass::W) {  // validate() saw its B run before it
      busy([&] { h.weights->run(); });
      live.erase({mb, item.chunk});
      continue;
    }
    std::optional<X> grad_out;
    if (!last_part) grad_out = st.template receive<X>(schedule.holder(k + 1).first, tag(k + 1) + 1, ext, {mb, k + 1, true});
    // The last part's loss is float; another's objective has its activation's element type.
    const auto differentiate = [&](const auto& objective) {
      std::apply(
          [&](auto&... p) {
            if (item.kind == pass::BW && at == last_fused_backward) {
              auto reducing = first_part ? accumulate_gradient_reducing(objective, std::tuple<>{}, p...)
                                         : accumulate_gradient_reducing(objective, std::tie(*h.in), p...);
              finish_reductions = [reducing] { reducing->finish(); };
            } else if (item.kind == pass::BW) {
              if (first_part) accumulate_gradient(objective, p...);
              else accumulate_gradient(objective, *h.in, p...);
            } else if (first_part) {
              h.weights = accumulate_input_gradient(objective, std::tuple<>{}, p...);
            } else {
              h.weights = accumulate_input_gradient(objective, std::tie(*h.in), p...);
            }
          },
          stage.params());
      if (!first_part) {
        auto [grad_in] = take_gradients(*h.in);
        st.send(grad_in, schedule.holder(k - 1).first, tag(k) + 1, {mb, k, true});
      }
    };
    busy([&] {
      if (last_part) differentiate(stage.loss(mb, *h.out));
      else differentiate(inner_product_objective(*h.out, *grad_out));
    });
    // The activations go; a split backward's W keeps what it reads.
    if (item.kind == pass::BW) {
      live.erase({mb, item.chunk});
    } else {
      h.in.reset();
      h.out.reset();
    }
  }
  // The weights' gradients, partial sums over the stage's data axes until now: reduced once per step.
  busy([&] {
    if (finish_reductions) finish_reductions();
    stage.step_gradients(std::apply([](auto&... p) { return take_gradients(p...); }, stage.params()));
  });
  st.wait_sends();
  stats.total_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return stats;
}

}  // namespace meshtensor::pipeline
