// Pre-LN transformer blocks and stacks, the attention mechanism chosen by a spec string:
//   encoder layer:  x = x + drop(attn(ln1(x)));  x = x + drop(mlp(ln2(x)))
//   decoder layer:  x = x + drop(self_attn(ln1(x), causal));
//                   x = x + drop(cross_attn(ln2(x), memory, memory padding mask));
//                   x = x + drop(mlp(ln3(x)))
// mlp is FeedForward (fc1, GELU, dropout, fc2); `drop` is a Dropout of the same p on each
// residual branch. Stacks hold their layers in a ModuleList "layers" and end with a LayerNorm
// "norm" (pre-LN blocks leave the residual stream unnormalized). Parameter names follow, e.g.
// "layers.0.attn.q_proj.weight", "layers.1.mlp.fc2.bias", "norm.weight".
// Not here: embeddings and heads (the apps build their models from these blocks), attention
// dropout (a spec option: "softmax:dropout=0.1").
#pragma once

#include <memory>
#include <string>

#include "nn/attention.h"
#include "nn/layers.h"

namespace linea::nn {

class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout = 0.0,
                          const std::string& spec = "softmax");
  // x [B, N, dim] -> [B, N, dim]; opts: causal (a causal LM) and/or a key padding mask [B, N].
  Tensor forward(const Tensor& x, const AttentionOptions& opts = {});
  Tensor operator()(const Tensor& x, const AttentionOptions& opts = {}) { return forward(x, opts); }

  const std::shared_ptr<MultiHeadAttention>& attn() const { return attn_; }
  const std::shared_ptr<FeedForward>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<MultiHeadAttention> attn_;
  std::shared_ptr<FeedForward> mlp_;
  std::shared_ptr<Dropout> drop_;
};

class TransformerDecoderLayer : public Module {
 public:
  // cross_spec: the cross-attention's mechanism ("" = the same as spec).
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

  const std::shared_ptr<MultiHeadAttention>& self_attn() const { return self_attn_; }
  const std::shared_ptr<MultiHeadAttention>& cross_attn() const { return cross_attn_; }
  const std::shared_ptr<FeedForward>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_, ln3_;
  std::shared_ptr<MultiHeadAttention> self_attn_, cross_attn_;
  std::shared_ptr<FeedForward> mlp_;
  std::shared_ptr<Dropout> drop_;
};

class TransformerEncoder : public Module {
 public:
  TransformerEncoder(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout = 0.0,
                     const std::string& spec = "softmax");
  Tensor forward(const Tensor& x, const AttentionOptions& opts = {});  // [B, N, dim] -> [B, N, dim]
  Tensor operator()(const Tensor& x, const AttentionOptions& opts = {}) { return forward(x, opts); }

  const std::shared_ptr<ModuleList>& layers() const { return layers_; }
  std::shared_ptr<TransformerEncoderLayer> layer(size_t i) const { return layers_->at<TransformerEncoderLayer>(i); }
  const std::shared_ptr<LayerNorm>& norm() const { return norm_; }

 private:
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<LayerNorm> norm_;
};

class TransformerDecoder : public Module {
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

  const std::shared_ptr<ModuleList>& layers() const { return layers_; }
  std::shared_ptr<TransformerDecoderLayer> layer(size_t i) const { return layers_->at<TransformerDecoderLayer>(i); }
  const std::shared_ptr<LayerNorm>& norm() const { return norm_; }

 private:
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<LayerNorm> norm_;
};

}  // namespace linea::nn
