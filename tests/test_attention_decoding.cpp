// Incremental decoding: for every causal-capable mechanism (softmax, performer with each feature
// map, nprf_rpe on both paths) with its samples fixed, decoding one or a few positions at a time
// equals the full causal forward in float64 (within 1e-10), also with padded positions and after
// a beam reorder; the query offset of AttentionOptions; the same through MultiHeadAttention and
// TransformerDecoder (cross-attention memory shared by the beams of a sentence); mechanisms that
// cannot serve a use are refused when built, saying what they support; and the redraw schedule
// is state, so a mechanism restored from its state dict continues exactly.
#include <memory>
#include <string>
#include <vector>

#include "attention/nprf_rpe/nprf_rpe.h"
#include "attention/performer/performer.h"
#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "nn/optim.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::randn64;

constexpr double kTol = 1e-10;

const std::vector<std::string> kCausalSpecs = {
    "softmax",
    "performer:features=6,chunk=2",
    "performer:features=6,feature_map=relu,chunk=3",
    "performer:features=5,feature_map=trf,chunk=4",
    "nprf_rpe:features=6,max_len=12,dense=1",
    "nprf_rpe:features=6,max_len=12,dense=0",
};

// Every parameter random (nprf_rpe's relative-position bias starts at zero, which would hide
// a wrong offset), everything float64, eval mode (no redraws, no dropout). Written in place:
// MultiHeadAttention's q, k and v weights stay one buffer, so that its steps hand the cache keys
// and values as one tensor's heads, as the apps' do.
void prepare(nn::Module& m, uint64_t seed) {
  manual_seed(seed);
  m.to(DType::Float64);
  NoGradGuard ng;
  for (auto& [name, p] : m.named_parameters()) p.copy_(randn(p.shape(), TensorOptions(p.dtype())) * 0.5);
  m.eval();
}

std::shared_ptr<attn::AttentionMechanism> mechanism(const std::string& spec, uint64_t seed) {
  auto m = attn::make_attention(spec, /*heads=*/2, /*head_dim=*/4, attn::AttentionUse::CausalSelf);
  prepare(*m, seed);
  return m;
}

attn::AttentionOptions causal(const Tensor& pad = Tensor(), int64_t offset = 0) {
  attn::AttentionOptions o;
  o.causal = true;
  o.query_offset = offset;
  o.key_padding_mask = pad;
  return o;
}

// Decodes q, k, v [B, H, L, D] in steps of the given lengths; returns the outputs [B, H, L, Dv].
Tensor decode(attn::AttentionMechanism& m, const Tensor& q, const Tensor& k, const Tensor& v,
              const std::vector<int64_t>& steps, const Tensor& pad = Tensor()) {
  auto state = m.start_decoding();
  std::vector<Tensor> outs;
  int64_t t = 0;
  for (int64_t T : steps) {
    Tensor p = pad.defined() ? narrow(pad, 1, t, T) : Tensor();
    outs.push_back(m.decode_step(narrow(q, 2, t, T), narrow(k, 2, t, T), narrow(v, 2, t, T), *state, p));
    t += T;
    EXPECT_EQ(state->length(), t);
  }
  return cat(outs, 2);
}

TEST(AttentionDecoding, StepByStepEqualsTheCausalForward) {
  for (const std::string& spec : kCausalSpecs) {
    SCOPED_TRACE(spec);
    auto m = mechanism(spec, 1);
    NoGradGuard ng;
    Tensor q = randn64({2, 2, 9, 4}), k = randn64({2, 2, 9, 4}), v = randn64({2, 2, 9, 3});
    Tensor full = m->forward(q, k, v, causal());
    EXPECT_TRUE(all_close(decode(*m, q, k, v, std::vector<int64_t>(9, 1)), full, kTol, 0));
    EXPECT_TRUE(all_close(decode(*m, q, k, v, {3, 1, 4, 1}), full, kTol, 0));
    // Padded positions: hidden from every later query, as in the forward with the same mask.
    Tensor pad = zeros({2, 9}, TensorOptions(DType::Bool));
    pad.narrow(1, 2, 2).select(0, 1).fill_(1.0);
    pad.narrow(1, 0, 1).select(0, 0).fill_(1.0);
    Tensor fullp = m->forward(q, k, v, causal(pad));
    EXPECT_TRUE(all_close(decode(*m, q, k, v, std::vector<int64_t>(9, 1), pad), fullp, kTol, 0));
    EXPECT_TRUE(all_close(decode(*m, q, k, v, {2, 5, 2}, pad), fullp, kTol, 0));
  }
}

