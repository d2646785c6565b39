// The vit app's data: Fashion-MNIST (IDX gzip files of the Debian package dataset-fashion-mnist)
// or a user's image folder (train/ and test/ of class sub-folders), normalized with the training
// set's mean and standard deviation, and the training augmentation.
// Not here: batching and shuffling (nn::DataLoader), the model (model.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/readers.h"

namespace vit {

inline const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct ImageData {
  linea::Tensor train_images, train_labels;  // Float32 [N, C, H, W] in [0, 1], Int64 [N]
  linea::Tensor test_images, test_labels;
  std::vector<std::string> classes;
  std::string source;  // "fashion-mnist (<dir>)" or "image folder <dir>"
};

// Fashion-MNIST from dir (train-images-idx3-ubyte.gz, ... as the Debian package installs them;
// the uncompressed names work too). Throws naming the missing file and the package to install.
ImageData load_fashion_mnist(const std::string& dir);

// dir/train/<class>/*.png|jpg and dir/test/<class>/*: the class lists must match. Images are
// converted to `channels` (0: gray if the first training image is gray) and resized to
// image_size x image_size when image_size > 0; with image_size = 0 every image must have the
// first image's size and be square (else a clear error says to pass --image-size).
ImageData load_image_folder(const std::string& dir, int channels, int64_t image_size);

// Keeps the first `limit` examples of each split (limit <= 0: all), for quick runs and tests.
void limit_examples(ImageData& data, int64_t train_limit, int64_t test_limit);

// Per-channel mean and standard deviation of images [N, C, H, W].
void channel_stats(const linea::Tensor& images, std::vector<double>& mean, std::vector<double>& std);

// (images - mean) / std per channel, in place on a contiguous Float32 [N, C, H, W] tensor.
void normalize_(linea::Tensor& images, const std::vector<double>& mean, const std::vector<double>& std);

// Training examples with augmentation: a random crop of the image zero-padded by `pad` pixels
// (i.e. a shift by up to pad pixels in each direction; pad 0 = off) and a horizontal flip with
// probability 1/2 (flip = false: off). The choices are a pure function of (seed, epoch, index),
// so runs and resumed runs see the same augmented data; set_epoch before DataLoader::reset.
// Padding uses the value of a black pixel after normalization (`fill`).
class AugmentedImages : public linea::nn::Dataset {
 public:
  AugmentedImages(linea::Tensor images, linea::Tensor labels, int64_t pad, bool flip, uint64_t seed,
                  std::vector<float> fill);
  int64_t size() const override { return images_.size(0); }
  linea::nn::Example get(int64_t i) const override;
  linea::nn::Batch get_batch(const std::vector<int64_t>& indices) const override;
  void set_epoch(int64_t epoch) { epoch_.store(epoch); }

 private:
  void augment_into(int64_t index, float* dst) const;
  linea::Tensor images_, labels_;
  int64_t pad_;
  bool flip_;
  uint64_t seed_;
  std::vector<float> fill_;
  std::atomic<int64_t> epoch_{0};
};

}  // namespace vit
