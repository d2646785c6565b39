// STUB: replaced by the performer implementation.
#include "attention/performer/performer.h"
namespace linea::attn {
std::shared_ptr<nn::AttentionKernel> make_performer(const AttentionSpec&, int64_t, int64_t) {
  LINEA_FAIL("attention 'performer': not implemented yet");
}
}  // namespace linea::attn
