// The IDX / FASTA / image-folder readers (see nn/readers.h). Files are read whole (gzip through
// zlib's gz* functions, which read plain files as they are), then parsed with every size checked
// against the bytes actually present.
// Not here: app-specific vocabularies or preprocessing.
#include "nn/readers.h"

#include <stb/stb_image.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>

#include "core/ops.h"
#include "nn/io_util.h"

namespace linea::nn {

namespace fs = std::filesystem;

// ---- file helpers ---------------------------------------------------------------------------

namespace {

void check_readable_file(const std::string& path, const char* op) {
  struct stat st;
  LINEA_CHECK(::stat(path.c_str(), &st) == 0, op, ": cannot open '", path, "': ", std::strerror(errno));
  LINEA_CHECK(!S_ISDIR(st.st_mode), op, ": '", path, "' is a directory, not a file");
}

// The whole (decompressed) contents of a gzip or plain file.
std::string read_maybe_gz(const std::string& path, const char* op) {
  check_readable_file(path, op);
  gzFile f = gzopen(path.c_str(), "rb");
  LINEA_CHECK(f != nullptr, op, ": cannot open '", path, "': ", std::strerror(errno));
  std::string out;
  std::vector<char> buf(1 << 16);  // gzread buffers internally; a small chunk is as fast
  for (;;) {
    int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      LINEA_FAIL(op, ": '", path, "': corrupted gzip data (", msg, ")");
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  int errnum = 0;
  std::string msg = gzerror(f, &errnum);
  gzclose(f);
  LINEA_CHECK(errnum == Z_OK || errnum == Z_STREAM_END, op, ": '", path,
              errnum == Z_BUF_ERROR ? "': truncated gzip data (" : "': gzip error (", msg, ")");
  return out;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08X", v);
  return b;
}

uint32_t be32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 | static_cast<uint32_t>(p[2]) << 8 |
         static_cast<uint32_t>(p[3]);
}

IdxArray parse_idx(const std::string& bytes, const std::string& path, const char* op, uint32_t expect_magic) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t size = bytes.size();
  LINEA_CHECK(size >= 4, op, ": '", path, "': file is ", size, " bytes, too short for an IDX header (truncated?)");
  const uint32_t magic = be32(p);
  if (expect_magic != 0)
    LINEA_CHECK(magic == expect_magic, op, ": '", path, "': bad magic number ", hex32(magic), " (expected ",
                hex32(expect_magic), expect_magic == 0x803 ? ", an IDX image file)" : ", an IDX label file)");
  LINEA_CHECK(p[0] == 0 && p[1] == 0, op, ": '", path, "': bad magic number ", hex32(magic),
              " (not an IDX file: the first two bytes must be zero)");
  LINEA_CHECK(p[2] == 0x08, op, ": '", path, "': IDX element type ", hex32(p[2]).replace(2, 6, ""),
              " is not supported (only unsigned bytes, 0x08)");
  const size_t ndim = p[3];
  const size_t header = 4 + 4 * ndim;
  LINEA_CHECK(size >= header, op, ": '", path, "': file is ", size, " bytes, too short for the ", ndim,
              "-dimension IDX header (truncated?)");
  IdxArray a;
  for (size_t d = 0; d < ndim; ++d) a.dims.push_back(be32(p + 4 + 4 * d));
  const uint64_t avail = size - header;
  const std::string dims_str = shape_str(a.dims);
  // numel, checked factor by factor against the bytes present (so it cannot overflow).
  uint64_t numel = 1;
  if (std::find(a.dims.begin(), a.dims.end(), 0) != a.dims.end()) {
    numel = 0;
    // No data needed, but huge other dims would still overflow a tensor's strides.
    LINEA_CHECK(shape_fits(a.dims), op, ": '", path, "': dims ", dims_str,
                " are too large for a tensor (their product overflows int64)");
  } else {
    for (int64_t n : a.dims) {
      LINEA_CHECK(numel <= avail / static_cast<uint64_t>(n), op, ": '", path, "': truncated: dims ", dims_str,
                  " need more bytes of data than the ", avail, " the file has");
      numel *= static_cast<uint64_t>(n);
    }
  }
  LINEA_CHECK(numel == avail, op, ": '", path, "': ", avail - numel, " unexpected bytes after the ", dims_str, " data");
  a.data.assign(p + header, p + size);
  return a;
}

}  // namespace

