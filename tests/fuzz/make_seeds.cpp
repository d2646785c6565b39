// The seed corpora of the fuzz targets: small valid inputs, in each target's input layout,
// written with Linea's own writers (safetensors, checkpoints, gzip, stb_image_write) or trained
// (SentencePiece models), so the fuzzers start from files that parse all the way.
//
//   fuzz_make_seeds OUT    writes OUT/<target>/<name> for every target (fuzz_<target>.cpp)
//
// Run by tests/fuzz/run.sh into build/fuzz/seeds; nothing here is committed but this generator.
#include <stb/stb_image_write.h>

#include <cstdio>
#include <iostream>

#include "autograd/ops.h"
#include "core/random.h"
#include "fuzz_util.h"
#include "nn/checkpoint.h"
#include "nn/io_util.h"
#include "nn/safetensors.h"
#include "tiny_model.h"
#ifdef LINEA_FUZZ_APPS
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "apps/translate/tokenizer.h"
#endif

using namespace linea;
namespace fs = std::filesystem;

namespace {

fs::path g_out;

void seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  fuzz::write_file(dir / name, bytes);
}

// A string as FuzzedDataProvider::ConsumeRandomLengthString reads it back: "\" doubled, then a
// "\" and another byte to end it.
std::string fdp_string(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\\') out += '\\';
  }
  return out + "\\;";
}

std::string read_file(const fs::path& path) {
  const std::vector<char> b = nn::detail::read_file_bytes(path.string(), "fuzz_make_seeds");
  return std::string(b.begin(), b.end());
}

// ---- safetensors ------------------------------------------------------------------------------

// A header written by hand, for the dtypes Linea reads but does not write.
std::string safetensors_by_hand(const std::string& json, const std::string& data) {
  std::string header = json;
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

void safetensors_seeds() {
  nn::StateDict weights{{"weight", full({2, 3}, 0.25)},
                        {"bias", from_vector<float>({1, -2, 3}, {3})},
                        {"count", zeros({}, TensorOptions(DType::Int64))}};
  seed("safetensors", "module", nn::detail::serialize_safetensors(weights, {{"format", "pt"}}));
  nn::StateDict dtypes{{"f64", from_vector<double>({1.5, -2.5}, {2})},
                       {"i64", from_vector<int64_t>({7, -8, 9, 10}, {2, 2})},
                       {"bool", full({3}, 1.0, TensorOptions(DType::Bool))},
                       {"empty", zeros({0, 4})},
                       {"scalar", full({}, 3.0)}};
  seed("safetensors", "dtypes", nn::detail::serialize_safetensors(dtypes, {}));
  seed("safetensors", "empty", nn::detail::serialize_safetensors({}, {{"note", "no tensors"}}));
  // F16 1.0, -2.0; BF16 1.0; U8, I8, I16, U16, I32, U32.
  const std::string data(
      "\x00\x3c\x00\xc0"
      "\x80\x3f"
      "\xff"
      "\x80"
      "\x01\x80"
      "\xff\xff"
      "\x01\x00\x00\x80"
      "\xff\xff\xff\xff",
      20);
  seed("safetensors", "half_and_ints",
       safetensors_by_hand(R"({"__metadata__":{"k":"v"},"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
                           R"("bf":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},)"
                           R"("u8":{"dtype":"U8","shape":[1],"data_offsets":[6,7]},)"
                           R"("i8":{"dtype":"I8","shape":[1],"data_offsets":[7,8]},)"
                           R"("i16":{"dtype":"I16","shape":[1],"data_offsets":[8,10]},)"
                           R"("u16":{"dtype":"U16","shape":[1],"data_offsets":[10,12]},)"
                           R"("i32":{"dtype":"I32","shape":[1],"data_offsets":[12,16]},)"
                           R"("u32":{"dtype":"U32","shape":[1],"data_offsets":[16,20]}})",
                           data));
}

// ---- IDX and FASTA (byte 0: the target's mode) ------------------------------------------------

std::string idx_file(uint8_t ndim, const std::vector<uint32_t>& dims, uint8_t fill) {
  std::string f{'\0', '\0', '\x08', static_cast<char>(ndim)};
  size_t n = 1;
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) f += static_cast<char>((d >> s) & 0xff);
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) f += static_cast<char>(fill + i * 37);
  return f;
}

void idx_seeds() {
  const std::string images = idx_file(3, {2, 3, 3}, 10), labels = idx_file(1, {4}, 1);
  // mode: bit 0 gzip by the target, bits 1-2 reader (0 gz, 1 images, 2 labels, 3 all), bits 3-4 flags.
  seed("idx", "images_plain", std::string(1, char(2 | 8 | 16)) + images);
  seed("idx", "images_gzip", std::string(1, char(3)) + images);
  seed("idx", "labels_plain", std::string(1, char(4)) + labels);
  seed("idx", "labels_gzip", std::string(1, char(5)) + labels);
  seed("idx", "any_4d", std::string(1, char(0)) + idx_file(4, {1, 2, 1, 2}, 0));
  seed("idx", "raw_gzip_file", std::string(1, char(6)) + fuzz::gzip(images.data(), images.size()));
}

