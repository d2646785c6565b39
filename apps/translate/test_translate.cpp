// The translate model and its search on toy models (random weights, tiny vocabularies):
// incremental decoding gives the full forward's logits (every decoder mechanism, after beams are
// reordered and sentences dropped); beam search with one beam is greedy search; a beam wide
// enough to keep every hypothesis finds the exhaustive search's best; a batch of sentences of
// different lengths decodes as each sentence alone.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "autograd/ops.h"
#include "core/random.h"
#include "model.h"
#include "search.h"

using namespace linea;
using namespace translate;

namespace {

ModelConfig toy_config(int64_t vocab, const std::string& dec = "softmax", const std::string& enc = "softmax") {
  ModelConfig c;
  c.src_vocab = c.tgt_vocab = vocab;
  c.dim = 16;
  c.heads = 2;
  c.enc_layers = c.dec_layers = 2;
  c.mlp_hidden = 32;
  c.dropout = 0.0;
  c.enc_attention = enc;
  c.dec_attention = dec;
  c.cross_attention = "softmax";
  c.max_len = 32;
  return c;
}

// Sources of the given lengths (tokens 4.. then eos), right-padded: src [B, S], src_pad [B, S].
std::pair<Tensor, Tensor> sources(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  int64_t S = 0;
  for (int64_t l : lengths) S = std::max(S, l);
  std::vector<int64_t> ids;
  std::vector<uint8_t> pad;
  uint64_t x = seed;
  for (int64_t l : lengths)
    for (int64_t i = 0; i < S; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      ids.push_back(i < l - 1 ? 4 + static_cast<int64_t>((x >> 33) % (vocab - 4)) : i == l - 1 ? 3 : 0);
      pad.push_back(i >= l);
    }
  const int64_t B = static_cast<int64_t>(lengths.size());
  Tensor p = from_vector<int64_t>(std::vector<int64_t>(pad.begin(), pad.end()), {B, S}) != 0.0;
  return {from_vector<int64_t>(ids, {B, S}), p};
}

}  // namespace

TEST(TranslateModel, IncrementalDecodingMatchesTheFullForward) {
  for (const std::string dec : {"softmax", "performer:features=16", "nprf_rpe:features=16"}) {
    SCOPED_TRACE(dec);
    manual_seed(3);
    Seq2Seq model(toy_config(12, dec, dec == "softmax" ? "lara:samples=4" : dec));
    model.eval();
    NoGradGuard ng;
    auto [src, pad] = sources({5, 3}, 12, 1);
    Tensor tgt = from_vector<int64_t>({2, 5, 6, 7, 8, 2, 9, 4, 11, 10}, {2, 5});
    Tensor memory = model.encode(src, pad);
    Tensor full = model.decode(tgt, memory, pad);  // [2, 5, V]
    attn::DecoderState st = model.start(memory, pad);
    for (int64_t t = 0; t < 5; ++t) {
      Tensor step = model.step(select(tgt, 1, t).contiguous(), st);
      EXPECT_LT(max(abs(step - select(full, 1, t))).item(), 1e-4) << "position " << t;
    }
    // Dropping sentence 0 leaves sentence 1's rows as they were.
    attn::DecoderState st2 = model.start(memory, pad);
    model.step(select(tgt, 1, 0).contiguous(), st2);
    st2.keep_sentences(from_vector<int64_t>({1}, {1}), 1);
    Tensor next = model.step(narrow(select(tgt, 1, 1), 0, 1, 1).contiguous(), st2);
    EXPECT_LT(max(abs(next - narrow(select(full, 1, 1), 0, 1, 1))).item(), 1e-4);
  }
}

TEST(TranslateSearch, OneBeamIsGreedy) {
  manual_seed(5);
  Seq2Seq model(toy_config(20));
  model.eval();
  NoGradGuard ng;
  auto [src, pad] = sources({6, 4, 9}, 20, 7);
  SearchOptions o;
  o.beam = 1;
  std::vector<Hypothesis> g = greedy_search(model, src, pad, o);
  auto b = beam_search(model, src, pad, o);
  ASSERT_EQ(g.size(), 3u);
  size_t produced = 0;  // the test means something only if the searches produce tokens
  for (const Hypothesis& h : g) produced += h.tokens.size();
  EXPECT_GE(produced, 6u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(b[i].size(), 1u);
    EXPECT_EQ(b[i][0].tokens, g[i].tokens);
    EXPECT_NEAR(b[i][0].log_prob, g[i].log_prob, 1e-9);
  }
}

