// Datasets, the prefetching DataLoader, and the IDX / FASTA / image-folder readers (see
// nn/data.h). Files are read whole (gzip through zlib's gz* functions, which read plain files
// as they are), then parsed with every size checked against the bytes actually present.
// Not here: app-specific vocabularies or preprocessing.
#include "nn/data.h"

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
#include <numeric>

#include "core/ops.h"
#include "core/random.h"

namespace linea::nn {

namespace fs = std::filesystem;

// ---- datasets ------------------------------------------------------------------------------

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  LINEA_CHECK(!indices.empty(), "Dataset::get_batch: empty list of indices");
  std::vector<Tensor> inputs, targets;
  Example first;
  for (size_t k = 0; k < indices.size(); ++k) {
    Example e = get(indices[k]);
    LINEA_CHECK(e.input.defined(), "Dataset::get_batch: example ", indices[k], " has an undefined input");
    if (k == 0) first = e;
    LINEA_CHECK(e.input.shape() == first.input.shape() && e.input.dtype() == first.input.dtype(),
                "Dataset::get_batch: example ", indices[k], " has input ", shape_str(e.input.shape()), " ",
                dtype_name(e.input.dtype()), " but example ", indices[0], " has ", shape_str(first.input.shape()), " ",
                dtype_name(first.input.dtype()), " (examples of one batch must share shape and dtype)");
    LINEA_CHECK(e.target.defined() == first.target.defined(), "Dataset::get_batch: example ", indices[k],
                e.target.defined() ? " has" : " has no", " target but example ", indices[0],
                first.target.defined() ? " has one" : " has none");
    if (e.target.defined())
      LINEA_CHECK(e.target.shape() == first.target.shape() && e.target.dtype() == first.target.dtype(),
                  "Dataset::get_batch: example ", indices[k], " has target ", shape_str(e.target.shape()), " ",
                  dtype_name(e.target.dtype()), " but example ", indices[0], " has ", shape_str(first.target.shape()),
                  " ", dtype_name(first.target.dtype()));
    inputs.push_back(e.input.detach());
    if (e.target.defined()) targets.push_back(e.target.detach());
  }
  Batch b;
  b.input = raw::stack(inputs, 0);
  if (!targets.empty()) b.target = raw::stack(targets, 0);
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
  e.input = raw::squeeze(raw::narrow(inputs_, 0, i, 1), 0);
  if (targets_.defined()) e.target = raw::squeeze(raw::narrow(targets_, 0, i, 1), 0);
  return e;
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  LINEA_CHECK(!indices.empty(), "TensorDataset::get_batch: empty list of indices");
  for (int64_t i : indices)
    LINEA_CHECK(i >= 0 && i < n_, "TensorDataset::get_batch: index ", i, " out of range for ", n_, " examples");
  Tensor idx = from_vector<int64_t>(indices, {static_cast<int64_t>(indices.size())});
  Batch b;
  b.input = raw::index_select(inputs_, 0, idx);
  if (targets_.defined()) b.target = raw::index_select(targets_, 0, idx);
  return b;
}

// ---- DataLoader -----------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), opts_(options) {
  LINEA_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  LINEA_CHECK(opts_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", opts_.batch_size);
  LINEA_CHECK(opts_.prefetch_depth >= 1, "DataLoader: prefetch_depth must be >= 1, got ", opts_.prefetch_depth);
  LINEA_CHECK(dataset_->size() >= 0, "DataLoader: the dataset reports a negative size ", dataset_->size());
}

DataLoader::~DataLoader() { stop_worker(); }

