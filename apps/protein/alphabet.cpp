// The ESM-2 alphabet (alphabet.h): token texts, residue lookups, encoding FASTA sequences and
// parsing `protein fill` text. Every error names the sequence (or text) and the 1-based position.
// Not here: reading FASTA files (nn/readers.h), masking (dataset.h).
#include "alphabet.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace protein {

namespace {

// Specials in id order, with the two that sit after the residues.
constexpr const char* kSpecialText[] = {"<cls>", "<pad>", "<eos>", "<unk>"};
constexpr const char* kNullText = "<null_1>";
constexpr const char* kMaskText = "<mask>";

// char -> residue id, -1 elsewhere; built once from kResidueChars.
const std::array<int8_t, 256>& residue_table() {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    for (int64_t k = 0; k < kNumResidueTokens; ++k)
      t[static_cast<unsigned char>(kResidueChars[k])] = static_cast<int8_t>(kFirstResidue + k);
    return t;
  }();
  return table;
}

// How a character shows in a message: 'x', or 0xNN when it does not print.
std::string show_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (std::isprint(u)) return std::string("'") + c + "'";
  const char* hex = "0123456789ABCDEF";
  return std::string("0x") + hex[u >> 4] + hex[u & 15];
}

}  // namespace

std::string token_text(int64_t id) {
  LINEA_CHECK(id >= 0 && id < kVocabSize, "protein token_text: id ", id, " is outside the alphabet [0, ", kVocabSize,
              ")");
  if (id < kFirstResidue) return kSpecialText[id];
  if (id == kNull) return kNullText;
  if (id == kMask) return kMaskText;
  return std::string(1, kResidueChars[id - kFirstResidue]);
}

int64_t residue_id(char c) { return residue_table()[static_cast<unsigned char>(c)]; }

bool is_residue(int64_t id) { return id >= kFirstResidue && id < kFirstResidue + kNumResidueTokens; }

bool is_standard(int64_t id) { return id >= kFirstResidue && id < kFirstResidue + kNumStandard; }

std::vector<int8_t> encode_residues(const std::string& sequence, const std::string& name) {
  LINEA_CHECK(!sequence.empty(), name, ": empty sequence (a record needs at least one residue)");
  std::vector<int8_t> ids(sequence.size());
  const std::array<int8_t, 256>& table = residue_table();
  for (size_t i = 0; i < sequence.size(); ++i) {
    const int8_t id = table[static_cast<unsigned char>(sequence[i])];
    LINEA_CHECK(id >= 0, name, ": invalid residue ", show_char(sequence[i]), " at position ", i + 1, " of ",
                sequence.size(), " (the alphabet is ", kResidueChars, ", upper case)");
    ids[i] = id;
  }
  return ids;
}

std::string decode(const std::vector<int64_t>& ids) {
  std::string s;
  s.reserve(ids.size());
  for (int64_t id : ids) {
    if (is_residue(id))
      s.push_back(kResidueChars[id - kFirstResidue]);
    else
      s += token_text(id);
  }
  return s;
}

std::vector<int64_t> parse_tokens(const std::string& text) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (c == '<') {
      const size_t close = text.find('>', i);
      LINEA_CHECK(close != std::string::npos, "protein: '<' at position ", i + 1, " of \"", text,
                  "\" is not closed by '>' (special tokens are written <mask>, <cls>, ...)");
      const std::string tok = text.substr(i, close - i + 1);
      int64_t id = -1;
      for (int64_t k = 0; k < kVocabSize; ++k)
        if (!is_residue(k) && token_text(k) == tok) id = k;
      LINEA_CHECK(id >= 0, "protein: unknown token ", tok, " at position ", i + 1, " of \"", text,
                  "\" (known: <cls> <pad> <eos> <unk> <null_1> <mask>)");
      ids.push_back(id);
      i = close;
      continue;
    }
    const int64_t id = residue_id(c);
    LINEA_CHECK(id >= 0, "protein: invalid residue ", show_char(c), " at position ", i + 1, " of \"", text,
                "\" (the alphabet is ", kResidueChars, ", upper case, and <mask>)");
    ids.push_back(id);
  }
  return ids;
}

}  // namespace protein
