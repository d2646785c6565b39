// Pre-LN transformer blocks and stacks, the attention mechanism chosen by a spec string:
//   encoder layer:  x = x + drop(attn(ln1(x)));  x = x + drop(mlp(ln2(x)))
//   decoder layer:  x = x + drop(self_attn(ln1(x), causal));
//                   x = x + drop(cross_attn(ln2(x), memory, memory padding mask));
//                   x = x + drop(mlp(ln3(x)))
// mlp is FeedForward (fc1, GELU, dropout, fc2); `drop` is a Dropout of the same p on each
// residual branch. Stacks hold their layers in a ModuleList "layers" and end with a LayerNorm
// "norm" (pre-LN blocks leave the residual stream unnormalized). Parameter names follow, e.g.
// "layers.0.attn.q_proj.weight", "layers.1.mlp.fc2.bias", "norm.weight".
// The residual stream runs between layers as two terms, x = base + drop(delta) (Residual): each
// residual sum, with its dropout, is computed inside the layer norm that follows it
// (add_layer_norm, one kernel for the three), the last one inside the stack's final norm. The
// values are those of the formulas above: dropout, add, then norm, with the same draws.
// Decoding: TransformerDecoder::start(memory) makes a DecoderState (one self-attention and one
// cross-attention cache per layer, attention/multihead.h), and step() runs the next positions
// through every layer, on the same two-term stream, as the full causal forward would compute them.
// Not here: embeddings and heads (the apps build their models from these blocks), attention
// dropout (a spec option: "softmax:dropout=0.1").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/multihead.h"
#include "nn/layers.h"

namespace linea::attn {

// The residual stream as two terms still to be added, base + drop(delta) (delta undefined: just
// base; drop null or off: delta as it is).
struct Residual {
  Tensor base, delta;
  nn::Dropout* drop = nullptr;
  Tensor sum() const {
    if (!delta.defined()) return base;
    return add(base, drop != nullptr ? drop->forward(delta) : delta);
  }
};

class TransformerEncoderLayer : public nn::Module {
 public:
  TransformerEncoderLayer(int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout = 0.0,
                          const std::string& spec = "softmax");
  // x [B, N, dim] -> [B, N, dim]; opts: causal (a causal LM) and/or a key padding mask [B, N].
  Tensor forward(const Tensor& x, const AttentionOptions& opts = {});
  Tensor operator()(const Tensor& x, const AttentionOptions& opts = {}) { return forward(x, opts); }
  // The same on the two-term stream (see the top of this file): in.sum() -> out.sum().
  Residual forward(const Residual& in, const AttentionOptions& opts = {});

  const std::shared_ptr<MultiHeadAttention>& attn() const { return attn_; }
  const std::shared_ptr<nn::FeedForward>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<nn::LayerNorm> ln1_, ln2_;
  std::shared_ptr<MultiHeadAttention> attn_;
  std::shared_ptr<nn::FeedForward> mlp_;
  std::shared_ptr<nn::Dropout> drop_;
};

class TransformerDecoderLayer : public nn::Module {
 public:
  // spec: the causal self-attention (softmax, performer, nprf_rpe); cross_spec: the
  // cross-attention ("" = the same as spec). An unsupported use fails here.
  TransformerDecoderLayer(int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout = 0.0,
                          const std::string& spec = "softmax", const std::string& cross_spec = "");
  // x [B, N, dim] (targets), memory [B, M, dim] (encoder output) -> [B, N, dim].
  // memory_key_padding_mask [B, M] hides padded source positions from the cross-attention;
  // tgt_key_padding_mask [B, N] hides padded target positions from the self-attention.
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& memory_key_padding_mask = Tensor(),
                 const Tensor& tgt_key_padding_mask = Tensor());
  Tensor operator()(const Tensor& x, const Tensor& memory, const Tensor& memory_key_padding_mask = Tensor(),
                    const Tensor& tgt_key_padding_mask = Tensor()) {
    return forward(x, memory, memory_key_padding_mask, tgt_key_padding_mask);
  }
  // The same on the two-term stream (see the top of this file): in.sum() -> out.sum().
  Residual forward(const Residual& in, const Tensor& memory, const Tensor& memory_key_padding_mask,
                   const Tensor& tgt_key_padding_mask);
  // The next positions x [B, T, dim] -> [B, T, dim] given the layer's caches (start_self() of
  // self_attn(), start_cross(memory) of cross_attn()); key_padding [B, T] or undefined.
  Tensor step(const Tensor& x, AttentionCache& self_cache, AttentionCache& cross_cache,
              const Tensor& key_padding = Tensor());
  // The same on the two-term stream, as forward: each residual add in the next norm's kernel.
  Residual step(const Residual& in, AttentionCache& self_cache, AttentionCache& cross_cache,
                const Tensor& key_padding = Tensor());

