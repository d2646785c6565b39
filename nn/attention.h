// Attention as a layer: the per-head mechanism interface (AttentionKernel), the spec strings
// that select one ("softmax", "performer:features=128,kernel=relu"), the registry that builds
// them by name, the exact softmax mechanism, and MultiHeadAttention, which owns the q/k/v/out
// projections and runs any registered mechanism on the per-head tensors.
//
// Conventions every mechanism follows (DESIGN.md, "Attention layer contract"):
//  - q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> out [B, H, N, Dv]; M may differ from N
//    (cross-attention);
//  - scores are scaled by 1/sqrt(D);
//  - AttentionOptions::causal: key m is visible to query n iff m <= n (aligned top-left when
//    N != M, as PyTorch's is_causal);
//  - AttentionOptions::key_padding_mask: Bool or Int64 [B, M], true / nonzero = padding (hidden
//    from every query); a query that sees no key at all gets a zero output, never NaN.
//
// Not here: the other mechanisms (performer, ra, lara, nprf_rpe: the attention/ directory),
// transformer blocks (nn/transformer.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace linea::nn {

// A parsed spec "name[:key=value[,key=value...]]". Getters return the default when the key is
// absent and throw when its value does not parse; each key a getter asks about becomes known,
// and check_all_used() then rejects any key no getter asked about (a typo such as
// "performer:feature=64" is an error, not a silently ignored option).
struct AttentionSpec {
  std::string name;
  std::map<std::string, std::string> options;

  // Throws linea::Error for malformed specs: empty name or key, a missing '=' or value,
  // duplicate keys, characters outside [A-Za-z0-9_.+-] in names, keys and values.
  static AttentionSpec parse(const std::string& spec);
  std::string str() const;  // canonical form: name, then key=value sorted by key

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;  // 1/0, true/false, yes/no, on/off
  std::string get_string(const std::string& key, const std::string& def) const;
  // Throws naming every key no getter has asked about, and the keys that were asked about.
  void check_all_used() const;

 private:
  const std::string* lookup(const std::string& key) const;  // marks key as known
  mutable std::set<std::string> known_;
};

struct AttentionOptions {
  bool causal = false;
  Tensor key_padding_mask;  // Bool or Int64 [B, M]; true / nonzero = padding; undefined = none
};

// The random quantities of a mechanism, by name (shapes for q [B, H, N, D], v [.., Dv]):
//   "omega"    [H, S, D]        feature rows of W (performer, nprf_rpe)
//   "eps"      [B, H, N, S, D]  Gaussian noise of ra;  [B, H, C, D] of lara
//   "ra_index" Int64 [B, H, N, S]  ra's sampled mixture components
using AttentionSamples = std::map<std::string, Tensor>;

// One attention mechanism on per-head tensors. Mechanisms with state (random features, ...)
// register it as parameters or buffers, so it is saved and moved with the model.
//
// Randomness: a mechanism draws its random quantities from the default generator of the
// inputs' device (linea::manual_seed), through sample() below, which also lets a caller fix
// them: set_samples() passes values in explicitly (used as given until clear_samples()), and
// freeze_samples() keeps whatever the next forward draws for every later forward. With all
// samples fixed a mechanism is a deterministic, differentiable function of q, k, v.
class AttentionKernel : public Module {
 public:
  AttentionKernel(std::string type_name, int64_t heads, int64_t head_dim)
      : Module(std::move(type_name)), heads_(heads), head_dim_(head_dim) {}
  // q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> [B, H, N, Dv]
  virtual Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) = 0;
  Tensor operator()(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {}) {
    return forward(q, k, v, opts);
  }
  // The attention matrix [B, H, N, M] this mechanism applies to v (its estimate of softmax
  // attention), so that forward(q, k, v) == attention_matrix(q, k) @ v. O(N M) memory: for
  // tests and pictures at small N. Draws samples like forward does; fix them first
  // (freeze_samples / set_samples) to compare with a forward. Throws if not supported.
  virtual Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts);

  // Names of the random quantities this mechanism draws (empty for deterministic ones).
  virtual std::vector<std::string> sample_names() const { return {}; }
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

  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

 protected:
  // The value of random quantity `name` for this call: the explicit or frozen value when there
  // is one (must have `shape`; moved to like's device, floats converted to like's dtype),
  // otherwise draw() (which must return `shape`). Recorded in last_samples().
  Tensor sample(const std::string& name, const Shape& shape, const Tensor& like, const std::function<Tensor()>& draw);

 private:
  int64_t heads_, head_dim_;
  bool frozen_ = false;
  AttentionSamples fixed_;  // explicit or frozen values
  AttentionSamples last_;
};

