// The translate app's data: the Bible reader on the installed SWORD modules (counts, cleaning,
// the NRSVA -> KJV mapping, RV's renumbered chapters, the lowercase its re-casing uses),
// `prepare` on small generated files (deterministic and disjoint splits, dropped lines,
// byte-identical reruns, clear errors) and on the Bible with a books split, the tokenizer (round
// trip, loading from bytes, special ids) and the dataset's padded, shifted batches.
// Not here: the model, training and BLEU.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <unordered_map>

#include "bible.h"
#include "core/error.h"
#include "dataset.h"
#include "prepare.h"
#include "sentencepiece_trainer.h"
#include "tests/test_util.h"
#include "tokenizer.h"

namespace sentencepiece::logging {  // exported by libsentencepiece, declared in its private headers
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace fs = std::filesystem;
using json = nlohmann::json;
using linea::test::read_all;
using linea::test::TempDir;
using linea::test::write_all;
using namespace translate;

namespace {

// ---- the Bible ---------------------------------------------------------------------------------

class Bible : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    corpus_ = new BibleCorpus(read_bible());
    for (const VersePair& p : corpus_->pairs) by_ref_[p.ref] = &p;
  }
  static void TearDownTestSuite() {
    delete corpus_;
    by_ref_.clear();
  }
  static const VersePair& pair(const std::string& ref) {
    auto it = by_ref_.find(ref);
    if (it == by_ref_.end()) throw std::runtime_error("no pair " + ref);
    return *it->second;
  }
  static BibleCorpus* corpus_;
  static std::map<std::string, const VersePair*> by_ref_;
};
BibleCorpus* Bible::corpus_ = nullptr;
std::map<std::string, const VersePair*> Bible::by_ref_;

TEST_F(Bible, CountsMatchTheModules) {
  const BibleStats& st = corpus_->stats;
  EXPECT_EQ(st.src_versification, "NRSVA");
  EXPECT_EQ(st.tgt_versification, "KJV");
  EXPECT_EQ(st.src_verses, 37791);
  EXPECT_EQ(st.tgt_verses, 31102);
  // 17 deuterocanonical books; their 6,687 verses never reach the Spanish side.
  EXPECT_EQ(st.missing_books.size(), 17u);
  EXPECT_EQ(st.dropped.at("book_missing_in_tgt"), 6687);
  EXPECT_EQ(st.missing_books.at("Tob"), 242);
  // NRSVA splits two KJV verses (3John.1.14-15, Rev.12.17-18): the second maps onto the first.
  EXPECT_EQ(st.dropped.at("duplicate_mapping"), 2);
  // WEB leaves 7 verses empty (Luke.17.36, Acts.8.37, ...; Rom.16.25-27 sit at 14.23).
  EXPECT_EQ(st.dropped.at("src_empty"), 7);
  EXPECT_EQ(st.titles_restored, 139);  // 138 psalm titles + Ps 151's (deuterocanonical)
  // The cleaning and the alignment, exactly as bible.h reports them for these modules: each is
  // deterministic, and a change to one of them shows here first (with bible.h's numbers to update).
  EXPECT_EQ(st.recased, 1188);  // RV capitalizes the first word of (almost) every chapter
  EXPECT_EQ(st.notes_removed, 2209);
  EXPECT_EQ(st.realigned, 178);  // RV's renumbered chapters (Num 13, Job 39-40, Jonah 2, ...)
  EXPECT_EQ(st.mapped, 0);       // the two verses NRSVA numbers apart from KJV are the dropped halves
  EXPECT_EQ(st.dropped.at("unaligned"), 20);
  EXPECT_EQ(st.dropped.at("length_mismatch"), 33);
  EXPECT_EQ(st.dropped.at("tgt_empty"), 4);  // 14 of RV's 18 empty slots have their verse elsewhere
  EXPECT_EQ(st.dropped.count("unmappable"), 0u);
  EXPECT_EQ(st.dropped.size(), 6u);
  EXPECT_EQ(st.tgt_unused, 46);
  EXPECT_EQ(st.pairs, 31038);
  int64_t dropped = 0;
  for (const auto& kv : st.dropped) dropped += kv.second;
  EXPECT_EQ(dropped + st.pairs, st.src_verses);  // every source verse is paired or counted
}

// FNV-1a 64 of every pair's reference and one side's text: a change to the text the cleaning
// gives any verse (a space, a letter's case, a footnote's remains) that the counts cannot see.
// When a change to bible.cpp moves it on purpose, compare `translate prepare`'s files before and
// after, and update the digests with what the diff shows in the commit.
TEST_F(Bible, TextDigests) {
  const auto digest = [](bool tgt) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const VersePair& p : corpus_->pairs)
      for (const std::string* s : {&p.ref, tgt ? &p.tgt : &p.src})
        for (unsigned char c : *s + "\n") h = (h ^ c) * 0x100000001b3ull;
    return h;
  };
  EXPECT_EQ(digest(false), 0x9bb5f301fa12c7b4ull) << std::hex << "English: " << digest(false);
  EXPECT_EQ(digest(true), 0x6f53f9856e60abe5ull) << std::hex << "Spanish: " << digest(true);
}

