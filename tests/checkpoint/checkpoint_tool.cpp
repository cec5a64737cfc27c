// The checkpoint tests' driver program (tests/checkpoint/CMakeLists.txt):
//   checkpoint_tool write FILE LAYOUT        saves tensors a, b, c (values from formulas) under LAYOUT
//   checkpoint_tool read FILE LAYOUT         loads them under LAYOUT and checks every value
//   checkpoint_tool loop DIR COUNT MB        COUNT checkpoints into DIR (steps after the current
//                                            one), tensor "big" of MB megabytes holding step + i
//   checkpoint_tool loop-async DIR COUNT MB  the same with io::async_checkpoints: each save written
//                                            while the next values are made (poll, then wait at the end)
//   checkpoint_tool verify DIR               loads DIR's current checkpoint and checks it is whole
// LAYOUT: rep | i | j | ij | ji on mesh [r x c] = [2 x P/2] for even P, else [P x 1].
// The formulas (also in read_with_python.py): a[i][j] (float) = 0.25 * (i * J + j) - 3,
// b[i] (double) = 0.5 * i + 1, c[i][j] (int32) = 3 * (i * J + j) - 7; extents a, c: 13 x 6, b: 13
// (uneven over 2, 4 and 8 parts). Exit 0 and "verified ..." on success; io_error text otherwise.
#include <cstdio>
#include <cstdlib>
#include <meshtensor/io/async_checkpoint.hpp>
#include <meshtensor/io/checkpoint.hpp>
#include <meshtensor/meshtensor.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace mt = meshtensor;
namespace io = meshtensor::io;

struct i_ : mt::dim<"i"> {};
struct j_ : mt::dim<"j"> {};
struct r_ : mt::axis<"r"> {};
struct c_ : mt::axis<"c"> {};
using grid = mt::mesh<r_, c_>;
constexpr std::int64_t I = 13, J = 6;

template <class L>
struct tensors {
  mt::tensor<float, L, i_, j_> a;
  mt::tensor<double, L, i_> b;
  mt::tensor<std::int32_t, L, i_, j_> c;
  tensors(const grid& g) : a(g, {I, J}), b(g, {I}), c(g, {I, J}) {}
  io::tensor_set set() {
    io::tensor_set s;
    s.add("a", a).add("b", b).add("c", c);
    return s;
  }
};

template <class L>
int write_or_read(const grid& g, const std::string& mode, const std::string& file) {
  tensors<L> t(g);
  std::vector<float> a(I * J);
  std::vector<double> b(I);
  std::vector<std::int32_t> c(I * J);
  for (std::int64_t n = 0; n < I * J; ++n) {
    a[n] = static_cast<float>(0.25 * static_cast<double>(n) - 3);
    c[n] = static_cast<std::int32_t>(3 * n - 7);
  }
  for (std::int64_t n = 0; n < I; ++n) b[n] = 0.5 * static_cast<double>(n) + 1;
  if (mode == "write") {
    t.a = mt::from_host<decltype(t.a)>(g, {I, J}, a);
    t.b = mt::from_host<decltype(t.b)>(g, {I}, b);
    t.c = mt::from_host<decltype(t.c)>(g, {I, J}, c);
    io::save(file, t.set(), {{"written_by", "checkpoint_tool"}, {"ranks", std::to_string(g.nprocs())}});
    if (g.rank() == 0) std::printf("wrote %s on %d ranks\n", file.c_str(), g.nprocs());
    return 0;
  }
  auto s = t.set();
  const auto meta = io::load(file, s);
  const bool ok = mt::gather_all(t.a) == a && mt::gather_all(t.b) == b && mt::gather_all(t.c) == c;
  if (g.rank() == 0)
    std::printf("%s %s (written on %s ranks) on %d ranks\n", ok ? "verified" : "WRONG VALUES in", file.c_str(),
                meta.count("ranks") ? meta.at("ranks").c_str() : "?", g.nprocs());
  return ok ? 0 : 2;
}

using L_big = mt::layout<grid, mt::split<i_, r_, c_>>;
using big_t = mt::tensor<float, L_big, i_>;

