// Attention specs, the mechanism registry, softmax attention and MultiHeadAttention (see
// attention.h). Masks are built with non-differentiable raw ops (they are Bool/Int64); the
// attention itself is composed from differentiable ops, so its backward follows their rules.
#include "nn/attention.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <mutex>

namespace linea::nn {

// ---- AttentionSpec ----------------------------------------------------------------------------
namespace {
std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool valid_token(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' || c == '-')) return false;
  return true;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}
}  // namespace

AttentionSpec AttentionSpec::parse(const std::string& spec_in) {
  const std::string spec = trim(spec_in);
  LINEA_CHECK(!spec.empty(), "attention spec: empty spec (expected e.g. 'softmax' or 'performer:features=128')");
  AttentionSpec out;
  const size_t colon = spec.find(':');
  out.name = trim(spec.substr(0, colon));
  LINEA_CHECK(!out.name.empty(), "attention spec '", spec, "': missing mechanism name before ':'");
  LINEA_CHECK(valid_token(out.name), "attention spec '", spec, "': invalid mechanism name '", out.name,
              "' (letters, digits, '_', '.', '+', '-')");
  if (colon == std::string::npos) return out;
  const std::string rest = spec.substr(colon + 1);
  LINEA_CHECK(!trim(rest).empty(), "attention spec '", spec, "': no options after ':' (expected key=value,...)");
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    const std::string item = trim(rest.substr(start, comma - start));
    LINEA_CHECK(!item.empty(), "attention spec '", spec, "': empty option (stray ',')");
    const size_t eq = item.find('=');
    LINEA_CHECK(eq != std::string::npos, "attention spec '", spec, "': option '", item,
                "' has no value (expected key=value)");
    const std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    LINEA_CHECK(!key.empty(), "attention spec '", spec, "': option '", item, "' has an empty key");
    LINEA_CHECK(valid_token(key), "attention spec '", spec, "': invalid option name '", key, "'");
    LINEA_CHECK(!value.empty(), "attention spec '", spec, "': option '", key, "' has an empty value");
    LINEA_CHECK(valid_token(value), "attention spec '", spec, "': invalid value '", value, "' for option '", key, "'");
    LINEA_CHECK(out.options.count(key) == 0, "attention spec '", spec, "': option '", key, "' given twice");
    out.options[key] = value;
    start = comma + 1;
  }
  return out;
}

std::string AttentionSpec::str() const {
  std::string s = name;
  bool first = true;
  for (auto& [k, v] : options) {
    s += (first ? ":" : ",") + k + "=" + v;
    first = false;
  }
  return s;
}

const std::string* AttentionSpec::lookup(const std::string& key) const {
  known_.insert(key);
  auto it = options.find(key);
  return it == options.end() ? nullptr : &it->second;
}

bool AttentionSpec::has(const std::string& key) const { return lookup(key) != nullptr; }

int64_t AttentionSpec::get_int(const std::string& key, int64_t def) const {
  const std::string* v = lookup(key);
  if (!v) return def;
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LINEA_CHECK(used == v->size() && used > 0, "attention spec '", str(), "': option '", key,
              "' expects an integer, got '", *v, "'");
  return static_cast<int64_t>(x);
}

double AttentionSpec::get_double(const std::string& key, double def) const {
  const std::string* v = lookup(key);
  if (!v) return def;
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LINEA_CHECK(used == v->size() && used > 0 && std::isfinite(x), "attention spec '", str(), "': option '", key,
              "' expects a number, got '", *v, "'");
  return x;
}

bool AttentionSpec::get_bool(const std::string& key, bool def) const {
  const std::string* v = lookup(key);
  if (!v) return def;
  std::string s = *v;
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  LINEA_FAIL("attention spec '", str(), "': option '", key, "' expects a boolean (1/0, true/false), got '", *v, "'");
}

std::string AttentionSpec::get_string(const std::string& key, const std::string& def) const {
  const std::string* v = lookup(key);
  return v ? *v : def;
}

void AttentionSpec::check_all_used() const {
  std::vector<std::string> unknown;
  for (auto& [k, _] : options)
    if (!known_.count(k)) unknown.push_back(k);
  if (unknown.empty()) return;
  const std::vector<std::string> known(known_.begin(), known_.end());
  LINEA_FAIL("attention spec '", str(), "': unknown option", unknown.size() > 1 ? "s " : " ", join(unknown), " for '",
             name, "' (", known.empty() ? "it takes no options" : "known options: " + join(known), ")");
}

