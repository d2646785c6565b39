// BLEU and chrF of a corpus, computed exactly as sacreBLEU 2.x does with its defaults, so that
// a score printed by Linea (linea-bleu, the translation app's validation) is the score
// `sacrebleu REF -i HYP [-m bleu chrf]` prints for the same text.
//
// Followed release: sacreBLEU 2.3.1 (kSacrebleuVersion, the `version:` field of the signatures).
// Its BLEU: the 13a (mteval-v13a) tokenizer, mixed case, smoothing `exp`, n-grams up to 4, no
// effective order. Its chrF: character n-grams up to 6, no word n-grams, beta 2, whitespace
// removed, effective-order averaging (the `eff:yes` of its signature; `eps_smoothing` selects
// the chrF++.py epsilon variant). Text is UTF-8; whitespace, stripping and characters are those
// of Python's str (Unicode code points; the whitespace of str.split()).
//
// Not here: other tokenizers, lowercasing, chrF++ word n-grams, TER, sentence-level scores,
// significance tests. Bad input (streams of different lengths, no references, no sentences,
// invalid UTF-8) throws linea::Error.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace linea::apps::bleu {

inline constexpr const char* kSacrebleuVersion = "2.3.1";
inline constexpr int kMaxNgramOrder = 4;

// What sacreBLEU's JSON prints for one metric.
struct Score {
  std::string name;           // "BLEU", "chrF2"
  double score = 0.0;         // in [0, 100]
  std::string signature;      // e.g. nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1
  std::string verbose_score;  // BLEU only: "P1/P2/P3/P4 (BP = b ratio = r hyp_len = h ref_len = l)"
};

struct BleuScore : Score {
  std::array<int64_t, kMaxNgramOrder> counts{};     // matched n-grams of order 1..4 (clipped by the refs)
  std::array<int64_t, kMaxNgramOrder> totals{};     // hypothesis n-grams of order 1..4
  std::array<double, kMaxNgramOrder> precisions{};  // in percent, exp-smoothed
  double bp = 0.0;                                  // brevity penalty
  int64_t sys_len = 0, ref_len = 0;                 // tokens; ref_len sums the closest reference lengths
  double ratio = 0.0;                               // sys_len / ref_len, 0 when ref_len is 0
};

struct ChrfOptions {
  int char_order = 6;
  int beta = 2;
  bool whitespace = false;     // keep whitespace inside the character n-grams
  bool eps_smoothing = false;  // chrF++.py's epsilon smoothing instead of effective-order averaging
};

struct ChrfScore : Score {
  std::vector<int64_t> stats;  // corpus sums, per order n = 1..char_order: hyp, ref, matched n-grams
};

// hyps[i] is the hypothesis of sentence i; refs[r][i] its r-th reference (every reference stream
// has one line per hypothesis; an empty line is an empty reference, as in sacreBLEU).
BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs);
ChrfScore corpus_chrf(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                      const ChrfOptions& options = {});

// BLEU from summed statistics (sacreBLEU's BLEU.compute_bleu with smooth_method="exp"); nrefs
// only goes into the signature.
BleuScore compute_bleu(const std::array<int64_t, kMaxNgramOrder>& counts,
                       const std::array<int64_t, kMaxNgramOrder>& totals, int64_t sys_len, int64_t ref_len,
                       int nrefs = 1);

// sacreBLEU's 13a tokenization of one (already right-stripped) line, split into tokens.
std::vector<std::string> tokenize_13a(std::string_view line);

// Output exactly as `sacrebleu --format json` prints one metric (json.dumps(indent=1) of name,
// score rounded to `width` decimals, signature, verbose_score, then each signature field), and
// as `--format text` does ("BLEU|<signature> = 12.3 <verbose>"); no trailing newline.
std::string to_json(const Score& s, int width = 1);
std::string to_text(const Score& s, int width = 1);
// f"{score:.{width}f}": what -b prints.
std::string format_score(double score, int width = 1);

// ---- text helpers, also used by linea-bleu -----------------------------------------------------
// Strict UTF-8 decoding as Python's "utf-8" codec (no overlongs, surrogates or code points past
// U+10FFFF); throws linea::Error naming the byte offset.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
// Python's str.isspace() for one code point: what str.split() and str.rstrip() strip.
bool is_space(char32_t c);
// Python's str.rstrip() on UTF-8 text.
std::string rstrip(std::string_view s);

}  // namespace linea::apps::bleu
