// The IDX, FASTA and image-folder readers on files generated here (gzip written with zlib,
// PNG/JPEG with stb_image_write) including their error messages.
// Not here: the DataLoader and samplers (test_data.cpp), safetensors/checkpoints (test_safetensors.cpp,
// test_checkpoint.cpp).
#include <stb/stb_image_write.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include "nn/readers.h"
#include "test_util.h"

using namespace linea;
using namespace linea::nn;
namespace fs = std::filesystem;
using linea::test::read_all;
using linea::test::TempDir;
using linea::test::write_all;

namespace {

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void put_be32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// An IDX file: magic, big-endian dims, bytes.
std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s;
  put_be32(s, magic);
  for (uint32_t d : dims) put_be32(s, d);
  s.append(data.begin(), data.end());
  return s;
}

}  // namespace

// ---- IDX --------------------------------------------------------------------------------------

TEST(IdxReader, ReadsGzipImagesAndLabels) {
  TempDir dir;
  std::vector<uint8_t> pix(3 * 2 * 3);
  for (size_t i = 0; i < pix.size(); ++i) pix[i] = static_cast<uint8_t>(i * 15);
  write_gz(dir.file("images.gz"), idx_bytes(0x00000803, {3, 2, 3}, pix));
  write_gz(dir.file("labels.gz"), idx_bytes(0x00000801, {3}, {7, 0, 9}));

  Tensor x = read_idx_images(dir.file("images.gz"));
  EXPECT_EQ(x.shape(), (Shape{3, 1, 2, 3}));
  EXPECT_EQ(x.dtype(), DType::Float32);
  std::vector<float> v = x.to_vector<float>();
  for (size_t i = 0; i < pix.size(); ++i) EXPECT_EQ(v[i], static_cast<float>(pix[i]) * (1.0f / 255.0f)) << i;
  EXPECT_EQ(v.back(), 1.0f);  // 255 -> 1
  Tensor raw255 = read_idx_images(dir.file("images.gz"), /*scale=*/false, /*add_channel=*/false);
  EXPECT_EQ(raw255.shape(), (Shape{3, 2, 3}));
  EXPECT_EQ(raw255.to_vector<float>()[5], 75.0f);

  Tensor y = read_idx_labels(dir.file("labels.gz"));
  EXPECT_EQ(y.dtype(), DType::Int64);
  EXPECT_EQ(y.to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));

  IdxArray a = read_idx_gz(dir.file("images.gz"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(a.data, pix);

  // Plain (uncompressed) files read the same.
  write_all(dir.file("labels"), idx_bytes(0x00000801, {3}, {7, 0, 9}));
  EXPECT_EQ(read_idx_labels(dir.file("labels")).to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));

  auto ds = load_idx_dataset(dir.file("images.gz"), dir.file("labels.gz"));
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->get(2).at("target").item<int64_t>(), 9);
}

