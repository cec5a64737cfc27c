// The checks of examples/translation, which the example itself leaves out (issue 47: the example is
// what a user copies). It includes the example's model.hpp and links its layouts' code, so what it
// checks is the example's model. One check per run:
//   --compare-layouts  the three layouts train the same model from the same start on the same
//                      batches: every step's loss within --tolerance (relative), and the loss falls
//   --check-plan       one real step of --layout against its plan, on every rank (collectives' calls
//                      and bytes per axis set, parameter and optimizer bytes)
//   --check-decode     after --steps of training (and --translate): beam search with beam 1 equals
//                      greedy decoding, and the key-value cache's logits equal a full forward pass
//   --plan-table3      the paper's Table 3 models (d_model 1024, d_kv 128, 6 + 6 layers, vocab 32768,
//                      heads 4 to 128) under both paper layouts on --mesh: parameters (from the model's
//                      tensors), memory per processor and bytes sent per step (no processes, no data)
// Exit code 3 when a check fails. The ctests are example.translation.* (examples/CMakeLists.txt).
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "model.hpp"

using namespace translation;

namespace {

std::string gib(std::int64_t bytes) { return fmt::format("{:g} GiB", std::round(bytes / 1073741824.0 * 1000) / 1000); }

std::int64_t bytes_sent(const mt::plan_report& p) {
  std::int64_t n = 0;
  for (const auto& [key, c] : p.totals) n += c.bytes;
  return n;
}

int compare_layouts(const grid& g, const options& o, const dataset& data, double tolerance) {
  const bool root = g.rank() == 0;
  const std::vector<std::string> names{"data", "model_parallel", "dp_mp"};
  std::vector<std::vector<double>> runs;
  for (const auto& n : names) runs.push_back(run_layout(n, g, o, data, nullptr, false).losses);
  double worst = 0;
  if (root) std::printf("%5s %12s %15s %12s %10s\n", "step", "data", "model_parallel", "dp_mp", "max rel");
  for (std::size_t s = 0; s < runs[0].size(); ++s) {
    double d = 0;
    for (std::size_t r = 1; r < runs.size(); ++r) d = std::max(d, std::abs(runs[r][s] - runs[0][s]) / std::abs(runs[0][s]));
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
    if (root) std::printf("%5zu %12.6f %15.6f %12.6f %10.2e\n", s + 1, runs[0][s], runs[1][s], runs[2][s], d);
  }
  const bool falls = !runs[0].empty() && runs[0].back() < runs[0].front();
  const bool ok = worst <= tolerance && falls;
  if (root)
    std::printf("largest relative difference between layouts: %.2e (tolerance %.0e); loss %s: %s\n", worst, tolerance,
                falls ? "falls" : "DOES NOT FALL", ok ? "agree" : "DISAGREE");
  return ok ? 0 : 3;
}

int check_plan(const grid& g, options o, const dataset& d) {
  o.steps = 1;
  o.evaluate = false;
  g.reset_counters();
  const auto real = run_layout(o.layout, g, o, d, nullptr, false);
  const mt::comm_counters counted = g.counters();
  const grid pm = grid::planned({g.size<rows>(), g.size<cols>()}, {g.coord<rows>(), g.coord<cols>()});
  const auto planned = run_layout(o.layout, pm, o, d, nullptr, false);
  const auto v = mt::agree_on_plan(g.communicator().cart(), g, counted, *planned.plan, real.param_bytes, real.state_bytes);
  if (!v.differences.empty()) std::printf("rank %d: %s", g.rank(), v.differences.c_str());
  if (g.rank() == 0)
    std::printf("check-plan (layout %s, mesh %s): %s; rank 0 sent %lld bytes in %lld collectives, holds %lld bytes of "
                "parameters and %lld of optimizer state\n",
                o.layout.c_str(), g.shape().to_string().c_str(),
                v.equal_everywhere ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS",
                (long long)v.bytes, (long long)v.calls, (long long)real.param_bytes, (long long)real.state_bytes);
  return v.equal_everywhere ? 0 : 3;
}

// On the first test sentences: beam search with beam 1 equals greedy decoding, and
// the cached decoder's logits at every position equal a full forward pass over the greedy output.
template <class L>
bool check_decoding(const model<L>& m, const grid& g, const options& o, const std::vector<std::vector<int>>& sources) {
  using ids_t = typename model<L>::ids_t;
  const bool root = g.rank() == 0;
  const auto greedy = greedy_decode(m, g, sources, o);
  options one = o;
  one.beam = 1;
  const auto beam1 = beam_decode(m, g, sources, one);
  const bool same = beam1 == greedy;
  // Teacher-force bos + greedy output through the cache and through logits(); compare every row.
  const mt::no_grad inference;
  options quiet = o;
  quiet.dropout = 0;
  const auto n = static_cast<std::int64_t>(sources.size()), T = o.tgt_length;
  std::vector<float> input(static_cast<std::size_t>(n * T), float(tokenizer::pad));
  for (std::int64_t r = 0; r < n; ++r) {
    input[r * T] = float(tokenizer::bos);
    for (std::size_t i = 0; i < greedy[r].size() && std::int64_t(i) + 1 < T; ++i) input[r * T + i + 1] = float(greedy[r][i]);
  }
  const auto source = mt::from_host<ids_t>(g, {n, o.src_length}, source_rows(sources, 1, o.src_length));
  const auto full = mt::gather_all(m.logits(source, mt::from_host<ids_t>(g, {n, T}, input), quiet, 0));
  auto cache = m.start_decoding(source, quiet);
  double worst = 0;
  for (std::int64_t p = 0; p < T; ++p) {
    std::vector<float> token(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r) token[r] = input[r * T + p];
    const auto step = mt::gather_all(m.next_logits(mt::from_host<ids_t>(g, {n, 1}, token), p, cache));
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t v = 0; v < o.vocab; ++v)
        worst = std::max(worst, std::abs(double(step[r * o.vocab + v]) - double(full[(r * T + p) * o.vocab + v])));
  }
  const bool cached_ok = worst <= 1e-4;
  if (root) {
    std::printf("check-decode: beam search with beam 1 %s greedy decoding on %lld sentences\n",
                same ? "equals" : "DIFFERS FROM", (long long)n);
    std::printf("check-decode: largest difference between cached and full logits %.2e over %lld positions: %s\n",
                worst, (long long)T, cached_ok ? "they agree" : "THEY DIFFER");
  }
  return same && cached_ok;
}