TEST(AttentionDecoding, QueryOffsetPlacesTheQueriesAmongTheKeys) {
  for (const std::string& spec : kCausalSpecs) {
    SCOPED_TRACE(spec);
    auto m = mechanism(spec, 2);
    NoGradGuard ng;
    Tensor q = randn64({1, 2, 8, 4}), k = randn64({1, 2, 8, 4}), v = randn64({1, 2, 8, 3});
    Tensor full = m->forward(q, k, v, causal());
    for (int64_t o : {1, 5, 7}) {
      Tensor part = m->forward(narrow(q, 2, o, 8 - o), k, v, causal(Tensor(), o));
      EXPECT_TRUE(all_close(part, narrow(full, 2, o, 8 - o), kTol, 0)) << "offset " << o;
    }
  }
  attn::SoftmaxAttention s(1, 4);
  EXPECT_LINEA_ERROR(s.forward(randn64({1, 1, 2, 4}), randn64({1, 1, 2, 4}), randn64({1, 1, 2, 4}), causal(Tensor(), -1)),
                     "query_offset must be >= 0, got -1");
}

TEST(GradCheck, CausalMechanismsWithAQueryOffset) {
  for (const std::string& spec : kCausalSpecs) {
    SCOPED_TRACE(spec);
    auto m = mechanism(spec, 8);
    Tensor q = randn64({1, 2, 3, 4}), k = randn64({1, 2, 6, 4}), v = randn64({1, 2, 6, 3});
    Tensor pad = zeros({1, 6}, TensorOptions(DType::Bool));
    pad.narrow(1, 1, 1).fill_(1.0);
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& x) { return m->forward(x[0], x[1], x[2], causal(pad, 2)); },
                     {q, k, v});
  }
}

TEST(AttentionDecoding, BeamReorderContinuesFromTheChosenRows) {
  for (const std::string& spec : kCausalSpecs) {
    SCOPED_TRACE(spec);
    auto m = mechanism(spec, 3);
    NoGradGuard ng;
    const int64_t B = 3, L = 8, P = 4;  // reorder after P positions
    Tensor q = randn64({B, 2, L, 4}), k = randn64({B, 2, L, 4}), v = randn64({B, 2, L, 3});
    const std::vector<int64_t> beam = {2, 0, 0};  // row b continues the prefix of row beam[b]
    Tensor index = from_vector<int64_t>(beam, {B});
    auto state = m->start_decoding();
    for (int64_t t = 0; t < P; ++t)
      m->decode_step(narrow(q, 2, t, 1), narrow(k, 2, t, 1), narrow(v, 2, t, 1), *state);
    state->reorder(index);
    std::vector<Tensor> outs;
    for (int64_t t = P; t < L; ++t)
      outs.push_back(m->decode_step(narrow(q, 2, t, 1), narrow(k, 2, t, 1), narrow(v, 2, t, 1), *state));
    // The full forward over the sequences the beams now hold: prefix of row beam[b], then row b.
    auto spliced = [&](const Tensor& x) {
      return cat({index_select(narrow(x, 2, 0, P), 0, index), narrow(x, 2, P, L - P)}, 2);
    };
    Tensor full = m->forward(spliced(q), spliced(k), spliced(v), causal());
    EXPECT_TRUE(all_close(cat(outs, 2), narrow(full, 2, P, L - P), kTol, 0));
  }
}

