// Tests of the BLEU / chrF library (bleu.h) and of the linea-bleu executable, against sacreBLEU:
// - figures of sacreBLEU's own test suite (mjpost/sacrebleu test/test_bleu.py,
//   test/test_sentence_bleu.py, test/test_chrf.py, test.sh), to the tolerance each file uses;
// - the 13a tokenizer on cases whose expected tokens follow from tokenizer_13a.py /
//   tokenizer_re.py (and were checked against Python's re running those rules);
// - the details that change scores: maximum counts over references, closest reference length
//   with ties to the shorter, exp smoothing, the no-match rule, empty hypotheses, Unicode
//   whitespace, code points rather than bytes, chrF's best reference;
// - the executable end to end: JSON / text output, -b, -w, -m, stdin, errors.
// The executable's path comes from CMake (LINEA_BLEU_TOOL).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "apps/tools/bleu.h"
#include "core/error.h"

namespace linea::apps::bleu {
namespace {

using Lines = std::vector<std::string>;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + v[i];
  return s;
}

// The example of sacreBLEU's README, also in test/test_bleu.py (_hyps, _refs): two references.
const Lines kHyps = {"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."};
const std::vector<Lines> kRefs = {{"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
                                  {"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."}};

// ---- figures of sacreBLEU's test suite ----------------------------------------------------------

// test/test_bleu.py, test_corpus_bleu_cases (EPSILON = 1e-8): default settings, and empty
// hypotheses that must not be dropped.
TEST(BleuSacrebleuSuite, CorpusBleuReadmeExample) {
  EXPECT_NEAR(corpus_bleu(kHyps, kRefs).score, 48.530827, 1e-8);
  EXPECT_EQ(corpus_bleu({"", "", ""}, kRefs).score, 0.0);
}

// test/test_bleu.py, test_raw_bleu_cases: no n-gram matches at all is 0 (#141), even though exp
// smoothing alone would give a positive score; identical text is 100.
TEST(BleuSacrebleuSuite, RawBleuCases) {
  EXPECT_EQ(corpus_bleu({"this is a test", "another test"}, {{"ref1", "ref2"}}).score, 0.0);
  EXPECT_NEAR(corpus_bleu({"this is a test"}, {{"this is a test"}}).score, 100.0, 1e-8);
}

// test/test_bleu.py, test_case_statistics (with tokenize none there; 13a splits these words the same).
TEST(BleuSacrebleuSuite, Statistics) {
  const BleuScore s = corpus_bleu({"am I am a character sequence"}, {{"I am a symbol string sequence a a"}});
  EXPECT_EQ(s.counts, (std::array<int64_t, 4>{4, 2, 1, 0}));
  EXPECT_EQ(s.totals, (std::array<int64_t, 4>{6, 5, 4, 3}));
}

// test/test_bleu.py, test_case_scoring: compute_bleu(common, total, 11, 11) = 0.8375922397 (in
// [0, 1] there, EPSILON 1e-8; all counts are non-zero, so exp smoothing changes nothing).
TEST(BleuSacrebleuSuite, Scoring) {
  EXPECT_NEAR(compute_bleu({9, 7, 5, 3}, {10, 8, 6, 4}, 11, 11).score, 83.75922397, 1e-6);
}

// test/test_sentence_bleu.py (EPSILON 1e-3), smooth exp, tok 13a: 8.493 (computed with effective
// order there, which is the same here because every order has n-grams), and #141's 0.0.
TEST(BleuSacrebleuSuite, SentenceBleu) {
  EXPECT_NEAR(corpus_bleu({"Producția de zahăr primă va fi exprimată în ceea ce privește zahărul alb;"},
                          {{"producţia de zahăr brut se exprimă în zahăr alb;"}})
                  .score,
              8.493, 1e-3);
  EXPECT_EQ(corpus_bleu({"this is a cat"}, {{"okay thanks"}}).score, 0.0);
}

// test/test_chrf.py (EPSILON 1e-4). test_cases: beta 3 with epsilon smoothing.
TEST(ChrfSacrebleuSuite, EpsilonSmoothingBeta3) {
  const ChrfOptions o{6, 3, false, true};
  const std::vector<std::tuple<std::string, std::string, double>> cases = {
      {"abcdefg", "hijklmnop", 0.0},
      {"a", "b", 0.0},
      {"", "b", 0.0},
      {"", "ref", 0.0},
      {"", "reference", 0.0},
      {"aa", "ab", 8.3333},
      {"a", "a", 16.6667},
      {"a b c", "a b c", 50.0},
      {"a b c", "abc", 50.0},
      {" risk assessment must be made of those who are qualified and expertise in the sector - these are the "
       "scientists .",
       "risk assessment has to be undertaken by those who are qualified and expert in that area - that is the "
       "scientists .",
       63.361730},
      {" Die    Beziehung zwischen  Obama und Netanjahu ist nicht gerade  freundlich. ",
       "Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich.", 64.1302698},
      {"Niemand hat die Absicht, eine Mauer zu errichten", "Niemand hat die Absicht, eine Mauer zu errichten", 100.0},
  };
  for (auto& [h, r, expected] : cases) EXPECT_NEAR(corpus_chrf({h}, {{r}}, o).score, expected, 1e-4) << h;
  EXPECT_NEAR(corpus_chrf({"a", "b"}, {{"a", "c"}}, o).score, 8.3333, 1e-4);
  // "0.0" above is eps-level, not 0: an order with neither precision nor recall adds eps (1e-16),
  // as do the five orders neither side reaches (precision and recall eps): 100 * 6 eps / 6.
  EXPECT_NEAR(corpus_chrf({"a"}, {{"b"}}, o).score, 1e-14, 1e-17);
}

// test/test_chrf.py, test_cases_effective_order: beta 3, sacreBLEU's default averaging.
TEST(ChrfSacrebleuSuite, EffectiveOrderBeta3) {
  const ChrfOptions o{6, 3, false, false};
  EXPECT_NEAR(corpus_chrf({"a"}, {{"a"}}, o).score, 100.0, 1e-4);
  EXPECT_NEAR(corpus_chrf({""}, {{"reference"}}, o).score, 0.0, 1e-4);
  EXPECT_NEAR(corpus_chrf({"a b c"}, {{"a b c"}}, o).score, 100.0, 1e-4);
  EXPECT_NEAR(corpus_chrf({"a b c"}, {{"abc"}}, o).score, 100.0, 1e-4);
  EXPECT_NEAR(corpus_chrf({""}, {{"c"}}, o).score, 0.0, 1e-4);
  EXPECT_NEAR(corpus_chrf({"a", "b"}, {{"a", "c"}}, o).score, 50.0, 1e-4);
  EXPECT_NEAR(corpus_chrf({"aa"}, {{"ab"}}, o).score, 25.0, 1e-4);
}

// test/test_chrf.py, test_cases_keep_whitespace: beta 3, whitespace kept in the n-grams.
TEST(ChrfSacrebleuSuite, KeepWhitespaceBeta3) {
  const ChrfOptions o{6, 3, true, false};
  EXPECT_NEAR(corpus_chrf({"Die Beziehung zwischen Obama und Netanjahu ist nicht gerade freundlich."},
                          {{"Das Verhältnis zwischen Obama und Netanyahu ist nicht gerade freundschaftlich."}}, o)
                  .score,
              67.3481606, 1e-4);
  EXPECT_NEAR(corpus_chrf({"risk assessment must be made of those who are qualified and expertise in the sector - "
                           "these are the scientists ."},
                          {{"risk assessment has to be undertaken by those who are qualified and expert in that "
                            "area - that is the scientists ."}},
                          o)
                  .score,
              65.2414427, 1e-4);
}

// test/test_chrf.py, test_sentence_level_chrf: chrF2 (the defaults) with epsilon smoothing, Czech.
TEST(ChrfSacrebleuSuite, SentenceLevelCzech) {
  const ChrfOptions o{6, 2, false, true};
  EXPECT_NEAR(corpus_chrf({"Co nás nejvíc trápí, protože lékaři si vybírají, kdo bude žít a kdo zemře."},
                          {{"Nejvíce smutní jsme z toho, že musíme rozhodovat o tom, kdo bude žít a kdo zemře."}}, o)
                  .score,
              39.14078509, 1e-4);
  EXPECT_NEAR(corpus_chrf({"Nebo prostě nemají vybavení, které by jim pomohlo, uvedli lékaři."},
                          {{"A někdy nemáme ani potřebný materiál, abychom jim pomohli, popsali lékaři."}}, o)
                  .score,
              31.22557079, 1e-4);
  EXPECT_NEAR(
      corpus_chrf({"Lapali po dechu, jejich životy skončily dřív, než skutečně začaly."},
                  {{"Lapali po dechu a pak jejich život skončil - dřív, než skutečně mohl začít, připomněli."}}, o)
          .score,
      57.15704367, 1e-4);
}

// ---- 13a tokenizer ------------------------------------------------------------------------------

TEST(BleuTokenizer13a, Rules) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Hello, world!", "Hello , world !"},
      // $ split off; period/comma kept between digits, split otherwise; dash split after a digit
      {"It costs $3.50, or 3,000-4,000 in 2019-2020.", "It costs $ 3.50 , or 3,000 - 4,000 in 2019 - 2020 ."},
      {"U.S. e.g. 3.14 .5 5. a.b 1,5 a,b ,5 5,", "U . S . e . g . 3.14 . 5 5 . a . b 1,5 a , b , 5 5 ,"},
      {".5 x", ". 5 x"},  // the line is padded with spaces first: a period at its start is split too
      {"x--y 5-6 a-5 (1-2) x-", "x--y 5 - 6 a-5 ( 1 - 2 ) x-"},
      // HTML entities unescaped in order (&amp;lt; becomes &lt;, then <); <skipped> dropped;
      // "-\n" joins, "\n" is a space
      {"&quot;Hi&quot; &amp; &lt;b&gt; &amp;lt;", "\" Hi \" & < b > <"},
      {"a <skipped> b co-\noperate x\ny", "a b cooperate x y"},
      // apostrophes stay; every other ASCII punctuation character is split off
      {"don't 'q' {a}[b]<c>|d~e^f_g`h@i#j%k*l+m=n;o:p?q/r\\s",
       "don't 'q' { a } [ b ] < c > | d ~ e ^ f _ g ` h @ i # j % k * l + m = n ; o : p ? q / r \\ s"},
      // only ASCII punctuation is split: Spanish ¿ ¡ stay on their words
      {"¿Quién es? ¡Oh, no!", "¿Quién es ? ¡Oh , no !"},
      {"«Hola»… ‘x’ 中文。", "«Hola»… ‘x’ 中文。"},
  };
  for (auto& [in, out] : cases) EXPECT_EQ(join(tokenize_13a(in)), out) << in;
}

