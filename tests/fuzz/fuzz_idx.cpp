// Fuzz target: the IDX readers (nn/readers.h: read_idx_gz, read_idx_images, read_idx_labels).
// Input layout: byte 0 is a mode, the rest is the file.
//   mode bit 0   1: the rest is gzip-compressed by the target before it is written, so valid
//                gzip streams of fuzzed IDX content reach the parser; 0: written as is (plain
//                IDX, or corrupt/truncated gzip when it starts with the gzip magic)
//   mode bits 1-2  the reader: 0 read_idx_gz, 1 read_idx_images, 2 read_idx_labels, 3 all three
//   mode bits 3-4  read_idx_images' scale and add_channel flags
// A file that reads must give as many values as its dims say.
#include <algorithm>

#include "fuzz_util.h"
#include "nn/readers.h"

using namespace linea;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const fuzz::fs::path path = fuzz::scratch_dir() / "input.idx";
  if (mode & 1)
    fuzz::write_file(path, fuzz::gzip(data + 1, size - 1));
  else
    fuzz::write_file(path, data + 1, size - 1);

  const int reader = (mode >> 1) & 3;
  const bool scale = mode & 8, add_channel = mode & 16;
  if (reader == 0 || reader == 3) {
    fuzz::expect_ok_or_error([&] {
      nn::IdxArray a = nn::read_idx_gz(path);
      // Dims may be huge when another is 0; the product must then be 0 without overflowing.
      uint64_t numel = std::find(a.dims.begin(), a.dims.end(), 0) != a.dims.end() ? 0 : 1;
      for (int64_t d : a.dims)
        if (numel != 0) LINEA_FUZZ_ASSERT(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel), "overflow");
      LINEA_FUZZ_ASSERT(numel == a.data.size(), "read_idx_gz: dims ", shape_str(a.dims), " but ", a.data.size(),
                        " values");
    });
  }
  if (reader == 1 || reader == 3) {
    fuzz::expect_ok_or_error([&] {
      Tensor t = nn::read_idx_images(path, scale, add_channel);
      LINEA_FUZZ_ASSERT(t.dim() == (add_channel ? 4 : 3), "read_idx_images: shape ", shape_str(t.shape()));
    });
  }
  if (reader == 2 || reader == 3) {
    fuzz::expect_ok_or_error([&] {
      Tensor t = nn::read_idx_labels(path);
      LINEA_FUZZ_ASSERT(t.dim() == 1, "read_idx_labels: shape ", shape_str(t.shape()));
    });
  }
  return 0;
}