// Checkpoint `step` holds big[i] = step + (i mod 1000) and its step in the metadata.
std::vector<float> big_values(std::int64_t n, std::int64_t step) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(step + i % 1000);
  return v;
}

template <class Checkpoints>
int loop(const grid& g, const std::string& dir, int count, double mb) {
  Checkpoints ckpt(dir, 2);
  const std::int64_t n = static_cast<std::int64_t>(mb * 1e6 / 4);
  std::int64_t step = 0;
  big_t big(g, {n});
  if (const auto name = ckpt.current(g.communicator().cart())) {
    io::tensor_set s;
    s.add("big", big);
    step = std::stoll(ckpt.load(s).at("step"));
  }
  for (int k = 0; k < count; ++k) {
    ++step;
    big = mt::from_host<big_t>(g, {n}, big_values(n, step));
    io::tensor_set s;
    s.add("big", big);
    const auto name = ckpt.save(s, step, {{"step", std::to_string(step)}});
    if (g.rank() == 0) std::printf("saved %s\n", name.c_str());
    std::fflush(stdout);
    if constexpr (std::is_same_v<Checkpoints, io::async_checkpoints>) ckpt.poll();
  }
  if constexpr (std::is_same_v<Checkpoints, io::async_checkpoints>) ckpt.wait();
  return 0;
}

int verify(const grid& g, const std::string& dir) {
  io::checkpoints ckpt(dir, 2);
  const auto name = ckpt.current(g.communicator().cart());
  if (!name) throw mt::io_error("verify: no current checkpoint in '" + dir + "'");
  const auto path = ckpt.file_of(*name);
  const auto info = io::inspect(path, g.communicator().cart());
  if (!info.tensors.count("big") || info.tensors.at("big").shape.size() != 1)
    throw mt::io_error("verify: '" + path + "' holds no 1-D tensor 'big'");
  const std::int64_t n = info.tensors.at("big").shape[0];
  big_t big(g, {n});
  io::tensor_set s;
  s.add("big", big);
  const auto meta = ckpt.load(s);
  const std::int64_t step = std::stoll(meta.at("step"));
  const bool ok = mt::gather_all(big) == big_values(n, step);
  if (g.rank() == 0)
    std::printf("%s %s: step %lld, %lld elements, on %d ranks\n", ok ? "verified" : "WRONG VALUES in", name->c_str(),
                static_cast<long long>(step), static_cast<long long>(n), g.nprocs());
  return ok ? 0 : 2;
}

int main(int argc, char** argv) {
  mt::environment env(argc, argv);
  try {
    if (argc < 3) throw mt::error("usage: checkpoint_tool write|read FILE LAYOUT | loop|loop-async DIR COUNT MB | verify DIR");
    const std::string mode = argv[1], path = argv[2];
    const int p = env.world_size();
    grid g(env, p % 2 == 0 ? std::array<int, 2>{2, p / 2} : std::array<int, 2>{p, 1});
    const int count = argc > 3 ? std::atoi(argv[3]) : 1;
    const double mb = argc > 4 ? std::atof(argv[4]) : 16;
    if (mode == "loop") return loop<io::checkpoints>(g, path, count, mb);
    if (mode == "loop-async") return loop<io::async_checkpoints>(g, path, count, mb);
    if (mode == "verify") return verify(g, path);
    const std::string layout = argc > 3 ? argv[3] : "rep";
    if (layout == "rep") return write_or_read<mt::layout<grid>>(g, mode, path);
    if (layout == "i") return write_or_read<mt::layout<grid, mt::split<i_, r_>>>(g, mode, path);
    if (layout == "j") return write_or_read<mt::layout<grid, mt::split<j_, c_>>>(g, mode, path);
    if (layout == "ij") return write_or_read<mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>>(g, mode, path);
    if (layout == "ji") return write_or_read<mt::layout<grid, mt::split<i_, c_, r_>>>(g, mode, path);
    throw mt::error("unknown layout '" + layout + "'");
  } catch (const std::exception& e) {
    return env.fail(e, "checkpoint_tool: ");
  }
}
