// A toy language pair for the translate app's tests: sentences of 2..7 words from a vocabulary of
// 20 and their word-for-word "translations" (learnable in seconds), written as two line-aligned
// text files for `translate prepare --src --tgt`.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace translate::test {

inline void write_toy_pair(const std::string& src_path, const std::string& tgt_path, int sentences = 800) {
  const std::vector<std::string> src_w{"sun",  "moon",  "star",  "tree", "river", "stone", "bird",
                                       "fish", "house", "road",  "king", "bread", "water", "fire",
                                       "wind", "light", "night", "day",  "hand",  "eye"};
  const std::vector<std::string> tgt_w{"sol",    "luna", "estrella", "arbol", "rio",  "piedra", "pajaro",
                                       "pez",    "casa", "camino",   "rey",   "pan",  "agua",   "fuego",
                                       "viento", "luz",  "noche",    "dia",   "mano", "ojo"};
  std::ofstream s(src_path), t(tgt_path);
  uint64_t x = 12345;
  auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % n;
  };
  for (int i = 0; i < sentences; ++i) {
    const uint64_t n = 2 + next(6);
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t w = next(20);
      s << (k ? " " : "") << src_w[w];
      t << (k ? " " : "") << tgt_w[w];
    }
    s << "\n";
    t << "\n";
  }
}

}  // namespace translate::test
