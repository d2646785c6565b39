// safetensors I/O: round trips of every dtype (0-d and empty tensors included), a file built
// byte by byte here (an independent writer) read back, the writer's exact bytes, rejection of
// truncated and corrupted files with named errors, and module state-dict round trips and
// load_state_dict errors. Not here: training checkpoints (test_checkpoint.cpp).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/safetensors.h"
#include "test_util.h"

using namespace linea;
using namespace linea::nn;
namespace fs = std::filesystem;
using linea::test::read_all;
using linea::test::TempDir;
using linea::test::write_all;

namespace {

// The independent writer: 8-byte little-endian length, the header text as given (padded with
// spaces to a multiple of 8 when `pad`), then `data` verbatim.
std::string hand_file(const std::string& header, const std::string& data, bool pad = true) {
  std::string h = header;
  if (pad)
    while (h.size() % 8 != 0) h += ' ';
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

template <typename T> std::string raw_bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(&s[0], v.data(), s.size());
  return s;
}

// Same dtype, shape and bitwise-identical elements.
::testing::AssertionResult same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << a.dtype() << " vs " << b.dtype();
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  Tensor ca = raw::contiguous(a.detach()), cb = raw::contiguous(b.detach());
  size_t n = static_cast<size_t>(a.numel()) * a.element_size();
  if (n && std::memcmp(ca.data_ptr(), cb.data_ptr(), n) != 0) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// A file with one F32 [2, 2] tensor "w" and one I64 [2] tensor "b", for the corruption tests.
std::string valid_file_bytes() {
  StateDict sd;
  sd["w"] = tensor<float>({1.f, 2.f, 3.f, 4.f}, {2, 2});
  sd["b"] = tensor<int64_t>({7, -8}, {2});
  return nn::detail::serialize_safetensors(sd, {{"note", "test"}});
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtypeWithMetadata) {
  TempDir dir;
  manual_seed(1);
  StateDict sd;
  sd["f32"] = randn({3, 4});
  sd["f64"] = randn({2, 5}, TensorOptions(DType::Float64));
  sd["i64"] = tensor<int64_t>({0, -1, 1LL << 40, INT64_MIN, INT64_MAX}, {5});
  sd["bool"] = from_vector<bool>({true, false, false, true, true, false}, {2, 3});
  sd["scalar"] = scalar_tensor(2.5, TensorOptions(DType::Float64));  // 0-d
  sd["empty"] = zeros({0, 3});                                       // no elements
  sd["empty_i64"] = zeros({4, 0}, TensorOptions(DType::Int64));
  sd["nested.name/with:chars"] = tensor<float>({-0.0f, 1e-30f}, {2});
  Tensor base = randn({4, 3});
  sd["transposed"] = base.transpose(0, 1);  // non-contiguous input is written row-major
  Metadata md{{"format", "pt"}, {"epoch", "3"}, {"utf8", "caf\xc3\xa9"}};

  std::string path = dir.file("all.safetensors");
  save_safetensors(path, sd, md);
  SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata, md);
  ASSERT_EQ(f.tensors.size(), sd.size());
  for (auto& [name, t] : sd) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(same_tensor(f.tensors[name], t)) << name;
    // (core's is_contiguous() answers false for some empty shapes such as [4, 0]; not ours to test.)
    if (t.numel() > 0) {
      EXPECT_TRUE(f.tensors[name].is_contiguous()) << name;
    }
    EXPECT_TRUE(f.tensors[name].is_cpu());
  }
  EXPECT_EQ(f.tensors["scalar"].dim(), 0);
  EXPECT_EQ(f.tensors["scalar"].item(), 2.5);
  EXPECT_EQ(f.tensors["empty"].shape(), (Shape{0, 3}));
}

TEST(Safetensors, NoMetadataAndEmptyDict) {
  TempDir dir;
  std::string path = dir.file("e.safetensors");
  save_safetensors(path, {});
  SafetensorsFile f = load_safetensors(path);
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
  // An empty dict without metadata is the 8-byte length and "{}" padded to 8.
  EXPECT_EQ(read_all(path), hand_file("{}", ""));
}

