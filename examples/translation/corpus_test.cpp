// Tests of corpus.hpp: the .mo reader on catalogs written here (both byte orders, every kind of
// entry it skips, broken files), the corpus's deduplication and split on catalogs written here,
// the batch permutation against values from an independent implementation, and the real corpus of
// this machine's /usr/share/locale with a tokenizer trained on it.
// Build and run (nothing of meshtensor needed), from the repository's root:
//   g++ -std=c++20 -O1 -I examples/translation examples/translation/corpus_test.cpp
//       -lsentencepiece -lsentencepiece_train -lpthread -o /tmp/corpus_test && /tmp/corpus_test
// Exits 1 after printing each failed check, 0 where all pass.
#include "corpus.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace translation;

static int failures = 0;

static void check(bool ok, const std::string& what, int line) {
  if (ok) return;
  ++failures;
  std::printf("FAILED (line %d): %s\n", line, what.c_str());
}
#define CHECK(condition) check((condition), #condition, __LINE__)
#define CHECK_MSG(condition, message) check((condition), std::string(#condition) + ": " + (message), __LINE__)

// Runs f, which must throw std::runtime_error whose message contains each of parts.
static void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts, int line) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    for (const auto& part : parts)
      check(message.find(part) != std::string::npos, "error message \"" + message + "\" lacks \"" + part + "\"", line);
    return;
  } catch (const std::exception& e) {
    check(false, std::string("a std::runtime_error expected, got another exception: ") + e.what(), line);
    return;
  }
  check(false, "a std::runtime_error expected, nothing thrown", line);
}
#define EXPECT_ERROR(statement, ...) expect_error([&] { statement; }, {__VA_ARGS__}, __LINE__)

static double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// A .mo writer, following the format as gettext documents it.

struct mo_entry {
  std::string id, str;
};

static std::string mo_bytes(const std::vector<mo_entry>& entries, bool big_endian, std::uint32_t revision = 0) {
  std::string out;
  auto put = [&](std::uint32_t w) {
    for (int i = 0; i < 4; ++i) {
      const int shift = big_endian ? 8 * (3 - i) : 8 * i;
      out.push_back(static_cast<char>((w >> shift) & 0xff));
    }
  };
  const auto n = static_cast<std::uint32_t>(entries.size());
  const std::uint32_t originals = 28, translations = 28 + 8 * n, strings = 28 + 16 * n;
  put(0x950412de), put(revision), put(n), put(originals), put(translations), put(0), put(strings);
  std::string data;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ids, strs;  // (length, offset)
  for (const auto& e : entries) {
    ids.emplace_back(e.id.size(), strings + data.size());
    data += e.id + '\0';
  }
  for (const auto& e : entries) {
    strs.emplace_back(e.str.size(), strings + data.size());
    data += e.str + '\0';
  }
  for (auto [length, offset] : ids) put(length), put(offset);
  for (auto [length, offset] : strs) put(length), put(offset);
  return out + data;
}

static void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) throw std::runtime_error(path.string() + ": cannot write");
}

static void put_word(std::string& bytes, std::size_t at, std::uint32_t w, bool big_endian) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>((w >> (big_endian ? 8 * (3 - i) : 8 * i)) & 0xff);
}

static const std::string utf8_header = "Project-Id-Version: test\nContent-Type: text/plain; charset=UTF-8\n";

// ---------------------------------------------------------------------------------------------

