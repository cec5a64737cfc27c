#pragma once
// Step time predicted from a plan (plan/report.hpp) and a machine's measured rates: an alpha-beta
// model per collective plus the local work,
//
//   time = kernels x seconds_per_kernel + allocated bytes / bytes_per_s + FLOPs / gemm rate
//          + optimizer bytes / optimizer_bytes_per_s + host bytes / host_bytes_per_s
//          + sum over collectives of what each leaves exposed,
//
// the gemm rate that of products of that size (measured at a few sizes, interpolated on log(m n k)),
// a collective's cost alpha + bytes x beta, alpha and beta measured for that collective over groups
// of that many processors. A blocking collective is exposed whole; a started one (a bucket's
// allreduce under gradient overlap, a prefetched gather, a dispatch in flight, a ring's hop) only
// for what the local work between its start and its wait does not cover, the plan's order replayed
// (plan/timeline.hpp; communication_of below). The replay assumes the transfer progresses while
// the work runs (a GPU's collectives on their own stream, or an MPI with a progress thread) and
// serialises transfers over the same axes. The rates
// are measured with every rank of the run busy at once (benchmarks/bench_calibrate.cpp), so a machine
// with more ranks than cores is calibrated as it will run. docs/plan-mode.md says how well it predicts.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include <algorithm>
#include <vector>

#include "../error.hpp"
#include "collective.hpp"
#include "report.hpp"
#include "timeline.hpp"

namespace meshtensor {

struct machine_calibration {
  int ranks = 1;                      // the rank count it was measured at
  double gemm_flops_per_s = 1e10;     // a float32 product, every rank at once (sizes not measured)
  std::map<double, double> gemm_rates;  // m n k of one product -> its FLOP/s
  // The same for products of bf16 operands ("gemm_bf16" lines); none: gemm_rates serve them too.
  std::map<double, double> bf16_gemm_rates;
  double bytes_per_s = 1e10;          // bytes of results an elementwise kernel writes per second
  double optimizer_bytes_per_s = 1e10;  // bytes of parameters an Adam step updates per second
  double host_bytes_per_s = 1e10;       // bytes from_host copies into a tensor per second
  double seconds_per_kernel = 5e-6;   // an op's fixed cost (host work and launch)
  // Whether the calibrated machine's bf16 products widen their operands to float in scratch
  // (kernels/product.hpp's portable path): a plan for it counts that scratch (plan_ledger's
  // counts_host_scratch). Written by bench_calibrate; a device's file (a GPU's) has none.
  bool bf16_products_widened = false;
  struct alpha_beta {
    double alpha = 0;  // seconds per call
    double beta = 0;   // seconds per byte sent
  };
  // By collective and group size.
  std::map<std::pair<collective, int>, alpha_beta> collectives;

  // FLOP/s of a product of m n k = mnk: interpolated on log(mnk) between the sizes measured,
  // the nearest one's beyond them.
  double gemm_rate(double mnk) const { return interpolated(gemm_rates, mnk); }
  // FLOP/s of a product of bf16 operands: from the gemm_bf16 figures, or gemm_rate's where none.
  double bf16_gemm_rate(double mnk) const {
    return bf16_gemm_rates.empty() ? gemm_rate(mnk) : interpolated(bf16_gemm_rates, mnk);
  }

  // The coefficients for groups of `size` processors: measured, or the nearest size measured.
  alpha_beta coefficients(collective kind, int size) const {
    const alpha_beta* best = nullptr;
    int distance = 0;
    for (const auto& [key, ab] : collectives)
      if (key.first == kind) {
        const int d = key.second > size ? key.second - size : size - key.second;
        if (!best || d < distance) best = &ab, distance = d;
      }
    if (!best)
      throw error(detail::cat("machine_calibration: no figures for ", to_string(kind),
                              "; recalibrate (benchmarks/bench_calibrate.cpp measures every collective)"));
    return *best;
  }

