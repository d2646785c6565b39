// safetensors files: a state dict (name -> tensor) plus string metadata, in the format of
// https://github.com/huggingface/safetensors, so checkpoints open in the Python ecosystem:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  UTF-8 JSON: {"__metadata__": {"key": "value", ...},            (optional)
//                           "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//              padded with spaces to a multiple of 8 (as the reference writer does)
//   [rest]     the tensors' raw little-endian row-major bytes, packed back to back in the
//              order of their offsets; offsets are relative to the end of the header.
//
// Writing: tensors in name order (StateDict is sorted), "__metadata__" first in the header,
// each tensor's entry as {"dtype", "shape", "data_offsets"}; written atomically (temp file +
// fsync + rename), so a crash never leaves a half-written file. Linea dtypes map to F32, F64,
// I64 and BOOL.
// Reading: everything in the header is validated before any byte is trusted (sizes, JSON,
// field types, dtype names, shape/offset agreement, packing without gaps or overlaps, data
// length), and a bad file throws linea::Error naming the file and the problem, never crashes.
// Besides Linea's own dtypes, files with I8/I16/I32/U8/U16/U32 (read as Int64) and F16/BF16
// (read as Float32) are accepted, so half-precision or int32 checkpoints from PyTorch load.
// Not here: training checkpoints (optimizer state, RNG, step: nn/checkpoint.h).
#pragma once

#include <map>
#include <string>

#include "nn/module.h"

namespace linea::nn {

using Metadata = std::map<std::string, std::string>;

struct SafetensorsFile {
  StateDict tensors;
  Metadata metadata;
};

// Writes `tensors` (any device, dtype and layout; copied to contiguous CPU bytes) and
// `metadata` to `path` atomically. The name "__metadata__" is reserved.
void save_safetensors(const std::string& path, const StateDict& tensors, const Metadata& metadata = {});

// Reads and validates a whole file; tensors are built on the CPU and then moved to `device`.
SafetensorsFile load_safetensors(const std::string& path, Device device = kCPU);

// Convenience: a module's state_dict to a file, and a file into a module (strict by default:
// missing, unexpected and mis-shaped keys are all listed in one linea::Error).
void save_module(const std::string& path, const Module& module, const Metadata& metadata = {});
Metadata load_module(const std::string& path, Module& module, bool strict = true);

namespace detail {
// The exact bytes save_safetensors writes (header length, padded header, data).
std::string serialize_safetensors(const StateDict& tensors, const Metadata& metadata);
// First half of save_safetensors: writes and fsyncs "<path>.tmp.<pid>" and returns that temp
// path; nn::detail::commit_temp_file (nn/io_util.h) renames it over `path`. Lets a caller
// write several files completely before replacing any of them (training checkpoints).
std::string write_safetensors_temp(const std::string& path, const StateDict& tensors, const Metadata& metadata);
// Parses bytes as a safetensors file; `name` (the path) is used in error messages.
SafetensorsFile parse_safetensors(const char* bytes, size_t size, const std::string& name);
}  // namespace detail

}  // namespace linea::nn
