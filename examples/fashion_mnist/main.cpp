// An MLP classifier for Fashion-MNIST (Debian's dataset-fashion-mnist), trained on a 2-D mesh
// (model.hpp: the model, its layouts and its step). The default layout splits the batch over the
// mesh's rows (data parallelism) and the hidden units over its cols (model parallelism).
//
//   mpiexec -n 4 fashion_mnist [--layout 2d|data|model] [--epochs 5] [--data-dir DIR]
//
// Checkpoints (docs/checkpoints.md): --checkpoint DIR --save-every N saves the weights, the
// optimizer's state and step count and the step every N steps; --resume DIR continues from DIR's
// current one (any layout and rank count). --csv FILE writes every step's loss exactly. --plan
// prints what a step needs per processor on a mesh of --mesh sizes, without processes or data.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fmt/core.h>
#include <fstream>
#include <meshtensor/io/checkpoint.hpp>
#include <numeric>
#include <random>

#include "idx.hpp"
#include "model.hpp"

using namespace fashion_mnist;

struct options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", layout = "2d", optimizer = "adam";
  std::vector<int> mesh{2, 2};  // a vector, not std::array: nvcc cannot compile CLI11 2.1's std::array overloads
  int epochs = 5, log_every = 100;
  std::int64_t max_steps = 0, batch_size = 128, hidden_units = 256, test_examples = 10000, save_every = 0;
  double lr = 1e-3;
  std::uint64_t seed = 1;
  std::string checkpoint, resume, csv;
  bool plan = false;
};

// The examples order[first, first + count) as float pixels in [0, 1] and int labels.
void make_batch(const idx::dataset& d, const std::vector<std::int64_t>& order, std::int64_t first, std::int64_t count,
                std::vector<float>& x, std::vector<int>& y) {
  x.resize(static_cast<std::size_t>(count * image_pixels));
  y.resize(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b < count; ++b) {
    const std::int64_t e = order[static_cast<std::size_t>(first + b)];
    for (std::int64_t p = 0; p < image_pixels; ++p) x[b * image_pixels + p] = d.images[e * image_pixels + p] * (1.0f / 255.0f);
    y[b] = d.labels[e];
  }
}