TEST_F(Bible, GenesisOneOneInBothLanguages) {
  const VersePair& p = pair("Gen.1.1");
  EXPECT_EQ(corpus_->pairs.front().ref, "Gen.1.1");
  // WEB's footnote after "God" used to glue it to "created"; RV's "EN el principio" is re-cased.
  EXPECT_EQ(p.src, "In the beginning, God created the heavens and the earth.");
  EXPECT_EQ(p.tgt, "En el principio crió Dios los cielos y la tierra.");
  EXPECT_EQ(corpus_->pairs.back().ref, "Rev.22.21");
  EXPECT_EQ(pair("Rev.22.21").src, "The grace of the Lord Jesus Christ be with all the saints. Amen.");  // no glossary
}

TEST_F(Bible, CleanText) {
  std::set<std::string> refs;
  for (const VersePair& p : corpus_->pairs) {
    for (const std::string* s : {&p.src, &p.tgt}) {
      ASSERT_FALSE(s->empty()) << p.ref;
      EXPECT_EQ(*s, normalize_space(*s)) << p.ref;  // no line breaks, double or edge spaces
      EXPECT_EQ(s->find_first_of("<>&"), std::string::npos) << p.ref << ": " << *s;
    }
    EXPECT_TRUE(refs.insert(p.ref).second) << p.ref;
  }
  // Poetry: line breaks collapsed; WEB's psalm title restored in front of verse 1, as RV has it.
  EXPECT_EQ(pair("Ps.23.1").src, "A Psalm by David. Yahweh is my shepherd; I shall lack nothing.");
  EXPECT_EQ(pair("Ps.23.1").tgt, "Salmo de David. Jehová es mi pastor; nada me faltará.");
  // RV's added words (<transChange>) no longer stick to their neighbours; enclitics still do.
  EXPECT_EQ(pair("Ezek.1.1").tgt.rfind("Y fué que á los treinta años, en el mes cuarto,", 0), 0u) << pair("Ezek.1.1").tgt;
  EXPECT_NE(pair("Gen.19.12").tgt.find("sácalo de este lugar"), std::string::npos) << pair("Gen.19.12").tgt;
  EXPECT_NE(pair("Gen.25.33").tgt.find("Júramelo en este día"), std::string::npos) << pair("Gen.25.33").tgt;
  // Two Strong's numbers in one lemma no longer leak "<G5547>" (3John.1.14 "verte <G4571>").
  EXPECT_NE(pair("3John.1.14").tgt.find("espero verte en breve"), std::string::npos);
  // A chapter opening after a one-letter word: "Y YO me paré" -> "Y yo me paré".
  EXPECT_EQ(pair("Rev.13.1").tgt.rfind("Y yo me paré sobre la arena del mar", 0), 0u) << pair("Rev.13.1").tgt;
}

TEST_F(Bible, VersificationMapping) {
  EXPECT_EQ(map_reference("Gen.1.1", "NRSVA", "KJV"), "Gen.1.1");
  EXPECT_EQ(map_reference("3John.1.15", "NRSVA", "KJV"), "3John.1.14");
  EXPECT_EQ(map_reference("Rev.12.18", "NRSVA", "KJV"), "Rev.12.17");
  // A book KJV lacks: a VerseKey would silently land on Gen.1.1.
  EXPECT_EQ(map_reference("Tob.1.1", "NRSVA", "KJV"), "");
  EXPECT_THROW(map_reference("Gen.51.1", "NRSVA", "KJV"), linea::Error);
  // The split verses pair once; the second half (empty in WEB) is not paired with Jude.1.1.
  EXPECT_NE(pair("3John.1.14").src.find("Peace be to you"), std::string::npos);
  EXPECT_EQ(by_ref_.count("3John.1.15"), 0u);
  EXPECT_NE(pair("Jude.1.1").tgt.find("Judas, siervo de Jesucristo"), std::string::npos);
  for (const VersePair& p : corpus_->pairs) EXPECT_NE(book_of(p.ref), "Tob");
}

TEST_F(Bible, RenumberedChaptersAreRealigned) {
  // RV numbers Num 12:16 as 13:1, so the module's Num.13.N holds KJV's 13:N-1.
  EXPECT_EQ(pair("Num.12.16").tgt.rfind("Y después movió el pueblo de Haseroth", 0), 0u) << pair("Num.12.16").tgt;
  EXPECT_EQ(pair("Num.13.1").tgt, "Y Jehová habló á Moisés, diciendo:");
  EXPECT_NE(pair("Num.13.10").tgt.find("Zabulón"), std::string::npos) << pair("Num.13.10").tgt;
  // Jonah 1:17 is RV's 2:1; Job 40:6 is RV's 40:1.
  EXPECT_EQ(pair("Jonah.1.17").tgt.rfind("Mas Jehová había prevenido un gran pez", 0), 0u) << pair("Jonah.1.17").tgt;
  EXPECT_EQ(pair("Job.40.6").tgt.rfind("Entonces respondió Jehová á Job desde la oscuridad", 0), 0u);
  // The module's last Job 39 slot holds nine RV verses: those English verses stay unpaired.
  EXPECT_EQ(by_ref_.count("Job.40.1"), 0u);
  EXPECT_EQ(pair("Exod.20.13").tgt, "No matarás.");  // short verses keep their pairs
}

TEST(BibleErrors, MissingModuleNamesThePackage) {
  BibleOptions o;
  o.tgt_module = "spaNoSuchModule";
  EXPECT_LINEA_ERROR(read_bible(o), "spaNoSuchModule", "not installed");
  TempDir empty;  // a SWORD library without modules
  o = BibleOptions();
  o.sword_path = empty.path.string();
  EXPECT_LINEA_ERROR(read_bible(o), "engWEB2015eb", "apt-get install sword-text-web", empty.path.string());
}

