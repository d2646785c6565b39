// Pre-LN transformer layers and stacks (see transformer.h).
#include "attention/transformer.h"

namespace linea::attn {

namespace {
void check_sizes(const char* who, int64_t dim, int64_t heads, int64_t mlp_hidden) {
  LINEA_CHECK(dim > 0 && heads > 0 && mlp_hidden > 0, who, ": dim, heads and mlp_hidden must be positive, got ", dim,
              ", ", heads, ", ", mlp_hidden);
  LINEA_CHECK(dim % heads == 0, who, ": dim ", dim, " is not divisible by heads ", heads);
}

void check_tokens(const char* who, const char* name, const Tensor& x, int64_t dim) {
  raw::check_defined(who, x, name);
  LINEA_CHECK(x.dim() == 3 && x.size(2) == dim, who, ": expected ", name, " [B, L, ", dim, "], got ",
              shape_str(x.shape()));
}
}  // namespace

// ---- encoder layer ----------------------------------------------------------------------------
TransformerEncoderLayer::TransformerEncoderLayer(int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout,
                                                 const std::string& spec)
    : nn::Module("TransformerEncoderLayer") {
  check_sizes("TransformerEncoderLayer", dim, heads, mlp_hidden);
  ln1_ = register_module("ln1", std::make_shared<nn::LayerNorm>(dim));
  attn_ = register_module("attn", std::make_shared<MultiHeadAttention>(dim, heads, spec));
  ln2_ = register_module("ln2", std::make_shared<nn::LayerNorm>(dim));
  mlp_ = register_module("mlp", std::make_shared<nn::FeedForward>(dim, mlp_hidden, dropout));
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(dropout));
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const AttentionOptions& opts) {
  return forward(Residual{x, Tensor()}, opts).sum();
}

// x = in.base + in.delta; h = ln1(x); y = x + drop(attn(h)); out = y + drop(mlp(ln2(y))) as {y, m}
Residual TransformerEncoderLayer::forward(const Residual& in, const AttentionOptions& opts) {
  check_tokens("TransformerEncoderLayer", "x", in.base, attn_->dim());
  auto [x, h] =
      in.delta.defined() ? ln1_->forward_add(in.base, in.delta, in.drop) : std::pair{in.base, ln1_->forward(in.base)};
  auto [y, h2] = ln2_->forward_add(x, attn_->forward(h, h, opts), drop_.get());  // [B, N, dim]
  return {y, mlp_->forward(h2), drop_.get()};  // its dropout folded into the next norm's sum
}

// ---- decoder layer ----------------------------------------------------------------------------
TransformerDecoderLayer::TransformerDecoderLayer(int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout,
                                                 const std::string& spec, const std::string& cross_spec)
    : nn::Module("TransformerDecoderLayer") {
  check_sizes("TransformerDecoderLayer", dim, heads, mlp_hidden);
  ln1_ = register_module("ln1", std::make_shared<nn::LayerNorm>(dim));
  self_attn_ = register_module("self_attn",
                               std::make_shared<MultiHeadAttention>(dim, heads, spec, MultiHeadOptions{AttentionUse::CausalSelf}));
  ln2_ = register_module("ln2", std::make_shared<nn::LayerNorm>(dim));
  cross_attn_ = register_module(
      "cross_attn", std::make_shared<MultiHeadAttention>(dim, heads, cross_spec.empty() ? spec : cross_spec,
                                                         MultiHeadOptions{AttentionUse::Cross}));
  ln3_ = register_module("ln3", std::make_shared<nn::LayerNorm>(dim));
  mlp_ = register_module("mlp", std::make_shared<nn::FeedForward>(dim, mlp_hidden, dropout));
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(dropout));
}

Tensor TransformerDecoderLayer::forward(const Tensor& x, const Tensor& memory, const Tensor& memory_key_padding_mask,
                                        const Tensor& tgt_key_padding_mask) {
  return forward(Residual{x, Tensor()}, memory, memory_key_padding_mask, tgt_key_padding_mask).sum();
}

