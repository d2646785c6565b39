// ProteinLM: the protein app's masked language model (model.h), ESM-2's layout at a small size.
// Not here: masking and batching (dataset.h), the loss and metrics (train.h), using a trained
// model (predictor.h).
#include "model.h"

#include <cmath>

#include "alphabet.h"
#include "apps/common/config_json.h"
#include "attention/registry.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/init.h"

using namespace linea;
using json = nlohmann::json;

namespace protein {

ModelConfig model_from_json(const json& j) {
  return linea::apps::config_from_json<ModelConfig>(j, "protein: the model config");
}

namespace {
// The spec the encoder is built with: a mechanism built for a longest sequence (its length
// option, e.g. nprf_rpe's relative-position table) must reach across a whole window, so it gets
// the model's unless the spec says otherwise (and a shorter one is refused here rather than at
// the first long batch). Other specs are passed as written; the registry reports a malformed or
// unknown one.
std::string encoder_spec(const ModelConfig& c) {
  const attn::AttentionSpec spec = attn::AttentionSpec::parse(c.attention);
  const std::string key = attn::attention_info(spec.name).length_option;
  if (key.empty()) return c.attention;
  const int64_t len = spec.get_int(key, c.max_len);
  LINEA_CHECK(len >= c.max_len, "protein: --attention '", c.attention, "' has ", key, "=", len,
              ", shorter than the model's windows (--max-len ", c.max_len, "); leave ", key,
              " out of the spec to use --max-len");
  return attn::with_length(c.attention, c.max_len);
}
}  // namespace

ProteinLM::ProteinLM(const ModelConfig& c) : nn::Module("ProteinLM"), cfg_(c) {
  LINEA_CHECK(c.dim > 0 && c.heads > 0 && c.dim % c.heads == 0, "protein: --dim ", c.dim,
              " must be a positive multiple of --heads ", c.heads);
  LINEA_CHECK(c.layers > 0, "protein: --layers must be positive, got ", c.layers);
  LINEA_CHECK(c.mlp_hidden > 0, "protein: --mlp-hidden must be positive, got ", c.mlp_hidden);
  LINEA_CHECK(c.dropout >= 0 && c.dropout < 1, "protein: --dropout must be in [0, 1), got ", c.dropout);
  LINEA_CHECK(c.positions == "learned" || c.positions == "none", "protein: --positions must be learned or none, got '",
              c.positions, "'");
  LINEA_CHECK(c.max_len >= 3, "protein: --max-len must be at least 3 (<cls>, one residue, <eos>), got ", c.max_len);
  const std::string spec = encoder_spec(c);

  // The embedding: N(0, dim^-1/2) with the <pad> row zero, multiplied by sqrt(dim) at the input
  // (fairseq's transformer, as the translate app). ESM-2 instead keeps nn.Embedding's N(0, 1)
  // unscaled; both give the encoder unit-size inputs, but with the head tied to this matrix ESM's
  // choice starts with logits of size ~sqrt(dim) (16 at dim 256), while rows of norm ~1 start
  // near the uniform prediction (loss ~ log 33), which is what short training runs need.
  embed_ = register_module("embed", std::make_shared<nn::Embedding>(kVocabSize, c.dim, kPad));
  nn::init::scaled_embedding_(embed_->weight(), kPad);
  // Learned positions at the scale of the scaled token embeddings (unit-size coordinates): the
  // layer's own ViT-style init (std 0.02) is 50 times weaker than the tokens here, and a toy
  // model then never learned that a residue follows from its left neighbour (test_protein).
  if (c.positions == "learned") {
    pos_ = register_module("pos", std::make_shared<nn::LearnedPositionalEmbedding>(c.max_len, c.dim));
    nn::init::normal_(pos_->weight(), 0.0, 1.0);
  }
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(c.dropout));
  encoder_ = register_module(
      "encoder", std::make_shared<attn::TransformerEncoder>(c.layers, c.dim, c.heads, c.mlp_hidden, c.dropout, spec));

  // ESM's RobertaLMHead: dense (PyTorch's Linear init, as ESM), GELU, LayerNorm, then the tied
  // output projection with its own bias (zeros). A plain Module holds the three so that the
  // names come out head.dense.*, head.norm.*, head.bias.
  auto head = register_module("head", std::make_shared<nn::Module>("LMHead"));
  head_dense_ = head->register_module("dense", std::make_shared<nn::Linear>(c.dim, c.dim));
  head_norm_ = head->register_module("norm", std::make_shared<nn::LayerNorm>(c.dim));
  head_bias_ = head->register_parameter("bias", zeros({kVocabSize}));
}

Tensor ProteinLM::hidden(const Tensor& tokens, const Tensor& pad) {
  LINEA_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::Int64,
              "ProteinLM: expected tokens Int64 [B, T], got ",
              tokens.defined() ? dtype_name(tokens.dtype()) + std::string(" ") + shape_str(tokens.shape())
                               : std::string("undefined"));
  LINEA_CHECK(tokens.size(1) <= cfg_.max_len, "ProteinLM: a window of ", tokens.size(1),
              " tokens is longer than the model's maximum of ", cfg_.max_len,
              " (--max-len; longer sequences are cut into windows)");
  if (pad.defined())
    LINEA_CHECK(pad.shape() == tokens.shape() && (pad.dtype() == DType::Bool || pad.dtype() == DType::Int64),
                "ProteinLM: the padding mask must be Bool or Int64 shaped like the tokens ", shape_str(tokens.shape()),
                ", got ", dtype_name(pad.dtype()), " ", shape_str(pad.shape()));
  // scale * embed[tokens] + pos in one kernel: [B, T, dim]
  Tensor x = embed_tokens(embed_->weight(), tokens, std::sqrt(static_cast<double>(cfg_.dim)),
                          pos_ ? pos_->weight() : Tensor(), 0, embed_->padding_idx());
  x = (*drop_)(x);
  attn::AttentionOptions o;
  o.key_padding_mask = pad;  // padded keys are hidden from every query
  return (*encoder_)(x, o);  // ends with the encoder's final LayerNorm
}

Tensor ProteinLM::logits(const Tensor& h) {
  LINEA_CHECK(h.defined() && h.dim() >= 1 && h.size(-1) == cfg_.dim, "ProteinLM::logits: expected [..., ", cfg_.dim,
              "], got ", h.defined() ? shape_str(h.shape()) : std::string("undefined"));
  Tensor x = (*head_norm_)(gelu((*head_dense_)(h)));
  return matmul(x, transpose(embed_->weight(), 0, 1)) + head_bias_;  // [..., 33]
}

}  // namespace protein
