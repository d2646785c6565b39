// linea-attn: runs one of Linea's attention mechanisms on per-head tensors read from a
// safetensors file and writes its output, its gradients and the random quantities it used, so a
// user can check Linea against their own implementation of the same formulas
// (apps/tools/check_linea_attn.py does that with PyTorch; usage in apps/tools/README.md).
//
//   linea-attn --spec SPEC --in IN.safetensors --out OUT.safetensors [--causal] [--eval] [--device cpu|cuda|auto]
//
// IN holds q [B,H,N,D], k [B,H,M,D], v [B,H,M,Dv] (F32 or F64, one dtype: the computation runs in
// it) and optionally dout [B,H,N,Dv], key_padding_mask (I64/U8/BOOL [B,M], nonzero = padding),
// the random quantities omega / eps / ra_index (shapes in attention/mechanism.h; floats are converted to
// the computation's dtype) and rpe [H, 2L-1] (nprf_rpe's relative-position bias). Any other name
// is an error, as is a random quantity the spec does not draw or an rpe for a spec without one.
// OUT holds out [B,H,N,Dv]; with dout also dq, dk, dv (= d<out . dout>/d{q,k,v}) and drpe; the
// random quantities the run used (last_samples(), given or drawn), so a run can be replayed; and
// metadata: the spec as built, mode, causal, device, dtype. With every random quantity given the
// output is a deterministic function of the inputs.
// Errors print "linea-attn: <message>" on stderr and exit with status 1.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "apps/common/device.h"
#include "linea.h"
#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "nn/safetensors.h"

using namespace linea;

namespace {

const std::vector<std::string> kRequired = {"q", "k", "v"};
const std::vector<std::string> kOptional = {"dout", "key_padding_mask", "omega", "eps", "ra_index", "rpe"};
const std::vector<std::string> kSamples = {"omega", "eps", "ra_index"};  // AttentionSamples names

struct Args {
  std::string spec, in, out, device = "cpu";
  bool causal = false, eval = false;
};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

const char* st_dtype(DType dt) { return dt == DType::Float32 ? "F32" : dt == DType::Float64 ? "F64" : "I64"; }

// rpe [H, 2L-1] -> L, checking that it covers every offset j - i of an N x M attention.
int64_t rpe_length(const Tensor& rpe, int64_t H, int64_t N, int64_t M) {
  LINEA_CHECK(rpe.dim() == 2 && rpe.size(0) == H && rpe.size(1) % 2 == 1, "rpe must be [H, 2L-1] = [", H,
              ", odd], got ", shape_str(rpe.shape()));
  const int64_t L = (rpe.size(1) + 1) / 2;
  LINEA_CHECK(L >= std::max(N, M), "rpe ", shape_str(rpe.shape()),
              " is too short: it holds offsets up to L-1 = ", L - 1, " but N = ", N, ", M = ", M,
              " needs L >= max(N, M) = ", std::max(N, M));
  return L;
}

// The first NaN or Inf of a floating tensor as "<what> holds nan at [b, h, n, d]", or "".
std::string first_nonfinite(const std::string& what, const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype())) return "";
  const std::vector<double> v = t.to(kCPU).to_vector<double>();
  const auto it = std::find_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); });
  if (it == v.end()) return "";
  int64_t flat = it - v.begin();
  std::vector<int64_t> index(t.dim());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    index[d] = flat % t.size(d);
    flat /= t.size(d);
  }
  std::string at;
  for (int64_t i : index) at += (at.empty() ? "" : ", ") + std::to_string(i);
  return what + " holds " +
         (std::isnan(*it) ? "nan"
          : *it > 0       ? "inf"
                          : "-inf") +
         " at [" + at + "] of " + shape_str(t.shape());
}

