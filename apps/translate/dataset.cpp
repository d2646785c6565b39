#include "dataset.h"

#include <algorithm>
#include <filesystem>

#include "apps/common/prepared_data.h"
#include "core/error.h"
#include "nn/io_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace linea;

namespace translate {

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  const std::vector<char> bytes = nn::detail::read_file_bytes(path, "translate: prepared data");
  std::vector<std::string> lines;
  for (size_t start = 0; start < bytes.size();) {
    size_t end = start;
    while (end < bytes.size() && bytes[end] != '\n') ++end;
    lines.emplace_back(bytes.begin() + start, bytes.begin() + end);
    start = end + 1;
  }
  return lines;
}

}  // namespace

Manifest read_manifest(const std::string& data_dir) {
  const std::string path = (fs::path(data_dir) / "data.json").string();
  Manifest m;
  m.dir = data_dir;
  m.json = linea::apps::read_data_json("translate", data_dir);
  try {
    LINEA_CHECK(m.json.at("format") == "linea-translate-data" && m.json.at("version") == 1, "translate: '", path,
                "' is not a version-1 linea-translate-data manifest; run `translate prepare` again");
    m.src_lang = m.json.at("src_lang");
    m.tgt_lang = m.json.at("tgt_lang");
    m.vocab = m.json.at("vocab").at("mode");
    m.src_model = (fs::path(data_dir) / m.json.at("vocab").at("src_model").get<std::string>()).string();
    m.tgt_model = (fs::path(data_dir) / m.json.at("vocab").at("tgt_model").get<std::string>()).string();
  } catch (const json::exception& e) {
    LINEA_FAIL("translate: cannot read '", path, "': ", e.what(), "; run `translate prepare` again");
  }
  return m;
}

ParallelSplit read_split(const std::string& data_dir, const std::string& split) {
  const Manifest m = read_manifest(data_dir);
  std::string src, tgt, ref;
  size_t n = 0;
  try {  // a hand-edited data.json can lack any of these or give them other types
    const json& files = m.json.at("files");
    LINEA_CHECK(files.is_object() && files.contains(split), "translate: no split '", split, "' in '", data_dir,
                "' (train, valid, test)");
    const json& f = files.at(split);
    const auto file = [&](const char* key) { return (fs::path(data_dir) / f.at(key).get<std::string>()).string(); };
    src = file("src");
    tgt = file("tgt");
    ref = file("ref");
    n = f.at("pairs").get<size_t>();
  } catch (const json::exception& e) {
    LINEA_FAIL("translate: cannot read split '", split, "' of '", (fs::path(data_dir) / "data.json").string(),
               "': ", e.what(), "; run `translate prepare` again");
  }
  ParallelSplit s;
  s.src = read_lines(src);
  s.tgt = read_lines(tgt);
  s.refs = read_lines(ref);
  LINEA_CHECK(s.src.size() == n && s.tgt.size() == n && s.refs.size() == n, "translate: split '", split, "' of '",
              data_dir, "' should hold ", n, " pairs but its files have ", s.src.size(), " / ", s.tgt.size(), " / ",
              s.refs.size(), " lines; run `translate prepare` again");
  return s;
}

TranslationDataset::TranslationDataset(ParallelSplit split, const Tokenizer& src_tok, const Tokenizer& tgt_tok,
                                       int64_t max_len)
    : split_(std::move(split)) {
  LINEA_CHECK(split_.src.size() == split_.tgt.size() && split_.src.size() == split_.refs.size(),
              "TranslationDataset: ", split_.src.size(), " sources, ", split_.tgt.size(), " targets and ",
              split_.refs.size(), " references");
  src_ids_.reserve(split_.src.size());
  tgt_ids_.reserve(split_.tgt.size());
  for (size_t i = 0; i < split_.src.size(); ++i) {
    src_ids_.push_back(src_tok.encode(split_.src[i]));
    tgt_ids_.push_back(tgt_tok.encode(split_.tgt[i]));
    const int64_t s = static_cast<int64_t>(src_ids_.back().size()) + 1, t = static_cast<int64_t>(tgt_ids_.back().size()) + 1;
    LINEA_CHECK(max_len <= 0 || (s <= max_len && t <= max_len), "TranslationDataset: example ", i, " (", split_.refs[i],
                ") has ", s, " source and ", t, " target tokens with eos, more than max_len ", max_len,
                "; prepare the data with a smaller --max-length or use a model with more positions");
  }
}

std::vector<int64_t> TranslationDataset::lengths() const {
  std::vector<int64_t> len(src_ids_.size());
  for (size_t i = 0; i < len.size(); ++i) len[i] = static_cast<int64_t>(std::max(src_ids_[i].size(), tgt_ids_[i].size())) + 1;
  return len;
}

nn::Batch TranslationDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t B = static_cast<int64_t>(indices.size());
  int64_t S = 1, T = 1;
  for (int64_t i : indices) {
    LINEA_CHECK(i >= 0 && i < size(), "TranslationDataset: index ", i, " out of range [0, ", size(), ")");
    S = std::max<int64_t>(S, static_cast<int64_t>(src_ids_[i].size()) + 1);
    T = std::max<int64_t>(T, static_cast<int64_t>(tgt_ids_[i].size()) + 1);
  }
  std::vector<int64_t> src(B * S, kPadId), tgt_in(B * T, kPadId), tgt_out(B * T, kPadId);
  Tensor src_pad = full({B, S}, 1.0, TensorOptions(DType::Bool)), tgt_pad = full({B, T}, 1.0, TensorOptions(DType::Bool));
  bool* sp = src_pad.data<bool>();
  bool* tp = tgt_pad.data<bool>();
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int64_t>& s = src_ids_[indices[b]];
    const std::vector<int64_t>& t = tgt_ids_[indices[b]];
    std::copy(s.begin(), s.end(), src.begin() + b * S);
    src[b * S + s.size()] = kEosId;
    std::fill(sp + b * S, sp + b * S + s.size() + 1, false);
    tgt_in[b * T] = kBosId;
    std::copy(t.begin(), t.end(), tgt_in.begin() + b * T + 1);
    std::copy(t.begin(), t.end(), tgt_out.begin() + b * T);
    tgt_out[b * T + t.size()] = kEosId;
    std::fill(tp + b * T, tp + b * T + t.size() + 1, false);
  }
  nn::Batch batch;
  batch.set("src", from_vector<int64_t>(src, {B, S}));
  batch.set("tgt_in", from_vector<int64_t>(tgt_in, {B, T}));
  batch.set("tgt_out", from_vector<int64_t>(tgt_out, {B, T}));
  batch.set("src_pad", src_pad);
  batch.set("tgt_pad", tgt_pad);
  batch.set("index", from_vector<int64_t>(indices, {B}));
  return batch;
}

nn::Example TranslationDataset::get(int64_t i) const {
  const nn::Batch b = get_batch({i});
  nn::Example e;
  for (const auto& [name, t] : b.tensors()) e.set(name, t.select(0, 0).contiguous());
  return e;
}

}  // namespace translate
