// A decoder-only Transformer language model with Mesh-TensorFlow's dims (batch, length, d_model,
// heads, d_kv, d_ff, vocab), byte-level (vocab = 256), trained on a text that Debian ships (by
// default /usr/share/common-licenses/GPL-3, from the base-files package).
//
// Layouts on a 2-D mesh [rows x cols], chosen with --layout:
//   data   batch over rows and cols (pure data parallelism: weight gradients allreduce over both)
//   model  vocab, heads and d_ff over rows and cols (model parallelism as in the Mesh-TensorFlow
//          paper: attention and feed-forward outputs and the logits' softmax allreduce over both)
//   2d     batch over rows; vocab, heads and d_ff over cols (both at once)
// Parameters are initialised from counter-based random numbers and dropout masks are functions of
// (seed, step, global index), so every layout computes the same model: --compare-layouts trains
// each layout in turn from the same start on the same batches and checks their losses agree.
//
//   mpiexec -n 4 transformer_lm [--layout 2d] [--steps 300] [--csv loss.csv]
//   mpiexec -n 4 transformer_lm --compare-layouts --steps 20
//
// --vocab V (default 256, bytes) above 256 makes the token at position p the byte pair
// (text[p] * 256 + text[p+1]) mod V (below 256: text[p] mod V). --dump DIR writes the initial
// weights, the first batch, its loss and the gradients of that loss to DIR as .npy files (for
// examples/transformer_lm/torch_reference.py, which recomputes them with PyTorch). --warmup W
// prints the median time of the steps after the first W; --memory prints the bytes of the
// parameters and the Adam state on each rank, and the peak resident set size.
//
// Checkpoints (docs/checkpoints.md): --checkpoint DIR --save-every N saves the parameters, the
// optimizer's state and step count, the step and the data position every N steps (a safetensors
// file per checkpoint, written by all ranks in parallel, made current atomically). --resume DIR
// continues from DIR's current checkpoint up to --steps, under any layout and rank count: on the
// same layout the losses equal those of an uninterrupted run bit for bit.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iomanip>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <random>
#include <sys/resource.h>

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct length : mt::dim<"length"> {};
struct memory_length : mt::dim<"memory_length"> {};
struct d_model : mt::dim<"d_model"> {};
struct heads : mt::dim<"heads"> {};
struct d_kv : mt::dim<"d_kv"> {};
struct d_ff : mt::dim<"d_ff"> {};
struct vocab : mt::dim<"vocab"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using layout_model = mt::layout<grid, mt::split<vocab, rows, cols>, mt::split<heads, rows, cols>,
                                mt::split<d_ff, rows, cols>>;
using layout_2d = mt::layout<grid, mt::split<batch, rows>, mt::split<vocab, cols>, mt::split<heads, cols>,
                             mt::split<d_ff, cols>>;

struct options {
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string layout = "2d";
  std::array<int, 2> mesh{2, 2};
  std::int64_t steps = 300, batch = 8, length = 64, d_model = 64, heads = 4, d_kv = 16, d_ff = 256;
  double lr = 2e-3, dropout = 0.0;
  std::string optimizer = "adam";
  std::uint64_t seed = 1;
  int log_every = 25;
  std::string csv = "transformer_lm_loss.csv";
  bool compare = false;
  double tolerance = 1e-4;
  std::int64_t vocab = 256;
  std::string dump;
  std::int64_t warmup = -1;
  bool memory = false;
  std::string checkpoint, resume;
  std::int64_t save_every = 0;
};
constexpr int n_layers = 2;

// The parameter names, in the order of model::tie().
std::vector<std::string> param_names() {
  std::vector<std::string> names{"embedding", "positions"};
  for (int b = 0; b < n_layers; ++b)
    for (const char* n : {"ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias", "w_in", "w_out"})
      names.push_back("blocks." + std::to_string(b) + "." + n);
  for (const char* n : {"lnf_scale", "lnf_bias", "softmax_weights"}) names.push_back(n);
  return names;
}

