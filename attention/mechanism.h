// The per-head attention mechanism interface every mechanism of attention/ implements
// (AttentionMechanism), what it is called with (AttentionOptions), what it declares it can do
// (AttentionSupport), the state it keeps while decoding one token at a time (DecodeState), and
// the mask helpers the mechanisms share.
//
// Conventions every mechanism follows (DESIGN.md, "Attention layer contract"):
//  - q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> out [B, H, N, Dv]; M may differ from N
//    (cross-attention);
//  - scores are scaled by 1/sqrt(D);
//  - query n sits at position n + query_offset among the keys: with causal, key m is visible to
//    query n iff m <= n + query_offset (offset 0 aligns them top-left, as PyTorch's is_causal);
//    position-aware mechanisms (nprf_rpe) measure relative positions the same way;
//  - key_padding_mask: Bool or Int64 [B, M], true / nonzero = padding (hidden from every query);
//    a query that sees no key at all gets a zero output, never NaN.
//
// Not here: the mechanisms themselves (attention/<name>/), the spec strings and the registry
// (attention/registry.h), the projections (attention/multihead.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace linea::attn {

struct AttentionOptions {
  bool causal = false;
  int64_t query_offset = 0;  // position of query 0 among the keys (>= 0)
  Tensor key_padding_mask;   // Bool or Int64 [B, M]; true / nonzero = padding; undefined = none
};

// The most random features (performer, nprf_rpe) or samples (ra, lara) a mechanism is built with:
// far above any useful count, low enough that a value such as features=1000000000000 is a clear
// linea::Error at construction instead of an allocation failure.
inline constexpr int64_t kMaxRandomFeatures = int64_t{1} << 16;

// What a mechanism can be used for; building it for anything else fails at construction.
struct AttentionSupport {
  bool causal = false;       // a causal mask (decoder self-attention)
  bool cross = false;        // keys/values of another sequence, of another length
  bool incremental = false;  // causal decoding one step at a time through a DecodeState
  // Each query's output depends on its position (relative-position bias): queries cannot be
  // regrouped, e.g. beams folded into the query axis of a shared cross-attention memory.
  bool positional = false;
  // "causal, cross-attention, incremental decoding" or "bidirectional self-attention only".
  std::string str() const;
};

// The ways a layer uses its mechanism, checked against AttentionSupport when it is built.
enum class AttentionUse { Self, CausalSelf, Cross };
const char* attention_use_name(AttentionUse use);

// The random quantities of a mechanism, by name (shapes for q [B, H, N, D], v [.., Dv]):
//   "omega"    [H, S, D]        feature rows of W (performer, nprf_rpe)
//   "eps"      [B, H, N, S, D]  Gaussian noise of ra;  [B, H, C, D] of lara
//   "ra_index" Int64 [B, H, N, S]  ra's sampled mixture components
using AttentionSamples = std::map<std::string, Tensor>;

// What a mechanism keeps between the calls of causal decoding: the keys seen so far, as a
// key/value cache or a constant-size summary. One per layer and batch of sequences.
class DecodeState {
 public:
  virtual ~DecodeState() = default;
  // Keys appended so far: the position of the next query.
  int64_t length() const { return length_; }
  // Keeps the batch rows `index` (Int64 [B'], any device), in that order (beam search).
  virtual void reorder(const Tensor& index) = 0;

 protected:
  int64_t length_ = 0;
  friend class AttentionMechanism;
};

// The state of mechanisms that are exact over all keys seen so far: the keys, values and key
// padding appended by every step ([B, H, t, D], [B, Hv, t, Dv], Bool [B, t] or undefined). Without
// gradients, keys and values are views of one buffer [B, H + Hv, room, max(D, Dv)] (the keys'
// heads, then the values') with room for later steps (grown by doubling, as a std::vector): a step
// copies only its own keys and values (one copy for both where they are one tensor's consecutive
// heads, as MultiHeadAttention's projection gives them), and a beam reorder copies the kept rows'
// filled parts into a buffer of the same room, one select for both. With gradients they are
// joined by cat.
class KeyValueCache : public DecodeState {
 public:
  void append(const Tensor& k, const Tensor& v, const Tensor& key_padding);  // raises length()
  void reorder(const Tensor& index) override;
  const Tensor& keys() const { return k_; }
  const Tensor& values() const { return v_; }
  const Tensor& key_padding() const { return pad_; }

 private:
  void check_continues(const Tensor& k, const Tensor& v) const;
  void view_filled(int64_t H, int64_t D, int64_t Hv, int64_t Dv);  // k_, v_ = kvbuf_'s first length_ positions
  Tensor k_, v_, pad_;
  Tensor kvbuf_, pbuf_;  // the buffers k_ and v_, and pad_ view (undefined: none of ours)
};

