// The basic layers: Linear, Embedding, LayerNorm, Dropout, GELU/ReLU, FeedForward (the
// transformer MLP), PatchEmbed (images to patch tokens), learned and sinusoidal positional
// embeddings. Each is a Module held by std::shared_ptr (build with std::make_shared), with a
// `forward` and an operator() that calls it; every forward checks its input's shape first and
// throws linea::Error naming the layer and the shape. Initialization is documented in nn/init.h.
// Layers are built on the CPU in float32; move/convert them with Module::to(device / dtype).
// Not here: attention and transformer blocks (attention/), losses (nn/loss.h).
#pragma once

#include <memory>
#include <string>

#include "nn/module.h"

namespace linea::nn {

// A module mapping one tensor to one tensor (activations, dropout), so that containers can hold
// any of them.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// y = x W^T + b, as PyTorch: weight [out, in], bias [out]; x [..., in] -> y [..., out].
// Default init: PyTorch's (U(-1/sqrt(in), 1/sqrt(in)) for weight and bias).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x);  // [..., in] -> [..., out]
  Tensor operator()(const Tensor& x) { return forward(x); }
  // The transformer initialization: weight truncated normal (std, cut at +-2 std), bias zeros.
  void reset_parameters_trunc_normal(double std = 0.02);
  std::string extra_repr() const override;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const Tensor& weight() const { return weight_; }  // [out, in]
  const Tensor& bias() const { return bias_; }      // [out], undefined without bias

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

// A lookup table: index Int64 [...] -> [..., dim], weight [num, dim] (truncated normal 0.02).
// padding_idx >= 0 names a row that starts at zero and never receives a gradient (its output
// is still weight[padding_idx], as in PyTorch); -1 = none.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1);
  Tensor forward(const Tensor& index);  // Int64 [...] -> [..., dim]
  Tensor operator()(const Tensor& index) { return forward(index); }
  std::string extra_repr() const override;

  int64_t num_embeddings() const { return num_; }
  int64_t embedding_dim() const { return dim_; }
  int64_t padding_idx() const { return padding_idx_; }
  const Tensor& weight() const { return weight_; }  // [num, dim]

 private:
  int64_t num_, dim_, padding_idx_;
  Tensor weight_;
};

// Normalizes over the trailing dims `normalized_shape`, then scales by weight (ones) and adds
// bias (zeros) when elementwise_affine.
class Dropout;

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x);  // [..., *normalized_shape] -> same
  Tensor operator()(const Tensor& x) { return forward(x); }
  // A residual connection and this norm after it: {s = x + r, forward(s)} in one kernel
  // (add_layer_norm); x and r of the same shape. With `drop`, r goes through that dropout first
  // (folded into the same kernel; an identity when it is off or in eval mode).
  std::pair<Tensor, Tensor> forward_add(const Tensor& x, const Tensor& r, const Dropout* drop = nullptr);
  std::string extra_repr() const override;

  const Shape& normalized_shape() const { return shape_; }
  double eps() const { return eps_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Shape shape_;
  double eps_;
  Tensor weight_, bias_;
};

// Inverted dropout with probability p while training (Module::is_training()); identity in eval.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
};

// GELU, exact (x * Phi(x)) or with the tanh approximation.
class GELU : public UnaryModule {
 public:
  explicit GELU(bool approximate = false);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  bool approximate_;
};

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

// "gelu", "gelu_tanh" or "relu"; throws on anything else.
std::shared_ptr<UnaryModule> make_activation(const std::string& name);

// The transformer MLP: fc1 (dim -> hidden), activation, dropout, fc2 (hidden -> dim); the
// activation and the dropout run as one kernel in training (activation_dropout).
// Submodules fc1, act, drop, fc2; Linear weights truncated normal 0.02, biases zero.
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, double dropout = 0.0, const std::string& activation = "gelu");
  Tensor forward(const Tensor& x);  // [..., dim] -> [..., dim]
  Tensor operator()(const Tensor& x) { return forward(x); }

  const std::shared_ptr<Linear>& fc1() const { return fc1_; }
  const std::shared_ptr<Linear>& fc2() const { return fc2_; }

 private:
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<UnaryModule> act_;
  UnaryOp act_op_;  // act_'s op, for the activation folded into the dropout
  std::shared_ptr<Dropout> drop_;
  std::shared_ptr<Linear> fc2_;
};

// Images [B, C, H, W] (H = W = image_size) -> patch tokens [B, (H/p)*(W/p), dim]: patches in
// row-major order (patch (i, j) is token i * W/p + j), each flattened in (c, y, x) order (the
// order of a Conv2d weight [dim, C, p, p]), by a reshape/permute and one Linear "proj"
// (C*p*p -> dim, PyTorch's default init, as the patch convolution of ViT).
class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t image_size, int64_t patch_size, int64_t in_channels, int64_t dim);
  Tensor forward(const Tensor& images);  // [B, C, H, W] -> [B, num_patches, dim]
  Tensor operator()(const Tensor& images) { return forward(images); }
  std::string extra_repr() const override;

  int64_t num_patches() const { return (image_size_ / patch_) * (image_size_ / patch_); }
  int64_t patch_size() const { return patch_; }
  const std::shared_ptr<Linear>& proj() const { return proj_; }

 private:
  int64_t image_size_, patch_, channels_, dim_;
  std::shared_ptr<Linear> proj_;
};

// x [B, L, dim] -> x + weight[offset : offset + L] (weight [max_len, dim], truncated normal 0.02).
class LearnedPositionalEmbedding : public Module {
 public:
  LearnedPositionalEmbedding(int64_t max_len, int64_t dim);
  Tensor forward(const Tensor& x, int64_t offset = 0);  // [B, L, dim] -> [B, L, dim]
  Tensor operator()(const Tensor& x, int64_t offset = 0) { return forward(x, offset); }
  std::string extra_repr() const override;
  const Tensor& weight() const { return weight_; }

 private:
  int64_t max_len_, dim_;
  Tensor weight_;
};

// x [B, L, dim] -> x + pe[offset : offset + L], with the fixed table of Vaswani et al. (buffer
// "pe" [max_len, dim]): pe[pos, 2i] = sin(pos / 10000^(2i/dim)), pe[pos, 2i+1] = cos(same angle).
class SinusoidalPositionalEmbedding : public Module {
 public:
  SinusoidalPositionalEmbedding(int64_t max_len, int64_t dim);
  Tensor forward(const Tensor& x, int64_t offset = 0);
  Tensor operator()(const Tensor& x, int64_t offset = 0) { return forward(x, offset); }
  std::string extra_repr() const override;
  const Tensor& table() const { return pe_; }  // [max_len, dim]

 private:
  int64_t max_len_, dim_;
  Tensor pe_;
};

namespace detail {
// x [..., L, dim] + table[offset : offset + L]; shared by the positional embeddings.
Tensor add_positions(const char* who, const Tensor& x, const Tensor& table, int64_t offset);
std::string fmt_double(double v);
}  // namespace detail

}  // namespace linea::nn