// Python's str.split(): U+00A0, U+3000, U+2009, U+001C, U+0085 separate words; U+200B (zero width
// space) and U+180E (no longer whitespace since Unicode 6.3) do not.
TEST(BleuTokenizer13a, UnicodeWhitespace) {
  const auto t = tokenize_13a(
      "a\u00a0b\u3000c\u2009d\u200be\x1c"
      "f\u0085g\u180eh\u2028i\u202fj\u205fk\u1680l\x0bm\x0cn\ro");
  EXPECT_EQ(t,
            (std::vector<std::string>{"a", "b", "c", "d\u200be", "f", "g\u180eh", "i", "j", "k", "l", "m", "n", "o"}));
  EXPECT_EQ(rstrip("x \u3000\u00a0\t\r"), "x");
  EXPECT_EQ(rstrip("x\u200b"), "x\u200b");
}

TEST(BleuTokenizer13a, InvalidUtf8Throws) {
  EXPECT_THROW(tokenize_13a("ab\xff"), Error);
  EXPECT_THROW(tokenize_13a("\xc0\xaf"), Error);      // overlong '/'
  EXPECT_THROW(tokenize_13a("\xed\xa0\x80"), Error);  // a UTF-16 surrogate
  EXPECT_THROW(tokenize_13a("\xe2\x82"), Error);      // truncated
  // Overlong 3- and 4-byte forms of '/', and the code point after U+10FFFF; U+10FFFF itself is valid.
  EXPECT_THROW(tokenize_13a("\xe0\x80\xaf"), Error);
  EXPECT_THROW(tokenize_13a("\xf0\x80\x80\xaf"), Error);
  EXPECT_THROW(tokenize_13a("\xf4\x90\x80\x80"), Error);
  EXPECT_EQ(utf8_decode("\xf4\x8f\xbf\xbf"), std::u32string(1, U'\U0010FFFF'));
  EXPECT_EQ(utf8_encode(utf8_decode("añ中😀")), "añ中😀");
  EXPECT_EQ(utf8_decode("añ中😀").size(), 4u);
}

