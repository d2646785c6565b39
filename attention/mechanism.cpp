// The mechanism base class (samples, redraw schedule, decoding through a key/value cache), the
// key/value cache and the mask helpers (see mechanism.h). Masks are built with
// non-differentiable ops (they are Bool); everything differentiable goes through autograd/ops.h.
#include "attention/mechanism.h"

#include <algorithm>

namespace linea::attn {

// ---- support -----------------------------------------------------------------------------------
std::string AttentionSupport::str() const {
  std::vector<std::string> can;
  if (causal) can.push_back("causal self-attention");
  if (cross) can.push_back("cross-attention");
  if (incremental) can.push_back("incremental decoding");
  if (can.empty()) return "bidirectional self-attention only";
  return "bidirectional self-attention, " + join(can);
}

const char* attention_use_name(AttentionUse use) {
  switch (use) {
    case AttentionUse::Self: return "self-attention";
    case AttentionUse::CausalSelf: return "causal self-attention";
    case AttentionUse::Cross: return "cross-attention";
  }
  return "?";
}

void AttentionMechanism::check_use(AttentionUse use, const std::string& what) const {
  const AttentionSupport s = support();
  const bool ok = use == AttentionUse::Self || (use == AttentionUse::CausalSelf && s.causal) ||
                  (use == AttentionUse::Cross && s.cross);
  LINEA_CHECK(ok, "attention '", what, "' cannot be used as ", attention_use_name(use), ": it supports ", s.str());
}

// ---- decoding ----------------------------------------------------------------------------------
namespace {
// Makes room in buf for n entries along dim: when it has fewer, a new buffer shaped s with twice n
// along dim, whose first `length` entries keep(view) writes (the filled part, copied once; buf is
// still the old buffer then). A step costs amortized O(1) copies where a cat copied the whole
// cache at every step.
template <class Keep>
void reserve(Tensor& buf, Shape s, int64_t dim, int64_t n, int64_t length, const TensorOptions& o, const Keep& keep) {
  if (buf.defined() && buf.size(dim) >= n) return;
  s[static_cast<size_t>(dim)] = std::max<int64_t>(2 * n, 16);
  Tensor grown = empty(s, o);
  if (length > 0) keep(narrow(grown, dim, 0, length));
  buf = grown;
}

// Heads [first, first + heads) of buf [B, H + Hv, T, E], their first `dim` values (views).
Tensor heads_in(const Tensor& buf, int64_t first, int64_t heads, int64_t dim) {
  return narrow(narrow(buf, 1, first, heads), 3, 0, dim);
}
}  // namespace

void KeyValueCache::check_continues(const Tensor& k, const Tensor& v) const {
  if (!k_.defined()) return;
  const auto same_but_length = [](const Tensor& a, const Tensor& b) {
    return a.dim() == 4 && a.size(0) == b.size(0) && a.size(1) == b.size(1) && a.size(3) == b.size(3) &&
           a.dtype() == b.dtype() && a.device() == b.device();
  };
  LINEA_CHECK(same_but_length(k, k_) && same_but_length(v, v_), "KeyValueCache::append: keys ", shape_str(k.shape()),
              " and values ", shape_str(v.shape()), " do not continue the cache's ", shape_str(k_.shape()), " and ",
              shape_str(v_.shape()), " (batch, heads and dims must stay, with the dtype and device)");
}

void KeyValueCache::view_filled(int64_t H, int64_t D, int64_t Hv, int64_t Dv) {
  const Tensor filled = narrow(kvbuf_, 2, 0, length_);
  k_ = heads_in(filled, 0, H, D);
  v_ = heads_in(filled, H, Hv, Dv);
}

void KeyValueCache::append(const Tensor& k, const Tensor& v, const Tensor& key_padding) {
  check_continues(k, v);
  const int64_t B = k.size(0), T = k.size(2);
  // Padding only needs keeping once some key is padded: earlier and unpadded steps count as unpadded.
  const Tensor& pad = key_padding;
  const TensorOptions bools(DType::Bool, k.device());
  if (GradMode::is_enabled() && (k.requires_grad() || v.requires_grad())) {
    // Differentiable through the cache: joined by cat (the buffers' in-place writes would not be).
    kvbuf_ = pbuf_ = Tensor();
    if (pad.defined() && !pad_.defined() && length_ > 0) pad_ = zeros({B, length_}, bools);
    if (pad.defined() || pad_.defined()) {
      const Tensor p = pad.defined() ? pad : zeros({B, T}, bools);
      pad_ = pad_.defined() ? cat({pad_, p}, 1) : p;
    }
    k_ = k_.defined() ? cat({k_, k}, 2) : k;
    v_ = v_.defined() ? cat({v_, v}, 2) : v;
    length_ += T;
    return;
  }
  const int64_t H = k.size(1), D = k.size(3), Hv = v.size(1), Dv = v.size(3), n = length_ + T;
  reserve(kvbuf_, {B, H + Hv, 0, std::max(D, Dv)}, 2, n, length_, k.options(), [&](Tensor kept) {
    if (kvbuf_.defined()) {
      kept.copy_(narrow(kvbuf_, 2, 0, length_));
    } else {  // filled by cat until now (a step with gradients)
      heads_in(kept, 0, H, D).copy_(k_);
      heads_in(kept, H, Hv, Dv).copy_(v_);
    }
  });
  // A projection's keys and values are one tensor's consecutive heads: one copy for both.
  Tensor slot = narrow(kvbuf_, 2, length_, T);
  if (const Tensor kv = D == Dv ? raw::joined_view({k, v}, 1) : Tensor(); kv.defined()) {
    slot.copy_(kv);
  } else {
    heads_in(slot, 0, H, D).copy_(k);
    heads_in(slot, H, Hv, Dv).copy_(v);
  }
  if (pad.defined() || pad_.defined()) {  // the unpadded part written as zeros in the buffer itself
    const auto write = [](Tensor to, const Tensor& from) { from.defined() ? to.copy_(from) : to.zero_(); };
    reserve(pbuf_, {B, 0}, 1, n, length_, bools, [&](Tensor kept) { write(kept, pad_); });
    write(narrow(pbuf_, 1, length_, T), pad);
    pad_ = narrow(pbuf_, 1, 0, n);
  }
  length_ = n;
  view_filled(H, D, Hv, Dv);
}

void KeyValueCache::reorder(const Tensor& index) {
  if (!k_.defined()) return;
  const Tensor i = index.to(k_.device());
  // The filled part is selected into a new buffer of the same room (the kept rows copied once,
  // none of the room, which the next appends write): a reorder at every beam step would copy the
  // room at every step too. Keys and values are one buffer's heads: one select for both.
  const auto select = [&](Tensor& buf, int64_t dim) {
    const Tensor filled = narrow(buf, dim, 0, length_);
    Shape s = buf.shape();
    s[0] = i.numel();
    buf = empty(s, buf.options());
    raw::index_select_out(narrow(buf, dim, 0, length_), filled, 0, i);
  };
  if (kvbuf_.defined()) {
    select(kvbuf_, 2);
    view_filled(k_.size(1), k_.size(3), v_.size(1), v_.size(3));
  } else {  // joined by cat (with gradients)
    k_ = index_select(k_, 0, i);
    v_ = index_select(v_, 0, i);
  }
  if (pbuf_.defined()) {
    select(pbuf_, 1);
    pad_ = narrow(pbuf_, 1, 0, length_);
  } else if (pad_.defined()) {
    pad_ = index_select(pad_, 0, i);
  }
}

std::unique_ptr<DecodeState> AttentionMechanism::start_decoding() const {
  LINEA_CHECK(support().incremental, type_name(), ": incremental decoding is not supported (it supports ",
              support().str(), ")");
  return std::make_unique<KeyValueCache>();
}

void AttentionMechanism::check_step(const Tensor& q, const Tensor& k, const Tensor& v) const {
  const std::string who = type_name() + " decode_step";
  check_attention_inputs(who, q, k, v, {});
  LINEA_CHECK(q.size(2) == k.size(2), who, ": expected as many new queries as new keys, got q ",
              shape_str(q.shape()), " and k ", shape_str(k.shape()));
  LINEA_CHECK(q.size(1) == heads() && q.size(3) == head_dim(), who, ": built for ", heads(), " heads of dim ",
              head_dim(), ", got q ", shape_str(q.shape()));
}

Tensor AttentionMechanism::decode_step(const Tensor& q, const Tensor& k, const Tensor& v, DecodeState& state,
                                       const Tensor& key_padding) {
  auto* cache = dynamic_cast<KeyValueCache*>(&state);
  LINEA_CHECK(cache != nullptr, type_name(), " decode_step: the state was not made by this mechanism's start_decoding");
  check_step(q, k, v);
  const int64_t offset = cache->length();
  if (cache->keys().defined())
    LINEA_CHECK(cache->keys().size(0) == k.size(0), type_name(), " decode_step: batch of ", k.size(0),
                " rows, the state holds ", cache->keys().size(0), " (reorder it first)");
  cache->append(k, v, key_padding_bool(key_padding));
  AttentionOptions o;
  o.causal = true;
  o.query_offset = offset;
  o.key_padding_mask = cache->key_padding();
  return forward(q, cache->keys(), cache->values(), o);
}

// ---- samples -----------------------------------------------------------------------------------
Tensor AttentionMechanism::attention_matrix(const Tensor&, const Tensor&, const AttentionOptions&) {
  LINEA_FAIL(type_name(), ": attention_matrix is not supported by this mechanism");
}

void AttentionMechanism::set_samples(const AttentionSamples& samples) {
  const std::vector<std::string> names = sample_names();
  for (auto& [name, t] : samples) {
    LINEA_CHECK(std::find(names.begin(), names.end(), name) != names.end(), type_name(), ": unknown sample '", name,
                "' (", names.empty() ? "it draws no samples" : "it draws: " + join(names), ")");
    LINEA_CHECK(t.defined(), type_name(), ": sample '", name, "' is undefined");
    fixed_[name] = t.detach();
  }
}

void AttentionMechanism::freeze_samples(bool on) {
  frozen_ = on;
  if (!on) fixed_.clear();
}

void AttentionMechanism::clear_samples() {
  frozen_ = false;
  fixed_.clear();
  last_.clear();
}

Tensor AttentionMechanism::sample(const std::string& name, const Shape& shape, const Tensor& like,
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
  } else {
    t = draw().detach();
    LINEA_CHECK(t.shape() == shape, type_name(), ": internal: drew '", name, "' of shape ", shape_str(t.shape()),
                ", expected ", shape_str(shape));
    if (frozen_) fixed_[name] = t;
  }
  last_[name] = t;
  return t;
}