TEST(IdxReader, RejectsBadFiles) {
  TempDir dir;
  std::string p = dir.file("f.gz");
  EXPECT_LINEA_ERROR(read_idx_images(dir.file("missing.gz")),
                     "read_idx_images: cannot open '" + dir.file("missing.gz") + "': No such file or directory");
  write_gz(p, idx_bytes(0x00000801, {3}, {1, 2, 3}));
  EXPECT_LINEA_ERROR(read_idx_images(p), "read_idx_images: '" + p +
                                             "': bad magic number 0x00000801 (expected 0x00000803, an IDX image file)");
  write_gz(p, idx_bytes(0x00000803, {3, 2, 3}, std::vector<uint8_t>(17)));
  EXPECT_LINEA_ERROR(read_idx_images(p),
                     "': truncated: dims [3, 2, 3] need more bytes of data than the 17 the file has");
  write_gz(p, idx_bytes(0x00000801, {3}, std::vector<uint8_t>(5)));
  EXPECT_LINEA_ERROR(read_idx_labels(p), "': 2 unexpected bytes after the [3] data");
  write_gz(p, std::string("\x00\x00\x08", 3));
  EXPECT_LINEA_ERROR(read_idx_labels(p), "': file is 3 bytes, too short for an IDX header (truncated?)");
  write_gz(p, idx_bytes(0x00000803, {3, 2, 3}, {}).substr(0, 10));
  EXPECT_LINEA_ERROR(read_idx_images(p), "file is 10 bytes, too short for the 3-dimension IDX header (truncated?)");
  write_gz(p, idx_bytes(0x00000D01, {1}, {0, 0, 0, 0}));
  EXPECT_LINEA_ERROR(read_idx_gz(p), "IDX element type 0x0D is not supported (only unsigned bytes, 0x08)");
  write_gz(p, idx_bytes(0x01000801, {1}, {0}));
  EXPECT_LINEA_ERROR(read_idx_gz(p), "bad magic number 0x01000801 (not an IDX file: the first two bytes must be zero)");
  // A gzip stream cut short (e.g. an interrupted download).
  std::vector<uint8_t> big(20000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 7919) % 251);
  write_gz(p, idx_bytes(0x00000803, {20, 25, 40}, big));
  std::string gz = read_all(p);
  write_all(p, gz.substr(0, gz.size() / 2));
  EXPECT_LINEA_ERROR(read_idx_images(p), "read_idx_images: '" + p + "': truncated gzip data");
  // Corrupted compressed bytes.
  std::string bad = gz;
  for (size_t i = 20; i < 60; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  write_all(p, bad);
  EXPECT_LINEA_ERROR(read_idx_images(p), "read_idx_images: '" + p + "': ");
  // Images and labels of different counts.
  write_gz(dir.file("i.gz"), idx_bytes(0x00000803, {2, 1, 1}, {1, 2}));
  write_gz(dir.file("l.gz"), idx_bytes(0x00000801, {3}, {1, 2, 3}));
  EXPECT_LINEA_ERROR(
      load_idx_dataset(dir.file("i.gz"), dir.file("l.gz")),
      "load_idx_dataset: '" + dir.file("i.gz") + "' has 2 images but '" + dir.file("l.gz") + "' has 3 labels");
  EXPECT_LINEA_ERROR(read_idx_gz(dir.path.string()), "is a directory, not a file");
  // No data is needed when a dim is 0, but huge others would overflow a tensor's strides
  // (found by tests/fuzz: fuzz_idx).
  write_gz(p, idx_bytes(0x00000803, {0, 0xffffffffu, 0xffffffffu}, {}));
  EXPECT_LINEA_ERROR(read_idx_images(p),
                     "read_idx_images: '" + p + "': dims [0, 4294967295, 4294967295] are too large for a tensor");
  write_gz(p, idx_bytes(0x00000803, {0, 5, 7}, {}));
  EXPECT_EQ(read_idx_images(p).shape(), Shape({0, 1, 5, 7}));
}

// ---- FASTA ------------------------------------------------------------------------------------

TEST(Fasta, ReadsPlainAndGzipWithMultiLineSequences) {
  const std::string text =
      ";an old-style comment\n"
      ">sp|P1|ONE first protein  OS=Test\n"
      "MKTAYIAK\n"
      "QRQISFVK\n"
      "\n"
      "SHF\n"
      ">P2\r\n"
      "ACDEFGHIKLMNPQRSTVWY*\r\n"
      "\r\n"
      ">P3 empty sequence\n"
      ">P4 last\n"
      "mk-ta.x\n"
      "  \n";
  TempDir dir;
  write_all(dir.file("a.fasta"), text);
  write_gz(dir.file("a.fasta.gz"), text);
  for (const std::string& path : {dir.file("a.fasta"), dir.file("a.fasta.gz")}) {
    SCOPED_TRACE(path);
    std::vector<FastaRecord> r = read_fasta(path);
    ASSERT_EQ(r.size(), 4u);
    EXPECT_EQ(r[0].id, "sp|P1|ONE");
    EXPECT_EQ(r[0].description, "first protein  OS=Test");
    EXPECT_EQ(r[0].sequence, "MKTAYIAKQRQISFVKSHF");
    EXPECT_EQ(r[1].id, "P2");
    EXPECT_EQ(r[1].description, "");
    EXPECT_EQ(r[1].sequence, "ACDEFGHIKLMNPQRSTVWY*");
    EXPECT_EQ(r[2].id, "P3");
    EXPECT_EQ(r[2].sequence, "");
    EXPECT_EQ(r[3].description, "last");
    EXPECT_EQ(r[3].sequence, "mk-ta.x");
  }
  // No trailing newline.
  write_all(dir.file("b.fa"), ">x\nAC\nGT");
  EXPECT_EQ(read_fasta(dir.file("b.fa"))[0].sequence, "ACGT");
  // Tabs separate like spaces: in the header and inside sequence lines.
  write_all(dir.file("c.fa"), ">x\tdesc here\nAC\tGT \tW\n");
  const std::vector<FastaRecord> c = read_fasta(dir.file("c.fa"));
  EXPECT_EQ(c[0].id, "x");
  EXPECT_EQ(c[0].description, "desc here");
  EXPECT_EQ(c[0].sequence, "ACGTW");
}

