// Tests of the linea-attn tool (apps/tools/linea_attn.cpp), run as a separate process on
// safetensors files written here: softmax out and gradients equal the in-process
// softmax_attention + backward (F64 and F32; causal, padded with U8 / I64 / BOOL masks,
// cross-attention); every other mechanism, run with all its random quantities given, is bitwise
// deterministic and equals the in-process mechanism with the same samples; a run without
// samples writes the ones it drew and replaying them reproduces it; bad inputs and flags exit
// with status 1 and a message naming the problem.
// The tool's path comes from CMake (LINEA_ATTN_TOOL).
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::TempDir;

struct ToolResult {
  int code;  // exit status; -1 when the process did not exit normally
  std::string out, err;
};

// Runs linea-attn with `args` (shell words), capturing stdout and stderr into the temp dir.
ToolResult run_tool(const TempDir& dir, const std::string& args) {
  const std::string so = dir.file("stdout.txt"), se = dir.file("stderr.txt");
  const std::string cmd = std::string("'") + LINEA_ATTN_TOOL + "' " + args + " >'" + so + "' 2>'" + se + "'";
  const int status = std::system(cmd.c_str());
  ToolResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, test::read_all(so), test::read_all(se)};
  return r;
}

std::string tool_args(const std::string& spec, const std::string& in, const std::string& out, bool causal = false,
                      bool eval = false) {
  return "--spec '" + spec + "' --in '" + in + "' --out '" + out + "'" + (causal ? " --causal" : "") +
         (eval ? " --eval" : "");
}

// Expects a failed run (status 1) whose stderr starts with "linea-attn: " and contains `what`.
void expect_error(const ToolResult& r, const std::string& what) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("linea-attn: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "stderr: " << r.err << "\nexpected: " << what;
}

// ---- inputs -------------------------------------------------------------------------------------
struct Problem {
  int64_t B = 2, H = 2, N = 5, M = 5, D = 4, Dv = 3;
  DType dtype = DType::Float64;
  bool causal = false, eval = false;
  // 0: no mask; 1: I64 mask; 2: BOOL mask; 3: U8 mask (a BOOL file entry renamed to U8)
  int mask_kind = 0;
};

struct Inputs {
  Tensor q, k, v, dout, mask;  // mask: Int64 [B, M] (or undefined)
};

Inputs make_inputs(const Problem& p, uint64_t seed) {
  manual_seed(seed);
  TensorOptions o(p.dtype);
  Inputs in;
  in.q = mul(randn({p.B, p.H, p.N, p.D}, o), 0.8);
  in.k = mul(randn({p.B, p.H, p.M, p.D}, o), 0.8);
  in.v = randn({p.B, p.H, p.M, p.Dv}, o);
  in.dout = randn({p.B, p.H, p.N, p.Dv}, o);
  if (p.mask_kind) {
    // batch 0: the last two keys padded; batch 1: the second key padded
    std::vector<int64_t> m(static_cast<size_t>(p.B * p.M), 0);
    m[p.M - 1] = m[p.M - 2] = 1;
    if (p.B > 1) m[p.M + 1] = 1;
    in.mask = from_vector<int64_t>(m, {p.B, p.M});
  }
  return in;
}

// Writes q, k, v, dout (unless !with_dout), the mask and `extra` to `path`.
void write_inputs(const std::string& path, const Problem& p, const Inputs& in, const nn::StateDict& extra = {},
                  bool with_dout = true) {
  nn::StateDict t = extra;
  t["q"] = in.q;
  t["k"] = in.k;
  t["v"] = in.v;
  if (with_dout) t["dout"] = in.dout;
  if (p.mask_kind == 1) t["key_padding_mask"] = in.mask;
  if (p.mask_kind >= 2) t["key_padding_mask"] = in.mask.to(DType::Bool);
  nn::save_safetensors(path, t);
  if (p.mask_kind == 3) {
    // Linea writes no U8; PyTorch's uint8 masks are U8 of the same one-byte layout as BOOL.
    std::string bytes = test::read_all(path);
    const std::string from = "\"dtype\":\"BOOL\"", to = "\"dtype\":\"U8\"  ";  // same length: valid JSON
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, from.size(), to);
    test::write_all(path, bytes);
  }
}

