// Data loading: a Dataset interface, a batching DataLoader with reproducible shuffling and a
// background prefetch thread, and readers for the formats the apps use: IDX (MNIST-style,
// gzip or plain), FASTA / FASTA.gz, and image folders (class sub-folders of PNG/JPEG).
//
//   auto data = std::make_shared<TensorDataset>(read_idx_images(img_path), read_idx_labels(lbl_path));
//   DataLoaderOptions opts;
//   opts.batch_size = 128;
//   DataLoader loader(data, opts);
//   for (int64_t e = 0; e < epochs; ++e)
//     for (Batch& b : loader.epoch(e)) { ... b.input [128, 1, 28, 28], b.target [128] ... }
//
// Shuffling uses the loader's own Philox stream keyed by (seed, epoch), never the global
// generator: the data order of epoch e is the same in every run and after a resume, and
// training code may use the global RNG freely. The prefetch thread prepares the next batches
// while the consumer trains on the current one; batches come out in the same order and with
// the same contents with prefetch on or off, an exception thrown while preparing a batch is
// rethrown by the next() that would have returned it, and the destructor stops the thread.
// Not here: tokenization, augmentation (a Dataset can do it, deterministically from its index),
// moving batches to a device (the training loop does, on its own thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"

namespace linea::nn {

// One example, or a batch of them stacked along a new leading dim. target may be undefined
// (unlabelled data).
struct Example {
  Tensor input;
  Tensor target;
};
using Batch = Example;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size(). Called from the loader's prefetch thread, so it must not use the
  // global RNG or unsynchronized shared state, and should return CPU tensors.
  virtual Example get(int64_t i) const = 0;
  // The examples `indices` stacked along a new dim 0. The default calls get() for each and
  // stacks (all inputs, and all targets, must share one shape and dtype); override it when a
  // whole batch can be gathered at once (TensorDataset does).
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

// The rows of CPU tensors inputs [N, ...] and targets [N, ...] (targets may be undefined).
// get_batch is one index_select per tensor.
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
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;      // drop the last batch when it is smaller than batch_size
  bool prefetch = true;        // prepare batches on a background thread
  int64_t prefetch_depth = 2;  // batches prepared ahead of the consumer (>= 1)
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const DataLoaderOptions& options() const { return opts_; }
  const Dataset& dataset() const { return *dataset_; }
  int64_t num_batches() const;  // per epoch

  // The example order of an epoch: 0..N-1 without shuffling, else a permutation that depends
  // only on (seed, epoch) (Fisher-Yates driven by Philox4x32-10 keyed by seed and epoch).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

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
  DataLoaderOptions opts_;
  int64_t epoch_ = 0;
  bool started_ = false;
  std::vector<int64_t> order_;
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

// ---- readers ---------------------------------------------------------------------------------

// An IDX file (http://yann.lecun.com/exdb/mnist/ format: magic 0x00 0x00 <type> <ndim>, ndim
// big-endian uint32 sizes, then the data), gzip-compressed or plain. Only unsigned-byte data
// (type 0x08) is supported.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major
};
IdxArray read_idx_gz(const std::string& path);
// Images (magic 0x00000803, [N, rows, cols]) as Float32 [N, 1, rows, cols] scaled to [0, 1]
// (scale = false keeps 0..255; add_channel = false gives [N, rows, cols]).
Tensor read_idx_images(const std::string& path, bool scale = true, bool add_channel = true);
// Labels (magic 0x00000801, [N]) as Int64 [N].
Tensor read_idx_labels(const std::string& path);
// Both, checked to hold the same number of examples, as a dataset.
std::shared_ptr<TensorDataset> load_idx_dataset(const std::string& images_path, const std::string& labels_path);

// FASTA or FASTA.gz (gzip detected by its magic bytes). Header lines ">id description";
// sequence lines are concatenated with whitespace removed; blank lines and ';' comment lines
// are skipped. Sequence characters must be letters, '*', '-' or '.'.
struct FastaRecord {
  std::string id;
  std::string description;
  std::string sequence;
};
std::vector<FastaRecord> read_fasta(const std::string& path);

// A folder of class sub-folders of PNG/JPEG images (dir/<class>/<file>.png|.jpg|.jpeg), read
// with stb_image. Classes are the sub-folder names sorted; files are sorted by name within a
// class; other files and hidden entries are ignored.
struct ImageFolderOptions {
  int channels = 0;      // 1 (grayscale) or 3 (RGB); 0: 1 if the first image is gray(+alpha), else 3
  int64_t height = 0;    // both 0: every image must have the first image's size;
  int64_t width = 0;     // else every image is resized to height x width
  bool bilinear = true;  // resize filter: bilinear (half-pixel centers) or nearest
};
struct ImageFolder {
  Tensor images;                     // Float32 [N, C, H, W] in [0, 1]
  Tensor labels;                     // Int64 [N]: index into classes
  std::vector<std::string> classes;  // sorted sub-folder names
  std::vector<std::string> files;    // each image's path
};
ImageFolder read_image_folder(const std::string& dir, const ImageFolderOptions& options = {});

// One PNG/JPEG image as Float32 [channels, height, width] in [0, 1], converted to `channels`
// (1 or 3) and resized (bilinear, half-pixel centers) when its size differs; height = width = 0
// keeps its own size. Throws naming the file when it cannot be decoded.
Tensor read_image(const std::string& path, int channels, int64_t height = 0, int64_t width = 0);

}  // namespace linea::nn
