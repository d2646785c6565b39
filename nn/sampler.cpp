// FixedSizeBatchSampler and TokenBudgetBatchSampler (see nn/sampler.h).
#include "nn/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/random.h"
#include "nn/data.h"

namespace linea::nn {

namespace {

// Fisher-Yates over v; the draw for position i is Philox block i under `key`, mapped to [0, i] by a
// 64x64 -> 128-bit multiply (bias below (i + 1) / 2^64).
template <typename T>
void philox_shuffle(std::vector<T>& v, uint64_t key) {
  for (size_t i = v.size(); i-- > 1;) {
    uint32_t w[4];
    linea::detail::Philox::block(key, static_cast<uint64_t>(i), w);
    uint64_t r = (static_cast<uint64_t>(w[0]) << 32) | w[1];
    auto j = static_cast<size_t>((static_cast<unsigned __int128>(r) * (i + 1)) >> 64);
    std::swap(v[i], v[j]);
  }
}

uint64_t epoch_key(uint64_t seed, int64_t epoch) {
  return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) + 0x632BE59BD9B4E019ull));
}

void check_epoch(int64_t epoch, const char* who) { LINEA_CHECK(epoch >= 0, who, ": epoch must be >= 0, got ", epoch); }

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  check_epoch(epoch, "epoch_permutation");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  philox_shuffle(order, epoch_key(seed, epoch));
  return order;
}

// ---- FixedSizeBatchSampler ---------------------------------------------------------------------

FixedSizeBatchSampler::FixedSizeBatchSampler(int64_t num_examples, int64_t batch_size, bool shuffle, uint64_t seed,
                                             bool drop_last)
    : n_(num_examples), batch_size_(batch_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  LINEA_CHECK(batch_size_ >= 1, "FixedSizeBatchSampler: batch_size must be >= 1, got ", batch_size_);
  LINEA_CHECK(n_ >= 0, "FixedSizeBatchSampler: negative number of examples ", n_);
}

int64_t FixedSizeBatchSampler::num_batches(int64_t) const {
  return drop_last_ ? n_ / batch_size_ : (n_ + batch_size_ - 1) / batch_size_;
}

std::vector<int64_t> FixedSizeBatchSampler::order(int64_t epoch) const {
  check_epoch(epoch, "FixedSizeBatchSampler");
  if (shuffle_) return epoch_permutation(n_, seed_, epoch);
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

std::vector<std::vector<int64_t>> FixedSizeBatchSampler::batches(int64_t epoch) const {
  const std::vector<int64_t> ord = order(epoch);
  std::vector<std::vector<int64_t>> out;
  for (int64_t b = 0, nb = num_batches(epoch); b < nb; ++b) {
    const int64_t begin = b * batch_size_, end = std::min(n_, begin + batch_size_);
    out.emplace_back(ord.begin() + begin, ord.begin() + end);
  }
  return out;
}

// ---- TokenBudgetBatchSampler -------------------------------------------------------------------

TokenBudgetBatchSampler::TokenBudgetBatchSampler(std::vector<int64_t> lengths, TokenBudgetOptions options)
    : lengths_(std::move(lengths)), opts_(options) {
  LINEA_CHECK(opts_.max_tokens >= 1, "TokenBudgetBatchSampler: max_tokens must be >= 1, got ", opts_.max_tokens);
  LINEA_CHECK(opts_.max_batch_size >= 0, "TokenBudgetBatchSampler: max_batch_size must be >= 0, got ",
              opts_.max_batch_size);
  for (size_t i = 0; i < lengths_.size(); ++i) {
    LINEA_CHECK(lengths_[i] >= 1, "TokenBudgetBatchSampler: example ", i, " has length ", lengths_[i],
                " (lengths must be >= 1)");
    LINEA_CHECK(lengths_[i] <= opts_.max_tokens, "TokenBudgetBatchSampler: example ", i, " has length ", lengths_[i],
                ", more than the budget of ", opts_.max_tokens,
                " tokens per batch (raise max_tokens or truncate/drop long examples)");
  }
}

std::vector<std::vector<int64_t>> TokenBudgetBatchSampler::batches(int64_t epoch) const {
  check_epoch(epoch, "TokenBudgetBatchSampler");
  const int64_t n = num_examples();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (opts_.shuffle) philox_shuffle(order, epoch_key(opts_.seed, epoch));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths_[a] < lengths_[b]; });
  // Ascending lengths: the example being added is the batch's longest.
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> cur;
  for (int64_t i : order) {
    const int64_t count = static_cast<int64_t>(cur.size()) + 1;
    const bool full = opts_.max_batch_size > 0 && count > opts_.max_batch_size;
    if (!cur.empty() && (full || lengths_[i] * count > opts_.max_tokens)) {
      out.push_back(std::move(cur));
      cur.clear();
    }
    cur.push_back(i);
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  if (opts_.shuffle) philox_shuffle(out, epoch_key(opts_.seed ^ 0xB47C4E5ull, epoch));
  return out;
}

ShardRange shard_range(int64_t n, int rank, int world) {
  LINEA_CHECK(world >= 1 && rank >= 0 && rank < world, "shard_range: rank ", rank, " of ", world);
  const int64_t first = n * rank / world, end = n * (rank + 1) / world;
  return {first, end - first};
}

ShardedBatchSampler::ShardedBatchSampler(std::shared_ptr<const BatchSampler> inner, int rank, int world)
    : inner_(std::move(inner)), rank_(rank), world_(world) {
  LINEA_CHECK(inner_ != nullptr, "ShardedBatchSampler: the inner sampler is null");
  LINEA_CHECK(world >= 1 && rank >= 0 && rank < world, "ShardedBatchSampler: rank ", rank, " is not a rank of ",
              world);
}

std::vector<std::vector<int64_t>> ShardedBatchSampler::batches(int64_t epoch) const {
  std::vector<std::vector<int64_t>> out = inner_->batches(epoch);
  for (auto& b : out) {
    const ShardRange r = shard_range(static_cast<int64_t>(b.size()), rank_, world_);
    b = std::vector<int64_t>(b.begin() + r.first, b.begin() + r.first + r.count);
  }
  return out;
}

}  // namespace linea::nn
