// Fuzz target: the small parsers of text from users and their files, picked by byte 0 (mod 5);
// the rest of the input is the text.
//   0  apps/tools/bleu.h: utf8_decode / utf8_encode, rstrip, tokenize_13a of one line
//   1  apps/tools/bleu.h: corpus_bleu and corpus_chrf; lines alternate hypothesis, reference
//   2  apps/translate/bible.h: invalid_utf8_at, utf8_length, normalize_space, checked against
//      bleu.h's UTF-8 decoder (two validators of one rule must agree)
//   3  apps/translate/bible.h: map_reference(ref, from, to); byte 1 picks the versifications
//   4  apps/protein/alphabet.h: parse_tokens (protein fill's input) and encode_residues
#include <cmath>

#include "apps/protein/alphabet.h"
#include "apps/tools/bleu.h"
#include "apps/translate/bible.h"
#include "fuzz_util.h"

using namespace linea;
namespace bleu = linea::apps::bleu;

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(text.substr(start, nl - start));
  lines.push_back(text.substr(start));
  return lines;
}

void bleu_line(const std::string& s) {
  std::u32string cps;
  if (fuzz::expect_ok_or_error([&] { cps = bleu::utf8_decode(s); }))
    LINEA_FUZZ_ASSERT(bleu::utf8_encode(cps) == s, "utf8_encode(utf8_decode(s)) != s");
  fuzz::expect_ok_or_error([&] {
    const std::string line = bleu::rstrip(s);
    for (const std::string& tok : bleu::tokenize_13a(line)) {
      LINEA_FUZZ_ASSERT(!tok.empty(), "tokenize_13a gave an empty token");
      for (char32_t c : bleu::utf8_decode(tok)) LINEA_FUZZ_ASSERT(!bleu::is_space(c), "tokenize_13a kept a space");
    }
  });
}

void bleu_corpus(const std::string& text) {
  std::vector<std::string> lines = split_lines(text), hyps;
  std::vector<std::vector<std::string>> refs(1);
  for (size_t i = 0; i + 1 < lines.size(); i += 2) {
    hyps.push_back(lines[i]);
    refs[0].push_back(lines[i + 1]);
  }
  fuzz::expect_ok_or_error([&] {
    const bleu::BleuScore b = bleu::corpus_bleu(hyps, refs);
    // 100 up to rounding: exp of the mean log precision can land a few ulps above it.
    LINEA_FUZZ_ASSERT(std::isfinite(b.score) && b.score >= 0 && b.score <= 100 + 1e-9, "BLEU ", b.score);
  });
  fuzz::expect_ok_or_error([&] {
    const bleu::ChrfScore c = bleu::corpus_chrf(hyps, refs);
    LINEA_FUZZ_ASSERT(std::isfinite(c.score) && c.score >= 0 && c.score <= 100 + 1e-9, "chrF ", c.score);
  });
}

void bible_text(const std::string& s) {
  const int64_t bad = translate::invalid_utf8_at(s);
  bool decodes = true;
  std::u32string cps;
  try {
    cps = bleu::utf8_decode(s);
  } catch (const linea::Error&) {
    decodes = false;
  }
  LINEA_FUZZ_ASSERT((bad < 0) == decodes, "invalid_utf8_at says ", bad, ", utf8_decode ",
                    decodes ? "accepts" : "refuses", " the text");
  LINEA_FUZZ_ASSERT(bad < static_cast<int64_t>(s.size()), "invalid_utf8_at ", bad, " past the end");
  if (!decodes) return;
  LINEA_FUZZ_ASSERT(translate::utf8_length(s) == static_cast<int64_t>(cps.size()), "utf8_length ",
                    translate::utf8_length(s), " but ", cps.size(), " code points");
  const std::string n = translate::normalize_space(s);
  LINEA_FUZZ_ASSERT(translate::invalid_utf8_at(n) < 0, "normalize_space made invalid UTF-8");
  LINEA_FUZZ_ASSERT(translate::normalize_space(n) == n, "normalize_space is not idempotent");
  LINEA_FUZZ_ASSERT(n.empty() || (n.front() != ' ' && n.back() != ' '), "normalize_space left an end space");
  LINEA_FUZZ_ASSERT(n.find("  ") == std::string::npos, "normalize_space left a double space");
}

void bible_reference(uint8_t pick, const std::string& ref) {
  const char* systems[] = {"KJV", "NRSVA", "NRSV", "Vulg", "Synodal", "Leningrad", "Catholic", "nonesuch"};
  const std::string from = systems[pick & 7], to = systems[(pick >> 3) & 7];
  fuzz::expect_ok_or_error([&] { translate::map_reference(ref, from, to); });
}

void protein_tokens(const std::string& s) {
  fuzz::expect_ok_or_error([&] {
    const std::vector<int64_t> ids = protein::parse_tokens(s);
    for (int64_t id : ids) LINEA_FUZZ_ASSERT(id >= 0 && id < protein::kVocabSize, "parse_tokens gave id ", id);
    LINEA_FUZZ_ASSERT(protein::parse_tokens(protein::decode(ids)) == ids,
                      "decode(parse_tokens(s)) reads back as "
                      "other ids");
  });
  fuzz::expect_ok_or_error([&] {
    for (int8_t id : protein::encode_residues(s, "fuzz"))
      LINEA_FUZZ_ASSERT(protein::is_residue(id), "encode_residues gave id ", int(id));
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  if (size < 2) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 5) {
    case 0:
      bleu_line(text);
      break;
    case 1:
      bleu_corpus(text);
      break;
    case 2:
      bible_text(text);
      break;
    case 3:
      bible_reference(data[1], text.substr(1));
      break;
    default:
      protein_tokens(text);
  }
  return 0;
}
