#include "model.h"

#include <cmath>

#include "nn/init.h"

using namespace linea;

namespace vit {

VisionTransformer::VisionTransformer(const VitConfig& cfg) : nn::Module("VisionTransformer"), cfg_(cfg) {
  LINEA_CHECK(cfg.pool == "cls" || cfg.pool == "mean", "VisionTransformer: --pool must be cls or mean, got '",
              cfg.pool, "'");
  LINEA_CHECK(cfg.patch >= 1 && cfg.image_size % cfg.patch == 0, "VisionTransformer: patch size ", cfg.patch,
              " does not divide the image size ", cfg.image_size);
  LINEA_CHECK(cfg.dim >= 1 && cfg.heads >= 1 && cfg.dim % cfg.heads == 0, "VisionTransformer: dim ", cfg.dim,
              " is not divisible by heads ", cfg.heads);
  LINEA_CHECK(cfg.depth >= 1 && cfg.mlp_ratio > 0, "VisionTransformer: depth ", cfg.depth, " and mlp ratio ",
              cfg.mlp_ratio, " must be positive");
  patch_ = register_module("patch", std::make_shared<nn::PatchEmbed>(cfg.image_size, cfg.patch, cfg.channels, cfg.dim));
  const int64_t tokens = patch_->num_patches() + (cfg.pool == "cls" ? 1 : 0);
  if (cfg.pool == "cls") cls_ = register_parameter("cls_token", nn::init::trunc_normal_(zeros({1, 1, cfg.dim}), 0.02));
  pos_ = register_module("pos", std::make_shared<nn::LearnedPositionalEmbedding>(tokens, cfg.dim));
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(cfg.dropout));
  const auto hidden = static_cast<int64_t>(std::lround(cfg.dim * cfg.mlp_ratio));
  encoder_ = register_module(
      "encoder", std::make_shared<attn::TransformerEncoder>(cfg.depth, cfg.dim, cfg.heads, hidden, cfg.dropout, cfg.attention));
  head_ = register_module("head", std::make_shared<nn::Linear>(cfg.dim, cfg.classes));
  head_->reset_parameters_trunc_normal(0.02);
  LINEA_CHECK(cfg.init == "trunc_normal" || cfg.init == "pytorch",
              "VisionTransformer: --init must be trunc_normal or pytorch, got '", cfg.init, "'");
  if (cfg.init == "pytorch") pytorch_init(*this);
}

// Every Linear below m (children() rather than named_modules(): the constructor's `this` is not
// yet owned by a shared_ptr) gets nn.Linear's default initialization.
void VisionTransformer::pytorch_init(const nn::Module& m) {
  for (const auto& [name, child] : m.children()) {
    if (auto lin = std::dynamic_pointer_cast<nn::Linear>(child)) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(lin->in_features()));
      nn::init::uniform_(lin->weight(), -bound, bound);
      if (lin->bias().defined()) nn::init::uniform_(lin->bias(), -bound, bound);
    }
    pytorch_init(*child);
  }
}

Tensor VisionTransformer::forward(const Tensor& images) {
  LINEA_CHECK(images.dim() == 4 && images.size(1) == cfg_.channels && images.size(2) == cfg_.image_size &&
                  images.size(3) == cfg_.image_size,
              "VisionTransformer: expected images [B, ", cfg_.channels, ", ", cfg_.image_size, ", ", cfg_.image_size,
              "], got ", shape_str(images.shape()));
  Tensor x = (*patch_)(images);  // [B, N, dim]
  // The class token before the patches and the positions added, one kernel each way:
  // cat({cls.expand(B, 1, dim), x}, 1) + pos  [B, 1 + N, dim]
  const Tensor prefix = cls_.defined() ? reshape(cls_, {1, cfg_.dim}) : Tensor();
  x = (*drop_)(prepend_and_add_positions(x, prefix, pos_->weight()));
  x = (*encoder_)(x);
  Tensor feat = cls_.defined() ? select(x, 1, 0) : mean(x, {1});  // [B, dim]
  return (*head_)(feat);
}

}  // namespace vit
