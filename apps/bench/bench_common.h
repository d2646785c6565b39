// Helpers the benchmarks share: splitting --specs lists and formatting error cells (device
// naming and --device come from apps/common/device.h, threads from core/runtime.h). Header-only (each benchmark is one executable).
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/common/device.h"
#include "core/device.h"
#include "core/error.h"
#include "core/runtime.h"

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

using apps::device_name;  // the device helpers live in apps/common/device.h, shared with the apps
using apps::resolve_device;

// The first line of an error message, for a table cell.
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace linea::bench
