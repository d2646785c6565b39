#include "prepare.h"
#include "apps/common/run_options.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include "apps/common/metrics.h"
#include "apps/common/prepared_data.h"
#include "bible.h"
#include "core/error.h"
#include "nn/io_util.h"
#include "nn/sampler.h"
#include "tokenizer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace translate {

void add_prepare_flags(CLI::App& app, PrepareOptions& o) {
  const char* data = "Data";
  app.add_option("--out", o.out, "folder to write (replaced only if it holds a prepared data.json)")
      ->group(data)->capture_default_str();
  app.add_option("--src", o.src_file, "source-language text file, one sentence per line (default: the Bible, "
                 "English side)")->group(data);
  app.add_option("--tgt", o.tgt_file, "target-language text file, line-aligned with --src (default: the Bible, "
                 "Spanish side)")->group(data);
  app.add_option("--src-lang", o.src_lang, "source language code, used in file names")->group(data)->capture_default_str();
  app.add_option("--tgt-lang", o.tgt_lang, "target language code, used in file names")->group(data)->capture_default_str();
  const char* split = "Split";
  app.add_option("--split", o.split, "random: random pairs for valid/test; books: whole books held out (Bible only)")
      ->group(split)->capture_default_str()->check(CLI::IsMember({"random", "books"}));
  app.add_option("--valid-size", o.valid_size, "random split: pairs in the validation set")
      ->group(split)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--test-size", o.test_size, "random split: pairs in the test set")
      ->group(split)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--valid-books", o.valid_books, "books split: comma-separated OSIS book names for validation")
      ->group(split)->capture_default_str();
  app.add_option("--test-books", o.test_books, "books split: comma-separated OSIS book names for test")
      ->group(split)->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the random split and of SentencePiece training")
      ->group(split)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  const char* vocab = "Vocabulary";
  app.add_option("--vocab-size", o.vocab_size, "SentencePiece vocabulary size (per model)")
      ->group(vocab)->capture_default_str()->check(CLI::Range(8, 1000000));
  app.add_option("--vocab", o.vocab, "joint: one model for both languages; separate: one per language")
      ->group(vocab)->capture_default_str()->check(CLI::IsMember({"joint", "separate"}));
  app.add_option("--spm-type", o.spm_type, "SentencePiece model type")
      ->group(vocab)->capture_default_str()->check(CLI::IsMember({"unigram", "bpe"}));
  const char* filter = "Filter (training pairs only)";
  app.add_option("--max-length", o.max_length, "drop training pairs with more tokens than this on a side (0: off)")
      ->group(filter)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--max-ratio", o.max_ratio,
                 "drop training pairs whose token counts differ by more than this "
                 "factor, as (longer+1)/(shorter+1) (0: off)")
      ->group(filter)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
}

namespace {

// The pairs before splitting, from either source.
struct Corpus {
  std::vector<std::string> src, tgt, refs;
  std::vector<std::string> books;  // per pair (Bible only)
  json source, read, dropped, cleaning;
};

Corpus load_bible() {
  BibleCorpus bible = read_bible();
  const BibleStats& st = bible.stats;
  Corpus c;
  for (VersePair& p : bible.pairs) {
    c.books.push_back(book_of(p.ref));
    c.refs.push_back(std::move(p.ref));
    c.src.push_back(std::move(p.src));
    c.tgt.push_back(std::move(p.tgt));
  }
  c.source = {{"kind", "bible"},
              {"sword_version", st.sword_version},
              {"src", {{"module", st.src_module}, {"versification", st.src_versification}}},
              {"tgt", {{"module", st.tgt_module}, {"versification", st.tgt_versification}}}};
  c.read = {{"src_verses", st.src_verses}, {"tgt_verses", st.tgt_verses}};
  c.dropped = st.dropped;
  c.cleaning = {{"books_missing_in_tgt", st.missing_books},
                {"pairs_mapped_between_versifications", st.mapped},
                {"pairs_realigned", st.realigned},
                {"tgt_verses_unused", st.tgt_unused},
                {"tgt_chapter_openings_recased", st.recased},
                {"footnotes_removed", st.notes_removed},
                {"psalm_titles_restored", st.titles_restored}};
  return c;
}

// The lines of a UTF-8 text file (a BOM removed), each whitespace-normalized (which removes a CR
// line end too).
std::vector<std::string> read_lines(const std::string& path, const char* flag) {
  const std::string op = std::string("translate prepare ") + flag;
  const std::vector<char> bytes = linea::nn::detail::read_file_bytes(path, op.c_str());
  std::string text(bytes.begin(), bytes.end());
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    const int64_t bad = invalid_utf8_at(line);
    LINEA_CHECK(bad < 0, op, ": '", path, "' line ", lines.size() + 1, " is not valid UTF-8 (byte ", bad + 1,
                " of the line)");
    lines.push_back(normalize_space(line));
    start = end + 1;
  }
  return lines;
}

