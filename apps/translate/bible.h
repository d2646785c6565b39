// The translate app's Bible corpus: the World English Bible (SWORD module engWEB2015eb, NRSVA
// versification) and the Reina-Valera 1909 (spaRV1909eb, KJV versification), read with the SWORD
// C++ library and aligned verse by verse into English-Spanish pairs.
//
// What reading does to the modules' text, each for a measured reason:
//  - OSIS markup goes through SWORD's plain-text filters (stripText) after three fixes to the raw
//    entry: footnotes are cut out with a space where the note sat between two words (WEB writes
//    "God<note>..</note><w>created", which the filter renders "Godcreated"); <w> word tags are
//    dropped (with two Strong's numbers in one lemma, the filter leaks "<G5547>" into the text);
//    and a space is put where RV's <transChange> added words touch a word ("enviada<..>por"),
//    except before an enclitic pronoun ("sáca"+"lo").
//  - WEB's canonical psalm titles ("A Psalm by David.") sit in a pre-verse heading that
//    stripText drops; RV has them inside verse 1, so they are put back in front of verse 1.
//  - Text after a book's end marker is not verse text (WEB's glossary follows Rev.22.21).
//  - RV writes each chapter's first word in capitals ("EN el principio", "Y YO me paré"): that
//    run of capitalized words in a chapter's first verse is re-cased, sentence-initial words
//    capitalized, others as the word is most often written elsewhere in RV ("Jehová", "yo").
//  - Whitespace is collapsed (poetry has line breaks) and trimmed.
// Alignment: each English verse is mapped to the target versification with SWORD's mapping
// (VerseKey::positionFrom: NRSVA 3John.1.15 -> KJV 3John.1.14); verses of books the target lacks
// (a VerseKey set to one silently lands on Genesis) are dropped. RV stores its own verse numbers
// in KJV's slots, so in some chapters (Num 13, 1Sam 24, Job 38-40, Hos 12, Jonah 2, ...) slot N
// holds another verse, a slot is empty, or the chapter's last slot holds several verses. So each
// book is aligned again, as sentence aligners do: a monotone dynamic-programming alignment that
// pairs verses or leaves them unpaired, scoring a pair by its length ratio (Gale & Church) and by
// word overlap through a lexicon learned from the corpus itself, and preferring the mapped slot.
// Pairs whose lengths still disagree (a verse split differently) are dropped. Every source verse
// not paired is counted by reason.
// Measured with Debian's modules (SWORD 1.9.0, engWEB2015eb 426.0, spaRV1909eb 2.60): 37,791
// English verses, 6,687 of them in the 17 books KJV lacks (Tob ... 4Macc); 31,102 Spanish. The
// other 31,104 map onto the 31,102 KJV verses (NRSVA's 3John.1.15 and Rev.12.18, both empty in
// WEB, map onto verses already taken), and 31,077 of those have text on both sides (7 English and
// 18 Spanish verses are empty), as counted by reference. After the alignment: 31,038 pairs, 178
// of them realigned (14 of the 18 empty Spanish slots have their verse elsewhere); dropped 20
// unaligned, 33 length mismatches, 4 empty Spanish verses; 2,209 footnotes cut, 1,188 RV chapter
// openings re-cased (test_translate_data pins these). Reading and aligning take about 3 s.
// Not here: splitting, tokenizing and writing the data (prepare.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace translate {

// A module missing from SWORD (or SWORD's library missing, or SWORD_PATH pointing elsewhere) is
// a linea::Error that names it and the Debian package that installs it.
struct BibleOptions {
  std::string src_module = "engWEB2015eb";  // English (source)
  std::string tgt_module = "spaRV1909eb";   // Spanish (target)
  std::string sword_path;  // a SWORD library folder (mods.d/, modules/); empty: SWORD's own search
};

struct VersePair {
  std::string ref;  // OSIS reference of the source verse ("Gen.1.1")
  std::string src, tgt;
};

struct BibleStats {
  std::string sword_version;
  std::string src_module, tgt_module, src_versification, tgt_versification;
  int64_t src_verses = 0, tgt_verses = 0;  // verses each module's versification has (read, incl. empty)
  int64_t pairs = 0;
  // Source verses not paired, by reason: "book_missing_in_tgt", "unmappable" (no target verse),
  // "duplicate_mapping" (two source verses map to one target verse), "src_empty", "tgt_empty",
  // "unaligned" (left unpaired by the alignment), "length_mismatch".
  std::map<std::string, int64_t> dropped;
  std::map<std::string, int64_t> missing_books;  // source book -> verses, for books the target lacks
  int64_t tgt_unused = 0;       // target verses with text that no kept pair uses
  int64_t mapped = 0;           // kept pairs whose reference differs between the versifications
  int64_t realigned = 0;        // kept pairs whose target verse is not at the mapped slot (RV numbering)
  int64_t recased = 0;          // RV chapter openings re-cased ("EN el principio" -> "En el principio")
  int64_t notes_removed = 0;    // footnotes cut out (both modules)
  int64_t titles_restored = 0;  // WEB psalm titles put back in front of verse 1
};

struct BibleCorpus {
  std::vector<VersePair> pairs;  // in the source's canonical order
  BibleStats stats;
};

BibleCorpus read_bible(const BibleOptions& options = {});

std::string book_of(const std::string& ref);  // "1John.2.3" -> "1John"

// `ref` ("Rev.12.18") of versification `from` as SWORD maps it to versification `to`
// ("Rev.12.17" for NRSVA -> KJV); "" when `to` lacks the book. For tests and stats.
std::string map_reference(const std::string& ref, const std::string& from, const std::string& to);

// The text cleaning shared with user data: runs of whitespace (ASCII and Unicode spaces,
// line breaks) collapsed to one space, the ends trimmed. `s` must be valid UTF-8.
std::string normalize_space(const std::string& s);
// Byte offset of the first invalid UTF-8 sequence in s, or -1 when s is valid.
int64_t invalid_utf8_at(const std::string& s);
int64_t utf8_length(const std::string& s);  // code points
// The lowercase of a Latin capital (ASCII, Latin-1 and Latin Extended-A), else cp itself: what the re-casing
// of chapter openings and the word matching use.
int32_t lower_cp(int32_t cp);

}  // namespace translate
