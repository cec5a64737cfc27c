// The planning checks of examples/fashion_mnist, on its model and training step (model.hpp), kept
// out of the example a user copies. A test program, not a tool: what it checks is that the library's
// plans hold for this model; a user plans their own model with the example's --plan.
//
//   mpiexec -n P fashion_mnist_checks --check-plan --layout L --mesh R C
//       one real step against its plan for this rank's coordinates, on every rank: the collectives'
//       calls and bytes per axis set, the bytes of parameters and optimizer state (exit 3 if not)
//   fashion_mnist_checks --predict --layout L --mesh R C --calibration FILE
//       the step time a plan predicts with bench_calibrate's rates (scripts/dev/bench_plan.sh)
//   fashion_mnist_checks --rank-layouts --mesh R C --calibration FILE
//       the three layouts ranked by predicted step time, the first as the type to paste
// The batch is synthetic: what is checked depends on the extents, not on the pixels.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <meshtensor/layout/candidates.hpp>
#include <optional>

#include "fashion_mnist/model.hpp"

using namespace fashion_mnist;

struct options {
  std::string layout = "2d", optimizer = "adam", calibration;
  std::vector<int> mesh{2, 2};
  std::int64_t batch_size = 128, hidden_units = 256;
  bool check_plan = false, predict = false, rank_layouts = false;
};

// What `steps` steps of the example leave: this processor's bytes of parameters and optimizer state,
// and on a planned mesh the plan of the last step (with the optimizer's state alive from its start).
struct step_info {
  std::int64_t param_bytes = 0, state_bytes = 0;
  std::optional<mt::plan_report> plan;
};

template <class L>
step_info run_steps(const grid& g, const options& o, int steps) {
  mt::optim::adam adam({.lr = 1e-3});
  mt::optim::sgd sgd({.lr = 1e-3, .momentum = 0.9});
  const auto with_optimizer = [&](auto&& f) { return o.optimizer == "sgd" ? f(sgd) : f(adam); };
  return with_optimizer([&](auto& optimizer) {
    mlp<L> m(g, o.hidden_units, 1);
    std::vector<float> x(static_cast<std::size_t>(o.batch_size * image_pixels));
    std::vector<int> y(static_cast<std::size_t>(o.batch_size));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 251) / 251.0f;
    for (std::size_t b = 0; b < y.size(); ++b) y[b] = static_cast<int>(b % n_classes);
    for (int step = 0; step < steps; ++step) {
      if (g.is_planned()) mt::reset_plan(g);
      // as the example's loop: the batch from the host, the step, the loss as a number
      (void)mt::item(m.step(optimizer, mt::from_host<typename mlp<L>::images>(g, {o.batch_size, image_pixels}, x),
                            mt::from_host<typename mlp<L>::labels>(g, {o.batch_size}, y)));
    }
    step_info info{mt::local_bytes(m.params()), optimizer.state_bytes(m.params()), std::nullopt};
    if (g.is_planned()) info.plan = mt::plan_report_of(g);
    return info;
  });
}

step_info run_layout(const std::string& name, const grid& g, const options& o, int steps) {
  if (name == "data") return run_steps<layout_data>(g, o, steps);
  if (name == "model") return run_steps<layout_model>(g, o, steps);
  return run_steps<layout_2d>(g, o, steps);
}

std::string layout_type(const std::string& name) {
  if (name == "data") return mt::layout_string<layout_data>();
  if (name == "model") return mt::layout_string<layout_model>();
  return mt::layout_string<layout_2d>();
}

int check_plan(const mt::environment& env, const options& o) {
  const grid g(env, {o.mesh[0], o.mesh[1]});
  g.reset_counters();
  const step_info real = run_layout(o.layout, g, o, 1);
  const mt::comm_counters counted = g.counters();
  const grid pm = grid::planned({g.size<rows>(), g.size<cols>()}, {g.coord<rows>(), g.coord<cols>()});
  const step_info planned = run_layout(o.layout, pm, o, 1);
  const auto v = mt::agree_on_plan(MPI_COMM_WORLD, g, counted, *planned.plan, real.param_bytes, real.state_bytes);
  if (!v.differences.empty()) fmt::print("rank {}: {}", g.rank(), v.differences);
  if (g.rank() == 0)
    fmt::print("check-plan (layout {}, {}, mesh {}): {}\n", o.layout, o.optimizer, g.shape().to_string(),
               v.equal_everywhere ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS");
  return v.equal_everywhere ? 0 : 3;
}

// --predict and --rank-layouts: two steps planned per layout on the first processor of --mesh.
int predict(const options& o) {
  if (o.calibration.empty()) throw mt::error("--predict and --rank-layouts need --calibration FILE (bench_calibrate writes one)");
  const auto c = mt::machine_calibration::load(o.calibration);
  std::vector<mt::layout_candidate> candidates;
  for (const std::string name : {"2d", "data", "model"}) {
    if (!o.rank_layouts && name != o.layout) continue;
    const step_info info = run_layout(name, grid::planned({o.mesh[0], o.mesh[1]}), o, 2);
    candidates.push_back({name, *info.plan, mt::predict(*info.plan, c), true});
  }
  if (!o.rank_layouts) {
    fmt::print("predicted step time {} (layout {}, mesh [{} x {}], calibration {}, {} ranks)\n",
               mt::to_string(candidates[0].time), o.layout, o.mesh[0], o.mesh[1], o.calibration, c.ranks);
    return 0;
  }
  const auto ranked = mt::rank_layouts(candidates, std::int64_t{1} << 62);
  fmt::print("layouts on mesh [rows={} x cols={}], calibration {} ({} ranks):\n{}", o.mesh[0], o.mesh[1], o.calibration,
             c.ranks, mt::ranking_table(ranked));
  fmt::print("best: --layout {}, that is\n  {}\n", ranked[0].name, layout_type(ranked[0].name));
  return 0;
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"the planning checks of examples/fashion_mnist"};
  app.add_flag("--check-plan", o.check_plan, "run one step, plan it, and check the plan equals it on every rank");
  app.add_flag("--predict", o.predict, "print the step time predicted from --calibration");
  app.add_flag("--rank-layouts", o.rank_layouts, "rank the three layouts by predicted step time (needs --calibration)");
  app.add_option("--calibration", o.calibration, "a machine's measured rates (bench_calibrate writes them)");
  app.add_option("--layout", o.layout)->check(CLI::IsMember({"2d", "data", "model"}))->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols")->expected(2);
  app.add_option("--batch", o.batch_size)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", o.hidden_units)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    if (o.check_plan + o.predict + o.rank_layouts != 1) throw mt::error("give one of --check-plan, --predict, --rank-layouts");
    if (o.check_plan) return check_plan(env, o);
    return env.world_rank() == 0 ? predict(o) : 0;
  } catch (const std::exception& e) {
    return env.fail(e, "fashion_mnist_checks: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("fashion_mnist_checks: error: ");
}