Corpus load_files(const std::string& src_path, const std::string& tgt_path) {
  const std::vector<std::string> src = read_lines(src_path, "--src"), tgt = read_lines(tgt_path, "--tgt");
  LINEA_CHECK(src.size() == tgt.size(), "translate prepare: --src '", src_path, "' has ", src.size(),
              " lines but --tgt '", tgt_path, "' has ", tgt.size(), "; the files must be line-aligned");
  Corpus c;
  std::map<std::string, int64_t> dropped;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i].empty() || tgt[i].empty()) {
      ++dropped[src[i].empty() && tgt[i].empty() ? "both_empty" : src[i].empty() ? "src_empty" : "tgt_empty"];
      continue;
    }
    c.src.push_back(src[i]);
    c.tgt.push_back(tgt[i]);
    c.refs.push_back(std::to_string(i + 1));
  }
  c.source = {{"kind", "files"}, {"src", src_path}, {"tgt", tgt_path}};
  c.read = {{"src_lines", src.size()}, {"tgt_lines", tgt.size()}};
  c.dropped = dropped;
  c.cleaning = json::object();
  return c;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    item = normalize_space(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The books split's held-out books in the flags' order, each with its split (1 valid, 2 test);
// checked before the Bible is read.
std::vector<std::pair<std::string, int>> held_out_books(const PrepareOptions& o) {
  LINEA_CHECK(o.src_file.empty(),
              "translate prepare: --split books needs the Bible; for --src/--tgt files use "
              "--split random");
  std::vector<std::pair<std::string, int>> held;
  std::map<std::string, int> role;
  for (int r : {1, 2}) {
    const std::vector<std::string> books = split_list(r == 1 ? o.valid_books : o.test_books);
    LINEA_CHECK(!books.empty(), "translate prepare: --", r == 1 ? "valid" : "test", "-books is empty");
    for (const std::string& b : books) {
      LINEA_CHECK(!role.count(b) || role[b] == r, "translate prepare: book '", b,
                  "' is in both --valid-books and --test-books");
      if (role.emplace(b, r).second) held.push_back({b, r});
    }
  }
  return held;
}

// Pair indices of train, valid, test, each in corpus order.
std::vector<std::vector<int64_t>> make_splits(const Corpus& c, const PrepareOptions& o) {
  const int64_t n = static_cast<int64_t>(c.src.size());
  std::vector<std::vector<int64_t>> s(3);
  if (o.split == "random") {
    LINEA_CHECK(o.valid_size + o.test_size < n, "translate prepare: --valid-size ", o.valid_size, " + --test-size ",
                o.test_size, " leaves no training pairs out of ", n);
    const std::vector<int64_t> perm = linea::nn::epoch_permutation(n, o.seed, 0);
    for (int64_t k = 0; k < n; ++k) s[k < o.valid_size ? 1 : k < o.valid_size + o.test_size ? 2 : 0].push_back(perm[k]);
    for (auto& v : s) std::sort(v.begin(), v.end());
    return s;
  }
  std::vector<std::string> known;
  for (const std::string& b : c.books)
    if (known.empty() || known.back() != b) known.push_back(b);
  std::map<std::string, int> role;
  for (const auto& [b, r] : held_out_books(o)) {
    LINEA_CHECK(std::find(known.begin(), known.end(), b) != known.end(), "translate prepare: unknown book '", b,
                "' in --", r == 1 ? "valid" : "test", "-books; the books with pairs are: ", linea::join(known));
    role[b] = r;
  }
  for (int64_t i = 0; i < n; ++i) {
    auto it = role.find(c.books[i]);
    s[it == role.end() ? 0 : it->second].push_back(i);
  }
  LINEA_CHECK(!s[0].empty(), "translate prepare: the held-out books leave no training pairs");
  return s;
}

json side_stats(const std::vector<std::string>& text, const std::vector<std::vector<int64_t>>& ids) {
  std::vector<int64_t> chars, tokens;
  int64_t unk = 0, total = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    chars.push_back(utf8_length(text[i]));
    tokens.push_back(static_cast<int64_t>(ids[i].size()));
    unk += std::count(ids[i].begin(), ids[i].end(), kUnkId);
    total += static_cast<int64_t>(ids[i].size());
  }
  return {{"chars", linea::apps::length_summary(chars)}, {"tokens", linea::apps::length_summary(tokens)},
          {"unk_rate", total ? std::round(1e6 * double(unk) / double(total)) / 1e6 : 0.0}};
}

