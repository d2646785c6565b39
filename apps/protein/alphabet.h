// The protein app's alphabet: ESM-2's 33 tokens with ESM-2's ids (fair-esm's Alphabet for
// "ESM-1b"/ESM-2), so a token id here means what it means to ESM-2:
//   0 <cls>  1 <pad>  2 <eos>  3 <unk>
//   4..23    the 20 standard residues  L A G V S E R T I D P K Q N F Y M H W C
//   24..28   X B U Z O (unknown, Asx, selenocysteine, Glx, pyrrolysine)
//   29 .  30 -  (gap characters of alignments)
//   31 <null_1> (never produced)  32 <mask>
// A sequence is encoded as <cls> residues... <eos>; FASTA sequences are read as written
// (upper case; anything outside the alphabet, lower case included, is an error naming the
// sequence and the 1-based position).
// Not here: reading FASTA (nn/readers.h), masking and batching (dataset.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace protein {

constexpr int64_t kCls = 0, kPad = 1, kEos = 2, kUnk = 3, kNull = 31, kMask = 32;
constexpr int64_t kVocabSize = 33;
constexpr int64_t kFirstResidue = 4;     // id of 'L'
constexpr int64_t kNumStandard = 20;     // ids 4..23: what a random replacement draws from
constexpr int64_t kNumResidueTokens = 27;  // ids 4..30: every character a sequence may hold
// The characters of ids 4..30, in id order.
inline constexpr const char* kResidueChars = "LAGVSERTIDPKQNFYMHWCXBUZO.-";

// The token's text: "<cls>", "<mask>", "L", ... (id outside [0, 33): a linea::Error).
std::string token_text(int64_t id);
// The id of a residue character, or -1 when it is not one of kResidueChars.
int64_t residue_id(char c);
bool is_residue(int64_t id);  // 4 <= id <= 30
bool is_standard(int64_t id);  // 4 <= id <= 23

// A sequence's residue ids (no <cls>/<eos>). An empty sequence, or a character outside the
// alphabet, is a linea::Error naming `name` (e.g. "DB.fasta.gz: record 12 'tr|W0FSK4|...'")
// and, for a character, it and its 1-based position.
std::vector<int8_t> encode_residues(const std::string& sequence, const std::string& name);
// The inverse: residue ids -> characters (a special id is written as its text, e.g. "<mask>").
std::string decode(const std::vector<int64_t>& ids);
// Text with residues and bracketed special tokens, as `protein fill` takes it:
// "MKT<mask>LL<mask>A" -> ids (no <cls>/<eos> added). Whitespace is skipped (text pasted over
// several lines). An unknown "<...>" or a bad character is an error naming the 1-based position.
std::vector<int64_t> parse_tokens(const std::string& text);

}  // namespace protein