// ---- text helpers -----------------------------------------------------------------------------

TEST(Text, NormalizeSpaceAndUtf8) {
  EXPECT_EQ(normalize_space("  a\tb\n\n c\xC2\xA0" "d\r\n"), "a b c d");  // NBSP is a space too
  EXPECT_EQ(normalize_space(""), "");
  EXPECT_EQ(invalid_utf8_at("plain ñ “quotes”"), -1);
  EXPECT_EQ(invalid_utf8_at("ab\xC3"), 2);         // truncated sequence
  EXPECT_EQ(invalid_utf8_at("a\xC3\x62\xC3\xB1"), 1);  // a lead byte without its continuation ("b")
  EXPECT_EQ(invalid_utf8_at("\xE2\x80\xC3\xB1"), 0);
  EXPECT_EQ(invalid_utf8_at("a\xC0\xAF"), 1);      // overlong
  EXPECT_EQ(invalid_utf8_at("\xED\xA0\x80"), 0);   // surrogate
  EXPECT_EQ(utf8_length("año"), 3);
}

// Latin Extended-A's capitals are even code points, but odd in U+0139-0148 and U+0179-017E.
TEST(Text, LowercaseOfLatinCapitals) {
  const std::vector<std::pair<int32_t, int32_t>> pairs = {
      {'A', 'a'},     {'Z', 'z'},     {0xC0, 0xE0},   {0xD1, 0xF1},   {0xDE, 0xFE},   {0x100, 0x101},
      {0x12E, 0x12F}, {0x130, 'i'},   {0x139, 0x13A}, {0x141, 0x142}, {0x147, 0x148}, {0x14A, 0x14B},
      {0x152, 0x153}, {0x176, 0x177}, {0x178, 0xFF},  {0x179, 0x17A}, {0x17D, 0x17E}};
  for (const auto& [upper, lower] : pairs) EXPECT_EQ(lower_cp(upper), lower) << std::hex << upper;
  // lowercase letters and others are kept
  for (int32_t cp : std::vector<int32_t>{'a', '1', 0xD7, 0xDF, 0xF1, 0xFF, 0x101, 0x131, 0x138, 0x13A, 0x142, 0x148,
                                         0x149, 0x14B, 0x17A, 0x17E, 0x17F, 0x180, 0x3A9})
    EXPECT_EQ(lower_cp(cp), cp) << std::hex << cp;
}

// ---- generated user data -------------------------------------------------------------------------

// n line pairs of a toy English/Spanish word-for-word "translation"; every 10th line empty on one
// side (or both at 50, 100, ...).
void write_pairs(const std::string& src, const std::string& tgt, int n, uint32_t seed = 7) {
  const std::vector<std::pair<std::string, std::string>> words = {
      {"the", "el"},     {"house", "casa"}, {"water", "agua"}, {"king", "rey"},      {"god", "dios"},
      {"said", "dijo"},  {"and", "y"},      {"good", "bueno"}, {"great", "grande"},  {"land", "tierra"},
      {"people", "pueblo"}, {"son", "hijo"}, {"day", "día"},   {"night", "noche"},   {"light", "luz"},
      {"heaven", "cielo"}, {"man", "hombre"}, {"woman", "mujer"}, {"bread", "pan"},  {"word", "palabra"}};
  std::mt19937 rng(seed);
  std::string a, b;
  for (int i = 1; i <= n; ++i) {
    std::string s, t;
    const int len = 3 + static_cast<int>(rng() % 10);
    for (int k = 0; k < len; ++k) {
      const auto& w = words[rng() % words.size()];
      s += (k ? " " : "") + w.first;
      t += (k ? " " : "") + w.second;
    }
    if (i % 10 == 0) (i % 50 == 0 ? s = t = "  " : (i % 20 == 0 ? s : t) = " \t");
    a += s + "\n";
    b += t + "\r\n";  // CRLF on one side: line ends are not part of the text
  }
  write_all(src, a);
  write_all(tgt, b);
}

PrepareOptions small(const TempDir& dir, const std::string& out = "out") {
  PrepareOptions o;
  o.src_file = dir.file("in.en");
  o.tgt_file = dir.file("in.es");
  o.out = dir.file(out);
  o.valid_size = 30;
  o.test_size = 40;
  o.vocab_size = 60;
  return o;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}