  // A text file of "key value..." lines, '#' comments.
  void save(const std::string& path) const {
    std::ofstream out(path);
    out << "# meshtensor machine calibration (benchmarks/bench_calibrate.cpp); collective lines: name group_size "
           "alpha_s beta_s_per_byte\n";
    out.precision(6);
    out << "ranks " << ranks << "\ngemm_flops_per_s " << gemm_flops_per_s << "\nbytes_per_s " << bytes_per_s
        << "\noptimizer_bytes_per_s " << optimizer_bytes_per_s << "\nhost_bytes_per_s " << host_bytes_per_s
        << "\nseconds_per_kernel " << seconds_per_kernel << "\nbf16_products_widened " << bf16_products_widened
        << "\n";
    for (const auto& [mnk, rate] : gemm_rates) out << "gemm " << mnk << ' ' << rate << "\n";
    for (const auto& [mnk, rate] : bf16_gemm_rates) out << "gemm_bf16 " << mnk << ' ' << rate << "\n";
    for (const auto& [key, ab] : collectives)
      out << "collective " << to_string(key.first) << ' ' << key.second << ' ' << ab.alpha << ' ' << ab.beta << "\n";
    if (!out) throw io_error(detail::cat("cannot write the calibration '", path, "'"));
  }
  static machine_calibration load(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw io_error(detail::cat("cannot open the calibration '", path, "'"));
    machine_calibration c;
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty() || line[0] == '#') continue;
      std::istringstream s(line);
      std::string key;
      s >> key;
      bool ok = true;
      if (key == "ranks") ok = static_cast<bool>(s >> c.ranks);
      else if (key == "gemm_flops_per_s") ok = static_cast<bool>(s >> c.gemm_flops_per_s);
      else if (key == "bytes_per_s") ok = static_cast<bool>(s >> c.bytes_per_s);
      else if (key == "optimizer_bytes_per_s") ok = static_cast<bool>(s >> c.optimizer_bytes_per_s);
      else if (key == "host_bytes_per_s") ok = static_cast<bool>(s >> c.host_bytes_per_s);
      else if (key == "seconds_per_kernel") ok = static_cast<bool>(s >> c.seconds_per_kernel);
      else if (key == "bf16_products_widened") ok = static_cast<bool>(s >> c.bf16_products_widened);
      else if (key == "gemm" || key == "gemm_bf16") {
        double mnk = 0, rate = 0;
        ok = static_cast<bool>(s >> mnk >> rate) && mnk > 0 && rate > 0;
        if (ok) (key == "gemm" ? c.gemm_rates : c.bf16_gemm_rates)[mnk] = rate;
      }
      else if (key == "collective") {
        std::string name;
        int size = 0;
        alpha_beta ab;
        ok = static_cast<bool>(s >> name >> size >> ab.alpha >> ab.beta);
        bool known = false;
        for (int k = 0; k <= static_cast<int>(collective::send); ++k)
          if (name == to_string(static_cast<collective>(k))) {
            c.collectives[{static_cast<collective>(k), size}] = ab;
            known = true;
          }
        ok = ok && known;
      } else {
        ok = false;
      }
      if (!ok) throw io_error(detail::cat("the calibration '", path, "', line ", number, ": cannot read '", line, "'"));
    }
    return c;
  }

 private:
  // gemm_rate's rule over the figures given; none: gemm_flops_per_s.
  double interpolated(const std::map<double, double>& rates, double mnk) const {
    if (rates.empty()) return gemm_flops_per_s;
    auto hi = rates.lower_bound(mnk);
    if (hi == rates.begin()) return hi->second;
    if (hi == rates.end()) return std::prev(hi)->second;
    const auto lo = std::prev(hi);
    const double w = (std::log(mnk) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
    return lo->second + w * (hi->second - lo->second);
  }
};

struct step_time {
  double kernels = 0, memory = 0, products = 0;
  double communication = 0;  // exposed: what the step waits for
  double hidden = 0;         // communication behind local work (not in the total)
  double total() const { return kernels + memory + products + communication; }
};