// ---- IDX ------------------------------------------------------------------------------------

IdxArray read_idx_gz(const std::string& path) {
  return parse_idx(read_maybe_gz(path, "read_idx_gz"), path, "read_idx_gz", 0);
}

Tensor read_idx_images(const std::string& path, bool scale, bool add_channel) {
  IdxArray a = parse_idx(read_maybe_gz(path, "read_idx_images"), path, "read_idx_images", 0x00000803);
  Shape shape = add_channel ? Shape{a.dims[0], 1, a.dims[1], a.dims[2]} : a.dims;
  std::vector<float> v(a.data.size());
  const float k = scale ? 1.0f / 255.0f : 1.0f;
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(a.data[i]) * k;
  return from_vector<float>(v, shape);
}

Tensor read_idx_labels(const std::string& path) {
  IdxArray a = parse_idx(read_maybe_gz(path, "read_idx_labels"), path, "read_idx_labels", 0x00000801);
  std::vector<int64_t> v(a.data.begin(), a.data.end());
  return from_vector<int64_t>(v, a.dims);
}

std::shared_ptr<TensorDataset> load_idx_dataset(const std::string& images_path, const std::string& labels_path) {
  Tensor x = read_idx_images(images_path);
  Tensor y = read_idx_labels(labels_path);
  LINEA_CHECK(x.size(0) == y.size(0), "load_idx_dataset: '", images_path, "' has ", x.size(0), " images but '",
              labels_path, "' has ", y.size(0), " labels");
  return std::make_shared<TensorDataset>(x, y);
}

// ---- FASTA ----------------------------------------------------------------------------------

std::vector<FastaRecord> read_fasta(const std::string& path) {
  const std::string text = read_maybe_gz(path, "read_fasta");
  std::vector<FastaRecord> out;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == ';') continue;  // blank or comment line
    if (line[0] == '>') {
      FastaRecord r;
      size_t b = line.find_first_not_of(" \t", 1);
      if (b != std::string::npos) {
        size_t e = line.find_first_of(" \t", b);
        r.id = line.substr(b, e == std::string::npos ? std::string::npos : e - b);
        if (e != std::string::npos) {
          size_t d = line.find_first_not_of(" \t", e);
          if (d != std::string::npos) r.description = line.substr(d);
        }
      }
      LINEA_CHECK(!r.id.empty(), "read_fasta: '", path, "' line ", line_no, ": empty header (expected '>id ...')");
      out.push_back(std::move(r));
      continue;
    }
    LINEA_CHECK(!out.empty(), "read_fasta: '", path, "' line ", line_no,
                ": sequence data before the first '>' header (is this a FASTA file?)");
    std::string& seq = out.back().sequence;
    for (char c : line) {
      if (c == ' ' || c == '\t') continue;
      LINEA_CHECK(std::isalpha(static_cast<unsigned char>(c)) || c == '*' || c == '-' || c == '.', "read_fasta: '",
                  path, "' line ", line_no, ": unexpected character ",
                  std::isprint(static_cast<unsigned char>(c)) ? std::string("'") + c + "'"
                                                              : "0x" + hex32(static_cast<unsigned char>(c)).substr(8),
                  " in the sequence of record '", out.back().id, "'");
      seq.push_back(c);
    }
  }
  LINEA_CHECK(!out.empty(), "read_fasta: '", path, "' contains no FASTA records (expected lines starting with '>')");
  return out;
}

// ---- image folders --------------------------------------------------------------------------

