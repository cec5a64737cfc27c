// English-to-French translation with an encoder-decoder Transformer: the model of the Mesh-TensorFlow
// paper's Table 3, trained on parallel text every Debian machine has: the French translations of
// installed programs' messages (the compiled gettext catalogs fr/LC_MESSAGES/*.mo of a fixed list
// of packages, corpus.hpp), tokenized by SentencePiece with one vocabulary for both languages.
//
// Layouts on a 2-D mesh [rows x cols], chosen with --layout (the paper's names):
//   data            batch over rows and cols
//   model_parallel  vocab, heads and d_ff over rows and cols  ("vocab:m0, heads:m0, d_ff:m0")
//   dp_mp           batch over rows; vocab, heads, d_ff over cols ("batch:m0, vocab:m1, heads:m1, d_ff:m1")
// Every layout computes the same model (counter-based initialisers and dropout masks):
// --compare-layouts trains each in turn from the same start on the same batches and checks the losses
// agree.
//
//   mpiexec -n 4 translation [--layout dp_mp] [--steps 3000] [--translate "File not found"]
//   mpiexec -n 4 translation --compare-layouts --steps 20
//
// The first run extracts the corpus (counts printed), trains the tokenizer on the training split
// and writes it and the token ids of every split to --data-dir (benchmarks/peers/torch_translation.py
// trains PyTorch's nn.Transformer on exactly those tokens). After training: --translate TEXT (any
// number) prints the French; --hypotheses FILE decodes the test split (beam search, --beam 4,
// --alpha 0.6, or --decode greedy) into FILE, with the references in FILE.ref and the sources in
// FILE.src (scripts/dev/bench_translation.sh scores them with sacrebleu); --check-decode checks that
// beam search with beam 1 equals greedy decoding and that the key-value cache's logits equal a full
// forward pass. --checkpoint DIR saves the parameters and Adam's state at the end; --resume DIR
// continues from them (to decode only, --steps equal to the checkpoint's).
//
// Planning (docs/scale.md): --plan plans one training step on a planned mesh of --mesh sizes (no
// processes, no data); --plan-table3 plans the paper's six Table 3 models (d_model 1024, d_kv 128,
// 6 + 6 layers, vocab 32768, heads 4 to 128) under both paper layouts on --mesh and prints their
// parameters (from the model's tensors), memory per processor and bytes sent per step;
// --check-plan runs one real step and checks its plan equals it on every rank.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fmt/core.h>
#include <iomanip>
#include <mpi.h>

#include "model.hpp"

using namespace translation;

train_result train_layout(const std::string& name, const grid& g, const options& o, const dataset& d,
                          const tokenizer* tok, bool verbose) {
  if (name == "data") return train<layout_data>(g, o, d, tok, verbose);
  if (name == "model_parallel") return train<layout_model_parallel>(g, o, d, tok, verbose);
  return train<layout_dp_mp>(g, o, d, tok, verbose);
}

std::string gib(std::int64_t bytes) { return fmt::format("{:g} GiB", std::round(bytes / 1073741824.0 * 1000) / 1000); }

// Two steps planned on a mesh of o.mesh's sizes; the report is the second's.
train_result plan_layout(options o, const std::string& layout) {
  o.steps = 2;
  o.layout = layout;
  const grid pm = grid::planned({o.mesh[0], o.mesh[1]});
  return train_layout(layout, pm, o, dataset{}, nullptr, false);
}

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

// --check-plan: one real step against its plan, on every rank.
int check_plan(const grid& g, options o, const dataset& d) {
  o.steps = 1;
  o.evaluate = false;
  g.reset_counters();
  const auto real = train_layout(o.layout, g, o, d, nullptr, false);
  const mt::comm_counters counted = g.counters();
  const grid pm = grid::planned({g.size<rows>(), g.size<cols>()}, {g.coord<rows>(), g.coord<cols>()});
  const auto planned = train_layout(o.layout, pm, o, d, nullptr, false);
  const auto& p = *planned.plan;
  const std::string wrong = mt::plan_differences(g, counted, p, real.param_bytes, real.state_bytes);
  if (!wrong.empty()) std::printf("rank %d: %s", g.rank(), wrong.c_str());
  int ok = wrong.empty(), all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, g.communicator().cart());
  std::int64_t calls = 0, bytes = 0;
  for (const auto& [key, n] : counted) calls += n.calls, bytes += n.bytes;
  if (g.rank() == 0)
    std::printf("check-plan (layout %s, mesh %s): %s; rank 0 sent %lld bytes in %lld collectives, holds %lld bytes of "
                "parameters and %lld of optimizer state\n",
                o.layout.c_str(), g.shape().to_string().c_str(),
                all ? "the plan equals the real step on every rank" : "THE PLAN DIFFERS", (long long)bytes,
                (long long)calls, (long long)real.param_bytes, (long long)real.state_bytes);
  return all ? 0 : 3;
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

