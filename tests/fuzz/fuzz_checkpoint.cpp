// Fuzz target: training checkpoint loading (nn/checkpoint.h load_checkpoint) on a fuzzed
// checkpoint folder, into a fixed tiny model and its AdamW optimizer (tiny_model.h).
// Input layout (FuzzedDataProvider):
//   model.safetensors     ConsumeRandomLengthString: the bytes up to a "\" followed by any byte
//                         other than "\" ("\\" stands for one "\")
//   training.safetensors  the same
//   the extra file        the rest of the bytes, under the name picked by the input's last byte
//                         (none, config.json, tokenizer.model, or a name the training file's
//                         metadata does not list)
// make_seeds.cpp writes real checkpoints of this model in this layout. A checkpoint that loads
// must leave a model and optimizer that can take a training step; one that is refused must leave
// them unchanged.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>

#include "autograd/ops.h"
#include "core/ops.h"
#include "core/random.h"
#include "fuzz_util.h"
#include "nn/checkpoint.h"
#include "nn/optim.h"
#include "tiny_model.h"

using namespace linea;

namespace {

// Fresh copies (a state_dict shares its tensors' storage with the module).
nn::StateDict copy(const nn::StateDict& sd) {
  nn::StateDict out;
  for (const auto& [name, t] : sd) out[name] = raw::clone(t);
  return out;
}

bool same_state(const nn::StateDict& a, const nn::StateDict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape() != t.shape() || it->second.dtype() != t.dtype()) return false;
    const Tensor x = t.contiguous(), y = it->second.contiguous();
    if (std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * x.element_size()) != 0) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  FuzzedDataProvider in(data, size);
  const std::string model_bytes = in.ConsumeRandomLengthString(size);
  const std::string train_bytes = in.ConsumeRandomLengthString(size);
  const char* names[] = {nullptr, "config.json", "tokenizer.model", "other"};
  const char* extra_name = names[in.ConsumeIntegralInRange<int>(0, 3)];
  const std::string extra = in.ConsumeRemainingBytesAsString();

  const fuzz::fs::path dir = fuzz::fresh_dir("checkpoint");
  fuzz::write_file(dir / "model.safetensors", model_bytes);
  fuzz::write_file(dir / "training.safetensors", train_bytes);
  if (extra_name) fuzz::write_file(dir / extra_name, extra);

  manual_seed(0);
  fuzz::TinyModel model;
  const std::unique_ptr<nn::AdamW> optimizer = fuzz::tiny_optimizer(model);
  nn::AdamW& opt = *optimizer;
  const nn::StateDict model_before = copy(model.state_dict()), opt_before = copy(opt.state_dict());
  nn::TrainState state;
  if (!fuzz::expect_ok_or_error([&] { state = nn::load_checkpoint(dir.string(), model, opt); })) {
    LINEA_FUZZ_ASSERT(same_state(model.state_dict(), model_before), "a refused checkpoint changed the model");
    LINEA_FUZZ_ASSERT(same_state(opt.state_dict(), opt_before), "a refused checkpoint changed the optimizer");
    return 0;
  }
  // One step on the loaded state: moments and step count must fit the parameters.
  const Tensor x = randn({4, 2});
  const Tensor loss = mean(mul(matmul(x, model.w.t()), add(model.b, 1.0)));
  opt.zero_grad();
  loss.backward();
  opt.step();
  return 0;
}
