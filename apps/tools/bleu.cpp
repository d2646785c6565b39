// BLEU and chrF as sacreBLEU 2.3.1 computes them (see bleu.h). Each step names the sacreBLEU
// function it reproduces; the floating-point operations are done in the same order as there,
// so the scores agree to the last bit, not only to the printed decimals.
#include "apps/tools/bleu.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "core/error.h"

namespace linea::apps::bleu {

// ---- text ---------------------------------------------------------------------------------------

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    // lead bytes: 0xxxxxxx, 110xxxxx (C0, C1 would be overlong), 1110xxxx, 11110xxx (up to F4)
    const int len = c < 0x80                ? 1
                    : c >= 0xC2 && c < 0xE0 ? 2
                    : c >= 0xE0 && c < 0xF0 ? 3
                    : c >= 0xF0 && c < 0xF5 ? 4
                                            : 0;
    static const char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};  // smallest code point of each length
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    LINEA_CHECK(len > 0 && i + len <= s.size(), "invalid UTF-8: byte 0x", std::hex, int(c), std::dec, " at offset ", i);
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      LINEA_CHECK((cc & 0xC0) == 0x80, "invalid UTF-8: bad continuation byte at offset ", i + k);
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Python's codec refuses overlong forms, UTF-16 surrogates and code points past U+10FFFF.
    LINEA_CHECK(cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF),
                "invalid UTF-8: bad sequence at offset ", i);
    out += cp;
    i += len;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out += char(c);
    } else if (c < 0x800) {
      out += char(0xC0 | (c >> 6));
      out += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += char(0xE0 | (c >> 12));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    } else {
      out += char(0xF0 | (c >> 18));
      out += char(0x80 | ((c >> 12) & 0x3F));
      out += char(0x80 | ((c >> 6) & 0x3F));
      out += char(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// CPython's _PyUnicode_IsWhitespace (bidirectional class WS, B or S, or category Zs).
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

std::u32string rstrip32(std::u32string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// str.split(): runs of whitespace separate, no empty fields.
std::vector<std::u32string> split32(const std::u32string& s) {
  std::vector<std::u32string> out;
  for (size_t i = 0; i < s.size();) {
    while (i < s.size() && is_space(s[i])) ++i;
    const size_t j = i;
    while (i < s.size() && !is_space(s[i])) ++i;
    if (i > j) out.emplace_back(s, j, i - j);
  }
  return out;
}

// str.replace(): non-overlapping, left to right, the replacement itself not scanned again.
std::u32string replace_all(const std::u32string& s, const std::u32string& from, const std::u32string& to) {
  std::u32string out;
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::u32string::npos; i = j + from.size()) out.append(s, i, j - i) += to;
  return out.append(s, i);
}

// Decodes one line of a corpus, naming it when it is not UTF-8.
std::u32string decode_line(const std::string& line, const char* op, const std::string& what, size_t i) {
  try {
    return utf8_decode(line);
  } catch (const Error& e) {
    LINEA_FAIL(op, ": ", what, " line ", i + 1, ": ", e.what());
  }
}

void check_streams(const char* op, const std::vector<std::string>& hyps,
                   const std::vector<std::vector<std::string>>& refs) {
  LINEA_CHECK(!refs.empty(), op, ": no reference streams (need at least one)");
  LINEA_CHECK(!hyps.empty(), op, ": no hypotheses (the corpus is empty)");
  for (size_t r = 0; r < refs.size(); ++r)
    LINEA_CHECK(refs[r].size() == hyps.size(), op, ": ", hyps.size(), " hypotheses but reference stream ", r, " has ",
                refs[r].size(), " lines");
}

}  // namespace

std::string rstrip(std::string_view s) { return utf8_encode(rstrip32(utf8_decode(s))); }

// ---- 13a tokenizer ------------------------------------------------------------------------------

namespace {

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }  // Python's [0-9]: ASCII only

// The ASCII punctuation of tokenizer_re's first rule, [\{-\~\[-\` -\&\(-\+\:-\@\/]: everything
// printable but letters, digits, ' , - and . (space is in it too, which is harmless).
bool is_13a_punct(char32_t c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') || (c >= '(' && c <= '+') ||
         (c >= ':' && c <= '@') || c == '/';
}

// re.sub of a two-character pattern: scan left to right; where (s[i], s[i+1]) matches, emit the
// replacement and continue after the pair, else emit s[i] and move on by one.
template <typename Match, typename Replace>
std::u32string sub_pairs(const std::u32string& s, Match match, Replace replace) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 2);
  size_t i = 0;
  for (; i + 1 < s.size(); ++i) {
    if (match(s[i], s[i + 1])) {
      out += replace(s[i], s[i + 1]);
      ++i;
    } else {
      out += s[i];
    }
  }
  if (i < s.size()) out += s[i];
  return out;
}

