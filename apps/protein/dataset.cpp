// The prepared folder read back and the masked-LM dataset (dataset.h): windows of framed residues
// (whole sequences, crops, or packed streams) and masks drawn per (seed, stream, sequence,
// position), so that what a position shows the model never depends on how it was batched.
// Not here: writing the folder (prepare.h), the model and the loss (train.h).
#include "dataset.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "alphabet.h"
#include "apps/common/prepared_data.h"
#include "core/error.h"
#include "nn/io_util.h"
#include "nn/readers.h"
#include "nn/sampler.h"
#include "prepare.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using linea::nn::splitmix64;

namespace protein {

namespace {

// Arbitrary constants that give each kind of draw its own hash stream, so that e.g. the mask of
// position 0 and the crop offset of the same sequence are unrelated.
constexpr uint64_t kMaskDomain = 0x6D61736B2D647261ull;
constexpr uint64_t kCropDomain = 0x63726F702D6F6666ull;
constexpr uint64_t kPackOffsetDomain = 0x7061636B2D6F6666ull;
constexpr uint64_t kPackOrderDomain = 0x7061636B2D6F7264ull;

uint64_t mix(uint64_t h, uint64_t v) { return splitmix64(h ^ v); }

// The top 53 bits as a double in [0, 1).
double unit(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace

// ---- the prepared folder -------------------------------------------------------------------------

Manifest read_manifest(const std::string& data_dir) {
  const std::string path = (fs::path(data_dir) / "data.json").string();
  Manifest m;
  m.dir = data_dir;
  m.json = linea::apps::read_data_json("protein", data_dir);
  try {
    const std::string format = m.json.at("format");
    LINEA_CHECK(format == kDataFormat, "protein: '", path, "' is a '", format, "' manifest, not ", kDataFormat,
                "; run `protein prepare --out ", data_dir, "` again");
    (void)m.json.at("files").at("train");
  } catch (const json::exception& e) {
    LINEA_FAIL("protein: cannot read '", path, "': ", e.what(), "; run `protein prepare --out ", data_dir, "` again");
  }
  return m;
}

std::string split_path(const Manifest& m, const std::string& split) {
  LINEA_CHECK(split == "train" || split == "valid" || split == "test" || split == "query", "protein: no split '",
              split, "' (train, valid, test, query)");
  try {  // a hand-edited data.json can lack the file or give it another type
    const json& files = m.json.at("files");
    if (!files.contains(split)) {  // (false on a non-object too)
      LINEA_CHECK(split == "query", "protein: '", m.dir, "/data.json' lists no ", split,
                  " file; run `protein prepare` again");
      return "";
    }
    return (fs::path(m.dir) / files.at(split).get<std::string>()).string();
  } catch (const json::exception& e) {
    LINEA_FAIL("protein: cannot read the ", split, " file of '", m.dir, "/data.json': ", e.what(),
               "; run `protein prepare` again");
  }
}

int64_t Sequences::total_residues() const {
  int64_t n = 0;
  for (const std::vector<int8_t>& r : residues) n += static_cast<int64_t>(r.size());
  return n;
}

Sequences read_sequences(const std::string& fasta_path) {
  Sequences s;
  // An empty file is an empty split (prepare writes one for --test-size 0).
  std::error_code ec;
  if (fs::is_regular_file(fasta_path, ec) && fs::file_size(fasta_path, ec) == 0 && !ec) return s;
  const std::vector<linea::nn::FastaRecord> records = linea::nn::read_fasta(fasta_path);
  for (size_t k = 0; k < records.size(); ++k) {
    const std::string name = "'" + fasta_path + "': record " + std::to_string(k + 1) + " '" + records[k].id + "'";
    s.residues.push_back(encode_residues(records[k].sequence, name));
    s.names.push_back(records[k].id);
  }
  return s;
}

// ---- masking and windows -------------------------------------------------------------------------

MaskDraw mask_draw(uint64_t seed, uint64_t stream, int64_t seq, int64_t pos, int64_t residue,
                   const MaskingOptions& masking) {
  uint64_t h = mix(mix(mix(splitmix64(seed ^ kMaskDomain), stream), static_cast<uint64_t>(seq)),
                   static_cast<uint64_t>(pos));
  MaskDraw d;
  d.input = residue;
  if (!(unit(h) < masking.prob)) return d;
  d.chosen = true;
  h = splitmix64(h);  // a fresh draw for what replaces it
  const double u = unit(h);
  if (u < masking.mask_token)
    d.input = kMask;
  else if (u < masking.mask_token + masking.random_token)
    d.input = kFirstResidue + static_cast<int64_t>(splitmix64(h) % kNumStandard);
  return d;
}

std::vector<std::pair<int64_t, int64_t>> sequence_windows(int64_t length, int64_t max_residues) {
  LINEA_CHECK(max_residues >= 1, "protein sequence_windows: max_residues must be >= 1, got ", max_residues);
  LINEA_CHECK(length >= 0, "protein sequence_windows: negative length ", length);
  std::vector<std::pair<int64_t, int64_t>> w;
  const int64_t count = (length + max_residues - 1) / max_residues;
  // The first `length % count` windows hold one residue more than the others.
  for (int64_t k = 0, begin = 0; k < count; ++k) {
    const int64_t size = length / count + (k < length % count ? 1 : 0);
    w.emplace_back(begin, begin + size);
    begin += size;
  }
  return w;
}

// ---- the dataset ---------------------------------------------------------------------------------

MaskedLMDataset::MaskedLMDataset(std::shared_ptr<const Sequences> sequences, DatasetOptions options)
    : seqs_(std::move(sequences)), opts_(options) {
  LINEA_CHECK(seqs_ != nullptr, "MaskedLMDataset: the sequences are null");
  const MaskingOptions& m = opts_.masking;
  LINEA_CHECK(m.prob >= 0 && m.prob <= 1 && m.mask_token >= 0 && m.random_token >= 0 &&
                  m.mask_token + m.random_token <= 1,
              "MaskedLMDataset: masking probabilities must be in [0, 1] with mask_token + random_token <= 1, got "
              "prob ", m.prob, ", mask_token ", m.mask_token, ", random_token ", m.random_token);
  LINEA_CHECK(opts_.pack >= 0, "MaskedLMDataset: pack must be >= 0, got ", opts_.pack);
  const int64_t n = seqs_->size();
  const auto len = [&](int64_t i) { return static_cast<int64_t>(seqs_->residues[i].size()); };

  if (opts_.pack > 0) {
    const int64_t L = opts_.pack;
    LINEA_CHECK(L >= 3, "MaskedLMDataset: pack must be >= 3 tokens, got ", L);
    pack_order_.resize(static_cast<size_t>(n));
    std::iota(pack_order_.begin(), pack_order_.end(), 0);
    if (opts_.train) pack_order_ = linea::nn::epoch_permutation(n, splitmix64(opts_.seed ^ kPackOrderDomain), 0);
    pack_starts_.assign(1, 0);
    for (int64_t k = 0; k < n; ++k) pack_starts_.push_back(pack_starts_.back() + len(pack_order_[k]) + 2);
    pack_total_ = pack_starts_.back();
    if (opts_.train) {
      // Windows [offset + kL, offset + (k+1)L) with the offset in [0, slack]: as many as fit
      // whatever the offset, and the slack (pack_total_ - count * L) is at least L - 1.
      const int64_t count = (pack_total_ + 1) / L - 1;
      LINEA_CHECK(count >= 1, "MaskedLMDataset: packing training windows of ", L, " tokens needs at least ",
                  2 * L - 1, " tokens of sequences (with <cls>/<eos>), the split has ", pack_total_);
      lengths_.assign(static_cast<size_t>(count), L);
    } else {
      const int64_t count = (pack_total_ + L - 1) / L;
      lengths_.assign(static_cast<size_t>(count), L);
      if (count > 0) lengths_.back() = pack_total_ - (count - 1) * L;
    }
    return;
  }

  LINEA_CHECK(opts_.max_len >= 3, "MaskedLMDataset: max_len must be >= 3 (<cls>, a residue, <eos>), got ",
              opts_.max_len);
  for (int64_t i = 0; i < n; ++i) {
    if (opts_.train) {
      lengths_.push_back(std::min(len(i) + 2, opts_.max_len));
      continue;
    }
    for (const auto& [begin, end] : sequence_windows(len(i), opts_.max_len - 2)) {
      Piece p;
      p.seq = i;
      p.begin = begin;
      p.end = end;
      p.cls = p.eos = true;
      fixed_windows_.push_back({p});
      lengths_.push_back(p.tokens());
    }
  }
}

int64_t MaskedLMDataset::pack_offset(int64_t epoch) const {
  const int64_t slack = pack_total_ - size() * opts_.pack;
  const uint64_t h = mix(splitmix64(opts_.seed ^ kPackOffsetDomain), static_cast<uint64_t>(epoch));
  return static_cast<int64_t>(h % static_cast<uint64_t>(slack + 1));
}

Window MaskedLMDataset::window_at(int64_t i, int64_t epoch) const {
  LINEA_CHECK(i >= 0 && i < size(), "MaskedLMDataset: index ", i, " out of range [0, ", size(), ")");
  if (opts_.pack == 0) {
    if (!opts_.train) return fixed_windows_[i];
    // One sequence: whole when it fits, else a crop of max_len - 2 residues at a drawn offset.
    const int64_t len = static_cast<int64_t>(seqs_->residues[i].size()), keep = opts_.max_len - 2;
    Piece p;
    p.seq = i;
    p.cls = p.eos = true;
    p.end = len;
    if (len > keep) {
      const uint64_t h = mix(mix(splitmix64(opts_.seed ^ kCropDomain), static_cast<uint64_t>(epoch)),
                             static_cast<uint64_t>(i));
      p.begin = static_cast<int64_t>(h % static_cast<uint64_t>(len - keep + 1));
      p.end = p.begin + keep;
    }
    return {p};
  }
  // Tokens [a, b) of the stream <cls> s <eos> <cls> s' <eos> ... (sequences in pack_order_).
  const int64_t L = opts_.pack;
  const int64_t a = i * L + (opts_.train ? pack_offset(epoch) : 0), b = std::min(a + L, pack_total_);
  Window w;
  size_t k = std::upper_bound(pack_starts_.begin(), pack_starts_.end(), a) - pack_starts_.begin() - 1;
  for (; k < pack_order_.size() && pack_starts_[k] < b; ++k) {
    // Sequence k's tokens are [s, s + len + 2): <cls> at s, residue r at s + 1 + r, <eos> at s + len + 1.
    const int64_t s = pack_starts_[k], seq = pack_order_[k];
    const int64_t len = static_cast<int64_t>(seqs_->residues[seq].size());
    Piece p;
    p.seq = seq;
    p.cls = a <= s;
    p.eos = b >= s + len + 2;
    p.begin = std::clamp<int64_t>(a - s - 1, 0, len);
    p.end = std::clamp<int64_t>(b - s - 1, 0, len);
    w.push_back(p);
  }
  return w;
}

Window MaskedLMDataset::window(int64_t i) const { return window_at(i, epoch_.load()); }

linea::nn::Batch MaskedLMDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t epoch = epoch_.load();  // once: a batch never mixes two epochs
  LINEA_CHECK(epoch >= 0, "MaskedLMDataset: epoch must be >= 0, got ", epoch);
  const uint64_t stream = opts_.train ? static_cast<uint64_t>(epoch) : kEvalStream;
  const int64_t B = static_cast<int64_t>(indices.size());
  std::vector<Window> windows;
  int64_t T = 1;
  for (int64_t i : indices) {
    windows.push_back(window_at(i, epoch));
    int64_t t = 0;
    for (const Piece& p : windows.back()) t += p.tokens();
    T = std::max(T, t);
  }
  std::vector<int64_t> tokens(static_cast<size_t>(B * T), kPad), targets(static_cast<size_t>(B * T), kPad);
  linea::Tensor pad = linea::full({B, T}, 1.0, linea::TensorOptions(linea::DType::Bool));
  bool* padp = pad.data<bool>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = b * T;
    for (const Piece& p : windows[b]) {
      if (p.cls) tokens[t++] = kCls;
      const std::vector<int8_t>& res = seqs_->residues[p.seq];
      for (int64_t pos = p.begin; pos < p.end; ++pos, ++t) {
        const MaskDraw d = mask_draw(opts_.seed, stream, p.seq, pos, res[pos], opts_.masking);
        tokens[t] = d.input;
        if (d.chosen) targets[t] = res[pos];
      }
      if (p.eos) tokens[t++] = kEos;
    }
    std::fill(padp + b * T, padp + t, false);
  }
  linea::nn::Batch batch;
  batch.set("tokens", linea::from_vector<int64_t>(tokens, {B, T}));
  batch.set("targets", linea::from_vector<int64_t>(targets, {B, T}));
  batch.set("pad", pad);
  batch.set("index", linea::from_vector<int64_t>(indices, {B}));
  return batch;
}

linea::nn::Example MaskedLMDataset::get(int64_t i) const {
  const linea::nn::Batch b = get_batch({i});
  linea::nn::Example e;
  for (const auto& [name, t] : b.tensors()) e.set(name, t.select(0, 0).contiguous());
  return e;
}

}  // namespace protein
