// The translate model and its search on toy models (random weights, tiny vocabularies):
// incremental decoding gives the full forward's logits (every decoder mechanism, after beams are
// reordered and sentences dropped); beam search with one beam is greedy search; a beam wide
// enough to keep every hypothesis returns them all, best first; beam search gives what its
// definition does (a plain reference over the full forward); a batch of sentences of different
// lengths decodes as each sentence alone. End to end on generated data (a toy language
// pair: a word-for-word mapping): training learns it (test BLEU), writes its outputs and best
// checkpoint, resumes exactly; separate vocabularies; each evaluation scores what it says (its
// split, weights and search); a Translator decodes in eval mode and leaves a training model
// training; `translate decode` gives the training run's own test hypotheses, reads stdin and CRLF
// lines, writes n-best lists numbered over the whole input whatever its buffer;
// translate-bench-decode's records on the trained checkpoint; bad input gets a clear error.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/common/metrics.h"
#include "apps/tools/bleu.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "dataset.h"
#include "model.h"
#include "nn/safetensors.h"
#include "prepare.h"
#include "search.h"
#include "tests/test_util.h"
#include "toy_data.h"
#include "train.h"
#include "translator.h"

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

// Two source sentences (5 and 3 tokens) with 5-token targets, through `model` (in eval, no grad):
// {the sources' padding, the targets, the memory, the full decode [2, 5, V]}.
std::tuple<Tensor, Tensor, Tensor, Tensor> decode_two_sentences(Seq2Seq& model) {
  auto [src, pad] = sources({5, 3}, 12, 1);
  Tensor tgt = from_vector<int64_t>({2, 5, 6, 7, 8, 2, 9, 4, 11, 10}, {2, 5});
  Tensor memory = model.encode(src, pad);
  Tensor full = model.decode(tgt, memory, pad);
  return {pad, tgt, memory, full};
}

TEST(TranslateModel, IncrementalDecodingMatchesTheFullForward) {
  for (const std::string dec : {"softmax", "performer:features=16", "nprf_rpe:features=16"}) {
    SCOPED_TRACE(dec);
    manual_seed(3);
    Seq2Seq model(toy_config(12, dec, dec == "softmax" ? "lara:samples=4" : dec));
    model.eval();
    NoGradGuard ng;
    Tensor pad, tgt, memory, full;
    std::tie(pad, tgt, memory, full) = decode_two_sentences(model);
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

// Learned positions: the source table moves the memory, the target table the logits, and a
// decoding step reads the target table at its own position (the incremental decode matches the
// full one); the embeddings start with a zero <pad> row, and with separate vocabularies the
// source's <pad> row gets no gradient (padded keys are masked and padded queries' outputs unused,
// so this holds with or without padding_idx; the op's own test covers padding_idx).
TEST(TranslateModel, LearnedPositionsAndPadRows) {
  manual_seed(5);
  ModelConfig c = toy_config(12);
  c.positions = "learned";
  c.joint_vocab = false;
  Seq2Seq model(c);
  std::map<std::string, Tensor> params;
  for (const auto& [name, t] : model.named_parameters()) params[name] = t;
  for (const char* name : {"src_embed.weight", "tgt_embed.weight"}) {
    EXPECT_EQ(sum(abs(select(params.at(name), 0, c.pad_id))).item(), 0.0) << name;
    EXPECT_GT(sum(abs(select(params.at(name), 0, 4))).item(), 0.0) << name;
  }
  model.eval();
  Tensor pad, tgt, memory, full;
  {
    NoGradGuard ng;
    std::tie(pad, tgt, memory, full) = decode_two_sentences(model);
    attn::DecoderState st = model.start(memory, pad);
    for (int64_t t = 0; t < 5; ++t)
      EXPECT_LT(max(abs(model.step(select(tgt, 1, t).contiguous(), st) - select(full, 1, t))).item(), 1e-4) << t;
    for (const char* name : {"src_pos.weight", "tgt_pos.weight"}) {
      Tensor table = params.at(name);
      const Tensor before = clone(table);
      manual_seed(6);  // (not a constant: each pre-LN LayerNorm would take it out again)
      table.copy_(table + randn(table.shape()));
      Tensor pad2, tgt2, memory2, full2;
      std::tie(pad2, tgt2, memory2, full2) = decode_two_sentences(model);
      EXPECT_EQ(linea::test::all_close(memory2, memory, 1e-6, 1e-6), std::string(name) == "tgt_pos.weight") << name;
      EXPECT_FALSE(linea::test::all_close(full2, full, 1e-6, 1e-6)) << name;
      table.copy_(before);
    }
  }
  model.zero_grad();
  auto [src, src_pad] = sources({5, 3}, 12, 1);
  sum(model.decode(tgt, model.encode(src, src_pad), src_pad)).backward();
  EXPECT_EQ(sum(abs(select(params.at("src_embed.weight").grad(), 0, c.pad_id))).item(), 0.0);
  EXPECT_GT(sum(abs(params.at("src_embed.weight").grad())).item(), 0.0);
}

// Settings that cannot make a model, and inputs it cannot take, are named.
TEST(TranslateModel, BadSettingsAndInputsAreNamed) {
  const auto bad = [](const std::function<void(ModelConfig&)>& edit) {
    ModelConfig c = toy_config(12);
    edit(c);
    Seq2Seq m(c);
  };
  const std::string vocab = "translate: vocabulary sizes must exceed the 4 special tokens, got ";
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.joint_vocab = false, c.src_vocab = 3; }), vocab + "3 and 12");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.joint_vocab = false, c.tgt_vocab = 3; }), vocab + "12 and 3");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.tgt_vocab = 13; }),
                     "translate: a joint vocabulary needs equal sizes, got 12 and 13");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.dim = -16; }),
                     "translate: --dim -16 must be a positive multiple of --heads 2");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.heads = 3; }),
                     "translate: --dim 16 must be a positive multiple of --heads 3");
  const std::string sizes = "translate: layers, --mlp-hidden and --max-len must be positive, got ";
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.enc_layers = 0; }), sizes + "0, 2, 32, 32");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.dec_layers = 0; }), sizes + "2, 0, 32, 32");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.mlp_hidden = 0; }), sizes + "2, 2, 0, 32");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.max_len = 1; }), sizes + "2, 2, 32, 1");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& c) { c.positions = "rotary"; }),
                     "translate: --positions must be sinusoidal, learned or none, got 'rotary'");
  bad([](ModelConfig& c) { c.positions = "none"; });
  bad([](ModelConfig& c) { c.joint_vocab = false, c.tgt_vocab = 13; });  // separate vocabularies differ freely
  ModelConfig c = toy_config(12);
  c.max_len = 6;
  Seq2Seq model(c);
  model.eval();
  NoGradGuard ng;
  auto [src, pad] = sources({5, 3}, 12, 1);
  EXPECT_LINEA_ERROR(model.encode(src.to(DType::Float32), pad),
                     "translate: expected token ids Int64 [B, L], got float32 [2, 5]");
  const Tensor memory = model.encode(src, pad);
  attn::DecoderState st = model.start(memory, pad);
  EXPECT_LINEA_ERROR(model.step(from_vector<int64_t>({2, 2}, {2, 1}), st),
                     "translate: step expects tokens [B], got [2, 1]");
  for (int64_t t = 0; t < 6; ++t) model.step(from_vector<int64_t>({2, 2}, {2}), st);
  EXPECT_LINEA_ERROR(model.step(from_vector<int64_t>({2, 2}, {2}), st),
                     "translate: a sequence of 7 tokens is longer than the model's maximum of 6 (--max-len)");
}