bool is_dot_comma(char32_t c) { return c == '.' || c == ','; }

// Tokenizer13a.__call__ then TokenizerRegexp.__call__, on code points.
std::vector<std::u32string> tokenize_13a_32(std::u32string line) {
  line = replace_all(line, U"<skipped>", U"");
  line = replace_all(line, U"-\n", U"");
  line = replace_all(line, U"\n", U" ");
  line = replace_all(line, U"&quot;", U"\"");
  line = replace_all(line, U"&amp;", U"&");
  line = replace_all(line, U"&lt;", U"<");
  line = replace_all(line, U"&gt;", U">");
  line = U" " + line + U" ";

  std::u32string s;  // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> ' \1 '
  s.reserve(line.size() * 2);
  for (char32_t c : line) s += is_13a_punct(c) ? std::u32string{U' ', c, U' '} : std::u32string{c};
  auto pad_after = [](char32_t a, char32_t b) { return std::u32string{a, U' ', b, U' '}; };   // '\1 \2 '
  auto pad_before = [](char32_t a, char32_t b) { return std::u32string{U' ', a, U' ', b}; };  // ' \1 \2'
  // ([^0-9])([\.,]): period and comma unless preceded by a digit
  s = sub_pairs(
      s, [](char32_t a, char32_t b) { return !is_digit(a) && is_dot_comma(b); }, pad_after);
  // ([\.,])([^0-9]): period and comma unless followed by a digit
  s = sub_pairs(
      s, [](char32_t a, char32_t b) { return is_dot_comma(a) && !is_digit(b); }, pad_before);
  // ([0-9])(-): dash when preceded by a digit
  s = sub_pairs(
      s, [](char32_t a, char32_t b) { return is_digit(a) && b == '-'; }, pad_after);
  return split32(s);
}

}  // namespace

std::vector<std::string> tokenize_13a(std::string_view line) {
  std::vector<std::string> out;
  for (auto& t : tokenize_13a_32(utf8_decode(line))) out.push_back(utf8_encode(t));
  return out;
}

// ---- BLEU ---------------------------------------------------------------------------------------

namespace {

using Counts = std::unordered_map<std::string, int64_t>;

// helpers.extract_all_word_ngrams: n-grams of order 1..4, keyed by their tokens joined with a
// space (tokens hold no whitespace, so the key is unambiguous).
std::array<Counts, kMaxNgramOrder> word_ngrams(const std::vector<std::string>& toks) {
  std::array<Counts, kMaxNgramOrder> c;
  for (size_t i = 0; i < toks.size(); ++i) {
    std::string key;
    for (size_t n = 0; n < c.size() && i + n < toks.size(); ++n) {
      if (n) key += ' ';
      key += toks[i + n];
      ++c[n][key];
    }
  }
  return c;
}

// BLEU._preprocess_segment: rstrip, then 13a.
std::vector<std::string> preprocess(const std::string& line, const std::string& what, size_t i) {
  std::vector<std::string> out;
  for (auto& t : tokenize_13a_32(rstrip32(decode_line(line, "corpus_bleu", what, i)))) out.push_back(utf8_encode(t));
  return out;
}

std::string fixed(double v, int decimals) {  // Python's f"{v:.{decimals}f}"
  std::vector<char> buf(std::max(64, decimals + 400));
  std::snprintf(buf.data(), buf.size(), "%.*f", decimals, v);
  return buf.data();
}

}  // namespace

