#include "data.h"

#include <cmath>
#include <filesystem>

#include "linea.h"

namespace fs = std::filesystem;
using namespace linea;

namespace vit {

namespace {

// dir/<name>.gz, or dir/<name> uncompressed.
std::string idx_file(const std::string& dir, const std::string& name) {
  for (const std::string& f : {dir + "/" + name + ".gz", dir + "/" + name}) {
    if (fs::is_regular_file(f)) return f;
    LINEA_CHECK(!fs::exists(f), "vit: Fashion-MNIST file '", f, "' is not a regular file (a folder?)");
  }
  LINEA_FAIL("vit: Fashion-MNIST file '", dir, "/", name,
             ".gz' not found; install it with `apt-get install dataset-fashion-mnist` (files under ",
             kFashionMnistDir, ") or pass --data DIR with the four IDX files");
}

Tensor first_rows(const Tensor& t, int64_t n) { return n > 0 && n < t.size(0) ? narrow(t, 0, 0, n).contiguous() : t; }

}  // namespace

ImageData load_fashion_mnist(const std::string& dir) {
  LINEA_CHECK(!fs::exists(dir) || fs::is_directory(dir), "vit: --data '", dir,
              "' is a file, not the folder of the four Fashion-MNIST IDX files");
  LINEA_CHECK(fs::is_directory(dir), "vit: data directory '", dir,
              "' does not exist; install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (files under ",
              kFashionMnistDir, ") or pass --data DIR");
  ImageData d;
  d.train_images = nn::read_idx_images(idx_file(dir, "train-images-idx3-ubyte"));
  d.train_labels = nn::read_idx_labels(idx_file(dir, "train-labels-idx1-ubyte"));
  d.test_images = nn::read_idx_images(idx_file(dir, "t10k-images-idx3-ubyte"));
  d.test_labels = nn::read_idx_labels(idx_file(dir, "t10k-labels-idx1-ubyte"));
  LINEA_CHECK(d.train_images.size(0) == d.train_labels.size(0) && d.test_images.size(0) == d.test_labels.size(0),
              "vit: '", dir, "': image and label files hold different numbers of examples (train ",
              d.train_images.size(0), " vs ", d.train_labels.size(0), ", test ", d.test_images.size(0), " vs ",
              d.test_labels.size(0), ")");
  LINEA_CHECK(d.train_images.size(2) == d.train_images.size(3) &&
                  d.test_images.shape() == Shape({d.test_images.size(0), 1, d.train_images.size(2), d.train_images.size(3)}),
              "vit: '", dir, "': expected square images of one size, got train ", shape_str(d.train_images.shape()),
              " and test ", shape_str(d.test_images.shape()));
  LINEA_CHECK(d.train_images.size(0) > 0 && d.test_images.size(0) > 0, "vit: '", dir,
              "': the IDX files hold no images (train ", d.train_images.size(0), ", test ", d.test_images.size(0), ")");
  d.classes = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  const int64_t max_label = std::max(max(d.train_labels).item<int64_t>(), max(d.test_labels).item<int64_t>());
  const int64_t min_label = std::min(min(d.train_labels).item<int64_t>(), min(d.test_labels).item<int64_t>());
  LINEA_CHECK(min_label >= 0 && max_label < 10, "vit: '", dir, "': labels must lie in 0..9, found ", min_label,
              "..", max_label);
  d.source = "fashion-mnist (" + dir + ")";
  return d;
}

ImageData load_image_folder(const std::string& dir, int channels, int64_t image_size) {
  for (const char* split : {"train", "test"}) {
    LINEA_CHECK(!fs::exists(dir + "/" + split) || fs::is_directory(dir + "/" + split), "vit: --image-folder '", dir,
                "': '", split, "' is a file, not a folder of class sub-folders");
    LINEA_CHECK(fs::is_directory(dir + "/" + split), "vit: --image-folder '", dir, "' has no '", split,
                "' sub-folder (expected ", dir, "/train/<class>/*.png and ", dir, "/test/<class>/*.png)");
  }
  nn::ImageFolderOptions o;
  o.channels = channels;
  o.height = o.width = image_size;
  nn::ImageFolder train;
  try {
    train = nn::read_image_folder(dir + "/train", o);
  } catch (const Error& e) {
    // The reader's hint names its C++ options; say which flag does that here.
    const std::string what = e.what();
    if (what.find("share one size") == std::string::npos) throw;
    LINEA_FAIL("vit: ", what.substr(0, what.find("; images must")),
               "; images must share one size: pass --image-size N to resize them all to NxN");
  }
  o.channels = static_cast<int>(train.images.size(1));
  o.height = train.images.size(2);
  o.width = train.images.size(3);
  LINEA_CHECK(o.height == o.width, "vit: --image-folder images are ", o.height, "x", o.width,
              " (HxW); the ViT needs square images: pass --image-size N to resize them");
  nn::ImageFolder test = nn::read_image_folder(dir + "/test", o);
  LINEA_CHECK(train.classes == test.classes, "vit: --image-folder '", dir,
              "': train/ and test/ must hold the same class folders (", train.classes.size(), " vs ",
              test.classes.size(), ")");
  ImageData d;
  d.train_images = train.images;
  d.train_labels = train.labels;
  d.test_images = test.images;
  d.test_labels = test.labels;
  d.classes = train.classes;
  d.source = "image folder " + dir;
  return d;
}

void limit_examples(ImageData& d, int64_t train_limit, int64_t test_limit) {
  d.train_images = first_rows(d.train_images, train_limit);
  d.train_labels = first_rows(d.train_labels, train_limit);
  d.test_images = first_rows(d.test_images, test_limit);
  d.test_labels = first_rows(d.test_labels, test_limit);
}

void channel_stats(const Tensor& images, std::vector<double>& mean_out, std::vector<double>& std_out) {
  const int64_t C = images.size(1);
  Tensor x = images.to(DType::Float64);
  Tensor m = mean(x, {0, 2, 3});
  Tensor s = sqrt(mean(square(x - m.reshape({1, C, 1, 1})), {0, 2, 3}));
  mean_out = m.to_vector<double>();
  std_out = s.to_vector<double>();
  for (double& v : std_out) v = std::max(v, 1e-6);  // a constant channel must not divide by 0
}

void normalize_(Tensor& images, const std::vector<double>& m, const std::vector<double>& s) {
  LINEA_CHECK(images.dtype() == DType::Float32 && images.is_contiguous() && images.dim() == 4 &&
                  images.size(1) == static_cast<int64_t>(m.size()),
              "vit: normalize_ expects contiguous Float32 [N, ", m.size(), ", H, W], got ", shape_str(images.shape()));
  const int64_t N = images.size(0), C = images.size(1), HW = images.size(2) * images.size(3);
  float* p = images.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const float mu = static_cast<float>(m[c]), inv = static_cast<float>(1.0 / s[c]);
      float* q = p + (n * C + c) * HW;
      for (int64_t i = 0; i < HW; ++i) q[i] = (q[i] - mu) * inv;
    }
}