// Beam search reorders whole sentences (keep_sentences) with several beams each: a position-aware
// decoder reads one copy of the memory per beam, which must follow the sentences even when their
// count stays the same (here the two sentences swap places).
TEST(TranslateModel, KeptSentencesCarryTheirMemoryToEveryBeam) {
  for (const std::string spec : {"softmax", "nprf_rpe:features=16"}) {
    SCOPED_TRACE(spec);
    manual_seed(4);
    ModelConfig config = toy_config(12, spec);
    config.cross_attention = spec;
    Seq2Seq model(config);
    model.eval();
    NoGradGuard ng;
    Tensor pad, tgt, memory, full;  // (not structured bindings: C++17 lambdas cannot capture those)
    std::tie(pad, tgt, memory, full) = decode_two_sentences(model);
    // Rows [sentence][beam], 2 beams each; the tokens of row r are those of sentence rows[r].
    const auto step_rows = [&](attn::DecoderState& st, int64_t t, const std::vector<int64_t>& rows) {
      const Tensor idx = from_vector<int64_t>(rows, {static_cast<int64_t>(rows.size())});
      const Tensor got = model.step(index_select(select(tgt, 1, t), 0, idx).contiguous(), st);
      const Tensor want = index_select(select(full, 1, t), 0, idx);
      EXPECT_LT(max(abs(got - want)).item(), 1e-4) << "position " << t;
    };
    attn::DecoderState st = model.start(memory, pad);
    step_rows(st, 0, {0, 0, 1, 1});
    st.keep_sentences(from_vector<int64_t>({1, 0}, {2}), 2);
    step_rows(st, 1, {1, 1, 0, 0});
    step_rows(st, 2, {1, 1, 0, 0});
  }
}