BleuScore compute_bleu(const std::array<int64_t, kMaxNgramOrder>& counts,
                       const std::array<int64_t, kMaxNgramOrder>& totals, int64_t sys_len, int64_t ref_len, int nrefs) {
  BleuScore s;
  s.name = "BLEU";
  s.counts = counts;
  s.totals = totals;
  s.sys_len = sys_len;
  s.ref_len = ref_len;
  s.bp = sys_len < ref_len ? (sys_len > 0 ? std::exp(1.0 - double(ref_len) / double(sys_len)) : 0.0) : 1.0;
  s.ratio = ref_len ? double(sys_len) / double(ref_len) : 0.0;

  // No match at all: 0 without smoothing (sacreBLEU #141), precisions left at 0.
  if (std::any_of(counts.begin(), counts.end(), [](int64_t c) { return c != 0; })) {
    double smooth_mteval = 1.0;
    for (int n = 0; n < kMaxNgramOrder; ++n) {
      if (totals[n] == 0) break;  // the higher orders keep precision 0, and so log 0 below
      if (counts[n] == 0) {
        smooth_mteval *= 2;  // exp smoothing (mteval-v13a): 1/2, 1/4, ... of a count over the total
        s.precisions[n] = 100.0 / (smooth_mteval * double(totals[n]));
      } else {
        s.precisions[n] = 100.0 * double(counts[n]) / double(totals[n]);
      }
    }
    double log_sum = 0.0;  // utils.my_log floors log(0) at -9999999999
    for (double p : s.precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
    s.score = s.bp * std::exp(log_sum / kMaxNgramOrder);
  }

  s.signature = "nrefs:" + std::to_string(nrefs) + "|case:mixed|eff:no|tok:13a|smooth:exp|version:" + kSacrebleuVersion;
  std::string prec;
  for (int n = 0; n < kMaxNgramOrder; ++n) prec += (n ? "/" : "") + fixed(s.precisions[n], 1);
  s.verbose_score = prec + " (BP = " + fixed(s.bp, 3) + " ratio = " + fixed(s.ratio, 3) +
                    " hyp_len = " + std::to_string(sys_len) + " ref_len = " + std::to_string(ref_len) + ")";
  return s;
}

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs) {
  check_streams("corpus_bleu", hyps, refs);
  std::array<int64_t, kMaxNgramOrder> correct{}, total{};
  int64_t sys_len = 0, ref_len = 0;
  for (size_t i = 0; i < hyps.size(); ++i) {
    // BLEU._extract_reference_info: per n-gram, its largest count over the references.
    std::array<Counts, kMaxNgramOrder> ref_max;
    std::vector<int64_t> ref_lens;
    for (size_t r = 0; r < refs.size(); ++r) {
      const auto toks = preprocess(refs[r][i], "reference stream " + std::to_string(r), i);
      ref_lens.push_back(int64_t(toks.size()));
      const auto c = word_ngrams(toks);
      for (int n = 0; n < kMaxNgramOrder; ++n)
        for (auto& [ng, k] : c[n]) ref_max[n][ng] = std::max(ref_max[n][ng], k);
    }
    // BLEU._compute_segment_statistics
    const auto toks = preprocess(hyps[i], "hypothesis", i);
    const int64_t hyp_len = int64_t(toks.size());
    int64_t closest_diff = -1, closest_len = -1;  // _get_closest_ref_len: ties go to the shorter
    for (int64_t len : ref_lens) {
      const int64_t diff = std::abs(hyp_len - len);
      if (closest_diff == -1 || diff < closest_diff)
        closest_diff = diff, closest_len = len;
      else if (diff == closest_diff && len < closest_len)
        closest_len = len;
    }
    sys_len += hyp_len;
    ref_len += closest_len;
    const auto c = word_ngrams(toks);
    for (int n = 0; n < kMaxNgramOrder; ++n) {
      for (auto& [ng, k] : c[n]) {
        total[n] += k;
        auto it = ref_max[n].find(ng);
        if (it != ref_max[n].end()) correct[n] += std::min(k, it->second);
      }
    }
  }
  return compute_bleu(correct, total, sys_len, ref_len, int(refs.size()));
}