TEST(Fasta, RejectsBadFiles) {
  TempDir dir;
  std::string p = dir.file("x.fa");
  EXPECT_LINEA_ERROR(read_fasta(dir.file("nope.fa")), "read_fasta: cannot open '" + dir.file("nope.fa") + "'");
  write_all(p, "");
  EXPECT_LINEA_ERROR(read_fasta(p),
                     "read_fasta: '" + p + "' contains no FASTA records (expected lines starting with '>')");
  write_all(p, "\n\nMKV\n>a\nMK\n");
  EXPECT_LINEA_ERROR(read_fasta(p), "read_fasta: '" + p + "' line 3: sequence data before the first '>' header");
  write_all(p, ">a\nMK1V\n");
  EXPECT_LINEA_ERROR(read_fasta(p), "line 2: unexpected character '1' in the sequence of record 'a'");
  write_all(p, ">a\nMK\x01V\n");
  EXPECT_LINEA_ERROR(read_fasta(p), "line 2: unexpected character 0x01 in the sequence of record 'a'");
  write_all(p, ">  \nMK\n");
  EXPECT_LINEA_ERROR(read_fasta(p), "line 1: empty header");
  // A path that stat accepts and open refuses: a socket (ENXIO).
  const std::string sock = dir.file("s.sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_LINEA_ERROR(read_fasta(sock), "read_fasta: cannot open '" + sock + "': " + std::strerror(ENXIO));
  ::close(fd);
  std::string seqs;
  for (int i = 0; i < 500; ++i)
    seqs +=
        ">s" + std::to_string(i) + "\nMKTAYIAKQRQISFVKSHFSRQ" + std::string(1, static_cast<char>('A' + i % 7)) + "\n";
  write_gz(p, seqs);
  std::string gz = read_all(p);
  write_all(p, gz.substr(0, gz.size() - 20));
  EXPECT_LINEA_ERROR(read_fasta(p), "truncated gzip data");
}

// ---- image folders ----------------------------------------------------------------------------

namespace {

void write_png(const std::string& path, int w, int h, int comp, const std::vector<uint8_t>& px) {
  ASSERT_EQ(px.size(), static_cast<size_t>(w * h * comp));
  ASSERT_NE(stbi_write_png(path.c_str(), w, h, comp, px.data(), w * comp), 0) << path;
}

}  // namespace

TEST(ImageFolderReader, ReadsClassFoldersOfPngs) {
  TempDir dir;
  fs::create_directories(dir.path / "zebra");
  fs::create_directories(dir.path / "ant");
  fs::create_directories(dir.path / ".hidden");
  // 3x2 (w x h) grayscale images with known pixels.
  std::vector<uint8_t> a0 = {0, 10, 20, 30, 40, 255}, a1 = {1, 2, 3, 4, 5, 6}, z0 = {9, 9, 9, 9, 9, 9};
  write_png(dir.file("ant/b.png"), 3, 2, 1, a1);
  write_png(dir.file("ant/a.png"), 3, 2, 1, a0);
  write_png(dir.file("zebra/only.PNG"), 3, 2, 1, z0);
  write_all(dir.file("ant/notes.txt"), "ignored");
  write_png(dir.file(".hidden/x.png"), 5, 5, 1, std::vector<uint8_t>(25));

  ImageFolder f = read_image_folder(dir.path.string());
  EXPECT_EQ(f.classes, (std::vector<std::string>{"ant", "zebra"}));
  EXPECT_EQ(f.images.shape(), (Shape{3, 1, 2, 3}));
  EXPECT_EQ(f.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(f.files[0], dir.file("ant/a.png"));
  std::vector<float> v = f.images.to_vector<float>();
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(v[i], static_cast<float>(a0[i] / 255.0));
    EXPECT_EQ(v[6 + i], static_cast<float>(a1[i] / 255.0));
  }

  // Gray forced to RGB: three equal planes.
  ImageFolderOptions rgb;
  rgb.channels = 3;
  ImageFolder g = read_image_folder(dir.path.string(), rgb);
  EXPECT_EQ(g.images.shape(), (Shape{3, 3, 2, 3}));
  std::vector<float> gv = g.images.to_vector<float>();
  for (size_t c = 0; c < 3; ++c)
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(gv[c * 6 + i], v[i]);
}

TEST(ImageFolderReader, RgbChannelsJpegAndResizing) {
  TempDir dir;
  fs::create_directories(dir.path / "c");
  // A 2x1 RGB image: red, blue. Auto channels -> 3, CHW layout.
  write_png(dir.file("c/rgb.png"), 2, 1, 3, {255, 0, 0, 0, 0, 255});
  ImageFolder f = read_image_folder(dir.path.string());
  EXPECT_EQ(f.images.shape(), (Shape{1, 3, 1, 2}));
  EXPECT_EQ(f.images.to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 0, 1}));

  // Resize 1x2 gray [0, 255] to 1x4: bilinear with half-pixel centers, and nearest.
  TempDir d2;
  fs::create_directories(d2.path / "k");
  write_png(d2.file("k/g.png"), 2, 1, 1, {0, 255});
  write_png(d2.file("k/h.png"), 3, 3, 1, std::vector<uint8_t>(9, 51));  // another size: resized too
  ImageFolderOptions o;
  o.height = 1;
  o.width = 4;
  ImageFolder r = read_image_folder(d2.path.string(), o);
  EXPECT_EQ(r.images.shape(), (Shape{2, 1, 1, 4}));
  EXPECT_TRUE(
      test::all_close(r.images.narrow(0, 0, 1).reshape({4}), tensor<float>({0.f, 0.25f, 0.75f, 1.f}, {4}), 1e-6, 0));
  EXPECT_TRUE(test::all_close(r.images.narrow(0, 1, 1).reshape({4}), full({4}, 0.2), 1e-6, 0));
  o.bilinear = false;
  ImageFolder n = read_image_folder(d2.path.string(), o);
  EXPECT_EQ(n.images.narrow(0, 0, 1).reshape({4}).to_vector<float>(), (std::vector<float>{0, 0, 1, 1}));

  // JPEG (lossy: a flat color comes back close).
  TempDir d3;
  fs::create_directories(d3.path / "j");
  std::vector<uint8_t> flat(8 * 8 * 3);
  for (size_t i = 0; i < flat.size(); i += 3) flat[i] = 200, flat[i + 1] = 100, flat[i + 2] = 50;
  ASSERT_NE(stbi_write_jpg(d3.file("j/a.jpg").c_str(), 8, 8, 3, flat.data(), 95), 0);
  ImageFolder j = read_image_folder(d3.path.string());
  EXPECT_EQ(j.images.shape(), (Shape{1, 3, 8, 8}));
  EXPECT_TRUE(test::all_close(j.images.mean({2, 3}).reshape({3}),
                              tensor<float>({200 / 255.f, 100 / 255.f, 50 / 255.f}, {3}), 0.03, 0));
}