TEST(Prepare, UserFilesSplitsAndStats) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 400);
  write_all(dir.file("in.es"), "\xEF\xBB\xBF" + read_all(dir.file("in.es")));  // a byte order mark: not text
  PrepareOptions o = small(dir);
  o.max_length = 0;  // 0: no filter (the toy pairs are short anyway)
  o.max_ratio = 0;
  const PrepareResult r = prepare(o);
  EXPECT_TRUE(r.stats["length_filter"]["dropped"].empty());
  // 40 lines have an empty side: 8 both (every 50th), 16 source (20th), 16 target (other 10th).
  EXPECT_EQ(r.stats["dropped"], json({{"both_empty", 8}, {"src_empty", 16}, {"tgt_empty", 16}}));
  EXPECT_EQ(r.stats["pairs"], 360);
  EXPECT_EQ(r.valid, 30);
  EXPECT_EQ(r.test, 40);
  EXPECT_EQ(r.train, 290);
  for (const char* f : {"train.en", "train.es", "train.ref", "valid.en", "valid.es", "valid.ref", "test.en", "test.es",
                        "test.ref", "spm.model", "stats.json", "data.json"})
    EXPECT_TRUE(fs::is_regular_file(fs::path(o.out) / f)) << f;
  // The splits are disjoint and cover every non-empty line, named by line number, in the input's
  // order, each line as the input has it (whitespace normalized, no CR).
  const std::vector<std::string> in_en = lines_of(dir.file("in.en"));
  std::vector<std::string> in_es = lines_of(dir.file("in.es"));
  in_es[0].erase(0, 3);  // the mark
  std::set<int> seen;
  for (const char* s : {"train", "valid", "test"}) {
    const ParallelSplit p = read_split(o.out, s);
    for (size_t i = 0; i < p.refs.size(); ++i) {
      const int line = std::stoi(p.refs[i]);
      EXPECT_TRUE(seen.insert(line).second) << "line " << line << " in two splits";
      EXPECT_NE(line % 10, 0);
      if (i > 0) {
        EXPECT_LT(std::stoi(p.refs[i - 1]), line) << s;
      }
      EXPECT_EQ(p.src[i], normalize_space(in_en.at(line - 1))) << s << " line " << line;
      EXPECT_EQ(p.tgt[i], normalize_space(in_es.at(line - 1))) << s << " line " << line;  // no CR
    }
  }
  EXPECT_EQ(seen.size(), 360u);
  const json manifest = json::parse(read_all(o.out + "/data.json"));
  EXPECT_EQ(manifest["files"]["valid"]["src"], "valid.en");
  EXPECT_EQ(manifest["vocab"]["src_model"], "spm.model");
  EXPECT_EQ(manifest["vocab"]["pad_id"], 0);
  EXPECT_EQ(manifest["vocab"]["eos_id"], 3);
  const json stats = json::parse(read_all(o.out + "/stats.json"));
  EXPECT_EQ(stats["splits"]["valid"]["pairs"], 30);
  EXPECT_GT(stats["splits"]["train"]["src"]["tokens"]["mean"].get<double>(), 3.0);
  EXPECT_GE(stats["splits"]["train"]["tgt"]["chars"]["max"].get<int>(), stats["splits"]["train"]["tgt"]["chars"]["p90"].get<int>());
  EXPECT_EQ(stats["splits"]["test"]["tgt"]["unk_rate"], 0.0);
  EXPECT_FALSE(fs::exists(o.out + ".tmp." + std::to_string(::getpid())));
}

TEST(Prepare, SeedDecidesTheSplitAndRerunsAreByteIdentical) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 300);
  PrepareOptions a = small(dir, "a"), b = small(dir, "b"), c = small(dir, "c");
  c.seed = 1;
  prepare(a);
  prepare(b);
  prepare(c);
  for (const auto& entry : fs::directory_iterator(a.out)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(read_all(entry.path().string()), read_all(b.out + "/" + name)) << name << " differs between two runs";
  }
  EXPECT_NE(read_all(a.out + "/valid.ref"), read_all(c.out + "/valid.ref"));
  // Rerunning into an existing prepared folder replaces it.
  a.valid_size = 10;
  prepare(a);
  EXPECT_EQ(lines_of(a.out + "/valid.ref").size(), 10u);
}

TEST(Prepare, SeparateVocabulariesAndLengthFilter) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 300);
  // Word for word, the two sides have as many tokens; some Spanish lines get one or two more.
  std::string es;
  int line = 0;
  for (const std::string& l : lines_of(dir.file("in.es")))
    ++line, es += l + (line % 7 == 0 ? " y y\n" : line % 7 == 3 ? " y\n" : "\n");
  write_all(dir.file("in.es"), es);
  PrepareOptions o = small(dir);
  o.vocab = "separate";
  o.src_lang = "en_GB";  // codes may hold '_' and '-'
  o.tgt_lang = "es-419";
  o.vocab_size = 40;  // per language now
  o.max_length = 6;   // drops the longer training pairs; valid and test keep theirs
  o.max_ratio = 1.1;  // and those whose sides differ: (longer+1)/(shorter+1) > 1.1
  const PrepareResult r = prepare(o);
  EXPECT_TRUE(fs::is_regular_file(o.out + "/spm.en_GB.model"));
  EXPECT_TRUE(fs::is_regular_file(o.out + "/spm.es-419.model"));
  EXPECT_TRUE(fs::is_regular_file(o.out + "/train.en_GB"));
  const Manifest m = read_manifest(o.out);
  EXPECT_EQ(m.src_model, o.out + "/spm.en_GB.model");
  EXPECT_EQ(m.tgt_model, o.out + "/spm.es-419.model");
  const json& dropped = r.stats["length_filter"]["dropped"];
  const int64_t too_long = dropped.value("too_long", 0), ratio = dropped.value("length_ratio", 0);
  EXPECT_GT(too_long, 20);
  EXPECT_GT(ratio, 0);
  EXPECT_EQ(r.train + r.valid + r.test + too_long + ratio, r.stats["pairs"].get<int64_t>());
  EXPECT_EQ(r.valid, 30);
  // Each model knows its own language's letters only ('k' is not in the Spanish words, 'í' not in
  // the English ones).
  const Tokenizer src = Tokenizer::from_file(m.src_model), tgt = Tokenizer::from_file(m.tgt_model);
  const auto has_unk = [](const std::vector<int64_t>& ids) { return std::count(ids.begin(), ids.end(), kUnkId) > 0; };
  EXPECT_TRUE(has_unk(tgt.encode("king")));
  EXPECT_FALSE(has_unk(src.encode("king")));
  EXPECT_TRUE(has_unk(src.encode("día")));
  EXPECT_FALSE(has_unk(tgt.encode("día")));
  // Both sides filtered, each with its own model; the bounds themselves kept.
  const ParallelSplit train = read_split(o.out, "train");
  size_t longest_train = 0;
  for (size_t i = 0; i < train.src.size(); ++i) {
    const size_t a = src.encode(train.src[i]).size(), b = tgt.encode(train.tgt[i]).size();
    EXPECT_LE(std::max(a, b), 6u) << train.refs[i];
    EXPECT_LE(double(std::max(a, b) + 1) / double(std::min(a, b) + 1), 1.1) << train.refs[i];
    longest_train = std::max({longest_train, a, b});
  }
  EXPECT_EQ(longest_train, 6u);
  const ParallelSplit valid = read_split(o.out, "valid");
  size_t longest_valid = 0, longest_valid_tgt = 0;
  for (size_t i = 0; i < valid.src.size(); ++i) {
    longest_valid = std::max(longest_valid, src.encode(valid.src[i]).size());
    longest_valid_tgt = std::max(longest_valid_tgt, tgt.encode(valid.tgt[i]).size());
  }
  EXPECT_GT(longest_valid, 6u);
  // stats.json's token counts are each side's model's.
  EXPECT_EQ(r.stats["splits"]["valid"]["src"]["tokens"]["max"].get<size_t>(), longest_valid);
  EXPECT_EQ(r.stats["splits"]["valid"]["tgt"]["tokens"]["max"].get<size_t>(), longest_valid_tgt);
}

