// STUB: replaced by the lara implementation.
#include "attention/lara/lara.h"
namespace linea::attn {
std::shared_ptr<nn::AttentionKernel> make_lara(const AttentionSpec&, int64_t, int64_t) {
  LINEA_FAIL("attention 'lara': not implemented yet");
}
}  // namespace linea::attn
