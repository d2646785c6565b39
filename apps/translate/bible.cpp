#include "bible.h"

#include <markupfiltmgr.h>
#include <swlog.h>
#include <swmgr.h>
#include <swmodule.h>
#include <swversion.h>
#include <versekey.h>
#include <versificationmgr.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <unordered_map>

#include "core/error.h"

namespace translate {

// ---- UTF-8 --------------------------------------------------------------------------------

namespace {

// Decodes the code point at s[i] and advances i; returns -1 (and advances by one byte) on an
// invalid sequence (overlong forms, surrogates and values above U+10FFFF are invalid).
int32_t next_cp(const std::string& s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return -1;
  }
  int32_t cp = len == 1 ? c : c & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) {
      ++i;
      return -1;
    }
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static const int32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return -1;
  }
  i += len;
  return cp;
}

void put_cp(std::string& out, int32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_space_cp(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Letters of the scripts the two Bibles use (Latin with accents); enough for the re-casing and
// the spacing decisions below, which only ever look at Spanish and English words.
bool is_letter_cp(int32_t cp) {
  return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
         (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7);
}
bool is_upper_cp(int32_t cp) { return lower_cp(cp) != cp; }

// The first code point of s at or after byte i that is not inside a markup tag.
int32_t next_visible_cp(const std::string& s, size_t i) {
  while (i < s.size()) {
    if (s[i] == '<') {
      size_t close = s.find('>', i);
      if (close == std::string::npos) return -1;
      i = close + 1;
      continue;
    }
    return next_cp(s, i);
  }
  return -1;
}

}  // namespace

// Latin Extended-A (U+0100-017F) pairs each capital with the code point after it, the capital even, except in
// U+0139-0148 and U+0179-017E where it is odd; U+0130 (İ) lowers to i, U+0178 (Ÿ) to ÿ, and U+0138, 0149 and
// 017F have no capital.
int32_t lower_cp(int32_t cp) {
  if ((cp >= 'A' && cp <= 'Z') || (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 0x20;
  if (cp == 0x130) return 'i';
  if (cp == 0x178) return 0xFF;
  const bool odd_capitals = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
  const bool even_capitals = cp >= 0x100 && cp <= 0x177 && !odd_capitals && cp != 0x138;
  if ((odd_capitals && cp % 2 == 1) || (even_capitals && cp % 2 == 0)) return cp + 1;
  return cp;
}

int64_t invalid_utf8_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (next_cp(s, i) < 0) return static_cast<int64_t>(at);
  }
  return -1;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
  return n;
}

std::string normalize_space(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const int32_t cp = next_cp(s, i);
    if (cp >= 0 && is_space_cp(cp)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out.append(s, at, i - at);
  }
  return out;
}

// ---- references ----------------------------------------------------------------------------

std::string book_of(const std::string& ref) { return ref.substr(0, ref.find('.')); }

namespace {

const sword::VersificationMgr::System* versification(const std::string& name) {
  const auto* sys = sword::VersificationMgr::getSystemVersificationMgr()->getVersificationSystem(name.c_str());
  LINEA_CHECK(sys != nullptr, "translate: SWORD has no versification system '", name, "'");
  return sys;
}

bool has_book(const sword::VersificationMgr::System* sys, const char* osis_book) {
  return sys->getBookNumberByOSISName(osis_book) >= 0;
}

// The position of `from` in the versification `to`. A fresh key each time: positionFrom leaves
// bounds on the key when a verse maps to a range (NRSVA 3John.1.15), which would clamp every
// later position set on it.
std::string map_key(const sword::VerseKey& from, const std::string& to) {
  sword::VerseKey key;
  key.setVersificationSystem(to.c_str());
  key.setIntros(false);
  key.positionFrom(from);
  return key.getOSISRef();
}

}  // namespace

std::string map_reference(const std::string& ref, const std::string& from, const std::string& to) {
  sword::VerseKey key;
  key.setVersificationSystem(from.c_str());
  key.setIntros(false);
  key.setText(ref.c_str());
  LINEA_CHECK(!key.popError() && key.getOSISRef() == ref, "translate: '", ref, "' is not a verse of versification ",
              from);
  if (!has_book(versification(to), key.getOSISBookName())) return "";
  return map_key(key, to);
}

// ---- reading a module ------------------------------------------------------------------------

namespace {

struct ModuleInfo {
  const char* description;
  const char* package;
};
ModuleInfo module_info(const std::string& name) {
  if (name == "engWEB2015eb") return {"World English Bible", "sword-text-web"};
  if (name == "spaRV1909eb") return {"Reina-Valera 1909", "sword-text-sparv"};
  return {"SWORD module", "the package that provides it"};
}

sword::SWModule* open_module(sword::SWMgr& mgr, const std::string& name, const std::string& path) {
  sword::SWModule* m = mgr.getModule(name.c_str());
  if (m) return m;
  std::vector<std::string> found;
  for (const auto& kv : mgr.getModules()) found.push_back(kv.first.c_str());
  const char* env = std::getenv("SWORD_PATH");
  const ModuleInfo info = module_info(name);
  const std::string where = !path.empty() ? "'" + path + "'"
                            : std::string("$SWORD_PATH, ~/.sword or /usr/share/sword; SWORD_PATH is ") +
                                  (env ? std::string("'") + env + "'" : std::string("unset"));
  LINEA_FAIL("translate: the SWORD module '", name, "' (", info.description, ") is not installed; install it with "
             "`apt-get install ", info.package, "` (modules read from ", where, "; modules found: ",
             found.empty() ? std::string("none") : linea::join(found), ")");
}

bool is_enclitic(std::string w) {
  static const std::set<std::string> enclitics = {"lo", "la", "los", "las", "le", "les", "me", "te", "se", "nos", "os"};
  for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return enclitics.count(w) > 0;
}

std::string tag_name(const std::string& tag) {  // "<w lemma=..>" -> "w", "</note>" -> "/note"
  size_t b = 1, e = 1;
  while (e < tag.size() && tag[e] != ' ' && tag[e] != '>' && !(tag[e] == '/' && e > 1)) ++e;
  return tag.substr(b, e - b);
}

struct RawCounts {
  int64_t notes = 0, titles = 0;
};

// The fixes to a raw OSIS entry described in bible.h, before SWORD's plain filter sees it.
// A canonical title is taken out into *title.
std::string fix_raw(const std::string& raw, std::string* title, RawCounts& counts) {
  std::string out;
  out.reserve(raw.size());
  int32_t last_cp = ' ';  // the last text code point emitted (markup skipped)
  size_t i = 0;
  while (i < raw.size()) {
    if (raw[i] != '<') {
      const size_t at = i;
      const int32_t cp = next_cp(raw, i);
      out.append(raw, at, i - at);
      last_cp = cp;
      continue;
    }
    const size_t close = raw.find('>', i);
    if (close == std::string::npos) break;
    const std::string tag = raw.substr(i, close + 1 - i);
    const std::string name = tag_name(tag);
    i = close + 1;
    if (name == "div" && tag.find("type=\"book\"") != std::string::npos && tag.find("eID=") != std::string::npos)
      break;  // the book ends here; what follows is not verse text
    if (name == "note" && tag[tag.size() - 2] != '/') {
      size_t end = raw.find("</note>", i);
      i = end == std::string::npos ? raw.size() : end + 7;
      ++counts.notes;
      const int32_t next = next_visible_cp(raw, i);
      const bool opens = next >= 0 && (is_letter_cp(next) || (next >= '0' && next <= '9') || next == 0x201C ||
                                      next == 0x2018 || next == 0xBF || next == 0xA1);
      if (!is_space_cp(last_cp) && opens) {
        out += ' ';
        last_cp = ' ';
      }
      continue;
    }
    if (name == "title" && tag.find("canonical=\"true\"") != std::string::npos && tag[tag.size() - 2] != '/') {
      size_t end = raw.find("</title>", i);
      if (end == std::string::npos) end = raw.size();
      *title += raw.substr(i, end - i);
      i = std::min(raw.size(), end + 8);
      ++counts.titles;
      continue;
    }
    if (name == "w" || name == "/w") continue;
    if (name == "transChange" && is_letter_cp(last_cp)) {
      const size_t end = raw.find("</transChange>", i);
      const std::string added = raw.substr(i, end == std::string::npos ? std::string::npos : end - i);
      if (is_letter_cp(next_visible_cp(added, 0)) && !is_enclitic(added)) out += ' ';
    }
    out += tag;
    if (name == "/transChange" && is_letter_cp(last_cp) && is_letter_cp(next_visible_cp(raw, i))) {
      out += ' ';
      last_cp = ' ';
    }
  }
  return out;
}

struct Verse {
  std::string ref, book;
  int chapter = 0, verse = 0;
  std::string text;
};

// Every verse of `m` in its versification's order (intros off), cleaned.
std::vector<Verse> read_module(sword::SWModule* m, RawCounts& counts) {
  std::unique_ptr<sword::SWKey> owned(m->createKey());
  auto* key = dynamic_cast<sword::VerseKey*>(owned.get());
  LINEA_CHECK(key != nullptr, "translate: SWORD module '", m->getName(), "' is not a Bible (no verse key)");
  key->setIntros(false);
  m->setKey(key);
  std::vector<Verse> verses;
  for ((*m) = sword::TOP; !m->popError(); (*m)++) {
    const auto* k = dynamic_cast<const sword::VerseKey*>(m->getKey());
    Verse v;
    v.ref = k->getOSISRef();
    v.book = k->getOSISBookName();
    v.chapter = k->getChapter();
    v.verse = k->getVerse();
    std::string title;
    const std::string fixed = fix_raw(m->getRawEntry(), &title, counts);
    std::string text = m->stripText(fixed.c_str(), static_cast<int>(fixed.size()));
    if (!title.empty()) {
      std::string none;
      const std::string fixed_title = fix_raw(title, &none, counts);
      text = std::string(m->stripText(fixed_title.c_str(), static_cast<int>(fixed_title.size()))) + " " + text;
    }
    v.text = normalize_space(text);
    verses.push_back(std::move(v));
  }
  return verses;
}

// ---- RV chapter openings ----------------------------------------------------------------------

struct Word {
  size_t begin, end;  // bytes of s
  std::vector<int32_t> cps;
};

std::vector<Word> words_of(const std::string& s) {
  std::vector<Word> words;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const int32_t cp = next_cp(s, i);
    if (!is_letter_cp(cp)) continue;
    if (words.empty() || words.back().end != at) words.push_back({at, at, {}});
    words.back().end = i;
    words.back().cps.push_back(cp);
  }
  return words;
}

std::string lower_word(const std::vector<int32_t>& cps) {
  std::string s;
  for (int32_t cp : cps) put_cp(s, lower_cp(cp));
  return s;
}

bool all_caps(const std::vector<int32_t>& cps) {
  return cps.size() >= 2 && std::all_of(cps.begin(), cps.end(), is_upper_cp);
}

// True when the word at byte `begin` starts a sentence: only spaces and opening punctuation
// (¿ ¡ “ ‘ « ( ") before it, back to the start or to a sentence end (. ! ? :).
bool sentence_initial(const std::string& s, size_t begin) {
  for (size_t i = begin; i > 0;) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;  // the previous code point
    size_t k = j;
    const int32_t cp = next_cp(s, k);
    const bool opening = is_space_cp(cp) || cp == '(' || cp == '"' || cp == 0xBF || cp == 0xA1 || cp == 0x201C ||
                         cp == 0x2018 || cp == 0xAB;
    if (!opening) return cp == '.' || cp == '!' || cp == '?' || cp == ':';
    i = j;
  }
  return true;
}