namespace {

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

bool hidden(const fs::path& p) {
  std::string n = p.filename().string();
  return !n.empty() && n[0] == '.';
}

// src: h x w x c bytes (HWC) -> dst: c x H x W floats in [0, 1] (CHW).
void resize_into(const unsigned char* src, int64_t h, int64_t w, int64_t c, float* dst, int64_t H, int64_t W,
                 bool bilinear) {
  const double sy = static_cast<double>(h) / H, sx = static_cast<double>(w) / W;
  for (int64_t y = 0; y < H; ++y) {
    for (int64_t x = 0; x < W; ++x) {
      for (int64_t ch = 0; ch < c; ++ch) {
        double v;
        if (!bilinear || (h == H && w == W)) {
          int64_t iy = std::min<int64_t>(h - 1, static_cast<int64_t>((y + 0.5) * sy));
          int64_t ix = std::min<int64_t>(w - 1, static_cast<int64_t>((x + 0.5) * sx));
          v = src[(iy * w + ix) * c + ch];
        } else {
          // Half-pixel centers (as PIL / torch align_corners=False), clamped at the borders.
          double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, static_cast<double>(h - 1));
          double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, static_cast<double>(w - 1));
          int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
          int64_t y1 = std::min(y0 + 1, h - 1), x1 = std::min(x0 + 1, w - 1);
          double ty = fy - y0, tx = fx - x0;
          auto at = [&](int64_t yy, int64_t xx) { return static_cast<double>(src[(yy * w + xx) * c + ch]); };
          v = (1 - ty) * ((1 - tx) * at(y0, x0) + tx * at(y0, x1)) + ty * ((1 - tx) * at(y1, x0) + tx * at(y1, x1));
        }
        dst[(ch * H + y) * W + x] = static_cast<float>(v / 255.0);
      }
    }
  }
}

const char* stbi_reason() { return stbi_failure_reason() ? stbi_failure_reason() : "unknown error"; }

// stb_image grows its buffer for a PNG's compressed data by the length each chunk declares,
// before it reads the chunk: a 60-byte file could make it allocate 2 GB. So the chunks are
// walked first, and each must lie within the file.
void check_png_chunks(const std::vector<char>& b, const std::string& path, const char* op) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  for (size_t pos = 8; pos < b.size();) {
    const size_t rest = b.size() - pos;  // from the chunk's length field to the end of the file
    const std::string type = rest >= 8 ? std::string(b.data() + pos + 4, 4) : std::string("?");
    const uint64_t len = rest >= 4 ? be32(p + pos) : 0;
    LINEA_CHECK(rest >= 12 && len <= rest - 12, op, ": cannot decode '", path, "': PNG chunk '", type, "' at byte ",
                pos, " needs ", len + 12, " bytes but the file has ", rest, " left (truncated or corrupt)");
    if (type == "IEND") return;
    pos += 12 + len;
  }
}

// stb_image 2.27 copies each IDAT chunk's data into a buffer it allocates at the first non-empty
// one: an empty IDAT before that passes memcpy a null pointer (undefined behaviour; found by
// fuzz_image). An empty IDAT adds nothing to the compressed stream, so such chunks are dropped
// from the bytes stb_image reads (the chunks were checked to lie within the file).
void drop_empty_idat_chunks(std::vector<char>& b) {
  // Calls f(pos, len, empty IDAT) for each chunk up to IEND.
  const auto walk = [&b](auto&& f) {
    const auto* p = reinterpret_cast<const unsigned char*>(b.data());
    for (size_t pos = 8; pos + 12 <= b.size();) {
      const size_t len = be32(p + pos);
      f(pos, len, len == 0 && std::memcmp(b.data() + pos + 4, "IDAT", 4) == 0);
      if (std::memcmp(b.data() + pos + 4, "IEND", 4) == 0) break;
      pos += 12 + len;
    }
  };
  bool any = false;
  walk([&](size_t, size_t, bool empty_idat) { any = any || empty_idat; });
  if (!any) return;  // the usual case: nothing copied
  std::vector<char> kept(b.begin(), b.begin() + 8);
  walk([&](size_t pos, size_t len, bool empty_idat) {
    if (!empty_idat) kept.insert(kept.end(), b.begin() + pos, b.begin() + pos + 12 + len);
  });
  b = std::move(kept);
}