static void test_mo_reader(const fs::path& tmp) {
  const std::vector<mo_entry> entries = {
      {"", utf8_header},
      {"Hello", "Bonjour"},
      {"menu\x04Open", "Ouvrir"},                                           // context
      {std::string("file\0files", 10), std::string("fichier\0fichiers", 16)},  // plural
      {"line one\nline two", "ligne un\nligne deux"},                        // multi-line
      {"Done.\n", "Terminé.\n"},                                            // trailing newline: trimmed, kept
      {"a\tb", "a\tc"},                                                     // tab
      {"GNU", "GNU"},                                                       // identical
      {"Untranslated", ""},                                                 // empty msgstr
      {"  Spaces around  ", " Espaces autour "},
      {"Exit", "Quitter"},
  };
  const std::vector<sentence_pair> expected = {
      {"Hello", "Bonjour"}, {"Done.", "Terminé."}, {"Spaces around", "Espaces autour"}, {"Exit", "Quitter"}};
  for (const bool big_endian : {false, true}) {
    const fs::path path = tmp / (big_endian ? "big.mo" : "little.mo");
    write_bytes(path, mo_bytes(entries, big_endian));
    try {
      const mo_catalog catalog = read_mo(path.string());
      CHECK_MSG(catalog.pairs == expected, path.string());
      CHECK(catalog.entries == 11);
      CHECK(catalog.charset == "UTF-8");
      CHECK(catalog.skipped.header == 1);
      CHECK(catalog.skipped.context == 1);
      CHECK(catalog.skipped.plural == 1);
      CHECK(catalog.skipped.multi_line == 2);
      CHECK(catalog.skipped.identical == 1);
      CHECK(catalog.skipped.untranslated == 1);
      CHECK(catalog.skipped.total() + static_cast<std::int64_t>(catalog.pairs.size()) == catalog.entries);
    } catch (const std::exception& e) {
      CHECK_MSG(false, std::string("read_mo threw: ") + e.what());
    }
  }

  // Broken files: each error names the file and what is wrong.
  const std::string good = mo_bytes(entries, false);
  const fs::path bad = tmp / "bad.mo";
  EXPECT_ERROR(read_mo((tmp / "absent.mo").string()), (tmp / "absent.mo").string(), "cannot open");
  write_bytes(bad, "");
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "truncated");
  write_bytes(bad, good.substr(0, 10));
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "truncated");
  write_bytes(bad, good.substr(0, 60));  // inside the table of originals
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "truncated", "table of originals");
  write_bytes(bad, good.substr(0, good.size() - 40));  // inside the strings
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "truncated", "translation string");
  std::string bytes = good;
  bytes[0] = 'X';
  write_bytes(bad, bytes);
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "bad magic");
  write_bytes(bad, std::string(64, '\0'));
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "bad magic");
  write_bytes(bad, mo_bytes(entries, true, 0x00020000));
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "revision 2.0");
  bytes = good;
  put_word(bytes, 12, 0xfffffff0u, false);  // the originals' table far past the end
  write_bytes(bad, bytes);
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "table of originals");
  bytes = good;
  put_word(bytes, 8, 0xffffffffu, false);  // N: 4 billion entries
  write_bytes(bad, bytes);
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "table of originals");
  bytes = good;
  put_word(bytes, 28 + 8 * 1 + 4, 0xffffff00u, false);  // original 1's offset
  write_bytes(bad, bytes);
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "original string 1");
  bytes = good;
  put_word(bytes, 28 + 8 * 11 + 8 * 2, 0x7fffffffu, false);  // translation 2's length
  write_bytes(bad, bytes);
  EXPECT_ERROR(read_mo(bad.string()), bad.string(), "translation string 2");

  // Every prefix of a catalog, and random corruptions: read or a std::runtime_error naming the
  // file, never anything else (a crash ends the test).
  int other_outcomes = 0;
  auto read_or_error = [&](const std::string& content) {
    write_bytes(bad, content);
    try {
      (void)read_mo(bad.string());
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find(bad.string()) == std::string::npos) ++other_outcomes;
    } catch (...) {
      ++other_outcomes;
    }
  };
  for (std::size_t length = 0; length < good.size(); ++length) read_or_error(good.substr(0, length));
  std::uint64_t state = 42;
  for (int trial = 0; trial < 2000; ++trial) {
    bytes = good;
    const int flips = 1 + static_cast<int>(splitmix64(state) % 4);
    for (int f = 0; f < flips; ++f)
      bytes[splitmix64(state) % std::min<std::size_t>(bytes.size(), 28 + 16 * 11)] =
          static_cast<char>(splitmix64(state) & 0xff);  // the header and tables: the offsets
    read_or_error(bytes);
  }
  CHECK(other_outcomes == 0);
}

