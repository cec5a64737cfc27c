#pragma once
// What a planned run (mesh::planned, docs/plan-mode.md) would cost the processor it stands for: the
// collectives by op, with calls and exact bytes; the FLOPs of the local products; the bytes of the
// tensors alive, now and at the peak, by kind. As a table (table()) or JSON (json()).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../geometry/mesh_shape.hpp"
#include "collective.hpp"
#include "ledger.hpp"
#include "timeline.hpp"

namespace meshtensor {

struct plan_report {
  struct collective_row {
    std::string op;          // "einsum", "layer_norm (backward)", ...
    std::string collective;  // "allreduce", ...
    std::string axes;        // "rows, cols"
    std::int64_t calls = 0;
    std::int64_t bytes = 0;  // sent by this processor
  };
  struct flops_row {
    std::string op;
    std::int64_t flops = 0;
  };
  using kind_bytes = std::array<std::int64_t, memory_kind_count>;

  mesh_shape shape;
  std::vector<int> coords;
  std::vector<collective_row> collectives;  // by op
  comm_counters totals;                     // by (collective, axes): what the mesh's counters hold
  plan_timeline timeline;                   // their order among the local work (cost_model.hpp replays it)
  std::vector<flops_row> flops;
  std::int64_t total_flops = 0;
  std::map<std::int64_t, std::int64_t> product_flops_by_size;  // by m n k of one product
  std::map<std::int64_t, std::int64_t> bf16_product_flops_by_size;  // the part of them whose operands are bf16
  std::int64_t kernels = 0;          // kernel launches (a product counts one)
  std::int64_t allocated_bytes = 0;  // bytes of every slice allocated (results and scratch)
  std::int64_t optimizer_bytes = 0;  // bytes of parameters updated in place by optimizers
  std::int64_t host_bytes = 0;       // bytes the host copied into tensors (from_host)
  std::int64_t waits = 0;            // the host's waits for the device (kernels::fence; host_waits())
  std::map<std::string, std::int64_t> activations_at_peak_by_op;  // by the op (and pass) that allocated them
  // Activations alive when a backward pass started (the largest such moment): what the tape saved
  // for it, by the op that allocated each (0 when no backward pass ran).
  std::int64_t saved_for_backward = 0;
  std::map<std::string, std::int64_t> saved_for_backward_by_op;
  kind_bytes live{};     // tensors alive when the report was taken
  kind_bytes at_peak{};  // at the peak of the bytes alive
  std::int64_t peak_bytes = 0;

  std::int64_t bytes_of(memory_kind k) const { return live[static_cast<int>(k)]; }
  std::int64_t peak_bytes_of(memory_kind k) const { return at_peak[static_cast<int>(k)]; }

  std::string table() const {
    std::string s = detail::cat("planned processor ", coords_string(), " of mesh ", shape.to_string(), "\n");
    s += line("op", "collective", "axes", "calls", "bytes");
    std::int64_t calls = 0, bytes = 0;
    for (const auto& r : collectives) {
      s += line(r.op, r.collective, r.axes, std::to_string(r.calls), std::to_string(r.bytes));
      calls += r.calls;
      bytes += r.bytes;
    }
    s += line("total", "", "", std::to_string(calls), std::to_string(bytes));
    std::int64_t bf16_flops = 0;
    for (const auto& [mnk, f] : bf16_product_flops_by_size) bf16_flops += f;
    s += detail::cat("local FLOPs (products): ", total_flops, "; kernels: ", kernels, "; bytes allocated: ",
                     allocated_bytes, "; updated by the optimizer: ", optimizer_bytes, "; copied from the host: ",
                     host_bytes, "; FLOPs of products of bf16 operands: ", bf16_flops, "; waits for the device: ", waits,
                     "\n");
    for (const auto& f : flops) s += detail::cat("  ", f.op, ": ", f.flops, "\n");
    s += "memory (bytes)             now    at the peak\n";
    for (int k = 0; k < memory_kind_count; ++k)
      s += padded(detail::cat("  ", to_string(static_cast<memory_kind>(k))), 20) + padded(std::to_string(live[k]), 14, true) +
           padded(std::to_string(at_peak[k]), 15, true) + "\n";
    std::int64_t now = 0;
    for (auto b : live) now += b;
    s += padded("  total", 20) + padded(std::to_string(now), 14, true) + padded(std::to_string(peak_bytes), 15, true) + "\n";
    s += "activations (bytes), by the op that allocated them   when the backward pass began    at the peak\n";
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> rows;
    for (const auto& [op, bytes] : saved_for_backward_by_op) rows[op].first = bytes;
    for (const auto& [op, bytes] : activations_at_peak_by_op) rows[op].second = bytes;
    for (const auto& [op, b] : rows)
      s += padded(detail::cat("  ", op), 48) + padded(std::to_string(b.first), 24, true) +
           padded(std::to_string(b.second), 15, true) + "\n";
    return s;
  }