// Two bugs of stb_image 2.27 (Debian 12's libstb; upstream fixed both in 2.28) let a crafted JPEG
// reach memory outside stb_image's buffers: it builds a Huffman table from its 16 code counts
// before it checks that they add up to at most 256 (and writes past the table when they do not),
// and it decodes a scan with a Huffman table no DHT segment defined (reading far outside the
// table). So the JPEG's marker segments are walked as stb_image walks them (by their lengths; in
// scan data, every 0xFF not followed by 0x00 or a restart marker starts one), every Huffman table
// is checked, and every scan must use tables defined before it.
void check_jpeg_segments(const std::vector<char>& b, const std::string& path, const char* op) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  const size_t n = b.size();
  // A byte of the file, or 0 past its end (what stb_image reads there).
  const auto byte = [&](size_t i) -> size_t { return i < n ? p[i] : 0; };
  bool defined[2][4] = {};  // [DC, AC][table id]: the Huffman tables DHT segments defined so far
  bool progressive = false;
  // From after the SOI marker; bytes that are not 0xFF are scan data, or padding between segments.
  for (size_t pos = 2; pos < n;) {
    if (p[pos] != 0xFF) {
      ++pos;
      continue;
    }
    size_t q = pos + 1;
    while (q < n && p[q] == 0xFF) ++q;  // fill bytes
    if (q >= n) return;
    const unsigned char marker = p[q];
    pos = q + 1;
    // No segment follows stuffing (FF 00), restart markers, TEM, SOI; EOI ends the file.
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) continue;
    if (marker == 0xD9) return;
    const size_t len = byte(pos) << 8 | byte(pos + 1);  // counts its own 2 bytes
    LINEA_CHECK(len >= 2 && pos + len <= n, op, ": cannot decode '", path, "': JPEG segment FF ",
                hex32(marker).substr(8), " at byte ", q - 1, " needs ", len, " bytes but the file has ", n - pos,
                " left (truncated or corrupt)");
    if (marker == 0xC4) {  // DHT: tables of 1 + 16 + (sum of counts) bytes, read as stb_image reads them
      int64_t left = static_cast<int64_t>(len) - 2;
      for (size_t t = pos + 2; left > 0;) {
        size_t codes = 0;
        for (size_t i = 1; i <= 16; ++i) codes += byte(t + i);
        LINEA_CHECK(codes <= 256, op, ": cannot decode '", path, "': JPEG Huffman table at byte ", t, " has ", codes,
                    " codes (at most 256)");
        if (byte(t) >> 4 <= 1 && (byte(t) & 15) <= 3) defined[byte(t) >> 4][byte(t) & 15] = true;
        t += 17 + codes;
        left -= static_cast<int64_t>(17 + codes);
      }
    }
    if (marker == 0xC2) progressive = true;  // SOF2 (of the other SOFs stb_image reads SOF0 and SOF1)
    if (marker == 0xDA) {  // SOS: Ns, Ns x (component, DC table << 4 | AC table), Ss, Se, Ah << 4 | Al
      const size_t ns = byte(pos + 2), ss = byte(pos + 3 + 2 * ns), ah = byte(pos + 5 + 2 * ns) >> 4;
      // Baseline scans decode with both tables; progressive ones with the DC table in a first DC
      // scan, with the AC table in AC scans.
      const bool dc = !progressive || (ss == 0 && ah == 0), ac = !progressive || ss != 0;
      for (size_t c = 0; c < ns; ++c) {
        const size_t td = byte(pos + 4 + 2 * c) >> 4, ta = byte(pos + 4 + 2 * c) & 15;
        LINEA_CHECK((!dc || (td <= 3 && defined[0][td])) && (!ac || (ta <= 3 && defined[1][ta])), op,
                    ": cannot decode '", path, "': the JPEG scan at byte ", q - 1,
                    " uses a Huffman table that no DHT segment before it defines");
      }
    }
    pos += len;
  }
}