// The longest output: ratio x source tokens + extra, at least 1, never past the model's max_len.
TEST(TranslateSearch, MaxOutputLength) {
  const ModelConfig c = toy_config(8);  // max_len 32
  SearchOptions o;
  o.max_len_ratio = 1.5;
  o.max_len_extra = 2;
  EXPECT_EQ(max_output_length(c, o, 4), 8);
  EXPECT_EQ(max_output_length(c, o, 5), 9);    // floor(7.5) + 2
  EXPECT_EQ(max_output_length(c, o, 30), 32);  // 47, past max_len
  o.max_len_ratio = 0;
  o.max_len_extra = 0;
  EXPECT_EQ(max_output_length(c, o, 4), 1);
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

TEST(TranslateSearch, WideBeamFindsEveryHypothesis) {
  // Three tokens it may produce (unk 1 and the real 4, 5; never pad 0 or bos 2), at most 3 output
  // tokens with eos: 13 possible outputs, all kept by 16 beams and returned best first, each with
  // its log-probability by the full forward.
  manual_seed(11);
  Seq2Seq model(toy_config(6));
  model.eval();
  NoGradGuard ng;
  std::vector<std::vector<int64_t>> all{{}};
  for (int64_t a : {1, 4, 5}) {
    all.push_back({a});
    for (int64_t b : {1, 4, 5}) all.push_back({a, b});
  }
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto [src, pad] = sources({4}, 6, seed);
    SearchOptions o;
    o.beam = 16;
    o.nbest = 16;
    o.len_penalty = 0;
    o.max_len_ratio = 0;
    o.max_len_extra = 3;
    auto hyps = beam_search(model, src, pad, o)[0];
    ASSERT_EQ(hyps.size(), all.size());
    std::vector<std::pair<double, std::vector<int64_t>>> want;
    for (const auto& seq : all) want.emplace_back(sequence_log_prob(model, src, pad, seq), seq);
    std::stable_sort(want.begin(), want.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    for (size_t i = 0; i < hyps.size(); ++i) {
      EXPECT_EQ(hyps[i].tokens, want[i].second) << "hypothesis " << i;
      EXPECT_NEAR(hyps[i].log_prob, want[i].first, 1e-4);
      EXPECT_EQ(hyps[i].score, hyps[i].log_prob);  // len_penalty 0
    }
  }
}

// Beam search as search.h defines it, for one unpadded sentence (src [1, S]), each step's
// log-probabilities by the full forward over the hypothesis so far: the reference for the
// batched, incremental beam_search.
std::vector<Hypothesis> reference_beam_search(Seq2Seq& model, const Tensor& src, const Tensor& pad,
                                              const SearchOptions& o) {
  const ModelConfig& c = model.config();
  const int64_t K = o.beam, V = c.tgt_vocab;
  const int64_t max_len = max_output_length(c, o, src.size(1));
  struct Candidate {
    double log_prob;
    size_t beam;
    int64_t token;
  };
  std::vector<Hypothesis> beams(1), finished;
  for (int64_t t = 0;; ++t) {
    std::vector<Candidate> cand;  // beam by beam, token by token: ties go to the earlier
    for (size_t j = 0; j < beams.size(); ++j) {
      std::vector<int64_t> in{c.bos_id};
      in.insert(in.end(), beams[j].tokens.begin(), beams[j].tokens.end());
      const Tensor logits = model.forward(src, pad, from_vector<int64_t>(in, {1, t + 1}));
      const std::vector<float> lp = log_softmax(select(select(logits, 0, 0), 0, t), 0).to_vector<float>();
      for (int64_t v = 0; v < V; ++v)
        if (v != c.pad_id && v != c.bos_id && (v == c.eos_id || t + 1 < max_len))
          cand.push_back({beams[j].log_prob + lp[static_cast<size_t>(v)], j, v});
    }
    std::stable_sort(cand.begin(), cand.end(), [](const auto& x, const auto& y) { return x.log_prob > y.log_prob; });
    cand.resize(std::min<size_t>(cand.size(), 2 * K));
    std::vector<Hypothesis> next;
    for (size_t i = 0; i < cand.size(); ++i) {
      Hypothesis h{beams[cand[i].beam].tokens, cand[i].log_prob, 0};
      if (cand[i].token == c.eos_id) {  // ends a hypothesis among the first K only
        h.score = h.log_prob / std::pow(static_cast<double>(t + 1), o.len_penalty);
        if (i < static_cast<size_t>(K) && finished.size() < static_cast<size_t>(K)) finished.push_back(h);
      } else if (next.size() < static_cast<size_t>(K)) {
        h.tokens.push_back(cand[i].token);
        next.push_back(h);
      }
    }
    if (finished.size() >= static_cast<size_t>(K) || next.empty()) break;
    beams = next;
  }
  std::stable_sort(finished.begin(), finished.end(), [](const auto& x, const auto& y) { return x.score > y.score; });
  finished.resize(std::min<size_t>(finished.size(), o.nbest));
  return finished;
}

// Beam search against its definition, sentence by sentence of a batch: on a small vocabulary, where
// the end token often ranks among a step's 2K best before the last step (hypotheses of several
// lengths, some ends past the first K), and on a model whose tokens all tie (zero embeddings:
// uniform log-probabilities), where the order among equal candidates decides (the earlier beam,
// then the smaller token).
TEST(TranslateSearch, BeamSearchFollowsItsDefinition) {
  NoGradGuard ng;
  const std::vector<int64_t> lengths{6, 2, 4, 5, 3};
  SearchOptions o;
  o.beam = 4;
  o.nbest = 3;  // fewer than the beams: the best 3 of the (up to) 4 finished
  o.len_penalty = 1.0;
  o.max_len_ratio = 1.0;
  o.max_len_extra = 2;
  for (const bool ties : {false, true}) {
    SCOPED_TRACE(ties ? "every token ties" : "random weights");
    manual_seed(19);
    Seq2Seq model(toy_config(8));
    model.eval();
    std::map<std::string, Tensor> param;
    for (const auto& [name, p] : model.named_parameters()) param[name] = p;
    if (ties) {
      param.at("embed.weight").zero_();
    } else {  // the end token likelier at every step: the last norm's bias along its embedding
      param.at("decoder.norm.bias").copy_(mul(select(param.at("embed.weight"), 0, 3), 3.0));
    }
    auto [src, pad] = sources(lengths, 8, 23);
    const auto batch = beam_search(model, src, pad, o);
    std::set<size_t> out_lengths;  // the test means something only if hypotheses end at different steps
    for (size_t i = 0; i < lengths.size(); ++i) {
      SCOPED_TRACE("sentence " + std::to_string(i));
      const int64_t l = lengths[i];
      const Tensor s1 = narrow(narrow(src, 0, i, 1), 1, 0, l).contiguous();
      const Tensor p1 = narrow(narrow(pad, 0, i, 1), 1, 0, l).contiguous();
      const auto want = reference_beam_search(model, s1, p1, o);
      ASSERT_EQ(batch[i].size(), want.size());
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(batch[i][k].tokens, want[k].tokens) << "hypothesis " << k;
        EXPECT_NEAR(batch[i][k].log_prob, want[k].log_prob, 1e-4);
        EXPECT_NEAR(batch[i][k].score, want[k].score, 1e-4);
        out_lengths.insert(want[k].tokens.size());
      }
    }
    EXPECT_GE(out_lengths.size(), 3u);
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
    const double length = static_cast<double>(greedy[i].tokens.size() + 1);
    EXPECT_NEAR(greedy[i].score, greedy[i].log_prob / std::pow(length, o.len_penalty), 1e-9);
  }
  // Without the caches: the same hypotheses.
  auto recomputed = greedy_search_recompute(model, src, pad, o);
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(recomputed[i].tokens, greedy[i].tokens);
    EXPECT_NEAR(recomputed[i].log_prob, greedy[i].log_prob, 1e-4);
  }
}