TEST(Safetensors, ReadsHandWrittenFile) {
  // Built byte by byte, without the writer under test: unpadded header, tensors stored in a
  // different order than their names, an F64 0-d tensor, BOOL bytes other than 0/1, and
  // the extra dtypes Linea converts on load (I32 -> Int64, F16/BF16 -> Float32).
  std::string data;
  std::vector<int64_t> b = {5, -6, 7};
  std::vector<float> w = {0.5f, -1.25f, 3.0f, 1e-7f};
  std::vector<double> s = {3.141592653589793};
  std::vector<int32_t> i32 = {-2, 2147483647};
  // 1, -2, 2^-24, +inf, 0, -0, NaN, 3 2^-16 (a subnormal of two bits)
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x0000, 0x8000, 0x7e00, 0x0300};
  std::vector<uint16_t> bf16 = {0x3f80, 0xbfc0};                 // 1, -1.5
  std::string bools = {'\0', '\1', '\2'};
  data += raw_bytes(b) + raw_bytes(w) + raw_bytes(s) + raw_bytes(i32) + raw_bytes(f16) + raw_bytes(bf16) + bools;
  std::string header = R"({"b":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},)"
                       R"("w":{"shape":[2,2],"dtype":"F32","data_offsets":[24,40]},)"
                       R"("s":{"dtype":"F64","shape":[],"data_offsets":[40,48]},)"
                       R"("i":{"dtype":"I32","shape":[2],"data_offsets":[48,56]},)"
                       R"("h":{"dtype":"F16","shape":[8],"data_offsets":[56,72]},)"
                       R"("bf":{"dtype":"BF16","shape":[1,2],"data_offsets":[72,76]},)"
                       R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[76,79]},)"
                       R"("z":{"dtype":"F32","shape":[0],"data_offsets":[76,76]},)"
                       R"("__metadata__":{"source":"hand"}})";
  TempDir dir;
  std::string path = dir.file("hand.safetensors");
  write_all(path, hand_file(header, data, /*pad=*/false));

  SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata, (Metadata{{"source", "hand"}}));
  ASSERT_EQ(f.tensors.size(), 8u);
  EXPECT_TRUE(same_tensor(f.tensors["b"], tensor<int64_t>({5, -6, 7}, {3})));
  EXPECT_TRUE(same_tensor(f.tensors["w"], tensor<float>({0.5f, -1.25f, 3.0f, 1e-7f}, {2, 2})));
  EXPECT_TRUE(same_tensor(f.tensors["s"], scalar_tensor(3.141592653589793, TensorOptions(DType::Float64))));
  EXPECT_TRUE(same_tensor(f.tensors["i"], tensor<int64_t>({-2, 2147483647}, {2})));
  EXPECT_TRUE(same_tensor(f.tensors["h"], tensor<float>({1.f, -2.f, 5.9604644775390625e-8f, INFINITY, 0.f, -0.f,
                                                         std::numeric_limits<float>::quiet_NaN(), 4.57763671875e-5f},
                                                        {8})));
  EXPECT_TRUE(same_tensor(f.tensors["bf"], tensor<float>({1.f, -1.5f}, {1, 2})));
  EXPECT_TRUE(same_tensor(f.tensors["m"], from_vector<bool>({false, true, true}, {3})));
  EXPECT_EQ(f.tensors["z"].shape(), Shape{0});  // empty, where "m" begins (and read after it: keys in name order)
}

TEST(Safetensors, WriterBytesMatchTheFormatExactly) {
  StateDict sd;
  sd["x"] = tensor<float>({1.0f, -2.0f}, {2});
  sd["a"] = tensor<float>({0.25f}, {1, 1});
  sd["n"] = tensor<int64_t>({258}, {1});  // 8-byte elements are written first
  Metadata md{{"k", "v"}};
  std::string expected_header = R"({"__metadata__":{"k":"v"},)"
                                R"("n":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                                R"("a":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]},)"
                                R"("x":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";
  std::string data = raw_bytes(std::vector<int64_t>{258}) + raw_bytes(std::vector<float>{0.25f}) +
                     raw_bytes(std::vector<float>{1.0f, -2.0f});
  std::string expected = hand_file(expected_header, data);
  // Header length: little-endian, and the header is padded with spaces to a multiple of 8.
  ASSERT_EQ(expected_header.size(), 190u);
  EXPECT_EQ(static_cast<unsigned char>(expected[0]), 192);
  EXPECT_EQ(expected.substr(1, 7), std::string(7, '\0'));
  EXPECT_EQ(expected.substr(8 + 190, 2), "  ");

  EXPECT_EQ(nn::detail::serialize_safetensors(sd, md), expected);
  TempDir dir;
  save_safetensors(dir.file("x.safetensors"), sd, md);
  EXPECT_EQ(read_all(dir.file("x.safetensors")), expected);
  // A literal byte check of a one-element file, independent of hand_file().
  StateDict one;
  one["t"] = tensor<float>({1.0f}, {});
  std::string bytes = nn::detail::serialize_safetensors(one, {});
  std::string js = R"({"t":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";  // 53 bytes -> 56
  ASSERT_EQ(bytes.size(), 8u + 56u + 4u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x38\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(bytes.substr(8, 56), js + "   ");
  EXPECT_EQ(bytes.substr(64), std::string("\x00\x00\x80\x3f", 4));  // 1.0f little-endian
}

