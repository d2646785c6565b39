// Data loading: batches of named tensors, a Dataset interface, and a DataLoader that gathers the
// batches a BatchSampler (nn/sampler.h) chooses, on a background prefetch thread.
//
//   auto data = std::make_shared<TensorDataset>(read_idx_images(img_path), read_idx_labels(lbl_path));
//   DataLoader loader(data, std::make_shared<FixedSizeBatchSampler>(data->size(), 128, true, seed));
//   for (int64_t e = 0; e < epochs; ++e)
//     for (Batch& b : loader.epoch(e)) { ... b.at("input") [128, 1, 28, 28], b.at("target") [128] ... }
//
// The sampler's batches are a pure function of (its settings, epoch), never of the global
// generator: the data of epoch e is the same in every run and after a resume, and training code
// may use the global RNG freely. The prefetch thread prepares the next batches while the consumer
// trains on the current one; batches come out in the same order and with the same contents with
// prefetch on or off, an exception thrown while preparing a batch is rethrown by the next() that
// would have returned it, and the destructor stops the thread.
// Not here: the file readers (nn/readers.h), which examples form a batch (nn/sampler.h),
// tokenization, augmentation (a Dataset can do it, deterministically from its index), moving
// batches to a device (the training loop does, on its own thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/sampler.h"

namespace linea::nn {

// Named tensors: one example, or a batch of them stacked along a new leading dim. Images use
// "input" and "target"; a text app may add "mask", "lengths", ... Undefined tensors are not stored.
class Batch {
 public:
  Batch() = default;
  Batch(std::initializer_list<std::pair<const std::string, Tensor>> tensors);
  // The tensor `name`; throws linea::Error listing the names present when there is none.
  const Tensor& at(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // Sets (an undefined tensor removes the name).
  void set(const std::string& name, Tensor t);
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  bool empty() const { return tensors_.empty(); }
  std::string names() const;  // "input, target"

 private:
  std::map<std::string, Tensor> tensors_;
};
using Example = Batch;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size(). Called from the loader's prefetch thread, so it must not use the
  // global RNG or unsynchronized shared state, and should return CPU tensors.
  virtual Example get(int64_t i) const = 0;
  // The examples `indices` stacked along a new dim 0, name by name. The default calls get() for
  // each and stacks (all examples must have the same names, and each name one shape and dtype);
  // override it when a whole batch can be gathered at once (TensorDataset does) or must be padded.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

// The rows of CPU tensors inputs [N, ...] ("input") and targets [N, ...] ("target"; may be
// undefined). get_batch is one index_select per tensor.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets = Tensor());
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
  int64_t n_;
};

// splitmix64, a 64-bit mixing function: random bits for a Dataset that needs them per example
// (augmentation), as a pure function of (seed, epoch, index) without a shared generator, e.g.
// splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ index).
uint64_t splitmix64(uint64_t x);

struct DataLoaderOptions {
  // For the FixedSizeBatchSampler the loader builds when it is given none:
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;      // drop the last batch when it is smaller than batch_size
  // Loading:
  bool prefetch = true;        // prepare batches on a background thread
  int64_t prefetch_depth = 2;  // batches prepared ahead of the consumer (>= 1)
};

class DataLoader {
 public:
  // Batches from a FixedSizeBatchSampler(dataset size, batch_size, shuffle, seed, drop_last).
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  // Batches from `sampler` (batch_size, shuffle, seed and drop_last of options are unused).
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const BatchSampler> sampler,
             DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const DataLoaderOptions& options() const { return opts_; }
  const Dataset& dataset() const { return *dataset_; }
  const BatchSampler& sampler() const { return *sampler_; }
  std::shared_ptr<const BatchSampler> sampler_ptr() const { return sampler_; }
  // Data parallelism: from the next reset() on, this loader yields rank `rank`'s slice of every
  // batch (a ShardedBatchSampler around the current sampler, or around the whole-batch sampler of
  // an earlier shard()); an empty slice is an empty Batch.
  void shard(int rank, int world);
  int64_t num_batches(int64_t epoch) const { return sampler_->num_batches(epoch); }
  int64_t num_batches() const { return num_batches(epoch_); }  // of the current epoch

  // Starts epoch `epoch` at batch `first_batch` (to resume mid-epoch), discarding anything
  // still being prepared for the previous position.
  void reset(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the current epoch (epoch 0 if reset was never called); false at the end.
  // Rethrows an exception raised while preparing that batch (the epoch then ends).
  bool next(Batch& batch);
  int64_t epoch() const { return epoch_; }

  // for (Batch& b : loader.epoch(e)) { ... }: reset(e, first_batch), then next() until the end.
  class Iterator {
   public:
    Iterator(DataLoader* loader, bool done) : loader_(loader), done_(done) { advance(); }
    Batch& operator*() { return batch_; }
    Batch* operator->() { return &batch_; }
    Iterator& operator++() {
      advance();
      return *this;
    }
    bool operator!=(const Iterator& o) const { return done_ != o.done_; }
    bool operator==(const Iterator& o) const { return done_ == o.done_; }

   private:
    void advance() {
      if (!done_) done_ = !loader_->next(batch_);
    }
    DataLoader* loader_;
    bool done_;
    Batch batch_;
  };
  class Range {
   public:
    explicit Range(DataLoader* loader) : loader_(loader) {}
    Iterator begin() { return Iterator(loader_, false); }
    Iterator end() { return Iterator(loader_, true); }

   private:
    DataLoader* loader_;
  };
  Range epoch(int64_t epoch, int64_t first_batch = 0) {
    reset(epoch, first_batch);
    return Range(this);
  }

 private:
  Batch make_batch(int64_t b) const;
  void stop_worker();
  void worker_loop(int64_t first, int64_t last);

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const BatchSampler> sampler_;
  DataLoaderOptions opts_;
  int64_t epoch_ = 0;
  bool started_ = false;
  std::vector<std::vector<int64_t>> batches_;  // of the current epoch
  int64_t next_batch_ = 0;  // without prefetch: the next batch to build

  // Prefetch state (guarded by mu_).
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  bool worker_done_ = true;
};

}  // namespace linea::nn