  const std::shared_ptr<MultiHeadAttention>& self_attn() const { return self_attn_; }
  const std::shared_ptr<MultiHeadAttention>& cross_attn() const { return cross_attn_; }
  const std::shared_ptr<nn::FeedForward>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<nn::LayerNorm> ln1_, ln2_, ln3_;
  std::shared_ptr<MultiHeadAttention> self_attn_, cross_attn_;
  std::shared_ptr<nn::FeedForward> mlp_;
  std::shared_ptr<nn::Dropout> drop_;
};

class TransformerEncoder : public nn::Module {
 public:
  TransformerEncoder(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout = 0.0,
                     const std::string& spec = "softmax");
  Tensor forward(const Tensor& x, const AttentionOptions& opts = {});  // [B, N, dim] -> [B, N, dim]
  Tensor operator()(const Tensor& x, const AttentionOptions& opts = {}) { return forward(x, opts); }

  const std::shared_ptr<nn::ModuleList>& layers() const { return layers_; }
  std::shared_ptr<TransformerEncoderLayer> layer(size_t i) const { return layers_->at<TransformerEncoderLayer>(i); }
  const std::shared_ptr<nn::LayerNorm>& norm() const { return norm_; }

 private:
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

// What a TransformerDecoder keeps between decoding steps: one self- and one cross-attention
// cache per layer. reorder() keeps the decoder rows `index` (beam search; see AttentionCache).
class DecoderState {
 public:
  int64_t length() const { return self_.empty() ? 0 : self_.front().length(); }
  void reorder(const Tensor& index) {
    for (auto& c : self_) c.reorder(index);
    for (auto& c : cross_) c.reorder(index);
  }
  // Keeps the sentences `sentences` (Int64 [Bm']) with their `beams` rows (beam search drops
  // finished sentences; see AttentionCache::keep_sentences).
  void keep_sentences(const Tensor& sentences, int64_t beams) {
    for (auto& c : self_) c.keep_sentences(sentences, beams);
    for (auto& c : cross_) c.keep_sentences(sentences, beams);
  }

 private:
  friend class TransformerDecoder;
  std::vector<AttentionCache> self_, cross_;
};

class TransformerDecoder : public nn::Module {
 public:
  TransformerDecoder(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout = 0.0,
                     const std::string& spec = "softmax", const std::string& cross_spec = "");
  // x [B, N, dim], memory [B, M, dim] -> [B, N, dim] (masks as TransformerDecoderLayer)
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& memory_key_padding_mask = Tensor(),
                 const Tensor& tgt_key_padding_mask = Tensor());
  Tensor operator()(const Tensor& x, const Tensor& memory, const Tensor& memory_key_padding_mask = Tensor(),
                    const Tensor& tgt_key_padding_mask = Tensor()) {
    return forward(x, memory, memory_key_padding_mask, tgt_key_padding_mask);
  }
  // Decoding: the memory [Bm, M, dim] projected once per layer; then step() with the next
  // positions x [B, T, dim] (B = Bm * beams, rows [sentence][beam]) -> [B, T, dim], normalized
  // like forward's output.
  DecoderState start(const Tensor& memory, const Tensor& memory_key_padding_mask = Tensor());
  Tensor step(const Tensor& x, DecoderState& state, const Tensor& key_padding = Tensor());

  const std::shared_ptr<nn::ModuleList>& layers() const { return layers_; }
  std::shared_ptr<TransformerDecoderLayer> layer(size_t i) const { return layers_->at<TransformerDecoderLayer>(i); }
  const std::shared_ptr<nn::LayerNorm>& norm() const { return norm_; }

 private:
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

}  // namespace linea::attn