TEST(Safetensors, RejectsTruncatedFiles) {
  std::string good = valid_file_bytes();
  TempDir dir;
  std::string path = dir.file("cut.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(good[i]);
  // Every cut point: in the length, in the header, in the data, one byte short.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    write_all(path, good.substr(0, cut));
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(good.size()));
    EXPECT_LINEA_ERROR(load_safetensors(path), path);
    EXPECT_LINEA_ERROR(load_safetensors(path), "truncated");
  }
  write_all(path, good.substr(0, 5));
  EXPECT_LINEA_ERROR(load_safetensors(path), "file is 5 bytes, too short for the 8-byte header length");
  write_all(path, good.substr(0, 8 + n / 2));
  EXPECT_LINEA_ERROR(load_safetensors(path), "header length " + std::to_string(n) + " exceeds the " +
                                                 std::to_string(n / 2) + " bytes after it");
  write_all(path, good.substr(0, good.size() - 3));
  EXPECT_LINEA_ERROR(load_safetensors(path),
                     "tensor 'w': data_offsets [16, 32] lie outside the data section of 29 bytes (truncated file?)");
  // The intact file loads.
  write_all(path, good);
  EXPECT_EQ(load_safetensors(path).tensors.size(), 2u);
}

TEST(Safetensors, RejectsCorruptedHeaders) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  auto expect_error = [&](const std::string& header, const std::string& data, const std::string& msg) {
    write_all(path, hand_file(header, data));
    EXPECT_LINEA_ERROR(load_safetensors(path), msg);
    EXPECT_LINEA_ERROR(load_safetensors(path), "load_safetensors: '" + path + "': ");
  };
  std::string d16(16, '\0');
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})", d16, "invalid JSON header");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})"
               "\xff",
               d16, "invalid JSON header");
  expect_error(R"([1, 2, 3])", "", "the JSON header must be an object, got array");
  expect_error(R"({"w":[1]})", "", "tensor 'w': entry must be an object, got array");
  expect_error(R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", d16, "tensor 'w': missing or non-string \"dtype\"");
  expect_error(
      R"({"w":{"dtype":"F17","shape":[2,2],"data_offsets":[0,16]}})", d16,
      "tensor 'w': unknown dtype 'F17' (supported: BOOL, U8, I8, I16, U16, I32, U32, I64, F16, BF16, F32, F64)");
  expect_error(R"({"w":{"dtype":"U64","shape":[2],"data_offsets":[0,16]}})", d16,
               "tensor 'w': dtype U64 is not supported by Linea");
  expect_error(R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", d16, "tensor 'w': missing \"shape\"");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", d16,
               "tensor 'w': \"shape\" [2,-2] is not an array of non-negative 64-bit integers");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2.5],"data_offsets":[0,16]}})", d16,
               "is not an array of non-negative");
  // No data is needed when a dim is 0, but a tensor's strides would overflow (tests/fuzz).
  expect_error(R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "",
               "tensor 'w': shape [0, 4294967296, 4294967296] is too large for a tensor");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2]}})", d16, "tensor 'w': missing or malformed \"data_offsets\"");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8,16]}})", d16, "malformed \"data_offsets\"");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":["0",16]}})", d16, "malformed \"data_offsets\"");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[-8,8]}})", d16, "malformed \"data_offsets\"");
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", d16,
               "tensor 'w': data_offsets [16, 0] end before they begin");
  expect_error(R"({"__metadata__":{"epoch":3}})", "", "\"__metadata__\" entry 'epoch' must be a string, got number");
  expect_error(
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      d16, "the JSON header names 'w' more than once");
  expect_error(R"({"__metadata__":"x"})", "", "\"__metadata__\" must be an object of strings, got string");
  // Huge shapes never overflow or allocate: they cannot fit in the data section.
  expect_error(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}})", d16,
               "tensor 'w': shape [4294967296, 4294967296, 4294967296] needs more bytes than the 16-byte data section");
  expect_error(R"({"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,16]}})", d16,
               "is not an array of non-negative 64-bit integers");

  // An absurd header length (as from a random or non-safetensors file).
  std::string big(16, '\0');
  big[5] = 1;  // 2^40
  write_all(path, big);
  EXPECT_LINEA_ERROR(load_safetensors(path), "header length 1099511627776 is larger than the 100000000-byte limit");
  // Missing file and a directory.
  EXPECT_LINEA_ERROR(load_safetensors(dir.file("nope.safetensors")), "load_safetensors: cannot open '");
  EXPECT_LINEA_ERROR(load_safetensors(dir.path.string()), "is a directory, not a file");
}

