#pragma once
// The translation example's data: an English-French parallel corpus made of the French message
// catalogs (gettext .mo files) that Debian installs under /usr/share/locale, its split into
// train/dev/test, a SentencePiece tokenizer trained on it, the token files that a PyTorch peer
// script trains on, and the batch order both sides share. Depends on the standard library and
// SentencePiece only (libsentencepiece-dev: link -lsentencepiece -lsentencepiece_train).
//
// Why software messages: every Debian machine has them, they need no download, and they are
// human translations of real sentences ("cannot open %s: No such file or directory").
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace translation {

struct sentence_pair {
  std::string en, fr;
  friend bool operator==(const sentence_pair&, const sentence_pair&) = default;
};

// ---------------------------------------------------------------------------------------------
// gettext .mo reader

// Entries of a catalog that are not usable single-line sentence pairs, by reason (each entry is
// counted under the first reason that applies, in this order).
struct mo_skip_counts {
  std::int64_t header = 0;          // empty msgid: the catalog's metadata, not a message
  std::int64_t context = 0;         // msgctxt "\x04" msgid: skipped, not stripped (see read_mo)
  std::int64_t plural = 0;          // msgid "\0" msgid_plural: the forms do not pair one to one
  std::int64_t untranslated = 0;    // empty msgstr (or either side only whitespace)
  std::int64_t multi_line = 0;      // a newline, carriage return or tab inside either side
  std::int64_t identical = 0;       // French == English: nothing to learn, BLEU for free
  std::int64_t total() const { return header + context + plural + untranslated + multi_line + identical; }
  mo_skip_counts& operator+=(const mo_skip_counts& o) {
    header += o.header, context += o.context, plural += o.plural, untranslated += o.untranslated;
    multi_line += o.multi_line, identical += o.identical;
    return *this;
  }
};

struct mo_catalog {
  std::string path;
  std::int64_t entries = 0;          // all entries of the file, the header included
  std::string charset;               // from the header's Content-Type ("" where it names none)
  std::vector<sentence_pair> pairs;  // the usable ones, in file order, trimmed
  mo_skip_counts skipped;
};

namespace catalog_reading {

inline std::string_view trim(std::string_view s) {
  constexpr std::string_view space = " \t\n\r\f\v";
  const auto first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

inline std::string lowercase_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

inline std::string read_file_bytes(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open " + what);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(path + ": error while reading " + what);
  return bytes;
}

// The charset that a catalog header's "Content-Type: text/plain; charset=X" names.
inline std::string header_charset(std::string_view header) {
  const auto at = header.find("charset=");
  if (at == std::string_view::npos) return {};
  auto value = header.substr(at + 8);
  value = value.substr(0, value.find_first_of(" ;\n\r\t"));
  return std::string(value);
}

}  // namespace catalog_reading

// Reads a compiled gettext catalog: a 28-byte header of 32-bit words (magic 0x950412de in the
// writer's byte order, which tells the reader that order; revision; N; offset of the table of
// originals; offset of the table of translations; hash table size and offset, unused here), then
// each table is N (length, offset) pairs locating the strings in the file.
//
// Keeps the pairs usable as single-line sentences: trimmed of surrounding whitespace (messages
// often end in "\n" for printf, which is formatting, not content), and skips the header, plural
// entries, empty translations, pairs with a line break or tab inside, and pairs whose French is the
// English. Entries with a context (msgctxt) are skipped rather than stripped of it: a context
// exists because the English alone is ambiguous ("Open" the verb or the adjective), so without it
// the pair is not a reliable translation, and would mostly add conflicting translations.
//
// Throws std::runtime_error naming the file and what is wrong for a file that cannot be read, is
// truncated, has a bad magic number or revision, or locates a table or string outside the file.
inline mo_catalog read_mo(const std::string& path) {
  const std::string bytes = catalog_reading::read_file_bytes(path, "gettext catalog");
  const auto size = static_cast<std::uint64_t>(bytes.size());
  auto fail = [&](const std::string& what) -> std::runtime_error {
    return std::runtime_error(path + ": not a valid gettext .mo catalog: " + what);
  };
  if (size < 20) throw fail("truncated: " + std::to_string(size) + " bytes, less than the 20-byte header");

  auto word_le = [&](std::uint64_t at) {
    std::uint32_t w = 0;
    for (int i = 3; i >= 0; --i) w = (w << 8) | static_cast<unsigned char>(bytes[at + i]);
    return w;
  };
  bool big_endian;
  if (word_le(0) == 0x950412deu) big_endian = false;
  else if (word_le(0) == 0xde120495u) big_endian = true;
  else {
    std::ostringstream magic;
    magic << "bad magic number 0x" << std::hex << word_le(0) << " (as little-endian; 0x950412de expected)";
    throw fail(magic.str());
  }
  auto word = [&](std::uint64_t at) {  // callers check at + 4 <= size
    const std::uint32_t w = word_le(at);
    return big_endian ? ((w >> 24) | ((w >> 8) & 0xff00u) | ((w << 8) & 0xff0000u) | (w << 24)) : w;
  };
  const std::uint32_t revision = word(4);
  if ((revision >> 16) > 1)  // GNU gettext reads major revisions 0 and 1 (1 adds system-dependent strings)
    throw fail("unsupported revision " + std::to_string(revision >> 16) + "." + std::to_string(revision & 0xffff));
  const std::uint64_t n = word(8), originals = word(12), translations = word(16);
  for (auto [table, name] : {std::pair{originals, "originals"}, std::pair{translations, "translations"}}) {
    if (table + 8 * n > size)
      throw fail(std::string("truncated or corrupt: the table of ") + name + " (" + std::to_string(n) +
                 " entries at offset " + std::to_string(table) + ") ends past the end of the file (" +
                 std::to_string(size) + " bytes)");
  }
  auto string_at = [&](std::uint64_t table, std::uint64_t i, const char* name) {
    const std::uint64_t length = word(table + 8 * i), offset = word(table + 8 * i + 4);
    if (offset + length > size)
      throw fail("truncated or corrupt: " + std::string(name) + " string " + std::to_string(i) + " (" +
                 std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                 ") ends past the end of the file (" + std::to_string(size) + " bytes)");
    return std::string_view(bytes).substr(offset, length);
  };

  mo_catalog catalog;
  catalog.path = path;
  catalog.entries = static_cast<std::int64_t>(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::string_view msgid = string_at(originals, i, "original");
    const std::string_view msgstr = string_at(translations, i, "translation");
    auto& skip = catalog.skipped;
    if (msgid.empty()) {
      catalog.charset = catalog_reading::header_charset(msgstr);
      ++skip.header;
      continue;
    }
    if (msgid.find('\x04') != std::string_view::npos) { ++skip.context; continue; }
    if (msgid.find('\0') != std::string_view::npos || msgstr.find('\0') != std::string_view::npos) {
      ++skip.plural;
      continue;
    }
    const std::string_view en = catalog_reading::trim(msgid), fr = catalog_reading::trim(msgstr);
    if (fr.empty() || en.empty()) { ++skip.untranslated; continue; }
    if (en.find_first_of("\n\r\t") != std::string_view::npos || fr.find_first_of("\n\r\t") != std::string_view::npos) {
      ++skip.multi_line;
      continue;
    }
    if (en == fr) { ++skip.identical; continue; }
    catalog.pairs.push_back({std::string(en), std::string(fr)});
  }
  return catalog;
}

// ---------------------------------------------------------------------------------------------
// The fixed list of catalogs

struct catalog_source {
  std::string_view file;     // under <locale_dir>/fr/LC_MESSAGES/
  std::string_view package;  // the Debian (bookworm) package that installs it
};

// The catalogs of the corpus, in the order that decides which translation wins where the same
// English has several (the first). Picked from `ls /usr/share/locale/fr/LC_MESSAGES/` of a
// Debian bookworm machine with scripts/install_deps.sh's packages (93 files), keeping those whose
// package (`dpkg -S`) is sure to be there:
//   - Priority: required (on every Debian system): coreutils, bash, tar, grep, sed, diffutils,
//     findutils, dpkg, apt (and libapt-pkg6.0, which apt depends on), login (shadow.mo),
//     libpam-runtime (Linux-PAM.mo);
//   - installed by scripts/install_deps.sh: make; binutils-common (bfd, binutils, gas, gold,
//     gprof, ld, opcodes.mo; g++ -> binutils depends on it); procps (cmake depends on it);
//   - added to scripts/install_deps.sh for this corpus (small, data only or everyday tools):
//     libc-l10n (libc.mo), git, gettext and gettext-base, libdpkg-perl (dpkg-dev.mo),
//     libglib2.0-data (glib20.mo), gnupg-l10n (gnupg2.mo), iso-codes.
// Left out: catalogs of packages that only arrive through long, fragile dependency chains
// (GStreamer, GTK, xkb-data, ...) or that the project has no use for (PostgreSQL, GnuCOBOL),
// and iso_639-3.mo (9000 language names that mostly differ from the English in case only, which
// would be a third of the corpus). iso_639.mo and iso_3166.mo are links to iso_639-2.mo and
// iso_3166-1.mo.
inline constexpr std::array<catalog_source, 33> catalog_files{{
    {"coreutils.mo", "coreutils"},
    {"bash.mo", "bash"},
    {"tar.mo", "tar"},
    {"grep.mo", "grep"},
    {"sed.mo", "sed"},
    {"diffutils.mo", "diffutils"},
    {"findutils.mo", "findutils"},
    {"dpkg.mo", "dpkg"},
    {"apt.mo", "apt"},
    {"libapt-pkg6.0.mo", "libapt-pkg6.0"},
    {"shadow.mo", "login"},
    {"Linux-PAM.mo", "libpam-runtime"},
    {"libc.mo", "libc-l10n"},
    {"make.mo", "make"},
    {"binutils.mo", "binutils-common"},
    {"bfd.mo", "binutils-common"},
    {"gas.mo", "binutils-common"},
    {"ld.mo", "binutils-common"},
    {"gold.mo", "binutils-common"},
    {"gprof.mo", "binutils-common"},
    {"opcodes.mo", "binutils-common"},
    {"procps-ng.mo", "procps"},
    {"git.mo", "git"},
    {"gettext-runtime.mo", "gettext-base"},
    {"gettext-tools.mo", "gettext"},
    {"dpkg-dev.mo", "libdpkg-perl"},
    {"glib20.mo", "libglib2.0-data"},
    {"gnupg2.mo", "gnupg-l10n"},
    {"iso_3166-1.mo", "iso-codes"},
    {"iso_4217.mo", "iso-codes"},
    {"iso_639-2.mo", "iso-codes"},
    {"iso_15924.mo", "iso-codes"},
    {"iso_639-5.mo", "iso-codes"},
}};

// ---------------------------------------------------------------------------------------------
// The corpus and its split

// FNV-1a, 64 bits: offset basis 0xcbf29ce484222325, for each byte h = (h ^ byte) * 0x100000001b3.
inline std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

enum class split { train, dev, test };

// The split of a pair, from its English alone (so an English sentence never appears in two
// splits, and adding or removing catalogs moves no pair between splits):
// bucket = fnv1a64(English bytes) % 100; buckets 0-1 -> test, 2-3 -> dev, 4-99 -> train
// (about 2%, 2%, 96%).
inline split split_of(std::string_view en) {
  const std::uint64_t bucket = fnv1a64(en) % 100;
  return bucket < 2 ? split::test : bucket < 4 ? split::dev : split::train;
}

struct corpus {
  std::vector<sentence_pair> train, dev, test;  // each in catalog-list order, then file order
  std::string catalog_dir;                      // <locale_dir>/fr/LC_MESSAGES
  std::vector<std::string> catalogs_read, catalogs_missing;  // file names of the fixed list
  std::int64_t entries = 0;                     // all entries of the catalogs read
  mo_skip_counts skipped;                       // entries that are no usable pair, by reason
  std::int64_t raw_pairs = 0;                   // entries kept as pairs: entries - skipped
  std::int64_t duplicates = 0;                  // pairs seen before (same English and French)
  std::int64_t conflicting_translations = 0;    // English seen before with another French (dropped)
  std::int64_t size() const { return static_cast<std::int64_t>(train.size() + dev.size() + test.size()); }
};

namespace catalog_reading {

// dpkg's path-exclude of /usr/share/locale (Debian's -slim container images have one) explains
// catalogs that are missing although their packages are installed.
inline std::string dpkg_locale_exclusion() {
  std::error_code ec;
  const std::filesystem::path dir = "/etc/dpkg/dpkg.cfg.d";
  if (!std::filesystem::is_directory(dir, ec)) return {};
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);)
      if (trim(line).starts_with("path-exclude") && line.find("/usr/share/locale") != std::string::npos)
        return entry.path().string() + " has \"" + std::string(trim(line)) + "\"";
  }
  return {};
}

}  // namespace catalog_reading

