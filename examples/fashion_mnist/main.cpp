// An MLP classifier for Fashion-MNIST (Debian's dataset-fashion-mnist), trained on a 2-D mesh.
// The default layout splits the batch over the mesh's rows (data parallelism) and the hidden
// units over its cols (model parallelism): x[batch, pixels] w1[pixels, hidden] needs no
// communication, h[batch, hidden] w2[hidden, classes] allreduces over cols, and the weight
// gradients allreduce over rows.
//
//   mpiexec -n 4 fashion_mnist [--layout 2d|data|model] [--epochs 5] [--data-dir DIR]
//
// Checkpoints (docs/checkpoints.md): --checkpoint DIR --save-every N saves the weights, the
// optimizer's state and step count and the step every N steps; --resume DIR continues from DIR's
// current one (any layout and rank count). --csv FILE writes every step's loss exactly.
//
// Planning (docs/scale.md): --plan plans two training steps of this code on a mesh of --mesh sizes
// with no processes and no data, and prints the second's memory, collectives and (with
// --calibration FILE from bench_calibrate) predicted time; --rank-layouts ranks the three layouts
// by predicted step time; --check-plan runs one step and checks its plan equals it on every rank.
#include <CLI/CLI.hpp>
#include <meshtensor/layout/candidates.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fmt/core.h>
#include <fstream>
#include <iomanip>
#include <map>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "idx.hpp"

namespace mt = meshtensor;
namespace nn = meshtensor::nn;

struct batch : mt::dim<"batch"> {};
struct pixels : mt::dim<"pixels"> {};
struct hidden : mt::dim<"hidden"> {};
struct classes : mt::dim<"classes"> {};
struct rows : mt::axis<"rows"> {};
struct cols : mt::axis<"cols"> {};
using grid = mt::mesh<rows, cols>;

// The compiled-in layouts.
using layout_2d = mt::layout<grid, mt::split<batch, rows>, mt::split<hidden, cols>>;
using layout_data = mt::layout<grid, mt::split<batch, rows, cols>>;
using layout_model = mt::layout<grid, mt::split<hidden, rows, cols>>;

struct options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string layout = "2d";
  // a vector, not std::array: nvcc cannot compile CLI11 2.1's std::array overloads
  std::vector<int> mesh{2, 2};
  int epochs = 5;
  std::int64_t max_steps = 0;
  std::int64_t batch_size = 128;
  std::int64_t hidden_units = 256;
  double lr = 1e-3;
  std::string optimizer = "adam";
  int log_every = 100;
  std::uint64_t seed = 1;
  bool expect_loss_drop = false;
  std::int64_t test_examples = 10000;
  std::string checkpoint, resume, csv;
  std::int64_t save_every = 0;
  bool plan = false, rank_layouts = false, check_plan = false;
  std::string calibration;
};

// What a run leaves besides its status: this processor's bytes of parameters and optimizer state,
// and on a planned mesh the plan's report (of the last step).
struct run_info {
  std::int64_t param_bytes = 0, state_bytes = 0;
  std::optional<mt::plan_report> plan;
};

struct dataset {
  std::int64_t n = 0;
  std::vector<std::uint8_t> images;  // n x 784
  std::vector<std::uint8_t> labels;  // n
};

dataset load(const std::string& dir, const std::string& prefix, MPI_Comm comm) {
  const std::string ip = dir + "/" + prefix + "-images-idx3-ubyte.gz", lp = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  auto im = idx::read(ip, 3, comm);
  auto lb = idx::read(lp, 1, comm);
  if (im.dims[1] != 28 || im.dims[2] != 28)
    throw mt::io_error(fmt::format("'{}' holds images of {}x{} pixels, expected 28x28", ip, im.dims[1], im.dims[2]));
  if (im.dims[0] != lb.dims[0])
    throw mt::io_error(fmt::format("'{}' holds {} images but '{}' holds {} labels", ip, im.dims[0], lp, lb.dims[0]));
  for (auto v : lb.data)
    if (v > 9) throw mt::io_error(fmt::format("'{}' holds the label {}; Fashion-MNIST labels are 0..9", lp, int(v)));
  return {im.dims[0], std::move(im.data), std::move(lb.data)};
}