Residual TransformerDecoderLayer::forward(const Residual& in, const Tensor& memory,
                                          const Tensor& memory_key_padding_mask, const Tensor& tgt_key_padding_mask) {
  const int64_t dim = self_attn_->dim();
  check_tokens("TransformerDecoderLayer", "x", in.base, dim);
  check_tokens("TransformerDecoderLayer", "memory", memory, dim);
  LINEA_CHECK(memory.size(0) == in.base.size(0), "TransformerDecoderLayer: batch of x ", shape_str(in.base.shape()),
              " and memory ", shape_str(memory.shape()), " differ");
  AttentionOptions self_opts;
  self_opts.causal = true;
  self_opts.key_padding_mask = tgt_key_padding_mask;
  AttentionOptions cross_opts;
  cross_opts.key_padding_mask = memory_key_padding_mask;
  auto [x, h] =
      in.delta.defined() ? ln1_->forward_add(in.base, in.delta, in.drop) : std::pair{in.base, ln1_->forward(in.base)};
  auto [y, h2] = ln2_->forward_add(x, self_attn_->forward(h, h, self_opts), drop_.get());  // [B, N, dim]
  auto [z, h3] = ln3_->forward_add(y, cross_attn_->forward(h2, memory, cross_opts), drop_.get());
  return {z, mlp_->forward(h3), drop_.get()};
}

Tensor TransformerDecoderLayer::step(const Tensor& x, AttentionCache& self_cache, AttentionCache& cross_cache,
                                     const Tensor& key_padding) {
  return step(Residual{x, Tensor()}, self_cache, cross_cache, key_padding).sum();
}

Residual TransformerDecoderLayer::step(const Residual& in, AttentionCache& self_cache, AttentionCache& cross_cache,
                                       const Tensor& key_padding) {
  check_tokens("TransformerDecoderLayer::step", "x", in.base, self_attn_->dim());
  auto [x, h] =
      in.delta.defined() ? ln1_->forward_add(in.base, in.delta, in.drop) : std::pair{in.base, ln1_->forward(in.base)};
  auto [y, h2] = ln2_->forward_add(x, self_attn_->step(h, self_cache, key_padding), drop_.get());
  auto [z, h3] = ln3_->forward_add(y, cross_attn_->step(h2, cross_cache), drop_.get());
  return {z, mlp_->forward(h3), drop_.get()};
}

// ---- stacks -----------------------------------------------------------------------------------
TransformerEncoder::TransformerEncoder(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout,
                                       const std::string& spec)
    : nn::Module("TransformerEncoder") {
  LINEA_CHECK(depth > 0, "TransformerEncoder: depth must be positive, got ", depth);
  layers_ = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < depth; ++i)
    layers_->push_back(std::make_shared<TransformerEncoderLayer>(dim, heads, mlp_hidden, dropout, spec));
  norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(dim));
}

Tensor TransformerEncoder::forward(const Tensor& x, const AttentionOptions& opts) {
  Residual r{x, Tensor()};
  for (size_t i = 0; i < layers_->size(); ++i) r = layer(i)->forward(r, opts);
  return norm_->forward_add(r.base, r.delta, r.drop).second;  // depth >= 1: the last layer left a delta
}

TransformerDecoder::TransformerDecoder(int64_t depth, int64_t dim, int64_t heads, int64_t mlp_hidden, double dropout,
                                       const std::string& spec, const std::string& cross_spec)
    : nn::Module("TransformerDecoder") {
  LINEA_CHECK(depth > 0, "TransformerDecoder: depth must be positive, got ", depth);
  layers_ = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < depth; ++i)
    layers_->push_back(std::make_shared<TransformerDecoderLayer>(dim, heads, mlp_hidden, dropout, spec, cross_spec));
  norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(dim));
}

Tensor TransformerDecoder::forward(const Tensor& x, const Tensor& memory, const Tensor& memory_key_padding_mask,
                                   const Tensor& tgt_key_padding_mask) {
  Residual r{x, Tensor()};
  for (size_t i = 0; i < layers_->size(); ++i)
    r = layer(i)->forward(r, memory, memory_key_padding_mask, tgt_key_padding_mask);
  return norm_->forward_add(r.base, r.delta, r.drop).second;
}

DecoderState TransformerDecoder::start(const Tensor& memory, const Tensor& memory_key_padding_mask) {
  DecoderState s;
  for (size_t i = 0; i < layers_->size(); ++i) {
    s.self_.push_back(layer(i)->self_attn()->start_self());
    s.cross_.push_back(layer(i)->cross_attn()->start_cross(memory, memory_key_padding_mask));
  }
  return s;
}

Tensor TransformerDecoder::step(const Tensor& x, DecoderState& state, const Tensor& key_padding) {
  LINEA_CHECK(state.self_.size() == layers_->size(), "TransformerDecoder::step: the state was made for ",
              state.self_.size(), " layers, this decoder has ", layers_->size(), " (use start())");
  Residual r{x, Tensor()};
  for (size_t i = 0; i < layers_->size(); ++i) r = layer(i)->step(r, state.self_[i], state.cross_[i], key_padding);
  return norm_->forward_add(r.base, r.delta, r.drop).second;
}

}  // namespace linea::attn