// Reads the catalogs of catalog_files under <locale_dir>/fr/LC_MESSAGES, in list order, and
// splits their pairs by split_of. A pair seen before (same English and French) is dropped and
// counted as a duplicate; an English seen before with another French keeps its first translation
// and counts as a conflicting translation. Missing catalogs: one warning on std::cerr naming them,
// unless fewer than half are found, which throws (naming the packages that install them). A
// catalog that is present but unreadable, or not in UTF-8, throws.
inline corpus load_corpus(const std::string& locale_dir = "/usr/share/locale") {
  corpus c;
  c.catalog_dir = (std::filesystem::path(locale_dir) / "fr" / "LC_MESSAGES").string();
  std::vector<std::string> missing_packages;
  std::vector<mo_catalog> catalogs;
  for (const auto& source : catalog_files) {
    const std::string path = (std::filesystem::path(c.catalog_dir) / source.file).string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      c.catalogs_missing.emplace_back(source.file);
      if (std::find(missing_packages.begin(), missing_packages.end(), source.package) == missing_packages.end())
        missing_packages.emplace_back(source.package);
      continue;
    }
    catalogs.push_back(read_mo(path));
    const std::string charset = catalog_reading::lowercase_ascii(catalogs.back().charset);
    if (!charset.empty() && charset != "utf-8" && charset != "utf8" && charset != "ascii" && charset != "us-ascii")
      throw std::runtime_error(path + ": the catalog is in " + catalogs.back().charset +
                               ", not UTF-8 (the corpus and tokenizer expect UTF-8)");
    c.catalogs_read.emplace_back(source.file);
  }
  if (!c.catalogs_missing.empty()) {
    auto join = [](const std::vector<std::string>& names) {
      std::string s;
      for (const auto& name : names) s += (s.empty() ? "" : " ") + name;
      return s;
    };
    std::string message = std::to_string(c.catalogs_missing.size()) + " of the " +
                          std::to_string(catalog_files.size()) + " French catalogs of the corpus are missing from " +
                          c.catalog_dir + ": " + join(c.catalogs_missing) + ". Installing the Debian packages " +
                          join(missing_packages) + " (scripts/install_deps.sh does) provides them.";
    if (const std::string exclusion = catalog_reading::dpkg_locale_exclusion(); !exclusion.empty())
      message += " Note that " + exclusion + ": dpkg does not install message catalogs while it is there "
                 "(remove it, then reinstall the packages).";
    if (2 * c.catalogs_read.size() < catalog_files.size())
      throw std::runtime_error("too few catalogs for the translation corpus (" +
                               std::to_string(c.catalogs_read.size()) + " found): " + message);
    std::cerr << "warning: " << message << " Continuing with the others.\n";
  }

  std::unordered_map<std::string, std::string> french_of;  // English -> the French kept
  for (auto& catalog : catalogs) {
    c.entries += catalog.entries;
    c.skipped += catalog.skipped;
    c.raw_pairs += static_cast<std::int64_t>(catalog.pairs.size());
    for (auto& pair : catalog.pairs) {
      const auto [at, inserted] = french_of.try_emplace(pair.en, pair.fr);
      if (!inserted) {
        ++(at->second == pair.fr ? c.duplicates : c.conflicting_translations);
        continue;
      }
      switch (split_of(pair.en)) {
        case split::train: c.train.push_back(std::move(pair)); break;
        case split::dev: c.dev.push_back(std::move(pair)); break;
        case split::test: c.test.push_back(std::move(pair)); break;
      }
    }
  }
  return c;
}

