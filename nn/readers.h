// The readers for the file formats the apps use: IDX (MNIST-style, gzip or plain), FASTA /
// FASTA.gz, and image folders (class sub-folders of PNG/JPEG) or single images. Files are read
// whole and parsed with every size checked against the bytes actually present; errors name the
// file.
// Not here: datasets, batching and loading (nn/data.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/data.h"

namespace linea::nn {

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

// Images with more pixels than this (64 megapixels, e.g. 8192 x 8192) are refused before they
// are decoded: a few bytes of a corrupt or hostile header can declare a size whose buffers would
// take gigabytes. Applies to the size a file declares and to a requested resize. Only PNG and
// JPEG are read (by their first bytes, whatever the file's extension): the other formats
// stb_image decodes (GIF, BMP, PSD, ...) are refused.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;

// One PNG/JPEG image as Float32 [channels, height, width] in [0, 1], converted to `channels`
// (1 or 3) and resized (bilinear, half-pixel centers) when its size differs; height = width = 0
// keeps its own size. Throws naming the file when it cannot be decoded.
Tensor read_image(const std::string& path, int channels, int64_t height = 0, int64_t width = 0);

}  // namespace linea::nn
