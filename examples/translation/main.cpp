// English-to-French translation with an encoder-decoder Transformer: the model of the Mesh-TensorFlow
// paper's Table 3, trained on parallel text every Debian machine has: the French translations of
// installed programs' messages (the compiled gettext catalogs fr/LC_MESSAGES/*.mo of a fixed list
// of packages, corpus.hpp), tokenized by SentencePiece with one vocabulary for both languages.
//
// Layouts on a 2-D mesh [rows x cols], chosen with --layout (the paper's names):
//   data            batch over rows and cols
//   model_parallel  vocab, heads and d_ff over rows and cols  ("vocab:m0, heads:m0, d_ff:m0")
//   dp_mp           batch over rows; vocab, heads, d_ff over cols ("batch:m0, vocab:m1, heads:m1, d_ff:m1")
// Every layout computes the same model (counter-based initialisers and dropout masks); the tests
// check that they train to the same losses (tests/examples/translation_checks.cpp).
//
//   mpiexec -n 4 translation [--layout dp_mp] [--steps 3000] [--translate "File not found"]
//
// The first run extracts the corpus (counts printed), trains the tokenizer on the training split
// and writes it and the token ids of every split to --data-dir (benchmarks/peers/torch_translation.py
// trains PyTorch's nn.Transformer on exactly those tokens). After training: --translate TEXT (any
// number) prints the French; --hypotheses FILE decodes the test split (beam search, --beam 4,
// --alpha 0.6, or --decode greedy) into FILE, with the references in FILE.ref and the sources in
// FILE.src (scripts/dev/bench_translation.sh scores them with sacrebleu). --checkpoint DIR saves
// the parameters and Adam's state at the end; --resume DIR continues from them (to decode only,
// --steps equal to the checkpoint's).
//
// Planning (docs/plan-mode.md): --plan plans one training step on a planned mesh of --mesh sizes (no
// processes, no data) and prints its memory per processor against --memory-budget and what it sends.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <iomanip>

#include "model.hpp"

using namespace translation;

std::string gib(std::int64_t bytes) { return fmt::format("{:g} GiB", std::round(bytes / 1073741824.0 * 1000) / 1000); }

std::int64_t bytes_sent(const mt::plan_report& p) {
  std::int64_t n = 0;
  for (const auto& [key, c] : p.totals) n += c.bytes;
  return n;
}

int plan(const mt::environment& env, const options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = plan_layout(o, o.layout);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (env.world_rank() != 0) return 0;
  const auto& p = *r.plan;
  const std::int64_t budget = static_cast<std::int64_t>(o.memory_budget_gib * 1073741824.0);
  std::printf("planned two training steps, reporting the second (layout %s, Adam), on mesh %s in %.3f s\n",
              o.layout.c_str(), p.shape.to_string().c_str(), seconds);
  std::printf("parameters: %lld (%.3f billion)\n", (long long)r.parameters, r.parameters / 1e9);
  std::printf("per processor (the first, which holds the largest parts): at the peak %s = parameters %s + optimizer "
              "state %s + gradients %s + activations %s; budget %s: %s\n",
              gib(p.peak_bytes).c_str(), gib(p.peak_bytes_of(mt::memory_kind::parameters)).c_str(),
              gib(p.peak_bytes_of(mt::memory_kind::optimizer_state)).c_str(),
              gib(p.peak_bytes_of(mt::memory_kind::gradients)).c_str(),
              gib(p.peak_bytes_of(mt::memory_kind::activations)).c_str(), gib(budget).c_str(),
              p.peak_bytes <= budget ? "fits" : "DOES NOT FIT");
  std::printf("bytes sent per step: %lld\n%s", (long long)bytes_sent(p), p.table().c_str());
  return 0;
}

void write_curve(const options& o, const train_result& r) {
  std::ofstream csv(o.csv);
  if (!csv) throw mt::io_error(fmt::format("cannot write '{}'", o.csv));
  csv << "step,loss,dev_loss\n" << std::setprecision(9);
  std::size_t next_dev = 0;
  const std::int64_t first = o.steps - static_cast<std::int64_t>(r.losses.size());
  for (std::size_t i = 0; i < r.losses.size(); ++i) {
    const std::int64_t step = first + static_cast<std::int64_t>(i) + 1;
    csv << step << ',' << r.losses[i] << ',';
    if (next_dev < r.dev_losses.size() && r.dev_losses[next_dev].first == step) csv << r.dev_losses[next_dev++].second;
    csv << '\n';
  }
  csv.close();
  std::printf("loss curve: %s\n", o.csv.c_str());
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) return;
  const std::string png = o.csv.substr(0, o.csv.rfind('.')) + ".png";
  const std::string cmd = "gnuplot -e \"set terminal png size 800,500; set output '" + png +
                          "'; set datafile separator ','; set xlabel 'step'; set ylabel 'cross-entropy (nats/token)';"
                          " set title 'translation, layout " + o.layout + "' noenhanced;"
                          " plot '" + o.csv + "' every ::1 using 1:2 with lines title 'training batch',"
                          " '' every ::1 using 1:3 with linespoints title 'dev'\" 2>/dev/null";
  if (std::system(cmd.c_str()) == 0) std::printf("loss plot: %s\n", png.c_str());
}