void write_lines(const fs::path& path, const std::vector<std::string>& lines) {
  std::ofstream f(path, std::ios::binary);
  for (const std::string& l : lines) f << l << '\n';
  f.close();
  LINEA_CHECK(f.good(), "translate prepare: cannot write '", path.string(), "'");
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  f.close();
  LINEA_CHECK(f.good(), "translate prepare: cannot write '", path.string(), "'");
}

bool safe_lang(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

PrepareResult prepare_folder(const PrepareOptions& o, std::ostream* log) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto say = [&](const std::string& s) {
    if (log) *log << s << std::endl;
  };
  LINEA_CHECK(o.src_file.empty() == o.tgt_file.empty(), "translate prepare: --src and --tgt go together (a pair of "
              "line-aligned files); give both, or neither for the Bible");
  LINEA_CHECK(safe_lang(o.src_lang) && safe_lang(o.tgt_lang) && o.src_lang != o.tgt_lang, "translate prepare: "
              "--src-lang and --tgt-lang must be two different codes of letters, digits, '-' or '_' (got '",
              o.src_lang, "' and '", o.tgt_lang, "')");
  LINEA_CHECK(o.split == "random" || o.split == "books", "translate prepare: --split must be random or books, got '",
              o.split, "'");
  LINEA_CHECK(o.vocab == "joint" || o.vocab == "separate", "translate prepare: --vocab must be joint or separate, got '",
              o.vocab, "'");
  LINEA_CHECK(o.valid_size >= 0 && o.test_size >= 0 && o.max_length >= 0 && o.max_ratio >= 0,
              "translate prepare: sizes and limits must be >= 0");
  if (o.split == "books") held_out_books(o);  // the flags' own errors before the Bible is read
  const std::string out_str = linea::apps::prepared_data_out("translate prepare", o.out);
  const fs::path out(out_str);

  say(o.src_file.empty() ? "reading the Bible with SWORD ..." : "reading " + o.src_file + " and " + o.tgt_file + " ...");
  Corpus c = o.src_file.empty() ? load_bible() : load_files(o.src_file, o.tgt_file);
  const std::vector<std::vector<int64_t>> split_idx = make_splits(c, o);

  // SentencePiece on the training split only.
  const bool joint = o.vocab == "joint";
  const std::string src_model = joint ? "spm.model" : "spm." + o.src_lang + ".model";
  const std::string tgt_model = joint ? "spm.model" : "spm." + o.tgt_lang + ".model";
  TokenizerTraining tt;
  tt.vocab_size = o.vocab_size;
  tt.model_type = o.spm_type;
  tt.seed = o.seed;
  std::vector<const std::string*> src_train, tgt_train;
  for (int64_t i : split_idx[0]) {
    src_train.push_back(&c.src[i]);
    tgt_train.push_back(&c.tgt[i]);
  }
  say("training SentencePiece (" + o.spm_type + ", " + o.vocab + ", vocab " + std::to_string(o.vocab_size) + ") on " +
      std::to_string(split_idx[0].size()) + " training pairs ...");
  std::map<std::string, std::string> models;  // file name -> bytes
  if (joint) {
    std::vector<const std::string*> both = src_train;
    both.insert(both.end(), tgt_train.begin(), tgt_train.end());
    models[src_model] = train_tokenizer(both, tt);
  } else {
    models[src_model] = train_tokenizer(src_train, tt);
    models[tgt_model] = train_tokenizer(tgt_train, tt);
  }
  const Tokenizer src_tok = Tokenizer::from_bytes(models[src_model]);
  const Tokenizer tgt_tok = Tokenizer::from_bytes(models[tgt_model]);

  // Tokenize, filter the training pairs, and write everything into a temporary folder.
  say("tokenizing and writing " + out_str + " ...");
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  linea::nn::StagingDir tmp(out_str + ".tmp." + std::to_string(::getpid()));
  const char* names[3] = {"train", "valid", "test"};
  json splits_json, files_json;
  std::map<std::string, int64_t> filtered;
  int64_t sizes[3] = {0, 0, 0};
  for (int s = 0; s < 3; ++s) {
    std::vector<std::string> src, tgt, refs;
    std::vector<std::vector<int64_t>> src_ids, tgt_ids;
    for (int64_t i : split_idx[s]) {
      std::vector<int64_t> a = src_tok.encode(c.src[i]), b = tgt_tok.encode(c.tgt[i]);
      if (s == 0) {
        const int64_t lo = std::min(a.size(), b.size()), hi = std::max(a.size(), b.size());
        const char* reason = o.max_length > 0 && hi > o.max_length                              ? "too_long"
                             : o.max_ratio > 0 && double(hi + 1) / double(lo + 1) > o.max_ratio ? "length_ratio"
                                                                                                 : nullptr;
        if (reason) {
          ++filtered[reason];
          continue;
        }
      }
      src.push_back(c.src[i]);
      tgt.push_back(c.tgt[i]);
      refs.push_back(c.refs[i]);
      src_ids.push_back(std::move(a));
      tgt_ids.push_back(std::move(b));
    }
    const std::string base = names[s];
    write_lines(tmp.path() / (base + "." + o.src_lang), src);
    write_lines(tmp.path() / (base + "." + o.tgt_lang), tgt);
    write_lines(tmp.path() / (base + ".ref"), refs);
    sizes[s] = static_cast<int64_t>(src.size());
    splits_json[base] = {{"pairs", sizes[s]}, {"src", side_stats(src, src_ids)}, {"tgt", side_stats(tgt, tgt_ids)}};
    files_json[base] = {{"src", base + "." + o.src_lang}, {"tgt", base + "." + o.tgt_lang}, {"ref", base + ".ref"},
                        {"pairs", sizes[s]}};
  }
  for (const auto& [name, bytes] : models) write_file(tmp.path() / name, bytes);

  json split_json = {{"method", o.split}, {"seed", o.seed}};
  if (o.split == "random") {
    split_json["valid_size"] = o.valid_size;
    split_json["test_size"] = o.test_size;
  } else {
    split_json["valid_books"] = split_list(o.valid_books);
    split_json["test_books"] = split_list(o.test_books);
  }
  const json vocab_json = {{"mode", o.vocab},         {"type", o.spm_type},      {"size", o.vocab_size},
                           {"src_model", src_model},  {"tgt_model", tgt_model},  {"character_coverage", 1.0},
                           {"pad_id", kPadId},        {"unk_id", kUnkId},        {"bos_id", kBosId},
                           {"eos_id", kEosId}};
  const json filter_json = {{"max_length", o.max_length}, {"max_ratio", o.max_ratio}, {"dropped", filtered},
                            {"applies_to", "train"}};
  json stats = {{"source", c.source},
                {"read", c.read},
                {"pairs", c.src.size()},
                {"dropped", c.dropped},
                {"cleaning", c.cleaning},
                {"length_filter", filter_json},
                {"splits", splits_json},
                {"vocab", vocab_json},
                {"split", split_json}};
  const json manifest = {{"format", "linea-translate-data"},
                         {"version", 1},
                         {"source", c.source.at("kind")},
                         {"src_lang", o.src_lang},
                         {"tgt_lang", o.tgt_lang},
                         {"files", files_json},
                         {"vocab", vocab_json},
                         {"split", split_json},
                         {"length_filter", filter_json},
                         {"seed", o.seed}};
  write_file(tmp.path() / "stats.json", stats.dump(2) + "\n");
  write_file(tmp.path() / "data.json", manifest.dump(2) + "\n");  // last: a folder with data.json is complete
  tmp.install(out);

  PrepareResult r;
  r.out = out_str;
  r.train = sizes[0];
  r.valid = sizes[1];
  r.test = sizes[2];
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = std::move(stats);
  return r;
}

}  // namespace