// Sizes from a file are checked before stb_image allocates for them (found by tests/fuzz:
// fuzz_image, where a 60-byte PNG made stb_image ask for 2 GB).
TEST(ImageReader, RefusesHugeDeclaredSizes) {
  TempDir dir;
  const std::string p = dir.file("a.png");
  std::vector<uint8_t> px(4 * 3);
  write_png(p, 4, 3, 1, px);
  EXPECT_EQ(read_image(p, 1).shape(), Shape({1, 3, 4}));
  std::string png = read_all(p);
  // The IHDR chunk (bytes 8..32): width and height at bytes 16 and 20, its CRC (which stb_image
  // does not check) at 29.
  std::string huge = png;
  huge.replace(16, 8, std::string("\x00\x00\x40\x00\x00\x00\x20\x00", 8));  // 16384 wide, 8192 high
  write_all(p, huge);
  EXPECT_LINEA_ERROR(read_image(p, 3), "read_image: '" + p +
                                           "' declares a 8192x16384 (HxW) image, more than the "
                                           "limit of 67108864 pixels");
  // The same in a JPEG's frame header (height, then width, after FF C0 and 3 bytes).
  const std::string j = dir.file("a.jpg");
  ASSERT_NE(stbi_write_jpg(j.c_str(), 4, 3, 1, px.data(), 90), 0);
  std::string jpeg = read_all(j);
  const size_t sof = jpeg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  jpeg.replace(sof + 5, 4, std::string("\x4e\x20\x4e\x20", 4));  // 20000 x 20000
  write_all(j, jpeg);
  EXPECT_LINEA_ERROR(read_image(j, 1), "read_image: '" + j + "' declares a 20000x20000 (HxW) image");
  // A Huffman table with more than 256 codes, which Debian's stb_image 2.27 writes past.
  ASSERT_NE(stbi_write_jpg(j.c_str(), 4, 3, 1, px.data(), 90), 0);
  jpeg = read_all(j);
  const size_t dht = jpeg.find("\xff\xc4");
  ASSERT_NE(dht, std::string::npos);
  jpeg[dht + 5] = '\xff';  // the first of the table's 16 code counts (after FF C4, length, class/id)
  write_all(j, jpeg);
  EXPECT_LINEA_ERROR(read_image(j, 1), "read_image: cannot decode '" + j + "': JPEG Huffman table at byte ");
  // A scan that uses a Huffman table no DHT defined, which stb_image 2.27 reads far outside of.
  ASSERT_NE(stbi_write_jpg(j.c_str(), 4, 3, 1, px.data(), 90), 0);
  jpeg = read_all(j);
  const size_t sos = jpeg.find("\xff\xda");
  ASSERT_NE(sos, std::string::npos);
  jpeg[sos + 6] = '\x22';  // the first component's tables: DC 2, AC 2
  write_all(j, jpeg);
  EXPECT_LINEA_ERROR(read_image(j, 1), "read_image: cannot decode '" + j + "': the JPEG scan at byte " +
                                           std::to_string(sos) + " uses a Huffman table that no DHT segment");
  // A segment longer than what is left of the file: cut inside the first Huffman table.
  ASSERT_NE(stbi_write_jpg(j.c_str(), 4, 3, 1, px.data(), 90), 0);
  jpeg = read_all(j);
  const size_t cut = jpeg.find("\xff\xc4");
  ASSERT_NE(cut, std::string::npos);
  const size_t seg_len =
      static_cast<size_t>(static_cast<uint8_t>(jpeg[cut + 2])) << 8 | static_cast<uint8_t>(jpeg[cut + 3]);
  write_all(j, jpeg.substr(0, cut + 10));
  EXPECT_LINEA_ERROR(read_image(j, 1), "read_image: cannot decode '" + j + "': JPEG segment FF C4 at byte " +
                                           std::to_string(cut) + " needs " + std::to_string(seg_len) +
                                           " bytes but the file has 8 left (truncated or corrupt)");
  // Headers that stb_image reads, pixel data it cannot: an IDAT chunk whose zlib header is bad.
  std::string bad_data = png;
  const size_t idat = bad_data.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  bad_data[idat + 4] = '\x00';
  write_all(p, bad_data);
  EXPECT_LINEA_ERROR(read_image(p, 1), "read_image: cannot decode '" + p + "': bad zlib header");
  // A chunk that claims more bytes than the file has.
  std::string chunk = png;
  chunk.replace(33, 4, std::string("\x7f\xff\xff\xf0", 4));  // the length of the chunk after IHDR
  write_all(p, chunk);
  EXPECT_LINEA_ERROR(read_image(p, 1), "read_image: cannot decode '" + p + "': PNG chunk '");
  EXPECT_LINEA_ERROR(read_image(p, 1), "' at byte 33 needs 2147483644 bytes but the file has");
  // A requested size past the limit, a channel count read_image does not convert to.
  write_all(p, png);
  EXPECT_LINEA_ERROR(read_image(p, 2), "read_image: channels must be 1 or 3, got 2");
  EXPECT_LINEA_ERROR(read_image(p, 1, 4, 0),
                     "read_image: height and width must both be 0 (keep the size) or both positive, got 4x0");
  EXPECT_LINEA_ERROR(read_image(p, 1, -1, -1), "read_image: height and width must both be 0");
  EXPECT_LINEA_ERROR(read_image(dir.path.string(), 1),
                     "read_image: '" + dir.path.string() + "' is not a readable file");
  EXPECT_LINEA_ERROR(read_image(p, 1, 1 << 14, 1 << 14), "read_image: resize to 16384x16384 is more than the limit");
}