TEST(Safetensors, RejectsBadOffsetsAndDataLength) {
  TempDir dir;
  std::string path = dir.file("off.safetensors");
  auto expect_error = [&](const std::string& header, size_t data_bytes, const std::string& msg) {
    write_all(path, hand_file(header, std::string(data_bytes, '\x01')));
    EXPECT_LINEA_ERROR(load_safetensors(path), msg);
  };
  // Span does not match dtype x shape.
  expect_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12,
               "tensor 'w': data_offsets [0, 12] span 12 bytes, but dtype F32 and shape [2, 2] need 16");
  // Overlap.
  expect_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
  // Two tensors on the same bytes.
  expect_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
      8, "overlap");
  // Gap.
  expect_error(
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
      12, "gap of 4 bytes before tensor 'b' at offset 8");
  // Out of bounds.
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 12,
               "tensor 'a': data_offsets [8, 16] lie outside the data section of 12 bytes");
  // Data section longer than the tensors (trailing bytes).
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12,
               "the data section is 12 bytes, but the tensors in the header account for 8 (trailing bytes");
  // A data section with no tensors at all.
  expect_error(R"({})", 8, "the data section is 8 bytes, but the tensors in the header account for 0");
}

TEST(Safetensors, NeverCrashesOnMutatedFiles) {
  // Deterministic byte mutations of a valid file: each either loads or throws linea::Error.
  std::string good = valid_file_bytes();
  TempDir dir;
  std::string path = dir.file("fuzz.safetensors");
  int loaded = 0, rejected = 0;
  uint64_t state = 12345;
  for (int iter = 0; iter < 400; ++iter) {
    std::string bad = good;
    int flips = 1 + iter % 3;
    for (int k = 0; k < flips; ++k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      size_t pos = (state >> 33) % bad.size();
      bad[pos] = static_cast<char>((state >> 20) & 0xff);
    }
    write_all(path, bad);
    try {
      load_safetensors(path);
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 400);
  EXPECT_GT(rejected, 0);
}

TEST(Safetensors, SaveErrorsAndAtomicity) {
  TempDir dir;
  StateDict bad;
  bad["__metadata__"] = zeros({1});
  EXPECT_LINEA_ERROR(save_safetensors(dir.file("a.safetensors"), bad),
                     "save_safetensors: the tensor name \"__metadata__\" is reserved");
  StateDict undef;
  undef["x"] = Tensor();
  EXPECT_LINEA_ERROR(save_safetensors(dir.file("a.safetensors"), undef), "save_safetensors: tensor 'x' is undefined");
  StateDict badutf;
  badutf["x\xff"] = zeros({1});
  EXPECT_LINEA_ERROR(save_safetensors(dir.file("a.safetensors"), badutf), "not valid UTF-8");
  EXPECT_LINEA_ERROR(save_safetensors(dir.file("no/such/dir/a.safetensors"), {}),
                     "save_safetensors: cannot create '" + dir.file("no/such/dir/a.safetensors") + ".tmp.");

  // An existing file survives a failed write: block the temp path with a directory so the
  // write fails (works even as root, unlike permission bits).
  std::string path = dir.file("model.safetensors");
  StateDict v1;
  v1["w"] = tensor<float>({1.f, 2.f}, {2});
  save_safetensors(path, v1);
  std::string before = read_all(path);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  fs::create_directory(tmp);
  StateDict v2;
  v2["w"] = tensor<float>({3.f, 4.f, 5.f}, {3});
  EXPECT_LINEA_ERROR(save_safetensors(path, v2), "' was not modified");
  EXPECT_EQ(read_all(path), before);
  EXPECT_TRUE(same_tensor(load_safetensors(path).tensors["w"], v1["w"]));
  fs::remove(tmp);
  // The write goes through once the obstacle is gone, and leaves no temp file behind.
  save_safetensors(path, v2);
  EXPECT_TRUE(same_tensor(load_safetensors(path).tensors["w"], v2["w"]));
  EXPECT_FALSE(fs::exists(tmp));
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);
}