// ---- BLEU details -------------------------------------------------------------------------------

// hyp "a b c d" vs ref "a b x c d": matches 4/4, 2/3, 0/2, 0/1; exp smoothing gives the zero
// orders 100/(2*2) and 100/(4*1); BP = exp(1 - 5/4). Score = BP * (100 * 200/3 * 25 * 25)^(1/4).
TEST(BleuCorpus, ExpSmoothingAndBrevityPenalty) {
  const BleuScore s = corpus_bleu({"a b c d"}, {{"a b x c d"}});
  EXPECT_EQ(s.counts, (std::array<int64_t, 4>{4, 2, 0, 0}));
  EXPECT_NEAR(s.precisions[2], 25.0, 1e-12);
  EXPECT_NEAR(s.precisions[3], 25.0, 1e-12);
  EXPECT_NEAR(s.bp, std::exp(-0.25), 1e-15);
  EXPECT_NEAR(s.score, 35.1862973998119, 1e-10);
  EXPECT_EQ(s.verbose_score, "100.0/66.7/25.0/25.0 (BP = 0.779 ratio = 0.800 hyp_len = 4 ref_len = 5)");
  EXPECT_EQ(s.signature, "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1");
}

// A corpus with no 3-grams: the loop stops at the first empty order and the missing precisions
// count as log 0 (utils.my_log's -9999999999), so the score is 0 despite perfect matches.
TEST(BleuCorpus, ShortCorpusIsZero) {
  const BleuScore s = corpus_bleu({"a b"}, {{"a b"}});
  EXPECT_EQ(s.score, 0.0);
  EXPECT_EQ(s.verbose_score, "100.0/100.0/0.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 2 ref_len = 2)");
}

