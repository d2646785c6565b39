// Reading a prepared protein folder (prepare.h) back, and the masked-language-model dataset:
// which residues each example holds, which of them are masked and what replaces them.
//
//   Manifest m = read_manifest("data/protein");
//   auto train = std::make_shared<const Sequences>(read_sequences(split_path(m, "train")));
//   MaskedLMDataset data(train, {.max_len = 256, .train = true, .seed = seed});
//   nn::TokenBudgetBatchSampler sampler(data.lengths(), {16384, 0, true, seed});
//
// Examples are windows: a list of pieces, each residues [begin, end) of one sequence, framed by
// <cls> before and/or <eos> after. Three ways to cut them:
//   train (pack = 0)  one example per sequence: the whole sequence as <cls> s <eos> when it fits in
//                     max_len tokens, else a random crop of max_len - 2 residues (its offset drawn
//                     from (seed, epoch, sequence)), framed the same way
//   eval  (pack = 0)  every sequence whole, in ceil(n / (max_len - 2)) windows of near-equal length
//                     (sequence_windows), each framed; every residue is scored exactly once
//   pack = L          the split's sequences concatenated as <cls> s1 <eos> <cls> s2 <eos> ... (in
//                     a (seed) random order for train, in file order for eval) and cut into windows
//                     of L tokens; train windows start at an offset drawn from (seed, epoch), so
//                     the cuts move every epoch; the count of windows is the same every epoch.
//                     With S stream tokens: train has floor((S+1)/L) - 1 windows of exactly L
//                     tokens from an offset in [0, S - count*L] (so up to 2L-2 tokens at the ends
//                     of the stream sit out an epoch); eval has ceil(S/L), the last one shorter,
//                     and covers every residue once. A window may start or end inside a sequence:
//                     only a sequence's true start has <cls>, only its true end <eos>.
// Masking (BERT/ESM): each residue position is chosen with probability `prob` (0.15); a chosen
// one becomes <mask> with probability 0.8, a random standard residue (never a special token)
// with 0.1, and stays with 0.1. Every draw is a pure function of (seed, stream, sequence index,
// position in the sequence): stream = the epoch in training; for evaluation one fixed stream, so
// an evaluation scores the same positions with the same inputs whatever the batch size, order,
// windows or packing. Special tokens are never chosen.
// Not here: the model, the loss, the metrics (train.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/data.h"

namespace protein {

struct Manifest {
  std::string dir;
  nlohmann::json json;  // data.json
};
// data.json of a prepared folder; a missing or foreign folder is a linea::Error that says to run
// `protein prepare`.
Manifest read_manifest(const std::string& data_dir);
// <dir>/<split>.fasta for split train, valid, test or query (query: "" when the folder has none).
std::string split_path(const Manifest& m, const std::string& split);

struct Sequences {
  std::vector<std::string> names;            // the FASTA ids
  std::vector<std::vector<int8_t>> residues;  // residue ids (alphabet.h), no <cls>/<eos>
  int64_t size() const { return static_cast<int64_t>(residues.size()); }
  int64_t total_residues() const;
};
// A FASTA or FASTA.gz file, every record encoded (errors name the file, the record and position).
// An empty file (an empty split, e.g. prepare --test-size 0) gives no sequences.
Sequences read_sequences(const std::string& fasta_path);

struct MaskingOptions {
  double prob = 0.15;          // chosen residue positions
  double mask_token = 0.8;     // of the chosen: replaced by <mask>
  double random_token = 0.1;   // of the chosen: replaced by a random standard residue (the rest stay)
};

// One draw: whether position `pos` of sequence `seq` is chosen, and its input token.
struct MaskDraw {
  bool chosen = false;
  int64_t input = 0;  // the token the model sees (the residue itself when not chosen)
};
// The draw for a residue `residue` at (seed, stream, seq, pos): a pure function (splitmix64).
MaskDraw mask_draw(uint64_t seed, uint64_t stream, int64_t seq, int64_t pos, int64_t residue,
                   const MaskingOptions& masking);
// The stream of evaluation masks (any stream an epoch cannot reach).
constexpr uint64_t kEvalStream = ~uint64_t{0};

// [begin, end) residue ranges covering a sequence of `length` residues in windows of at most
// `max_residues`: ceil(length / max_residues) ranges of near-equal length, in order.
std::vector<std::pair<int64_t, int64_t>> sequence_windows(int64_t length, int64_t max_residues);

struct Piece {
  int64_t seq = 0;         // index into the Sequences
  int64_t begin = 0, end = 0;  // residues [begin, end)
  bool cls = false, eos = false;  // framed by <cls> before / <eos> after
  int64_t tokens() const { return end - begin + cls + eos; }
};
using Window = std::vector<Piece>;

struct DatasetOptions {
  int64_t max_len = 256;  // tokens per example with <cls>/<eos> (>= 3); the model's positions
  int64_t pack = 0;       // > 0: windows of this many tokens from the concatenated split (max_len unused)
  bool train = true;      // random crops and per-epoch masks; else whole sequences and fixed masks
  MaskingOptions masking;
  uint64_t seed = 0;
};

// A batch of B examples, T = the longest example's tokens:
//   "tokens"  Int64 [B, T]  the model's input: framed residues with the masking applied, padded with <pad>
//   "targets" Int64 [B, T]  the original residue at chosen positions, else <pad> (the loss's ignore index)
//   "pad"     Bool  [B, T]  true at padding
//   "index"   Int64 [B]     the examples' indices
class MaskedLMDataset : public linea::nn::Dataset {
 public:
  MaskedLMDataset(std::shared_ptr<const Sequences> sequences, DatasetOptions options);

  int64_t size() const override { return static_cast<int64_t>(lengths_.size()); }
  linea::nn::Example get(int64_t i) const override;  // the batch entries without the batch dim
  linea::nn::Batch get_batch(const std::vector<int64_t>& indices) const override;
  // Training: the epoch whose crops, masks and pack offset get() uses (thread-safe: the
  // loader's prefetch thread may be reading).
  void set_epoch(int64_t epoch) { epoch_.store(epoch); }
  int64_t epoch() const { return epoch_.load(); }

  // Example i of the current epoch.
  Window window(int64_t i) const;
  // Tokens per example (the same every epoch): for nn::TokenBudgetBatchSampler.
  const std::vector<int64_t>& lengths() const { return lengths_; }
  const Sequences& sequences() const { return *seqs_; }
  const DatasetOptions& options() const { return opts_; }

 private:
  std::shared_ptr<const Sequences> seqs_;
  DatasetOptions opts_;
  std::vector<int64_t> lengths_;
  std::atomic<int64_t> epoch_{0};
  std::vector<Window> fixed_windows_;  // eval without packing: every example's window
  // Packing: the sequences in stream order, where each one's <cls> sits in the stream
  // (pack_starts_[k], plus the total at the end), and the stream's length in tokens.
  std::vector<int64_t> pack_order_, pack_starts_;
  int64_t pack_total_ = 0;

  Window window_at(int64_t i, int64_t epoch) const;
  int64_t pack_offset(int64_t epoch) const;  // training: where window 0 starts in the stream
};

}  // namespace protein