// ---- redraw schedule ---------------------------------------------------------------------------
void AttentionMechanism::init_redraw(int64_t every) {
  LINEA_CHECK(every >= 0, type_name(), ": redraw must be >= 0 (0 = never), got ", every);
  LINEA_CHECK(!redraw_calls_.defined(), type_name(), ": init_redraw called twice");
  redraw_every_ = every;
  redraw_calls_ = register_host_buffer("redraw_calls", zeros({}, TensorOptions(DType::Int64)));
}

int64_t AttentionMechanism::redraw_calls() const {
  return redraw_calls_.defined() ? redraw_calls_.data<int64_t>()[0] : 0;
}

bool AttentionMechanism::redraw_due() {
  LINEA_CHECK(redraw_calls_.defined(), type_name(), ": internal: redraw_due without init_redraw");
  if (!is_training()) return false;
  const int64_t calls = redraw_calls();
  redraw_calls_.fill_(static_cast<double>(calls + 1));
  return redraw_every_ > 0 && calls % redraw_every_ == 0;
}

// ---- helpers -----------------------------------------------------------------------------------
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
  LINEA_CHECK(opts.query_offset >= 0, who, ": query_offset must be >= 0, got ", opts.query_offset);
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

Tensor key_padding_bool(const Tensor& m) {
  if (!m.defined()) return Tensor();
  if (m.dtype() == DType::Bool) return m.detach();
  LINEA_CHECK(m.dtype() == DType::Int64, "key_padding_mask: must be bool or int64, got ", dtype_name(m.dtype()));
  return m.detach() != 0.0;
}

