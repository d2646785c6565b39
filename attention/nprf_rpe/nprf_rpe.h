// STUB: replaced by the nprf_rpe implementation.
#pragma once
#include "attention/common/common.h"
namespace linea::attn {
std::shared_ptr<nn::AttentionKernel> make_nprf_rpe(const AttentionSpec& spec, int64_t heads, int64_t head_dim);
}  // namespace linea::attn