  std::string json() const {
    std::string s = "{\"mesh\": {";
    for (std::size_t i = 0; i < shape.axis_names().size(); ++i)
      s += detail::cat(i ? ", " : "", quoted(shape.axis_names()[i]), ": ", shape.sizes()[i]);
    s += "}, \"coords\": [";
    for (std::size_t i = 0; i < coords.size(); ++i) s += detail::cat(i ? ", " : "", coords[i]);
    s += "], \"collectives\": [";
    for (std::size_t i = 0; i < collectives.size(); ++i) {
      const auto& r = collectives[i];
      s += detail::cat(i ? ", " : "", "{\"op\": ", quoted(r.op), ", \"collective\": ", quoted(r.collective),
                       ", \"axes\": ", quoted(r.axes), ", \"calls\": ", r.calls, ", \"bytes\": ", r.bytes, "}");
    }
    s += detail::cat("], \"kernels\": ", kernels, ", \"allocated_bytes\": ", allocated_bytes, ", \"optimizer_bytes\": ",
                     optimizer_bytes, ", \"host_bytes\": ", host_bytes, ", \"waits\": ", waits,
                     ", \"flops\": {\"total\": ", total_flops);
    for (const auto& f : flops) s += detail::cat(", ", quoted(f.op), ": ", f.flops);
    s += "}, \"memory\": {\"now\": {";
    for (int k = 0; k < memory_kind_count; ++k)
      s += detail::cat(k ? ", " : "", quoted(to_string(static_cast<memory_kind>(k))), ": ", live[k]);
    s += "}, \"at_peak\": {";
    for (int k = 0; k < memory_kind_count; ++k)
      s += detail::cat(k ? ", " : "", quoted(to_string(static_cast<memory_kind>(k))), ": ", at_peak[k]);
    const auto by_op = [&](const std::map<std::string, std::int64_t>& m) {
      std::string o = "{";
      for (const auto& [op, bytes] : m) o += detail::cat(o.size() > 1 ? ", " : "", quoted(op), ": ", bytes);
      return o + "}";
    };
    s += detail::cat("}, \"activations_at_peak_by_op\": ", by_op(activations_at_peak_by_op),
                     ", \"saved_for_backward\": ", saved_for_backward,
                     ", \"saved_for_backward_by_op\": ", by_op(saved_for_backward_by_op), ", \"peak\": ", peak_bytes, "}}");
    return s;
  }