Tensor causal_hidden(int64_t N, int64_t M, int64_t offset, Device device) {
  const TensorOptions io(DType::Int64, device);
  Tensor rows = reshape(arange(static_cast<double>(offset), static_cast<double>(offset + N), 1.0, io), {N, 1});
  Tensor cols = reshape(arange(0.0, static_cast<double>(M), 1.0, io), {1, M});
  return cols > rows;  // key m after query n's position n + offset
}

Tensor attention_mask(const AttentionOptions& opts, int64_t N, int64_t M, Device device) {
  Tensor masked;
  if (opts.causal) masked = reshape(causal_hidden(N, M, opts.query_offset, device), {1, 1, N, M});
  Tensor pad = key_padding_bool(opts);
  if (pad.defined()) {
    LINEA_CHECK(pad.dim() == 2 && pad.size(1) == M, "attention_mask: key_padding_mask must be [B, ", M, "], got ",
                shape_str(pad.shape()));
    pad = reshape(pad, {pad.size(0), 1, 1, M});            // [B, 1, 1, M]
    masked = masked.defined() ? (masked | pad) : pad;
  }
  return masked;
}

Tensor masked_softmax(const Tensor& logits, const Tensor& hidden, int64_t dim) {
  if (!hidden.defined()) return softmax(logits, dim);
  LINEA_CHECK(hidden.dtype() == DType::Bool, "masked_softmax: hidden must be a bool mask, got ",
              dtype_name(hidden.dtype()));
  // The dtype's lowest finite value, not -inf: a fully hidden slice stays finite (uniform) and is
  // zeroed below instead of turning into NaN; hidden entries of other slices get exactly 0.
  Tensor p = softmax(masked_fill(logits, hidden, dtype_lowest(logits.dtype())), dim);
  return where(all(hidden, {dim}, /*keepdim=*/true), 0.0, p);
}

}  // namespace linea::attn
