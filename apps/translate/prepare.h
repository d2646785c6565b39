// `translate prepare`: builds the translation data folder from the Bible (bible.h) or from a
// user's pair of line-aligned files, with the splits, SentencePiece model(s) trained on the
// training split and statistics.
//
//   translate prepare                                  the Bible, random split, joint 8k unigram vocab
//   translate prepare --split books --test-books John,1John,2John,3John --valid-books Acts
//   translate prepare --src corpus.de --tgt corpus.en --src-lang de --tgt-lang en --out data/de-en
//
// The folder (--out, default data/translate), written to a temporary sibling folder and renamed
// into place only when complete (an existing folder is replaced only if it holds a data.json):
//   {train,valid,test}.{src_lang,tgt_lang}  one sentence per line (UTF-8, whitespace normalized)
//   {train,valid,test}.ref   where each line came from: OSIS references (Gen.1.1) or, for user
//                            files, 1-based line numbers of the input files
//   spm.model (joint vocab) or spm.{src_lang}.model + spm.{tgt_lang}.model (separate vocabs)
//   stats.json               source, counts read, pairs kept, dropped by reason, per-split length
//                            statistics (chars and tokens: mean, median, p90, max), unk rates
//   data.json                the manifest read back by read_manifest / read_split (dataset.h)
// Splits: `random` draws valid and test pairs with a permutation fixed by --seed (the rest is
// train); `books` holds out whole books (Bible only). Valid and test are never filtered, so every
// model is scored on the same sentences; training pairs longer than --max-length tokens on a
// side, or with a token length ratio (longer+1)/(shorter+1) above --max-ratio, are dropped.
// The same flags and inputs give byte-identical folders.
// Not here: reading a prepared folder back (dataset.h).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

namespace CLI {
class App;
}

namespace translate {

// Books of about 1,000 verses each: the Johannine writings (879 + 105 + 13 + 14) and Acts (1,007).
inline const char* kDefaultTestBooks = "John,1John,2John,3John";
inline const char* kDefaultValidBooks = "Acts";

struct PrepareOptions {
  std::string out = "data/translate";
  std::string src_file, tgt_file;  // user data; both empty: the Bible
  std::string src_lang = "en", tgt_lang = "es";
  std::string split = "random";  // random | books
  int64_t valid_size = 1000, test_size = 1000;
  std::string valid_books = kDefaultValidBooks, test_books = kDefaultTestBooks;
  int64_t vocab_size = 8000;
  std::string vocab = "joint";       // joint | separate
  std::string spm_type = "unigram";  // unigram | bpe
  int64_t max_length = 250;          // training pairs: tokens per side (0: no limit)
  double max_ratio = 3.0;            // training pairs: (longer+1)/(shorter+1) tokens (0: no limit)
  uint64_t seed = 0;
};

// Registers the flags above on `app` (the `prepare` subcommand), showing opts' values as defaults.
void add_prepare_flags(CLI::App& app, PrepareOptions& opts);

struct PrepareResult {
  std::string out;  // the folder written
  int64_t train = 0, valid = 0, test = 0;
  double seconds = 0;
  nlohmann::json stats;  // what stats.json holds
};

// Writes the folder; progress lines go to `log` when given. Bad flags and inputs are linea::Error.
PrepareResult prepare(const PrepareOptions& options, std::ostream* log = nullptr);

// A few lines for the terminal: pairs per split, dropped counts, vocabulary, time.
std::string describe(const PrepareResult& result);

}  // namespace translate
