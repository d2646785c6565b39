// Fuzz target: loading a SentencePiece model from bytes (apps/translate/tokenizer.h
// Tokenizer::from_bytes: what a translation checkpoint or a prepared folder carries), then using
// what loaded.
// Input layout (FuzzedDataProvider): a text to encode (ConsumeRandomLengthString, at most 128
// bytes: up to a "\" and another byte, "\\" stands for "\"), then the model's bytes (the rest).
// make_seeds.cpp writes models trained by train_tokenizer in this layout. A model that loads
// must encode the text to ids inside its vocabulary, decode them, and name every piece.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>

#include "apps/translate/tokenizer.h"
#include "fuzz_util.h"

using namespace linea;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  FuzzedDataProvider in(data, size);
  const std::string text = in.ConsumeRandomLengthString(128);
  const std::string model = in.ConsumeRemainingBytesAsString();
  translate::Tokenizer tok;
  if (!fuzz::expect_ok_or_error([&] { tok = translate::Tokenizer::from_bytes(model); })) return 0;
  LINEA_FUZZ_ASSERT(tok.loaded() && tok.bytes() == model, "from_bytes: the model's bytes were not kept");
  const int64_t vocab = tok.vocab_size();
  fuzz::expect_ok_or_error([&] {
    const std::vector<int64_t> ids = tok.encode(text);
    for (int64_t id : ids) LINEA_FUZZ_ASSERT(id >= 0 && id < vocab, "encode gave id ", id, " of ", vocab);
    tok.decode(ids);
  });
  fuzz::expect_ok_or_error([&] { tok.pieces(text); });
  for (int64_t id = 0; id < std::min<int64_t>(vocab, 16); ++id) fuzz::expect_ok_or_error([&] { tok.piece(id); });
  // Ids outside the vocabulary are refused, never looked up.
  for (int64_t id : {int64_t{-1}, vocab, int64_t{1} << 40})
    LINEA_FUZZ_ASSERT(!fuzz::expect_ok_or_error([&] { tok.decode({id}); }), "decode accepted id ", id);
  return 0;
}