// ---- chrF ---------------------------------------------------------------------------------------

namespace {

using CharCounts = std::unordered_map<std::u32string, int64_t>;

// helpers.extract_all_char_ngrams: orders 1..N of the line, whitespace removed unless kept.
std::vector<CharCounts> char_ngrams(const std::u32string& line, const ChrfOptions& o) {
  std::u32string s;
  if (o.whitespace) {
    s = line;
  } else {
    for (char32_t c : line)
      if (!is_space(c)) s += c;
  }
  std::vector<CharCounts> c(o.char_order);
  for (size_t i = 0; i < s.size(); ++i)
    for (size_t n = 0; n < c.size() && i + n < s.size(); ++n) ++c[n][s.substr(i, n + 1)];
  return c;
}

// CHRF._compute_f_score, in percent.
double chrf_f_score(const std::vector<int64_t>& st, const ChrfOptions& o) {
  const double eps = 1e-16;
  const int factor = o.beta * o.beta;
  double score = 0.0, avg_prec = 0.0, avg_rec = 0.0;
  int effective_order = 0;
  for (int i = 0; i < o.char_order; ++i) {
    const int64_t n_hyp = st[3 * i], n_ref = st[3 * i + 1], n_match = st[3 * i + 2];
    const double prec = n_hyp > 0 ? double(n_match) / double(n_hyp) : eps;
    const double rec = n_ref > 0 ? double(n_match) / double(n_ref) : eps;
    const double denom = factor * prec + rec;
    score += denom > 0 ? (1 + factor) * prec * rec / denom : eps;
    if (n_hyp > 0 && n_ref > 0) {  // sacreBLEU < 2.0's effective order: only orders both sides have
      avg_prec += prec;
      avg_rec += rec;
      ++effective_order;
    }
  }
  if (o.eps_smoothing) return 100 * score / o.char_order;
  if (effective_order == 0) {
    avg_prec = avg_rec = 0.0;
  } else {
    avg_prec /= effective_order;
    avg_rec /= effective_order;
  }
  if (avg_prec + avg_rec == 0.0) return 0.0;
  score = (1 + factor) * avg_prec * avg_rec;
  score /= (factor * avg_prec) + avg_rec;
  return 100 * score;
}

}  // namespace