// A float32 array in NumPy's .npy format (version 1.0, little-endian, C order).
void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<std::int64_t>& shape) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (auto e : shape) header += std::to_string(e) + ", ";
  header += "), }";
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw mt::io_error(mt::detail::cat("cannot write '", path, "'"));
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const unsigned char le[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  out.write(reinterpret_cast<const char*>(le), 2);
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) throw mt::io_error(mt::detail::cat("cannot write '", path, "'"));
}

// Gathers t to rank 0, which writes it to path. Collective.
template <class T>
void dump_tensor(const T& t, const std::string& path) {
  const auto full = mt::gather(t);
  if (t.mesh().rank() != 0) return;
  const auto ext = t.extents();
  write_npy(path, full, std::vector<std::int64_t>(ext.begin(), ext.end()));
}

template <class L>
struct model {
  template <class... D>
  using t = mt::tensor<float, L, D...>;
  struct block {
    t<d_model> ln1_scale, ln1_bias;
    t<d_model, heads, d_kv> wq, wk, wv;
    t<heads, d_kv, d_model> wo;
    t<d_model> ln2_scale, ln2_bias;
    t<d_model, d_ff> w_in;
    t<d_ff, d_model> w_out;
    auto tie() { return std::tie(ln1_scale, ln1_bias, wq, wk, wv, wo, ln2_scale, ln2_bias, w_in, w_out); }
  };
  t<vocab, d_model> embedding;
  t<length, d_model> positions;
  std::array<block, n_layers> blocks;
  t<d_model> lnf_scale, lnf_bias;
  t<d_model, vocab> softmax_weights;

  auto tie() {
    return std::tuple_cat(std::tie(embedding, positions), blocks[0].tie(), blocks[1].tie(),
                          std::tie(lnf_scale, lnf_bias, softmax_weights));
  }

  model(const grid& g, const options& o) {
    std::uint64_t s = o.seed * 1000;
    const std::int64_t dm = o.d_model, h = o.heads, kv = o.d_kv, ff = o.d_ff;
    embedding = mt::random_normal<decltype(embedding)>(g, {o.vocab, dm}, s++, 0, 0.3);
    positions = mt::random_normal<decltype(positions)>(g, {o.length, dm}, s++, 0, 0.1);
    for (auto& b : blocks) {
      b.ln1_scale = mt::full<t<d_model>>(g, {dm}, 1.0f);
      b.ln1_bias = mt::zeros<t<d_model>>(g, {dm});
      b.wq = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {dm, h, kv}, s++);
      b.wk = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {dm, h, kv}, s++);
      b.wv = nn::normal_fan_in<t<d_model, heads, d_kv>, d_model>(g, {dm, h, kv}, s++);
      b.wo = nn::normal_fan_in<t<heads, d_kv, d_model>, heads, d_kv>(g, {h, kv, dm}, s++);
      b.ln2_scale = mt::full<t<d_model>>(g, {dm}, 1.0f);
      b.ln2_bias = mt::zeros<t<d_model>>(g, {dm});
      b.w_in = nn::normal_fan_in<t<d_model, d_ff>, d_model>(g, {dm, ff}, s++);
      b.w_out = nn::normal_fan_in<t<d_ff, d_model>, d_ff>(g, {ff, dm}, s++);
    }
    lnf_scale = mt::full<t<d_model>>(g, {dm}, 1.0f);
    lnf_bias = mt::zeros<t<d_model>>(g, {dm});
    softmax_weights = nn::normal_fan_in<t<d_model, vocab>, d_model>(g, {dm, o.vocab}, s++);
    std::apply([](auto&... p) { (p.requires_grad(), ...); }, tie());
  }

  // Mean next-byte cross-entropy of a batch.
  auto loss(const t<batch, length>& ids, const t<batch, length>& labels, const options& o, std::uint64_t step) const {
    const std::uint64_t dseed = o.seed * 7919;
    auto x = nn::embedding<vocab>(embedding, ids) + positions;  // [batch, length, d_model]
    int site = 0;
    for (const auto& b : blocks) {
      const auto h = nn::layer_norm<d_model>(x, b.ln1_scale, b.ln1_bias);
      x = x + nn::dropout(nn::causal_attention<length, memory_length, d_model, heads, d_kv>(h, b.wq, b.wk, b.wv, b.wo),
                          o.dropout, dseed + site++, step);
      const auto f = nn::layer_norm<d_model>(x, b.ln2_scale, b.ln2_bias);
      x = x + nn::dropout(nn::feed_forward<d_model, d_ff>(f, b.w_in, b.w_out), o.dropout, dseed + site++, step);
    }
    const auto logits = nn::dense<d_model, vocab>(nn::layer_norm<d_model>(x, lnf_scale, lnf_bias), softmax_weights);
    return mt::reduce_mean<batch, length>(nn::softmax_cross_entropy<vocab>(logits, labels));
  }
};