// How RV writes each word outside chapter openings: lowercase form -> (count lowercase,
// count capitalized), sentence-initial occurrences not counted.
using CaseCounts = std::unordered_map<std::string, std::pair<int64_t, int64_t>>;

CaseCounts case_counts(const std::vector<Verse>& verses) {
  CaseCounts counts;
  for (const Verse& v : verses) {
    if (v.verse == 1) continue;
    for (const Word& w : words_of(v.text)) {
      if (all_caps(w.cps) || sentence_initial(v.text, w.begin)) continue;
      const bool lower = std::none_of(w.cps.begin(), w.cps.end(), is_upper_cp);
      const bool capitalized = is_upper_cp(w.cps[0]) && std::none_of(w.cps.begin() + 1, w.cps.end(), is_upper_cp);
      if (lower) ++counts[lower_word(w.cps)].first;
      if (capitalized) ++counts[lower_word(w.cps)].second;
    }
  }
  return counts;
}

// Re-cases the first run of all-capital words of a chapter's first verse; true if it did.
bool recase_opening(std::string& text, const CaseCounts& counts) {
  const std::vector<Word> words = words_of(text);
  size_t first = 0;
  while (first < words.size() && !all_caps(words[first].cps)) ++first;
  if (first == words.size()) return false;
  std::string out = text.substr(0, words[first].begin);
  for (size_t k = first; k < words.size() && all_caps(words[k].cps); ++k) {
    if (k > first) out.append(text, words[k - 1].end, words[k].begin - words[k - 1].end);
    const std::string lower = lower_word(words[k].cps);
    auto it = counts.find(lower);
    const bool capitalize = sentence_initial(text, words[k].begin) ||
                            (it != counts.end() && it->second.second > it->second.first);
    for (size_t c = 0; c < words[k].cps.size(); ++c)  // all capitals: the first stays one if capitalized
      put_cp(out, c == 0 && capitalize ? words[k].cps[c] : lower_cp(words[k].cps[c]));
    if (k + 1 == words.size() || !all_caps(words[k + 1].cps)) {
      out.append(text, words[k].end, std::string::npos);
      break;
    }
  }
  text = out;
  return true;
}