AugmentedImages::AugmentedImages(Tensor images, Tensor labels, int64_t pad, bool flip, uint64_t seed,
                                 std::vector<float> fill)
    : images_(images.contiguous()), labels_(std::move(labels)), pad_(pad), flip_(flip), seed_(seed),
      fill_(std::move(fill)) {
  LINEA_CHECK(images_.dtype() == DType::Float32 && images_.dim() == 4 &&
                  static_cast<int64_t>(fill_.size()) == images_.size(1),
              "vit: AugmentedImages expects Float32 [N, C, H, W] and one fill value per channel, got ",
              shape_str(images_.shape()));
  LINEA_CHECK(pad_ >= 0 && pad_ < images_.size(2), "vit: --crop-padding ", pad_, " must lie in [0, ",
              images_.size(2), ")");
}

void AugmentedImages::augment_into(int64_t index, float* dst) const {
  const int64_t C = images_.size(1), H = images_.size(2), W = images_.size(3);
  const float* src = images_.data<float>() + index * C * H * W;
  const uint64_t r = nn::splitmix64(nn::splitmix64(nn::splitmix64(seed_) ^ static_cast<uint64_t>(epoch_.load())) ^
                                     static_cast<uint64_t>(index));
  // Crop offset (dy, dx) in [-pad, pad]: output pixel (y, x) is input pixel (y + dy, x + dx).
  const int64_t span = 2 * pad_ + 1;
  const int64_t dy = static_cast<int64_t>(r % span) - pad_;
  const int64_t dx = static_cast<int64_t>((r >> 16) % span) - pad_;
  const bool flip = flip_ && ((r >> 40) & 1);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sy = y + dy, sx0 = (flip ? W - 1 - x : x) + dx;
        dst[(c * H + y) * W + x] =
            (sy >= 0 && sy < H && sx0 >= 0 && sx0 < W) ? src[(c * H + sy) * W + sx0] : fill_[c];
      }
}

nn::Example AugmentedImages::get(int64_t i) const {
  LINEA_CHECK(i >= 0 && i < size(), "vit: example ", i, " out of range for ", size(), " images");
  Tensor out = empty({images_.size(1), images_.size(2), images_.size(3)});
  augment_into(i, out.data<float>());
  return {{"input", out}, {"target", select(labels_, 0, i)}};
}

nn::Batch AugmentedImages::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t B = static_cast<int64_t>(indices.size());
  const int64_t per = images_.size(1) * images_.size(2) * images_.size(3);
  Tensor out = empty({B, images_.size(1), images_.size(2), images_.size(3)});
  for (int64_t b = 0; b < B; ++b) {
    LINEA_CHECK(indices[b] >= 0 && indices[b] < size(), "vit: example ", indices[b], " out of range for ", size(),
                " images");
    augment_into(indices[b], out.data<float>() + b * per);
  }
  std::vector<int64_t> idx(indices.begin(), indices.end());
  return {{"input", out}, {"target", index_select(labels_, 0, from_vector<int64_t>(idx, {B}))}};
}

}  // namespace vit