// In-process run: out and d{q,k,v} (and drpe when the mechanism has an "rpe" parameter).
nn::StateDict run_in_process(attn::AttentionMechanism& mech, const Problem& p, const Inputs& in) {
  Tensor q = in.q.detach(), k = in.k.detach(), v = in.v.detach();
  q.requires_grad_(true);
  k.requires_grad_(true);
  v.requires_grad_(true);
  attn::AttentionOptions o;
  o.causal = p.causal;
  o.key_padding_mask = in.mask;
  Tensor out = mech.forward(q, k, v, o);
  out.backward(in.dout);
  nn::StateDict r{{"out", out.detach()}, {"dq", q.grad()}, {"dk", k.grad()}, {"dv", v.grad()}};
  for (auto& [name, t] : mech.named_parameters())
    if (name == "rpe") r["drpe"] = t.grad();
  return r;
}

// The tolerance of "equal to the in-process computation": same code, same dtype, so only the
// last bits may differ (they do not, in practice).
double tol(DType dt) { return dt == DType::Float64 ? 1e-12 : 1e-6; }

void expect_matches(const nn::StateDict& got, const nn::StateDict& want, DType dt, const std::string& what) {
  for (auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no '" << name << "' in the tool's output";
    EXPECT_EQ(got.at(name).dtype(), dt) << what << ": " << name;
    EXPECT_TRUE(all_close(got.at(name), w, tol(dt), tol(dt))) << what << ": " << name;
  }
}

// ---- softmax ------------------------------------------------------------------------------------
void check_softmax(const Problem& p, const std::string& what) {
  SCOPED_TRACE(what);
  TempDir dir;
  Inputs in = make_inputs(p, 7);
  write_inputs(dir.file("in.safetensors"), p, in);
  ToolResult r =
      run_tool(dir, tool_args("softmax", dir.file("in.safetensors"), dir.file("out.safetensors"), p.causal, p.eval));
  ASSERT_EQ(r.code, 0) << r.err;

  nn::SafetensorsFile f = nn::load_safetensors(dir.file("out.safetensors"));
  auto mech = attn::make_attention("softmax", p.H, p.D);
  expect_matches(f.tensors, run_in_process(*mech, p, in), p.dtype, what);
  EXPECT_EQ(f.tensors.size(), 4u) << "softmax draws nothing: out, dq, dk, dv only";
  EXPECT_EQ(f.metadata["spec"], "softmax");
  EXPECT_EQ(f.metadata["mode"], p.eval ? "eval" : "train");
  EXPECT_EQ(f.metadata["causal"], p.causal ? "1" : "0");
  EXPECT_EQ(f.metadata["device"], "cpu");
  EXPECT_EQ(f.metadata["dtype"], p.dtype == DType::Float64 ? "F64" : "F32");
}

TEST(LineaAttnTool, SoftmaxEqualsInProcessF64) {
  Problem p;
  check_softmax(p, "bidirectional");
  p.causal = true;
  check_softmax(p, "causal");
  p.causal = false;
  p.M = 7;
  check_softmax(p, "cross-attention M != N");
  p.eval = true;
  check_softmax(p, "eval");
}

TEST(LineaAttnTool, SoftmaxEqualsInProcessF32) {
  Problem p;
  p.dtype = DType::Float32;
  check_softmax(p, "bidirectional");
  p.causal = true;
  p.mask_kind = 1;
  check_softmax(p, "causal + padded");
}

TEST(LineaAttnTool, SoftmaxPaddingMasks) {
  Problem p;
  p.mask_kind = 1;
  check_softmax(p, "I64 mask");
  p.mask_kind = 2;
  check_softmax(p, "BOOL mask");
  p.mask_kind = 3;
  check_softmax(p, "U8 mask");
  p.causal = true;
  check_softmax(p, "U8 mask, causal");
  p.causal = false;
  p.M = 6;
  check_softmax(p, "U8 mask, cross-attention");
}

TEST(LineaAttnTool, NoDoutWritesOnlyOut) {
  TempDir dir;
  Problem p;
  Inputs in = make_inputs(p, 3);
  write_inputs(dir.file("in.safetensors"), p, in, {}, /*with_dout=*/false);
  ToolResult r = run_tool(dir, tool_args("softmax", dir.file("in.safetensors"), dir.file("out.safetensors")));
  ASSERT_EQ(r.code, 0) << r.err;
  nn::SafetensorsFile f = nn::load_safetensors(dir.file("out.safetensors"));
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_TRUE(all_close(f.tensors.at("out"), attn::softmax_attention(in.q, in.k, in.v), 1e-12, 1e-12));
}