int main(int argc, char** argv) try {
  mt::environment env(argc, argv);
  options o;
  CLI::App app{"meshtensor: English-to-French translation with an encoder-decoder Transformer on a 2-D mesh"};
  app.add_option("--data-dir", o.data_dir, "the tokenizer and the token files (made when missing)")->capture_default_str();
  app.add_option("--locale-dir", o.locale_dir, "where the gettext catalogs are")->capture_default_str();
  app.add_option("--layout", o.layout, "data | model_parallel | dp_mp")
      ->check(CLI::IsMember({"data", "model_parallel", "dp_mp"}))
      ->capture_default_str();
  app.add_option("--mesh", o.mesh, "mesh sizes rows cols (their product must be the number of ranks)")->expected(2);
  app.add_option("--vocab", o.vocab, "SentencePiece vocabulary (shared by English and French)")
      ->check(CLI::Range(8, 1 << 20))
      ->capture_default_str();
  app.add_option("--steps", o.steps)->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--batch", o.batch, "sentence pairs per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--src-length", o.src_length, "source positions (longer sentences are cut)")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--tgt-length", o.tgt_length, "target positions")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  app.add_option("--d-model", o.d_model)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--heads", o.heads)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-kv", o.d_kv)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--d-ff", o.d_ff)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--layers", o.layers, "encoder blocks, and as many decoder blocks")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr, "Adam's learning rate (constant)")->capture_default_str();
  app.add_option("--dropout", o.dropout)->check(CLI::Range(0.0, 0.9))->capture_default_str();
  app.add_option("--label-smoothing", o.label_smoothing)->check(CLI::Range(0.0, 0.5))->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--log-every", o.log_every)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "dev loss every N steps (0: at the end)")->check(CLI::NonNegativeNumber);
  app.add_option("--dev-sentences", o.dev_sentences, "dev sentences in the dev loss")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--csv", o.csv, "loss curve (a PNG next to it when gnuplot is installed)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "print the median step time after this many warm-up steps");
  app.add_option("--translate", o.translate, "after training: translate these English texts");
  app.add_option("--hypotheses", o.hypotheses, "after training: decode the test split into this file");
  app.add_option("--decode-limit", o.decode_limit, "with --hypotheses: the first N test sentences (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--decode", o.decode_mode, "beam | greedy")->check(CLI::IsMember({"beam", "greedy"}))->capture_default_str();
  app.add_option("--decode-batch", o.decode_batch, "sentences decoded together (with beam search, x beam rows)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--beam", o.beam, "beam size")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--alpha", o.alpha, "length penalty's exponent: ((5 + n) / 6)^alpha")->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint, "save the parameters and Adam's state here after training");
  app.add_option("--resume", o.resume, "start from this directory's current checkpoint");
  app.add_flag("--plan", o.plan, "plan one training step on a mesh of --mesh sizes (no processes, no data) and report it");
  app.add_option("--memory-budget", o.memory_budget_gib, "with --plan: memory per processor in GiB (a TPUv2 core: 8)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  try {
    if (o.plan) return plan(env, o);
    grid g(env, {o.mesh[0], o.mesh[1]});
    const auto [data, tok] = prepare_data(env, o);
    const bool root = env.world_rank() == 0;
    if (root)
      std::printf("translation: %d + %d layers, d_model %lld, heads %lld, d_kv %lld, d_ff %lld, vocab %lld; batch %lld, "
                  "lengths %lld / %lld; mesh [rows=%d x cols=%d]; Adam lr %g, dropout %g\n",
                  (int)o.layers, (int)o.layers, (long long)o.d_model, (long long)o.heads, (long long)o.d_kv,
                  (long long)o.d_ff, (long long)o.vocab, (long long)o.batch, (long long)o.src_length,
                  (long long)o.tgt_length, g.size<rows>(), g.size<cols>(), o.lr, o.dropout);
    if (root) std::printf("layout %s; local kernels: %s\n", o.layout.c_str(), mt::kernels::describe().c_str());
    const auto r = run_layout(o.layout, g, o, data, tok.get(), true);
    if (root) {
      std::printf("parameters: %lld\n", (long long)r.parameters);
      if (!r.losses.empty()) write_curve(o, r);
    }
    return 0;
  } catch (const std::exception& e) {
    return env.fail(e, "translation: error: ");
  }
} catch (const mt::environment_start_error& e) {  // every rank alike, before there is an environment
  return e.report("translation: error: ");
}
