// Fuzz target: the image readers (nn/readers.h read_image and read_image_folder), i.e. Linea's
// size checks and resizing around stb_image's PNG/JPEG decoding.
// Input layout: 3 bytes of options, then the image file.
//   byte 0  bit 0: channels 1 or 3; bits 1-2: 0 read_image at the file's size, 1 read_image
//           resized, 2 read_image_folder (one class, one image), 3 both readers;
//           bits 3-4: the folder's channels (0 auto, 1, 3); bit 5: folder resized;
//           bit 6: nearest instead of bilinear for the folder
//   byte 1, byte 2: resize height and width, 1..16
// Files that declare more than kMaxImagePixels must be refused with linea::Error. Files that
// declare a legal but large size (over 2^18 pixels) are skipped: decoding them is correct but too
// slow for a fuzzing iteration. stb_image itself is compiled into this target with the
// sanitizers (stb_image_instrumented.cpp), so its decoders are fuzzed too.
#include <algorithm>
#include <cstring>

#include "fuzz_util.h"
#include "nn/readers.h"

using namespace linea;

namespace {

// The size a PNG's IHDR or a JPEG's first frame header declares (0 when there is none), read
// here rather than by stb_image: its JPEG header parser is one of the things fuzzed.
int64_t declared_pixels(const uint8_t* p, size_t n) {
  const auto be = [&](size_t i, int bytes) {  // at most 2^31, so that a product fits
    int64_t v = 0;
    for (int k = 0; k < bytes; ++k) v = v << 8 | (i + k < n ? p[i + k] : 0);
    return std::min<int64_t>(v, int64_t{1} << 31);
  };
  if (n >= 24 && std::memcmp(p, "\x89PNG", 4) == 0) return be(16, 4) * be(20, 4);
  for (size_t i = 0; i + 9 <= n; ++i)
    if (p[i] == 0xFF && p[i + 1] >= 0xC0 && p[i + 1] <= 0xCF && p[i + 1] != 0xC4 && p[i + 1] != 0xC8 &&
        p[i + 1] != 0xCC)
      return be(i + 5, 2) * be(i + 7, 2);
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  if (size < 3) return 0;
  const uint8_t mode = data[0];
  const int64_t height = 1 + data[1] % 16, width = 1 + data[2] % 16;
  const uint8_t* image = data + 3;
  const size_t image_size = size - 3;
  const int64_t pixels = declared_pixels(image, image_size);
  if (pixels > (int64_t{1} << 18) && pixels <= nn::kMaxImagePixels) return 0;

  const int channels = mode & 1 ? 3 : 1;
  const int which = (mode >> 1) & 3;
  if (which != 2) {
    const fuzz::fs::path path = fuzz::scratch_dir() / "input.img";
    fuzz::write_file(path, image, image_size);
    const bool resize = which == 1;
    fuzz::expect_ok_or_error([&] {
      Tensor t = nn::read_image(path, channels, resize ? height : 0, resize ? width : 0);
      LINEA_FUZZ_ASSERT(t.dim() == 3 && t.size(0) == channels, "read_image: shape ", shape_str(t.shape()));
      LINEA_FUZZ_ASSERT(!resize || (t.size(1) == height && t.size(2) == width), "read_image: shape ",
                        shape_str(t.shape()), " after a resize to ", height, "x", width);
    });
  }
  if (which >= 2) {
    const fuzz::fs::path dir = fuzz::fresh_dir("folder");
    fuzz::fs::create_directory(dir / "class");
    fuzz::write_file(dir / "class" / "a.png", image, image_size);
    nn::ImageFolderOptions o;
    const int c = (mode >> 3) & 3;
    o.channels = c == 0 ? 0 : c == 1 ? 1 : 3;
    if (mode & 32) {
      o.height = height;
      o.width = width;
    }
    o.bilinear = !(mode & 64);
    fuzz::expect_ok_or_error([&] {
      nn::ImageFolder f = nn::read_image_folder(dir.string(), o);
      LINEA_FUZZ_ASSERT(f.images.dim() == 4 && f.images.size(0) == 1 && f.labels.numel() == 1,
                        "read_image_folder: images ", shape_str(f.images.shape()));
    });
  }
  return 0;
}
