// A small synthetic Fashion-MNIST-like dataset for the vit app's tests, written as the four gzip
// IDX files the app reads: each class is a bright bar at its own row (3 rows high, starting at
// row 2c + 3), on noise.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace vit::test {

inline void put_be32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// The 28x28 image of class `label`.
inline std::vector<uint8_t> bar_image(int label, std::mt19937& rng) {
  std::uniform_int_distribution<int> noise(0, 60);
  std::vector<uint8_t> img(28 * 28);
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x) {
      const bool bar = y >= 2 * label + 3 && y < 2 * label + 6 && x >= 4 && x < 24;
      img[y * 28 + x] = static_cast<uint8_t>(bar ? 200 + noise(rng) / 2 : noise(rng));
    }
  return img;
}

// Writes the four Fashion-MNIST files (train/test images and labels) into dir.
inline void write_fake_fashion_mnist(const std::string& dir, int n_train, int n_test, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  for (auto [prefix, n] : {std::pair<std::string, int>{"train", n_train}, {"t10k", n_test}}) {
    std::string images, labels;
    put_be32(images, 0x803);
    put_be32(images, n);
    put_be32(images, 28);
    put_be32(images, 28);
    put_be32(labels, 0x801);
    put_be32(labels, n);
    for (int i = 0; i < n; ++i) {
      const int label = static_cast<int>(rng() % 10);
      auto img = bar_image(label, rng);
      images.append(img.begin(), img.end());
      labels.push_back(static_cast<char>(label));
    }
    write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", images);
    write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", labels);
  }
}

}  // namespace vit::test