std::vector<unsigned char> read_text(const std::string& path, std::int64_t need) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mt::io_error(mt::detail::cat("cannot open '", path, "'"));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(bytes.size()) < need)
    throw mt::io_error(mt::detail::cat("'", path, "' has ", bytes.size(), " bytes; at least ", need,
                                       " are needed for sequences of this length"));
  return bytes;
}

// The model's hyperparameters, stored with a checkpoint and checked on resume.
mt::io::metadata run_config(const options& o) {
  return {{"d_model", std::to_string(o.d_model)}, {"heads", std::to_string(o.heads)},
          {"d_kv", std::to_string(o.d_kv)},       {"d_ff", std::to_string(o.d_ff)},
          {"vocab", std::to_string(o.vocab)},     {"batch", std::to_string(o.batch)},
          {"length", std::to_string(o.length)},   {"layers", std::to_string(n_layers)},
          {"seed", std::to_string(o.seed)},       {"optimizer", o.optimizer},
          {"dropout", mt::detail::cat(o.dropout)}, {"lr", mt::detail::cat(o.lr)}};
}

// The parameters and the chosen optimizer's state, by name, for checkpoints.
template <class L>
mt::io::tensor_set training_state(model<L>& m, mt::optim::adam& adam, mt::optim::adafactor& adafactor,
                                  const options& o) {
  mt::io::tensor_set set;
  auto params = m.tie();
  const auto names = param_names();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (set.add(names[I], std::get<I>(params)), ...);
  }(std::make_index_sequence<std::tuple_size_v<decltype(params)>>{});
  if (o.optimizer == "adafactor") mt::io::add_optimizer_state(set, adafactor, params, names);
  else mt::io::add_optimizer_state(set, adam, params, names);
  return set;
}

