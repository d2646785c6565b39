// Generated protein sequences for the protein app's tests, with something to learn: families of
// mutated copies of Markov-chain sequences whose next residue is a fixed function of the current
// one half of the time, written as a FASTA file wrapped like UniProt's. mmseqs2 clusters the
// families, so a cluster split tests on families the model never saw.
#pragma once

#include <cstdint>
#include <fstream>
#include <random>
#include <string>

namespace protein::test {

inline const std::string kStandard = "LAGVSERTIDPKQNFYMHWC";

// The chain's rule: after residue c comes successor(c) with probability 1/2, else any residue.
inline char successor(char c) { return kStandard[(kStandard.find(c) * 7 + 3) % 20]; }

inline std::string chain(std::mt19937& rng, int64_t length) {
  std::uniform_int_distribution<int> any(0, 19), coin(0, 1);
  std::string s(1, kStandard[any(rng)]);
  while (static_cast<int64_t>(s.size()) < length) s += coin(rng) ? successor(s.back()) : kStandard[any(rng)];
  return s;
}

// `families` families of `members` sequences: a chain of 30..120 residues and copies with 5%
// substitutions, named <tag><family>_<member>.
inline void write_families(const std::string& path, int families, int members, uint32_t seed, const std::string& tag) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(30, 120), any(0, 19), pct(0, 99);
  std::ofstream f(path);
  for (int fam = 0; fam < families; ++fam) {
    const std::string base = chain(rng, len(rng));
    for (int m = 0; m < members; ++m) {
      std::string s = base;
      if (m > 0)
        for (char& c : s)
          if (pct(rng) < 5) c = kStandard[any(rng)];
      f << ">" << tag << fam << "_" << m << " family " << fam << "\n";
      for (size_t i = 0; i < s.size(); i += 60) f << s.substr(i, 60) << "\n";  // wrapped like UniProt
    }
  }
}

}  // namespace protein::test
