// The protein app's masked language model: an encoder-only pre-LN transformer built from the
// attention/ blocks, ESM-2's shape at a small size:
//   tokens [B, T] -> embed (33 x dim) + learned positions (or none) -> dropout
//   -> TransformerEncoder (pre-LN, `layers` layers, self-attention chosen by `attention`, padding
//      hidden by the key padding mask) -> hidden [B, T, dim] (after the final LayerNorm)
//   -> LM head as ESM's: Linear(dim, dim) -> GELU -> LayerNorm -> x @ embed.weight^T + bias
//   -> logits [B, T, 33]
// The output projection is the token embedding (tied). Positions: "learned" (max_len x dim) or
// "none" (nprf_rpe brings its relative bias; the other mechanisms then see a bag of residues).
// Parameter names: embed.weight, pos.weight, encoder.layers.<i>.*, encoder.norm.*,
// head.dense.*, head.norm.*, head.bias.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "attention/transformer.h"
#include "nn/layers.h"

namespace protein {

struct ModelConfig {
  int64_t dim = 256, heads = 4, layers = 4, mlp_hidden = 1024;
  double dropout = 0.0;
  std::string attention = "softmax";  // any of the five mechanisms' specs
  std::string positions = "learned";  // learned | none
  int64_t max_len = 256;              // tokens per window, with <cls>/<eos>
};

// config.json's "model" (apps/common/config_json.h): json(config), model_from_json(j).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, dim, heads, layers, mlp_hidden, dropout, attention, positions, max_len)
ModelConfig model_from_json(const nlohmann::json& j);  // a missing key or a wrong type is a linea::Error naming it

class ProteinLM : public linea::nn::Module {
 public:
  explicit ProteinLM(const ModelConfig& cfg);  // bad settings: linea::Error naming the flag
  // tokens Int64 [B, T], pad Bool [B, T] (true: padding; may be undefined) -> hidden [B, T, dim].
  // T > max_len is a linea::Error naming --max-len.
  linea::Tensor hidden(const linea::Tensor& tokens, const linea::Tensor& pad);
  linea::Tensor logits(const linea::Tensor& hidden);  // [.., dim] -> [.., 33]
  linea::Tensor forward(const linea::Tensor& tokens, const linea::Tensor& pad) { return logits(hidden(tokens, pad)); }
  const ModelConfig& config() const { return cfg_; }

 private:
  ModelConfig cfg_;
  std::shared_ptr<linea::nn::Embedding> embed_;
  std::shared_ptr<linea::nn::LearnedPositionalEmbedding> pos_;
  std::shared_ptr<linea::nn::Dropout> drop_;
  std::shared_ptr<linea::attn::TransformerEncoder> encoder_;
  std::shared_ptr<linea::nn::Linear> head_dense_;
  std::shared_ptr<linea::nn::LayerNorm> head_norm_;
  linea::Tensor head_bias_;
};

}  // namespace protein