// Trains one layout; returns the loss of every step (the same on every rank) from first_step on.
template <class L>
std::vector<double> train(const grid& g, const options& o, const std::vector<unsigned char>& text, bool verbose,
                          std::int64_t* first_step = nullptr) {
  using ids_t = mt::tensor<float, L, batch, length>;
  model<L> m(g, o);
  mt::optim::adam adam({.lr = o.lr, .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9});
  mt::optim::adafactor adafactor({.lr = o.lr});
  std::mt19937_64 rng(o.seed);  // the same batches on every rank and in every layout
  std::uniform_int_distribution<std::int64_t> start(0, static_cast<std::int64_t>(text.size()) - o.length - 2);
  std::int64_t step0 = 0;
  if (!o.resume.empty()) {
    auto state = training_state(m, adam, adafactor, o);
    const mt::io::checkpoints from(o.resume);
    const auto meta = from.load(state);
    for (const auto& [k, v] : run_config(o))
      if (k != "lr" && k != "dropout" && (!meta.count(k) || meta.at(k) != v))
        throw mt::io_error(mt::detail::cat("--resume ", o.resume, ": the checkpoint has ", k, " = ",
                                           meta.count(k) ? meta.at(k) : "(none)", ", this run ", v));
    step0 = std::stoll(meta.at("step"));
    const auto opt_steps = std::stoll(meta.at("optimizer.steps"));
    if (o.optimizer == "adafactor") adafactor.set_steps(opt_steps);
    else adam.set_steps(opt_steps);
    // The data position: the batches drawn so far are drawn again, so the next are the same.
    for (std::int64_t k = 0, n = std::stoll(meta.at("data_position")); k < n; ++k) (void)start(rng);
    if (verbose && g.rank() == 0)
      std::printf("resumed from %s at step %lld (saved on %s ranks, layout %s)\n", o.resume.c_str(), (long long)step0,
                  meta.at("ranks").c_str(), meta.at("layout").c_str());
  }
  if (first_step) *first_step = step0;
  std::int64_t drawn = step0 * o.batch;
  const auto token = [&](std::int64_t p) -> float {
    if (o.vocab <= 256) return static_cast<float>(text[p] % o.vocab);
    return static_cast<float>((std::int64_t{text[p]} * 256 + text[p + 1]) % o.vocab);
  };
  std::vector<double> step_seconds;
  std::vector<float> ids(static_cast<std::size_t>(o.batch * o.length)), labels(ids.size());
  std::vector<double> losses;
  const bool root = g.rank() == 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto tlog = t0, tlast = t0;
  for (std::int64_t step = step0; step < o.steps; ++step) {
    for (std::int64_t b = 0; b < o.batch; ++b, ++drawn) {
      const std::int64_t s = start(rng);
      for (std::int64_t l = 0; l < o.length; ++l) {
        ids[b * o.length + l] = token(s + l);
        labels[b * o.length + l] = token(s + l + 1);
      }
    }
    const auto x = mt::from_host<ids_t>(g, {o.batch, o.length}, ids);
    const auto y = mt::from_host<ids_t>(g, {o.batch, o.length}, labels);
    const auto loss = m.loss(x, y, o, static_cast<std::uint64_t>(step));
    auto params = m.tie();
    auto grads = std::apply([&](auto&... p) { return mt::gradient(loss, p...); }, params);
    if (step == 0 && !o.dump.empty()) {
      const auto names = param_names();
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (dump_tensor(std::get<I>(params), o.dump + "/param." + names[I] + ".npy"), ...);
        (dump_tensor(std::get<I>(grads), o.dump + "/grad." + names[I] + ".npy"), ...);
      }(std::make_index_sequence<std::tuple_size_v<decltype(grads)>>{});
      dump_tensor(x, o.dump + "/ids.npy");
      dump_tensor(y, o.dump + "/labels.npy");
      if (root) {
        write_npy(o.dump + "/loss.npy", {mt::detail::host_view(loss.view())(0)}, {});
        std::ofstream cfg(o.dump + "/config.txt");
        cfg << "layout " << o.layout << "\nranks " << g.nprocs() << "\nbatch " << o.batch << "\nlength " << o.length
            << "\nd_model " << o.d_model << "\nheads " << o.heads << "\nd_kv " << o.d_kv << "\nd_ff " << o.d_ff
            << "\nvocab " << o.vocab << "\nlayers " << n_layers << "\n";
        std::printf("dumped the initial weights, the first batch, its loss and gradients to %s\n", o.dump.c_str());
      }
    }
    if (o.optimizer == "adafactor") adafactor.step(params, grads);
    else adam.step(params, grads);
    losses.push_back(mt::detail::host_view(loss.view())(0));
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) {
      auto state = training_state(m, adam, adafactor, o);
      auto meta = run_config(o);
      meta["step"] = std::to_string(step + 1);
      meta["data_position"] = std::to_string(drawn);
      meta["optimizer.steps"] = std::to_string(o.optimizer == "adafactor" ? adafactor.steps() : adam.steps());
      meta["layout"] = o.layout;
      meta["ranks"] = std::to_string(g.nprocs());
      const auto name = mt::io::checkpoints(o.checkpoint).save(state, step + 1, meta);
      if (verbose && root) std::printf("saved checkpoint %s/%s\n", o.checkpoint.c_str(), name.c_str());
    }
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - tlast).count());
    tlast = std::chrono::steady_clock::now();
    if (verbose && root && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - tlog).count();
      const int k = static_cast<int>(std::min<std::int64_t>(step % o.log_every, step - step0) + 1);
      std::printf("step %5lld/%lld  loss %.4f  (%.3f bits/byte)  %.1f steps/s  %.0f tokens/s\n", (long long)(step + 1),
                  (long long)o.steps, losses.back(), losses.back() / std::log(2.0), k / dt,
                  k * o.batch * o.length / dt);
      std::fflush(stdout);
      tlog = now;
    }
  }
  if (verbose && root) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto trained = o.steps - std::min(step0, o.steps);
    std::printf("trained %lld steps in %.1f s (%.2f steps/s)\n", (long long)trained, s, trained / s);
  }
  if (o.warmup >= 0 && o.warmup < static_cast<std::int64_t>(step_seconds.size())) {
    // Each step ends when rank 0 has its loss; the slowest rank sets the pace through the collectives.
    std::vector<double> timed(step_seconds.begin() + o.warmup, step_seconds.end());
    std::sort(timed.begin(), timed.end());
    const std::size_t n = timed.size();
    const double median = n % 2 ? timed[n / 2] : 0.5 * (timed[n / 2 - 1] + timed[n / 2]);
    if (root)
      std::printf("step_time_median_ms %.3f over %zu steps after %lld warm-up steps\n", 1e3 * median, n,
                  (long long)o.warmup);
  }
  if (o.memory) {
    // Bytes of the local slices of the parameters and of Adam's two moments (laid out like them).
    long long local = 0;
    std::apply([&](auto&... p) { ((local += p.local_size() * static_cast<long long>(sizeof(float))), ...); }, m.tie());
    const long long with_state = 3 * local;
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    long long rss = ru.ru_maxrss * 1024LL, stats[4] = {with_state, -with_state, rss, -rss};
    MPI_Allreduce(MPI_IN_PLACE, stats, 4, MPI_LONG_LONG, MPI_MAX, g.communicator().cart());
    if (root)
      std::printf("memory_params_adam_bytes_per_rank max %lld min %lld; peak_rss_bytes max %lld min %lld\n", stats[0],
                  -stats[1], stats[2], -stats[3]);
  }
  return losses;
}

