// What the apps share about the machine they run on: naming the device in reports and
// summaries, setting the thread counts, and resolving --device cpu|cuda|auto. Header-only.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/device.h"
#include "core/error.h"

namespace linea::apps {

// The processor's model name from /proc/cpuinfo.
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The GPU's name from nvidia-smi (the apps link no CUDA runtime of their own).
inline std::string gpu_model() {
  std::string name;
  if (FILE* p = popen("nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null", "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof buf, p)) name = buf;
    pclose(p);
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name.empty() ? "unknown GPU" : name;
}

// "cuda:0 (NVIDIA H100 ...)" or "cpu (<model>, 2 OpenMP threads, 2 OpenBLAS threads)".
inline std::string device_name(const Device& d) {
  if (d.is_cuda()) return d.str() + " (" + gpu_model() + ")";
  return "cpu (" + cpu_model() + ", " + std::to_string(omp_get_max_threads()) + " OpenMP threads, " +
         std::to_string(openblas_get_num_threads()) + " OpenBLAS threads)";
}

// Sets the OpenMP and OpenBLAS thread counts (0 keeps their defaults).
inline void set_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

// --device cpu|cuda|auto as a Device; throws (naming `who`) when CUDA is asked for but unusable.
inline Device resolve_device(const std::string& who, const std::string& arg) {
  const Device device = arg == "auto" ? (cuda_available() ? Device("cuda") : kCPU) : Device(arg);
  LINEA_CHECK(!device.is_cuda() || cuda_available(), who, ": --device ", arg,
              " but no usable CUDA device (built with CUDA: ", cuda_built() ? "yes" : "no", ")");
  return device;
}

}  // namespace linea::apps
