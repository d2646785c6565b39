#include "search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/ops.h"
#include "core/error.h"

using namespace linea;

namespace translate {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::vector<int64_t> source_lengths(const Tensor& src_pad) {
  std::vector<int64_t> len;
  const Tensor n = sum(~src_pad, {1});
  for (int64_t v : n.to(kCPU).to_vector<int64_t>()) len.push_back(v);
  return len;
}

// Bans padding and bos in log-probabilities [rows, V]; rows at their last position may only end.
void restrict_rows(std::vector<float>& lp, const ModelConfig& c, const std::vector<bool>& force_eos) {
  const int64_t V = c.tgt_vocab;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t r = 0; r < force_eos.size(); ++r) {
    float* row = lp.data() + r * V;
    row[c.pad_id] = row[c.bos_id] = ninf;
    if (force_eos[r]) {
      const float eos = row[c.eos_id];
      std::fill(row, row + V, ninf);
      row[c.eos_id] = eos;
    }
  }
}

// Log-probabilities of the next token [rows, V] on the host, restricted as above.
std::vector<float> next_log_probs(Seq2Seq& model, const std::vector<int64_t>& tokens, attn::DecoderState& state,
                                  Device device, const std::vector<bool>& force_eos) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  Tensor t = from_vector<int64_t>(tokens, {rows}).to(device);
  std::vector<float> lp = log_softmax(model.step(t, state), 1).to(kCPU).to_vector<float>();
  restrict_rows(lp, model.config(), force_eos);
  return lp;
}

// Greedy search's step for one row at position t: the most probable token goes into h; returns
// it (eos: h is finished and scored).
int64_t greedy_pick(const float* row, const ModelConfig& c, double len_penalty, int64_t t, Hypothesis& h) {
  const int64_t best = std::max_element(row, row + c.tgt_vocab) - row;
  h.log_prob += row[best];
  if (best == c.eos_id)
    h.score = h.log_prob / std::pow(static_cast<double>(t + 1), len_penalty);
  else
    h.tokens.push_back(best);
  return best;
}

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}).to(device);
}

void check_inputs(const Seq2Seq& model, const Tensor& src, const Tensor& src_pad, const SearchOptions& o) {
  LINEA_CHECK(src.dim() == 2 && src_pad.shape() == src.shape(), "translate: search expects src [B, S] and src_pad [B, S], got ",
              shape_str(src.shape()), " and ", shape_str(src_pad.shape()));
  LINEA_CHECK(o.beam >= 1 && o.nbest >= 1 && o.nbest <= o.beam, "translate: --beam (", o.beam,
              ") must be >= 1 and --nbest (", o.nbest, ") within 1..beam");
  LINEA_CHECK(o.max_len_ratio >= 0 && o.max_len_extra >= 0, "translate: --max-len-ratio (", o.max_len_ratio,
              ") and the extra length (", o.max_len_extra, ") must be non-negative");
  (void)model;
}

}  // namespace

int64_t max_output_length(const ModelConfig& cfg, const SearchOptions& o, int64_t src_len) {
  const auto n = static_cast<int64_t>(std::floor(o.max_len_ratio * static_cast<double>(src_len))) + o.max_len_extra;
  return std::max<int64_t>(1, std::min(n, cfg.max_len));
}

std::vector<Hypothesis> greedy_search(Seq2Seq& model, const Tensor& src, const Tensor& src_pad,
                                      const SearchOptions& o) {
  check_inputs(model, src, src_pad, o);
  const ModelConfig& c = model.config();
  const int64_t B = src.size(0), V = c.tgt_vocab;
  const std::vector<int64_t> src_len = source_lengths(src_pad);
  std::vector<Hypothesis> out(B);
  attn::DecoderState state = model.start(model.encode(src, src_pad), src_pad);
  std::vector<int64_t> active(B), tokens(B, c.bos_id);  // active[r]: the sentence of row r
  for (int64_t i = 0; i < B; ++i) active[i] = i;
  for (int64_t t = 0; !active.empty(); ++t) {
    std::vector<bool> force(active.size());
    for (size_t r = 0; r < active.size(); ++r) force[r] = t + 1 >= max_output_length(c, o, src_len[active[r]]);
    const std::vector<float> lp = next_log_probs(model, tokens, state, src.device(), force);
    std::vector<int64_t> keep, next_active, next_tokens;
    for (size_t r = 0; r < active.size(); ++r) {
      const int64_t best = greedy_pick(lp.data() + r * V, c, o.len_penalty, t, out[active[r]]);
      if (best == c.eos_id) continue;
      keep.push_back(static_cast<int64_t>(r));
      next_active.push_back(active[r]);
      next_tokens.push_back(best);
    }
    if (!next_active.empty() && next_active.size() < active.size())
      state.keep_sentences(index_tensor(keep, src.device()), 1);
    active = std::move(next_active);
    tokens = std::move(next_tokens);
  }
  return out;
}