// Multi-reference: each n-gram is clipped by its largest count in any reference ("a a a" gets 2
// unigram matches from "a a"); each sentence takes its closest reference length (2 of {1, 2} for
// 3 tokens, 5 of {2, 5} for 4), so ref_len = 7.
TEST(BleuCorpus, MultiReference) {
  const BleuScore s = corpus_bleu({"a a a", "x y z w"}, {{"a", "x y"}, {"a a", "x y z w v"}});
  EXPECT_EQ(s.counts, (std::array<int64_t, 4>{6, 4, 2, 1}));
  EXPECT_EQ(s.totals, (std::array<int64_t, 4>{7, 5, 3, 1}));
  EXPECT_EQ(s.sys_len, 7);
  EXPECT_EQ(s.ref_len, 7);
  EXPECT_NEAR(s.score, 82.22672338010389, 1e-10);
  EXPECT_EQ(s.signature.substr(0, 8), "nrefs:2|");
  // The streams in the other order ("a a" first): the same clipping, the same score.
  const BleuScore swapped = corpus_bleu({"a a a", "x y z w"}, {{"a a", "x y z w v"}, {"a", "x y"}});
  EXPECT_EQ(swapped.counts, s.counts);
  EXPECT_EQ(swapped.score, s.score);
}

// Equally close references (2 and 4 tokens around 3): the shorter one counts.
TEST(BleuCorpus, ClosestReferenceTiesToShorter) {
  EXPECT_EQ(corpus_bleu({"one two three"}, {{"one two"}, {"one two three four"}}).ref_len, 2);
  EXPECT_EQ(corpus_bleu({"one two three"}, {{"one two three four"}, {"one two"}}).ref_len, 2);
}

TEST(BleuCorpus, EmptyHypotheses) {
  BleuScore s = corpus_bleu({"", ""}, {{"a b", "c"}});
  EXPECT_EQ(s.score, 0.0);
  EXPECT_EQ(s.verbose_score, "0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 3)");
  s = corpus_bleu({""}, {{""}});  // nothing at all: BP 1, ratio 0 (sacreBLEU's "if ref_len else 0")
  EXPECT_EQ(s.verbose_score, "0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 0 ref_len = 0)");
}