TEST(LineaAttnTool, HelpExitsZero) {
  TempDir dir;
  ToolResult r = run_tool(dir, "--help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--spec", "--in", "--out", "--causal", "--eval", "--device"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from --help:\n" << r.out;
}

// ---- the other mechanisms -----------------------------------------------------------------------
struct SpecCase {
  std::string spec;
  Problem p;
  std::string what;
};

Problem variant(int64_t N, int64_t M, bool causal, int mask_kind, bool eval, DType dtype = DType::Float64) {
  Problem p;
  p.N = N;
  p.M = M;
  p.causal = causal;
  p.mask_kind = mask_kind;
  p.eval = eval;
  p.dtype = dtype;
  return p;
}

// Every spec x variant: causal where supported (performer, nprf_rpe),
// padding, cross-attention (M != N) where supported (not ra, lara), eval, F64 and F32.
std::vector<SpecCase> spec_cases() {
  const DType f32 = DType::Float32;
  std::vector<SpecCase> cs;
  for (const char* s :
       {"performer:features=8", "performer:features=8,feature_map=relu", "performer:features=8,feature_map=trf"}) {
    cs.push_back({s, variant(5, 5, false, 0, false), "bidirectional"});
    cs.push_back({s, variant(5, 5, true, 0, false), "causal"});
    cs.push_back({s, variant(5, 7, false, 3, false), "padded (U8), cross"});
    cs.push_back({s, variant(5, 5, true, 1, false, f32), "causal, padded, F32"});
    cs.push_back({s, variant(5, 5, false, 0, true), "eval"});
  }
  for (const char* s : {"ra:samples=2", "ra:samples=2,biased=1"}) {
    cs.push_back({s, variant(5, 5, false, 0, false), "bidirectional"});
    cs.push_back({s, variant(5, 5, false, 1, false), "padded"});
    cs.push_back({s, variant(5, 5, false, 0, true, f32), "eval, F32"});
  }
  for (const char* s : {"lara:samples=3", "lara:samples=3,proposal=mixed"}) {
    cs.push_back({s, variant(7, 7, false, 0, false), "N % C != 0"});
    cs.push_back({s, variant(7, 7, false, 1, false), "padded"});
    cs.push_back({s, variant(2, 2, false, 0, false), "N <= C"});
    cs.push_back({s, variant(7, 7, false, 0, true, f32), "eval, F32"});
  }
  for (const char* s : {"nprf_rpe:features=8", "nprf_rpe:features=8,dense=1"}) {
    cs.push_back({s, variant(5, 5, false, 0, false), "bidirectional"});
    cs.push_back({s, variant(5, 5, true, 0, false), "causal"});
    cs.push_back({s, variant(5, 7, false, 1, false), "padded, cross"});
    cs.push_back({s, variant(5, 5, true, 3, false, f32), "causal, padded (U8), F32"});
  }
  return cs;
}

class LineaAttnSpec : public ::testing::TestWithParam<std::string> {};

// For each case: the in-process mechanism draws its samples (train or eval mode as the case
// says); the tool, given all of them (and a random rpe for nprf_rpe), must reproduce the
// in-process out and gradients, and two runs must write byte-identical files.
TEST_P(LineaAttnSpec, GivenSamplesDeterministicAndEqualInProcess) {
  const std::string name = GetParam();
  int ran = 0;
  for (const SpecCase& c : spec_cases()) {
    if (attn::AttentionSpec::parse(c.spec).name != name) continue;
    SCOPED_TRACE(c.spec + " / " + c.what);
    const Problem& p = c.p;
    const bool rpe = name == "nprf_rpe";
    const int64_t L = std::max(p.N, p.M) + 1;  // longer than needed: offsets beyond max(N, M) unused
    const std::string spec = rpe ? c.spec + ",max_len=" + std::to_string(L) : c.spec;
    auto mech = attn::make_attention(spec, p.H, p.D);
    mech->to(p.dtype);
    mech->train(!p.eval);
    Inputs in = make_inputs(p, 11 + ran);
    nn::StateDict extra;
    if (rpe) {
      extra["rpe"] = mul(randn({p.H, 2 * L - 1}, TensorOptions(p.dtype)), 0.5);
      mech->load_state_dict({{"rpe", extra["rpe"]}}, false);
    }
    attn::AttentionOptions o;
    o.causal = p.causal;
    o.key_padding_mask = in.mask;
    {
      NoGradGuard ng;
      mech->forward(in.q, in.k, in.v, o);  // draws the samples
    }
    attn::AttentionSamples samples = mech->last_samples();
    for (auto& [n, t] : samples) extra[n] = t;
    mech->set_samples(samples);
    nn::StateDict want = run_in_process(*mech, p, in);

    TempDir dir;
    write_inputs(dir.file("in.safetensors"), p, in, extra);
    for (const char* out : {"a.safetensors", "b.safetensors"}) {
      ToolResult r = run_tool(dir, tool_args(c.spec, dir.file("in.safetensors"), dir.file(out), p.causal, p.eval));
      ASSERT_EQ(r.code, 0) << r.err;
    }
    EXPECT_EQ(test::read_all(dir.file("a.safetensors")), test::read_all(dir.file("b.safetensors")))
        << "two runs with every sample given differ";
    nn::SafetensorsFile f = nn::load_safetensors(dir.file("a.safetensors"));
    expect_matches(f.tensors, want, p.dtype, c.spec + " / " + c.what);
    if (rpe) {
      EXPECT_TRUE(f.tensors.count("drpe"));
    }
    for (auto& [n, t] : samples) {  // the samples used are written back as given
      ASSERT_TRUE(f.tensors.count(n)) << n;
      const Tensor& got = f.tensors.at(n);
      EXPECT_TRUE(all_close(got, is_floating(got.dtype()) ? t.to(got.dtype()) : t, 0, 0)) << n;
    }
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

// A run without samples draws them and writes them; a second run given those reproduces the first.
TEST_P(LineaAttnSpec, DrawnSamplesAreWrittenAndReplay) {
  const std::string name = GetParam();
  int ran = 0;
  for (const SpecCase& c : spec_cases()) {
    if (attn::AttentionSpec::parse(c.spec).name != name || c.p.eval) continue;
    SCOPED_TRACE(c.spec + " / " + c.what);
    const Problem& p = c.p;
    auto mech =
        attn::make_attention(c.spec + (name == "nprf_rpe" ? ",max_len=" + std::to_string(std::max(p.N, p.M)) : ""), p.H, p.D);
    const std::vector<std::string> draws = mech->sample_names();
    ASSERT_FALSE(draws.empty()) << c.spec << " draws no random quantities";
    TempDir dir;
    Inputs in = make_inputs(p, 23 + ran);
    write_inputs(dir.file("in.safetensors"), p, in);
    ToolResult r = run_tool(dir, tool_args(c.spec, dir.file("in.safetensors"), dir.file("a.safetensors"), p.causal));
    ASSERT_EQ(r.code, 0) << r.err;
    nn::SafetensorsFile first = nn::load_safetensors(dir.file("a.safetensors"));
    nn::StateDict samples;
    for (auto& n : draws)
      if (first.tensors.count(n)) samples[n] = first.tensors.at(n);
    EXPECT_FALSE(samples.empty()) << "a train-mode run wrote none of its samples";
    write_inputs(dir.file("replay.safetensors"), p, in, samples);
    r = run_tool(dir, tool_args(c.spec, dir.file("replay.safetensors"), dir.file("b.safetensors"), p.causal));
    ASSERT_EQ(r.code, 0) << r.err;
    nn::SafetensorsFile second = nn::load_safetensors(dir.file("b.safetensors"));
    for (const char* t : {"out", "dq", "dk", "dv"})
      EXPECT_TRUE(all_close(second.tensors.at(t), first.tensors.at(t), 0, 0)) << t;
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, LineaAttnSpec, ::testing::Values("performer", "ra", "lara", "nprf_rpe"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---- errors -------------------------------------------------------------------------------------
struct LineaAttnErrors : ::testing::Test {
  TempDir dir;
  Problem p;
  Inputs in = make_inputs(p, 5);
  std::string in_path = dir.file("in.safetensors"), out_path = dir.file("out.safetensors");
  ToolResult run_with(const nn::StateDict& tensors, const std::string& spec = "softmax", const std::string& more = "") {
    nn::save_safetensors(in_path, tensors);
    return run_tool(dir, tool_args(spec, in_path, out_path) + more);
  }
  nn::StateDict qkv() const { return {{"q", in.q}, {"k", in.k}, {"v", in.v}}; }
};

TEST_F(LineaAttnErrors, MissingQ) {
  expect_error(run_with({{"k", in.k}, {"v", in.v}}), "missing tensor 'q'");
  EXPECT_FALSE(std::filesystem::exists(out_path)) << "no output on error";
}

TEST_F(LineaAttnErrors, MismatchedShapes) {
  nn::StateDict t = qkv();
  t["k"] = randn({p.B, p.H, p.M, p.D + 1}, TensorOptions(DType::Float64));
  expect_error(run_with(t), "shapes do not match");
  t = qkv();
  t["dout"] = randn({p.B, p.H, p.N, p.Dv + 1}, TensorOptions(DType::Float64));
  expect_error(run_with(t), "dout must be [B, H, N, Dv]");
  t = qkv();
  t["key_padding_mask"] = zeros({p.B, p.M + 1}, TensorOptions(DType::Int64));
  expect_error(run_with(t), "key_padding_mask must be [B, M]");
}

TEST_F(LineaAttnErrors, MixedDtypes) {
  nn::StateDict t = qkv();
  t["v"] = in.v.to(DType::Float32);
  expect_error(run_with(t), "must share one dtype");
  t = qkv();
  for (auto& [n, x] : t) x = x.to(DType::Int64);
  expect_error(run_with(t), "q must be F32 or F64");
}

TEST_F(LineaAttnErrors, UnknownSpec) {
  expect_error(run_with(qkv(), "sofmax"), "unknown attention 'sofmax'");
  expect_error(run_with(qkv(), "softmax:dropot=0.1"), "dropot");
}

TEST_F(LineaAttnErrors, UnknownTensorName) {
  nn::StateDict t = qkv();
  t["omgea"] = zeros({p.H, 4, p.D}, TensorOptions(DType::Float64));
  expect_error(run_with(t), "unknown tensor 'omgea'");
}

TEST_F(LineaAttnErrors, RpeTooShort) {
  nn::StateDict t = qkv();
  t["rpe"] = zeros({p.H, 2 * (p.N - 1) - 1}, TensorOptions(DType::Float64));  // L = N - 1
  expect_error(run_with(t, "nprf_rpe"), "too short");
  t["rpe"] = zeros({p.H, 2 * p.N}, TensorOptions(DType::Float64));  // even length
  expect_error(run_with(t, "nprf_rpe"), "rpe must be [H, 2L-1]");
  t["rpe"] = zeros({p.H, 2 * p.N - 1}, TensorOptions(DType::Float64));
  expect_error(run_with(t, "nprf_rpe:max_len=9"), "max_len=9");
}

TEST_F(LineaAttnErrors, SamplesAndRpeTheSpecDoesNotUse) {
  nn::StateDict t = qkv();
  t["omega"] = randn({p.H, 4, p.D}, TensorOptions(DType::Float64));
  expect_error(run_with(t), "'omega' given, but spec 'softmax' does not draw it");
  t = qkv();
  t["ra_index"] = zeros({p.B, p.H, p.N, 1}, TensorOptions(DType::Int64));
  expect_error(run_with(t), "'ra_index' given");
  t = qkv();
  t["rpe"] = zeros({p.H, 2 * p.N - 1}, TensorOptions(DType::Float64));
  expect_error(run_with(t), "no 'rpe' parameter");
}

TEST_F(LineaAttnErrors, BadFlagsAndFiles) {
  nn::save_safetensors(in_path, qkv());
  expect_error(run_tool(dir, tool_args("softmax", in_path, out_path) + " --device tpu"),
               "--device 'tpu' is not a device (expected cpu, cuda, cuda:N or auto)");
  expect_error(run_tool(dir, "--in '" + in_path + "' --out '" + out_path + "'"), "--spec");
  expect_error(run_tool(dir, tool_args("softmax", in_path, out_path) + " --frobnicate"), "frobnicate");
  expect_error(run_tool(dir, tool_args("softmax", dir.file("nope.safetensors"), out_path)), "nope.safetensors");
  test::write_all(dir.file("bad.safetensors"), "not a safetensors file");
  expect_error(run_tool(dir, tool_args("softmax", dir.file("bad.safetensors"), out_path)), "bad.safetensors");
  if (!cuda_available())
    expect_error(run_tool(dir, tool_args("softmax", in_path, out_path) + " --device cuda"), "no usable CUDA device");
}

// ---- CUDA ---------------------------------------------------------------------------------------
TEST(LineaAttnTool, CudaMatchesCpu) {
  LINEA_REQUIRE_CUDA();
  TempDir dir;
  Problem p;
  p.dtype = DType::Float32;
  p.mask_kind = 1;
  p.causal = true;
  Inputs in = make_inputs(p, 9);
  write_inputs(dir.file("in.safetensors"), p, in);
  for (const char* dev : {"cpu", "cuda"}) {
    ToolResult r =
        run_tool(dir, tool_args("softmax", dir.file("in.safetensors"), dir.file(std::string(dev) + ".st"), true) +
                          " --device " + dev);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  nn::SafetensorsFile c = nn::load_safetensors(dir.file("cpu.st")), g = nn::load_safetensors(dir.file("cuda.st"));
  EXPECT_EQ(g.metadata["device"], "cuda:0");
  for (const char* t : {"out", "dq", "dk", "dv"})
    EXPECT_TRUE(all_close(g.tensors.at(t), c.tensors.at(t), 1e-5, 1e-4)) << t;
}

}  // namespace
}  // namespace linea