PrepareResult prepare(const PrepareOptions& options, std::ostream* log) {
  return linea::apps::naming_filesystem_errors("translate prepare", [&] { return prepare_folder(options, log); });
}

std::string describe(const PrepareResult& r) {
  std::ostringstream s;
  const json& st = r.stats;
  s << "wrote " << r.out << ": train " << r.train << ", valid " << r.valid << ", test " << r.test << " pairs ("
    << st.at("pairs").get<int64_t>() << " after cleaning";
  for (const auto& [reason, n] : st.at("dropped").items()) s << "; " << reason << " " << n;
  s << ")\n";
  const json& f = st.at("length_filter").at("dropped");
  if (!f.empty()) {
    s << "length filter (train only):";
    for (const auto& [reason, n] : f.items()) s << " " << reason << " " << n;
    s << "\n";
  }
  const json& v = st.at("vocab");
  s << "vocabulary: " << v.at("mode").get<std::string>() << " " << v.at("type").get<std::string>() << " "
    << v.at("size") << " (" << v.at("src_model").get<std::string>();
  if (v.at("tgt_model") != v.at("src_model")) s << ", " << v.at("tgt_model").get<std::string>();
  s << "); " << std::fixed;
  s.precision(1);
  s << r.seconds << " s\n";
  return s.str();
}

}  // namespace translate