// ---- alignment --------------------------------------------------------------------------------

// Length model of a true pair (Gale & Church 1993): target chars ~ ratio * source chars, with a
// spread that grows with sqrt(source chars), so short verses ("You shall not murder." / "No
// matarás.") may differ more in ratio than long ones. Fitted robustly (median, MAD).
struct LengthModel {
  double ratio = 1, spread = 1;
  double z(const std::string& src, const std::string& tgt) const {
    const double ls = static_cast<double>(utf8_length(src)), lt = static_cast<double>(utf8_length(tgt));
    return std::fabs(lt - ratio * ls) / (spread * std::sqrt(ls));
  }
};

LengthModel fit_length_model(const std::vector<Verse>& src, const std::vector<Verse>& tgt,
                             const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  LINEA_CHECK(pairs.size() >= 100, "translate: only ", pairs.size(), " verses have text in both modules");
  const auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  std::vector<double> ls, lt, r;
  for (const auto& [s, t] : pairs) {
    ls.push_back(static_cast<double>(utf8_length(src[s].text)));
    lt.push_back(static_cast<double>(utf8_length(tgt[t].text)));
    r.push_back(lt.back() / ls.back());
  }
  LengthModel lm;
  lm.ratio = median(r);
  for (size_t k = 0; k < ls.size(); ++k) r[k] = std::fabs(lt[k] - lm.ratio * ls[k]) / std::sqrt(ls[k]);
  lm.spread = std::max(1.4826 * median(r), 1e-3);  // the MAD as a standard deviation
  return lm;
}