// The corpus, the tokenizer (trained on rank 0 when --data-dir has none of --vocab's size; the
// token files for the PyTorch peer written beside it), and every split as token ids.
std::pair<dataset, std::unique_ptr<tokenizer>> prepare_data(const mt::environment& env, const options& o) {
  const bool root = env.world_rank() == 0;
  const corpus c = load_corpus(o.locale_dir);
  const std::string model_path = o.data_dir + "/tokenizer.model";
  if (root) {
    std::printf("%s", describe(c).c_str());
    bool fresh = !std::filesystem::exists(model_path);
    if (!fresh && tokenizer(model_path).vocab_size() != o.vocab) {
      std::printf("%s has another vocabulary size than --vocab %lld: training it again\n", model_path.c_str(),
                  (long long)o.vocab);
      fresh = true;
    }
    if (fresh) {
      std::filesystem::create_directories(o.data_dir);
      const auto t0 = std::chrono::steady_clock::now();
      train_tokenizer(c, static_cast<int>(o.vocab), o.data_dir + "/tokenizer");
      const tokenizer tok(model_path);
      write_token_files(c, tok, o.data_dir);
      std::printf("trained the tokenizer (SentencePiece, vocab %lld, the training split) and wrote the token files "
                  "to %s in %.1f s\n",
                  (long long)o.vocab, o.data_dir.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the other ranks read the tokenizer rank 0 wrote
  auto tok = std::make_unique<tokenizer>(model_path);
  dataset d;
  const auto encode = [&](const std::vector<sentence_pair>& pairs, std::vector<token_pair>& out) {
    for (const auto& p : pairs) out.push_back({tok->encode(p.en), tok->encode(p.fr)});
  };
  encode(c.train, d.train);
  encode(c.dev, d.dev);
  encode(c.test, d.test);
  for (const auto& p : c.test) d.test_en.push_back(p.en), d.test_fr.push_back(p.fr);
  return {std::move(d), std::move(tok)};
}

int main(int argc, char** argv) {
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
  app.add_flag("--compare-layouts", o.compare, "train every layout for --steps steps and check the losses agree");
  app.add_option("--tolerance", o.tolerance, "relative tolerance of --compare-layouts")->capture_default_str();
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
  app.add_flag("--check-decode", o.check_decode,
               "after training: check beam 1 equals greedy decoding and the cached logits equal a full forward pass");
  app.add_option("--checkpoint", o.checkpoint, "save the parameters and Adam's state here after training");
  app.add_option("--resume", o.resume, "start from this directory's current checkpoint");
  app.add_flag("--plan", o.plan, "plan one training step on a mesh of --mesh sizes (no processes, no data) and report it");
  app.add_flag("--plan-table3", o.plan_table3, "plan the paper's Table 3 models under both paper layouts on --mesh");
  app.add_option("--memory-budget", o.memory_budget_gib, "with --plan: memory per processor in GiB (a TPUv2 core: 8)")
      ->capture_default_str();
  app.add_flag("--check-plan", o.check_plan, "run one step, plan it, and check the plan equals it on every rank");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return env.world_rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  try {
    if (o.compare && (!o.checkpoint.empty() || !o.resume.empty()))
      throw mt::error("--compare-layouts trains every layout from scratch; it takes no --checkpoint or --resume");
    if (o.plan_table3) return plan_table3(env, o);
    if (o.plan) return plan(env, o);
    grid g(env, {o.mesh[0], o.mesh[1]});
    const auto [data, tok] = prepare_data(env, o);
    if (o.check_plan) return check_plan(g, o, data);
    const bool root = env.world_rank() == 0;
    if (root)
      std::printf("translation: %d + %d layers, d_model %lld, heads %lld, d_kv %lld, d_ff %lld, vocab %lld; batch %lld, "
                  "lengths %lld / %lld; mesh [rows=%d x cols=%d]; Adam lr %g, dropout %g\n",
                  (int)o.layers, (int)o.layers, (long long)o.d_model, (long long)o.heads, (long long)o.d_kv,
                  (long long)o.d_ff, (long long)o.vocab, (long long)o.batch, (long long)o.src_length,
                  (long long)o.tgt_length, g.size<rows>(), g.size<cols>(), o.lr, o.dropout);
    if (!o.compare) {
      if (root) std::printf("layout %s; local kernels: %s\n", o.layout.c_str(), mt::kernels::describe().c_str());
      const auto r = train_layout(o.layout, g, o, data, tok.get(), true);
      if (root) {
        std::printf("parameters: %lld\n", (long long)r.parameters);
        if (!r.losses.empty()) write_curve(o, r);
      }
      return r.decode_ok ? 0 : 3;
    }
    const std::vector<std::string> names{"data", "model_parallel", "dp_mp"};
    std::vector<std::vector<double>> runs;
    for (const auto& n : names) runs.push_back(train_layout(n, g, o, data, nullptr, false).losses);
    double worst = 0;
    if (root) std::printf("%5s %12s %15s %12s %10s\n", "step", "data", "model_parallel", "dp_mp", "max rel");
    for (std::size_t s = 0; s < runs[0].size(); ++s) {
      double d = 0;
      for (std::size_t r = 1; r < runs.size(); ++r) d = std::max(d, std::abs(runs[r][s] - runs[0][s]) / std::abs(runs[0][s]));
      if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
      if (root) std::printf("%5zu %12.6f %15.6f %12.6f %10.2e\n", s + 1, runs[0][s], runs[1][s], runs[2][s], d);
    }
    const bool falls = !runs[0].empty() && runs[0].back() < runs[0].front();
    const bool ok = worst <= o.tolerance && falls;
    if (root)
      std::printf("largest relative difference between layouts: %.2e (tolerance %.0e); loss %s: %s\n", worst, o.tolerance,
                  falls ? "falls" : "DOES NOT FALL", ok ? "agree" : "DISAGREE");
    return ok ? 0 : 3;
  } catch (const std::exception& e) {
    return env.fail(e, "translation: error: ");
  }
}