TEST(Prepare, UnknownRateCountsPiecesTheTrainingSplitNeverSaw) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 200);
  // Lines 1-40 each end in a CJK character of their own: those held out are unknown to the model.
  std::string en;
  int line = 0;
  for (const std::string& l : lines_of(dir.file("in.en"))) {
    const int cp = 0x4E00 + ++line;  // three bytes of UTF-8
    const std::string cjk =
        line > 40 ? "" : std::string{char(0xE0 | cp >> 12), char(0x80 | (cp >> 6 & 0x3F)), char(0x80 | (cp & 0x3F))};
    en += l + (cjk.empty() ? "" : " " + cjk) + "\n";
  }
  write_all(dir.file("in.en"), en);
  PrepareOptions o = small(dir);
  o.vocab_size = 80;
  const PrepareResult r = prepare(o);
  const Tokenizer tok = Tokenizer::from_file(read_manifest(o.out).src_model);
  double held_out_unk = 0;
  for (const char* s : {"train", "valid", "test"}) {
    int64_t unk = 0, total = 0;
    for (const std::string& l : read_split(o.out, s).src) {
      const std::vector<int64_t> ids = tok.encode(l);
      unk += std::count(ids.begin(), ids.end(), kUnkId);
      total += static_cast<int64_t>(ids.size());
    }
    const double rate = std::round(1e6 * double(unk) / double(total)) / 1e6;
    EXPECT_EQ(r.stats["splits"][s]["src"]["unk_rate"].get<double>(), rate) << s;
    if (std::string(s) != "train") held_out_unk += rate;
  }
  EXPECT_EQ(r.stats["splits"]["train"]["src"]["unk_rate"], 0.0);  // character coverage 1.0
  EXPECT_GT(held_out_unk, 0.0);
}

TEST(Prepare, ClearErrors) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 50);
  write_pairs(dir.file("short.en"), dir.file("short.es"), 49);
  PrepareOptions o = small(dir);
  o.valid_size = o.test_size = 5;
  o.tgt_file = dir.file("short.es");
  EXPECT_LINEA_ERROR(prepare(o), "50 lines", "49", "in.en", "short.es");
  o.tgt_file = dir.file("missing.es");
  EXPECT_LINEA_ERROR(prepare(o), "missing.es");
  write_all(dir.file("bad.es"), "uno\ndos\xff\n");
  write_all(dir.file("two.en"), "one\ntwo\n");
  o.src_file = dir.file("two.en");
  o.tgt_file = dir.file("bad.es");
  EXPECT_LINEA_ERROR(prepare(o), "bad.es", "line 2", "UTF-8", "byte 4");
  o = small(dir);
  o.split = "books";
  EXPECT_LINEA_ERROR(prepare(o), "needs the Bible");
  o = small(dir);
  o.valid_size = 25;  // + 20 = the 45 pairs of 50 lines (every 10th has an empty side)
  o.test_size = 20;
  EXPECT_LINEA_ERROR(prepare(o), "leaves no training pairs", "45");
  o = small(dir);
  o.tgt_lang = o.src_lang;
  EXPECT_LINEA_ERROR(prepare(o), "two different codes");
  o = small(dir);
  o.src_lang = "e n";
  EXPECT_LINEA_ERROR(prepare(o), "--src-lang", "'e n'");
  o = small(dir);
  o.max_length = -1;
  EXPECT_LINEA_ERROR(prepare(o), "must be >= 0");
  o = small(dir);
  o.tgt_file.clear();
  EXPECT_LINEA_ERROR(prepare(o), "--src and --tgt");
  o = small(dir, "not_data");
  fs::create_directories(o.out);
  write_all(o.out + "/precious.txt", "x");
  o.valid_size = o.test_size = 5;
  EXPECT_LINEA_ERROR(prepare(o), "refusing to replace");
  EXPECT_TRUE(fs::exists(o.out + "/precious.txt"));
  o = small(dir);
  o.valid_size = o.test_size = 5;
  o.vocab_size = 5000;
  EXPECT_LINEA_ERROR(prepare(o), "--vocab-size");
  EXPECT_FALSE(fs::exists(o.out));  // a failed prepare leaves no folder behind
  EXPECT_LINEA_ERROR(read_split(dir.file("nowhere"), "train"), "translate prepare");
}

