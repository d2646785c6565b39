// Multi-head attention: the q/k/v/out projections around one per-head mechanism (chosen by a
// spec string or passed as an instance), for training (forward over whole sequences) and for
// decoding one step at a time (step() with an AttentionCache).
//
// Decoding: start_self() gives the cache of a causal self-attention (the mechanism's DecodeState:
// projected keys and values for softmax and nprf_rpe, a constant-size recurrent state for causal
// performer); start_cross(memory) projects the encoder memory once per sentence. For beam
// search the decoder's batch rows are laid out [sentence][beam]: a cross-attention cache holds
// the memory once per sentence and serves every beam of it (the beams are folded into the query
// axis; mechanisms whose outputs depend on the query position read a per-beam copy instead), so
// reorder() never copies the memory; a self-attention cache is reordered only when the index is
// not the identity.
#pragma once

#include <memory>
#include <string>

#include "attention/registry.h"
#include "nn/layers.h"

namespace linea::attn {

struct MultiHeadOptions {
  AttentionUse use = AttentionUse::Self;  // checked against the mechanism's support at construction
  bool bias = true;                       // biases on the four projections
  int64_t kv_dim = -1;                    // width of the key/value input (-1: dim)
};

// The decoding state of one MultiHeadAttention (see the top of this file).
class AttentionCache {
 public:
  bool is_cross() const { return cross_; }
  // Positions decoded so far (the position of the next query).
  int64_t length() const { return length_; }
  // Keeps the decoder rows `index` (Int64 [B'], any device) in that order. Cross-attention
  // caches change nothing (their memory is shared by a sentence's beams); with a CPU index they
  // check that every row stays within its sentence.
  void reorder(const Tensor& index);
  // Keeps the sentences `sentences` (Int64 [Bm'], indices of the current sentences, in that
  // order) with their `beams` rows each: beam search drops the sentences it has finished.
  void keep_sentences(const Tensor& sentences, int64_t beams);

 private:
  friend class MultiHeadAttention;
  bool cross_ = false;
  int64_t length_ = 0;
  std::unique_ptr<DecodeState> self_;  // self-attention
  Tensor mem_k_, mem_v_, mem_pad_;     // cross: [Bm, H, M, Dh], [Bm, H, M, Dh], Bool [Bm, M] or undefined
  Tensor rep_k_, rep_v_, rep_pad_;     // cross, positional mechanisms: the memory repeated per beam
};

class MultiHeadAttention : public nn::Module {
 public:
  MultiHeadAttention(int64_t dim, int64_t heads, const std::string& spec = "softmax", MultiHeadOptions options = {});
  // A mechanism built elsewhere (its heads and head_dim must be heads and dim / heads).
  MultiHeadAttention(int64_t dim, int64_t heads, std::shared_ptr<AttentionMechanism> mechanism,
                     MultiHeadOptions options = {});
  // x_q [B, N, dim], x_kv [B, M, kv_dim] (pass x_q again for self-attention) -> [B, N, dim]
  Tensor forward(const Tensor& x_q, const Tensor& x_kv, const AttentionOptions& opts = {});
  Tensor operator()(const Tensor& x_q, const Tensor& x_kv, const AttentionOptions& opts = {}) {
    return forward(x_q, x_kv, opts);
  }

  // ---- decoding -------------------------------------------------------------------------------
  // An empty causal self-attention cache (throws unless the mechanism decodes incrementally).
  AttentionCache start_self() const;
  // memory [Bm, M, kv_dim] projected once; memory_key_padding_mask [Bm, M] or undefined.
  AttentionCache start_cross(const Tensor& memory, const Tensor& memory_key_padding_mask = Tensor());
  // x [B, T, dim]: the next T positions -> [B, T, dim]. Self: causal over everything decoded so
  // far (key_padding [B, T] marks padded new positions). Cross: B is a multiple of the memory's
  // batch (the beams of each sentence, in order).
  Tensor step(const Tensor& x, AttentionCache& cache, const Tensor& key_padding = Tensor());

  std::string extra_repr() const override;
  int64_t dim() const { return dim_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return dim_ / heads_; }
  AttentionUse use() const { return use_; }
  const std::string& spec() const { return spec_; }
  const std::shared_ptr<nn::Linear>& q_proj() const { return q_proj_; }
  const std::shared_ptr<nn::Linear>& k_proj() const { return k_proj_; }
  const std::shared_ptr<nn::Linear>& v_proj() const { return v_proj_; }
  const std::shared_ptr<nn::Linear>& out_proj() const { return out_proj_; }
  const std::shared_ptr<AttentionMechanism>& mechanism() const { return mechanism_; }

 private:
  void init(std::shared_ptr<AttentionMechanism> mechanism, const MultiHeadOptions& options);
  Tensor heads_of(const Tensor& projected, int64_t L) const;  // [B, L, dim] -> [B, H, L, Dh] (a view)
  Tensor merge_heads(const Tensor& o) const;                  // [B, H, L, Dh] -> [B, L, dim]

  int64_t dim_, heads_, kv_dim_ = 0;
  AttentionUse use_ = AttentionUse::Self;
  std::string spec_;
  std::shared_ptr<nn::Linear> q_proj_, k_proj_, v_proj_, out_proj_;
  std::shared_ptr<AttentionMechanism> mechanism_;
};

}  // namespace linea::attn