// ---- registry ---------------------------------------------------------------------------------
using AttentionFactory =
    std::function<std::shared_ptr<AttentionKernel>(const AttentionSpec& spec, int64_t heads, int64_t head_dim)>;

// Adds a mechanism under `name` (throws if the name is taken or malformed). `softmax` is built in.
// Note for mechanisms in other files of the static library: an object file that nothing
// references is not linked, so register from a function that the program (or
// detail::register_builtin_attentions) calls, not from a static initializer alone.
void register_attention(const std::string& name, AttentionFactory factory);
namespace detail {
// Defined in attention/builtin.cpp (performer, ra, lara, nprf_rpe); the registry calls it once.
void register_builtin_attentions(std::map<std::string, AttentionFactory>& factories);
}  // namespace detail
std::vector<std::string> registered_attentions();  // sorted names
// Parses the spec, builds the mechanism, and checks every option was used. Throws
// "unknown attention 'x' (known: softmax, ...)" for an unregistered name.
std::shared_ptr<AttentionKernel> make_attention(const std::string& spec, int64_t heads, int64_t head_dim);
std::shared_ptr<AttentionKernel> make_attention(const AttentionSpec& spec, int64_t heads, int64_t head_dim);

// ---- helpers shared by mechanisms ---------------------------------------------------------------
// Checks q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] (same dtype and device) and the key
// padding mask [B, M]; `who` names the mechanism in the error.
void check_attention_inputs(const std::string& who, const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionOptions& opts);
// The key padding mask as Bool [B, M] (true = padding); undefined when there is none.
Tensor key_padding_bool(const AttentionOptions& opts);
// Bool [B or 1, 1, N, M], true where key m is hidden from query n (causal and/or padding);
// undefined when nothing is masked.
Tensor attention_mask(const AttentionOptions& opts, int64_t N, int64_t M, Device device);

// softmax over `dim` of logits with the entries where `hidden` (Bool, broadcast to logits) is
// true left out; a slice with every entry hidden gives zeros, not NaN. hidden may be undefined.
Tensor masked_softmax(const Tensor& logits, const Tensor& hidden, int64_t dim);

// Exact scaled dot-product attention: softmax(q k^T / sqrt(D) + mask) v, with dropout p on the
// attention weights when training. Differentiable in q, k, v.
Tensor softmax_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {},
                         double dropout = 0.0, bool training = false);

// The `softmax` mechanism. Spec options: dropout=p (on the attention weights, training only).
class SoftmaxAttention : public AttentionKernel {
 public:
  SoftmaxAttention(int64_t heads, int64_t head_dim, double dropout = 0.0);
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) override;
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) override;
  std::string extra_repr() const override;
  double dropout() const { return dropout_; }

 private:
  double dropout_;
};

// Multi-head attention: q_proj (dim -> dim), k_proj and v_proj (kv_dim -> dim), the mechanism
// ("kernel", chosen by spec) on [B, heads, L, dim/heads], and out_proj (dim -> dim). Projection
// weights truncated normal 0.02, biases zero. kv_dim = -1 means dim.
class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t dim, int64_t heads, const std::string& spec = "softmax", bool bias = true,
                     int64_t kv_dim = -1);
  // x_q [B, N, dim], x_kv [B, M, kv_dim] (pass x_q again for self-attention) -> [B, N, dim]
  Tensor forward(const Tensor& x_q, const Tensor& x_kv, const AttentionOptions& opts = {});
  Tensor operator()(const Tensor& x_q, const Tensor& x_kv, const AttentionOptions& opts = {}) {
    return forward(x_q, x_kv, opts);
  }
  std::string extra_repr() const override;

  int64_t dim() const { return dim_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return dim_ / heads_; }
  const std::string& spec() const { return spec_; }
  const std::shared_ptr<Linear>& q_proj() const { return q_proj_; }
  const std::shared_ptr<Linear>& k_proj() const { return k_proj_; }
  const std::shared_ptr<Linear>& v_proj() const { return v_proj_; }
  const std::shared_ptr<Linear>& out_proj() const { return out_proj_; }
  const std::shared_ptr<AttentionKernel>& kernel() const { return kernel_; }

 private:
  int64_t dim_, heads_, kv_dim_;
  std::string spec_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, out_proj_;
  std::shared_ptr<AttentionKernel> kernel_;
};

}  // namespace linea::nn
