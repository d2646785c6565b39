// Helpers the benchmarks share: splitting --specs lists, the median of timings and formatting
// error cells (device naming and --device come from apps/common/device.h, threads from
// core/runtime.h, synchronize and allocator_of from core/device.h). Header-only (each benchmark
// is one executable).
#pragma once

#include <algorithm>
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

// The median of repeated timings (the mean of the middle two for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Characters a UTF-8 string shows ("±" is two bytes, one character), for padding table columns.
inline size_t display_width(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // not a continuation byte
  return n;
}

// Prints a table to stdout: a header of `corner` (over the row labels, 8 wide) and the column
// names, then a row per label with its cells (cells[row][column]). A column is as wide as its
// widest entry, two spaces apart; the last is not padded.
inline void print_table(const std::string& corner, const std::vector<std::string>& rows,
                        const std::vector<std::string>& columns, const std::vector<std::vector<std::string>>& cells) {
  std::vector<size_t> width(columns.size());
  for (size_t j = 0; j < columns.size(); ++j) {
    width[j] = display_width(columns[j]);
    for (const std::vector<std::string>& row : cells) width[j] = std::max(width[j], display_width(row[j]));
  }
  const auto print_row = [&](const std::string& label, const std::vector<std::string>& entries) {
    std::printf("%8s", label.c_str());
    for (size_t j = 0; j < entries.size(); ++j) {
      const size_t pad = j + 1 == entries.size() ? 0 : width[j] - display_width(entries[j]);
      std::printf("  %s%*s", entries[j].c_str(), static_cast<int>(pad), "");
    }
    std::printf("\n");
  };
  print_row(corner, columns);
  for (size_t i = 0; i < rows.size(); ++i) print_row(rows[i], cells[i]);
}

// The first line of an error message, for a table cell.
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace linea::bench