// "12.345 ms: kernels 1.234, memory 0.567, products 9.876, communication 0.668" (ms), and
// "(0.321 more hidden behind the work)" where some is.
inline std::string to_string(const step_time& t) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  s << 1e3 * t.total() << " ms: kernels " << 1e3 * t.kernels << ", memory " << 1e3 * t.memory << ", products "
    << 1e3 * t.products << ", communication " << 1e3 * t.communication;
  if (1e3 * t.hidden >= 0.0005) s << " (" << 1e3 * t.hidden << " more hidden behind the work)";  // shown as 0.001 or more
  return s.str();
}

// A plan's communication by (collective, axes), on a calibrated machine: what it costs, and the
// part of that the step waits for.
struct communication_cost {
  std::int64_t calls = 0, bytes = 0;
  double seconds = 0;  // alpha per call + beta per byte
  double exposed = 0;  // not hidden behind local work
};

// Plans made from now on describe a run on the machine c was measured on: they count this host's
// kernel scratch (the portable bf16 product's widened operands) only where c's products widen too,
// so a plan for a GPU's calibration made on a CPU without bf16 kernels holds what the GPU would.
inline void plan_for(const machine_calibration& c) {
  detail::plan_ledger::get().counts_host_scratch = c.bf16_products_widened;
}

namespace detail {
inline double cost_of(const machine_calibration& c, const mesh_shape& shape, collective op, axis_set axes,
                      std::int64_t calls, std::int64_t bytes) {
  // A send (pipeline stages) goes to one other processor, outside the mesh's axes.
  const int size = op == collective::send ? 2 : shape.size_over(axes);
  if (size <= 1) return 0;  // counted, but no message leaves the processor
  const auto ab = c.coefficients(op, size);
  return static_cast<double>(calls) * ab.alpha + static_cast<double>(bytes) * ab.beta;
}
// The time of local work as predict() times it.
inline double work_seconds(const plan_work& w, const machine_calibration& c) {
  double t = static_cast<double>(w.kernels) * c.seconds_per_kernel +
             static_cast<double>(w.allocated_bytes) / c.bytes_per_s +
             static_cast<double>(w.optimizer_bytes) / c.optimizer_bytes_per_s +
             static_cast<double>(w.host_bytes) / c.host_bytes_per_s;
  for (const auto& p : w.products) {
    const double mnk = static_cast<double>(p.mnk);
    t += static_cast<double>(p.flops) / (p.bf16 ? c.bf16_gemm_rate(mnk) : c.gemm_rate(mnk));
  }
  return t;
}
}  // namespace detail

// Where a replayed step spent its time (seconds from its start): its local work, each collective's
// transfer (begin to end, over its axes), and the work's waits for transfers (exposed).
struct replayed_span {
  double begin = 0, end = 0;
};
struct replayed_transfer {
  comm_key key;
  replayed_span span;
};
struct replayed_step {
  std::vector<replayed_span> work, waits;
  std::vector<replayed_transfer> transfers;
  double end = 0;
};

namespace detail {
// communication_of's replay; where `spans` is given, it also says when each thing ran.
inline std::map<comm_key, communication_cost> replay(const plan_report& r, const machine_calibration& c,
                                                     replayed_step* spans) {
  std::map<comm_key, communication_cost> out;
  if (r.timeline.events.empty()) {
    for (const auto& [key, n] : r.totals) {
      const double t = detail::cost_of(c, r.shape, key.first, key.second, n.calls, n.bytes);
      out[key] = {n.calls, n.bytes, t, t};
    }
    return out;
  }
  struct in_flight {
    comm_key key;
    double seconds = 0, end = 0;
  };
  std::map<std::int64_t, in_flight> started;  // by ticket
  std::map<axis_set, double> free_at;  // when the last transfer over these axes ends
  double now = 0;
  const auto work = [&](const plan_work& w) {
    const double d = detail::work_seconds(w, c);
    if (spans && d > 0) spans->work.push_back({now, now + d});
    now += d;
  };
  const auto wait_until = [&](double t) {
    if (t <= now) return 0.0;
    if (spans) spans->waits.push_back({now, t});
    const double waited = t - now;
    now = t;
    return waited;
  };
  for (const auto& e : r.timeline.events) {
    work(e.before);
    const comm_key key{e.op, e.axes};
    if (e.kind == plan_event_kind::waited) {
      const auto f = started.find(e.ticket);
      if (f == started.end()) continue;  // started before the report's start
      out[f->second.key].exposed += wait_until(f->second.end);
      started.erase(f);
      continue;
    }
    const double d = detail::cost_of(c, r.shape, e.op, e.axes, 1, e.bytes);
    auto& cost = out[key];
    cost.calls += 1;
    cost.bytes += e.bytes;
    cost.seconds += d;
    double& link = free_at[e.axes];
    const double begin = std::max(now, link), end = begin + d;
    link = end;
    if (spans && d > 0) spans->transfers.push_back({key, {begin, end}});
    if (e.kind == plan_event_kind::blocking)
      cost.exposed += wait_until(end);
    else
      started[e.ticket] = {key, d, end};
  }
  for (const auto& [ticket, f] : started) out[f.key].exposed += f.seconds;
  if (spans) {
    work(r.timeline.after);
    spans->end = now;
    for (const auto& t : spans->transfers) spans->end = std::max(spans->end, t.span.end);
  }
  return out;
}
}  // namespace detail

