#pragma once
// --generate: sampling through the key-value cache under the decode layout, and --check-generate.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "model.hpp"

// The axes that split the cache's positions under decode layout D, for the report.
template <class D>
const char* cache_axes() {
  using A = typename D::template axes_of<memory_length>;
  if constexpr (std::is_same_v<A, mt::type_list<>>) return "no axis";
  else if constexpr (std::is_same_v<A, mt::type_list<rows>>) return "rows";
  else return "cols";
}

// --generate N: N bytes sampled after --prompt, one at a time through the key-value cache, with the
// per-token latency (the logits gathered on every rank, so each knows the next byte). With
// --check-generate, the cached logits of every position are compared with one full forward pass
// over the whole sequence. Returns false when they disagree.
// Decoding runs on dm, the model under decode_layout_t<L> (m itself, or its copy there); the check's
// full forward pass on m, under L.
template <class L, class D>
bool generate_on(const model<L>& m, const model<D>& dm, const grid& g, const options& o) {
  using ids_t = mt::tensor<float, L, batch, length>;
  using token_t = mt::tensor<float, D, batch, length>;
  const std::int64_t n_prompt = static_cast<std::int64_t>(o.prompt.size()), total = n_prompt + o.generate;
  if (o.vocab != 256) throw mt::error("--generate samples bytes: it needs --vocab 256");
  if (n_prompt == 0) throw mt::error("--generate needs a --prompt of at least one byte");
  if (total > o.length)
    throw mt::error(fmt::format("--generate: the prompt's {} bytes and {} new ones exceed --length {} (the positions "
                                "the model has)", n_prompt, o.generate, o.length));
  // Positions 0 .. total - 2 go through the cache (the last byte is only sampled).
  typename model<D>::kv_cache cache(dm, g, total - 1);
  std::mt19937_64 rng(o.seed * 31 + 7);  // the same draws on every rank
  std::vector<float> seq(o.prompt.begin(), o.prompt.end());
  std::vector<std::vector<float>> cached;  // each position's logits, for --check-generate
  std::vector<double> token_ms;
  for (std::int64_t p = 0; p + 1 < total; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    auto lv = mt::gather_all(dm.next_logits(mt::from_host<token_t>(g, {1, 1}, std::span<const float>(&seq[p], 1)), p, cache));
    if (p + 1 >= n_prompt) {
      // The next byte: the most likely, or drawn from softmax(logits / temperature).
      std::size_t next = std::max_element(lv.begin(), lv.end()) - lv.begin();
      if (o.temperature > 0) {
        std::vector<double> w(lv.size());
        for (std::size_t i = 0; i < lv.size(); ++i) w[i] = std::exp((lv[i] - lv[next]) / o.temperature);
        next = std::discrete_distribution<std::size_t>(w.begin(), w.end())(rng);
      }
      seq.push_back(static_cast<float>(next));
      token_ms.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (o.check_generate) cached.push_back(std::move(lv));
  }
  const bool root = g.rank() == 0;
  // The cache this processor holds (keys and values of every block), against the whole cache: the
  // context layout splits its positions.
  std::int64_t held = 0, whole = 0;
  for (const auto* list : {&cache.k, &cache.v})
    for (const auto& t : *list) held += t.local_size(), whole += t.size();
  std::int64_t most_held = held;
  MPI_Allreduce(&held, &most_held, 1, MPI_INT64_T, MPI_MAX, g.communicator().cart());
  // The median of the first and of the last 20 tokens: flat when a token's cost does not grow
  // with its position.
  const auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const auto ends = static_cast<std::ptrdiff_t>(std::min<std::size_t>(20, token_ms.size()));
  const double first_ms = median_of({token_ms.begin(), token_ms.begin() + ends});
  const double last_ms = median_of({token_ms.end() - ends, token_ms.end()});
  std::sort(token_ms.begin(), token_ms.end());
  if (root) {
    std::string text;
    for (float c : seq) text += (c >= 32 && c < 127) || c == '\n' ? static_cast<char>(c) : '?';
    std::printf("generated %lld bytes after a prompt of %lld on %d ranks (temperature %g):\n%s\n",
                (long long)o.generate, (long long)n_prompt, g.nprocs(), o.temperature, text.c_str());
    std::printf("per-token latency: median %.3f ms, min %.3f ms, max %.3f ms; median of the first %td %.3f ms, "
                "of the last %td %.3f ms\n",
                token_ms[token_ms.size() / 2], token_ms.front(), token_ms.back(), ends, first_ms, ends, last_ms);
    std::printf("key-value cache: %lld positions, at most %.1f KiB per rank of %.1f KiB (positions split over %s)\n",
                (long long)(total - 1), double(most_held) * sizeof(float) / 1024, double(whole) * sizeof(float) / 1024,
                cache_axes<D>());
  }
  if (!o.check_generate) return true;
  // One forward pass over the sequence (without its last byte): position p's logits must be the
  // cached run's.
  const std::vector<float> ids(seq.begin(), seq.end() - 1);
  const auto full = mt::gather_all(m.logits(mt::from_host<ids_t>(g, {1, total - 1}, ids), o, 0));
  double worst = 0;
  for (std::int64_t p = 0; p + 1 < total; ++p)
    for (std::int64_t v = 0; v < o.vocab; ++v)
      worst = std::max(worst, std::abs(double(full[p * o.vocab + v]) - double(cached[p][v])));
  const bool ok = worst <= 1e-4;
  if (root)
    std::printf("check-generate: largest difference between cached and full logits %.2e over %lld positions: %s\n",
                worst, (long long)(total - 1), ok ? "the cached and full logits agree" : "THEY DIFFER");
  return ok;
}

template <class L>
bool generate(const model<L>& m, const grid& g, const options& o) {
  const mt::no_grad inference;  // no tape: nothing is kept for a backward pass
  if constexpr (std::is_same_v<decode_layout_t<L>, L>) return generate_on(m, m, g, o);
  else return generate_on(m, m.template relayouted<decode_layout_t<L>>(), g, o);
}
