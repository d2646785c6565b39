// The vit app's training step: one batch of images through the model, the label-smoothed loss
// and the correct predictions (declared in train.h; the shared loop's step hook).
#include "autograd/ops.h"
#include "train.h"

using namespace linea;

namespace vit {

apps::StepResult train_step(VisionTransformer& model, const nn::Batch& batch, Device device, double label_smoothing) {
  Tensor x = batch.at("input").to(device), y = batch.at("target").to(device);
  Tensor logits = model(x);
  apps::StepResult r;
  r.loss = cross_entropy(logits, y, -100, label_smoothing);
  r.units = x.size(0);
  r.stats["accuracy"] = sum(eq(argmax(logits.detach(), 1), y));
  return r;
}

}  // namespace vit