std::vector<Hypothesis> greedy_search_recompute(Seq2Seq& model, const Tensor& src, const Tensor& src_pad,
                                                const SearchOptions& o) {
  check_inputs(model, src, src_pad, o);
  const ModelConfig& c = model.config();
  const int64_t B = src.size(0), V = c.tgt_vocab;
  const std::vector<int64_t> src_len = source_lengths(src_pad);
  std::vector<Hypothesis> out(B);
  Tensor memory = model.encode(src, src_pad), pad = src_pad;
  std::vector<int64_t> active(B);
  std::vector<std::vector<int64_t>> prefix(B, {c.bos_id});
  for (int64_t i = 0; i < B; ++i) active[i] = i;
  for (int64_t t = 0; !active.empty(); ++t) {
    const int64_t n = static_cast<int64_t>(active.size());
    std::vector<int64_t> ids;
    for (int64_t a : active) ids.insert(ids.end(), prefix[a].begin(), prefix[a].end());
    Tensor logits = model.decode(from_vector<int64_t>(ids, {n, t + 1}).to(src.device()), memory, pad);
    std::vector<float> lp = log_softmax(select(logits, 1, t), 1).to(kCPU).to_vector<float>();
    std::vector<bool> force(n);
    for (int64_t r = 0; r < n; ++r) force[r] = t + 1 >= max_output_length(c, o, src_len[active[r]]);
    restrict_rows(lp, c, force);
    std::vector<int64_t> keep, next_active;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t best = greedy_pick(lp.data() + r * V, c, o.len_penalty, t, out[active[r]]);
      if (best == c.eos_id) continue;
      prefix[active[r]].push_back(best);
      keep.push_back(r);
      next_active.push_back(active[r]);
    }
    if (!next_active.empty() && next_active.size() < active.size()) {
      const Tensor k = index_tensor(keep, src.device());
      memory = index_select(memory, 0, k);
      pad = index_select(pad, 0, k);
    }
    active = std::move(next_active);
  }
  return out;
}

