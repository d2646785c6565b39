// The float32 matmul precision setting (see precision.h).
#include "core/precision.h"

#include <atomic>

#include "core/error.h"

namespace linea {

namespace {
std::atomic<MatmulPrecision> g_precision{MatmulPrecision::Float32};
}

void set_matmul_precision(MatmulPrecision p) { g_precision.store(p, std::memory_order_relaxed); }

MatmulPrecision matmul_precision() { return g_precision.load(std::memory_order_relaxed); }

std::string precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::TF32:
      return "tf32";
    case MatmulPrecision::BF16:
      return "bf16";
    default:
      return "fp32";
  }
}

MatmulPrecision parse_precision(const std::string& name) {
  if (name == "fp32") return MatmulPrecision::Float32;
  if (name == "tf32") return MatmulPrecision::TF32;
  if (name == "bf16") return MatmulPrecision::BF16;
  LINEA_FAIL("precision: expected fp32, tf32 or bf16, got '", name, "'");
}

}  // namespace linea
