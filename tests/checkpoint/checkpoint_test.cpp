// Checkpoints (io/safetensors.hpp, io/checkpoint.hpp): a tensor saved under one layout loads
// under every other, on meshes [P] and [2x2] (or [P x 1]), with even and uneven extents; the bytes
// on disk are the global row-major array whatever the layout; bad files are io_errors on every
// rank naming the file and the tensor, and leave the tensors as they were; optimizer state and the
// step count survive a round trip; the checkpoint directory keeps `keep` checkpoints and a
// `latest` pointer; an asynchronous save writes the same bytes, of the values at its call, and
// moves `latest` only once published; a sharded save (a shard per pipeline stage) loads on one mesh.
#include <algorithm>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <meshtensor/io/async_checkpoint.hpp>
#include <meshtensor/io/checkpoint.hpp>
#include <test_support.hpp>
#include <thread>

using namespace tst;
namespace mt = meshtensor;
namespace io = meshtensor::io;
namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;

namespace {
// A directory every rank agrees on (rank 0's name, broadcast), removed at the end.
std::string shared_dir(const std::string& tag) {
  std::string d;
  if (world_rank() == 0) {
    d = (fs::temp_directory_path() / ("meshtensor-ckpt-" + tag + "-" + std::to_string(::getpid()))).string();
    fs::remove_all(d);
    fs::create_directories(d);
  }
  int n = static_cast<int>(d.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  d.resize(static_cast<std::size_t>(n));
  MPI_Bcast(d.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return d;
}
void remove_dir(const std::string& d) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(d);
}

// The global array i * 0.25 - 3: distinct, exact in float and double.
template <class T>
std::vector<T> values(std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(0.25 * static_cast<double>(i) - 3);
  return v;
}

// Every rank must throw io_error with all these in its message; the allreduce proves none hangs.
template <class F>
void require_io_error_everywhere(F&& f, const std::vector<std::string>& needles) {
  int threw = 0;
  try {
    f();
  } catch (const mt::io_error& e) {
    threw = 1;
    for (const auto& n : needles) REQUIRE_THAT(std::string(e.what()), ContainsSubstring(n));
  }
  int all = 0;
  MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  REQUIRE(all == 1);
}

// Saves x under layout From, then loads it into a tensor under every layout of Tos: equal, and
// the file's bytes are the row-major global array (read back with plain C++).
template <class M, class From, class Tos>
void round_trips(const M& m, const std::string& dir, const std::array<std::int64_t, 2>& ext) {
  using X = mt::tensor<float, From, i_, j_>;
  const auto host = values<float>(ext[0] * ext[1]);
  const auto x = mt::from_host<X>(m, ext, host);
  io::tensor_set out;
  out.add("x", x);
  const std::string path = dir + "/x.safetensors";
  io::save(path, out, {{"note", "round trip"}});
  // Rank 0 reads the file back with plain C++; every rank checks its verdict (a REQUIRE failing
  // on one rank only would leave the others waiting in the next collective).
  std::string file_problem;
  if (world_rank() == 0) {
    std::ifstream in(path, std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, ' ');
    in.read(header.data(), static_cast<std::streamsize>(n));
    std::vector<float> data(host.size());
    in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
    if (n % 8 != 0) file_problem = "header length not a multiple of 8";
    else if (header.find("\"dtype\":\"F32\"") == std::string::npos || header.find("\"note\":\"round trip\"") == std::string::npos)
      file_problem = "header lacks the dtype or the metadata: " + header;
    else if (in.gcount() != static_cast<std::streamsize>(data.size() * sizeof(float)) || data != host)
      file_problem = "the data is not the row-major global array";
    else if (fs::file_size(path) != 8 + n + host.size() * sizeof(float))
      file_problem = "the file has bytes beyond the data";
  }
  int len = static_cast<int>(file_problem.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  file_problem.resize(static_cast<std::size_t>(len));
  MPI_Bcast(file_problem.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  INFO("written under " << layout_name<From>());
  REQUIRE(file_problem == "");
  for_each_type(Tos{}, [&]<class To>() {
    INFO("from " << layout_name<From>() << " to " << layout_name<To>());
    using Y = mt::tensor<float, To, i_, j_>;
    Y y(m, ext);
    io::tensor_set in;
    in.add("x", y);
    const auto meta = io::load(path, in);
    REQUIRE(meta.at("note") == "round trip");
    REQUIRE(meta.count("meshtensor.dims") == 0);
    REQUIRE(mt::gather_all(y) == host);
  });
}
}  // namespace

TEST_CASE("a tensor saved under any layout loads under every layout, even and uneven extents", "[checkpoint]") {
  const auto dir = shared_dir("layouts");
  // Even (8 x 12), and uneven over 2, 3, 4 parts with one dim (3) smaller than 4 parts.
  const auto ext = GENERATE(std::array<std::int64_t, 2>{8, 12}, std::array<std::int64_t, 2>{13, 3});
  INFO("extents " << ext[0] << " x " << ext[1]);
  SECTION("mesh [P]") {
    using Ls = line_layouts<line, i_, j_>;
    for_each_type(Ls{}, [&]<class From>() { round_trips<line, From, Ls>(world_line(), dir, ext); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    using Ls = grid_layouts<i_, j_>;
    for_each_type(Ls{}, [&]<class From>() { round_trips<grid, From, Ls>(world_grid(), dir, ext); });
  }
  remove_dir(dir);
}

TEST_CASE("a tensor saved under zigzag loads under split and replicated layouts, and they under zigzag",
          "[checkpoint][zigzag]") {
  // The file is the row-major global array whatever the layout (round_trips reads it back), so a
  // zigzag tensor's pieces land where a contiguous one's boxes do.
  const auto dir = shared_dir("zigzag");
  const auto ext = GENERATE(std::array<std::int64_t, 2>{8, 12}, std::array<std::int64_t, 2>{13, 3});
  INFO("extents " << ext[0] << " x " << ext[1]);
  SECTION("mesh [P]") {
    using Ls = list<mt::layout<line, mt::zigzag<i_, x_>>, mt::layout<line, mt::zigzag<j_, x_>>,
                    mt::layout<line, mt::split<i_, x_>>, mt::layout<line>>;
    for_each_type(Ls{}, [&]<class From>() { round_trips<line, From, Ls>(world_line(), dir, ext); });
  }
  SECTION("mesh [2x2] (or [P x 1])") {
    using Ls = list<mt::layout<grid, mt::zigzag<i_, r_, c_>>, mt::layout<grid, mt::zigzag<i_, c_>, mt::split<j_, r_>>,
                    mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>, mt::layout<grid>>;
    for_each_type(Ls{}, [&]<class From>() { round_trips<grid, From, Ls>(world_grid(), dir, ext); });
  }
  remove_dir(dir);
}

TEST_CASE("several tensors and dtypes in one file; scalars and empty tensors", "[checkpoint]") {
  const auto dir = shared_dir("dtypes");
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  auto a = mt::from_host<mt::tensor<double, L, i_, j_>>(g, {5, 7}, values<double>(35));
  auto b = mt::from_host<mt::tensor<std::int32_t, L, j_>>(g, {7}, std::vector<std::int32_t>{1, -2, 3, -4, 5, -6, 7});
  auto s = mt::from_host<mt::tensor<float, L>>(g, {}, std::vector<float>{42.5f});
  auto e = mt::tensor<float, L, i_, k_>(g, {0, 3});
  std::vector<mt::bf16> hv;
  for (int n = 0; n < 35; ++n) hv.push_back(0.1f * float(n) - 1.7f);  // not exact in bf16: rounded bits
  auto h = mt::from_host<mt::tensor<mt::bf16, L, i_, j_>>(g, {5, 7}, hv);
  std::vector<mt::complex<double>> zv;
  std::vector<mt::complex<float>> cv;
  for (int n = 0; n < 35; ++n) zv.emplace_back(0.1 * n - 1.7, 1.0 / (n + 3)), cv.emplace_back(0.3f * float(n), -1.0f / float(n + 1));
  auto z = mt::from_host<mt::tensor<mt::complex<double>, L, i_, j_>>(g, {5, 7}, zv);
  auto c = mt::from_host<mt::tensor<mt::complex<float>, L, j_, i_>>(g, {7, 5}, cv);
  io::tensor_set out;
  out.add("a", a).add("b", b).add("scalar", s).add("empty", e).add("h", h).add("z", z).add("c", c);
  io::save(dir + "/m.safetensors", out);

  using L2 = mt::layout<grid, mt::split<j_, r_, c_>>;
  mt::tensor<double, L2, i_, j_> a2(g, {5, 7});
  mt::tensor<std::int32_t, L2, j_> b2(g, {7});
  mt::tensor<float, L2> s2(g, {});
  mt::tensor<float, L2, i_, k_> e2(g, {0, 3});
  mt::tensor<mt::bf16, L2, i_, j_> h2(g, {5, 7});
  mt::tensor<mt::complex<double>, L2, i_, j_> z2(g, {5, 7});
  mt::tensor<mt::complex<float>, L2, j_, i_> c2(g, {7, 5});
  io::tensor_set in;
  in.add("scalar", s2).add("b", b2).add("a", a2).add("empty", e2).add("h", h2).add("c", c2).add("z", z2);  // any order
  io::load(dir + "/m.safetensors", in);
  const auto info = io::inspect(dir + "/m.safetensors", MPI_COMM_WORLD);
  REQUIRE(info.tensors.at("h").dtype == "BF16");
  REQUIRE((info.tensors.at("z").dtype == "C128" && info.tensors.at("c").dtype == "C64"));
  const auto z_back = mt::gather_all(z2);
  const auto c_back = mt::gather_all(c2);
  for (int n = 0; n < 35; ++n) {
    REQUIRE((z_back[n].real() == zv[n].real() && z_back[n].imag() == zv[n].imag()));
    REQUIRE((c_back[n].real() == cv[n].real() && c_back[n].imag() == cv[n].imag()));
  }
  const auto h_back = mt::gather_all(h2);
  for (int n = 0; n < 35; ++n) REQUIRE(h_back[n].bits() == hv[n].bits());
  REQUIRE(mt::gather_all(a2) == values<double>(35));
  REQUIRE(mt::gather_all(b2) == std::vector<std::int32_t>{1, -2, 3, -4, 5, -6, 7});
  REQUIRE(mt::gather_all(s2) == std::vector<float>{42.5f});
  // A subset loads too.
  mt::tensor<std::int32_t, L, j_> b3(g, {7});
  io::tensor_set only_b;
  only_b.add("b", b3);
  io::load(dir + "/m.safetensors", only_b);
  REQUIRE(mt::gather_all(b3) == mt::gather_all(b));
  // Names: unique, not __metadata__.
  REQUIRE_THROWS_AS(only_b.add("b", b3), mt::shape_error);
  REQUIRE_THROWS_AS(only_b.add("__metadata__", b3), mt::shape_error);
  remove_dir(dir);
}

TEST_CASE("bad files and mismatches are io_errors on every rank, naming file and tensor; tensors unchanged",
          "[checkpoint]") {
  const auto dir = shared_dir("bad");
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_, c_>>;
  using X = mt::tensor<float, L, i_, j_>;
  const auto host = values<float>(6 * 4);
  auto x = mt::from_host<X>(g, {6, 4}, host);
  auto y = mt::from_host<mt::tensor<float, L, i_>>(g, {6}, values<float>(6));
  io::tensor_set out;
  out.add("x", x).add("y", y);
  const std::string good = dir + "/good.safetensors";
  io::save(good, out);
  const auto size = fs::file_size(good);

  // The target: its values must survive every failed load.
  const auto before = values<float>(24);
  auto target = mt::from_host<X>(g, {6, 4}, std::vector<float>(24, 7.0f));
  auto target_y = mt::from_host<mt::tensor<float, L, i_>>(g, {6}, std::vector<float>(6, 7.0f));
  auto expect_fail = [&](const std::string& path, const std::vector<std::string>& needles) {
    io::tensor_set in;
    in.add("y", target_y).add("x", target);
    require_io_error_everywhere([&] { io::load(path, in); }, needles);
    REQUIRE(mt::gather_all(target) == std::vector<float>(24, 7.0f));
    REQUIRE(mt::gather_all(target_y) == std::vector<float>(6, 7.0f));
  };
  // Rank 0 writes a damaged copy; the others wait for it.
  auto damaged = [&](const std::string& name, auto&& damage) {
    const std::string p = dir + "/" + name;
    if (world_rank() == 0) {
      fs::copy_file(good, p, fs::copy_options::overwrite_existing);
      damage(p);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return p;
  };
  auto header_of = [&](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string h(n, ' ');
    in.read(h.data(), static_cast<std::streamsize>(n));
    return h;
  };
  // Rewrites the file with one text of its header replaced (the length updated, the data kept).
  auto edit_header = [&](const std::string& from, const std::string& to) {
    return [=](const std::string& p) {
      std::string h = header_of(p);
      const auto data_at = 8 + h.size();
      const auto at = h.find(from);
      REQUIRE(at != std::string::npos);
      h.replace(at, from.size(), to);
      std::string data;
      {
        std::ifstream in(p, std::ios::binary);
        in.seekg(static_cast<std::streamoff>(data_at));
        data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      std::ofstream f(p, std::ios::binary | std::ios::trunc);
      const std::uint64_t n = h.size();
      f.write(reinterpret_cast<const char*>(&n), 8);
      f.write(h.data(), static_cast<std::streamsize>(h.size()));
      f.write(data.data(), static_cast<std::streamsize>(data.size()));
    };
  };

  SECTION("missing file") { expect_fail(dir + "/none.safetensors", {"none.safetensors"}); }
  SECTION("truncated data") {
    const auto p = damaged("short.safetensors", [&](const std::string& q) { fs::resize_file(q, size - 5); });
    expect_fail(p, {"short.safetensors", "truncated"});
  }
  SECTION("truncated inside the length") {
    const auto p = damaged("tiny.safetensors", [&](const std::string& q) { fs::resize_file(q, 5); });
    expect_fail(p, {"tiny.safetensors", "truncated: 5 bytes"});
  }
  SECTION("header length past the end") {
    const auto p = damaged("len.safetensors", [&](const std::string& q) {
      std::fstream f(q, std::ios::binary | std::ios::in | std::ios::out);
      const std::uint64_t n = 1u << 20;
      f.write(reinterpret_cast<const char*>(&n), 8);
    });
    expect_fail(p, {"len.safetensors", "header length is 1048576"});
  }
  SECTION("header not JSON") {
    const auto p = damaged("json.safetensors", edit_header("{\"", "[["));
    expect_fail(p, {"json.safetensors", "not valid JSON"});
  }
  SECTION("a parse error quoting a 100 kB token is cut") {
    // nlohmann's message quotes the string it read up to the bad character, whole.
    const auto p = damaged("token.safetensors", edit_header("{\"", "{\"" + std::string(100000, 'x') + "\x01"));
    expect_fail(p, {"token.safetensors", "not valid JSON", "...)"});
    io::tensor_set in;
    in.add("y", target_y).add("x", target);
    try {
      io::load(p, in);
      FAIL("loaded a file whose header is not JSON");
    } catch (const mt::io_error& e) {
      REQUIRE(std::string_view(e.what()).size() < 400);
    }
  }
  SECTION("offsets past the end") {
    const auto p = damaged("offsets.safetensors", edit_header("\"data_offsets\":[0,96]", "\"data_offsets\":[900,996]"));
    expect_fail(p, {"offsets.safetensors", "tensor 'x'", "outside"});
  }
  SECTION("missing tensor") {
    io::tensor_set in;
    in.add("z", target);
    require_io_error_everywhere([&] { io::load(good, in); }, {"good.safetensors", "no tensor 'z'", "x, y"});
  }
  SECTION("another dtype") {
    auto d = mt::tensor<double, L, i_, j_>(g, {6, 4});
    io::tensor_set in;
    in.add("x", d);
    require_io_error_everywhere([&] { io::load(good, in); }, {"good.safetensors", "tensor 'x' is F32", "F64"});
  }
  SECTION("another extent") {
    auto d = X(g, {6, 5});
    io::tensor_set in;
    in.add("x", d);
    require_io_error_everywhere([&] { io::load(good, in); }, {"tensor 'x' has shape [6, 4]", "[6, 5]", "dims i, j"});
  }
  SECTION("another dim name") {
    auto d = mt::tensor<float, L, i_, k_>(g, {6, 4});
    io::tensor_set in;
    in.add("x", d);
    require_io_error_everywhere([&] { io::load(good, in); }, {"tensor 'x' has dims [i, j] in the file", "[i, k]"});
  }
  SECTION("a const tensor cannot be loaded into") {
    const X c(g, {6, 4});
    io::tensor_set in;
    in.add("x", c);
    require_io_error_everywhere([&] { io::load(good, in); }, {"tensor 'x' was added as const"});
  }
  SECTION("the good file still loads") {
    io::tensor_set in;
    in.add("y", target_y).add("x", target);
    io::load(good, in);
    REQUIRE(mt::gather_all(target) == before);
  }
  remove_dir(dir);
}

TEST_CASE("optimizer state and step count round-trip; a resumed optimizer continues exactly", "[checkpoint]") {
  const auto dir = shared_dir("optim");
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using L2 = mt::layout<grid, mt::split<j_, r_, c_>>;
  // Runs `steps` Adafactor (factored, momentum) steps on w from a fixed start with fixed grads.
  auto run = [&]<class LL>(mt::tensor<double, LL, i_, j_>& w, mt::optim::adafactor& opt, int from, int to) {
    for (int t = from; t < to; ++t)
      opt.step(std::tie(w), std::tuple{mt::random_normal<mt::tensor<double, LL, i_, j_>>(g, {5, 7}, 100 + t)});
  };
  const mt::optim::adafactor::config cfg{.lr = 0.01, .beta1 = 0.9};
  auto w_all = mt::random_normal<mt::tensor<double, L, i_, j_>>(g, {5, 7}, 1);
  mt::optim::adafactor all(cfg);
  run(w_all, all, 0, 6);

  auto w = mt::random_normal<mt::tensor<double, L, i_, j_>>(g, {5, 7}, 1);
  mt::optim::adafactor first(cfg);
  run(w, first, 0, 3);
  io::checkpoints ckpt(dir + "/run", 2);
  {
    io::tensor_set set;
    set.add("w", w);
    io::add_optimizer_state(set, first, std::tie(w), {"w"});
    REQUIRE(set.size() == 4);  // w, vr, vc, m
    ckpt.save(set, first.steps(), {{"optimizer.steps", std::to_string(first.steps())}});
  }
  // Resume under another layout, from a fresh optimizer.
  mt::tensor<double, L2, i_, j_> w2(g, {5, 7});
  mt::optim::adafactor second(cfg);
  io::tensor_set set;
  set.add("w", w2);
  io::add_optimizer_state(set, second, std::tie(w2), {"w"});
  const auto meta = ckpt.load(set);
  second.set_steps(std::stoll(meta.at("optimizer.steps")));
  REQUIRE(second.steps() == 3);
  run(w2, second, 3, 6);
  REQUIRE(max_rel_error(mt::gather_all(w2), mt::gather_all(w_all)) < 1e-12);
  REQUIRE(max_rel_error(mt::gather_all(w2), mt::gather_all(w)) > 1e-6);  // the three steps did move it
  remove_dir(dir);
}

TEST_CASE("the checkpoint directory: latest names the newest complete one, keep prunes older ones",
          "[checkpoint]") {
  const auto dir = shared_dir("dir") + "/run";
  const auto g = world_line();
  using L = mt::layout<line, mt::split<i_, x_>>;
  auto x = mt::from_host<mt::tensor<float, L, i_>>(g, {9}, values<float>(9));
  io::checkpoints ckpt(dir, 2);
  REQUIRE(!ckpt.current(MPI_COMM_WORLD));
  {
    io::tensor_set in;
    in.add("x", x);
    require_io_error_everywhere([&] { ckpt.load(in); }, {"no checkpoint in", "latest"});
  }
  io::tensor_set set;
  set.add("x", x);
  // A leftover of an interrupted save is cleared by the next save.
  if (world_rank() == 0) fs::create_directories(dir + "/.tmp-step-00000009");
  MPI_Barrier(MPI_COMM_WORLD);
  REQUIRE(ckpt.save(set, 10) == "step-00000010");
  REQUIRE(ckpt.save(set, 20) == "step-00000020");
  REQUIRE(ckpt.save(set, 20) == "step-00000020-2");  // a name taken: never overwritten
  REQUIRE(ckpt.save(set, 30) == "step-00000030");
  REQUIRE(*ckpt.current(MPI_COMM_WORLD) == "step-00000030");
  std::vector<std::string> names;  // what every rank sees (one file system)
  for (const auto& d : fs::directory_iterator(dir)) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names == std::vector<std::string>{"latest", "step-00000020-2", "step-00000030"});
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has listed before rank 0 begins the next save
  // Past 8 digits the names grow longer; pruning goes by the step, not by the names' text order.
  REQUIRE(ckpt.save(set, 99'999'999) == "step-99999999");
  REQUIRE(ckpt.save(set, 100'000'000) == "step-100000000");
  REQUIRE(ckpt.save(set, 100'000'001) == "step-100000001");
  names.clear();
  for (const auto& d : fs::directory_iterator(dir)) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names == std::vector<std::string>{"latest", "step-100000000", "step-100000001"});
  // A latest that names something missing is an error, not a silent fresh start.
  if (world_rank() == 0) {
    std::ofstream(dir + "/latest") << "step-00000099\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  require_io_error_everywhere([&] { (void)ckpt.current(MPI_COMM_WORLD); }, {"step-00000099", "does not exist"});
  remove_dir(fs::path(dir).parent_path().string());
}

TEST_CASE("a sharded checkpoint, a shard per pipeline stage, loads on one mesh; bad indexes name the file",
          "[checkpoint]") {
  const int size = world_size(), per = size % 2 == 0 ? size / 2 : 1, count = size / per;
  const auto dir = shared_dir("shards") + "/run";
  namespace pl = meshtensor::pipeline;
  pl::stages<line> st(MPI_COMM_WORLD, count, {per});
  using V = mt::tensor<float, mt::layout<line, mt::split<i_, x_>>, i_>;
  // Stage s holds "w.s", 5 + s elements offset by 100 s (uneven over a stage of 2 processors).
  const auto stage_values = [](int s) {
    auto v = values<float>(5 + s);
    for (auto& x : v) x += 100.0f * static_cast<float>(s);
    return v;
  };
  auto w = mt::from_host<V>(st.mesh(), {5 + st.index()}, stage_values(st.index()));
  io::tensor_set set;
  set.add("w." + std::to_string(st.index()), w);
  io::checkpoints ckpt(dir);
  REQUIRE(ckpt.save_shard(set, st.index(), count, st.whole(), 7, {{"step", "7"}}) == "step-00000007");
  REQUIRE(fs::exists(dir + "/step-00000007/" + io::shard_file_name(count - 1, count)));
  REQUIRE(!fs::exists(dir + "/step-00000007/model.safetensors"));
  // Every stage's tensor, loaded on one mesh of all the processors (split over all of them).
  const auto g = world_line();
  std::vector<V> all;
  all.reserve(static_cast<std::size_t>(count));  // the set refers to them
  io::tensor_set whole;
  for (int s = 0; s < count; ++s) whole.add("w." + std::to_string(s), all.emplace_back(g, std::array<std::int64_t, 1>{5 + s}));
  REQUIRE(ckpt.load(whole).at("step") == "7");
  for (int s = 0; s < count; ++s) REQUIRE(mt::gather_all(all[static_cast<std::size_t>(s)]) == stage_values(s));
  V extra(g, {3});
  io::tensor_set missing;
  missing.add("w.0", all[0]).add("nowhere", extra);
  require_io_error_everywhere([&] { ckpt.load(missing); },
                              {"model.safetensors.index.json' maps no file to tensor 'nowhere'"});
  if (count > 1) {  // one name saved by two stages
    io::tensor_set twice;
    twice.add("twice", w);
    require_io_error_everywhere([&] { ckpt.save_shard(twice, st.index(), count, st.whole(), 8); },
                                {"tensor 'twice' is in two shards"});
  }
  REQUIRE_THROWS_WITH(io::parse_shard_index("{\"weight_map\": []}", "idx.json"),
                      ContainsSubstring("'idx.json' has no \"weight_map\" object"));
  REQUIRE_THROWS_WITH(io::parse_shard_index("{\"weight_map\": {\"a\": \"../x.safetensors\"}}", "idx.json"),
                      ContainsSubstring("tensor 'a' is in '../x.safetensors', which is not a file name"));
  REQUIRE_THROWS_WITH(io::parse_shard_index("{", "idx.json"), ContainsSubstring("'idx.json' is not JSON"));
  REQUIRE(io::shard_file_name(0, 2) == "model-00001-of-00002.safetensors");
  remove_dir(fs::path(dir).parent_path().string());
}

namespace {
// Rank 0 compares two files byte for byte; every rank gets the verdict ("" when equal).
std::string files_differ(const std::string& a, const std::string& b) {
  std::string problem;
  if (world_rank() == 0) {
    auto read = [](const std::string& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string x = read(a), y = read(b);
    if (x.empty()) problem = "'" + a + "' is empty or missing";
    else if (x != y) problem = "'" + a + "' (" + std::to_string(x.size()) + " bytes) differs from '" + b + "' (" +
                               std::to_string(y.size()) + " bytes)";
  }
  int len = static_cast<int>(problem.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  problem.resize(static_cast<std::size_t>(len));
  MPI_Bcast(problem.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  return problem;
}
}  // namespace

TEST_CASE("an asynchronous save writes io::save's bytes of the values at its call; latest moves when published",
          "[checkpoint]") {
  const auto dir = shared_dir("async");
  const auto g = world_grid();
  using L = mt::layout<grid, mt::split<i_, r_>, mt::split<j_, c_>>;
  using L2 = mt::layout<grid, mt::split<j_, r_, c_>>;
  using R = mt::layout<grid>;
  const std::array<std::int64_t, 2> ext{13, 3};  // uneven over 2 and 4 parts
  const auto a_host = values<float>(13 * 3);
  const auto b_host = values<double>(13);
  auto a = mt::from_host<mt::tensor<float, L, i_, j_>>(g, ext, a_host);
  auto b = mt::from_host<mt::tensor<double, R, i_>>(g, {13}, b_host);
  io::tensor_set set;
  set.add("a", a).add("b", b);
  const io::metadata meta{{"step", "5"}};
  io::save(dir + "/sync.safetensors", set, meta);

  io::async_checkpoints ckpt(dir + "/run", 2);
  REQUIRE(ckpt.save(set, 5, meta) == "step-00000005");
  REQUIRE(ckpt.in_flight());
  // Training goes on: the tensors change at once; the save holds the values of its call.
  a = mt::from_host<mt::tensor<float, L, i_, j_>>(g, ext, std::vector<float>(13 * 3, 42.0f));
  b = mt::from_host<mt::tensor<double, R, i_>>(g, {13}, std::vector<double>(13, 7.0));
  REQUIRE(!ckpt.current(MPI_COMM_WORLD));  // not published before every rank's write is done
  REQUIRE(ckpt.wait() == std::optional<std::string>("step-00000005"));
  REQUIRE(!ckpt.in_flight());
  REQUIRE(ckpt.buffered_bytes() > 0);  // kept for the next save
  REQUIRE(*ckpt.current(MPI_COMM_WORLD) == "step-00000005");
  REQUIRE(files_differ(ckpt.file_of("step-00000005"), dir + "/sync.safetensors") == "");
  mt::tensor<float, L2, i_, j_> a2(g, ext);
  mt::tensor<double, L2, i_> b2(g, {13});
  io::tensor_set in;
  in.add("a", a2).add("b", b2);
  REQUIRE(ckpt.load(in).at("step") == "5");
  REQUIRE(mt::gather_all(a2) == a_host);
  REQUIRE(mt::gather_all(b2) == b_host);
  remove_dir(dir);
}

TEST_CASE("asynchronous saves: one in flight, poll publishes, keep prunes, errors on every rank", "[checkpoint]") {
  const auto dir = shared_dir("async-dir") + "/run";
  const auto g = world_line();
  using L = mt::layout<line, mt::split<i_, x_>>;
  auto x = mt::from_host<mt::tensor<float, L, i_>>(g, {9}, values<float>(9));
  io::tensor_set set;
  set.add("x", x);
  io::async_checkpoints ckpt(dir, 2);
  REQUIRE(!ckpt.poll());  // nothing in flight: no checkpoint, no collective
  REQUIRE(ckpt.save(set, 10) == "step-00000010");
  REQUIRE(ckpt.save(set, 20) == "step-00000020");  // waits for step 10 and publishes it first
  REQUIRE(*ckpt.current(MPI_COMM_WORLD) == "step-00000010");
  std::optional<std::string> published;
  for (int k = 0; k < 10000 && !published; ++k) {  // every rank gets the same answer from each poll
    published = ckpt.poll();
    if (!published) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(published == std::optional<std::string>("step-00000020"));
  REQUIRE(*ckpt.current(MPI_COMM_WORLD) == "step-00000020");
  REQUIRE(ckpt.save(set, 30) == "step-00000030");
  REQUIRE(ckpt.wait() == std::optional<std::string>("step-00000030"));
  REQUIRE(!ckpt.wait());
  std::vector<std::string> names;
  for (const auto& d : fs::directory_iterator(dir)) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names == std::vector<std::string>{"latest", "step-00000020", "step-00000030"});
  // A directory that cannot be made: io_error on every rank, naming it; nothing in flight after.
  const std::string blocked = fs::path(dir).parent_path().string() + "/a-file";
  if (world_rank() == 0) std::ofstream(blocked) << "not a directory\n";
  MPI_Barrier(MPI_COMM_WORLD);
  io::async_checkpoints bad(blocked + "/run");
  require_io_error_everywhere([&] { bad.save(set, 1); }, {"a-file"});
  REQUIRE(!bad.in_flight());
  // The writer's own errors name the file (here a directory that went away).
  io::detail::file_image img;
  img.path = blocked + ".gone/model.safetensors";
  img.bytes = {'x'};
  img.runs.push_back({0, 0, 1});
  REQUIRE_THAT(io::detail::write_image(img), ContainsSubstring("cannot open '" + img.path + "'"));
  remove_dir(fs::path(dir).parent_path().string());
}

TEST_CASE("an asynchronous save's copy on several threads copies every byte once", "[checkpoint]") {
  // 13 MiB in pieces of uneven sizes (one across thread boundaries), 1 to 4 threads.
  const std::int64_t n = std::int64_t{13} << 20;
  std::vector<char> from(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) from[static_cast<std::size_t>(i)] = static_cast<char>((i * 131 + i / 7) & 0xff);
  for (int threads = 1; threads <= 4; ++threads) {
    INFO(threads << " threads");
    std::vector<char> to(from.size() + 2, 'z');
    std::vector<io::detail::copy_piece> pieces;
    const std::int64_t cuts[] = {0, 3, (std::int64_t{5} << 20) + 1, (std::int64_t{9} << 20) - 7, n};
    for (int k = 0; k + 1 < 5; ++k)
      pieces.push_back({to.data() + 1 + cuts[k], from.data() + cuts[k], cuts[k + 1] - cuts[k]});
    io::detail::copy_pieces(pieces, threads);
    REQUIRE(to.front() == 'z');
    REQUIRE(to.back() == 'z');
    REQUIRE(std::equal(from.begin(), from.end(), to.begin() + 1));
  }
}
