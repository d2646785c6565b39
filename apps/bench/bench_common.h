// Helpers the benchmarks share: naming the device in a report, splitting --specs lists, and
// formatting error cells. Header-only (each benchmark is one executable).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace linea::bench {

// Splits "a:x=1,y=2,b,c" into {"a:x=1,y=2", "b", "c"}: a piece with '=' and no ':' continues
// the previous spec's options (spec names never contain '=').
inline std::vector<std::string> split_specs(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string piece;
  while (std::getline(ss, piece, ',')) {
    if (piece.empty()) continue;
    if (!out.empty() && piece.find('=') != std::string::npos && piece.find(':') == std::string::npos)
      out.back() += "," + piece;
    else
      out.push_back(piece);
  }
  return out;
}

// The processor's model name from /proc/cpuinfo.
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The GPU's name from nvidia-smi (the benchmarks link no CUDA runtime of their own).
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

// The first line of an error message, for a table cell.
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace linea::bench