// log P(tokens + eos | source) by the full forward.
double sequence_log_prob(Seq2Seq& model, const Tensor& src, const Tensor& pad, const std::vector<int64_t>& tokens) {
  std::vector<int64_t> in{2};
  in.insert(in.end(), tokens.begin(), tokens.end());
  std::vector<int64_t> target = tokens;
  target.push_back(3);
  const int64_t T = static_cast<int64_t>(in.size());
  Tensor lp = log_softmax(model.forward(src, pad, from_vector<int64_t>(in, {1, T})), 2);
  const std::vector<float> v = lp.to_vector<float>();
  const int64_t V = lp.size(2);
  double s = 0;
  for (int64_t t = 0; t < T; ++t) s += v[t * V + target[t]];
  return s;
}

TEST(TranslateSearch, WideBeamFindsTheExhaustiveBest) {
  // Two real tokens (4, 5), at most 3 output tokens with eos: 7 possible outputs, all kept by 8 beams.
  manual_seed(11);
  Seq2Seq model(toy_config(6));
  model.eval();
  NoGradGuard ng;
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto [src, pad] = sources({4}, 6, seed);
    SearchOptions o;
    o.beam = 8;
    o.nbest = 7;
    o.len_penalty = 0;
    o.max_len_ratio = 0;
    o.max_len_extra = 3;
    auto hyps = beam_search(model, src, pad, o)[0];
    ASSERT_EQ(hyps.size(), 7u);
    std::vector<std::vector<int64_t>> all{{}, {4}, {5}, {4, 4}, {4, 5}, {5, 4}, {5, 5}};
    double best = -1e30;
    std::vector<int64_t> arg;
    for (const auto& seq : all) {
      const double lp = sequence_log_prob(model, src, pad, seq);
      if (lp > best) best = lp, arg = seq;
    }
    EXPECT_EQ(hyps[0].tokens, arg);
    EXPECT_NEAR(hyps[0].log_prob, best, 1e-4);
    for (const Hypothesis& h : hyps) EXPECT_NEAR(h.log_prob, sequence_log_prob(model, src, pad, h.tokens), 1e-4);
    for (size_t i = 1; i < hyps.size(); ++i) EXPECT_GE(hyps[i - 1].score, hyps[i].score);
  }
}

TEST(TranslateSearch, BatchDecodesAsEachSentenceAlone) {
  manual_seed(13);
  Seq2Seq model(toy_config(30, "performer:features=16"));
  model.eval();
  NoGradGuard ng;
  const std::vector<int64_t> lengths{7, 3, 11, 5};
  auto [src, pad] = sources(lengths, 30, 17);
  SearchOptions o;
  o.beam = 4;
  o.nbest = 2;
  o.max_len_ratio = 1.0;
  o.max_len_extra = 2;
  auto batch = beam_search(model, src, pad, o);
  auto greedy = greedy_search(model, src, pad, o);
  std::set<size_t> out_lengths;  // sentences must end at different steps for the test to mean something
  for (const auto& h : batch) out_lengths.insert(h[0].tokens.size());
  EXPECT_GE(out_lengths.size(), 2u);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t l = lengths[i];
    Tensor s1 = narrow(narrow(src, 0, i, 1), 1, 0, l).contiguous(), p1 = narrow(narrow(pad, 0, i, 1), 1, 0, l).contiguous();
    auto alone = beam_search(model, s1, p1, o)[0];
    ASSERT_EQ(batch[i].size(), alone.size());
    for (size_t k = 0; k < alone.size(); ++k) {
      EXPECT_EQ(batch[i][k].tokens, alone[k].tokens) << "sentence " << i << " hypothesis " << k;
      EXPECT_NEAR(batch[i][k].score, alone[k].score, 1e-4);
      EXPECT_LE(static_cast<int64_t>(batch[i][k].tokens.size()) + 1, max_output_length(model.config(), o, l));
    }
    EXPECT_EQ(greedy[i].tokens, greedy_search(model, s1, p1, o)[0].tokens);
  }
  // Without the caches: the same hypotheses.
  auto recomputed = greedy_search_recompute(model, src, pad, o);
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(recomputed[i].tokens, greedy[i].tokens);
    EXPECT_NEAR(recomputed[i].log_prob, greedy[i].log_prob, 1e-4);
  }
}