// The key/value cache past its buffer's first size (16 positions, then doubling): a long softmax
// decode with padding from the middle on (and steps without it in between) and a beam reorder
// equals the causal forward over the sequences the beams hold; the keys a step saw stay what they
// were while later steps write into the same buffers; a reorder keeps the buffers' room; and with
// gradients on, the cache is differentiable (joined by cat) and keeps the same padding. Keys and values apart (Dv = 3 < D: the buffer's value rows have
// a column the views leave out), and as one tensor's consecutive heads (a projection's: one copy).
TEST(AttentionDecoding, KeyValueCacheGrowsPastItsBuffers) {
  auto m = mechanism("softmax", 5);
  const int64_t B = 2, L = 41, P = 23;  // reorder after P positions
  Tensor q = randn64({B, 2, L, 4}), k = randn64({B, 2, L, 4}), v = randn64({B, 2, L, 3});
  Tensor pad = zeros({B, L}, TensorOptions(DType::Bool));
  pad.narrow(1, 8, 2).select(0, 1).fill_(1.0);  // kept through the buffer's growth at 17 and 35
  pad.narrow(1, 20, 3).select(0, 1).fill_(1.0);
  pad.narrow(1, 30, 1).select(0, 0).fill_(1.0);
  // No padding given before position 5 (the cache keeps none until then), nor at 12-13 (the
  // cache writes them unpadded).
  const auto given = [&](int64_t t) { return t < 5 || t == 12 || t == 13 ? Tensor() : narrow(pad, 1, t, 1); };
  const auto padding_is = [](const Tensor& got, const Tensor& want) {
    return all_close(got.to(DType::Int64), want.to(DType::Int64), 0, 0);
  };
  const Tensor index = from_vector<int64_t>({1, 1}, {B});
  const Tensor kv = randn64({B, 4, L, 4});
  struct Operands {
    const char* name;
    Tensor k, v;
  };
  for (const Operands& ops :
       {Operands{"apart", k, v}, Operands{"one tensor's heads", narrow(kv, 1, 0, 2), narrow(kv, 1, 2, 2)}}) {
    SCOPED_TRACE(ops.name);
    NoGradGuard ng;
    attn::KeyValueCache cache;
    std::vector<Tensor> outs;
    Tensor seen, seen_copy;  // the keys of step 9, as the cache handed them out then
    for (int64_t t = 0; t < L; ++t) {
      const void* reordered = nullptr;
      if (t == P) {
        cache.reorder(index);
        reordered = cache.keys().data_ptr();
      }
      cache.append(narrow(ops.k, 2, t, 1), narrow(ops.v, 2, t, 1), given(t));
      // The reorder kept the buffer's room (34 positions): the next step writes into it, no new buffer.
      if (reordered) {
        EXPECT_EQ(cache.keys().data_ptr(), reordered);
      }
      if (t == 9) {
        seen = cache.keys();
        seen_copy = clone(seen);
      }
      attn::AttentionOptions o = causal(cache.key_padding(), t);
      outs.push_back(m->forward(narrow(q, 2, t, 1), cache.keys(), cache.values(), o));
    }
    EXPECT_EQ(cache.length(), L);
    EXPECT_TRUE(all_close(seen, seen_copy, 0, 0));
    auto spliced = [&](const Tensor& x, int64_t dim) {
      return cat({index_select(narrow(x, dim, 0, P), 0, index), narrow(x, dim, P, L - P)}, dim);
    };
    EXPECT_TRUE(all_close(cache.keys(), spliced(ops.k, 2), 0, 0));
    EXPECT_TRUE(all_close(cache.values(), spliced(ops.v, 2), 0, 0));
    EXPECT_TRUE(padding_is(cache.key_padding(), spliced(pad, 1)));
    Tensor full = m->forward(spliced(q, 2), spliced(ops.k, 2), spliced(ops.v, 2), causal(spliced(pad, 1)));
    EXPECT_TRUE(all_close(narrow(cat(outs, 2), 2, P, L - P), narrow(full, 2, P, L - P), kTol, 0));
  }
  // Differentiable: every appended key gets the gradient of its place in keys(); the padding as
  // without gradients.
  attn::KeyValueCache cache;
  ASSERT_TRUE(k.requires_grad());
  for (int64_t t = 0; t < 20; ++t) cache.append(narrow(k, 2, t, 1), narrow(v, 2, t, 1), given(t));
  EXPECT_TRUE(padding_is(cache.key_padding(), narrow(pad, 1, 0, 20)));
  const Tensor w = randn({B, 2, 20, 4}, TensorOptions(DType::Float64));
  sum(mul(cache.keys(), w)).backward();
  ASSERT_TRUE(k.grad().defined());
  EXPECT_TRUE(all_close(narrow(k.grad(), 2, 0, 20), w, 0, 0));
  // A reorder of a cache joined by cat selects the rows of its keys, values and padding too.
  attn::KeyValueCache joined;
  for (int64_t t = 0; t < 12; ++t) joined.append(narrow(k, 2, t, 1), narrow(v, 2, t, 1), given(t));
  joined.reorder(index);
  EXPECT_TRUE(all_close(joined.keys(), index_select(narrow(k, 2, 0, 12), 0, index), 0, 0));
  EXPECT_TRUE(all_close(joined.values(), index_select(narrow(v, 2, 0, 12), 0, index), 0, 0));
  EXPECT_TRUE(padding_is(joined.key_padding(), index_select(narrow(pad, 1, 0, 12), 0, index)));
  // Then steps without gradients: the keys joined so far copied into a buffer, the new ones after.
  NoGradGuard ng;
  for (int64_t t = 20; t < 25; ++t) cache.append(narrow(k, 2, t, 1), narrow(v, 2, t, 1), given(t));
  EXPECT_TRUE(all_close(cache.keys(), narrow(k, 2, 0, 25), 0, 0));
  EXPECT_TRUE(all_close(cache.values(), narrow(v, 2, 0, 25), 0, 0));
  EXPECT_TRUE(padding_is(cache.key_padding(), narrow(pad, 1, 0, 25)));
}