// ---- the Bible through prepare: whole books held out ---------------------------------------------

TEST(Prepare, BibleBooksSplit) {
  TempDir dir;
  PrepareOptions o;
  o.out = dir.file("bible");
  o.split = "books";
  o.test_books = "Jonah, Mal,";  // spaces and an empty item are fine
  o.valid_books = "Ruth";
  o.vocab_size = 500;  // quick SentencePiece training (BPE is faster than unigram at small sizes)
  o.spm_type = "bpe";
  const PrepareResult r = prepare(o);
  EXPECT_EQ(r.valid, 85);
  EXPECT_EQ(r.test, 47 + 55);
  const std::map<std::string, std::set<std::string>> allowed = {{"valid", {"Ruth"}}, {"test", {"Jonah", "Mal"}}};
  for (const char* s : {"train", "valid", "test"})
    for (const std::string& ref : read_split(o.out, s).refs) {
      const std::string book = book_of(ref);
      if (std::string(s) == "train")
        EXPECT_TRUE(book != "Ruth" && book != "Jonah" && book != "Mal") << ref;
      else
        EXPECT_TRUE(allowed.at(s).count(book)) << s << ": " << ref;
    }
  const json stats = json::parse(read_all(o.out + "/stats.json"));
  EXPECT_EQ(stats["source"]["src"]["module"], "engWEB2015eb");
  EXPECT_EQ(stats["split"]["test_books"], json({"Jonah", "Mal"}));
  EXPECT_EQ(stats["read"]["src_verses"], 37791);
  EXPECT_EQ(lines_of(o.out + "/valid.ref").front(), "Ruth.1.1");
  // Every book held out: from the books the training split holds (these fail before tokenizing).
  std::set<std::string> books;
  for (const std::string& ref : lines_of(o.out + "/train.ref")) books.insert(book_of(ref));
  o.test_books = "Jonah,Mal";
  for (const std::string& b : books) o.test_books += "," + b;
  EXPECT_LINEA_ERROR(prepare(o), "held-out books leave no training pairs");
  o.test_books = "Jonah,Tobit";
  EXPECT_LINEA_ERROR(prepare(o), "unknown book 'Tobit'", "Gen, Exod,", "Rev");
  o.test_books = "Jonah,Ruth";
  EXPECT_LINEA_ERROR(prepare(o), "book 'Ruth' is in both");
  o.test_books = " , ";
  EXPECT_LINEA_ERROR(prepare(o), "--test-books is empty");
}

// ---- tokenizer ----------------------------------------------------------------------------------

TEST(Tokenizer, RoundTripBytesAndSpecialIds) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 200);
  std::vector<std::string> text = lines_of(dir.file("in.en"));
  text.push_back("Ñandú, “quotes” — and año");
  std::vector<const std::string*> ptrs;
  for (const std::string& s : text) ptrs.push_back(&s);
  TokenizerTraining t;
  t.vocab_size = 50;
  const std::string bytes = train_tokenizer(ptrs, t);
  EXPECT_EQ(bytes, train_tokenizer(ptrs, t));  // deterministic
  write_all(dir.file("m.model"), bytes);
  const Tokenizer a = Tokenizer::from_file(dir.file("m.model")), b = Tokenizer::from_bytes(bytes);
  EXPECT_EQ(a.bytes(), bytes);
  EXPECT_EQ(a.vocab_size(), 50);
  EXPECT_EQ(a.piece(0), "<pad>");
  EXPECT_EQ(a.piece(1), "<unk>");
  EXPECT_EQ(a.piece(2), "<s>");
  EXPECT_EQ(a.piece(3), "</s>");
  const std::string s = "the king said good bread and año";
  const std::vector<int64_t> ids = a.encode(s);
  EXPECT_EQ(ids, b.encode(s));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kBosId) + std::count(ids.begin(), ids.end(), kEosId), 0);
  EXPECT_EQ(a.decode(ids), s);  // character_coverage 1.0: ñ has a piece
  std::vector<int64_t> framed = {kBosId};
  framed.insert(framed.end(), ids.begin(), ids.end());
  framed.insert(framed.end(), {kEosId, kPadId, kPadId});
  EXPECT_EQ(a.decode(framed), s);
  EXPECT_THROW(a.decode({50}), linea::Error);
  EXPECT_THROW(a.piece(-1), linea::Error);
  EXPECT_THROW(Tokenizer::from_bytes("not a model"), linea::Error);
  EXPECT_LINEA_ERROR(Tokenizer().encode("x"), "before a model was loaded");
  EXPECT_LINEA_ERROR(Tokenizer::from_file(dir.file("nope.model")), "nope.model");
  t.model_type = "bpe";
  EXPECT_NE(train_tokenizer(ptrs, t), bytes);
  t.vocab_size = 100000;
  EXPECT_LINEA_ERROR(train_tokenizer(ptrs, t), "--vocab-size");
}

