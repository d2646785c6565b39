// STUB: replaced by the ra implementation.
#include "attention/ra/ra.h"
namespace linea::attn {
std::shared_ptr<nn::AttentionKernel> make_ra(const AttentionSpec&, int64_t, int64_t) {
  LINEA_FAIL("attention 'ra': not implemented yet");
}
}  // namespace linea::attn