TEST(BleuCorpus, UnicodeWhitespaceSeparatesWords) {
  EXPECT_NEAR(corpus_bleu({"the\u00a0quick\u3000brown\u2009fox\x1cjumps"}, {{"the quick brown fox jumps"}}).score,
              100.0, 1e-9);
  const BleuScore s = corpus_bleu({"the quick\u200bbrown fox jumps"}, {{"the quick brown fox jumps"}});
  EXPECT_EQ(s.verbose_score, "75.0/33.3/25.0/25.0 (BP = 0.779 ratio = 0.800 hyp_len = 4 ref_len = 5)");
  // Lines are right-stripped first, so "x-\n" is not joined to nothing and trailing blanks vanish.
  EXPECT_EQ(corpus_bleu({"a b c d-\n"}, {{"a b c d-"}}).score, corpus_bleu({"a b c d-"}, {{"a b c d-"}}).score);
}

TEST(BleuCorpus, BadInputThrows) {
  try {
    corpus_bleu({"a", "b"}, {{"a", "b"}, {"a"}});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 hypotheses but reference stream 1 has 1 lines"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(corpus_bleu({"a"}, {}), Error);
  EXPECT_THROW(corpus_bleu({}, {{}}), Error);
  EXPECT_THROW(corpus_chrf({"a"}, {{"a", "b"}}), Error);
  EXPECT_THROW(corpus_chrf({"a"}, {}), Error);
  try {
    corpus_bleu({"ok", "bad \xff"}, {{"a", "b"}});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hypothesis line 2"), std::string::npos) << e.what();
  }
}

// ---- chrF details -------------------------------------------------------------------------------

// Characters are code points: "niño" vs "nino" shares n, i, o and "ni" (27.083...: precision =
// recall = (3/4 + 1/3) / 2 per order 1-2, orders 3-4 match nothing... computed by sacreBLEU).
TEST(ChrfCorpus, CodePointsNotBytes) {
  EXPECT_NEAR(corpus_chrf({"niño"}, {{"nino"}}).score, 27.083333333333332, 1e-10);
}

// Orders the reference does not reach count no hypothesis n-grams (_get_match_statistics'
// "hyp_count if ref_ngrams else 0"), so "abcdef" vs "ab" averages over orders 1 and 2 only.
TEST(ChrfCorpus, OrdersWithoutReferenceNgrams) {
  const ChrfScore s = corpus_chrf({"abcdef"}, {{"ab"}});
  EXPECT_EQ(s.stats, (std::vector<int64_t>{6, 2, 2, 5, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_NEAR(s.score, 64.51612903225808, 1e-10);
  EXPECT_EQ(s.name, "chrF2");
  EXPECT_EQ(s.signature, "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.3.1");
}

TEST(ChrfCorpus, BestReferencePerSentence) {
  EXPECT_NEAR(corpus_chrf({"abc"}, {{"xyz"}, {"abc"}}).score, 100.0, 1e-12);
  // "aba" and "aabb" give "aaaa" the same f-score (20.83) from different statistics: the first
  // reference's statistics are the ones summed.
  auto first_orders = [](const ChrfScore& c) { return std::vector<int64_t>(c.stats.begin(), c.stats.begin() + 9); };
  EXPECT_EQ(first_orders(corpus_chrf({"aaaa"}, {{"aba"}, {"aabb"}})),
            (std::vector<int64_t>{4, 3, 2, 3, 2, 0, 2, 1, 0}));
  EXPECT_EQ(first_orders(corpus_chrf({"aaaa"}, {{"aabb"}, {"aba"}})),
            (std::vector<int64_t>{4, 4, 2, 3, 3, 1, 2, 2, 0}));
  EXPECT_NEAR(corpus_chrf(kHyps, kRefs).score, 59.72751782684763, 1e-10);
}

// ---- output -------------------------------------------------------------------------------------

const char* kReadmeJson = R"json({
 "name": "BLEU",
 "score": 48.5,
 "signature": "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1",
 "verbose_score": "82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)",
 "nrefs": "2",
 "case": "mixed",
 "eff": "no",
 "tok": "13a",
 "smooth": "exp",
 "version": "2.3.1"
})json";

TEST(BleuOutput, JsonAndText) {
  const BleuScore s = corpus_bleu(kHyps, kRefs);
  EXPECT_EQ(to_json(s), kReadmeJson);
  EXPECT_EQ(to_text(s, 2),
            "BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1 = 48.53 "
            "82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)");
  EXPECT_EQ(format_score(s.score, 4), "48.5308");
  const ChrfScore c = corpus_chrf(kHyps, kRefs);
  EXPECT_EQ(to_json(c), R"({
 "name": "chrF2",
 "score": 59.7,
 "signature": "nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.3.1",
 "nrefs": "2",
 "case": "mixed",
 "eff": "yes",
 "nc": "6",
 "nw": "0",
 "space": "no",
 "version": "2.3.1"
})");
}

// The JSON score is float(f"{score:.{w}f}") printed by repr(): shortest digits, ".0" for whole
// numbers, exponent notation below 1e-4.
TEST(BleuOutput, JsonScoreIsPythonRepr) {
  auto json_score = [](double v, int w) {
    Score s{"X", v, "a:b", ""};
    const std::string j = to_json(s, w);
    const size_t b = j.find("\"score\": ") + 9;
    return j.substr(b, j.find(',', b) - b);
  };
  EXPECT_EQ(json_score(48.530827, 0), "49.0");
  EXPECT_EQ(json_score(48.530827, 3), "48.531");
  EXPECT_EQ(json_score(100.0, 1), "100.0");
  EXPECT_EQ(json_score(0.0, 1), "0.0");
  EXPECT_EQ(json_score(0.25, 1), "0.2");  // round half to even on the exact binary value, as Python
  EXPECT_EQ(json_score(0.00012, 4), "0.0001");
  EXPECT_EQ(json_score(0.00004, 5), "4e-05");
  EXPECT_EQ(json_score(0.000123, 6), "0.000123");
  EXPECT_EQ(json_score(1.0 / 3.0, 20), "0.3333333333333333");
  EXPECT_EQ(json_score(1e15, 1), "1000000000000000.0");  // fixed notation up to 16 digits
  EXPECT_EQ(json_score(1e16, 1), "1e+16");
}

// ---- the executable -----------------------------------------------------------------------------

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "linea_bleu_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = (path / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
};

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct ToolResult {
  int code;
  std::string out, err;
};