 private:
  std::string coords_string() const {
    std::string s = "(";
    for (std::size_t i = 0; i < coords.size(); ++i) s += detail::cat(i ? ", " : "", shape.axis_names()[i], "=", coords[i]);
    return s + ")";
  }
  static std::string padded(std::string s, std::size_t w, bool right = false) {
    if (s.size() >= w) return s + " ";
    return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
  }
  static std::string line(const std::string& op, const std::string& c, const std::string& axes, const std::string& calls,
                          const std::string& bytes) {
    return padded(op, 34) + padded(c, 15) + padded(axes, 14) + padded(calls, 8, true) + padded(bytes, 16, true) + "\n";
  }
  static std::string quoted(const std::string& v) {
    std::string s = "\"";
    for (char ch : v) {
      if (ch == '"' || ch == '\\') s += '\\';
      s += ch;
    }
    return s + "\"";
  }
};

// The report of a planned mesh's run so far (since it was made or since reset_plan).
template <class M>
plan_report plan_report_of(const M& m) {
  if (!m.is_planned())
    throw error("plan_report_of: the mesh is not planned; make it with mesh::planned(sizes)");
  const auto& ledger = detail::plan_ledger::get();
  plan_report r;
  r.shape = m.shape();
  r.coords = m.communicator().coords();
  for (const auto& [key, rec] : ledger.collectives()) {
    const auto& [op, kind, axes] = key;
    r.collectives.push_back({op, kind, m.axes_string(axes), rec.calls, rec.bytes});
  }
  r.totals = m.counters();
  r.timeline = ledger.timeline();
  for (const auto& [op, f] : ledger.flops()) {
    r.flops.push_back({op, f});
    r.total_flops += f;
  }
  r.kernels = ledger.kernels();
  r.product_flops_by_size = ledger.product_flops_by_size();
  r.bf16_product_flops_by_size = ledger.bf16_product_flops_by_size();
  r.allocated_bytes = ledger.allocated_bytes();
  r.optimizer_bytes = ledger.optimizer_bytes();
  r.host_bytes = ledger.host_bytes();
  r.waits = ledger.waits();
  r.live = ledger.live();
  r.at_peak = ledger.at_peak();
  r.activations_at_peak_by_op = ledger.activations_at_peak_by_op();
  r.saved_for_backward = std::max<std::int64_t>(ledger.saved_for_backward(), 0);
  r.saved_for_backward_by_op = ledger.saved_for_backward_by_op();
  r.peak_bytes = ledger.peak_total();
  return r;
}

// Starts a new report on a planned mesh: counters, collectives and FLOPs from zero, the peak from
// the bytes alive now (parameters and optimizer state stay counted while they live).
template <class M>
void reset_plan(const M& m) {
  m.reset_counters();
  detail::plan_ledger::get().reset();
}

// What one real step and its plan disagree on, empty when nothing: the collectives per (kind,
// axes) with their calls and bytes (less the bytes the data routes, whose sum over the processors
// agree_on_plan compares), the bytes of parameters and optimizer state, and the host's
// waits for the device (when `waits`, the step's host_waits(), is given). The examples'
// --check-plan prints it on each rank that differs (Mesh: the real mesh, which names the axes).
template <class Mesh>
std::string plan_differences(const Mesh& m, const comm_counters& counted, const plan_report& planned,
                             std::int64_t parameter_bytes, std::int64_t optimizer_state_bytes,
                             std::optional<std::int64_t> waits = std::nullopt) {
  std::string wrong;
  const auto fixed = [](const comm_counters& c) {
    comm_counters f;
    for (const auto& [key, n] : c) f[key] = {n.calls, n.bytes - n.routed_bytes};
    return f;
  };
  if (fixed(planned.totals) != fixed(counted)) {
    wrong += "collectives differ:\n";
    for (const auto& [what, c] : {std::pair{"real", &counted}, std::pair{"planned", &planned.totals}})
      for (const auto& [key, n] : *c)
        wrong += detail::cat("  ", what, " ", to_string(key.first), " over {", m.axes_string(key.second), "}: ", n.calls,
                             " calls, ", n.bytes, " bytes",
                             n.routed_bytes > 0 ? detail::cat(" (", n.routed_bytes, " of them routed by the data)") : "",
                             "\n");
  }
  if (planned.bytes_of(memory_kind::parameters) != parameter_bytes)
    wrong += detail::cat("parameter bytes: planned ", planned.bytes_of(memory_kind::parameters), ", real ",
                         parameter_bytes, "\n");
  if (planned.bytes_of(memory_kind::optimizer_state) != optimizer_state_bytes)
    wrong += detail::cat("optimizer state bytes: planned ", planned.bytes_of(memory_kind::optimizer_state), ", real ",
                         optimizer_state_bytes, "\n");
  if (waits && planned.waits != *waits)
    wrong += detail::cat("waits for the device: planned ", planned.waits, ", real ", *waits, "\n");
  return wrong;
}

}  // namespace meshtensor
