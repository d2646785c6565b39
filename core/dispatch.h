// Device dispatch in one place: LINEA_BACKEND(device, fn, args...) calls linea::cpu::fn or
// linea::cuda::fn. Internal to the raw op layer (core/ops*.cpp); not a public header.
#pragma once

#include "core/error.h"
#include "core/kernels.h"

#ifdef LINEA_WITH_CUDA
#define LINEA_BACKEND(device, fn, ...) \
  ((device).is_cuda() ? ::linea::cuda::fn(__VA_ARGS__) : ::linea::cpu::fn(__VA_ARGS__))
#else
#define LINEA_BACKEND(device, fn, ...)                                                        \
  ((device).is_cuda() ? throw ::linea::Error(#fn ": this build of Linea has no CUDA backend") \
                      : ::linea::cpu::fn(__VA_ARGS__))
#endif