// Runs linea-bleu with `args` (shell words) in the temp dir, stdin from `stdin_file` if given.
ToolResult run_tool(const TempDir& d, const std::string& args, const std::string& stdin_file = "/dev/null") {
  const std::string so = (d.path / "stdout").string(), se = (d.path / "stderr").string();
  const std::string cmd = "cd '" + d.path.string() + "' && '" + LINEA_BLEU_TOOL + "' " + args + " <'" + stdin_file +
                          "' >'" + so + "' 2>'" + se + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_all(so), read_all(se)};
}

void expect_error(const ToolResult& r, const std::string& what) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("error: linea-bleu: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "stderr: " << r.err << "\nexpected: " << what;
}

std::string lines(const Lines& v) {
  std::string s;
  for (auto& l : v) s += l + "\n";
  return s;
}

class BleuTool : public ::testing::Test {
 protected:
  void SetUp() override {
    d.write("ref1", lines(kRefs[0]));
    d.write("ref2", lines(kRefs[1]));
    d.write("hyp", lines(kHyps));
  }
  TempDir d;
};

TEST_F(BleuTool, DefaultJson) {
  const ToolResult r = run_tool(d, "ref1 ref2 -i hyp");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, std::string(kReadmeJson) + "\n");
  EXPECT_EQ(run_tool(d, "ref1 ref2", (d.path / "hyp").string()).out, r.out);  // stdin
  EXPECT_EQ(run_tool(d, "ref1 ref2 -i -", (d.path / "hyp").string()).out, r.out);
}

TEST_F(BleuTool, ScoreOnlyAndWidth) {
  EXPECT_EQ(run_tool(d, "ref1 ref2 -i hyp -b").out, "48.5\n");
  EXPECT_EQ(run_tool(d, "ref1 ref2 -i hyp -b -w 4").out, "48.5308\n");
  EXPECT_NE(run_tool(d, "ref1 ref2 -i hyp -w 0").out.find("\n \"score\": 49.0,\n"), std::string::npos);
  expect_error(run_tool(d, "ref1 -i hyp -w -1"), "-w must be >= 0");
}