// An empty IDAT chunk before the image data is legal PNG, and made stb_image 2.27 pass memcpy a
// null pointer (found by fuzz_image; its input, in tests/fuzz/regressions/image, fails the clang
// UBSan build without the fix): read_image drops it, and the image reads the same.
TEST(ImageReader, EmptyIdatChunkBeforeTheData) {
  TempDir dir;
  const std::string p = dir.file("a.png");
  std::vector<uint8_t> px(5 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(17 * i);
  write_png(p, 5, 3, 1, px);
  const Tensor plain = read_image(p, 1);
  std::string png = read_all(p);
  const size_t idat = png.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  // length 0, "IDAT", CRC (unchecked), before the chunk's length field
  png.insert(idat - 4, std::string("\x00\x00\x00\x00IDAT\xae\x42\x60\x82", 12));
  write_all(p, png);
  const Tensor again = read_image(p, 1);
  EXPECT_EQ(again.shape(), plain.shape());
  EXPECT_EQ(again.to_vector<float>(), plain.to_vector<float>());
}

TEST(ImageFolderReader, RejectsBadFolders) {
  TempDir dir;
  EXPECT_LINEA_ERROR(read_image_folder(dir.file("nope")),
                     "read_image_folder: '" + dir.file("nope") + "' does not exist");
  write_all(dir.file("file"), "x");
  EXPECT_LINEA_ERROR(read_image_folder(dir.file("file")), "is not a directory");
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string()),
                     "read_image_folder: '" + dir.path.string() + "' has no class sub-folders");
  fs::create_directories(dir.path / "a");
  fs::create_directories(dir.path / "b");
  write_png(dir.file("a/1.png"), 4, 4, 1, std::vector<uint8_t>(16));
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string()),
                     "read_image_folder: class folder '" + dir.file("b") + "' contains no PNG or JPEG images");
  write_png(dir.file("b/2.png"), 7, 5, 1, std::vector<uint8_t>(35));
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string()), "read_image_folder: '" + dir.file("b/2.png") +
                                                               "' is 5x7 (HxW) but '" + dir.file("a/1.png") +
                                                               "' is 4x4; images must share one size");
  write_all(dir.file("b/2.png"), "not a png at all");
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string()),
                     "read_image_folder: cannot decode '" + dir.file("b/2.png") + "'");
  write_all(dir.file("b/2.png"), "GIF89a\x01\x00\x01\x00\x00\x00\x00;");  // stb_image reads GIF; Linea does not
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string()),
                     "read_image_folder: cannot decode '" + dir.file("b/2.png") + "': not a PNG or JPEG file");
  ImageFolderOptions o;
  o.channels = 2;
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string(), o), "channels must be 0 (auto), 1 or 3, got 2");
  o.channels = 0;
  o.height = 4;
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string(), o), "height and width must both be 0");
  o.height = o.width = 1 << 14;
  EXPECT_LINEA_ERROR(read_image_folder(dir.path.string(), o),
                     "read_image_folder: resize to 16384x16384 is more than the limit of 67108864 pixels");
}