// Word-translation evidence learned from the corpus itself: the kLexWords most frequent words of
// each language, and for each source word the (up to) three target words that co-occur with it
// most (Dice coefficient > 0.2) in verses paired at their mapped slots, almost all of which are
// right. A pair's overlap is the fraction of its source words (those with translations) whose
// translation occurs in the target verse: median 0.80 for the pairs at their mapped slots, 0.45
// for a verse and its neighbour's translation, measured on these modules.
constexpr size_t kLexWords = 2000;

std::vector<std::string> lower_words(const std::string& s) {
  std::vector<std::string> out;
  for (const Word& w : words_of(s)) out.push_back(lower_word(w.cps));
  return out;
}

struct Lexicon {
  std::vector<std::vector<int32_t>> src_words, tgt_words;  // per verse: sorted ids of frequent words
  std::vector<std::vector<int32_t>> translations;           // per source word id

  // -1 when no source word has a translation.
  double overlap(int64_t s, int64_t t) const {
    int hits = 0, known = 0;
    const std::vector<int32_t>& tw = tgt_words[t];
    for (int32_t w : src_words[s]) {
      if (translations[w].empty()) continue;
      ++known;
      hits += std::any_of(translations[w].begin(), translations[w].end(),
                          [&](int32_t x) { return std::binary_search(tw.begin(), tw.end(), x); });
    }
    return known ? double(hits) / known : -1.0;
  }
};