TEST_F(BleuTool, MetricsChrfAndBoth) {
  const ToolResult c = run_tool(d, "ref1 ref2 -i hyp -m chrf");
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out.substr(0, 40), "{\n \"name\": \"chrF2\",\n \"score\": 59.7,\n \"si");
  // Several metrics: sacreBLEU's order (BLEU first whatever the order asked), as a JSON list.
  const ToolResult both = run_tool(d, "ref1 ref2 -i hyp -m chrf bleu");
  EXPECT_EQ(both.out, "[\n" + std::string(kReadmeJson) + ",\n" + c.out.substr(0, c.out.size() - 1) + "\n]\n");
  EXPECT_EQ(run_tool(d, "ref1 ref2 -i hyp -m bleu chrf -b").out, "[\n48.5,\n59.7\n]\n");
  expect_error(run_tool(d, "ref1 -i hyp -m ter"), "ter");
}

TEST_F(BleuTool, TextFormat) {
  EXPECT_EQ(run_tool(d, "ref1 ref2 -i hyp -m bleu chrf -f text").out,
            "  BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1 = 48.5 82.4/50.0/45.5/37.5 (BP = "
            "0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)\n"
            "chrF2|nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.3.1 = 59.7\n");
}

// sacreBLEU reads files splitting at '\n' only: a '\r' inside a reference is whitespace (test.sh's
// control character test), "\r\n" endings and a missing final newline change nothing.
TEST_F(BleuTool, LineEndings) {
  d.write("h1", "Hello! How are you doing today?\n");
  d.write("r_ok", "Hello! How are you doing today?\n");
  d.write("r_cr", "Hello! How are you \r doing today?");
  const ToolResult ok = run_tool(d, "r_ok -i h1 -w 2 -b"), cr = run_tool(d, "r_cr -i h1 -w 2 -b");
  EXPECT_EQ(ok.out, "100.00\n");
  EXPECT_EQ(cr.out, ok.out);
  d.write("hyp_crlf", "The dog bit the man.\r\nIt wasn't surprising.\r\nThe man had just bitten him.");
  EXPECT_EQ(run_tool(d, "ref1 ref2 -i hyp_crlf -b -w 6").out, "48.530827\n");
  // On stdin sacreBLEU has universal newlines: a lone '\r' ends a line there.
  d.write("hyp_cr", "The dog bit the man.\rIt wasn't surprising.\rThe man had just bitten him.\r");
  EXPECT_EQ(run_tool(d, "ref1 ref2 -b -w 6", (d.path / "hyp_cr").string()).out, "48.530827\n");
  expect_error(run_tool(d, "ref1 ref2 -i hyp_cr"), "has 1 lines but reference 'ref1' has 3");
}

// Files ending in .gz are gunzipped, as sacreBLEU's smart_open does.
TEST_F(BleuTool, GzipReference) {
  ASSERT_EQ(std::system(("gzip -k '" + (d.path / "ref1").string() + "'").c_str()), 0);
  EXPECT_EQ(run_tool(d, "ref1.gz ref2 -i hyp").out, run_tool(d, "ref1 ref2 -i hyp").out);
}

// An empty stdin is one empty hypothesis for sacreBLEU (its first readline()); an empty file none.
TEST_F(BleuTool, EmptyInput) {
  d.write("one", "a b c d e\n");
  d.write("empty", "");
  EXPECT_EQ(run_tool(d, "one -b", (d.path / "empty").string()).out, "0.0\n");
  expect_error(run_tool(d, "one -i empty"), "'empty' has no lines");
}

TEST_F(BleuTool, Errors) {
  expect_error(run_tool(d, "ref1 -i missing.txt"), "cannot open 'missing.txt'");
  expect_error(run_tool(d, "nothere -i hyp"), "cannot open 'nothere'");
  expect_error(run_tool(d, "ref1 -i ."), "cannot read '.': it is a directory");
  d.write("short", "only one line\nand two\n");
  expect_error(run_tool(d, "ref1 short -i hyp"), "('hyp') has 3 lines but reference 'short' has 2");
  expect_error(run_tool(d, "-i hyp"), "no reference files");
  d.write("bad", "ok\nnot \xff utf-8\nok\n");
  expect_error(run_tool(d, "ref1 -i bad"), "'bad' line 2: invalid UTF-8");
  expect_error(run_tool(d, "ref1 -i hyp --bogus"), "bogus");
  d.write("tabbed", "a\tb\nc\nd\n");
  expect_error(run_tool(d, "ref1", (d.path / "tabbed").string()), "tab");
}

TEST_F(BleuTool, Help) {
  const ToolResult r = run_tool(d, "--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--score-only"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--metrics"), std::string::npos);
}

}  // namespace
}  // namespace linea::apps::bleu