// `model` with its piece number `index` renamed to `text`: a model SentencePiece must refuse.
// (protobuf: field 1 of a ModelProto is a piece, field 1 of a piece its text; every field of
// both is length-delimited but a piece's score and type.)
std::string rename_piece(const std::string& model, size_t index, const std::string& text) {
  size_t at = 0;
  const auto varint = [&](const std::string& b, size_t& i) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto c = static_cast<unsigned char>(b.at(i++));
      v |= uint64_t(c & 127) << shift;
      if (c < 128) return v;
    }
  };
  const auto put_varint = [](uint64_t v) {
    std::string out;
    for (; v >= 128; v >>= 7) out.push_back(static_cast<char>(v | 128));
    return out + static_cast<char>(v);
  };
  size_t seen = 0;
  while (at < model.size()) {
    const size_t start = at;
    const uint64_t tag = varint(model, at);
    EXPECT_EQ(tag & 7, 2u) << "a ModelProto field that is not length-delimited";
    const uint64_t len = varint(model, at);
    if (tag >> 3 == 1 && seen++ == index) {
      const std::string piece = model.substr(at, len);
      size_t p = 0;
      EXPECT_EQ(varint(piece, p), 10u) << "a piece that does not start with its text";
      const uint64_t old_len = varint(piece, p);
      const std::string renamed = "\x0a" + put_varint(text.size()) + text + piece.substr(p + old_len);
      return model.substr(0, start) + "\x0a" + put_varint(renamed.size()) + renamed + model.substr(at + len);
    }
    at += len;
  }
  ADD_FAILURE() << "the model has no piece " << index;
  return model;
}

// Models that break Linea's id convention or SentencePiece's own rules, ids outside the
// vocabulary and training on nothing are named; training is quiet and leaves the log level as
// it found it.
TEST(Tokenizer, BadModelsAndIdsAreNamed) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 200);
  const std::vector<std::string> text = lines_of(dir.file("in.en"));
  std::vector<const std::string*> ptrs;
  for (const std::string& s : text) ptrs.push_back(&s);
  TokenizerTraining t;
  t.vocab_size = 40;
  const int log_level = sentencepiece::logging::GetMinLogLevel();
  sentencepiece::logging::SetMinLogLevel(1);
  testing::internal::CaptureStderr();
  const std::string bytes = train_tokenizer(ptrs, t);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(sentencepiece::logging::GetMinLogLevel(), 1);
  const Tokenizer tok = Tokenizer::from_bytes(bytes);
  EXPECT_EQ(tok.bytes(), bytes);
  EXPECT_LINEA_ERROR(Tokenizer().bytes(), "translate: Tokenizer used before a model was loaded");
  for (const int64_t id : {-1, 40})
    EXPECT_LINEA_ERROR(tok.decode({5, id}),
                       "translate: Tokenizer::decode: id " + std::to_string(id) + " is outside the vocabulary [0, 40)");
  EXPECT_LINEA_ERROR(tok.piece(40), "translate: Tokenizer::piece: id 40 is outside the vocabulary [0, 40)");
  EXPECT_LINEA_ERROR(train_tokenizer({}, t), "translate: no sentences to train the SentencePiece model on");
  // Each special id in the wrong place on its own (-1: the model has no such piece).
  sentencepiece::logging::SetMinLogLevel(2);  // quiet, as train_tokenizer is
  for (const auto& [name, value] :
       std::map<std::string, int>{{"pad_id", -1}, {"unk_id", 4}, {"bos_id", -1}, {"eos_id", -1}}) {
    std::unordered_map<std::string, std::string> args = {{"input", dir.file("in.en")},
                                                         {"model_type", "unigram"},
                                                         {"vocab_size", "40"},
                                                         {"pad_id", "0"},
                                                         {"unk_id", "1"},
                                                         {"bos_id", "2"},
                                                         {"eos_id", "3"}};
    args[name] = std::to_string(value);
    std::string model;
    ASSERT_TRUE(sentencepiece::SentencePieceTrainer::Train(args, nullptr, &model).ok()) << name;
    EXPECT_LINEA_ERROR(Tokenizer::from_bytes(model), "; Linea's models use pad=0 unk=1 bos=2 eos=3");
    EXPECT_LINEA_ERROR(Tokenizer::from_bytes(model), name.substr(0, 3) + "=" + std::to_string(value));
  }
  sentencepiece::logging::SetMinLogLevel(log_level);
  // SentencePiece's own checks: a piece twice or an empty one (a status back), a piece "\0" (an
  // exception from the trie builder, which reads its keys as C strings).
  for (const std::string& piece : {tok.piece(11), std::string(), std::string(1, '\0')}) {
    const std::string bad = rename_piece(bytes, 10, piece);
    EXPECT_LINEA_ERROR(Tokenizer::from_bytes(bad),
                       "translate: cannot load the SentencePiece model (" + std::to_string(bad.size()) + " bytes): ");
  }
}

// ---- dataset -------------------------------------------------------------------------------------