// ---- end to end on a toy language pair ------------------------------------------------------------

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using linea::test::TempDir;
using translate::test::write_toy_pair;

// `prepare` settings for the toy pair, written into `dir` (into <dir>/data: 700 / 50 / 50 pairs).
PrepareOptions toy_prepare_options(const TempDir& dir) {
  write_toy_pair(dir.file("src.txt"), dir.file("tgt.txt"));
  PrepareOptions p;
  p.src_file = dir.file("src.txt");
  p.tgt_file = dir.file("tgt.txt");
  p.out = dir.file("data");
  p.valid_size = p.test_size = 50;
  p.vocab_size = 64;
  return p;
}

// The toy data, prepared once for every test of this file.
const std::string& toy_data() {
  static TempDir dir;  // removed when the process exits
  static const std::string data = [] {
    const PrepareOptions p = toy_prepare_options(dir);
    prepare(p);
    return p.out;
  }();
  return data;
}

TrainOptions toy_options(const std::string& out, int64_t epochs) {
  TrainOptions o;
  o.data_dir = toy_data();
  o.model.dim = 32;
  o.model.heads = 2;
  o.model.enc_layers = o.model.dec_layers = 1;
  o.model.mlp_hidden = 64;
  o.model.dropout = 0.1;
  o.model.max_len = 64;
  o.max_tokens = 256;
  o.epochs = epochs;
  o.lr = 3e-3;
  o.warmup = 100;
  o.patience = 0;
  o.search.beam = 3;
  o.run.out_dir = out;
  o.run.device = "cpu";
  o.run.progress = false;
  o.run.plot = true;
  o.run.log_every = 20;
  return o;
}

using linea::test::Shell;
Shell run_translate(const std::string& args, const TempDir& dir) {
  return linea::test::run_shell(TRANSLATE_EXE, args, dir.file("translate_output.txt"));
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

// Each sentence scored alone: the mean negative log-likelihood per target token of `data` (the
// end token counted, no padding, no smoothing), the definition the padded evaluation batches
// must give.
double loss_sentence_by_sentence(Seq2Seq& model, const TranslationDataset& data) {
  NoGradGuard ng;
  model.eval();
  const ModelConfig& mc = model.config();
  double nll = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < data.size(); ++i) {
    std::vector<int64_t> src = data.src_ids(i), in = {mc.bos_id}, target = data.tgt_ids(i);
    src.push_back(mc.eos_id);
    in.insert(in.end(), target.begin(), target.end());
    target.push_back(mc.eos_id);
    const auto S = static_cast<int64_t>(src.size()), T = static_cast<int64_t>(target.size());
    const Tensor logits = model.forward(from_vector<int64_t>(src, {1, S}), zeros({1, S}, TensorOptions(DType::Bool)),
                                        from_vector<int64_t>(in, {1, T}));
    nll += cross_entropy(logits.reshape({T, -1}), from_vector<int64_t>(target, {T}), -100, 0.0, Reduction::Sum).item();
    tokens += T;
  }
  return nll / static_cast<double>(tokens);
}

}  // namespace