template <class L, class Optimizer>
void train(const grid& g, const options& o, Optimizer& optimizer, const idx::dataset& tr, const idx::dataset& te) {
  using X = typename mlp<L>::images;
  using Y = typename mlp<L>::labels;
  const bool root = g.rank() == 0;
  const std::int64_t nb = o.batch_size;
  mlp<L> m(g, o.hidden_units, o.seed);
  std::vector<std::int64_t> order(static_cast<std::size_t>(tr.n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o.seed);  // the same on every rank
  const std::int64_t per_epoch = tr.n / nb;
  const std::int64_t total = o.max_steps > 0 ? std::min(o.max_steps, per_epoch * o.epochs) : per_epoch * o.epochs;

  // Checkpoints: the weights and the optimizer's state; the step, in the metadata. The data
  // position follows from the step (an epoch's order is the seeded generator's next shuffle).
  const auto state = [&] {
    mt::io::tensor_set set;
    set.add("w1", m.w1).add("b1", m.b1).add("w2", m.w2).add("b2", m.b2);
    mt::io::add_optimizer_state(set, optimizer, m.params(), {"w1", "b1", "w2", "b2"});
    return set;
  };
  const mt::io::metadata config{{"hidden", std::to_string(o.hidden_units)}, {"batch", std::to_string(nb)},
                                {"seed", std::to_string(o.seed)}, {"optimizer", o.optimizer}};
  std::int64_t step0 = 0;
  if (!o.resume.empty()) {
    auto set = state();
    const auto meta = mt::io::checkpoints(o.resume).load(set);
    for (const auto& [k, v] : config)
      if (!meta.count(k) || meta.at(k) != v)
        throw mt::io_error(fmt::format("--resume {}: the checkpoint has {} = {}, this run {}", o.resume, k,
                                       meta.count(k) ? meta.at(k) : "(none)", v));
    step0 = std::stoll(meta.at("step"));
    optimizer.set_steps(std::stoll(meta.at("optimizer.steps")));
    // The epochs begun before step0 shuffled once each; the next shuffle is the one step0 would see.
    for (std::int64_t e = 0; e * per_epoch < step0; ++e) std::shuffle(order.begin(), order.end(), rng);
    if (root) fmt::print("resumed from {} at step {}\n", o.resume, step0);
  }
  if (root)
    fmt::print("fashion_mnist: {} training and {} test images; layout {} on mesh [rows={} x cols={}]; MLP 784-{}-10, "
               "batch {}, {} lr {:g}, {} steps\n", tr.n, te.n, o.layout, g.size<rows>(), g.size<cols>(), o.hidden_units,
               nb, o.optimizer, o.lr, total);

  std::vector<float> hx;
  std::vector<int> hy;
  std::vector<double> losses;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  auto tlog = t0;
  std::int64_t logged = step0;  // the step of the last printed line
  for (std::int64_t step = step0; step < total; ++step) {
    const std::int64_t in_epoch = step % per_epoch;
    if (in_epoch == 0) std::shuffle(order.begin(), order.end(), rng);
    make_batch(tr, order, in_epoch * nb, nb, hx, hy);
    losses.push_back(mt::item(m.step(optimizer, mt::from_host<X>(g, {nb, image_pixels}, hx), mt::from_host<Y>(g, {nb}, hy))));
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) {
      auto meta = config;
      meta["step"] = std::to_string(step + 1);
      meta["optimizer.steps"] = std::to_string(optimizer.steps());
      meta["layout"] = o.layout;
      const auto name = mt::io::checkpoints(o.checkpoint).save(state(), step + 1, meta);
      if (root) fmt::print("saved checkpoint {}/{}\n", o.checkpoint, name);
    }
    if (root && ((step + 1) % o.log_every == 0 || step + 1 == total)) {
      const auto now = std::chrono::steady_clock::now();
      const std::size_t k = std::min<std::size_t>(losses.size(), static_cast<std::size_t>(o.log_every));
      const double recent = std::accumulate(losses.end() - static_cast<std::ptrdiff_t>(k), losses.end(), 0.0) / double(k);
      fmt::print("step {:6d}/{}  epoch {}  loss {:.4f}  {:8.0f} examples/s\n", step + 1, total, step / per_epoch + 1,
                 recent, double((step + 1 - logged) * nb) / std::chrono::duration<double>(now - tlog).count());
      std::fflush(stdout);
      tlog = now;
      logged = step + 1;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root && !o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "step,loss\n";  // exact: the float32 loss as a double, 17 digits
    for (std::size_t i = 0; i < losses.size(); ++i) csv << fmt::format("{},{:.17g}\n", step0 + std::int64_t(i) + 1, losses[i]);
    if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  }

  // Test accuracy, in batches whose size divides by every mesh size used here; no tape recorded.
  mt::no_grad inference;
  const std::int64_t eb = 1000, n_test = std::min(o.test_examples, te.n) / eb * eb;
  std::vector<std::int64_t> test_order(static_cast<std::size_t>(te.n));
  std::iota(test_order.begin(), test_order.end(), 0);
  std::int64_t correct = 0;
  for (std::int64_t first = 0; first < n_test; first += eb) {
    make_batch(te, test_order, first, eb, hx, hy);
    const auto logits = mt::gather(m.logits(mt::from_host<X>(g, {eb, image_pixels}, hx)));
    if (root)
      for (std::int64_t b = 0; b < eb; ++b) {
        const auto* row = logits.data() + b * n_classes;
        correct += (std::max_element(row, row + n_classes) - row) == hy[b];
      }
  }
  if (root) {
    const auto trained = total - std::min(step0, total);
    fmt::print("trained {} steps in {:.1f} s ({:.1f} steps/s, {:.0f} examples/s)\n", trained, train_s,
               trained / train_s, trained * nb / train_s);
    fmt::print("test accuracy: {:.2f}% ({} of {})\n", 100.0 * correct / std::max<std::int64_t>(1, n_test), correct, n_test);
  }
}

// --plan: two steps on a planned mesh (no processes, no data: blank images), the second reported,
// with the optimizer's state alive from its start.
template <class L, class Optimizer>
void plan(const options& o, Optimizer& optimizer) {
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
  mlp<L> m(pm, o.hidden_units, o.seed);
  const std::vector<float> x(static_cast<std::size_t>(o.batch_size * image_pixels));
  const std::vector<int> y(static_cast<std::size_t>(o.batch_size));
  for (int step = 0; step < 2; ++step) {
    mt::reset_plan(pm);
    (void)mt::item(m.step(optimizer, mt::from_host<typename mlp<L>::images>(pm, {o.batch_size, image_pixels}, x),
                          mt::from_host<typename mlp<L>::labels>(pm, {o.batch_size}, y)));
  }
  const auto p = mt::plan_report_of(pm);
  fmt::print("fashion_mnist planned (layout {}, MLP 784-{}-10, batch {}, {}): peak {:.1f} MiB per processor\n{}", o.layout,
             o.hidden_units, o.batch_size, o.optimizer, p.peak_bytes / 1048576.0, p.table());
}

template <class L>
int run(const mt::environment& env, const options& o) {
  mt::optim::adam adam({.lr = o.lr});
  mt::optim::sgd sgd({.lr = o.lr, .momentum = 0.9});
  const auto with_optimizer = [&](auto&& f) { return o.optimizer == "sgd" ? f(sgd) : f(adam); };
  if (o.plan) {
    if (env.world_rank() == 0) with_optimizer([&](auto& opt) { plan<L>(o, opt); });
    return 0;
  }
  const grid g(env, {o.mesh[0], o.mesh[1]});
  const auto tr = idx::load_fashion_mnist(o.data_dir, "train", MPI_COMM_WORLD);
  const auto te = idx::load_fashion_mnist(o.data_dir, "t10k", MPI_COMM_WORLD);
  with_optimizer([&](auto& opt) { train<L>(g, o, opt, tr, te); });
  return 0;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor: a Fashion-MNIST MLP trained on a 2-D mesh"};
  app.add_option("--data-dir", o.data_dir, "directory of the gzip'd idx files")->capture_default_str();
  app.add_option("--layout", o.layout, "2d: batch over rows, hidden over cols; data: batch over both axes; "
                                       "model: hidden over both axes")
      ->check(CLI::IsMember({"2d", "data", "model"}))
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product: the number of ranks, or any with --plan)")->expected(2);
  app.add_option("--epochs", o.epochs)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.max_steps, "stop after this many steps (0: run every epoch)");
  app.add_option("--batch", o.batch_size)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", o.hidden_units)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  app.add_option("--log-every", o.log_every, "steps between printed losses (their mean)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--test-examples", o.test_examples, "test images to evaluate (multiples of 1000)")->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint, "directory for checkpoints (with --save-every)");
  app.add_option("--save-every", o.save_every, "save a checkpoint every N steps (needs --checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", o.resume, "continue from this directory's current checkpoint");
  app.add_option("--csv", o.csv, "write every step's loss (17 digits) to this file");
  app.add_flag("--plan", o.plan, "print what a step needs per processor on --mesh, without running it");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // every rank parses the same argv: rank 0 prints help or the error
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    if (o.save_every > 0 && o.checkpoint.empty()) throw mt::error("--save-every needs --checkpoint DIR");
    if (o.layout == "data") return run<layout_data>(env, o);
    if (o.layout == "model") return run<layout_model>(env, o);
    return run<layout_2d>(env, o);
  } catch (const std::exception& e) {
    // Every rank failed alike: rank 0 prints it once and all return 1. This rank alone: the job ends
    // with its message instead of leaving the others waiting in a collective.
    return env.fail(e, "fashion_mnist: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("fashion_mnist: error: ");
}