TEST(AttentionDecoding, StepInputsAreChecked) {
  auto m = mechanism("softmax", 4);
  auto state = m->start_decoding();
  Tensor x = randn64({2, 2, 1, 4});
  m->decode_step(x, x, x, *state);
  EXPECT_LINEA_ERROR(m->decode_step(randn64({2, 2, 2, 4}), x, x, *state), "as many new queries as new keys");
  EXPECT_LINEA_ERROR(m->decode_step(randn64({3, 2, 1, 4}), randn64({3, 2, 1, 4}), randn64({3, 2, 1, 4}), *state),
                     "reorder it first");
  auto p = mechanism("performer:features=4", 5);
  auto pstate = p->start_decoding();
  EXPECT_LINEA_ERROR(m->decode_step(x, x, x, *pstate), "not made by this mechanism");
  // The cache itself: a step's keys and values must continue what it holds.
  attn::KeyValueCache cache;
  cache.append(x, x, Tensor());
  EXPECT_LINEA_ERROR(cache.append(x, randn64({2, 2, 1, 3}), Tensor()), "do not continue the cache's");
  EXPECT_LINEA_ERROR(cache.append(randn64({2, 3, 1, 4}), x, Tensor()), "do not continue the cache's");
  EXPECT_LINEA_ERROR(cache.append(x, x.to(DType::Float32), Tensor()), "do not continue the cache's");
}