TEST(Dataset, PaddedShiftedBatches) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 120);
  PrepareOptions o = small(dir);
  o.valid_size = o.test_size = 10;
  prepare(o);
  const Manifest m = read_manifest(o.out);
  const Tokenizer src_tok = Tokenizer::from_file(m.src_model), tgt_tok = Tokenizer::from_file(m.tgt_model);
  const ParallelSplit split = read_split(o.out, "valid");
  TranslationDataset ds(split, src_tok, tgt_tok);
  ASSERT_EQ(ds.size(), 10);
  const std::vector<int64_t> idx = {3, 0, 7};
  const linea::nn::Batch b = ds.get_batch(idx);
  int64_t S = 0, T = 0;
  for (int64_t i : idx) {
    S = std::max<int64_t>(S, ds.src_ids(i).size() + 1);
    T = std::max<int64_t>(T, ds.tgt_ids(i).size() + 1);
  }
  EXPECT_EQ(b.at("src").shape(), linea::Shape({3, S}));
  EXPECT_EQ(b.at("tgt_in").shape(), linea::Shape({3, T}));
  EXPECT_EQ(b.at("tgt_out").shape(), linea::Shape({3, T}));
  EXPECT_EQ(b.at("src_pad").dtype(), linea::DType::Bool);
  EXPECT_EQ(b.at("tgt_pad").shape(), linea::Shape({3, T}));
  EXPECT_EQ(b.at("index").to_vector<int64_t>(), idx);
  const auto src = b.at("src").to_vector<int64_t>(), tin = b.at("tgt_in").to_vector<int64_t>(),
             tout = b.at("tgt_out").to_vector<int64_t>();
  const auto spad = b.at("src_pad").to_vector<int64_t>(), tpad = b.at("tgt_pad").to_vector<int64_t>();
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<int64_t>& s = ds.src_ids(idx[r]);
    const std::vector<int64_t>& t = ds.tgt_ids(idx[r]);
    EXPECT_EQ(src_tok.decode(s), split.src[idx[r]]);
    for (int64_t k = 0; k < S; ++k) {
      const int64_t n = static_cast<int64_t>(s.size());
      EXPECT_EQ(src[r * S + k], k < n ? s[k] : k == n ? kEosId : kPadId);
      EXPECT_EQ(spad[r * S + k], k > n);
    }
    for (int64_t k = 0; k < T; ++k) {
      const int64_t n = static_cast<int64_t>(t.size());
      EXPECT_EQ(tin[r * T + k], k == 0 ? kBosId : k <= n ? t[k - 1] : kPadId);
      EXPECT_EQ(tout[r * T + k], k < n ? t[k] : k == n ? kEosId : kPadId);
      EXPECT_EQ(tpad[r * T + k], k > n);
    }
  }
  const std::vector<int64_t> len = ds.lengths();
  for (int64_t i = 0; i < ds.size(); ++i)
    EXPECT_EQ(len[i], static_cast<int64_t>(std::max(ds.src_ids(i).size(), ds.tgt_ids(i).size())) + 1);
  const linea::nn::Example e = ds.get(3);
  EXPECT_EQ(e.at("src").shape(), linea::Shape({static_cast<int64_t>(ds.src_ids(3).size()) + 1}));  // unpadded
  EXPECT_EQ(e.at("index").item<int64_t>(), 3);
  const int64_t longest = *std::max_element(len.begin(), len.end());
  EXPECT_LINEA_ERROR(TranslationDataset(split, src_tok, tgt_tok, longest - 1), "max_len");
  EXPECT_NO_THROW(TranslationDataset(split, src_tok, tgt_tok, longest));
  // Sources and targets swapped, the same bound: one of the two cases holds the longest example
  // on its target side.
  ParallelSplit swapped = split;
  std::swap(swapped.src, swapped.tgt);
  EXPECT_LINEA_ERROR(TranslationDataset(swapped, tgt_tok, src_tok, longest - 1), "max_len");
  EXPECT_LINEA_ERROR(ds.get_batch({2, 10}), "index 10 out of range [0, 10)");
  ParallelSplit short_refs = split;
  short_refs.refs.pop_back();
  EXPECT_LINEA_ERROR(TranslationDataset(short_refs, src_tok, tgt_tok), "10 sources, 10 targets and 9 references");
}

// A prepared folder edited or damaged by hand: each fault named, with the fix.
TEST(Dataset, DamagedFoldersAreNamed) {
  TempDir dir;
  write_pairs(dir.file("in.en"), dir.file("in.es"), 120);
  PrepareOptions o = small(dir);
  o.valid_size = o.test_size = 10;
  prepare(o);
  EXPECT_LINEA_ERROR(read_split(o.out, "dev"), "no split 'dev'", "(train, valid, test)");
  for (const char* f : {"valid.en", "valid.es", "valid.ref"}) {  // a line short in one file
    const std::string keep = read_all(o.out + "/" + f);
    write_all(o.out + "/" + f, keep.substr(0, keep.rfind('\n', keep.size() - 2) + 1));
    EXPECT_LINEA_ERROR(read_split(o.out, "valid"), "should hold 10 pairs", "run `translate prepare` again");
    write_all(o.out + "/" + f, keep);
  }
  EXPECT_EQ(read_split(o.out, "valid").refs.size(), 10u);
  json manifest = json::parse(read_all(o.out + "/data.json"));
  manifest["version"] = 2;
  write_all(o.out + "/data.json", manifest.dump());
  EXPECT_LINEA_ERROR(read_manifest(o.out), "not a version-1 linea-translate-data manifest");
}

}  // namespace
