// Batch, the datasets and the prefetching DataLoader (see nn/data.h).
// Not here: the file readers (nn/readers.cpp) or the samplers (nn/sampler.cpp).
#include "nn/data.h"

#include <omp.h>

#include <algorithm>

#include "autograd/ops.h"

namespace linea::nn {

// ---- Batch ----------------------------------------------------------------------------------

Batch::Batch(std::initializer_list<std::pair<const std::string, Tensor>> tensors) {
  for (const auto& [name, t] : tensors) set(name, t);
}

const Tensor& Batch::at(const std::string& name) const {
  auto it = tensors_.find(name);
  LINEA_CHECK(it != tensors_.end(), "Batch: no tensor named '", name, "' (the batch has ",
              tensors_.empty() ? std::string("none") : names(), ")");
  return it->second;
}

void Batch::set(const std::string& name, Tensor t) {
  if (t.defined())
    tensors_[name] = std::move(t);
  else
    tensors_.erase(name);
}

std::string Batch::names() const {
  std::string out;
  for (const auto& kv : tensors_) out += (out.empty() ? "" : ", ") + kv.first;
  return out;
}

// ---- datasets ------------------------------------------------------------------------------

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  LINEA_CHECK(!indices.empty(), "Dataset::get_batch: empty list of indices");
  std::map<std::string, std::vector<Tensor>> parts;
  Example first;
  for (size_t k = 0; k < indices.size(); ++k) {
    Example e = get(indices[k]);
    LINEA_CHECK(!e.empty(), "Dataset::get_batch: example ", indices[k], " has no tensors");
    if (k == 0) first = e;
    LINEA_CHECK(e.names() == first.names(), "Dataset::get_batch: example ", indices[k], " has tensors ", e.names(),
                " but example ", indices[0], " has ", first.names());
    for (const auto& [name, t] : e.tensors()) {
      const Tensor& f = first.at(name);
      LINEA_CHECK(t.shape() == f.shape() && t.dtype() == f.dtype(), "Dataset::get_batch: example ", indices[k],
                  " has ", name, " ", shape_str(t.shape()), " ", dtype_name(t.dtype()), " but example ", indices[0],
                  " has ", shape_str(f.shape()), " ", dtype_name(f.dtype()),
                  " (examples of one batch must share shape and dtype)");
      parts[name].push_back(t.detach());
    }
  }
  Batch b;
  for (auto& [name, ts] : parts) b.set(name, stack(ts, 0));
  return b;
}

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  LINEA_CHECK(inputs_.defined() && inputs_.dim() >= 1, "TensorDataset: inputs must be a tensor of at least 1 dim, got ",
              inputs_.defined() ? shape_str(inputs_.shape()) : "undefined");
  LINEA_CHECK(inputs_.is_cpu() && (!targets_.defined() || targets_.is_cpu()),
              "TensorDataset: inputs and targets must be CPU tensors (batches are prepared on a CPU thread; move "
              "each batch to the device in the training loop)");
  n_ = inputs_.size(0);
  if (targets_.defined())
    LINEA_CHECK(targets_.dim() >= 1 && targets_.size(0) == n_, "TensorDataset: inputs ", shape_str(inputs_.shape()),
                " and targets ", shape_str(targets_.shape()), " have different numbers of rows");
  inputs_ = inputs_.detach();
  if (targets_.defined()) targets_ = targets_.detach();
}

Example TensorDataset::get(int64_t i) const {
  LINEA_CHECK(i >= 0 && i < n_, "TensorDataset::get: index ", i, " out of range for ", n_, " examples");
  Example e;
  e.set("input", select(inputs_, 0, i));
  if (targets_.defined()) e.set("target", select(targets_, 0, i));
  return e;
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  LINEA_CHECK(!indices.empty(), "TensorDataset::get_batch: empty list of indices");
  for (int64_t i : indices)
    LINEA_CHECK(i >= 0 && i < n_, "TensorDataset::get_batch: index ", i, " out of range for ", n_, " examples");
  Tensor idx = from_vector<int64_t>(indices, {static_cast<int64_t>(indices.size())});
  Batch b;
  b.set("input", index_select(inputs_, 0, idx));
  if (targets_.defined()) b.set("target", index_select(targets_, 0, idx));
  return b;
}