// ---- registry ---------------------------------------------------------------------------------
namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, AttentionFactory> factories;
  Registry() {
    // Built-in mechanisms. (Mechanisms living in other object files register here too, by
    // calling their registration function, so that the static library links them in.)
    factories["softmax"] = [](const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
      return std::make_shared<SoftmaxAttention>(heads, head_dim, spec.get_double("dropout", 0.0));
    };
    detail::register_builtin_attentions(factories);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_attention(const std::string& name, AttentionFactory factory) {
  LINEA_CHECK(valid_token(name), "register_attention: invalid name '", name, "'");
  LINEA_CHECK(factory != nullptr, "register_attention: empty factory for '", name, "'");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  LINEA_CHECK(r.factories.count(name) == 0, "register_attention: '", name, "' is already registered");
  r.factories[name] = std::move(factory);
}

std::vector<std::string> registered_attentions() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (auto& [n, _] : r.factories) names.push_back(n);
  return names;
}

std::shared_ptr<AttentionKernel> make_attention(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  LINEA_CHECK(heads > 0 && head_dim > 0, "make_attention('", spec.str(),
              "'): heads and head_dim must be positive, got ", heads, " and ", head_dim);
  AttentionFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(spec.name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) LINEA_FAIL("unknown attention '", spec.name, "' (known: ", join(registered_attentions()), ")");
  std::shared_ptr<AttentionKernel> k = factory(spec, heads, head_dim);
  LINEA_CHECK(k != nullptr, "make_attention: the factory of '", spec.name, "' returned null");
  spec.check_all_used();
  return k;
}

std::shared_ptr<AttentionKernel> make_attention(const std::string& spec, int64_t heads, int64_t head_dim) {
  return make_attention(AttentionSpec::parse(spec), heads, head_dim);
}

// ---- helpers ----------------------------------------------------------------------------------
void check_attention_inputs(const std::string& who, const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionOptions& opts) {
  const char* w = who.c_str();
  raw::check_defined(w, q, "q");
  raw::check_defined(w, k, "k");
  raw::check_defined(w, v, "v");
  LINEA_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, who,
              ": expected q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv], got q ", shape_str(q.shape()), ", k ",
              shape_str(k.shape()), ", v ", shape_str(v.shape()));
  LINEA_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3) && v.size(0) == k.size(0) &&
                  v.size(1) == k.size(1) && v.size(2) == k.size(2),
              who, ": shapes do not match (q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv]): q ", shape_str(q.shape()),
              ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  raw::check_same_dtype(w, q, k);
  raw::check_same_dtype(w, q, v);
  raw::check_same_device(w, q, k);
  raw::check_same_device(w, q, v);
  const Tensor& m = opts.key_padding_mask;
  if (m.defined()) {
    LINEA_CHECK(m.dtype() == DType::Bool || m.dtype() == DType::Int64, who,
                ": key_padding_mask must be bool or int64, got ", dtype_name(m.dtype()));
    LINEA_CHECK(m.dim() == 2 && m.size(0) == k.size(0) && m.size(1) == k.size(2), who,
                ": key_padding_mask must be [B, M] = ", shape_str({k.size(0), k.size(2)}), ", got ",
                shape_str(m.shape()));
    raw::check_same_device(w, q, m);
  }
}

Tensor key_padding_bool(const AttentionOptions& opts) {
  const Tensor& m = opts.key_padding_mask;
  if (!m.defined()) return Tensor();
  if (m.dtype() == DType::Bool) return m.detach();
  LINEA_CHECK(m.dtype() == DType::Int64, "key_padding_mask: must be bool or int64, got ", dtype_name(m.dtype()));
  return raw::binary(BinaryOp::Ne, m.detach(), scalar_tensor(0.0, m.options()));
}

Tensor attention_mask(const AttentionOptions& opts, int64_t N, int64_t M, Device device) {
  Tensor masked;
  if (opts.causal) {
    const TensorOptions io(DType::Int64, device);
    Tensor rows = raw::reshape(arange(0.0, static_cast<double>(N), 1.0, io), {N, 1});
    Tensor cols = raw::reshape(arange(0.0, static_cast<double>(M), 1.0, io), {1, M});
    masked = raw::reshape(raw::binary(BinaryOp::Gt, cols, rows), {1, 1, N, M});  // key m > query n: hidden
  }
  Tensor pad = key_padding_bool(opts);
  if (pad.defined()) {
    LINEA_CHECK(pad.dim() == 2 && pad.size(1) == M, "attention_mask: key_padding_mask must be [B, ", M, "], got ",
                shape_str(pad.shape()));
    pad = raw::reshape(pad, {pad.size(0), 1, 1, M});                                // [B, 1, 1, M]
    masked = masked.defined() ? raw::binary(BinaryOp::Maximum, masked, pad) : pad;  // or
  }
  return masked;
}

