// The basic layers (see layers.h): forward passes composed from the differentiable ops of
// autograd/ops.h, so their backward comes from those ops' rules.
#include "nn/layers.h"

#include <cmath>
#include <sstream>

#include "nn/init.h"

namespace linea::nn {

namespace detail {
std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Tensor add_positions(const char* who, const Tensor& x, const Tensor& table, int64_t offset) {
  raw::check_defined(who, x, "x");
  const int64_t max_len = table.size(0), dim = table.size(1);
  LINEA_CHECK(x.dim() >= 2 && x.size(-1) == dim, who, ": expected input [B, L, ", dim, "], got ", shape_str(x.shape()));
  const int64_t L = x.size(-2);
  LINEA_CHECK(offset >= 0 && offset + L <= max_len, who, ": positions [", offset, ", ", offset + L, ") exceed max_len ",
              max_len, " (input ", shape_str(x.shape()), ")");
  return add(x, narrow(table, 0, offset, L));  // [.., L, dim] + [L, dim]
}
}  // namespace detail

namespace {
std::string bool_str(bool b) { return b ? "true" : "false"; }

// LayerNorm's input ends in its normalized shape.
void check_normalized(const Shape& shape, const Tensor& x) {
  const int64_t k = static_cast<int64_t>(shape.size());
  bool ok = x.dim() >= k;
  for (int64_t i = 0; ok && i < k; ++i) ok = x.size(x.dim() - k + i) == shape[i];
  LINEA_CHECK(ok, "LayerNorm: expected input [..., ", shape_str(shape).substr(1), " (normalized_shape ",
              shape_str(shape), "), got ", shape_str(x.shape()));
}
}  // namespace

// ---- Linear -----------------------------------------------------------------------------------
Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : Module("Linear"), in_(in_features), out_(out_features) {
  LINEA_CHECK(in_features > 0 && out_features > 0, "Linear: in_features and out_features must be positive, got ",
              in_features, " and ", out_features);
  weight_ = register_parameter("weight", empty({out_, in_}));
  init::kaiming_uniform_(weight_, std::sqrt(5.0));  // U(-1/sqrt(in), 1/sqrt(in)), as PyTorch
  if (bias) {
    bias_ = register_parameter("bias", empty({out_}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    init::uniform_(bias_, -bound, bound);
  }
}

void Linear::reset_parameters_trunc_normal(double std) {
  init::trunc_normal_(weight_, std);
  if (bias_.defined()) init::zeros_(bias_);
}

Tensor Linear::forward(const Tensor& x) {
  raw::check_defined("Linear", x, "input");
  LINEA_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear: expected input [..., ", in_, "] (in_features=", in_,
              "), got ", shape_str(x.shape()));
  return linear(x, weight_, bias_);  // [..., in] @ [in, out] + [out] -> [..., out]
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
         ", bias=" + bool_str(bias_.defined());
}

// ---- Embedding --------------------------------------------------------------------------------
Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx)
    : Module("Embedding"), num_(num_embeddings), dim_(embedding_dim), padding_idx_(padding_idx) {
  LINEA_CHECK(num_embeddings > 0 && embedding_dim > 0,
              "Embedding: sizes must be positive, got num_embeddings=", num_embeddings,
              ", embedding_dim=", embedding_dim);
  LINEA_CHECK(padding_idx >= -1 && padding_idx < num_embeddings, "Embedding: padding_idx ", padding_idx,
              " out of range for ", num_embeddings, " embeddings (-1 = none)");
  weight_ = register_parameter("weight", empty({num_, dim_}));
  init::trunc_normal_(weight_, 0.02);
  if (padding_idx_ >= 0) init::zeros_(weight_.detach().narrow(0, padding_idx_, 1));  // a view: no graph
}

Tensor Embedding::forward(const Tensor& index) {
  raw::check_defined("Embedding", index, "index");
  LINEA_CHECK(index.dtype() == DType::Int64, "Embedding: index must be int64, got ", dtype_name(index.dtype()),
              " (shape ", shape_str(index.shape()), ")");
  return embedding(weight_, index, padding_idx_);  // [..., dim]; the padding row gets no gradient
}

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(num_) + ", " + std::to_string(dim_);
  if (padding_idx_ >= 0) s += ", padding_idx=" + std::to_string(padding_idx_);
  return s;
}

// ---- LayerNorm --------------------------------------------------------------------------------
LayerNorm::LayerNorm(int64_t dim, double eps, bool elementwise_affine)
    : LayerNorm(Shape{dim}, eps, elementwise_affine) {}

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"), shape_(std::move(normalized_shape)), eps_(eps) {
  LINEA_CHECK(!shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t d : shape_) LINEA_CHECK(d > 0, "LayerNorm: normalized_shape must be positive, got ", shape_str(shape_));
  LINEA_CHECK(eps > 0, "LayerNorm: eps must be positive, got ", eps);
  if (elementwise_affine) {
    weight_ = register_parameter("weight", ones(shape_));
    bias_ = register_parameter("bias", zeros(shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  raw::check_defined("LayerNorm", x, "input");
  check_normalized(shape_, x);
  return layer_norm(x, shape_, weight_, bias_, eps_);
}

std::pair<Tensor, Tensor> LayerNorm::forward_add(const Tensor& x, const Tensor& r, const Dropout* drop) {
  raw::check_defined("LayerNorm", x, "input");
  raw::check_defined("LayerNorm", r, "residual");
  check_normalized(shape_, x);
  const double p = drop != nullptr && drop->is_training() ? drop->p() : 0.0;
  return add_layer_norm(x, r, shape_, weight_, bias_, eps_, p);
}

std::string LayerNorm::extra_repr() const {
  return shape_str(shape_) + ", eps=" + detail::fmt_double(eps_) +
         ", elementwise_affine=" + bool_str(weight_.defined());
}

// ---- Dropout, activations ---------------------------------------------------------------------
Dropout::Dropout(double p) : UnaryModule("Dropout"), p_(p) {
  LINEA_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  raw::check_defined("Dropout", x, "input");
  return dropout(x, p_, is_training());
}

std::string Dropout::extra_repr() const { return "p=" + detail::fmt_double(p_); }

GELU::GELU(bool approximate) : UnaryModule("GELU"), approximate_(approximate) {}

Tensor GELU::forward(const Tensor& x) {
  raw::check_defined("GELU", x, "input");
  return gelu(x, approximate_);
}

std::string GELU::extra_repr() const { return approximate_ ? "approximate='tanh'" : "approximate='none'"; }

Tensor ReLU::forward(const Tensor& x) {
  raw::check_defined("ReLU", x, "input");
  return relu(x);
}

std::shared_ptr<UnaryModule> make_activation(const std::string& name) {
  if (name == "gelu") return std::make_shared<GELU>(false);
  if (name == "gelu_tanh") return std::make_shared<GELU>(true);
  if (name == "relu") return std::make_shared<ReLU>();
  LINEA_FAIL("make_activation: unknown activation '", name, "' (known: gelu, gelu_tanh, relu)");
}

// ---- FeedForward ------------------------------------------------------------------------------
FeedForward::FeedForward(int64_t dim, int64_t hidden, double dropout, const std::string& activation)
    : Module("FeedForward") {
  fc1_ = register_module("fc1", std::make_shared<Linear>(dim, hidden));
  act_ = register_module("act", make_activation(activation));
  act_op_ = activation == "relu" ? UnaryOp::Relu : activation == "gelu_tanh" ? UnaryOp::GeluTanh : UnaryOp::GeluErf;
  drop_ = register_module("drop", std::make_shared<Dropout>(dropout));
  fc2_ = register_module("fc2", std::make_shared<Linear>(hidden, dim));
  fc1_->reset_parameters_trunc_normal();
  fc2_->reset_parameters_trunc_normal();
}

Tensor FeedForward::forward(const Tensor& x) {
  // [..., dim] -> [..., hidden] -> [..., dim]; while the dropout is on, it and the activation
  // are one kernel (activation_dropout), forward and backward.
  const Tensor h = fc1_->forward(x);
  if (drop_->is_training() && drop_->p() > 0) return fc2_->forward(activation_dropout(h, act_op_, drop_->p(), true));
  return fc2_->forward(drop_->forward(act_->forward(h)));
}

// ---- PatchEmbed -------------------------------------------------------------------------------
PatchEmbed::PatchEmbed(int64_t image_size, int64_t patch_size, int64_t in_channels, int64_t dim)
    : Module("PatchEmbed"), image_size_(image_size), patch_(patch_size), channels_(in_channels), dim_(dim) {
  LINEA_CHECK(image_size > 0 && patch_size > 0 && in_channels > 0 && dim > 0,
              "PatchEmbed: sizes must be positive, got image_size=", image_size, ", patch_size=", patch_size,
              ", in_channels=", in_channels, ", dim=", dim);
  LINEA_CHECK(image_size % patch_size == 0, "PatchEmbed: image_size ", image_size, " is not divisible by patch_size ",
              patch_size);
  proj_ = register_module("proj", std::make_shared<Linear>(in_channels * patch_size * patch_size, dim));
}

Tensor PatchEmbed::forward(const Tensor& images) {
  raw::check_defined("PatchEmbed", images, "images");
  LINEA_CHECK(images.dim() == 4 && images.size(1) == channels_ && images.size(2) == image_size_ &&
                  images.size(3) == image_size_,
              "PatchEmbed: expected images [B, ", channels_, ", ", image_size_, ", ", image_size_, "], got ",
              shape_str(images.shape()));
  const int64_t B = images.size(0), p = patch_, n = image_size_ / patch_;
  // [B, C, H, W] -> [B, C, n, p, n, p] -> [B, n(row), n(col), C, p, p] -> [B, n*n, C*p*p]
  Tensor x = reshape(images, {B, channels_, n, p, n, p});
  x = permute(x, {0, 2, 4, 1, 3, 5});
  x = reshape(x, {B, n * n, channels_ * p * p});
  return proj_->forward(x);  // [B, n*n, dim]
}

std::string PatchEmbed::extra_repr() const {
  return "image_size=" + std::to_string(image_size_) + ", patch_size=" + std::to_string(patch_) +
         ", in_channels=" + std::to_string(channels_) + ", dim=" + std::to_string(dim_) +
         ", num_patches=" + std::to_string(num_patches());
}

// ---- positional embeddings --------------------------------------------------------------------
LearnedPositionalEmbedding::LearnedPositionalEmbedding(int64_t max_len, int64_t dim)
    : Module("LearnedPositionalEmbedding"), max_len_(max_len), dim_(dim) {
  LINEA_CHECK(max_len > 0 && dim > 0, "LearnedPositionalEmbedding: sizes must be positive, got max_len=", max_len,
              ", dim=", dim);
  weight_ = register_parameter("weight", empty({max_len, dim}));
  init::trunc_normal_(weight_, 0.02);
}

Tensor LearnedPositionalEmbedding::forward(const Tensor& x, int64_t offset) {
  return detail::add_positions("LearnedPositionalEmbedding", x, weight_, offset);
}

std::string LearnedPositionalEmbedding::extra_repr() const {
  return "max_len=" + std::to_string(max_len_) + ", dim=" + std::to_string(dim_);
}

SinusoidalPositionalEmbedding::SinusoidalPositionalEmbedding(int64_t max_len, int64_t dim)
    : Module("SinusoidalPositionalEmbedding"), max_len_(max_len), dim_(dim) {
  LINEA_CHECK(max_len > 0 && dim > 0, "SinusoidalPositionalEmbedding: sizes must be positive, got max_len=", max_len,
              ", dim=", dim);
  std::vector<double> pe(static_cast<size_t>(max_len * dim));
  for (int64_t pos = 0; pos < max_len; ++pos)
    for (int64_t j = 0; j < dim; ++j) {
      const double i2 = static_cast<double>(j - j % 2);  // 2i
      const double angle = static_cast<double>(pos) / std::pow(10000.0, i2 / static_cast<double>(dim));
      pe[pos * dim + j] = j % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  pe_ = register_buffer("pe", from_vector<double>(pe, {max_len, dim}, TensorOptions(DType::Float32)));
}

Tensor SinusoidalPositionalEmbedding::forward(const Tensor& x, int64_t offset) {
  return detail::add_positions("SinusoidalPositionalEmbedding", x, pe_, offset);
}

std::string SinusoidalPositionalEmbedding::extra_repr() const {
  return "max_len=" + std::to_string(max_len_) + ", dim=" + std::to_string(dim_);
}

}  // namespace linea::nn