// The plan's order replayed on the machine (plan/timeline.hpp): a blocking collective waits for
// its transfer; a started one's transfer runs from its start (or once the transfers before it over
// the same axes end) while the work goes on, and its wait costs what is left of it. One started
// and never waited in the plan (a pipeline's send, which the next stage's receive waits for) is
// exposed whole. A report without a timeline (made by hand) counts every collective as blocking.
inline std::map<comm_key, communication_cost> communication_of(const plan_report& r, const machine_calibration& c) {
  return detail::replay(r, c, nullptr);
}

// The replayed step as a picture `width` characters wide: a row for the work ('#' computing, '.'
// waiting for a transfer) and one per set of axes ('=' a transfer in flight over them), each
// character a width-th of the step (a character holds a mark where anything of its kind ran in it).
// docs/training.md draws one step of sequence parallelism this way.
inline std::string timeline_picture(const plan_report& r, const machine_calibration& c, int width = 100) {
  replayed_step step;
  detail::replay(r, c, &step);
  if (step.end <= 0 || width < 1) return "(nothing timed)\n";
  const auto row = [&](const std::vector<replayed_span>& spans, char mark, std::string& line) {
    for (const auto& sp : spans) {
      // Rounding's last bits do not spill a span into the next character.
      const int from = static_cast<int>(sp.begin / step.end * width + 1e-9);
      const int to = std::max(from + 1, static_cast<int>(std::ceil(sp.end / step.end * width - 1e-9)));
      for (int i = from; i < std::min(to, width); ++i) line[static_cast<std::size_t>(i)] = mark;
    }
  };
  std::string work(static_cast<std::size_t>(width), ' ');
  row(step.work, '#', work);
  row(step.waits, '.', work);
  std::map<std::string, std::vector<replayed_span>> by_axes;
  for (const auto& t : step.transfers)
    by_axes[t.key.first == collective::send ? "(another stage)" : r.shape.axes_string(t.key.second)].push_back(t.span);
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  s << "timeline of the step, " << 1e3 * step.end << " ms across ('#' work, '.' waiting, '=' in flight):\n";
  s << "  work             |" << work << "|\n";
  for (const auto& [axes, spans] : by_axes) {
    std::string line(static_cast<std::size_t>(width), ' ');
    row(spans, '=', line);
    std::string name = "  " + axes;
    name.resize(std::max<std::size_t>(name.size(), 19), ' ');
    s << name << "|" << line << "|\n";
  }
  return s.str();
}

// The communication of a plan by axes and collective (ms): its cost and what of it is exposed,
// the lines --plan prints after the predicted step.
inline std::string communication_table(const plan_report& r, const machine_calibration& c) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  s << "communication predicted (ms)      axes              calls      cost   exposed    hidden\n";
  const auto cell = [&](const std::string& v, std::size_t w) { s << v << std::string(v.size() < w ? w - v.size() : 1, ' '); };
  for (const auto& [key, cost] : communication_of(r, c)) {
    if (cost.seconds <= 0) continue;
    cell(std::string("  ") + to_string(key.first), 34);
    cell(key.first == collective::send ? "(another stage)" : r.shape.axes_string(key.second), 16);
    s.width(7);
    s << cost.calls << ' ';
    for (const double v : {cost.seconds, cost.exposed, std::max(0.0, cost.seconds - cost.exposed)}) {
      s.width(9);
      s << 1e3 * v << ' ';
    }
    s << '\n';
  }
  return s.str();
}

