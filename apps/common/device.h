// What the apps share about the machine they run on: naming the device in reports and
// summaries, resolving --device cpu|cuda|auto and applying --precision. Thread counts, the CPU's and the GPU's
// names come from the library (core/runtime.h). Header-only.
#pragma once

#include <string>

#include "core/device.h"
#include "core/error.h"
#include "core/precision.h"
#include "core/runtime.h"

namespace linea::apps {

// "cuda:0 (NVIDIA H100 ...)" or "cpu (<model>, 2 OpenMP threads, 2 OpenBLAS threads, Haswell
// kernels)", the last being OpenBLAS's core type (core/runtime.h, blas_kernels).
inline std::string device_name(const Device& d) {
  if (d.is_cuda()) {
    std::string gpu;
    try {
      gpu = cuda_device_name(d.index);
    } catch (const Error&) {
      gpu = "unknown GPU";  // a name in a report is not worth failing a run for
    }
    return d.str() + " (" + gpu + ")";
  }
  return "cpu (" + cpu_name() + ", " + std::to_string(num_threads()) + " OpenMP threads, " +
         std::to_string(blas_num_threads()) + " OpenBLAS threads, " + blas_kernels() + " kernels)";
}

// --device cpu|cuda|cuda:N|auto as a Device. Throws linea::Error when the spec does not parse
// or when CUDA is asked for but unusable; the message starts with "who: " (nothing when who is
// empty, for a tool that prefixes its errors itself).
inline Device resolve_device(const std::string& who, const std::string& arg) {
  const std::string at = who.empty() ? "--device " : who + ": --device ";
  if (arg == "auto") return cuda_available() ? Device("cuda") : kCPU;
  Device device;
  try {
    device = Device(arg);
  } catch (const Error&) {
    LINEA_FAIL(at, "'", arg, "' is not a device (expected cpu, cuda, cuda:N or auto)");
  }
  if (device.is_cpu()) return device;
  LINEA_CHECK(cuda_available(), at, arg, ": no usable CUDA device (",
              cuda_built() ? "no GPU or driver found" : "this build of Linea has no CUDA backend", ")");
  const int count = cuda_device_count();
  LINEA_CHECK(device.index < count, at, arg, ": this machine has ", count, " CUDA device", count == 1 ? "" : "s");
  return device;
}

// --precision fp32|tf32|bf16 for a run on `device`: sets the float32 matmul precision
// (core/precision.h). tf32 and bf16 are the GPU's tensor cores; on the CPU they are an error
// ("who: --precision bf16 needs --device cuda ...") rather than a silent float32 run.
inline void apply_precision(const std::string& who, const std::string& arg, const Device& device) {
  const MatmulPrecision p = parse_precision(arg);
  LINEA_CHECK(p == MatmulPrecision::Float32 || device.is_cuda(), who, ": --precision ", arg,
              " needs --device cuda (the CPU computes every matmul in float32)");
  set_matmul_precision(p);
}

}  // namespace linea::apps