std::vector<std::vector<Hypothesis>> beam_search(Seq2Seq& model, const Tensor& src, const Tensor& src_pad,
                                                 const SearchOptions& o) {
  check_inputs(model, src, src_pad, o);
  const ModelConfig& c = model.config();
  const int64_t B = src.size(0), V = c.tgt_vocab, K = o.beam;
  const std::vector<int64_t> src_len = source_lengths(src_pad);

  struct Beam {
    std::vector<int64_t> tokens;
    double log_prob = kNegInf;  // -inf: an empty slot (fewer live continuations than beams)
  };
  struct Sentence {
    int64_t index;                  // in the batch
    std::vector<Beam> beams;        // K, rows [sentence][beam] of the decoder state
    std::vector<Hypothesis> finished;
  };
  struct Candidate {
    double log_prob;
    int64_t beam, token;
  };
  std::vector<Sentence> active(B);
  for (int64_t i = 0; i < B; ++i) {
    active[i].index = i;
    active[i].beams.assign(K, Beam{});
    active[i].beams[0].log_prob = 0;  // the first step continues one beam only
  }
  std::vector<std::vector<Hypothesis>> out(B);
  attn::DecoderState state = model.start(model.encode(src, src_pad), src_pad);
  std::vector<int64_t> tokens(B * K, c.bos_id);
  std::vector<Candidate> cand;
  for (int64_t t = 0; !active.empty(); ++t) {
    const int64_t n = static_cast<int64_t>(active.size());
    std::vector<bool> force(n * K);
    for (int64_t a = 0; a < n; ++a)
      for (int64_t j = 0; j < K; ++j) force[a * K + j] = t + 1 >= max_output_length(c, o, src_len[active[a].index]);
    const std::vector<float> lp = next_log_probs(model, tokens, state, src.device(), force);
    const double norm = std::pow(static_cast<double>(t + 1), o.len_penalty);

    std::vector<int64_t> reorder(n * K), keep, next_tokens;
    std::vector<Sentence> still;
    for (int64_t a = 0; a < n; ++a) {
      Sentence& s = active[a];
      // The 2K best continuations: the 2K best tokens of each beam, then the best of those.
      cand.clear();
      const size_t top = static_cast<size_t>(std::min<int64_t>(2 * K, V));
      std::vector<int64_t> ids(V);
      for (int64_t j = 0; j < K; ++j) {
        if (s.beams[j].log_prob == kNegInf) continue;
        const float* row = lp.data() + (a * K + j) * V;
        for (int64_t v = 0; v < V; ++v) ids[v] = v;
        std::partial_sort(ids.begin(), ids.begin() + top, ids.end(),
                          [row](int64_t x, int64_t y) { return row[x] > row[y] || (row[x] == row[y] && x < y); });
        for (size_t i = 0; i < top; ++i)
          if (row[ids[i]] != -std::numeric_limits<float>::infinity())
            cand.push_back({s.beams[j].log_prob + row[ids[i]], j, ids[i]});
      }
      std::stable_sort(cand.begin(), cand.end(), [](const Candidate& x, const Candidate& y) {
        return x.log_prob > y.log_prob;
      });
      if (cand.size() > 2 * static_cast<size_t>(K)) cand.resize(2 * K);
      std::vector<Beam> next;
      for (size_t i = 0; i < cand.size(); ++i) {
        const Candidate& x = cand[i];
        if (x.token == c.eos_id) {
          if (static_cast<int64_t>(i) < K && static_cast<int64_t>(s.finished.size()) < K)
            s.finished.push_back({s.beams[x.beam].tokens, x.log_prob, x.log_prob / norm});
        } else if (static_cast<int64_t>(next.size()) < K) {
          Beam b{s.beams[x.beam].tokens, x.log_prob};
          b.tokens.push_back(x.token);
          reorder[a * K + static_cast<int64_t>(next.size())] = a * K + x.beam;
          next.push_back(std::move(b));
        }
      }
      for (int64_t j = static_cast<int64_t>(next.size()); j < K; ++j) {
        reorder[a * K + j] = a * K + j;  // an empty slot keeps its row
        next.push_back(Beam{});
      }
      const bool done = static_cast<int64_t>(s.finished.size()) >= K || next[0].log_prob == kNegInf;
      if (done) {
        std::stable_sort(s.finished.begin(), s.finished.end(),
                         [](const Hypothesis& x, const Hypothesis& y) { return x.score > y.score; });
        s.finished.resize(std::min<size_t>(s.finished.size(), o.nbest));
        out[s.index] = std::move(s.finished);
        continue;
      }
      s.beams = std::move(next);
      keep.push_back(a);
      for (int64_t j = 0; j < K; ++j)
        next_tokens.push_back(s.beams[j].tokens.empty() ? c.bos_id : s.beams[j].tokens.back());
      still.push_back(std::move(s));
    }
    if (still.empty()) break;
    bool moved = false;  // every beam in place (common): nothing to send to the device or reorder
    for (size_t i = 0; i < reorder.size() && !moved; ++i) moved = reorder[i] != static_cast<int64_t>(i);
    if (moved) state.reorder(index_tensor(reorder, src.device()));
    if (static_cast<int64_t>(still.size()) < n) state.keep_sentences(index_tensor(keep, src.device()), K);
    active = std::move(still);
    tokens = std::move(next_tokens);
  }
  return out;
}

}  // namespace translate