// ---- modules ---------------------------------------------------------------------------------

namespace {

class Inner : public Module {
 public:
  Inner() : Module("Inner") { scale = register_parameter("scale", randn({1})); }
  Tensor scale;
};

class TinyNet : public Module {
 public:
  TinyNet() : Module("TinyNet") {
    w = register_parameter("w", randn({3, 2}));
    b = register_parameter("b", randn({3}));
    steps = register_buffer("steps", tensor<int64_t>({4}, {1}));
    mask = register_buffer("mask", from_vector<bool>({true, false, true}, {3}));
    inner = register_module("inner", std::make_shared<Inner>());
  }
  Tensor forward(const Tensor& x) { return add(matmul(x, w.t()), b) * inner->scale; }
  Tensor w, b, steps, mask;
  std::shared_ptr<Inner> inner;
};

}  // namespace

TEST(Safetensors, ModuleStateDictRoundTrip) {
  TempDir dir;
  manual_seed(3);
  auto a = std::make_shared<TinyNet>();
  raw::fill_(a->steps, 17.0);
  std::string path = dir.file("tiny.safetensors");
  save_module(path, *a, {{"arch", "TinyNet"}});

  manual_seed(4);  // a fresh module with other values
  auto b = std::make_shared<TinyNet>();
  ASSERT_FALSE(same_tensor(a->w, b->w));
  Tensor w_handle = b->w;
  Metadata md = load_module(path, *b);
  EXPECT_EQ(md.at("arch"), "TinyNet");
  StateDict sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), 5u);
  for (auto& [name, t] : sa) EXPECT_TRUE(same_tensor(sb.at(name), t)) << name;
  // Values were copied into the module's own tensors: the handles it holds see them.
  EXPECT_TRUE(w_handle.same(b->w));
  EXPECT_TRUE(same_tensor(w_handle, a->w));
  EXPECT_TRUE(b->w.requires_grad());
  Tensor x = randn({2, 2});
  EXPECT_TRUE(same_tensor(a->forward(x), b->forward(x)));
}

TEST(Safetensors, LoadStateDictErrorsListEveryBadKey) {
  TempDir dir;
  manual_seed(5);
  auto net = std::make_shared<TinyNet>();
  StateDict sd = net->state_dict();
  sd.erase("inner.scale");
  sd.erase("b");
  sd["extra"] = zeros({1});
  sd["w"] = zeros({2, 3});
  std::string path = dir.file("bad_keys.safetensors");
  save_safetensors(path, sd);
  auto fresh = std::make_shared<TinyNet>();
  StateDict before = fresh->state_dict();
  std::string expected =
      "load_module: '" + path +
      "': load_state_dict (TinyNet): missing keys: b, inner.scale; unexpected keys: extra; shape mismatch: w "
      "(expected [3, 2], got [2, 3]);";
  try {
    load_module(path, *fresh);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
  // Nothing was modified by the failed load.
  for (auto& [name, t] : fresh->state_dict()) EXPECT_TRUE(same_tensor(t, before.at(name))) << name;
  // Non-strict loads ignore missing/unexpected keys but never a mis-shaped one.
  EXPECT_LINEA_ERROR(load_module(path, *fresh, /*strict=*/false), "shape mismatch: w (expected [3, 2], got [2, 3])");
  sd["w"] = ones({3, 2});
  save_safetensors(path, sd);
  load_module(path, *fresh, /*strict=*/false);
  EXPECT_TRUE(same_tensor(fresh->w, ones({3, 2})));
  EXPECT_TRUE(same_tensor(fresh->b, before.at("b")));
}

TEST(Safetensors, LoadsOntoCudaWhenAvailable) {
  LINEA_REQUIRE_CUDA();
  TempDir dir;
  StateDict sd;
  sd["w"] = tensor<float>({1.f, 2.f, 3.f}, {3});
  sd["m"] = from_vector<bool>({true, false}, {2});
  std::string path = dir.file("cuda.safetensors");
  save_safetensors(path, sd);
  SafetensorsFile f = load_safetensors(path, Device("cuda"));
  EXPECT_TRUE(f.tensors["w"].is_cuda());
  EXPECT_TRUE(same_tensor(f.tensors["w"].to(kCPU), sd["w"]));
  EXPECT_TRUE(same_tensor(f.tensors["m"].to(kCPU), sd["m"]));
  // Saving CUDA tensors writes their values.
  save_safetensors(path, f.tensors);
  EXPECT_TRUE(same_tensor(load_safetensors(path).tensors["w"], sd["w"]));
}
