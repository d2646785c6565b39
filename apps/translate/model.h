// The translate app's encoder-decoder transformer (Vaswani et al., 2017, pre-LN), built from the
// attention/ blocks:
//   source ids [B, S] -> embed * sqrt(dim) + positions -> dropout -> TransformerEncoder -> memory
//   target ids [B, T] (bos + tokens) -> embed * sqrt(dim) + positions -> dropout
//     -> TransformerDecoder (causal self-attention, cross-attention on the memory) -> logits [B, T, V]
// The output layer is the target embedding transposed (tied); with one joint vocabulary the
// source, target and output share a single embedding matrix "embed.weight" (else "src_embed"
// and "tgt_embed"). Positions: the fixed sinusoids (default: any length up to max_len, nothing to
// learn), learned embeddings, or none (nprf_rpe brings its own relative positions).
// Each attention is chosen by a spec string: the encoder takes any mechanism, the decoder's
// causal self-attention softmax, performer or nprf_rpe, the cross-attention any that supports it.
// Decoding: start(memory) projects the encoder memory once per layer; step(tokens, state) runs
// the next position of every decoder row (beams are rows [sentence][beam]; see attention/multihead.h).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "attention/transformer.h"
#include "nn/layers.h"

namespace translate {

struct ModelConfig {
  int64_t src_vocab = 0, tgt_vocab = 0;  // equal with a joint vocabulary
  bool joint_vocab = true;               // one embedding for source, target and output
  int64_t dim = 256, heads = 4, enc_layers = 3, dec_layers = 3, mlp_hidden = 1024;
  double dropout = 0.1;
  std::string enc_attention = "softmax", dec_attention = "softmax", cross_attention = "softmax";
  std::string positions = "sinusoidal";  // sinusoidal, learned or none
  int64_t max_len = 256;                 // longest source or target sequence (tokens, with eos)
  int64_t pad_id = 0, bos_id = 2, eos_id = 3;
};

// config.json's "model" (apps/common/config_json.h): json(config), model_from_json(j).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, src_vocab, tgt_vocab, joint_vocab, dim, heads, enc_layers, dec_layers,
                                   mlp_hidden, dropout, enc_attention, dec_attention, cross_attention, positions,
                                   max_len, pad_id, bos_id, eos_id)
ModelConfig model_from_json(const nlohmann::json& j);  // a missing key or a wrong type is a linea::Error naming it

class Seq2Seq : public linea::nn::Module {
 public:
  explicit Seq2Seq(const ModelConfig& cfg);
  // src [B, S] Int64, src_pad Bool [B, S] (true: padding) -> memory [B, S, dim]
  linea::Tensor encode(const linea::Tensor& src, const linea::Tensor& src_pad);
  // tgt_in [B, T] (bos + tokens), the memory and its padding -> logits [B, T, tgt_vocab]
  linea::Tensor decode(const linea::Tensor& tgt_in, const linea::Tensor& memory, const linea::Tensor& src_pad);
  linea::Tensor forward(const linea::Tensor& src, const linea::Tensor& src_pad, const linea::Tensor& tgt_in) {
    return decode(tgt_in, encode(src, src_pad), src_pad);
  }

  // Incremental decoding: the memory of Bm sentences -> a state for B = Bm * beams rows; then
  // step(tokens [B]) -> logits [B, tgt_vocab] of the position after `tokens`.
  linea::attn::DecoderState start(const linea::Tensor& memory, const linea::Tensor& src_pad);
  linea::Tensor step(const linea::Tensor& tokens, linea::attn::DecoderState& state);

  const ModelConfig& config() const { return cfg_; }

 private:
  // ids [B, L] at positions offset.. -> scaled embeddings + positions, dropped out: [B, L, dim]
  linea::Tensor embed(const std::shared_ptr<linea::nn::Embedding>& table,
                      const std::shared_ptr<linea::nn::LearnedPositionalEmbedding>& learned, const linea::Tensor& ids,
                      int64_t offset);
  linea::Tensor logits(const linea::Tensor& h);  // [.., dim] -> [.., tgt_vocab] with the tied embedding

  ModelConfig cfg_;
  std::shared_ptr<linea::nn::Embedding> src_embed_, tgt_embed_;  // the same module with a joint vocabulary
  std::shared_ptr<linea::nn::SinusoidalPositionalEmbedding> sin_pos_;
  std::shared_ptr<linea::nn::LearnedPositionalEmbedding> src_pos_, tgt_pos_;
  std::shared_ptr<linea::nn::Dropout> drop_;
  std::shared_ptr<linea::attn::TransformerEncoder> encoder_;
  std::shared_ptr<linea::attn::TransformerDecoder> decoder_;
};

}  // namespace translate