Tensor masked_softmax(const Tensor& logits, const Tensor& hidden, int64_t dim) {
  if (!hidden.defined()) return softmax(logits, dim);
  LINEA_CHECK(hidden.dtype() == DType::Bool, "masked_softmax: hidden must be a bool mask, got ",
              dtype_name(hidden.dtype()));
  // The dtype's lowest finite value, not -inf: a fully hidden slice stays finite (uniform) and is
  // zeroed below instead of turning into NaN; hidden entries of other slices get exactly 0.
  const double lowest = logits.dtype() == DType::Float32 ? -static_cast<double>(FLT_MAX) : -DBL_MAX;
  Tensor p = softmax(masked_fill(logits, hidden, lowest), dim);
  Tensor all_hidden = raw::reduce(ReduceOp::Min, hidden, {dim}, /*keepdim=*/true);  // 1 = all hidden
  Tensor keep = raw::binary(BinaryOp::Eq, all_hidden, scalar_tensor(0.0, all_hidden.options()));
  return where(keep, p, scalar_tensor(0.0, p.options()));
}

Tensor softmax_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                         double dropout_p, bool training) {
  check_attention_inputs("softmax attention", q, k, v, opts);
  LINEA_CHECK(is_floating(q.dtype()), "softmax attention: expected float32/float64 inputs, got ",
              dtype_name(q.dtype()));
  LINEA_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "softmax attention: dropout must be in [0, 1), got ", dropout_p);
  const int64_t N = q.size(2), M = k.size(2), D = q.size(3);
  // scores [B, H, N, M] = (q / sqrt(D)) k^T (k^T a transposed view: no copy)
  Tensor scores = matmul(mul(q, 1.0 / std::sqrt(static_cast<double>(D))), transpose(k, -2, -1));
  Tensor attn = masked_softmax(scores, attention_mask(opts, N, M, q.device()), -1);  // mask [B|1, 1, N, M]
  if (training && dropout_p > 0.0) attn = dropout(attn, dropout_p, true);
  return matmul(attn, v);  // [B, H, N, M] @ [B, H, M, Dv] -> [B, H, N, Dv]
}

// ---- AttentionKernel: samples -------------------------------------------------------------------
Tensor AttentionKernel::attention_matrix(const Tensor&, const Tensor&, const AttentionOptions&) {
  LINEA_FAIL(type_name(), ": attention_matrix is not supported by this mechanism");
}

void AttentionKernel::set_samples(const AttentionSamples& samples) {
  const std::vector<std::string> names = sample_names();
  for (auto& [name, t] : samples) {
    LINEA_CHECK(std::find(names.begin(), names.end(), name) != names.end(), type_name(), ": unknown sample '", name,
                "' (", names.empty() ? "it draws no samples" : "it draws: " + join(names), ")");
    LINEA_CHECK(t.defined(), type_name(), ": sample '", name, "' is undefined");
    fixed_[name] = t.detach();
  }
}

void AttentionKernel::freeze_samples(bool on) {
  frozen_ = on;
  if (!on) fixed_.clear();
}

void AttentionKernel::clear_samples() {
  frozen_ = false;
  fixed_.clear();
  last_.clear();
}

Tensor AttentionKernel::sample(const std::string& name, const Shape& shape, const Tensor& like,
                               const std::function<Tensor()>& draw) {
  Tensor t;
  auto it = fixed_.find(name);
  if (it != fixed_.end()) {
    t = it->second;
    LINEA_CHECK(t.shape() == shape, type_name(), ": sample '", name, "' has shape ", shape_str(t.shape()),
                " but this call needs ", shape_str(shape),
                frozen_ ? " (frozen by an earlier call; clear_samples() to draw new ones)" : "");
    if (t.device() != like.device()) t = t.to(like.device());
    if (is_floating(t.dtype()) && t.dtype() != like.dtype()) t = t.to(like.dtype());
    if (t.dtype() == DType::Bool) t = t.to(DType::Int64);
  } else {
    t = draw().detach();
    LINEA_CHECK(t.shape() == shape, type_name(), ": internal: drew '", name, "' of shape ", shape_str(t.shape()),
                ", expected ", shape_str(shape));
    if (frozen_) fixed_[name] = t;
  }
  last_[name] = t;
  return t;
}

