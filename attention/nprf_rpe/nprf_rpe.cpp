// STUB: replaced by the nprf_rpe implementation.
#include "attention/nprf_rpe/nprf_rpe.h"
namespace linea::attn {
std::shared_ptr<nn::AttentionKernel> make_nprf_rpe(const AttentionSpec&, int64_t, int64_t) {
  LINEA_FAIL("attention 'nprf_rpe': not implemented yet");
}
}  // namespace linea::attn