// A few printable lines of the corpus's counts.
inline std::string describe(const corpus& c) {
  const auto& s = c.skipped;
  std::ostringstream out;
  out << "catalogs: " << c.catalogs_read.size() << " read, " << c.catalogs_missing.size() << " missing, of "
      << catalog_files.size() << " (" << c.catalog_dir << ")\n"
      << "entries: " << c.entries << "; skipped " << s.total() << ": " << s.header << " headers, " << s.context
      << " with context, " << s.plural << " plural, " << s.untranslated << " untranslated, " << s.multi_line
      << " multi-line, " << s.identical << " identical to the English\n"
      << "pairs: " << c.raw_pairs << " read, " << c.duplicates << " duplicates, " << c.conflicting_translations
      << " conflicting translations of an English already seen (first kept), " << c.size() << " unique\n"
      << "split (FNV-1a 64 of the English % 100: 0-1 test, 2-3 dev): train " << c.train.size() << ", dev "
      << c.dev.size() << ", test " << c.test.size() << "\n";
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

namespace tokenizer_training {

// Hands the training split to SentencePiece's trainer in memory: each pair's English, then its
// French.
class training_sentences : public sentencepiece::SentenceIterator {
 public:
  explicit training_sentences(const std::vector<sentence_pair>& pairs) : pairs_(pairs) {}
  bool done() const override { return index_ >= 2 * pairs_.size(); }
  void Next() override { ++index_; }
  const std::string& value() const override {
    const auto& pair = pairs_[index_ / 2];
    return index_ % 2 == 0 ? pair.en : pair.fr;
  }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<sentence_pair>& pairs_;
  std::size_t index_ = 0;
};

}  // namespace tokenizer_training

// Trains a SentencePiece unigram model of vocab_size pieces on the training split only (dev and
// test stay unseen), English and French together: one vocabulary shared by source and target,
// so the two embeddings can be tied. Writes model_prefix.model (and model_prefix.vocab, a
// readable list of the pieces), creating model_prefix's directory if missing.
//
// Unigram rather than BPE: it is SentencePiece's default and the usual choice of its translation
// models, trains faster than SentencePiece's BPE, and segments by likelihood rather than by merge
// history. Deterministic: all sentences are used (input_sentence_size 0, no sampling nor
// shuffling) and one thread (the EM's sums do not depend on scheduling); the random generator's
// seed, which only sampling would use, is fixed anyway (a process-wide SentencePiece setting).
// The text is not normalised (identity rule, spaces kept as they are), so decode(encode(s)) == s
// for every string made of characters of the training split (character_coverage 1.0); with
// SentencePiece's default NFKC, French's no-break spaces would come back as plain ones.
// Ids: pad 0, unk 1, bos 2, eos 3 (tokenizer's constants).
inline void train_tokenizer(const corpus& c, int vocab_size, const std::string& model_prefix) {
  if (c.train.empty()) throw std::runtime_error("train_tokenizer: the corpus's training split is empty");
  if (vocab_size < 8) throw std::runtime_error("train_tokenizer: vocab_size " + std::to_string(vocab_size) + " is too small");
  const std::filesystem::path parent = std::filesystem::path(model_prefix).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error(parent.string() + ": cannot create the tokenizer's directory: " + ec.message());

  const std::unordered_map<std::string, std::string> options{
      {"model_prefix", model_prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "unigram"},
      {"character_coverage", "1.0"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"minloglevel", "1"},  // no INFO lines (dozens per training)
  };
  sentencepiece::SetRandomGeneratorSeed(20240101u);
  tokenizer_training::training_sentences sentences(c.train);
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &sentences);
  if (!status.ok())
    throw std::runtime_error(model_prefix + ".model: training the SentencePiece model failed: " + status.ToString());
}