// ---- SoftmaxAttention -------------------------------------------------------------------------
SoftmaxAttention::SoftmaxAttention(int64_t heads, int64_t head_dim, double dropout)
    : AttentionKernel("SoftmaxAttention", heads, head_dim), dropout_(dropout) {
  LINEA_CHECK(dropout >= 0.0 && dropout < 1.0, "SoftmaxAttention: dropout must be in [0, 1), got ", dropout);
}

Tensor SoftmaxAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  return softmax_attention(q, k, v, opts, dropout_, is_training());
}

Tensor SoftmaxAttention::attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) {
  check_attention_inputs("softmax attention_matrix", q, k, k, opts);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  return masked_softmax(matmul(mul(q, scale), transpose(k, -2, -1)), attention_mask(opts, q.size(2), k.size(2), q.device()),
                        -1);
}

std::string SoftmaxAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", dropout=" + detail::fmt_double(dropout_);
}

// ---- MultiHeadAttention -----------------------------------------------------------------------
MultiHeadAttention::MultiHeadAttention(int64_t dim, int64_t heads, const std::string& spec, bool bias, int64_t kv_dim)
    : Module("MultiHeadAttention"), dim_(dim), heads_(heads), kv_dim_(kv_dim < 0 ? dim : kv_dim) {
  LINEA_CHECK(dim > 0 && heads > 0 && kv_dim_ > 0, "MultiHeadAttention: dim, heads and kv_dim must be positive, got ",
              dim, ", ", heads, ", ", kv_dim_);
  LINEA_CHECK(dim % heads == 0, "MultiHeadAttention: dim ", dim, " is not divisible by heads ", heads);
  AttentionSpec parsed = AttentionSpec::parse(spec);
  spec_ = parsed.str();
  q_proj_ = register_module("q_proj", std::make_shared<Linear>(dim, dim, bias));
  k_proj_ = register_module("k_proj", std::make_shared<Linear>(kv_dim_, dim, bias));
  v_proj_ = register_module("v_proj", std::make_shared<Linear>(kv_dim_, dim, bias));
  out_proj_ = register_module("out_proj", std::make_shared<Linear>(dim, dim, bias));
  for (auto* p : {&q_proj_, &k_proj_, &v_proj_, &out_proj_}) (*p)->reset_parameters_trunc_normal();
  kernel_ = register_module("kernel", make_attention(parsed, heads, dim / heads));
}

Tensor MultiHeadAttention::forward(const Tensor& x_q, const Tensor& x_kv, const AttentionOptions& opts) {
  raw::check_defined("MultiHeadAttention", x_q, "x_q");
  raw::check_defined("MultiHeadAttention", x_kv, "x_kv");
  LINEA_CHECK(x_q.dim() == 3 && x_q.size(2) == dim_, "MultiHeadAttention: expected x_q [B, N, ", dim_, "], got ",
              shape_str(x_q.shape()));
  LINEA_CHECK(x_kv.dim() == 3 && x_kv.size(2) == kv_dim_ && x_kv.size(0) == x_q.size(0),
              "MultiHeadAttention: expected x_kv [", x_q.size(0), ", M, ", kv_dim_, "] (batch of x_q ",
              shape_str(x_q.shape()), "), got ", shape_str(x_kv.shape()));
  const int64_t B = x_q.size(0), N = x_q.size(1), M = x_kv.size(1), H = heads_, Dh = dim_ / heads_;
  // [B, L, dim] -> [B, L, H, Dh] -> [B, H, L, Dh] (views)
  auto split = [&](const Tensor& x, int64_t L) { return permute(reshape(x, {B, L, H, Dh}), {0, 2, 1, 3}); };
  Tensor q = split(q_proj_->forward(x_q), N);
  Tensor k = split(k_proj_->forward(x_kv), M);
  Tensor v = split(v_proj_->forward(x_kv), M);
  Tensor o = kernel_->forward(q, k, v, opts);  // [B, H, N, Dh]
  LINEA_CHECK(o.shape() == Shape({B, H, N, Dh}), "MultiHeadAttention: mechanism '", spec_, "' returned ",
              shape_str(o.shape()), ", expected ", shape_str({B, H, N, Dh}));
  o = reshape(permute(o, {0, 2, 1, 3}), {B, N, dim_});  // [B, N, H, Dh] -> [B, N, dim]
  return out_proj_->forward(o);
}

std::string MultiHeadAttention::extra_repr() const {
  std::string s = "dim=" + std::to_string(dim_) + ", heads=" + std::to_string(heads_) + ", spec='" + spec_ + "'";
  if (kv_dim_ != dim_) s += ", kv_dim=" + std::to_string(kv_dim_);
  return s;
}

}  // namespace linea::nn