// ---- DataLoader -----------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {

std::shared_ptr<const BatchSampler> default_sampler(const std::shared_ptr<const Dataset>& ds,
                                                    const DataLoaderOptions& o) {
  LINEA_CHECK(ds != nullptr, "DataLoader: the dataset is null");
  LINEA_CHECK(o.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", o.batch_size);
  LINEA_CHECK(ds->size() >= 0, "DataLoader: the dataset reports a negative size ", ds->size());
  return std::make_shared<FixedSizeBatchSampler>(ds->size(), o.batch_size, o.shuffle, o.seed, o.drop_last);
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : DataLoader(dataset, default_sampler(dataset, options), options) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const BatchSampler> sampler,
                       DataLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), opts_(options) {
  LINEA_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  LINEA_CHECK(sampler_ != nullptr, "DataLoader: the batch sampler is null");
  LINEA_CHECK(opts_.prefetch_depth >= 1, "DataLoader: prefetch_depth must be >= 1, got ", opts_.prefetch_depth);
  LINEA_CHECK(sampler_->num_examples() == dataset_->size(), "DataLoader: the batch sampler is for ",
              sampler_->num_examples(), " examples, the dataset has ", dataset_->size());
}

DataLoader::~DataLoader() { stop_worker(); }

Batch DataLoader::make_batch(int64_t b) const {
  const std::vector<int64_t>& indices = batches_[static_cast<size_t>(b)];
  return indices.empty() ? Batch() : dataset_->get_batch(indices);  // empty: a rank's empty shard
}

void DataLoader::shard(int rank, int world) {
  stop_worker();
  std::shared_ptr<const BatchSampler> whole = sampler_;
  if (auto* sharded = dynamic_cast<const ShardedBatchSampler*>(whole.get())) whole = sharded->inner();  // re-shard
  sampler_ = std::make_shared<ShardedBatchSampler>(whole, rank, world);
  started_ = false;
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lk(mu_);
  ready_.clear();
  error_ = nullptr;
  stop_ = false;
  worker_done_ = true;
}

void DataLoader::worker_loop(int64_t first, int64_t last) {
  // One thread for this thread's OpenMP regions: with all cores they would form a second team
  // beside the training loop's, more threads than cores, for batches too small to gain from it.
  omp_set_num_threads(1);
  for (int64_t b = first; b < last; ++b) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) break;
    }
    Batch batch;
    try {
      batch = make_batch(b);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      error_ = std::current_exception();
      break;
    }
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || static_cast<int64_t>(ready_.size()) < opts_.prefetch_depth; });
    if (stop_) break;
    ready_.push_back(std::move(batch));
    lk.unlock();
    cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    worker_done_ = true;
  }
  cv_.notify_all();
}

void DataLoader::reset(int64_t epoch, int64_t first_batch) {
  LINEA_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got ", epoch);
  stop_worker();
  batches_ = sampler_->batches(epoch);
  const auto nb = static_cast<int64_t>(batches_.size());
  LINEA_CHECK(first_batch >= 0 && first_batch <= nb, "DataLoader::reset: first_batch ", first_batch, " is outside [0, ",
              nb, "]");
  epoch_ = epoch;
  started_ = true;
  next_batch_ = first_batch;
  if (opts_.prefetch && first_batch < nb) {
    worker_done_ = false;
    worker_ = std::thread([this, first_batch, nb] { worker_loop(first_batch, nb); });
  }
}

bool DataLoader::next(Batch& batch) {
  if (!started_) reset(0);
  const auto nb = static_cast<int64_t>(batches_.size());
  if (!opts_.prefetch) {
    if (next_batch_ >= nb) return false;
    int64_t b = next_batch_;
    next_batch_ = nb;  // an exception ends the epoch, as with prefetch
    batch = make_batch(b);
    next_batch_ = b + 1;
    return true;
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !ready_.empty() || error_ || worker_done_; });
  if (!ready_.empty()) {
    batch = std::move(ready_.front());
    ready_.pop_front();
    lk.unlock();
    cv_.notify_all();
    return true;
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    lk.unlock();
    std::rethrow_exception(e);
  }
  return false;
}

}  // namespace linea::nn