// A locale directory with the first `present` catalogs of the fixed list, catalog i holding
// contents(i).
static fs::path make_locale_dir(const fs::path& root, std::size_t present,
                                const std::function<std::vector<mo_entry>(std::size_t)>& contents) {
  const fs::path dir = root / "fr" / "LC_MESSAGES";
  fs::create_directories(dir);
  for (std::size_t i = 0; i < present; ++i) write_bytes(dir / catalog_files[i].file, mo_bytes(contents(i), i % 2 == 1));
  return root;
}

static void test_corpus_on_written_catalogs(const fs::path& tmp) {
  const std::size_t half = (catalog_files.size() + 1) / 2;
  // Catalog 0: 400 messages and two words; catalog 1: one duplicate, one conflicting
  // translation, one new pair; the others up to half the list: their header only.
  auto contents = [](const std::string& suffix) {
    return [suffix](std::size_t i) {
      std::vector<mo_entry> entries = {{"", utf8_header}};
      if (i == 0) {
        entries.push_back({"Hello", "Bonjour"});
        entries.push_back({"File", "Fichier"});
        for (int k = 0; k < 400; ++k)
          entries.push_back({"message number " + std::to_string(k), "message numéro " + std::to_string(k) + suffix});
      } else if (i == 1) {
        entries.push_back({"Hello", "Bonjour"});
        entries.push_back({"File", "Dossier"});
        entries.push_back({"Exit", "Quitter"});
      }
      return entries;
    };
  };
  const fs::path locale = make_locale_dir(tmp / "locale", half, contents(""));
  try {
    const corpus c = load_corpus(locale.string());
    std::printf("written catalogs:\n%s", describe(c).c_str());
    CHECK(c.catalogs_read.size() == half);
    CHECK(c.catalogs_missing.size() == catalog_files.size() - half);
    CHECK(c.duplicates == 1);
    CHECK(c.conflicting_translations == 1);
    CHECK(c.raw_pairs == 402 + 3);
    CHECK(c.size() == 403);
    CHECK(c.skipped.header == static_cast<std::int64_t>(half));
    CHECK(c.entries == c.raw_pairs + c.skipped.total());
    std::set<std::string> english;
    bool split_by_english = true, file_kept_first = false;
    for (const auto& [pairs, expected] : {std::pair{&c.train, split::train}, {&c.dev, split::dev}, {&c.test, split::test}})
      for (const auto& pair : *pairs) {
        english.insert(pair.en);
        split_by_english = split_by_english && split_of(pair.en) == expected;
        if (pair.en == "File") file_kept_first = pair.fr == "Fichier";
      }
    CHECK(english.size() == 403);  // no English twice
    CHECK(split_by_english);
    CHECK(file_kept_first);
    CHECK(!c.train.empty() && !c.dev.empty() && !c.test.empty());
    const double held_out = static_cast<double>(c.dev.size() + c.test.size()) / static_cast<double>(c.size());
    CHECK_MSG(held_out > 0.01 && held_out < 0.08, "dev + test: " + std::to_string(held_out));

    // The same input twice: the same split. Other French for the same English: the same split.
    const corpus again = load_corpus(locale.string());
    CHECK(again.train == c.train && again.dev == c.dev && again.test == c.test);
    const fs::path other_locale = make_locale_dir(tmp / "other_locale", half, contents(" (bis)"));
    const corpus other = load_corpus(other_locale.string());
    auto english_of = [](const std::vector<sentence_pair>& pairs) {
      std::vector<std::string> en;
      for (const auto& pair : pairs) en.push_back(pair.en);
      return en;
    };
    CHECK(english_of(other.train) == english_of(c.train) && english_of(other.dev) == english_of(c.dev) &&
          english_of(other.test) == english_of(c.test));
    CHECK(other.train != c.train);
  } catch (const std::exception& e) {
    CHECK_MSG(false, std::string("load_corpus threw: ") + e.what());
  }

  // Fewer than half: an error naming what is missing and the packages that install it.
  const fs::path sparse = make_locale_dir(tmp / "sparse_locale", half - 1, contents(""));
  EXPECT_ERROR(load_corpus(sparse.string()), "too few catalogs", std::string(catalog_files.back().file),
               std::string(catalog_files.back().package), (sparse / "fr" / "LC_MESSAGES").string());
  // A catalog of the list that is broken, or not in UTF-8: an error naming it.
  const fs::path broken = make_locale_dir(tmp / "broken_locale", half, contents(""));
  const fs::path broken_file = broken / "fr" / "LC_MESSAGES" / catalog_files[2].file;
  write_bytes(broken_file, "not a catalog at all, but long enough to have a header");
  EXPECT_ERROR(load_corpus(broken.string()), broken_file.string(), "bad magic");
  write_bytes(broken_file, mo_bytes({{"", "Content-Type: text/plain; charset=ISO-8859-1\n"}, {"Yes", "Oui"}}, false));
  EXPECT_ERROR(load_corpus(broken.string()), broken_file.string(), "ISO-8859-1");
}

