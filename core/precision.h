// The precision of float32 matrix products on CUDA, as PyTorch users know it from
// torch.set_float32_matmul_precision ("highest" / "high" / "medium"):
//   Float32 (the default) full float32, as on the CPU;
//   TF32    the tensor cores' TensorFloat-32 (10-bit mantissa inputs), float32 accumulation;
//   BF16    the tensor cores in bfloat16 (8-bit mantissa inputs), float32 accumulation.
// Only the GEMMs' inputs are rounded: tensors, weights, optimizer state, reductions, softmax and
// norms stay float32 (under TF32 and BF16 the fused softmax attention rounds the inputs of its
// products, q, k, v and the probabilities, the same way; under Float32 it runs on the tensor cores
// as three TF32 products per product, about 2^-21 relative instead of 2^-24, as PyTorch's
// memory-efficient SDPA does in float32: cuda/attention.cu; FAVOR+ attention's fused products
// likewise: cuda/favor_attention.cu). The CPU path always computes
// in float32 (OpenBLAS), whatever the setting; float64 GEMMs are always full precision. Apps
// expose it as --precision fp32|tf32|bf16.
// Not here: the kernels (cuda/blas.cu passes the matching cuBLAS compute type).
#pragma once

#include <string>

namespace linea {

enum class MatmulPrecision { Float32, TF32, BF16 };

// Process-wide (a relaxed atomic): set it before the work it should apply to.
void set_matmul_precision(MatmulPrecision p);
MatmulPrecision matmul_precision();

// "fp32", "tf32", "bf16" and back; parse throws linea::Error naming the bad value.
std::string precision_name(MatmulPrecision p);
MatmulPrecision parse_precision(const std::string& name);

}  // namespace linea