// Ids of each verse's frequent words (the kLexWords most frequent over `verses`, ties by spelling).
std::vector<std::vector<int32_t>> word_ids(const std::vector<Verse>& verses) {
  std::vector<std::vector<std::string>> words;
  std::unordered_map<std::string, int64_t> freq;
  for (const Verse& v : verses) {
    words.push_back(lower_words(v.text));
    for (const std::string& w : words.back()) ++freq[w];
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (const auto& kv : freq) ranked.push_back({-kv.second, kv.first});
  std::sort(ranked.begin(), ranked.end());
  std::unordered_map<std::string, int32_t> id;
  for (size_t k = 0; k < std::min(ranked.size(), kLexWords); ++k) id[ranked[k].second] = static_cast<int32_t>(k);
  std::vector<std::vector<int32_t>> ids(verses.size());
  for (size_t v = 0; v < verses.size(); ++v) {
    for (const std::string& w : words[v]) {
      auto it = id.find(w);
      if (it != id.end()) ids[v].push_back(it->second);
    }
    std::sort(ids[v].begin(), ids[v].end());
    ids[v].erase(std::unique(ids[v].begin(), ids[v].end()), ids[v].end());
  }
  return ids;
}

Lexicon learn_lexicon(const std::vector<Verse>& src, const std::vector<Verse>& tgt,
                      const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  Lexicon lex;
  lex.src_words = word_ids(src);
  lex.tgt_words = word_ids(tgt);
  const size_t N = kLexWords;
  std::vector<int32_t> co(N * N, 0), df_src(N, 0), df_tgt(N, 0);
  for (const auto& [s, t] : pairs) {
    for (int32_t a : lex.src_words[s]) ++df_src[a];
    for (int32_t b : lex.tgt_words[t]) ++df_tgt[b];
    for (int32_t a : lex.src_words[s])
      for (int32_t b : lex.tgt_words[t]) ++co[a * N + b];
  }
  lex.translations.resize(N);
  for (size_t a = 0; a < N; ++a) {
    std::vector<std::pair<double, int32_t>> best;
    for (size_t b = 0; b < N; ++b) {
      const double dice = co[a * N + b] ? 2.0 * co[a * N + b] / (df_src[a] + df_tgt[b]) : 0.0;
      if (dice > 0.2) best.push_back({-dice, static_cast<int32_t>(b)});
    }
    std::sort(best.begin(), best.end());
    for (size_t k = 0; k < std::min<size_t>(best.size(), 3); ++k) lex.translations[a].push_back(best[k].second);
  }
  return lex;
}

constexpr int64_t kBand = 8;         // RV's numbering drifts at most 5 verses from KJV's (Job 40)
constexpr double kSkipCost = 5.0;    // leaving a verse with text unpaired; a shift by one costs two
constexpr double kOffCost = 0.5;     // pairing off the mapped slot: a shift must fit better all along
constexpr double kMaxZ = 8.0;        // cap on the length term, so one odd verse cannot force a shift
constexpr double kLexWeight = 5.0;   // cost per unit of missing overlap
constexpr double kNoLexOverlap = 0.75;  // assumed overlap of a pair without evidence
constexpr double kDropZ = 5.0;       // kept pairs further off in length than this are misaligned

// Monotone alignment of one book (dynamic programming, as for sentence alignment): source
// verses i, mapped to target slots slot[i], against the target slots [slot[0], slot[n-1]] in
// order. Each step pairs the next source and target verse (cost(i, t), plus kOffCost off the
// mapped slot), or leaves one of them unpaired (kSkipCost; nothing for an empty verse, which
// may also pair for nothing at its mapped slot), staying within kBand slots of the mapped slot.
// Returns each source verse's target slot, or -1.
template <typename Cost>
std::vector<int64_t> align_book(const std::vector<int64_t>& slot, const std::vector<bool>& src_text,
                                const std::vector<bool>& tgt_text, const Cost& cost_of) {
  const int64_t n = static_cast<int64_t>(slot.size()), W = 2 * kBand + 1;
  const int64_t lo = slot.front(), hi = slot.back() + 1;
  const auto center = [&](int64_t i) { return i < n ? slot[i] : hi; };
  const auto cell = [&](int64_t i, int64_t t) -> int64_t {
    const int64_t o = t - center(i) + kBand;
    return o < 0 || o >= W ? -1 : i * W + o;
  };
  enum : uint8_t { kNone, kPair, kSkipSrc, kSkipTgt };
  std::vector<double> cost((n + 1) * W, std::numeric_limits<double>::infinity());
  std::vector<uint8_t> move((n + 1) * W, kNone);
  const auto relax = [&](int64_t i, int64_t t, double c, uint8_t m) {
    const int64_t k = cell(i, t);
    if (k >= 0 && c < cost[k]) cost[k] = c, move[k] = m;
  };
  cost[cell(0, lo)] = 0;
  for (int64_t i = 0; i <= n; ++i)
    for (int64_t t = center(i) - kBand; t <= center(i) + kBand; ++t) {
      const int64_t k = cell(i, t);
      if (t < lo || t > hi || !std::isfinite(cost[k])) continue;
      const bool s_text = i < n && src_text[i], t_text = t < hi && tgt_text[t];
      if (t < hi) relax(i, t + 1, cost[k] + (t_text ? kSkipCost : 0.0), kSkipTgt);
      if (i == n) continue;
      relax(i + 1, t, cost[k] + (s_text ? kSkipCost : 0.0), kSkipSrc);
      if (t < hi && s_text && t_text)
        relax(i + 1, t + 1, cost[k] + cost_of(i, t) + (t != slot[i] ? kOffCost : 0.0), kPair);
      else if (t == slot[i])
        relax(i + 1, t + 1, cost[k], kPair);
    }
  LINEA_CHECK(cell(n, hi) >= 0 && std::isfinite(cost[cell(n, hi)]), "translate: cannot align verses ", lo, "..", hi,
              " within ", kBand, " verses of their mapped slots");
  std::vector<int64_t> match(n, -1);
  for (int64_t i = n, t = hi; i > 0 || t > lo;) {
    const uint8_t m = move[cell(i, t)];
    if (m == kPair) match[i - 1] = t - 1;
    i -= m != kSkipTgt;
    t -= m != kSkipSrc;
  }
  return match;
}

}  // namespace