// A PNG or JPEG file's bytes and its declared size, checked before anything is allocated for the
// pixels. Other formats stb_image knows are refused: Linea reads PNG and JPEG (readers.h), and
// each decoder left out is one less for a hostile file to aim at.
struct ImageFile {
  std::vector<char> bytes;
  int h = 0, w = 0, comp = 0;
};
ImageFile read_image_file(const std::string& path, const char* op) {
  ImageFile f;
  f.bytes = detail::read_file_bytes(path, op);
  const std::vector<char>& b = f.bytes;
  const bool png = b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0;
  const bool jpeg = b.size() >= 3 && std::memcmp(b.data(), "\xff\xd8\xff", 3) == 0;
  LINEA_CHECK(png || jpeg, op, ": cannot decode '", path, "': not a PNG or JPEG file");
  LINEA_CHECK(b.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), op, ": '", path, "' is ", b.size(),
              " bytes, too large for stb_image");
  if (png) check_png_chunks(b, path, op);
  if (png) drop_empty_idat_chunks(f.bytes);
  if (jpeg) check_jpeg_segments(b, path, op);
  const auto* data = reinterpret_cast<const stbi_uc*>(b.data());
  LINEA_CHECK(stbi_info_from_memory(data, static_cast<int>(b.size()), &f.w, &f.h, &f.comp) == 1, op,
              ": cannot decode '", path, "': ", stbi_reason());
  LINEA_CHECK(f.h > 0 && f.w > 0 && static_cast<int64_t>(f.h) * f.w <= kMaxImagePixels, op, ": '", path,
              "' declares a ", f.h, "x", f.w, " (HxW) image, more than the limit of ", kMaxImagePixels,
              " pixels (corrupt file?)");
  return f;
}

// The pixels of f converted to `channels` channels: f.h x f.w x channels bytes (HWC), to free
// with stbi_image_free.
unsigned char* decode_image(const ImageFile& f, int channels, const std::string& path, const char* op) {
  int w = 0, h = 0, comp = 0;
  unsigned char* img = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(f.bytes.data()),
                                             static_cast<int>(f.bytes.size()), &w, &h, &comp, channels);
  LINEA_CHECK(img != nullptr, op, ": cannot decode '", path, "': ", stbi_reason());
  if (h != f.h || w != f.w) {  // cannot happen with stb_image's decoders; the buffer size depends on it
    stbi_image_free(img);
    LINEA_FAIL(op, ": cannot decode '", path, "': it declares ", f.h, "x", f.w, " but decodes as ", h, "x", w);
  }
  return img;
}

}  // namespace