ChrfScore corpus_chrf(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                      const ChrfOptions& o) {
  check_streams("corpus_chrf", hyps, refs);
  LINEA_CHECK(o.char_order >= 1 && o.beta >= 0, "corpus_chrf: char_order must be >= 1 and beta >= 0, got ",
              o.char_order, " and ", o.beta);
  ChrfScore out;
  out.stats.assign(3 * o.char_order, 0);
  for (size_t i = 0; i < hyps.size(); ++i) {
    const auto hyp = char_ngrams(decode_line(hyps[i], "corpus_chrf", "hypothesis", i), o);
    // CHRF._compute_segment_statistics: the reference with the best f-score (the first of equals).
    std::vector<int64_t> best;
    double best_f = -1.0;
    for (size_t r = 0; r < refs.size(); ++r) {
      const auto ref =
          char_ngrams(decode_line(refs[r][i], "corpus_chrf", "reference stream " + std::to_string(r), i), o);
      std::vector<int64_t> st;
      for (int n = 0; n < o.char_order; ++n) {  // CHRF._get_match_statistics
        int64_t hyp_count = 0, ref_count = 0, match = 0;
        for (auto& [ng, k] : hyp[n]) {
          hyp_count += k;
          auto it = ref[n].find(ng);
          if (it != ref[n].end()) match += std::min(k, it->second);
        }
        for (auto& [ng, k] : ref[n]) ref_count += k;
        st.insert(st.end(), {ref[n].empty() ? 0 : hyp_count, ref_count, match});  // no hyp count without ref n-grams
      }
      const double f = chrf_f_score(st, o);
      if (f > best_f) best_f = f, best = std::move(st);
    }
    for (size_t k = 0; k < best.size(); ++k) out.stats[k] += best[k];
  }
  out.name = "chrF" + std::to_string(o.beta);
  out.score = chrf_f_score(out.stats, o);
  out.signature = "nrefs:" + std::to_string(refs.size()) + "|case:mixed|eff:" + (o.eps_smoothing ? "no" : "yes") +
                  "|nc:" + std::to_string(o.char_order) + "|nw:0|space:" + (o.whitespace ? "yes" : "no") +
                  "|version:" + kSacrebleuVersion;
  return out;
}

// ---- output -------------------------------------------------------------------------------------

namespace {

// repr(float): the shortest digits that read back to x, in fixed notation unless the decimal
// exponent is below -4 or above 15 (then 1.5e-05 / 1e+16).
std::string python_float_repr(double x) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX
  const size_t e = sci.find('e');
  std::string sign, mant = sci.substr(0, e);
  if (mant[0] == '-') sign = "-", mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // x = 0.digits * 10^decpt
  const int nd = int(digits.size());
  if (decpt <= -4 || decpt > 16) {
    std::string m = digits.substr(0, 1) + (nd > 1 ? "." + digits.substr(1) : "");
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return sign + m + ex;
  }
  if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= nd) return sign + digits + std::string(decpt - nd, '0') + ".0";
  return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

// json.dumps(ensure_ascii=False) of a string.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04x", c);
          out += u;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string format_score(double score, int width) {
  // fixed() sizes its buffer as width + 400 (an int): a bound keeps that from overflowing.
  LINEA_CHECK(width >= 0 && width <= 1000, "format_score: width must be in [0, 1000], got ", width);
  return fixed(score, width);
}

std::string to_json(const Score& s, int width) {
  std::vector<std::pair<std::string, std::string>> items = {
      {"name", json_string(s.name)},
      {"score", python_float_repr(std::strtod(format_score(s.score, width).c_str(), nullptr))},
      {"signature", json_string(s.signature)}};
  if (!s.verbose_score.empty()) items.emplace_back("verbose_score", json_string(s.verbose_score));
  for (size_t b = 0; !s.signature.empty() && b <= s.signature.size();) {  // then each key:value of the signature
    size_t e = s.signature.find('|', b);
    if (e == std::string::npos) e = s.signature.size();
    const std::string field = s.signature.substr(b, e - b);
    const size_t colon = field.find(':');
    items.emplace_back(field.substr(0, colon), json_string(field.substr(colon + 1)));
    b = e + 1;
  }
  std::string out = "{";
  for (size_t k = 0; k < items.size(); ++k)
    out += (k ? ",\n " : "\n ") + json_string(items[k].first) + ": " + items[k].second;
  return out + "\n}";
}

std::string to_text(const Score& s, int width) {
  std::string line = (s.signature.empty() ? s.name : s.name + "|" + s.signature) + " = " + format_score(s.score, width);
  return s.verbose_score.empty() ? line : line + " " + s.verbose_score;
}

}  // namespace linea::apps::bleu
