// Fuzz target: the FASTA reader (nn/readers.h read_fasta, plain and gzip) and the protein app's
// reading of a FASTA split on top of it (apps/protein/dataset.h read_sequences: every record
// encoded with the ESM alphabet).
// Input layout: byte 0 is a mode, the rest is the file.
//   mode bit 0   1: the rest is gzip-compressed by the target before it is written (valid gzip
//                of fuzzed FASTA text); 0: written as is (plain text, or corrupt gzip)
// A file that reads must give records with non-empty ids and sequences of allowed characters.
#include <cctype>

#include "apps/protein/alphabet.h"
#include "apps/protein/dataset.h"
#include "fuzz_util.h"
#include "nn/readers.h"

using namespace linea;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  if (size < 1) return 0;
  const fuzz::fs::path path = fuzz::scratch_dir() / "input.fasta";
  if (data[0] & 1)
    fuzz::write_file(path, fuzz::gzip(data + 1, size - 1));
  else
    fuzz::write_file(path, data + 1, size - 1);

  fuzz::expect_ok_or_error([&] {
    const std::vector<nn::FastaRecord> records = nn::read_fasta(path);
    LINEA_FUZZ_ASSERT(!records.empty(), "read_fasta returned no records without an error");
    for (const nn::FastaRecord& r : records) {
      LINEA_FUZZ_ASSERT(!r.id.empty(), "read_fasta: a record with an empty id");
      for (char c : r.sequence)
        LINEA_FUZZ_ASSERT(std::isalpha(static_cast<unsigned char>(c)) || c == '*' || c == '-' || c == '.',
                          "read_fasta: character ", static_cast<int>(static_cast<unsigned char>(c)),
                          " in the sequence of '", r.id, "'");
    }
  });
  fuzz::expect_ok_or_error([&] {
    const protein::Sequences s = protein::read_sequences(path);
    LINEA_FUZZ_ASSERT(s.names.size() == s.residues.size(), "read_sequences: names and residues differ in count");
    for (const std::vector<int8_t>& r : s.residues)
      for (int8_t id : r) LINEA_FUZZ_ASSERT(protein::is_residue(id), "read_sequences: id ", int(id), " is no residue");
  });
  return 0;
}
