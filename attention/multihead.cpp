// MultiHeadAttention and its decoding cache (see multihead.h).
#include "attention/multihead.h"

namespace linea::attn {

// ---- AttentionCache -------------------------------------------------------------------------------
void AttentionCache::reorder(const Tensor& index) {
  raw::check_defined("AttentionCache::reorder", index, "index");
  LINEA_CHECK(index.dtype() == DType::Int64 && index.dim() == 1, "AttentionCache::reorder: index must be Int64 [B], got ",
              dtype_name(index.dtype()), " ", shape_str(index.shape()));
  if (cross_) {
    if (!index.is_cpu() || !mem_k_.defined()) return;
    // Rows must stay with their sentence: row i belongs to sentence i / beams.
    const int64_t rows = index.size(0), Bm = mem_k_.size(0);
    if (rows % Bm != 0) return;  // a batch that changes size: the next step checks it
    const int64_t beams = rows / Bm;
    const std::vector<int64_t> idx = index.to_vector<int64_t>();
    for (int64_t i = 0; i < rows; ++i)
      LINEA_CHECK(idx[i] / beams == i / beams, "AttentionCache::reorder: row ", i, " takes row ", idx[i],
                  ", which belongs to another sentence (rows are [sentence][beam], ", beams, " beams each)");
    return;
  }
  if (!self_) return;
  if (index.is_cpu()) {  // the identity reorders nothing (beam search often keeps every beam in place)
    const std::vector<int64_t> idx = index.to_vector<int64_t>();
    bool identity = true;
    for (size_t i = 0; i < idx.size() && identity; ++i) identity = idx[i] == static_cast<int64_t>(i);
    if (identity) return;
  }
  NoGradGuard ng;
  self_->reorder(index);
}

void AttentionCache::keep_sentences(const Tensor& sentences, int64_t beams) {
  raw::check_defined("AttentionCache::keep_sentences", sentences, "sentences");
  LINEA_CHECK(sentences.dtype() == DType::Int64 && sentences.dim() == 1 && beams > 0,
              "AttentionCache::keep_sentences: sentences must be Int64 [Bm] and beams positive, got ",
              dtype_name(sentences.dtype()), " ", shape_str(sentences.shape()), " and ", beams);
  NoGradGuard ng;
  if (cross_) {
    if (!mem_k_.defined()) return;
    const Tensor s = sentences.to(mem_k_.device());
    mem_k_ = index_select(mem_k_, 0, s);
    mem_v_ = index_select(mem_v_, 0, s);
    if (mem_pad_.defined()) mem_pad_ = index_select(mem_pad_, 0, s);
    rep_k_ = rep_v_ = rep_pad_ = Tensor();  // rebuilt for the new batch by the next step
    return;
  }
  if (!self_) return;
  // Row b of sentence s is s * beams + b (a small index, made on the host).
  std::vector<int64_t> rows;
  for (int64_t sent : sentences.to_vector<int64_t>())
    for (int64_t b = 0; b < beams; ++b) rows.push_back(sent * beams + b);
  self_->reorder(from_vector<int64_t>(rows, {static_cast<int64_t>(rows.size())}).to(sentences.device()));
}

// ---- MultiHeadAttention ---------------------------------------------------------------------------
MultiHeadAttention::MultiHeadAttention(int64_t dim, int64_t heads, const std::string& spec, MultiHeadOptions options)
    : Module("MultiHeadAttention"), dim_(dim), heads_(heads) {
  LINEA_CHECK(dim > 0 && heads > 0, "MultiHeadAttention: dim and heads must be positive, got ", dim, " and ", heads);
  LINEA_CHECK(dim % heads == 0, "MultiHeadAttention: dim ", dim, " is not divisible by heads ", heads);
  AttentionSpec parsed = AttentionSpec::parse(spec);
  spec_ = parsed.str();
  init(make_attention(parsed, heads, dim / heads, options.use), options);
}

MultiHeadAttention::MultiHeadAttention(int64_t dim, int64_t heads, std::shared_ptr<AttentionMechanism> mechanism,
                                       MultiHeadOptions options)
    : Module("MultiHeadAttention"), dim_(dim), heads_(heads) {
  LINEA_CHECK(dim > 0 && heads > 0, "MultiHeadAttention: dim and heads must be positive, got ", dim, " and ", heads);
  LINEA_CHECK(dim % heads == 0, "MultiHeadAttention: dim ", dim, " is not divisible by heads ", heads);
  LINEA_CHECK(mechanism != nullptr, "MultiHeadAttention: the mechanism is null");
  LINEA_CHECK(mechanism->heads() == heads && mechanism->head_dim() == dim / heads, "MultiHeadAttention: the ",
              mechanism->type_name(), " was built for ", mechanism->heads(), " heads of dim ", mechanism->head_dim(),
              ", this layer has ", heads, " heads of dim ", dim / heads);
  spec_ = mechanism->type_name();
  mechanism->check_use(options.use, spec_);
  init(std::move(mechanism), options);
}

void MultiHeadAttention::init(std::shared_ptr<AttentionMechanism> mechanism, const MultiHeadOptions& o) {
  kv_dim_ = o.kv_dim < 0 ? dim_ : o.kv_dim;
  LINEA_CHECK(kv_dim_ > 0, "MultiHeadAttention: kv_dim must be positive, got ", kv_dim_);
  use_ = o.use;
  q_proj_ = register_module("q_proj", std::make_shared<nn::Linear>(dim_, dim_, o.bias));
  k_proj_ = register_module("k_proj", std::make_shared<nn::Linear>(kv_dim_, dim_, o.bias));
  v_proj_ = register_module("v_proj", std::make_shared<nn::Linear>(kv_dim_, dim_, o.bias));
  out_proj_ = register_module("out_proj", std::make_shared<nn::Linear>(dim_, dim_, o.bias));
  for (auto* p : {&q_proj_, &k_proj_, &v_proj_, &out_proj_}) (*p)->reset_parameters_trunc_normal();
  // q, k and v's weights in one buffer, one after another (and their biases in another), so that
  // linears runs the projections of one input as one GEMM: self-attention's three, the memory's
  // k and v (the parameters keep their names, shapes and values).
  nn::pack_together({q_proj_->weight(), k_proj_->weight(), v_proj_->weight()});
  if (o.bias) nn::pack_together({q_proj_->bias(), k_proj_->bias(), v_proj_->bias()});
  mechanism_ = register_module("mechanism", std::move(mechanism));
}

namespace {
// x through several linear layers as one op (linears).
std::vector<Tensor> project(const Tensor& x, std::initializer_list<const nn::Linear*> layers) {
  std::vector<Tensor> weights, biases;
  for (const nn::Linear* l : layers) {
    weights.push_back(l->weight());
    biases.push_back(l->bias());
  }
  return linears(x, weights, biases);
}
}  // namespace

Tensor MultiHeadAttention::heads_of(const Tensor& x, int64_t L) const {
  // [B, L, dim] -> [B, L, H, Dh] -> [B, H, L, Dh] (views)
  return permute(reshape(x, {x.size(0), L, heads_, dim_ / heads_}), {0, 2, 1, 3});
}

Tensor MultiHeadAttention::merge_heads(const Tensor& o) const {
  return reshape(permute(o, {0, 2, 1, 3}), {o.size(0), o.size(2), dim_});  // [B, L, H, Dh] -> [B, L, dim]
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
  // The projections that read one input run as one op (self-attention: x's q, k and v;
  // cross-attention: the memory's k and v), so that its gradient is summed in their GEMMs.
  std::vector<Tensor> qkv;
  if (x_q.same(x_kv)) {
    qkv = project(x_q, {q_proj_.get(), k_proj_.get(), v_proj_.get()});
  } else {
    qkv = project(x_kv, {k_proj_.get(), v_proj_.get()});
    qkv.insert(qkv.begin(), q_proj_->forward(x_q));
  }
  Tensor o = mechanism_->forward(heads_of(qkv[0], N), heads_of(qkv[1], M), heads_of(qkv[2], M), opts);  // [B, H, N, Dh]
  LINEA_CHECK(o.shape() == Shape({B, H, N, Dh}), "MultiHeadAttention: mechanism '", spec_, "' returned ",
              shape_str(o.shape()), ", expected ", shape_str({B, H, N, Dh}));
  return out_proj_->forward(merge_heads(o));
}

AttentionCache MultiHeadAttention::start_self() const {
  LINEA_CHECK(kv_dim_ == dim_, "MultiHeadAttention::start_self: a self-attention needs kv_dim == dim, got ", kv_dim_,
              " and ", dim_);
  AttentionCache c;
  c.self_ = mechanism_->start_decoding();
  return c;
}

AttentionCache MultiHeadAttention::start_cross(const Tensor& memory, const Tensor& memory_key_padding_mask) {
  raw::check_defined("MultiHeadAttention::start_cross", memory, "memory");
  LINEA_CHECK(memory.dim() == 3 && memory.size(2) == kv_dim_, "MultiHeadAttention::start_cross: expected memory [B, M, ",
              kv_dim_, "], got ", shape_str(memory.shape()));
  LINEA_CHECK(mechanism_->support().cross, "MultiHeadAttention::start_cross: attention '", spec_,
              "' does not support cross-attention (it supports ", mechanism_->support().str(), ")");
  AttentionCache c;
  c.cross_ = true;
  const int64_t M = memory.size(1);
  const std::vector<Tensor> kv = project(memory, {k_proj_.get(), v_proj_.get()});
  c.mem_k_ = heads_of(kv[0], M);
  c.mem_v_ = heads_of(kv[1], M);
  c.mem_pad_ = key_padding_bool(memory_key_padding_mask);
  if (c.mem_pad_.defined())
    LINEA_CHECK(c.mem_pad_.dim() == 2 && c.mem_pad_.size(0) == memory.size(0) && c.mem_pad_.size(1) == M,
                "MultiHeadAttention::start_cross: memory_key_padding_mask must be [", memory.size(0), ", ", M,
                "], got ", shape_str(c.mem_pad_.shape()));
  return c;
}

Tensor MultiHeadAttention::step(const Tensor& x, AttentionCache& cache, const Tensor& key_padding) {
  raw::check_defined("MultiHeadAttention::step", x, "x");
  LINEA_CHECK(x.dim() == 3 && x.size(2) == dim_, "MultiHeadAttention::step: expected x [B, T, ", dim_, "], got ",
              shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), H = heads_, Dh = dim_ / heads_;
  Tensor o;
  if (!cache.cross_) {
    LINEA_CHECK(cache.self_ != nullptr, "MultiHeadAttention::step: the cache was not made by start_self()");
    const std::vector<Tensor> qkv = project(x, {q_proj_.get(), k_proj_.get(), v_proj_.get()});
    o = mechanism_->decode_step(heads_of(qkv[0], T), heads_of(qkv[1], T), heads_of(qkv[2], T), *cache.self_,
                                key_padding);
  } else {
    const Tensor q = heads_of(q_proj_->forward(x), T);  // [B, H, T, Dh]
    const int64_t Bm = cache.mem_k_.size(0);
    LINEA_CHECK(B % Bm == 0, "MultiHeadAttention::step: ", B, " decoder rows are not a whole number of beams for the ",
                Bm, " sentences of the memory");
    const int64_t beams = B / Bm;
    AttentionOptions opts;
    opts.query_offset = cache.length_;
    if (beams == 1 || !mechanism_->support().positional) {
      // The beams of a sentence as more queries on its memory: [B, H, T, Dh] -> [Bm, H, beams*T, Dh].
      Tensor qf = reshape(permute(reshape(q, {Bm, beams, H, T, Dh}), {0, 2, 1, 3, 4}), {Bm, H, beams * T, Dh});
      opts.key_padding_mask = cache.mem_pad_;
      Tensor of = mechanism_->forward(qf, cache.mem_k_, cache.mem_v_, opts);  // [Bm, H, beams*T, Dh]
      o = reshape(permute(reshape(of, {Bm, H, beams, T, Dh}), {0, 2, 1, 3, 4}), {B, H, T, Dh});
    } else {
      // Position-aware mechanisms read one copy of the memory per beam, made once per batch size.
      if (!cache.rep_k_.defined() || cache.rep_k_.size(0) != B) {
        const TensorOptions io(DType::Int64, x.device());
        Tensor rows = reshape(expand(reshape(arange(0.0, static_cast<double>(Bm), 1.0, io), {Bm, 1}), {Bm, beams}), {B});
        cache.rep_k_ = index_select(cache.mem_k_, 0, rows);
        cache.rep_v_ = index_select(cache.mem_v_, 0, rows);
        if (cache.mem_pad_.defined()) cache.rep_pad_ = index_select(cache.mem_pad_, 0, rows);
      }
      opts.key_padding_mask = cache.rep_pad_;
      o = mechanism_->forward(q, cache.rep_k_, cache.rep_v_, opts);
    }
  }
  cache.length_ += T;
  return out_proj_->forward(merge_heads(o));
}

std::string MultiHeadAttention::extra_repr() const {
  std::string s = "dim=" + std::to_string(dim_) + ", heads=" + std::to_string(heads_) + ", spec='" + spec_ + "'";
  if (kv_dim_ != dim_) s += ", kv_dim=" + std::to_string(kv_dim_);
  if (use_ != AttentionUse::Self) s += std::string(", use=") + attention_use_name(use_);
  return s;
}

}  // namespace linea::attn