// One attention mechanism on per-head tensors. Mechanisms with state (random features, ...)
// register it as parameters or buffers, so it is saved and moved with the model.
//
// Randomness: a mechanism draws its random quantities from the default generator of the
// inputs' device (linea::manual_seed), through sample() below, which also lets a caller fix
// them: set_samples() passes values in explicitly (used as given until clear_samples()), and
// freeze_samples() keeps whatever the next forward draws for every later forward. With all
// samples fixed a mechanism is a deterministic, differentiable function of q, k, v.
class AttentionMechanism : public nn::Module {
 public:
  AttentionMechanism(std::string type_name, int64_t heads, int64_t head_dim)
      : Module(std::move(type_name)), heads_(heads), head_dim_(head_dim) {}
  // q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> [B, H, N, Dv]
  virtual Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) = 0;
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {}) {
    return forward(q, k, v, opts);
  }
  // What it can be used for; the default claims bidirectional self-attention only.
  virtual AttentionSupport support() const { return {}; }
  // Throws, naming `what` (the spec) and what the mechanism does support, unless it can be used so.
  void check_use(AttentionUse use, const std::string& what) const;

  // ---- causal decoding, one or a few positions at a time ------------------------------------
  // An empty state for this mechanism (throws when !support().incremental).
  virtual std::unique_ptr<DecodeState> start_decoding() const;
  // q, k, v [B, H, T, D|Dv]: the next T positions of a causal self-attention. Appends their
  // keys and values to `state` and returns the outputs of their queries [B, H, T, Dv], equal to
  // the causal forward over everything appended so far. key_padding: Bool/Int64 [B, T] for
  // the new keys, or undefined. The default serves the mechanisms that keep a KeyValueCache.
  virtual Tensor decode_step(const Tensor& q, const Tensor& k, const Tensor& v, DecodeState& state,
                             const Tensor& key_padding = Tensor());

  // The attention matrix [B, H, N, M] this mechanism applies to v (its estimate of softmax
  // attention), so that forward(q, k, v) == attention_matrix(q, k) @ v. O(N M) memory: for
  // tests and pictures at small N. Draws samples like forward does; fix them first
  // (freeze_samples / set_samples) to compare with a forward. Throws if not supported.
  virtual Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts);

  // Names of the random quantities this mechanism draws (empty for deterministic ones).
  virtual std::vector<std::string> sample_names() const { return {}; }
  // True when eval mode still draws them (unbiased RA: its eval output stays a sample).
  virtual bool draws_in_eval() const { return false; }
  // Uses these values instead of drawing (converted to the inputs' device and float dtype at
  // each forward; shapes checked there). Names outside sample_names() throw.
  void set_samples(const AttentionSamples& samples);
  // on: the values the next forward draws are kept for all later forwards; off: draw again.
  void freeze_samples(bool on = true);
  bool samples_frozen() const { return frozen_; }
  // Forgets explicit and frozen values and unfreezes; the next forward draws afresh.
  void clear_samples();
  // The values the last forward (or attention_matrix) used, by name.
  const AttentionSamples& last_samples() const { return last_; }

  // ---- the redraw schedule of random features kept in a buffer ------------------------------
  // redraw = N: the features are redrawn at the training calls 0, N, 2N, ... (0: never). The
  // calls are counted in the host buffer "redraw_calls" (saved in the state dict), so a resumed
  // run redraws exactly where the uninterrupted one did. Every training call counts, whether or
  // not its samples are fixed (fixed samples win over a due redraw).
  int64_t redraw_every() const { return redraw_every_; }
  int64_t redraw_calls() const;  // training calls counted so far

  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

 protected:
  // The value of random quantity `name` for this call: the explicit or frozen value when there
  // is one (must have `shape`; moved to like's device, floats converted to like's dtype),
  // otherwise draw() (which must return `shape`). Recorded in last_samples().
  Tensor sample(const std::string& name, const Shape& shape, const Tensor& like, const std::function<Tensor()>& draw);
  // Declares the schedule (constructor only): registers the counter buffer.
  void init_redraw(int64_t every);
  // One call of the schedule: in training mode counts it and returns whether the features are
  // due for a redraw; in eval mode returns false and counts nothing.
  bool redraw_due();
  // For decode_step overrides: checks a step's inputs (as many new queries as keys, this
  // mechanism's heads and head dim).
  void check_step(const Tensor& q, const Tensor& k, const Tensor& v) const;
  static void advance(DecodeState& state, int64_t steps) { state.length_ += steps; }

 private:
  int64_t heads_, head_dim_;
  bool frozen_ = false;
  AttentionSamples fixed_;  // explicit or frozen values
  AttentionSamples last_;
  int64_t redraw_every_ = 0;
  Tensor redraw_calls_;  // Int64 0-d, host buffer
};

// ---- helpers shared by mechanisms ---------------------------------------------------------------
// Checks q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] (same dtype and device), the key
// padding mask [B, M] and the query offset; `who` names the mechanism in the error.
void check_attention_inputs(const std::string& who, const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionOptions& opts);
// The key padding mask as Bool [B, M] (true = padding); undefined when there is none.
Tensor key_padding_bool(const Tensor& mask);
inline Tensor key_padding_bool(const AttentionOptions& opts) { return key_padding_bool(opts.key_padding_mask); }
// Bool [N, M], true where key m is hidden from query n by causality: m > n + offset. The one
// definition of causal visibility every mechanism uses.
Tensor causal_hidden(int64_t N, int64_t M, int64_t offset, Device device);
// Bool [B or 1, 1, N, M], true where key m is hidden from query n (causal and/or padding);
// undefined when nothing is masked.
Tensor attention_mask(const AttentionOptions& opts, int64_t N, int64_t M, Device device);

// softmax over `dim` of logits with the entries where `hidden` (Bool, broadcast to logits) is
// true left out; a slice with every entry hidden gives zeros, not NaN. hidden may be undefined.
Tensor masked_softmax(const Tensor& logits, const Tensor& hidden, int64_t dim);

}  // namespace linea::attn