TEST(TranslateApp, TrainsWritesOutputsAndDecodes) {
  TempDir run;
  TrainOptions o = toy_options(run.file("run"), 50);
  o.ema = 0.99;
  const TrainReport report = run_training(o);
  const std::string out = o.run.out_dir;
  const json summary = linea::apps::read_json_file(out + "/summary.json", "test");
  EXPECT_EQ(report.test_bleu, summary.at("test_bleu").get<double>());
  // The toy pair is learnable: a word-for-word mapping (a broken model or search stays near 0).
  EXPECT_GT(summary.at("test_bleu").get<double>(), 50.0);
  EXPECT_GT(summary.at("test_bleu_greedy").get<double>(), 50.0);
  for (const char* k : {"test_loss", "test_ppl", "test_chrf", "best_valid_bleu", "best_step", "bleu_signature",
                        "bleu_verbose", "chrf_signature", "train_tokens_per_s", "decode_beam_sentences_per_s",
                        "decode_greedy_sentences_per_s", "decode_beam_tokens_per_s", "decode_greedy_tokens_per_s"})
    EXPECT_TRUE(summary.contains(k)) << k;
  EXPECT_EQ(summary.at("beam").get<int64_t>(), 3);
  EXPECT_EQ(summary.at("len_penalty").get<double>(), o.search.len_penalty);
  EXPECT_EQ(summary.at("hypotheses"), json({{"beam", out + "/test.beam.es"}, {"greedy", out + "/test.greedy.es"}}));
  EXPECT_EQ(summary.at("ema_decay").get<double>(), 0.99);
  EXPECT_EQ(summary.at("bleu_signature").get<std::string>(), "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.3.1");
  EXPECT_EQ(lines_of(out + "/test.beam.es").size(), 50u);
  EXPECT_EQ(lines_of(out + "/test.greedy.es").size(), 50u);
  int epochs = 0;
  for (const json& r : linea::apps::MetricsLog::read(out + "/metrics.jsonl"))
    if (r.at("type") == "epoch") {
      ++epochs;
      for (const char* k : {"valid_loss", "valid_ppl", "valid_bleu", "valid_decode_sentences_per_s", "tokens_per_s"})
        EXPECT_TRUE(r.contains(k)) << k;
    }
  EXPECT_EQ(epochs, 50);
  EXPECT_EQ(linea::test::read_all(out + "/curves.png").substr(0, 4), "\x89PNG");  // no file: "" (a failure, not a throw)
  for (const char* f : {"model.safetensors", "config.json", "spm.model"})
    EXPECT_TRUE(fs::exists(out + "/checkpoint/best/" + std::string(f))) << f;
  // The best checkpoint is the one with the best valid BLEU of the epoch records.
  double best = -1;
  for (const json& r : linea::apps::MetricsLog::read(out + "/metrics.jsonl"))
    if (r.at("type") == "epoch") best = std::max(best, r.at("valid_bleu").get<double>());
  EXPECT_EQ(summary.at("best_valid_bleu").get<double>(), best);

  // --eval-only into a new folder scores the best weights again: the same test BLEU.
  TempDir again;
  TrainOptions e = o;
  e.run.eval_only = true;
  e.run.checkpoint_dir = out + "/checkpoint";
  e.run.out_dir = again.file("eval");  // does not exist yet
  const TrainReport re = run_training(e);
  EXPECT_EQ(re.test_bleu, summary.at("test_bleu").get<double>());
  EXPECT_EQ(re.test_bleu_greedy, summary.at("test_bleu_greedy").get<double>());
  EXPECT_EQ(linea::apps::read_json_file(e.run.out_dir + "/eval.json", "test").at("test_bleu").get<double>(),
            re.test_bleu);
  EXPECT_EQ(lines_of(e.run.out_dir + "/test.beam.es"), lines_of(out + "/test.beam.es"));

  // In process: a Translator over a model in training mode (dropout 0.1) decodes in eval mode and
  // leaves the model training.
  {
    Translator tr = Translator::load(out + "/checkpoint/best", kCPU);
    tr.model().train();
    const auto hyps = tr.translate(lines_of(toy_data() + "/test.en"), o.search, 16);
    EXPECT_TRUE(tr.model().is_training());
    const auto beam = lines_of(out + "/test.beam.es");
    ASSERT_EQ(hyps.size(), beam.size());
    for (size_t i = 0; i < hyps.size(); ++i) EXPECT_EQ(hyps[i].at(0), beam[i]) << i;
  }
  // `translate decode` with the checkpoint gives the run's own test hypotheses.
  TempDir dir;
  const std::string test_src = toy_data() + "/test.en";
  Shell r = run_translate("decode --checkpoint " + out + "/checkpoint --beam 3 --input " + test_src + " --output " +
                              dir.file("hyp.txt") + " --device cpu",
                          dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(lines_of(dir.file("hyp.txt")), lines_of(out + "/test.beam.es"));
  EXPECT_NE(r.output.find("sentences/s"), std::string::npos) << r.output;
  // stdin, greedy; n-best lists.
  r = run_translate("decode --checkpoint " + out + "/checkpoint --beam 1 --device cpu --input - < " + test_src, dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(lines_of(out + "/test.greedy.es")[0]), std::string::npos) << r.output;
  r = run_translate("decode --checkpoint " + out + "/checkpoint --beam 3 --nbest 2 --device cpu --input " + test_src +
                        " --output " + dir.file("nbest.txt"),
                    dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto nbest = lines_of(dir.file("nbest.txt"));
  ASSERT_EQ(nbest.size(), 100u);
  EXPECT_EQ(nbest[0].rfind("1 ||| ", 0), 0u) << nbest[0];
  EXPECT_EQ(nbest[3].rfind("2 ||| ", 0), 0u) << nbest[3];
  EXPECT_TRUE(std::regex_search(nbest[0], std::regex(" \\|\\|\\| -[0-9]+\\.[0-9]{4}$"))) << nbest[0];
  // "line ||| hypothesis ||| score": each sentence's best is its 1-best, the scores descend.
  const auto beam_hyps = lines_of(out + "/test.beam.es");
  for (size_t k = 0; k + 1 < nbest.size(); k += 2) {
    const auto fields = [](const std::string& line) {
      const size_t a = line.find(" ||| "), b = line.rfind(" ||| ");
      return std::make_tuple(line.substr(0, a), line.substr(a + 5, b - a - 5), std::stod(line.substr(b + 5)));
    };
    const auto [n0, h0, s0] = fields(nbest[k]);
    const auto [n1, h1, s1] = fields(nbest[k + 1]);
    EXPECT_EQ(n0, std::to_string(k / 2 + 1));
    EXPECT_EQ(n1, n0);
    EXPECT_EQ(h0, beam_hyps.at(k / 2)) << nbest[k];
    EXPECT_GE(s0, s1) << nbest[k] << " / " << nbest[k + 1];
    EXPECT_LT(s0, 0.0) << nbest[k];
  }
  // The same input with CRLF line ends, translated 10 lines at a time (the last buffer full, none
  // left at the end): the same lists, numbered over the whole input; an error names its line of
  // the whole input too.
  std::string crlf;
  for (const std::string& line : lines_of(test_src)) crlf += line + "\r\n";
  linea::test::write_all(dir.file("crlf.en"), crlf);
  r = run_translate("decode --checkpoint " + out + "/checkpoint --beam 3 --nbest 2 --buffer-size 10 --device cpu " +
                        "--input " + dir.file("crlf.en") + " --output " + dir.file("nbest10.txt"),
                    dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(lines_of(dir.file("nbest10.txt")), nbest);
  linea::test::write_all(dir.file("blank3.en"), "sun\nmoon\n\nstar\n");
  r = run_translate(
      "decode --checkpoint " + out + "/checkpoint --buffer-size 1 --device cpu --input " + dir.file("blank3.en"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("line 3 is empty"), std::string::npos) << r.output;

  // translate-bench-decode on the checkpoint: the recomputing baseline, greedy and beam search with
  // caches, each a record of the flags; the caches change no greedy hypothesis.
  const std::string records = dir.file("decode.jsonl");
  r = linea::test::run_shell(BENCH_DECODE_EXE,
                             "--checkpoint " + out + "/checkpoint --device cpu --threads 1 --sentences 5 --batch 2 " +
                                 "--beam 2 --input " + test_src + " --json " + records,
                             dir.file("bench.txt"));
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<std::string> rows = lines_of(records);
  ASSERT_EQ(rows.size(), 3u);
  const std::vector<std::string> searches = {"greedy, recompute prefix", "greedy, incremental", "beam 2, incremental"};
  for (size_t i = 0; i < 3; ++i) {
    const json j = json::parse(rows[i]);
    SCOPED_TRACE(rows[i]);
    EXPECT_EQ(j.at("search"), searches[i]);
    EXPECT_EQ(j.at("sentences"), 5);
    EXPECT_EQ(j.at("batch"), 2);
    EXPECT_EQ(j.at("beam"), i == 2 ? 2 : 1);
    EXPECT_EQ(j.at("greedy_identical"), 5);
    EXPECT_GE(j.at("tokens").get<int64_t>(), 5);  // an end token per sentence at least
    EXPECT_NE(j.at("device").get<std::string>().find(" 1 OpenMP threads"), std::string::npos);
    EXPECT_NEAR(j.at("sentences_per_s").get<double>() * j.at("seconds").get<double>(), 5.0, 1e-9);
    EXPECT_NEAR(j.at("speedup_vs_recompute").get<double>(),
                json::parse(rows[0]).at("seconds").get<double>() / j.at("seconds").get<double>(), 1e-12);
  }
}

// Separate vocabularies end to end (the model's flag, both tokenizers in the checkpoint), and what
// each evaluation scores: the epoch's valid loss over the whole split and its greedy BLEU over the
// first --valid-sentences pairs, with the weights of that moment (the last epoch's are the
// checkpoint's); the test loss, the greedy and beam hypotheses and their BLEU and chrF, with the
// best weights; the run's report. --eval-only refuses data with another tokenizer on either side,
// and an empty training split is named.
TEST(TranslateApp, SeparateVocabulariesAndWhatTheEvaluationsScore) {
  TempDir dir;
  PrepareOptions p = toy_prepare_options(dir);
  p.vocab_size = 40;  // each side has 20 words
  p.vocab = "separate";
  p.max_length = 0, p.max_ratio = 0;  // every pair kept, as in the folders below
  prepare(p);
  TrainOptions o = toy_options(dir.file("run"), 10);  // beam and greedy differ by then
  o.data_dir = p.out;
  o.valid_sentences = 20;
  o.run.plot = false;
  const TrainReport report = run_training(o);
  const std::string ckpt = o.run.out_dir + "/checkpoint";
  const json config = linea::apps::read_json_file(ckpt + "/config.json", "test");
  const json summary = linea::apps::read_json_file(o.run.out_dir + "/summary.json", "test");
  EXPECT_EQ(summary.at("model"), config.at("model"));
  EXPECT_EQ(summary.at("data"), config.at("data"));
  EXPECT_EQ(report.test_bleu, summary.at("test_bleu").get<double>());
  EXPECT_EQ(report.test_bleu_greedy, summary.at("test_bleu_greedy").get<double>());
  EXPECT_EQ(report.best_valid_bleu, summary.at("best_valid_bleu").get<double>());
  EXPECT_EQ(report.steps, summary.at("steps").get<int64_t>());
  EXPECT_EQ(report.train_tokens_per_s, summary.at("train_tokens_per_s").get<double>());
  EXPECT_FALSE(config.at("model").at("joint_vocab").get<bool>());
  EXPECT_EQ(config.at("tokenizers"), json({{"source", "spm.en.model"}, {"target", "spm.es.model"}}));
  EXPECT_EQ(config.at("languages"), json({{"source", "en"}, {"target", "es"}}));
  EXPECT_EQ(config.at("run").at("train_pairs").get<size_t>(), read_split(p.out, "train").src.size());
  for (const char* f : {"spm.en.model", "spm.es.model"})
    for (const std::string& at : {ckpt, ckpt + "/best"})
      EXPECT_EQ(linea::test::read_all(at + "/" + f), linea::test::read_all(p.out + "/" + f)) << at << " " << f;

  json last;
  for (const json& r : linea::apps::MetricsLog::read(o.run.out_dir + "/metrics.jsonl"))
    if (r.at("type") == "epoch") last = r;
  ASSERT_EQ(last.at("epoch").get<int64_t>(), 10);
  Translator final_weights = Translator::load(ckpt, kCPU);
  const TranslationDataset valid(read_split(p.out, "valid"), final_weights.source_tokenizer(),
                                 final_weights.target_tokenizer());
  EXPECT_NEAR(last.at("valid_loss").get<double>(), loss_sentence_by_sentence(final_weights.model(), valid), 1e-5);
  std::vector<std::string> src = valid.text().src, ref = valid.text().tgt;
  src.resize(20), ref.resize(20);
  SearchOptions greedy = o.search;
  greedy.beam = 1;
  std::vector<std::string> hyps;
  for (const auto& h : final_weights.translate(src, greedy, o.decode_batch)) hyps.push_back(h.at(0));
  EXPECT_EQ(last.at("valid_bleu").get<double>(), linea::apps::bleu::corpus_bleu(hyps, {ref}).score);

  Translator best = Translator::load(ckpt + "/best", kCPU);
  const TranslationDataset test(read_split(p.out, "test"), best.source_tokenizer(), best.target_tokenizer());
  EXPECT_NEAR(summary.at("test_loss").get<double>(), loss_sentence_by_sentence(best.model(), test), 1e-5);
  EXPECT_DOUBLE_EQ(summary.at("test_ppl").get<double>(), std::exp(summary.at("test_loss").get<double>()));
  // The test hypotheses: greedy and beam (3) with the best weights, each scored on its own file.
  std::vector<std::string> greedy_hyps;
  for (const auto& h : best.translate(test.text().src, greedy, o.decode_batch)) greedy_hyps.push_back(h.at(0));
  const auto greedy_file = lines_of(o.run.out_dir + "/test.greedy.es"),
             beam_file = lines_of(o.run.out_dir + "/test.beam.es");
  EXPECT_EQ(greedy_file, greedy_hyps);
  EXPECT_NE(beam_file, greedy_file);  // (were they equal, the three checks below could not tell them apart)
  namespace bleu = linea::apps::bleu;
  EXPECT_EQ(summary.at("test_bleu_greedy").get<double>(), bleu::corpus_bleu(greedy_file, {test.text().tgt}).score);
  EXPECT_EQ(summary.at("test_bleu").get<double>(), bleu::corpus_bleu(beam_file, {test.text().tgt}).score);
  EXPECT_EQ(summary.at("test_chrf").get<double>(), bleu::corpus_chrf(beam_file, {test.text().tgt}).score);

  // --eval-only with data whose target (then source) tokenizer is not the checkpoint's: the other
  // side's is the same file, so each comparison is seen alone.
  for (const bool target : {true, false}) {
    PrepareOptions q = p;
    q.out = dir.file(target ? "data_tgt" : "data_src");
    std::string text = linea::test::read_all(target ? p.tgt_file : p.src_file);
    for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    (target ? q.tgt_file : q.src_file) = dir.file(target ? "tgt_upper.txt" : "src_upper.txt");
    linea::test::write_all(target ? q.tgt_file : q.src_file, text);
    prepare(q);
    const std::string same = target ? "/spm.en.model" : "/spm.es.model";
    ASSERT_EQ(linea::test::read_all(q.out + same), linea::test::read_all(p.out + same));
    TrainOptions e = o;
    e.data_dir = q.out;
    e.run.eval_only = true;
    e.run.checkpoint_dir = ckpt;
    e.run.out_dir = dir.file(target ? "eval_tgt" : "eval_src");
    EXPECT_LINEA_ERROR(run_training(e),
                       "translate: --eval-only: the checkpoint in '" + ckpt + "/best' was trained with",
                       "other tokenizers than the data in '" + q.out + "'");
  }

  // No training pairs.
  json manifest = linea::apps::read_json_file(p.out + "/data.json", "test");
  for (const char* key : {"src", "tgt", "ref"})
    linea::test::write_all(p.out + "/" + manifest.at("files").at("train").at(key).get<std::string>(), "");
  manifest["files"]["train"]["pairs"] = 0;
  linea::test::write_all(p.out + "/data.json", manifest.dump());
  o.run.out_dir = dir.file("empty");
  EXPECT_LINEA_ERROR(run_training(o), "translate: '" + p.out + "' has no training pairs");
}

TEST(TranslateApp, ResumeContinuesExactly) {
  TempDir a, b;
  TrainOptions full = toy_options(a.file("run"), 3);
  full.search.beam = 1;
  const TrainReport r_full = run_training(full);
  TrainOptions part = toy_options(b.file("run"), 3);
  part.search.beam = 1;
  part.run.max_steps = 40;  // mid-epoch 2
  run_training(part);
  part.run.max_steps = 0;
  part.run.resume = true;
  const TrainReport r_resumed = run_training(part);
  EXPECT_EQ(r_resumed.steps, r_full.steps);
  std::vector<double> la, lb;
  for (const json& r : linea::apps::MetricsLog::read(a.file("run/metrics.jsonl")))
    if (r.at("type") == "step" && r.at("step").get<int64_t>() > 40) la.push_back(r.at("loss").get<double>());
  for (const json& r : linea::apps::MetricsLog::read(b.file("run/metrics.jsonl")))
    if (r.at("type") == "step" && r.at("step").get<int64_t>() > 40) lb.push_back(r.at("loss").get<double>());
  ASSERT_FALSE(la.empty());
  EXPECT_EQ(la, lb);
  EXPECT_EQ(linea::test::read_all(a.file("run/test.greedy.es")), linea::test::read_all(b.file("run/test.greedy.es")));
  // Another learning rate is refused, naming it.
  part.lr = 1e-3;
  try {
    run_training(part);
    ADD_FAILURE() << "a resume with another --lr was accepted";
  } catch (const linea::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }
}

TEST(TranslateApp, BadInputGetsAClearError) {
  TempDir dir;
  TrainOptions o = toy_options(dir.file("run"), 1);  // a checkpoint to decode with
  o.search.beam = 1;
  run_training(o);
  const std::string out = o.run.out_dir;
  {
    Translator tr = Translator::load(out + "/checkpoint/best", kCPU);
    EXPECT_LINEA_ERROR(tr.translate({"sun"}, o.search, 0), "at least one sentence, got 0");
    // The longest source the model takes: max_len (64) tokens with the end token.
    const Tokenizer& tok = tr.source_tokenizer();
    std::string word;
    for (const std::string& line : lines_of(toy_data() + "/test.en")) {
      std::istringstream words(line);
      for (std::string w; word.empty() && words >> w;)
        if (tok.encode(w).size() == 1) word = w;
    }
    ASSERT_FALSE(word.empty());
    std::string at_max = word;
    for (int i = 1; i < 63; ++i) at_max += " " + word;
    ASSERT_EQ(tok.encode(at_max).size(), 63u);
    EXPECT_EQ(tr.encode_source(at_max, "line 9").size(), 64u);
    EXPECT_LINEA_ERROR(tr.encode_source(at_max + " " + word, "line 9"), "line 9 has 65 tokens", "maximum of 64");
    // The decoding counts (sentences; output tokens with their end token) add up over calls.
    std::vector<std::string> lines = lines_of(toy_data() + "/test.en");
    lines.resize(5);
    DecodeStats st;
    const auto hyps = tr.translate(lines, o.search, 2, &st);
    int64_t tokens = 0;  // each sentence decoded alone (as in a batch: BatchDecodesAsEachSentenceAlone)
    {
      linea::NoGradGuard ng;
      tr.model().eval();
      for (const std::string& line : lines) {
        const std::vector<int64_t> ids = tr.encode_source(line, "line");
        const int64_t S = static_cast<int64_t>(ids.size());
        const auto h = greedy_search(tr.model(), linea::from_vector<int64_t>(ids, {1, S}),
                                     linea::zeros({1, S}, linea::TensorOptions(linea::DType::Bool)), o.search);
        EXPECT_EQ(tr.target_tokenizer().decode(h.at(0).tokens), hyps[&line - &lines[0]].at(0));
        tokens += static_cast<int64_t>(h.at(0).tokens.size()) + 1;
      }
    }
    EXPECT_EQ(st.sentences, 5);
    EXPECT_EQ(st.tokens, tokens);
    tr.translate(lines, o.search, 2, &st);
    EXPECT_EQ(st.sentences, 10);
    EXPECT_EQ(st.tokens, 2 * tokens);
  }
  // A checkpoint whose target vocabulary is not the model's; one whose weights hold a NaN.
  for (const char* fault : {"vocab", "nan"}) {
    const std::string bad = dir.file(std::string("bad_") + fault);
    fs::copy(out + "/checkpoint/best", bad, fs::copy_options::recursive);
    if (std::string(fault) == "vocab") {
      json cfg = json::parse(linea::test::read_all(bad + "/config.json"));
      cfg["model"]["tgt_vocab"] = cfg["model"]["tgt_vocab"].get<int64_t>() + 1;
      linea::test::write_all(bad + "/config.json", cfg.dump());
      EXPECT_LINEA_ERROR(Translator::load(bad, kCPU), "do not match the model's");
    } else {
      linea::nn::SafetensorsFile f = linea::nn::load_safetensors(bad + "/model.safetensors");
      f.tensors.begin()->second.narrow(0, 0, 1).fill_(NAN);
      linea::nn::save_safetensors(bad + "/model.safetensors", f.tensors, f.metadata);
      EXPECT_LINEA_ERROR(Translator::load(bad, kCPU), bad + "/model.safetensors", "non-finite");
    }
  }
  linea::test::write_all(dir.file("in.txt"), "sun moon\n\nstar\n");
  Shell r = run_translate("decode --checkpoint " + out + "/checkpoint --input " + dir.file("in.txt"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("error: translate: line 2 is empty"), std::string::npos) << r.output;
  std::string long_line;
  for (int i = 0; i < 80; ++i) long_line += "sun ";
  linea::test::write_all(dir.file("long.txt"), "sun\n" + long_line + "\n");
  r = run_translate("decode --checkpoint " + out + "/checkpoint --input " + dir.file("long.txt"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("line 2 has"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("maximum of 64"), std::string::npos) << r.output;
  // A checkpoint of another app, a folder that is no checkpoint, a missing one.
  fs::create_directories(dir.file("vit"));
  linea::test::write_all(dir.file("vit/config.json"), R"({"format": "linea-vit/1"})");
  r = run_translate("decode --checkpoint " + dir.file("vit") + " --input " + dir.file("in.txt"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("is not a translate checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("linea-vit/1"), std::string::npos) << r.output;
  r = run_translate("decode --checkpoint " + dir.path.string() + " --input " + dir.file("in.txt"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no config.json"), std::string::npos) << r.output;
  r = run_translate("decode --checkpoint " + dir.file("missing") + " --input " + dir.file("in.txt"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  // Flags: an unknown attention, a decoder mechanism that cannot be causal, --nbest > --beam, no data.
  r = run_translate("train --data " + toy_data() + " --out " + dir.file("x") + " --enc-attention bogus", dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("bogus"), std::string::npos) << r.output;
  r = run_translate("train --data " + toy_data() + " --out " + dir.file("x") + " --dec-attention lara", dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("lara"), std::string::npos) << r.output;
  r = run_translate("decode --checkpoint " + out + "/checkpoint --beam 2 --nbest 3 --input " + dir.file("in.txt"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--nbest 3"), std::string::npos) << r.output;
  r = run_translate("train --data " + dir.file("nodata") + " --out " + dir.file("x"), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("nodata"), std::string::npos) << r.output;
  r = run_translate("--help", dir);
  EXPECT_EQ(r.code, 0);
  for (const char* cmd : {"prepare", "train", "decode"}) EXPECT_NE(r.output.find(cmd), std::string::npos) << cmd;
}