void fasta_seeds() {
  const std::string text =
      "; a comment\n>sp|P1|ONE first protein\nMKTAYIAKQR\nQISFVKSHFS\n\n>two\r\nACDEFGHIKLMNPQRSTVWYXBUZO.-\n";
  seed("fasta", "plain", std::string(1, '\0') + text);
  seed("fasta", "gzip_by_target", std::string(1, '\1') + text);
  seed("fasta", "raw_gzip_file", std::string(1, '\0') + fuzz::gzip(text.data(), text.size()));
}

// ---- images (3 option bytes, then the file) ---------------------------------------------------

void append_bytes(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

std::string png(int w, int h, int comp) {
  std::vector<unsigned char> px(static_cast<size_t>(w * h * comp));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<unsigned char>(i * 29 + 7);
  std::string out;
  if (stbi_write_png_to_func(append_bytes, &out, w, h, comp, px.data(), w * comp) == 0) std::abort();
  return out;
}

std::string jpeg(int w, int h, int comp) {
  std::vector<unsigned char> px(static_cast<size_t>(w * h * comp));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<unsigned char>(i * 13);
  std::string out;
  if (stbi_write_jpg_to_func(append_bytes, &out, w, h, comp, px.data(), 90) == 0) std::abort();
  return out;
}

void image_seeds() {
  // byte 0: bit 0 channels 3, bits 1-2 reader (0 keep size, 1 resize, 2 folder, 3 both), bits 3-4
  // folder channels, bit 5 folder resize, bit 6 nearest; bytes 1, 2: resize height, width - 1.
  seed("image", "gray_png", std::string{'\x00', '\x02', '\x03'} + png(4, 3, 1));
  seed("image", "rgb_png_resized", std::string{'\x03', '\x07', '\x04'} + png(5, 5, 3));
  seed("image", "rgba_png_folder", std::string{'\x35', '\x01', '\x01'} + png(2, 2, 4));
  seed("image", "gray_alpha_png_both", std::string{'\x06', '\x03', '\x03'} + png(3, 2, 2));
  seed("image", "rgb_jpeg", std::string{'\x01', '\x00', '\x00'} + jpeg(8, 8, 3));
  seed("image", "gray_jpeg_folder", std::string{'\x64', '\x05', '\x05'} + jpeg(9, 7, 1));
}

// ---- attention specs (3 option bytes, then the spec) -----------------------------------------

void attention_seeds() {
  const char* specs[] = {"softmax",
                         "softmax:dropout=0.1",
                         "performer:features=8,redraw=2,chunk=2",
                         "performer:feature_map=relu,orthogonal=0",
                         "performer:feature_map=trf,features=4",
                         "ra:samples=2",
                         "ra:samples=3,biased=1",
                         "lara:samples=3,proposal=mixed",
                         "lara:adaptive=1,noise=0.5,beta=2",
                         "nprf_rpe:features=4,max_len=8,dense=1",
                         "nprf_rpe:dense=auto,redraw=0"};
  int k = 0;
  for (const char* s : specs) {
    // Alternate the use (self, causal, cross) and eval mode; always run the forward (bit 2).
    const char flags = static_cast<char>((k % 3) | 4 | (k % 2 ? 8 : 0));
    seed("attention_spec", "spec" + std::to_string(k++), std::string{'\x01', '\x03', flags} + s);
  }
}

// ---- checkpoints (model, training file, extra file; tiny_model.h) ------------------------------

void checkpoint_seeds() {
  const fs::path dir = fuzz::scratch_dir() / "checkpoint";
  for (bool with_file : {false, true}) {
    manual_seed(1);
    fuzz::TinyModel model;
    std::unique_ptr<nn::AdamW> opt = fuzz::tiny_optimizer(model);
    const Tensor loss = mean(mul(matmul(randn({4, 2}), model.w.t()), add(model.b, 1.0)));
    loss.backward();
    opt->step();
    nn::TrainState st;
    st.step = 1;
    st.extra["schedule"] = "cosine";
    if (with_file) st.files["config.json"] = "{\"format\": \"fuzz\"}\n";
    fs::remove_all(dir);
    nn::save_checkpoint(dir.string(), model, *opt, st);
    std::string input =
        fdp_string(read_file(dir / "model.safetensors")) + fdp_string(read_file(dir / "training.safetensors"));
    // The extra file's bytes, then the last byte: which name it gets (1: config.json).
    input += with_file ? st.files["config.json"] + '\x01' : std::string(1, '\0');
    seed("checkpoint", with_file ? "with_config" : "plain", input);
  }
}

// ---- the apps' files (byte 0: which reader) -----------------------------------------------------

void app_data_seeds() {
  const std::string translate_manifest =
      R"({"format": "linea-translate-data", "version": 1, "src_lang": "en", "tgt_lang": "es",)"
      R"( "files": {"train": {"src": "train.src", "tgt": "train.tgt", "ref": "train.ref", "pairs": 2}},)"
      R"( "vocab": {"mode": "joint", "src_model": "spm.model", "tgt_model": "spm.model"}})";
  seed("app_data", "translate",
       std::string(1, '\0') + fdp_string(translate_manifest) + fdp_string("In the beginning\nAnd God said\n") +
           fdp_string("En el principio\nY dijo Dios\n") + fdp_string("Gen.1.1\nGen.1.3\n") + '\0');
  const std::string protein_manifest =
      R"({"format": "linea-protein-data/1", "files": {"train": "train.fasta", "valid": "train.fasta",)"
      R"( "test": "train.fasta"}})";
  seed("app_data", "protein",
       std::string(1, '\1') + fdp_string(protein_manifest) + ">a\nMKTAYIAKQR\n>b desc\nACDEFGHIKLMNPQRSTVWY\n");
  seed("app_data", "metrics",
       std::string(1, '\2') +
           "{\"type\": \"step\", \"step\": 1, \"loss\": 2.5}\n{\"type\": \"epoch\", \"epoch\": 1, \"step\": 4}\n"
           "{\"note\": \"no step\"}\n[1, 2]\n{\"type\": \"step\", \"step\": 9, \"lo" +
           '\x04');
  seed("app_data", "config",
       std::string(1, '\3') + R"({"format": "fuzz-checkpoint/1", "model": {"dim": 8, "heads": 2}, "seed": 0})");
}

// ---- text (byte 0: which parser) ---------------------------------------------------------------

void text_seeds() {
  seed("text", "bleu_line",
       std::string(1, '\0') + "Hello, world! It's 3.5% (approx.) &amp; \"quoted\" -- end\t \xc2\xa0");
  seed("text", "bleu_corpus",
       std::string("\x01") +
           "the cat sat\nthe cat sat on the mat\nhello there\nhello\n\xc3\xa9t\xc3\xa9\n\xc3\xa9t\xc3\xa9\n");
  seed("text", "bible_text", "\x02  H\xc3\xa9llo\xc2\xa0 w\xc3\xb6rld\xe3\x80\x80 \n\t end ");
  seed("text", "reference", std::string("\x03\x01") + "3John.1.15");
  seed("text", "reference2", std::string("\x03\x08") + "Gen.1.1");
  seed("text", "protein_tokens", "\x04MKT<mask>LL<mask>A <cls>ACDEFGHIKLMNPQRSTVWY<eos>");
}

#ifdef LINEA_FUZZ_APPS
// Sentences for SentencePiece's trainer.
class Sentences : public sentencepiece::SentenceIterator {
 public:
  explicit Sentences(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

// Models as train_tokenizer makes them (same special ids), but with the identity normalizer:
// the default one carries a 237 KB character map, far over the target's input size.
void tokenizer_seeds() {
  const std::vector<std::string> text = {"In the beginning God created the heavens and the earth.",
                                         "The earth was formless and empty.",
                                         "Darkness was on the surface of the deep.",
                                         "God said, Let there be light, and there was light.",
                                         "En el principio creo Dios los cielos y la tierra.",
                                         "Y la tierra estaba desordenada y vacia."};
  for (const char* type : {"unigram", "bpe"}) {
    Sentences it(text);
    const std::unordered_map<std::string, std::string> args = {{"model_type", type},
                                                               {"vocab_size", "50"},
                                                               {"character_coverage", "1.0"},
                                                               {"normalization_rule_name", "identity"},
                                                               {"pad_id", std::to_string(translate::kPadId)},
                                                               {"unk_id", std::to_string(translate::kUnkId)},
                                                               {"bos_id", std::to_string(translate::kBosId)},
                                                               {"eos_id", std::to_string(translate::kEosId)},
                                                               {"num_threads", "1"},
                                                               {"minloglevel", "2"}};
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    if (!status.ok()) LINEA_FAIL("SentencePiece training: ", status.ToString());
    translate::Tokenizer::from_bytes(model);  // loads as the app loads it
    seed("tokenizer", type, fdp_string("And God saw the light, que era buena.") + model);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds OUT (writes OUT/<target>/<seed>)\n";
    return 2;
  }
  try {
    g_out = argv[1];
    safetensors_seeds();
    idx_seeds();
    fasta_seeds();
    image_seeds();
    attention_seeds();
    checkpoint_seeds();
    app_data_seeds();
    text_seeds();
#ifdef LINEA_FUZZ_APPS
    tokenizer_seeds();
#endif
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