static void test_hashes_and_permutation() {
  // Published FNV-1a 64 test vectors.
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  // splitmix64 from state 0 (Vigna's reference gives 0xe220a8397b1dcdaf first), and the
  // permutations below: from an independent Python implementation of the rule documented in
  // corpus.hpp (integers masked to 64 bits), written for this test.
  std::uint64_t state = 0;
  CHECK(splitmix64(state) == 0xe220a8397b1dcdafull);
  CHECK(splitmix64(state) == 0x6e789e6aa1b965f4ull);
  CHECK(splitmix64(state) == 0x06c45d188009454full);
  CHECK(permutation(10, 1) == (std::vector<std::int64_t>{4, 2, 8, 1, 9, 3, 0, 6, 7, 5}));
  CHECK(permutation(10, 0) == (std::vector<std::int64_t>{6, 3, 2, 9, 8, 1, 4, 7, 0, 5}));
  CHECK(permutation(1, 5) == (std::vector<std::int64_t>{0}));
  CHECK(permutation(0, 5).empty());
  std::vector<std::int64_t> p = permutation(1000, 7);
  std::sort(p.begin(), p.end());
  bool is_permutation = p.size() == 1000;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(p.size()); ++i) is_permutation = is_permutation && p[i] == i;
  CHECK(is_permutation);
}

static std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