// ---- through the layers ----------------------------------------------------------------------
TEST(AttentionDecoding, MultiHeadSelfAttentionStepsEqualItsCausalForward) {
  for (const std::string& spec : kCausalSpecs) {
    SCOPED_TRACE(spec);
    attn::MultiHeadAttention mha(8, 2, spec, {attn::AttentionUse::CausalSelf});
    prepare(mha, 6);
    NoGradGuard ng;
    Tensor x = randn64({2, 7, 8});
    Tensor full = mha(x, x, causal());
    attn::AttentionCache cache = mha.start_self();
    std::vector<Tensor> outs;
    for (int64_t t : {0, 1, 2, 3, 4, 5, 6}) outs.push_back(mha.step(narrow(x, 1, t, 1), cache));
    EXPECT_EQ(cache.length(), 7);
    EXPECT_TRUE(all_close(cat(outs, 1), full, kTol, 0));
  }
}

// A decoder decoded step by step, with beams: rows [sentence][beam], the memory given once per
// sentence; compared with the full forward over the memory repeated per beam.
void expect_decoder_steps_match(const std::string& spec, const std::string& cross_spec) {
  SCOPED_TRACE(spec + " / " + cross_spec);
  attn::TransformerDecoder dec(2, 8, 2, 12, 0.1, spec, cross_spec);
  prepare(dec, 7);
  NoGradGuard ng;
  const int64_t S = 2, beams = 3, B = S * beams, L = 6, M = 5, P = 3;
  Tensor memory = randn64({S, M, 8});
  Tensor mem_pad = zeros({S, M}, TensorOptions(DType::Bool));
  mem_pad.select(0, 1).narrow(0, 3, 2).fill_(1.0);  // sentence 1 has 3 source tokens
  Tensor x = randn64({B, L, 8});
  Tensor rows = from_vector<int64_t>({0, 0, 0, 1, 1, 1}, {B});  // the sentence of each decoder row
  Tensor mem_rows = index_select(memory, 0, rows), pad_rows = index_select(mem_pad, 0, rows);

  // Without reordering: every position step by step.
  attn::DecoderState st = dec.start(memory, mem_pad);
  std::vector<Tensor> outs;
  for (int64_t t = 0; t < L; ++t) outs.push_back(dec.step(narrow(x, 1, t, 1), st));
  EXPECT_EQ(st.length(), L);
  EXPECT_TRUE(all_close(cat(outs, 1), dec(x, mem_rows, pad_rows), kTol, 0));

  // With a reorder within each sentence after P positions.
  const std::vector<int64_t> keep = {2, 0, 0, 4, 5, 3};
  Tensor index = from_vector<int64_t>(keep, {B});
  attn::DecoderState st2 = dec.start(memory, mem_pad);
  dec.step(narrow(x, 1, 0, P), st2);  // a prefix of P positions at once
  st2.reorder(index);
  Tensor rest = dec.step(narrow(x, 1, P, L - P), st2);
  Tensor spliced = cat({index_select(narrow(x, 1, 0, P), 0, index), narrow(x, 1, P, L - P)}, 1);
  EXPECT_TRUE(all_close(rest, narrow(dec(spliced, mem_rows, pad_rows), 1, P, L - P), kTol, 0));
  const std::vector<int64_t> across = {3, 1, 2, 0, 4, 5};
  EXPECT_LINEA_ERROR(st2.reorder(from_vector<int64_t>(across, {B})), "belongs to another sentence");
}

TEST(AttentionDecoding, TransformerDecoderStepsEqualItsForward) {
  expect_decoder_steps_match("softmax", "softmax");
  expect_decoder_steps_match("performer:features=6,chunk=2", "performer:features=6");
  expect_decoder_steps_match("nprf_rpe:features=6,max_len=8,dense=0", "nprf_rpe:features=6,max_len=8");
  expect_decoder_steps_match("performer:features=6,feature_map=trf", "ra:samples=2,biased=1");
}