int run(const Args& a) {
  const Device device = apps::resolve_device("", a.device);  // errors get our prefix in main
  nn::SafetensorsFile file = nn::load_safetensors(a.in);  // on the CPU; moved below
  nn::StateDict& in = file.tensors;
  for (auto& [name, _] : in)
    LINEA_CHECK(contains(kRequired, name) || contains(kOptional, name), a.in, ": unknown tensor '", name,
                "' (expected ", join(kRequired), " and optionally ", join(kOptional), ")");
  for (auto& name : kRequired)
    LINEA_CHECK(in.count(name), a.in, ": missing tensor '", name, "' (q, k, v are required)");
  for (auto& [name, t] : in) {  // NaN/Inf would flow silently into every output
    const std::string bad = first_nonfinite(name, t);
    LINEA_CHECK(bad.empty(), a.in, ": ", bad, " (inputs must be finite)");
  }
  auto get = [&](const std::string& name) { return in.count(name) ? in.at(name) : Tensor(); };

  // ---- inputs: q, k, v, dout in one float dtype; the mask; shapes -------------------------------
  Tensor q = get("q"), k = get("k"), v = get("v"), dout = get("dout"), mask = get("key_padding_mask");
  const DType dt = q.dtype();
  LINEA_CHECK(is_floating(dt), a.in, ": q must be F32 or F64, got ", dtype_name(dt));
  for (auto& [name, t] : {std::pair<const char*, Tensor>{"k", k}, {"v", v}, {"dout", dout}})
    LINEA_CHECK(!t.defined() || t.dtype() == dt, a.in, ": ", name, " is ", dtype_name(t.dtype()), " but q is ",
                dtype_name(dt), " (q, k, v and dout must share one dtype, F32 or F64)");
  attn::AttentionOptions opts;
  opts.causal = a.causal;
  opts.key_padding_mask = mask;
  attn::check_attention_inputs(a.in, q, k, v, opts);  // shapes, and the mask as Int64/Bool [B, M]
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), M = k.size(2), Dv = v.size(3);
  LINEA_CHECK(!dout.defined() || dout.shape() == Shape({B, H, N, Dv}), a.in,
              ": dout must be [B, H, N, Dv] = ", shape_str({B, H, N, Dv}), ", got ", shape_str(dout.shape()));
  Tensor rpe = get("rpe");
  if (rpe.defined())
    LINEA_CHECK(is_floating(rpe.dtype()), a.in, ": rpe must be F32 or F64, got ", dtype_name(rpe.dtype()));

  // ---- the mechanism --------------------------------------------------------------------------
  // A mechanism built for a longest sequence (its length option: nprf_rpe's bias table) gets L of
  // the given rpe; without rpe, any L >= max(N, M) computes the same (the bias starts at zero), so
  // the smallest is used.
  const attn::AttentionSpec spec = attn::AttentionSpec::parse(a.spec);
  const std::string length_key = attn::attention_info(spec.name).length_option;
  const int64_t L = length_key.empty() ? 0 : rpe.defined() ? rpe_length(rpe, H, N, M) : std::max(N, M);
  if (!length_key.empty() && spec.options.count(length_key))
    LINEA_CHECK(!rpe.defined() || spec.get_int(length_key, -1) == L, "spec '", a.spec, "' names ", length_key, "=",
                spec.options.at(length_key), " but rpe ", shape_str(rpe.shape()), " has L = ", L, " (drop ", length_key,
                " from the spec, or make them agree)");
  const std::string built_spec = length_key.empty() ? a.spec : attn::with_length(a.spec, L);
  std::shared_ptr<attn::AttentionMechanism> mech = attn::make_attention(built_spec, H, D);
  mech->to(device);
  mech->to(dt);  // parameters (rpe) in the computation's dtype
  mech->train(!a.eval);

  Tensor rpe_param;
  for (auto& [name, p] : mech->named_parameters())
    if (name == "rpe") rpe_param = p;
  if (rpe.defined()) {
    LINEA_CHECK(rpe_param.defined(), "rpe given, but spec '", a.spec,
                "' has no 'rpe' parameter (only nprf_rpe has one)");
    rpe_length(rpe, H, N, M);
    mech->load_state_dict({{"rpe", rpe}}, /*strict=*/false);  // checks the shape, converts dtype/device
  }

  const std::vector<std::string> draws = mech->sample_names();
  attn::AttentionSamples given;
  for (auto& name : kSamples) {
    Tensor t = get(name);
    if (!t.defined()) continue;
    LINEA_CHECK(contains(draws, name), "'", name, "' given, but spec '", a.spec, "' does not draw it (",
                draws.empty() ? "it draws no random quantities" : "it draws: " + join(draws), ")");
    if (name == "ra_index")
      LINEA_CHECK(t.dtype() == DType::Int64, a.in, ": ra_index must be I64, got ", dtype_name(t.dtype()));
    else
      LINEA_CHECK(is_floating(t.dtype()), a.in, ": ", name, " must be F32 or F64, got ", dtype_name(t.dtype()));
    given[name] = t.to(device);
  }
  mech->set_samples(given);  // shapes are checked by the mechanism at the forward
  if (auto sm = std::dynamic_pointer_cast<attn::SoftmaxAttention>(mech); sm && sm->dropout() > 0 && !a.eval)
    std::cerr << "linea-attn: note: softmax dropout in train mode is random and cannot be replayed (use --eval)\n";

  // ---- forward (and backward) -----------------------------------------------------------------
  const bool grads = dout.defined();
  q = q.to(device);
  k = k.to(device);
  v = v.to(device);
  if (grads) {
    q.requires_grad_(true);
    k.requires_grad_(true);
    v.requires_grad_(true);
  }
  if (mask.defined()) opts.key_padding_mask = mask.to(device);
  nn::StateDict result;
  {
    std::unique_ptr<NoGradGuard> no_grad(grads ? nullptr : new NoGradGuard());
    Tensor out = mech->forward(q, k, v, opts);
    LINEA_CHECK(out.shape() == Shape({B, H, N, Dv}), "internal: ", mech->type_name(), " returned ",
                shape_str(out.shape()), ", expected ", shape_str({B, H, N, Dv}));
    result["out"] = out.detach();
    if (grads) {
      out.backward(dout.to(device));
      auto grad_or_zeros = [](const Tensor& x) { return x.grad().defined() ? x.grad() : zeros_like(x.detach()); };
      result["dq"] = grad_or_zeros(q);
      result["dk"] = grad_or_zeros(k);
      result["dv"] = grad_or_zeros(v);
      if (rpe_param.defined()) result["drpe"] = grad_or_zeros(rpe_param);
    }
  }
  for (auto& [name, t] : mech->last_samples()) result[name] = t;
  for (auto& [name, t] : result) {  // finite inputs, yet an overflow: say so rather than write it
    const std::string bad = first_nonfinite(name, t);
    LINEA_CHECK(bad.empty(), built_spec, " computed non-finite values from the finite inputs of ", a.in, ": ", bad,
                " (do q and k overflow float32 in the scores?)");
  }

  nn::Metadata meta;
  meta["tool"] = "linea-attn";
  meta["spec"] = built_spec;  // as built: nprf_rpe with its max_len
  meta["mode"] = a.eval ? "eval" : "train";
  meta["causal"] = a.causal ? "1" : "0";
  meta["device"] = device.str();
  meta["dtype"] = st_dtype(dt);
  nn::save_safetensors(a.out, result, meta);

  std::vector<std::string> written;
  for (auto& [name, _] : result) written.push_back(name);
  std::cout << "linea-attn: " << built_spec << " (" << meta["mode"] << (a.causal ? ", causal" : "") << ", "
            << device.str() << ", " << dtype_name(dt) << ") q " << shape_str(q.shape()) << " k " << shape_str(k.shape())
            << " v " << shape_str(v.shape()) << " -> " << a.out << ": " << join(written) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Runs one Linea attention mechanism on q/k/v from a safetensors file and writes out (and dq, dk, dv, drpe "
      "when dout is given) plus the random quantities it used.",
      "linea-attn"};
  Args a;
  // --list alone prints the registered mechanisms, their support and options (attention/registry.h).
  CLI::Option* list = app.add_flag("--list", "print every mechanism with what it supports and its options, and exit");
  app.add_option("--spec", a.spec, "attention spec: " + attn::attention_flag_help(attn::AttentionUse::Self));
  app.add_option("--in", a.in,
                 "input safetensors: q [B,H,N,D], k [B,H,M,D], v [B,H,M,Dv]; optional dout, key_padding_mask [B,M], "
                 "omega, eps, ra_index, rpe [H,2L-1]");
  app.add_option("--out", a.out, "output safetensors: out, dq, dk, dv, drpe, the samples used, metadata");
  app.add_flag("--causal", a.causal, "key m visible to query n iff m <= n");
  app.add_flag("--eval", a.eval, "eval mode (default: train mode)");
  app.add_option("--device", a.device, "cpu, cuda, cuda:N or auto (default cpu)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "linea-attn: " << e.what() << " (see --help)\n";
    return 1;
  }
  if (list->count() > 0) {
    std::cout << attn::describe_attentions();
    return 0;
  }
  for (const char* flag : {"--spec", "--in", "--out"})
    if (app.get_option(flag)->count() == 0) {
      std::cerr << "linea-attn: " << flag << " is required (see --help)\n";
      return 1;
    }
  try {
    return run(a);
  } catch (const std::exception& e) {  // linea::Error, and anything unexpected, the same way
    std::cerr << "linea-attn: " << e.what() << "\n";
    return 1;
  }
}