template <class L>
bool train_and_check_decoding(const grid& g, const options& o, const dataset& data, const tokenizer& tok) {
  model<L> m(g, o);
  train(m, g, o, data, true);
  decode_requests(m, g, o, data, tok, true);  // --translate: what the trained model says
  std::vector<std::vector<int>> sources;
  for (std::size_t i = 0; i < std::min<std::size_t>(data.test.size(), 6); ++i) sources.push_back(data.test[i].src);
  return check_decoding(m, g, o, sources);
}

int check_decode(const grid& g, const options& o, const dataset& data, const tokenizer& tok) {
  bool ok = false;
  if (o.layout == "data") ok = train_and_check_decoding<layout_data>(g, o, data, tok);
  else if (o.layout == "model_parallel") ok = train_and_check_decoding<layout_model_parallel>(g, o, data, tok);
  else ok = train_and_check_decoding<layout_dp_mp>(g, o, data, tok);
  return ok ? 0 : 3;
}

// The paper's Table 3 column, each row planned under both of its layouts.
int plan_table3(const mt::environment& env, options o) {
  o.d_model = 1024, o.d_kv = 128, o.layers = 6, o.vocab = 32768;
  const std::int64_t budget = static_cast<std::int64_t>(o.memory_budget_gib * 1073741824.0);
  const bool root = env.world_rank() == 0;
  const double paper[] = {0.15, 0.24, 0.42, 0.77, 1.48, 2.89};
  if (root)
    std::printf("Table 3 planned on mesh [%d x %d]: d_model 1024, d_kv 128, 6 + 6 layers, vocab 32768, batch %lld, "
                "lengths %lld / %lld, Adam, float32; memory per processor at the peak, bytes sent per step by the "
                "first processor\n%5s %6s %15s %7s %6s | %-28s | %-28s\n",
                o.mesh[0], o.mesh[1], (long long)o.batch, (long long)o.src_length, (long long)o.tgt_length, "heads",
                "d_ff", "parameters", "billion", "paper", "model_parallel: memory, sent", "dp_mp: memory, sent");
  int row = 0;
  for (std::int64_t heads = 4; heads <= 128; heads *= 2, ++row) {
    o.heads = heads;
    o.d_ff = heads * 512;
    const auto mp = plan_layout(o, "model_parallel");
    const auto dm = plan_layout(o, "dp_mp");
    if (!root) continue;
    const auto cell = [&](const train_result& r) {
      return fmt::format("{}{}, {:g} MB", gib(r.plan->peak_bytes), r.plan->peak_bytes <= budget ? " (fits)" : " (OVER)",
                         std::round(bytes_sent(*r.plan) / 1e6));
    };
    std::printf("%5lld %6lld %15lld %7.3f %6.2f | %-28s | %-28s\n", (long long)heads, (long long)o.d_ff,
                (long long)mp.parameters, mp.parameters / 1e9, paper[row], cell(mp).c_str(), cell(dm).c_str());
  }
  if (root) std::printf("budget %s per processor\n", gib(budget).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  double tolerance = 1e-4;
  bool compare = false, plan = false, decode = false, table3 = false;
  CLI::App app{"the checks of examples/translation (tests/examples/translation_checks.cpp says what each does)"};
  auto* checks = app.add_option_group("check", "one of");
  checks->add_flag("--compare-layouts", compare, "the three layouts train to the same losses");
  checks->add_flag("--check-plan", plan, "one real step of --layout equals its plan on every rank");
  checks->add_flag("--check-decode", decode, "after training: beam 1 equals greedy, cached logits equal full ones");
  checks->add_flag("--plan-table3", table3, "plan the paper's Table 3 models under both paper layouts on --mesh");
  checks->require_option(1);
  app.add_option("--tolerance", tolerance, "relative tolerance of --compare-layouts")->capture_default_str();
  // The example's flags that the checks use (examples/translation/main.cpp describes them).
  app.add_option("--data-dir", o.data_dir)->capture_default_str();
  app.add_option("--layout", o.layout)->check(CLI::IsMember({"data", "model_parallel", "dp_mp"}))->capture_default_str();
  app.add_option("--mesh", o.mesh)->expected(2);
  const std::initializer_list<std::pair<const char*, std::int64_t*>> sizes{
      {"--vocab", &o.vocab},   {"--steps", &o.steps},   {"--batch", &o.batch},       {"--src-length", &o.src_length},
      {"--tgt-length", &o.tgt_length}, {"--d-model", &o.d_model}, {"--heads", &o.heads}, {"--d-kv", &o.d_kv},
      {"--d-ff", &o.d_ff},     {"--layers", &o.layers}, {"--eval-every", &o.eval_every}};
  for (const auto& [flag, value] : sizes)
    app.add_option(flag, *value)->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--log-every", o.log_every)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dropout", o.dropout)->check(CLI::Range(0.0, 0.9))->capture_default_str();
  app.add_option("--translate", o.translate, "with --check-decode: translate these too");
  app.add_option("--memory-budget", o.memory_budget_gib, "with --plan-table3: GiB per processor")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    if (table3) return plan_table3(env, o);
    const grid g(env, {o.mesh[0], o.mesh[1]});
    const auto [data, tok] = prepare_data(env, o);
    if (compare) return compare_layouts(g, o, data, tolerance);
    if (plan) return check_plan(g, o, data);
    return check_decode(g, o, data, *tok);
  } catch (const std::exception& e) {
    return env.fail(e, "translation_checks: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("translation_checks: error: ");
}