class tokenizer {
 public:
  static constexpr int pad = 0, unk = 1, bos = 2, eos = 3;

  explicit tokenizer(const std::string& model_path) : path_(model_path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model_path, ec))
      throw std::runtime_error(model_path + ": no such SentencePiece model file (train_tokenizer writes it)");
    if (const auto status = processor_->Load(model_path); !status.ok())
      throw std::runtime_error(model_path + ": cannot load the SentencePiece model: " + status.ToString());
    if (processor_->pad_id() != pad || processor_->unk_id() != unk || processor_->bos_id() != bos ||
        processor_->eos_id() != eos)
      throw std::runtime_error(model_path + ": the SentencePiece model's special ids are pad " +
                               std::to_string(processor_->pad_id()) + ", unk " + std::to_string(processor_->unk_id()) +
                               ", bos " + std::to_string(processor_->bos_id()) + ", eos " +
                               std::to_string(processor_->eos_id()) + "; 0, 1, 2, 3 expected (train_tokenizer's)");
  }

  // The ids of text's pieces, without bos and eos.
  std::vector<int> encode(const std::string& text) const {
    std::vector<int> ids;
    if (const auto status = processor_->Encode(text, &ids); !status.ok())
      throw std::runtime_error(path_ + ": encoding failed: " + status.ToString());
    return ids;
  }

  // The text of ids; pad, bos and eos decode to nothing, unk to " \u2047 " (SentencePiece's).
  std::string decode(const std::vector<int>& ids) const {
    for (const int id : ids)
      if (id < 0 || id >= vocab_size())
        throw std::runtime_error(path_ + ": cannot decode id " + std::to_string(id) + ", outside the vocabulary of " +
                                 std::to_string(vocab_size()));
    std::string text;
    if (const auto status = processor_->Decode(ids, &text); !status.ok())
      throw std::runtime_error(path_ + ": decoding failed: " + status.ToString());
    return text;
  }

  int vocab_size() const { return processor_->GetPieceSize(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_ =
      std::make_unique<sentencepiece::SentencePieceProcessor>();
};

// ---------------------------------------------------------------------------------------------
// Files shared with the PyTorch peer

// For each split s of train, dev, test, writes into dir (created if missing), one line per pair,
// in the corpus's order:
//   s.src, s.tgt: the token ids of the English, of the French, in decimal, separated by one space,
//                 without bos and eos;
//   s.en, s.fr:   the text of the English, of the French (UTF-8).
// Lines end in "\n" (the last one too).
inline void write_token_files(const corpus& c, const tokenizer& tok, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create the directory of the token files: " + ec.message());
  const std::pair<const char*, const std::vector<sentence_pair>*> splits[] = {
      {"train", &c.train}, {"dev", &c.dev}, {"test", &c.test}};
  for (const auto& [name, pairs] : splits) {
    const auto base = std::filesystem::path(dir) / name;
    struct output {
      std::string path;
      std::ofstream stream;
    };
    std::array<output, 4> files;
    const char* extensions[] = {".src", ".tgt", ".en", ".fr"};
    for (int f = 0; f < 4; ++f) {
      files[f].path = base.string() + extensions[f];
      files[f].stream.open(files[f].path, std::ios::binary | std::ios::trunc);
      if (!files[f].stream) throw std::runtime_error(files[f].path + ": cannot open for writing");
    }
    auto write_ids = [](std::ofstream& out, const std::vector<int>& ids) {
      for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
      out << '\n';
    };
    for (const auto& pair : *pairs) {
      if (pair.en.find_first_of("\n\r") != std::string::npos || pair.fr.find_first_of("\n\r") != std::string::npos)
        throw std::runtime_error(base.string() + ".*: the pair \"" + pair.en + "\" has a line break; one line per pair expected");
      write_ids(files[0].stream, tok.encode(pair.en));
      write_ids(files[1].stream, tok.encode(pair.fr));
      files[2].stream << pair.en << '\n';
      files[3].stream << pair.fr << '\n';
    }
    for (auto& file : files) {
      file.stream.close();
      if (!file.stream) throw std::runtime_error(file.path + ": error while writing");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The batch order shared with Python

// splitmix64 (Steele, Lea and Flood; Vigna's reference code), all arithmetic modulo 2^64:
//   state += 0x9e3779b97f4a7c15; z = state;
//   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
//   return z ^ (z >> 31);
// From state 0 the first outputs are 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4.
inline std::uint64_t splitmix64(std::uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  std::uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A permutation of 0 .. n-1, the same in the Python peer: p = [0, 1, ..., n-1]; state = seed;
// for i = n-1 down to 1: j = splitmix64(state) % (i + 1) (unsigned 64-bit remainder); swap p[i]
// and p[j]. (Fisher-Yates from the back; the modulo's bias, below 2^-40 for n < 2^24, is part of the
// definition.) n = 10, seed = 1 gives 4 2 8 1 9 3 0 6 7 5.
inline std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  if (n < 0) throw std::invalid_argument("permutation: n = " + std::to_string(n) + " is negative");
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
  std::uint64_t state = seed;
  for (std::int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<std::int64_t>(splitmix64(state) % static_cast<std::uint64_t>(i + 1));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

}  // namespace translation