// The examples order[first, first + count) as float pixels in [0, 1] and int labels.
void make_batch(const dataset& d, const std::vector<std::int64_t>& order, std::int64_t first, std::int64_t count,
                std::vector<float>& x, std::vector<int>& y) {
  x.resize(static_cast<std::size_t>(count * 784));
  y.resize(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b < count; ++b) {
    const std::int64_t e = order[static_cast<std::size_t>(first + b)];
    for (std::int64_t p = 0; p < 784; ++p) x[b * 784 + p] = d.images[e * 784 + p] * (1.0f / 255.0f);
    y[b] = d.labels[e];
  }
}

template <class L>
int train(const grid& g, const options& o, const dataset& tr, const dataset& te, run_info* info = nullptr) {
  using X = mt::tensor<float, L, batch, pixels>;
  using Y = mt::tensor<int, L, batch>;
  using W1 = mt::tensor<float, L, pixels, hidden>;
  using B1 = mt::tensor<float, L, hidden>;
  using W2 = mt::tensor<float, L, hidden, classes>;
  using B2 = mt::tensor<float, L, classes>;
  const bool root = g.rank() == 0;
  const std::int64_t H = o.hidden_units, nb = o.batch_size;

  std::optional<mt::plan_kind_scope> as_parameters(std::in_place, mt::memory_kind::parameters);  // for a plan
  auto w1 = nn::normal_fan_in<W1, pixels>(g, {784, H}, o.seed);
  auto b1 = mt::zeros<B1>(g, {H});
  auto w2 = nn::normal_fan_in<W2, hidden>(g, {H, 10}, o.seed + 1);
  auto b2 = mt::zeros<B2>(g, {10});
  as_parameters.reset();
  for (auto* p : {&w1}) p->requires_grad();
  b1.requires_grad();
  w2.requires_grad();
  b2.requires_grad();

  auto logits_of = [&](const X& x, const W1& a, const B1& ab, const W2& c, const B2& cb) {
    const auto h = mt::relu(nn::dense<pixels, hidden>(x, a, ab));
    return nn::dense<hidden, classes>(h, c, cb);
  };

  mt::optim::adam adam({.lr = o.lr});
  mt::optim::sgd sgd({.lr = o.lr, .momentum = 0.9});
  std::vector<std::int64_t> order(static_cast<std::size_t>(tr.n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(o.seed);  // the same on every rank
  const std::int64_t per_epoch = tr.n / nb;
  const std::int64_t total = o.max_steps > 0 ? std::min(o.max_steps, per_epoch * o.epochs) : per_epoch * o.epochs;

  // Checkpoints: the weights and the optimizer's state; the step, in the metadata. The data
  // position follows from the step (an epoch's order is the seeded generator's next shuffle).
  auto params = std::tie(w1, b1, w2, b2);
  const std::vector<std::string> names{"w1", "b1", "w2", "b2"};
  auto state = [&] {
    mt::io::tensor_set set;
    set.add("w1", w1).add("b1", b1).add("w2", w2).add("b2", b2);
    if (o.optimizer == "sgd") mt::io::add_optimizer_state(set, sgd, params, names);
    else mt::io::add_optimizer_state(set, adam, params, names);
    return set;
  };
  const mt::io::metadata config{{"hidden", std::to_string(H)}, {"batch", std::to_string(nb)},
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
    if (o.optimizer == "sgd") sgd.set_steps(std::stoll(meta.at("optimizer.steps")));
    else adam.set_steps(std::stoll(meta.at("optimizer.steps")));
    // The epochs begun before step0 shuffled once each; the next shuffle is the one step0 would see.
    for (std::int64_t e = 0; e * per_epoch < step0; ++e) std::shuffle(order.begin(), order.end(), rng);
    if (root) std::printf("resumed from %s at step %lld\n", o.resume.c_str(), (long long)step0);
  }
  if (root && !g.is_planned())
    std::printf("fashion_mnist: %lld training and %lld test images; layout %s on mesh [rows=%d x cols=%d]; "
                "MLP 784-%lld-10, batch %lld, %s lr %g, %lld steps\n",
                (long long)tr.n, (long long)te.n, o.layout.c_str(), g.size<rows>(), g.size<cols>(), (long long)H,
                (long long)nb, o.optimizer.c_str(), o.lr, (long long)total);

  std::vector<float> hx;
  std::vector<int> hy;
  std::vector<double> losses;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  auto tlog = t0;
  std::int64_t seen_since_log = 0;
  for (std::int64_t step = step0; step < total; ++step) {
    if (g.is_planned()) mt::reset_plan(g);  // a plan reports its last step
    const std::int64_t in_epoch = step % per_epoch;
    if (in_epoch == 0) std::shuffle(order.begin(), order.end(), rng);
    make_batch(tr, order, in_epoch * nb, nb, hx, hy);
    const auto x = mt::from_host<X>(g, {nb, 784}, hx);
    const auto y = mt::from_host<Y>(g, {nb}, hy);
    const auto loss = mt::reduce_mean<batch>(nn::softmax_cross_entropy<classes>(logits_of(x, w1, b1, w2, b2), y));
    auto grads = mt::gradient(loss, w1, b1, w2, b2);
    if (o.optimizer == "sgd") sgd.step(std::tie(w1, b1, w2, b2), grads);
    else adam.step(std::tie(w1, b1, w2, b2), grads);
    losses.push_back(mt::item(loss));
    seen_since_log += nb;
    if (o.save_every > 0 && (step + 1) % o.save_every == 0) {
      auto meta = config;
      meta["step"] = std::to_string(step + 1);
      meta["optimizer.steps"] = std::to_string(o.optimizer == "sgd" ? sgd.steps() : adam.steps());
      meta["layout"] = o.layout;
      const auto name = mt::io::checkpoints(o.checkpoint).save(state(), step + 1, meta);
      if (root) std::printf("saved checkpoint %s/%s\n", o.checkpoint.c_str(), name.c_str());
    }
    if (root && !g.is_planned() && ((step + 1) % o.log_every == 0 || step + 1 == total)) {
      const auto now = std::chrono::steady_clock::now();
      const double dt = std::chrono::duration<double>(now - tlog).count();
      double recent = 0;
      const std::size_t k = std::min<std::size_t>(losses.size(), static_cast<std::size_t>(o.log_every));
      for (std::size_t i = losses.size() - k; i < losses.size(); ++i) recent += losses[i] / double(k);
      std::printf("step %6lld/%lld  epoch %lld  loss %.4f  %8.0f examples/s\n", (long long)(step + 1),
                  (long long)total, (long long)(step / per_epoch + 1), recent, seen_since_log / dt);
      std::fflush(stdout);
      tlog = now;
      seen_since_log = 0;
    }
  }
  if (info) {
    info->param_bytes = mt::local_bytes(params);
    info->state_bytes = o.optimizer == "sgd" ? sgd.state_bytes(params) : adam.state_bytes(params);
    if (g.is_planned()) info->plan = mt::plan_report_of(g);
  }
  if (g.is_planned()) return 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (root && !o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "step,loss\n" << std::setprecision(17);  // exact: the float32 loss as a double
    for (std::size_t i = 0; i < losses.size(); ++i) csv << step0 + static_cast<std::int64_t>(i) + 1 << ',' << losses[i] << '\n';
    if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  }

  // Test accuracy, in batches whose size divides by every mesh size used here.
  const std::int64_t eb = 1000, n_test = std::min(o.test_examples, te.n) / eb * eb;
  std::vector<std::int64_t> test_order(static_cast<std::size_t>(te.n));
  std::iota(test_order.begin(), test_order.end(), 0);
  std::int64_t correct = 0;
  const auto dw1 = w1.detached();
  const auto db1 = b1.detached();
  const auto dw2 = w2.detached();
  const auto db2 = b2.detached();
  for (std::int64_t first = 0; first < n_test; first += eb) {
    make_batch(te, test_order, first, eb, hx, hy);
    const auto logits = mt::gather(logits_of(mt::from_host<X>(g, {eb, 784}, hx), dw1, db1, dw2, db2));
    if (root)
      for (std::int64_t b = 0; b < eb; ++b) {
        const auto* row = logits.data() + b * 10;
        correct += (std::max_element(row, row + 10) - row) == hy[b];
      }
  }
  int status = 0;
  if (root) {
    const auto trained = total - std::min(step0, total);
    std::printf("trained %lld steps in %.1f s (%.1f steps/s, %.0f examples/s)\n", (long long)trained, train_s,
                trained / train_s, trained * nb / train_s);
    std::printf("test accuracy: %.2f%% (%lld of %lld)\n", 100.0 * correct / std::max<std::int64_t>(1, n_test),
                (long long)correct, (long long)n_test);
    if (o.expect_loss_drop) {
      const std::size_t k = std::min<std::size_t>(10, losses.size() / 2);
      double first = 0, last = 0;
      for (std::size_t i = 0; i < k; ++i) {
        first += losses[i] / double(k);
        last += losses[losses.size() - k + i] / double(k);
      }
      const bool ok = k > 0 && last < 0.8 * first;
      std::printf("loss over the first %zu steps %.4f, over the last %zu %.4f: %s\n", k, first, k, last,
                  ok ? "falls" : "DOES NOT FALL");
      status = ok ? 0 : 3;
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

int train_layout(const std::string& name, const grid& g, const options& o, const dataset& tr, const dataset& te,
                 run_info* info = nullptr) {
  if (name == "data") return train<layout_data>(g, o, tr, te, info);
  if (name == "model") return train<layout_model>(g, o, tr, te, info);
  return train<layout_2d>(g, o, tr, te, info);
}

std::string layout_type(const std::string& name) {
  if (name == "data") return mt::layout_string<layout_data>();
  if (name == "model") return mt::layout_string<layout_model>();
  return mt::layout_string<layout_2d>();
}

// --plan and --rank-layouts: two steps planned per layout (no data: a batch of blank images).
int plan(const mt::environment& env, options o) {
  o.max_steps = 2;
  o.epochs = 1;
  o.test_examples = 0;
  dataset blank{o.batch_size, std::vector<std::uint8_t>(static_cast<std::size_t>(o.batch_size * 784)),
                std::vector<std::uint8_t>(static_cast<std::size_t>(o.batch_size))};
  std::optional<mt::machine_calibration> c;
  if (!o.calibration.empty()) c = mt::machine_calibration::load(o.calibration);
  if (o.rank_layouts && !c) throw mt::error("--rank-layouts needs --calibration FILE (bench_calibrate writes one)");
  std::vector<mt::layout_candidate> candidates;
  for (const std::string name : {"2d", "data", "model"}) {
    if (!o.rank_layouts && name != o.layout) continue;
    run_info info;
    const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
    train_layout(name, pm, o, blank, blank, &info);
    candidates.push_back({name, *info.plan, c ? mt::predict(*info.plan, *c) : mt::step_time{}, true});
  }
  if (env.world_rank() != 0) return 0;
  if (!o.rank_layouts) {
    const auto& k = candidates[0];
    std::printf("fashion_mnist planned (layout %s, MLP 784-%lld-10, batch %lld, %s): peak %.1f MiB per processor\n%s",
                k.name.c_str(), (long long)o.hidden_units, (long long)o.batch_size, o.optimizer.c_str(),
                k.report.peak_bytes / 1048576.0, k.report.table().c_str());
    if (c)
      std::printf("predicted step time %s (calibration %s, %d ranks)\n", mt::to_string(k.time).c_str(),
                  o.calibration.c_str(), c->ranks);
    return 0;
  }
  const auto ranked = mt::rank_layouts(candidates, std::int64_t{1} << 62);
  std::printf("layouts on mesh [rows=%d x cols=%d], calibration %s (%d ranks):\n", o.mesh[0], o.mesh[1],
              o.calibration.c_str(), c->ranks);
  std::printf("%s", mt::ranking_table(ranked).c_str());
  std::printf("best: --layout %s, that is\n  %s\n", ranked[0].name.c_str(), layout_type(ranked[0].name).c_str());
  return 0;
}

// --check-plan: one real step against its plan, on every rank.
int check_plan(const grid& g, options o, const dataset& tr, const dataset& te) {
  o.max_steps = 1;
  o.test_examples = 0;
  g.reset_counters();
  run_info real, planned;
  train_layout(o.layout, g, o, tr, te, &real);
  const mt::comm_counters counted = g.counters();
  const grid pm = grid::planned({g.size<rows>(), g.size<cols>()}, {g.coord<rows>(), g.coord<cols>()});
  train_layout(o.layout, pm, o, tr, te, &planned);
  const auto& p = *planned.plan;
  const std::string wrong = mt::plan_differences(g, counted, p, real.param_bytes, real.state_bytes);
  if (!wrong.empty()) std::printf("rank %d: %s", g.rank(), wrong.c_str());
  int mine = wrong.empty(), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (g.rank() == 0)
    std::printf("check-plan (layout %s, %s, mesh %s): %s\n", o.layout.c_str(), o.optimizer.c_str(),
                g.shape().to_string().c_str(), all ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS");
  return all ? 0 : 3;
}

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor: a Fashion-MNIST MLP trained on a 2-D mesh"};
  const std::map<std::string, std::string> layouts{{"2d", "batch over rows, hidden over cols"},
                                                   {"data", "batch over rows and cols"},
                                                   {"model", "hidden over rows and cols"}};
  app.add_option("--data-dir", o.data_dir, "directory of the gzip'd idx files")->capture_default_str();
  app.add_option("--layout", o.layout, "2d: batch over rows, hidden over cols; data: batch over both axes; "
                                       "model: hidden over both axes")
      ->check(CLI::IsMember({"2d", "data", "model"}))
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product must be the number of ranks)")->expected(2);
  app.add_option("--epochs", o.epochs)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.max_steps, "stop after this many steps (0: run every epoch)");
  app.add_option("--batch", o.batch_size)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", o.hidden_units)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  app.add_option("--log-every", o.log_every)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--test-examples", o.test_examples, "test images to evaluate (multiples of 1000)")->capture_default_str();
  app.add_flag("--expect-loss-drop", o.expect_loss_drop, "exit with 3 unless the loss falls by 20% (for tests)");
  app.add_option("--checkpoint", o.checkpoint, "directory for checkpoints (with --save-every)");
  app.add_option("--save-every", o.save_every, "save a checkpoint every N steps (needs --checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", o.resume, "continue from this directory's current checkpoint");
  app.add_option("--csv", o.csv, "write every step's loss (17 digits) to this file");
  app.add_flag("--plan", o.plan, "plan two training steps on a mesh of --mesh sizes (no processes, no data)");
  app.add_option("--calibration", o.calibration, "with --plan: predict the step time from this bench_calibrate file");
  app.add_flag("--rank-layouts", o.rank_layouts, "rank the three layouts on --mesh by predicted step time");
  app.add_flag("--check-plan", o.check_plan, "run one step, plan it, and check the plan equals it on every rank");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
    return rc;
  }

  try {
    if (o.save_every > 0 && o.checkpoint.empty()) throw mt::error("--save-every needs --checkpoint DIR");
    if (o.plan || o.rank_layouts) return plan(env, o);
    grid g(env, {o.mesh[0], o.mesh[1]});
    const auto tr = load(o.data_dir, "train", MPI_COMM_WORLD);
    const auto te = load(o.data_dir, "t10k", MPI_COMM_WORLD);
    if (o.check_plan) return check_plan(g, o, tr, te);
    return train_layout(o.layout, g, o, tr, te);
  } catch (const std::exception& e) {
    // Every rank failed alike: rank 0 prints it once and all return 1. This rank alone: the job ends
    // with its message instead of leaving the others waiting in a collective.
    return env.fail(e, "fashion_mnist: error: ");
  }
}
