// The translate app's training step: one batch of sentence pairs through the model, the
// label-smoothed loss over the target tokens and their plain summed cross-entropy (declared in
// train.h; the shared loop's step hook).
#include "autograd/ops.h"
#include "train.h"

using namespace linea;

namespace translate {

int64_t target_tokens(const nn::Batch& b) {
  const Tensor& pad = b.at("tgt_pad");
  LINEA_CHECK(pad.is_cpu(), "translate: target_tokens counts on the host, got a batch on ", pad.device().str());
  return static_cast<int64_t>(sum(~pad).item());
}

apps::StepResult train_step(Seq2Seq& model, const nn::Batch& b, Device device, int64_t pad, double label_smoothing) {
  Tensor tgt_out = b.at("tgt_out").to(device);
  Tensor logits = model.forward(b.at("src").to(device), b.at("src_pad").to(device), b.at("tgt_in").to(device));
  apps::StepResult r;
  // The mean's count is taken on the device; the plain summed cross-entropy comes from the same
  // pass over the logits.
  Tensor nll;
  r.loss = cross_entropy(logits, tgt_out, pad, label_smoothing, Reduction::Mean, &nll);
  r.stats["nll"] = nll;
  // Counted where the batch was made; a batch already on the device (a captured step) leaves it
  // to target_tokens.
  r.units = b.at("tgt_pad").is_cpu() ? target_tokens(b) : 0;
  return r;
}

}  // namespace translate