int64_t DataLoader::num_batches() const {
  int64_t n = dataset_->size(), bs = opts_.batch_size;
  return opts_.drop_last ? n / bs : (n + bs - 1) / bs;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  LINEA_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(dataset_->size()));
  std::iota(order.begin(), order.end(), 0);
  if (!opts_.shuffle) return order;
  // Fisher-Yates; the draw for position i is Philox block i under a key mixing seed and epoch,
  // mapped to [0, i] by a 64x64 -> 128-bit multiply (bias below (i + 1) / 2^64).
  const uint64_t key = splitmix64(opts_.seed ^ splitmix64(static_cast<uint64_t>(epoch) + 0x632BE59BD9B4E019ull));
  for (size_t i = order.size(); i-- > 1;) {
    uint32_t w[4];
    linea::detail::Philox::block(key, static_cast<uint64_t>(i), w);
    uint64_t r = (static_cast<uint64_t>(w[0]) << 32) | w[1];
    auto j = static_cast<size_t>((static_cast<unsigned __int128>(r) * (i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

Batch DataLoader::make_batch(int64_t b) const {
  const int64_t n = static_cast<int64_t>(order_.size());
  const int64_t begin = b * opts_.batch_size, end = std::min(n, begin + opts_.batch_size);
  std::vector<int64_t> idx(order_.begin() + begin, order_.begin() + end);
  return dataset_->get_batch(idx);
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
  const int64_t nb = num_batches();
  LINEA_CHECK(first_batch >= 0 && first_batch <= nb, "DataLoader::reset: first_batch ", first_batch, " is outside [0, ",
              nb, "]");
  stop_worker();
  order_ = epoch_order(epoch);
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
  if (!opts_.prefetch) {
    if (next_batch_ >= num_batches()) return false;
    int64_t b = next_batch_;
    next_batch_ = num_batches();  // an exception ends the epoch, as with prefetch
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
  std::vector<char> buf(1 << 20);
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

}  // namespace

ImageFolder read_image_folder(const std::string& dir, const ImageFolderOptions& o) {
  const char* op = "read_image_folder";
  LINEA_CHECK(o.channels == 0 || o.channels == 1 || o.channels == 3, op, ": channels must be 0 (auto), 1 or 3, got ",
              o.channels);
  LINEA_CHECK((o.height == 0) == (o.width == 0) && o.height >= 0 && o.width >= 0, op,
              ": height and width must both be 0 (keep sizes) or both positive, got ", o.height, "x", o.width);
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
  int fw = 0, fh = 0, fc = 0;
  LINEA_CHECK(stbi_info(first.c_str(), &fw, &fh, &fc) == 1, op, ": cannot decode '", first,
              "': ", stbi_failure_reason() ? stbi_failure_reason() : "unknown error");
  const int64_t C = o.channels != 0 ? o.channels : (fc <= 2 ? 1 : 3);
  const bool resize = o.height > 0;
  const int64_t H = resize ? o.height : fh, W = resize ? o.width : fw;

  const int64_t N = static_cast<int64_t>(files.size());
  std::vector<float> pixels(static_cast<size_t>(N * C * H * W));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < N; ++i) {
    const std::string& path = files[i].first;
    int w = 0, h = 0, comp = 0;
    unsigned char* img = stbi_load(path.c_str(), &w, &h, &comp, static_cast<int>(C));
    LINEA_CHECK(img != nullptr, op, ": cannot decode '", path,
                "': ", stbi_failure_reason() ? stbi_failure_reason() : "unknown error");
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
  std::error_code ec;
  LINEA_CHECK(fs::is_regular_file(path, ec), op, ": '", path, "' is not a readable file");
  int w = 0, h = 0, comp = 0;
  unsigned char* img = stbi_load(path.c_str(), &w, &h, &comp, channels);
  LINEA_CHECK(img != nullptr, op, ": cannot decode '", path,
              "': ", stbi_failure_reason() ? stbi_failure_reason() : "unknown error");
  const int64_t H = height > 0 ? height : h, W = width > 0 ? width : w;
  std::vector<float> pixels(static_cast<size_t>(channels * H * W));
  resize_into(img, h, w, channels, pixels.data(), H, W, /*bilinear=*/true);
  stbi_image_free(img);
  return from_vector<float>(pixels, {channels, H, W});
}

}  // namespace linea::nn