// ---- the corpus ---------------------------------------------------------------------------------

BibleCorpus read_bible(const BibleOptions& options) {
  sword::SWLog::getSystemLog()->setLogLevel(sword::SWLog::LOG_ERROR);
  auto* filters = new sword::MarkupFilterMgr(sword::FMT_PLAIN);  // owned by the manager
  std::unique_ptr<sword::SWMgr> mgr =
      options.sword_path.empty() ? std::make_unique<sword::SWMgr>(filters)
                                 : std::make_unique<sword::SWMgr>(options.sword_path.c_str(), true, filters, false, false);
  sword::SWModule* src_mod = open_module(*mgr, options.src_module, options.sword_path);
  sword::SWModule* tgt_mod = open_module(*mgr, options.tgt_module, options.sword_path);

  BibleCorpus corpus;
  BibleStats& st = corpus.stats;
  st.sword_version = sword::SWVersion::currentVersion.getText();
  st.src_module = options.src_module;
  st.tgt_module = options.tgt_module;
  RawCounts raw_counts;
  std::vector<Verse> src = read_module(src_mod, raw_counts);
  std::vector<Verse> tgt = read_module(tgt_mod, raw_counts);
  st.notes_removed = raw_counts.notes;
  st.titles_restored = raw_counts.titles;
  {
    std::unique_ptr<sword::SWKey> k(src_mod->createKey());
    st.src_versification = dynamic_cast<sword::VerseKey&>(*k).getVersificationSystem();
    std::unique_ptr<sword::SWKey> t(tgt_mod->createKey());
    st.tgt_versification = dynamic_cast<sword::VerseKey&>(*t).getVersificationSystem();
  }
  st.src_verses = static_cast<int64_t>(src.size());
  st.tgt_verses = static_cast<int64_t>(tgt.size());

  const CaseCounts cases = case_counts(tgt);
  for (Verse& v : tgt)
    if (v.verse == 1 && recase_opening(v.text, cases)) ++st.recased;

  // Map every source verse to a target slot; the target's verses are its slots, book by book.
  std::unordered_map<std::string, int64_t> slot_of;
  for (int64_t t = 0; t < static_cast<int64_t>(tgt.size()); ++t) slot_of[tgt[t].ref] = t;
  const auto* tgt_sys = versification(st.tgt_versification);
  sword::VerseKey key;
  key.setVersificationSystem(st.src_versification.c_str());
  key.setIntros(false);
  struct Mapped {
    int64_t src, slot;
  };
  std::vector<Mapped> mapped;
  std::vector<bool> slot_taken(tgt.size(), false);
  for (int64_t s = 0; s < static_cast<int64_t>(src.size()); ++s) {
    if (!has_book(tgt_sys, src[s].book.c_str())) {
      ++st.dropped["book_missing_in_tgt"];
      ++st.missing_books[src[s].book];
      continue;
    }
    key.setText(src[s].ref.c_str());
    auto it = slot_of.find(map_key(key, st.tgt_versification));
    if (it == slot_of.end()) {
      ++st.dropped["unmappable"];
      continue;
    }
    if (slot_taken[it->second]) {  // NRSVA splits a KJV verse in two (3John.1.14-15)
      ++st.dropped["duplicate_mapping"];
      continue;
    }
    slot_taken[it->second] = true;
    mapped.push_back({s, it->second});
  }

  // The length model and the lexicon from the verses with text at their mapped slots.
  std::vector<std::pair<int64_t, int64_t>> identity;
  for (const Mapped& m : mapped)
    if (!src[m.src].text.empty() && !tgt[m.slot].text.empty()) identity.push_back({m.src, m.slot});
  const LengthModel lm = fit_length_model(src, tgt, identity);
  const Lexicon lex = learn_lexicon(src, tgt, identity);
  std::vector<bool> tgt_text(tgt.size());
  for (size_t t = 0; t < tgt.size(); ++t) tgt_text[t] = !tgt[t].text.empty();

  // Book by book (mapped verses are in canonical order, so each book is one run).
  std::vector<bool> tgt_used(tgt.size(), false);
  for (size_t b = 0; b < mapped.size();) {
    size_t e = b;
    std::vector<int64_t> slots;
    std::vector<bool> src_text;
    for (; e < mapped.size() && tgt[mapped[e].slot].book == tgt[mapped[b].slot].book; ++e) {
      slots.push_back(mapped[e].slot);
      src_text.push_back(!src[mapped[e].src].text.empty());
    }
    const auto pair_cost = [&](int64_t i, int64_t t) {
      const int64_t s = mapped[b + i].src;
      const double overlap = lex.overlap(s, t);
      return std::min(lm.z(src[s].text, tgt[t].text), kMaxZ) +
             kLexWeight * (1.0 - (overlap < 0 ? kNoLexOverlap : overlap));
    };
    const std::vector<int64_t> match = align_book(slots, src_text, tgt_text, pair_cost);
    for (size_t k = 0; k < slots.size(); ++k) {
      const int64_t si = mapped[b + k].src, t = match[k];
      const Verse& s = src[si];
      const char* reason = nullptr;
      if (s.text.empty())
        reason = "src_empty";
      else if (t < 0 || tgt[t].text.empty())
        reason = t < 0 && tgt_text[slots[k]] ? "unaligned" : "tgt_empty";
      else if (lm.z(s.text, tgt[t].text) > kDropZ)
        reason = "length_mismatch";
      if (reason) {
        ++st.dropped[reason];
        continue;
      }
      tgt_used[t] = true;
      st.mapped += tgt[slots[k]].ref != s.ref;
      st.realigned += t != slots[k];
      corpus.pairs.push_back({s.ref, s.text, tgt[t].text});
    }
    b = e;
  }
  for (size_t t = 0; t < tgt.size(); ++t) st.tgt_unused += !tgt_used[t] && !tgt[t].text.empty();
  st.pairs = static_cast<int64_t>(corpus.pairs.size());
  return corpus;
}

}  // namespace translate