ImageFolder read_image_folder(const std::string& dir, const ImageFolderOptions& o) {
  const char* op = "read_image_folder";
  LINEA_CHECK(o.channels == 0 || o.channels == 1 || o.channels == 3, op, ": channels must be 0 (auto), 1 or 3, got ",
              o.channels);
  LINEA_CHECK((o.height == 0) == (o.width == 0) && o.height >= 0 && o.width >= 0, op,
              ": height and width must both be 0 (keep sizes) or both positive, got ", o.height, "x", o.width);
  LINEA_CHECK(o.height == 0 || o.height <= kMaxImagePixels / o.width, op, ": resize to ", o.height, "x", o.width,
              " is more than the limit of ", kMaxImagePixels, " pixels");
  std::error_code ec;
  LINEA_CHECK(fs::exists(dir, ec), op, ": '", dir, "' does not exist");
  LINEA_CHECK(fs::is_directory(dir, ec), op, ": '", dir, "' is not a directory");

  ImageFolder out;
  std::vector<std::pair<std::string, int64_t>> files;  // path, label
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && !hidden(e.path())) out.classes.push_back(e.path().filename().string());
  LINEA_CHECK(!ec, op, ": cannot list '", dir, "': ", ec.message());
  std::sort(out.classes.begin(), out.classes.end());
  LINEA_CHECK(!out.classes.empty(), op, ": '", dir, "' has no class sub-folders (expected ", dir,
              "/<class>/<image>.png or .jpg)");
  for (size_t k = 0; k < out.classes.size(); ++k) {
    fs::path cdir = fs::path(dir) / out.classes[k];
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(cdir, ec))
      if (e.is_regular_file() && !hidden(e.path()) && is_image_file(e.path())) names.push_back(e.path().string());
    LINEA_CHECK(!ec, op, ": cannot list '", cdir.string(), "': ", ec.message());
    LINEA_CHECK(!names.empty(), op, ": class folder '", cdir.string(), "' contains no PNG or JPEG images");
    std::sort(names.begin(), names.end());
    for (auto& n : names) files.emplace_back(n, static_cast<int64_t>(k));
  }

  // Channels and (unless resizing) the size come from the first image.
  const std::string& first = files[0].first;
  ImageFile f = read_image_file(first, op);
  const int64_t C = o.channels != 0 ? o.channels : (f.comp <= 2 ? 1 : 3);
  const bool resize = o.height > 0;
  const int64_t H = resize ? o.height : f.h, W = resize ? o.width : f.w;

  const int64_t N = static_cast<int64_t>(files.size());
  std::vector<float> pixels(static_cast<size_t>(N * C * H * W));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < N; ++i) {
    const std::string& path = files[i].first;
    if (i > 0) f = read_image_file(path, op);
    const int h = f.h, w = f.w;
    unsigned char* img = decode_image(f, static_cast<int>(C), path, op);
    if (!resize && (h != H || w != W)) {
      stbi_image_free(img);
      LINEA_FAIL(op, ": '", path, "' is ", h, "x", w, " (HxW) but '", first, "' is ", H, "x", W,
                 "; images must share one size, or set ImageFolderOptions height/width to resize them");
    }
    resize_into(img, h, w, C, pixels.data() + i * C * H * W, H, W, o.bilinear);
    stbi_image_free(img);
    labels.push_back(files[i].second);
    out.files.push_back(path);
  }
  out.images = from_vector<float>(pixels, {N, C, H, W});
  out.labels = from_vector<int64_t>(labels, {N});
  return out;
}

Tensor read_image(const std::string& path, int channels, int64_t height, int64_t width) {
  const char* op = "read_image";
  LINEA_CHECK(channels == 1 || channels == 3, op, ": channels must be 1 or 3, got ", channels);
  LINEA_CHECK(height >= 0 && width >= 0 && (height == 0) == (width == 0), op,
              ": height and width must both be 0 (keep the size) or both positive, got ", height, "x", width);
  LINEA_CHECK(height == 0 || height <= kMaxImagePixels / width, op, ": resize to ", height, "x", width,
              " is more than the limit of ", kMaxImagePixels, " pixels");
  std::error_code ec;
  LINEA_CHECK(fs::is_regular_file(path, ec), op, ": '", path, "' is not a readable file");
  const ImageFile f = read_image_file(path, op);
  const int h = f.h, w = f.w;
  unsigned char* img = decode_image(f, channels, path, op);
  const int64_t H = height > 0 ? height : h, W = width > 0 ? width : w;
  std::vector<float> pixels(static_cast<size_t>(channels * H * W));
  resize_into(img, h, w, channels, pixels.data(), H, W, /*bilinear=*/true);
  stbi_image_free(img);
  return from_vector<float>(pixels, {channels, H, W});
}

}  // namespace linea::nn