std::vector<double> train_layout(const std::string& name, const grid& g, const options& o,
                                 const std::vector<unsigned char>& text, bool verbose,
                                 std::int64_t* first_step = nullptr) {
  if (name == "data") return train<layout_data>(g, o, text, verbose, first_step);
  if (name == "model") return train<layout_model>(g, o, text, verbose, first_step);
  return train<layout_2d>(g, o, text, verbose, first_step);
}

// The loss of each step, exactly (17 digits: the float32 loss as a double, round-trippable).
void write_curve(const options& o, const std::vector<double>& losses, std::int64_t first_step) {
  std::ofstream csv(o.csv);
  if (!csv) throw mt::io_error(mt::detail::cat("cannot write '", o.csv, "'"));
  csv << "step,loss\n" << std::setprecision(17);
  for (std::size_t i = 0; i < losses.size(); ++i) csv << first_step + i + 1 << ',' << losses[i] << '\n';
  csv.close();
  std::printf("loss curve: %s\n", o.csv.c_str());
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    const std::string png = o.csv.substr(0, o.csv.rfind('.')) + ".png";
    const std::string cmd = "gnuplot -e \"set terminal png size 800,500; set output '" + png +
                            "'; set datafile separator ','; set xlabel 'step'; set ylabel 'loss (nats/byte)';"
                            " set title 'transformer_lm, layout " + o.layout + "' noenhanced;"
                            " plot '" + o.csv + "' every ::1 using 1:2 with lines title 'training loss'\"";
    if (std::system(cmd.c_str()) == 0) std::printf("loss plot: %s\n", png.c_str());
  } else {
    std::printf("(gnuplot not found: no PNG)\n");
  }
}

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor: a byte-level Transformer language model on a 2-D mesh"};
  app.add_option("--text", o.text, "training text")->capture_default_str();
  app.add_option("--layout", o.layout, "data | model | 2d")->check(CLI::IsMember({"data", "model", "2d"}))->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product must be the number of ranks)");
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", o.batch)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--length", o.length)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-model", o.d_model)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--heads", o.heads)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-kv", o.d_kv)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-ff", o.d_ff)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--dropout", o.dropout)->check(CLI::Range(0.0, 0.9))->capture_default_str();
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"adam", "adafactor"}))->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--log-every", o.log_every)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--csv", o.csv, "loss curve output (a PNG next to it when gnuplot is installed)")->capture_default_str();
  app.add_flag("--compare-layouts", o.compare, "train every layout for --steps steps and check the losses agree");
  app.add_option("--tolerance", o.tolerance, "relative tolerance of --compare-layouts")->capture_default_str();
  app.add_option("--vocab", o.vocab, "vocabulary: 256 = bytes; above, byte pairs mod vocab")
      ->check(CLI::Range(2, 65536))->capture_default_str();
  app.add_option("--dump", o.dump, "directory for the initial weights, first batch, loss and gradients (.npy)");
  app.add_option("--warmup", o.warmup, "print the median step time after this many warm-up steps");
  app.add_flag("--memory", o.memory, "print the bytes of parameters + Adam state per rank and the peak RSS");
  app.add_option("--checkpoint", o.checkpoint, "directory for checkpoints (with --save-every)");
  app.add_option("--save-every", o.save_every, "save a checkpoint every N steps (needs --checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", o.resume, "continue from this directory's current checkpoint, up to --steps");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  try {
    if (o.save_every > 0 && o.checkpoint.empty()) throw mt::error("--save-every needs --checkpoint DIR");
    if (o.compare && (!o.checkpoint.empty() || !o.resume.empty()))
      throw mt::error("--compare-layouts trains every layout from scratch; it takes no --checkpoint or --resume");
    grid g(env, o.mesh);
    const auto text = read_text(o.text, o.length + 3);
    const bool root = env.world_rank() == 0;
    if (root)
      std::printf("transformer_lm: %zu bytes of %s; %d layers, d_model %lld, heads %lld, d_kv %lld, d_ff %lld, "
                  "vocab %lld; batch %lld x length %lld; mesh [rows=%d x cols=%d]; %s lr %g, dropout %g\n",
                  text.size(), o.text.c_str(), n_layers, (long long)o.d_model, (long long)o.heads, (long long)o.d_kv,
                  (long long)o.d_ff, (long long)o.vocab, (long long)o.batch, (long long)o.length, g.size<rows>(),
                  g.size<cols>(), o.optimizer.c_str(), o.lr, o.dropout);
    if (!o.compare) {
      if (root) std::printf("layout %s\n", o.layout.c_str());
      std::int64_t first_step = 0;
      const auto losses = train_layout(o.layout, g, o, text, true, &first_step);
      if (root) write_curve(o, losses, first_step);
      return 0;
    }
    const std::vector<std::string> names{"data", "model", "2d"};
    std::vector<std::vector<double>> runs;
    for (const auto& n : names) runs.push_back(train_layout(n, g, o, text, false));
    double worst = 0;
    if (root) std::printf("%5s %12s %12s %12s %10s\n", "step", "data", "model", "2d", "max rel");
    for (std::size_t s = 0; s < runs[0].size(); ++s) {
      double d = 0;
      for (std::size_t r = 1; r < runs.size(); ++r)
        d = std::max(d, std::abs(runs[r][s] - runs[0][s]) / std::abs(runs[0][s]));
      if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
      if (root) std::printf("%5zu %12.6f %12.6f %12.6f %10.2e\n", s + 1, runs[0][s], runs[1][s], runs[2][s], d);
    }
    const bool falls = runs[0].back() < runs[0].front();
    const bool ok = worst <= o.tolerance && falls;
    if (root)
      std::printf("largest relative difference between layouts: %.2e (tolerance %.0e); loss %s: %s\n", worst,
                  o.tolerance, falls ? "falls" : "DOES NOT FALL", ok ? "agree" : "DISAGREE");
    return ok ? 0 : 3;
  } catch (const std::exception& e) {
    // Every rank failed alike: rank 0 prints it once and all return 1. This rank alone: the job ends
    // with its message instead of leaving the others waiting in a collective.
    return env.fail(e, "transformer_lm: error: ");
  }
}