// The predicted time of what a plan recorded, on the calibrated machine.
inline step_time predict(const plan_report& r, const machine_calibration& c) {
  step_time t;
  t.kernels = static_cast<double>(r.kernels) * c.seconds_per_kernel;
  t.memory = static_cast<double>(r.allocated_bytes) / c.bytes_per_s +
             static_cast<double>(r.optimizer_bytes) / c.optimizer_bytes_per_s +
             static_cast<double>(r.host_bytes) / c.host_bytes_per_s;
  if (r.product_flops_by_size.empty()) t.products = static_cast<double>(r.total_flops) / c.gemm_flops_per_s;
  for (const auto& [mnk, flops] : r.product_flops_by_size) {
    const auto bf16 = r.bf16_product_flops_by_size.find(mnk);
    const double in_bf16 = bf16 == r.bf16_product_flops_by_size.end() ? 0.0 : static_cast<double>(bf16->second);
    const double size = static_cast<double>(mnk);
    t.products += (static_cast<double>(flops) - in_bf16) / c.gemm_rate(size) + in_bf16 / c.bf16_gemm_rate(size);
  }
  for (const auto& [key, cost] : communication_of(r, c)) {
    t.communication += cost.exposed;
    t.hidden += std::max(0.0, cost.seconds - cost.exposed);  // not a rounding's -1e-20
  }
  return t;
}

// One candidate layout's plan, as rank_layouts orders them.
struct layout_candidate {
  std::string name;     // the user's name for it, or layout_string<L>() (layout/candidates.hpp)
  plan_report report;   // of the step planned under it
  step_time time;       // predicted
  bool fits = true;     // its peak bytes within the budget
};

// Orders candidates: those whose peak fits the budget per processor first, by predicted step time
// (ties: less memory); then those that do not fit, by peak bytes.
inline std::vector<layout_candidate> rank_layouts(std::vector<layout_candidate> candidates, std::int64_t budget_bytes) {
  for (auto& c : candidates) c.fits = c.report.peak_bytes <= budget_bytes;
  std::stable_sort(candidates.begin(), candidates.end(), [](const layout_candidate& a, const layout_candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits && a.time.total() != b.time.total()) return a.time.total() < b.time.total();
    return a.report.peak_bytes < b.report.peak_bytes;
  });
  return candidates;
}

// rank_layouts' result as a table: rank, name, predicted time and its parts (ms), peak MiB per
// processor, fits.
inline std::string ranking_table(const std::vector<layout_candidate>& ranked) {
  std::size_t width = 6;
  for (const auto& k : ranked) width = std::max(width, k.name.size());
  std::ostringstream s;
  s.setf(std::ios::fixed);
  const auto cell = [&](auto v, int w, int precision = 3) -> std::ostringstream& {
    s.width(w);
    s.precision(precision);
    s << v << ' ';
    return s;
  };
  s << "rank " << std::string("layout") + std::string(width - 6, ' ')
    << " predicted_ms kernels_ms  memory_ms products_ms    comm_ms     peak_MiB fits\n";
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    const auto& k = ranked[i];
    cell(i + 1, 4) << k.name << std::string(width - k.name.size(), ' ') << ' ';
    cell(1e3 * k.time.total(), 12);
    cell(1e3 * k.time.kernels, 10);
    cell(1e3 * k.time.memory, 10);
    cell(1e3 * k.time.products, 11);
    cell(1e3 * k.time.communication, 10);
    cell(static_cast<double>(k.report.peak_bytes) / 1048576.0, 12, 1) << (k.fits ? "yes" : "no") << '\n';
  }
  return s.str();
}

}  // namespace meshtensor
