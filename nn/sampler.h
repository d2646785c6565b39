// Batch samplers: which examples form each batch of an epoch. The DataLoader (nn/data.h) asks
// its sampler for the batches of an epoch and gathers them from the dataset.
//
//   FixedSizeBatchSampler   batches of batch_size examples in a (seed, epoch) permutation (or in
//                           order), the last one smaller or dropped (drop_last)
//   TokenBudgetBatchSampler examples grouped by length, each batch's padded size (longest
//                           example x count) within max_tokens, batches in a (seed, epoch) order
//   ShardedBatchSampler     data parallelism: one rank's contiguous slice of another sampler's batches
//
// Every sampler is a pure function of (its settings, epoch): the batches of epoch e are the same in
// every run and after a resume, a resume mid-epoch restarts at a batch index
// (DataLoader::reset(epoch, batch)), and the global RNG plays no part.
// Not here: gathering or padding the examples (the Dataset's get_batch does).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace linea::nn {

class BatchSampler {
 public:
  virtual ~BatchSampler() = default;
  // The batches of `epoch` (>= 0): lists of example indices in [0, num_examples()); every
  // example appears at most once per epoch.
  virtual std::vector<std::vector<int64_t>> batches(int64_t epoch) const = 0;
  virtual int64_t num_batches(int64_t epoch) const { return static_cast<int64_t>(batches(epoch).size()); }
  virtual int64_t num_examples() const = 0;
};

// A permutation of 0..n-1 that depends only on (seed, epoch): Fisher-Yates driven by
// Philox4x32-10 keyed by seed and epoch. Pinned by tests: changing it changes existing runs' data order.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

class FixedSizeBatchSampler : public BatchSampler {
 public:
  FixedSizeBatchSampler(int64_t num_examples, int64_t batch_size, bool shuffle = true, uint64_t seed = 0,
                        bool drop_last = false);
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override;
  int64_t num_batches(int64_t epoch) const override;
  int64_t num_examples() const override { return n_; }
  // The example order of an epoch: the identity without shuffling, else epoch_permutation.
  std::vector<int64_t> order(int64_t epoch) const;

 private:
  int64_t n_, batch_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
};

struct TokenBudgetOptions {
  int64_t max_tokens = 4096;  // longest example of a batch x its number of examples <= this
  int64_t max_batch_size = 0;  // at most this many examples per batch (0: no limit)
  bool shuffle = true;        // batch order (and ties of equal length) from (seed, epoch); else by length
  uint64_t seed = 0;
};

// Length bucketing: each epoch, the examples are put in a (seed, epoch) random order, stably sorted
// by length (so equal lengths are mixed differently each epoch), and cut greedily into batches whose
// padded size stays within max_tokens; the batches are then shuffled by (seed, epoch). Every example
// appears exactly once per epoch. An example longer than max_tokens is refused at construction.
class TokenBudgetBatchSampler : public BatchSampler {
 public:
  TokenBudgetBatchSampler(std::vector<int64_t> lengths, TokenBudgetOptions options);
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override;
  int64_t num_examples() const override { return static_cast<int64_t>(lengths_.size()); }
  const std::vector<int64_t>& lengths() const { return lengths_; }

 private:
  std::vector<int64_t> lengths_;
  TokenBudgetOptions opts_;
};

// Data parallelism (nn/data_parallel.h): rank r of `world` gets, of every batch of `inner`, the
// contiguous slice shard_range(n, r, world) (sizes differ by at most one; a batch smaller than
// the world leaves some ranks an empty slice), so the ranks together see each batch in the order
// one process would, and every rank has the same number of batches.
class ShardedBatchSampler : public BatchSampler {
 public:
  ShardedBatchSampler(std::shared_ptr<const BatchSampler> inner, int rank, int world);
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override;
  int64_t num_batches(int64_t epoch) const override { return inner_->num_batches(epoch); }
  int64_t num_examples() const override { return inner_->num_examples(); }
  const std::shared_ptr<const BatchSampler>& inner() const { return inner_; }

 private:
  std::shared_ptr<const BatchSampler> inner_;
  int rank_, world_;
};

// [first, first + count) of a batch of n examples for rank `rank` of `world`: n * rank / world
// .. n * (rank + 1) / world.
struct ShardRange {
  int64_t first = 0, count = 0;
};
ShardRange shard_range(int64_t n, int rank, int world);

}  // namespace linea::nn