// ---- what a mechanism supports -----------------------------------------------------------------
TEST(AttentionSupport, UnsupportedUsesFailWhenBuilt) {
  EXPECT_LINEA_ERROR(attn::TransformerDecoderLayer(8, 2, 16, 0.0, "lara"),
                     "attention 'lara' cannot be used as causal self-attention: it supports bidirectional "
                     "self-attention only");
  EXPECT_LINEA_ERROR(attn::TransformerDecoder(1, 8, 2, 16, 0.0, "softmax", "lara:samples=4"),
                     "attention 'lara:samples=4' cannot be used as cross-attention");
  EXPECT_LINEA_ERROR(attn::make_attention("ra", 2, 4, attn::AttentionUse::CausalSelf),
                     "cannot be used as causal self-attention: it supports bidirectional self-attention, "
                     "cross-attention");
  EXPECT_LINEA_ERROR(attn::MultiHeadAttention(8, 2, "lara", {attn::AttentionUse::Cross}), "cannot be used as cross");
  EXPECT_LINEA_ERROR(attn::make_attention("ra", 2, 4)->start_decoding(), "incremental decoding is not supported");
  auto perf = std::make_shared<attn::PerformerAttention>(2, 4, 8);
  EXPECT_LINEA_ERROR(attn::MultiHeadAttention(8, 4, perf), "was built for 2 heads of dim 4");
  attn::MultiHeadAttention by_instance(8, 2, perf, {attn::AttentionUse::CausalSelf});
  EXPECT_EQ(by_instance.mechanism().get(), perf.get());
  for (const std::string& name : attn::registered_attentions()) {
    if (!attn::attention_info(name).support.incremental) continue;
    auto m = attn::make_attention(name, 2, 4, attn::AttentionUse::CausalSelf);
    EXPECT_TRUE(m->support().causal && m->support().incremental && m->support().cross) << name;
  }
}

// ---- the redraw schedule is state --------------------------------------------------------------
// Trains a mechanism's MultiHeadAttention for `calls` SGD steps on fixed data; the loss sequence.
std::vector<double> train_calls(attn::MultiHeadAttention& mha, nn::SGD& opt, int64_t calls) {
  std::vector<double> losses;
  for (int64_t i = 0; i < calls; ++i) {
    Tensor x = randn({2, 5, 8});
    Tensor loss = mean(square(mha(x, x, causal())));
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

TEST(AttentionRedraw, RestoredStateRedrawsWhereTheUninterruptedRunDid) {
  for (const std::string spec : {"performer:features=4,redraw=3", "nprf_rpe:features=4,max_len=8,redraw=3"}) {
    SCOPED_TRACE(spec);
    manual_seed(9);
    attn::MultiHeadAttention a(8, 2, spec, {attn::AttentionUse::CausalSelf});
    nn::SGD opt_a({nn::ParamGroup{a.parameters(), 0.05}});
    train_calls(a, opt_a, 4);  // calls 0..3: redraws at 0 and 3
    EXPECT_EQ(a.mechanism()->redraw_calls(), 4);
    nn::StateDict saved;
    for (auto& [n, t] : a.state_dict()) saved[n] = clone(t);
    ASSERT_EQ(saved.count("mechanism.redraw_calls"), 1u);
    const std::vector<uint64_t> rng = get_rng_state(kCPU);
    const std::vector<double> straight = train_calls(a, opt_a, 4);  // calls 4..7: a redraw at 6

    manual_seed(1234);  // another model, restored from the saved state
    attn::MultiHeadAttention b(8, 2, spec, {attn::AttentionUse::CausalSelf});
    b.load_state_dict(saved);
    EXPECT_EQ(b.mechanism()->redraw_calls(), 4);
    nn::SGD opt_b({nn::ParamGroup{b.parameters(), 0.05}});
    set_rng_state(rng, kCPU);
    const std::vector<double> resumed = train_calls(b, opt_b, 4);
    EXPECT_EQ(resumed, straight);
    for (auto& [n, t] : a.state_dict()) EXPECT_TRUE(all_close(b.state_dict().at(n), t, 0, 0)) << n;
  }
}

}  // namespace
}  // namespace linea
