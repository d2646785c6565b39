#include "model.h"

#include <cmath>

#include "apps/common/config_json.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/init.h"

using namespace linea;
using json = nlohmann::json;

namespace translate {

ModelConfig model_from_json(const json& j) {
  return linea::apps::config_from_json<ModelConfig>(j, "translate: the model config");
}

namespace {
// fairseq's embedding initialization, for the sqrt(dim) input scale.
std::shared_ptr<nn::Embedding> make_embedding(int64_t vocab, int64_t dim, int64_t pad) {
  auto e = std::make_shared<nn::Embedding>(vocab, dim, pad);
  nn::init::scaled_embedding_(e->weight(), pad);
  return e;
}
}  // namespace

Seq2Seq::Seq2Seq(const ModelConfig& c) : nn::Module("Seq2Seq"), cfg_(c) {
  LINEA_CHECK(c.src_vocab > 3 && c.tgt_vocab > 3, "translate: vocabulary sizes must exceed the 4 special tokens, got ",
              c.src_vocab, " and ", c.tgt_vocab);
  LINEA_CHECK(!c.joint_vocab || c.src_vocab == c.tgt_vocab, "translate: a joint vocabulary needs equal sizes, got ",
              c.src_vocab, " and ", c.tgt_vocab);
  LINEA_CHECK(c.dim > 0 && c.heads > 0 && c.dim % c.heads == 0, "translate: --dim ", c.dim,
              " must be a positive multiple of --heads ", c.heads);
  LINEA_CHECK(c.enc_layers > 0 && c.dec_layers > 0 && c.mlp_hidden > 0 && c.max_len > 1,
              "translate: layers, --mlp-hidden and --max-len must be positive, got ", c.enc_layers, ", ", c.dec_layers,
              ", ", c.mlp_hidden, ", ", c.max_len);
  LINEA_CHECK(c.positions == "sinusoidal" || c.positions == "learned" || c.positions == "none",
              "translate: --positions must be sinusoidal, learned or none, got '", c.positions, "'");
  if (c.joint_vocab) {
    src_embed_ = tgt_embed_ = register_module("embed", make_embedding(c.src_vocab, c.dim, c.pad_id));
  } else {
    src_embed_ = register_module("src_embed", make_embedding(c.src_vocab, c.dim, c.pad_id));
    tgt_embed_ = register_module("tgt_embed", make_embedding(c.tgt_vocab, c.dim, c.pad_id));
  }
  if (c.positions == "sinusoidal") {
    sin_pos_ = register_module("pos", std::make_shared<nn::SinusoidalPositionalEmbedding>(c.max_len, c.dim));
  } else if (c.positions == "learned") {
    src_pos_ = register_module("src_pos", std::make_shared<nn::LearnedPositionalEmbedding>(c.max_len, c.dim));
    tgt_pos_ = register_module("tgt_pos", std::make_shared<nn::LearnedPositionalEmbedding>(c.max_len, c.dim));
  }
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(c.dropout));
  encoder_ = register_module("encoder", std::make_shared<attn::TransformerEncoder>(
                                            c.enc_layers, c.dim, c.heads, c.mlp_hidden, c.dropout, c.enc_attention));
  decoder_ = register_module("decoder", std::make_shared<attn::TransformerDecoder>(c.dec_layers, c.dim, c.heads,
                                                                                   c.mlp_hidden, c.dropout,
                                                                                   c.dec_attention, c.cross_attention));
}

Tensor Seq2Seq::embed(const std::shared_ptr<nn::Embedding>& table,
                      const std::shared_ptr<nn::LearnedPositionalEmbedding>& learned, const Tensor& ids,
                      int64_t offset) {
  LINEA_CHECK(ids.dim() == 2 && ids.dtype() == DType::Int64, "translate: expected token ids Int64 [B, L], got ",
              dtype_name(ids.dtype()), " ", shape_str(ids.shape()));
  LINEA_CHECK(offset + ids.size(1) <= cfg_.max_len, "translate: a sequence of ", offset + ids.size(1),
              " tokens is longer than the model's maximum of ", cfg_.max_len, " (--max-len)");
  // scale * table[ids] + positions in one kernel; the modules hold the tables.
  const Tensor positions = sin_pos_ ? sin_pos_->table() : learned ? learned->weight() : Tensor();
  Tensor x = embed_tokens(table->weight(), ids, std::sqrt(static_cast<double>(cfg_.dim)), positions, offset,
                          table->padding_idx());
  return (*drop_)(x);
}

Tensor Seq2Seq::logits(const Tensor& h) { return matmul(h, transpose(tgt_embed_->weight(), 0, 1)); }

Tensor Seq2Seq::encode(const Tensor& src, const Tensor& src_pad) {
  Tensor x = embed(src_embed_, src_pos_, src, 0);
  attn::AttentionOptions o;
  o.key_padding_mask = src_pad;
  return (*encoder_)(x, o);
}

Tensor Seq2Seq::decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src_pad) {
  Tensor x = embed(tgt_embed_, tgt_pos_, tgt_in, 0);
  // No target padding mask: padding only ever follows a sentence's tokens, and a causal
  // self-attention never lets a real position see a later one.
  return logits((*decoder_)(x, memory, src_pad));
}

attn::DecoderState Seq2Seq::start(const Tensor& memory, const Tensor& src_pad) {
  return decoder_->start(memory, src_pad);
}

Tensor Seq2Seq::step(const Tensor& tokens, attn::DecoderState& state) {
  LINEA_CHECK(tokens.dim() == 1, "translate: step expects tokens [B], got ", shape_str(tokens.shape()));
  const int64_t t = state.length();
  Tensor x = embed(tgt_embed_, tgt_pos_, reshape(tokens, {tokens.size(0), 1}), t);
  return reshape(logits(decoder_->step(x, state)), {tokens.size(0), cfg_.tgt_vocab});
}

}  // namespace translate