static std::string joined(const std::vector<int>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

static void test_real_corpus_and_tokenizer(const fs::path& tmp) {
  auto start = std::chrono::steady_clock::now();
  corpus c;
  try {
    c = load_corpus();
  } catch (const std::exception& e) {
    CHECK_MSG(false, std::string("load_corpus() threw: ") + e.what());
    return;
  }
  std::printf("this machine's corpus (load_corpus: %.2f s):\n%s", seconds_since(start), describe(c).c_str());
  CHECK_MSG(c.size() >= 20000, "tens of thousands of pairs expected, got " + std::to_string(c.size()));
  CHECK(c.entries == c.raw_pairs + c.skipped.total());
  CHECK(c.raw_pairs == c.size() + c.duplicates + c.conflicting_translations);
  CHECK(c.dev.size() > 100 && c.test.size() > 100);

  const std::string prefix = (tmp / "tokenizer" / "spm").string();
  start = std::chrono::steady_clock::now();
  try {
    train_tokenizer(c, 2000, prefix);
  } catch (const std::exception& e) {
    CHECK_MSG(false, std::string("train_tokenizer threw: ") + e.what());
    return;
  }
  std::printf("train_tokenizer (vocab 2000, %zu sentences): %.2f s\n", 2 * c.train.size(), seconds_since(start));
  const tokenizer tok(prefix + ".model");
  CHECK(tok.vocab_size() == 2000);

  for (const std::string s : {"No such file or directory", "cannot open file: permission denied",
                              "Hello world, this is a test of the translation example.", "error: 42 files (3.5%) [ok]"}) {
    const std::vector<int> ids = tok.encode(s);
    CHECK_MSG(tok.decode(ids) == s, s + " -> " + tok.decode(ids));
    CHECK_MSG(std::none_of(ids.begin(), ids.end(), [](int id) { return id < 4; }), s + " -> " + joined(ids));
  }
  // Identity normalisation: every training sentence comes back as it was, French included.
  std::int64_t train_mismatches = 0;
  for (const auto& pair : c.train)
    for (const std::string* s : {&pair.en, &pair.fr})
      if (tok.decode(tok.encode(*s)) != *s && train_mismatches++ < 3) std::printf("  no round trip: %s\n", s->c_str());
  CHECK(train_mismatches == 0);
  std::int64_t held_out_sentences = 0, held_out_with_unk = 0, tokens = 0;
  for (const auto* split : {&c.dev, &c.test})
    for (const auto& pair : *split)
      for (const std::string* s : {&pair.en, &pair.fr}) {
        const auto ids = tok.encode(*s);
        ++held_out_sentences;
        tokens += static_cast<std::int64_t>(ids.size());
        held_out_with_unk += std::count(ids.begin(), ids.end(), tokenizer::unk) > 0;
      }
  std::printf("dev + test: %lld sentences, %.1f tokens each, %lld with an unknown piece\n",
              static_cast<long long>(held_out_sentences), static_cast<double>(tokens) / held_out_sentences,
              static_cast<long long>(held_out_with_unk));
  CHECK(tok.decode({tokenizer::bos, tokenizer::pad, tokenizer::eos}).empty());
  EXPECT_ERROR(tok.decode({2000}), prefix + ".model", "2000");

  // Deterministic: the same corpus gives the same pieces and scores (the .vocab file; the .model
  // also records the training options, model_prefix included). Trained twice on a tenth of the
  // pairs: what could make two trainings differ (threads, shuffling, the seed) does not depend on
  // the corpus's size, and a tenth trains in a tenth of the time.
  corpus part;  // train_tokenizer reads the training split alone
  part.train.assign(c.train.begin(), c.train.begin() + static_cast<std::ptrdiff_t>(c.train.size() / 10));
  const std::string prefix_a = (tmp / "tokenizer" / "part_a").string(), prefix_b = (tmp / "tokenizer" / "part_b").string();
  start = std::chrono::steady_clock::now();
  train_tokenizer(part, 500, prefix_a);
  train_tokenizer(part, 500, prefix_b);
  std::printf("train_tokenizer twice (vocab 500, %zu sentences): %.2f s\n", 2 * part.train.size(), seconds_since(start));
  CHECK(catalog_reading::read_file_bytes(prefix_a + ".vocab", "vocabulary") ==
        catalog_reading::read_file_bytes(prefix_b + ".vocab", "vocabulary"));

  EXPECT_ERROR(tokenizer((tmp / "absent.model").string()), (tmp / "absent.model").string());
  write_bytes(tmp / "garbage.model", "this is no model");
  EXPECT_ERROR(tokenizer((tmp / "garbage.model").string()), (tmp / "garbage.model").string());

  // The token files.
  const fs::path dir = tmp / "tokens" / "nested";
  start = std::chrono::steady_clock::now();
  write_token_files(c, tok, dir.string());
  std::printf("write_token_files: %.2f s\n", seconds_since(start));
  for (const auto& [name, pairs] : {std::pair{"train", &c.train}, {"dev", &c.dev}, {"test", &c.test}}) {
    const auto src = lines_of(dir / (std::string(name) + ".src")), tgt = lines_of(dir / (std::string(name) + ".tgt"));
    const auto en = lines_of(dir / (std::string(name) + ".en")), fr = lines_of(dir / (std::string(name) + ".fr"));
    CHECK_MSG(src.size() == pairs->size() && tgt.size() == pairs->size() && en.size() == pairs->size() &&
                  fr.size() == pairs->size(),
              name);
    if (src.size() != pairs->size() || en.size() != pairs->size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < pairs->size(); ++i)
      same = same && en[i] == (*pairs)[i].en && fr[i] == (*pairs)[i].fr && src[i] == joined(tok.encode((*pairs)[i].en)) &&
             tgt[i] == joined(tok.encode((*pairs)[i].fr));
    CHECK_MSG(same, name);
  }
}

int main() {
  char pattern[] = "/tmp/corpus_test.XXXXXX";
  if (!mkdtemp(pattern)) {
    std::printf("FAILED: cannot create a temporary directory from %s\n", pattern);
    return 1;
  }
  const fs::path tmp = pattern;
  try {
    test_mo_reader(tmp);
    test_corpus_on_written_catalogs(tmp);
    test_hashes_and_permutation();
    test_real_corpus_and_tokenizer(tmp);
  } catch (const std::exception& e) {
    ++failures;
    std::printf("FAILED: unexpected exception: %s\n", e.what());
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (failures) {
    std::printf("%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
