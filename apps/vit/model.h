// The Vision Transformer of the vit app (Dosovitskiy et al., 2021), built from nn/ blocks:
//   images [B, C, H, W] -> patch tokens [B, N, dim] (PatchEmbed, N = (H/p)*(W/p))
//   -> (pool=cls) prepend a learned CLS token -> + learned positional embedding -> dropout
//   -> TransformerEncoder (pre-LN, `depth` layers, self-attention chosen by `attention` spec)
//   -> pooled feature (the CLS token, or the mean over tokens) -> Linear head -> logits [B, classes]
// Parameter names: patch.proj.*, cls_token, pos.weight, encoder.layers.<i>.*, encoder.norm.*,
// head.* (so a checkpoint reads in PyTorch as a plain state_dict).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "nn/layers.h"
#include "attention/transformer.h"

namespace vit {

struct VitConfig {
  int64_t image_size = 28;
  int64_t channels = 1;
  int64_t classes = 10;
  int64_t patch = 4;
  int64_t dim = 64;
  int64_t depth = 6;
  int64_t heads = 4;
  double mlp_ratio = 2.0;
  double dropout = 0.0;
  std::string pool = "cls";  // "cls" or "mean"
  std::string attention = "softmax";
  // Linear layers' initialization: "pytorch" (nn.Linear's default, U(+-1/sqrt(fan_in)) for weight
  // and bias) or "trunc_normal" (std 0.02, biases 0: timm's ViT, made for long schedules; 1.4
  // points lower test accuracy after a 3-epoch run of the default ViT on Fashion-MNIST).
  std::string init = "pytorch";
};
// config.json's "model" (apps/common/config_json.h).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(VitConfig, image_size, channels, classes, patch, dim, depth, heads, mlp_ratio,
                                   dropout, pool, attention, init)

class VisionTransformer : public linea::nn::Module {
 public:
  explicit VisionTransformer(const VitConfig& cfg);
  linea::Tensor forward(const linea::Tensor& images);  // [B, C, H, W] -> logits [B, classes]
  linea::Tensor operator()(const linea::Tensor& images) { return forward(images); }
  const VitConfig& config() const { return cfg_; }
  const std::shared_ptr<linea::attn::TransformerEncoder>& encoder() const { return encoder_; }

 private:
  static void pytorch_init(const linea::nn::Module& m);
  VitConfig cfg_;
  std::shared_ptr<linea::nn::PatchEmbed> patch_;
  linea::Tensor cls_;
  std::shared_ptr<linea::nn::LearnedPositionalEmbedding> pos_;
  std::shared_ptr<linea::nn::Dropout> drop_;
  std::shared_ptr<linea::attn::TransformerEncoder> encoder_;
  std::shared_ptr<linea::nn::Linear> head_;
};

}  // namespace vit
