// `protein prepare`: builds the protein data folder from a FASTA file (default: the 20,000
// UniProt sequences of Debian's mmseqs2-examples), split by sequence-identity clusters so that
// no test sequence has a close relative in training.
//
//   protein prepare                                    DB.fasta.gz, cluster split, data/protein
//   protein prepare --split random --out data/protein-random
//   protein prepare --fasta my.fasta.gz --query other.fasta --out data/mine
//
// Clustering runs Debian's `mmseqs easy-cluster input.fasta clu tmp --min-seq-id 0.5 -c 0.8`
// (flags --min-seq-id, --coverage, --threads) as a subprocess in a temporary folder beside --out
// (removed afterwards), on the checked records with their headers replaced by 0-based indices, and
// reads its clu_cluster.tsv (representative, member). Splits, deterministic by --seed:
//   cluster  whole clusters, in a (seed) random order, go to test until it holds --test-size
//            sequences, then to valid until --valid-size, the rest to train
//   random   sequences drawn at random (the clusters are still computed, to count how many valid
//            and test sequences have a cluster-mate in train: what a random split leaks)
// Every sequence is checked against the alphabet (alphabet.h) before anything is written, and
// ids (the first word of a header) must be unique.
//
// The folder (--out, default data/protein), written to a temporary sibling folder and renamed
// into place only when complete (an existing folder is replaced only if it holds a data.json):
//   train.fasta, valid.fasta, test.fasta   the split's records, headers and sequences as read
//                                          (sequence on one line), in input order
//   query.fasta                            --query's records (default QUERY.fasta.gz; none if "")
//   clusters.tsv                           "representative<TAB>member" per input sequence (ids)
//   data.json                              the manifest:
//     format          "linea-protein-data/1"
//     inputs          fasta, sequences, residues, query, query_sequences
//     split           method, seed, valid_size, test_size
//     mmseqs          command, version, min_seq_id, coverage, threads
//     clusters        count, largest, singletons
//     files           train, valid, test, (query,) clusters: file names in the folder
//     splits          train, valid, test (and query): sequences, residues, clusters (not query),
//                     length {mean, median, p90, max}; valid, test and query: identical_in_train
//                     (the very same sequence is in train); valid, test: with_cluster_mate_in_train
//                     (0 for the cluster split; what a random split leaks)
//     residue_counts  {"L": n, "A": n, ...}: every residue character, counted over train (for the
//                     unigram baseline)
//     seconds         how long prepare took (the one field that differs between identical runs)
// Not here: reading the folder back, masking, batching (dataset.h).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

namespace CLI {
class App;
}

namespace protein {

inline const char* kDefaultFasta = "/usr/share/doc/mmseqs2/example-data/DB.fasta.gz";
inline const char* kDefaultQuery = "/usr/share/doc/mmseqs2/example-data/QUERY.fasta.gz";
inline const char* kDataFormat = "linea-protein-data/1";

struct PrepareOptions {
  std::string out = "data/protein";
  std::string fasta = kDefaultFasta;
  std::string query = kDefaultQuery;  // "" for none
  std::string split = "cluster";      // cluster | random
  int64_t valid_size = 1000, test_size = 1000;  // sequences (cluster split: at least, whole clusters)
  double min_seq_id = 0.5, coverage = 0.8;
  std::string mmseqs = "mmseqs";  // the executable
  int threads = 0;                // mmseqs --threads (0: all cores)
  uint64_t seed = 0;
};

// Registers the flags above on `app` (the `prepare` subcommand), showing opts' values as defaults.
void add_prepare_flags(CLI::App& app, PrepareOptions& opts);

struct PrepareResult {
  std::string out;
  int64_t train = 0, valid = 0, test = 0, query = 0;  // sequences
  double seconds = 0;
  nlohmann::json data;  // what data.json holds
};

// Writes the folder; progress lines go to `log` when given. Bad flags and inputs (a missing
// FASTA, an empty record, an invalid residue, mmseqs missing or failing) are linea::Error.
PrepareResult prepare(const PrepareOptions& options, std::ostream* log = nullptr);

// A few lines for the terminal: sequences and residues per split, clusters, time.
std::string describe(const PrepareResult& result);

}  // namespace protein
