// Fuzz target: attention spec strings (attention/registry.h): AttentionSpec::parse, str() and
// make_attention(spec, heads, head_dim, use), then one small forward of whatever was built.
// Input layout: 3 bytes of options, then the spec text ("performer:features=8,redraw=2").
//   byte 0  heads - 1 (mod 4)      byte 1  head_dim - 1 (mod 8)
//   byte 2  bits 0-1: the use (self, causal self, cross); bit 2: run a forward on q, k, v of
//           length 3 (cross: 2 keys), the last key padded; bit 3: in eval mode
// A spec that parses must print (str()) as a spec that parses to the same name and options; an
// option value out of range (features=1000000000000) must be a linea::Error, not an allocation.
// The forward runs only when every integer option is at most 64, to keep iterations fast.
#include "attention/registry.h"
#include "core/random.h"
#include "fuzz_util.h"

using namespace linea;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  if (size < 3) return 0;
  const int64_t heads = 1 + data[0] % 4, head_dim = 1 + data[1] % 8;
  const attn::AttentionUse uses[] = {attn::AttentionUse::Self, attn::AttentionUse::CausalSelf,
                                     attn::AttentionUse::Cross};
  const attn::AttentionUse use = uses[(data[2] & 3) % 3];
  const bool forward = data[2] & 4, eval = data[2] & 8;
  const std::string text(reinterpret_cast<const char*>(data + 3), size - 3);

  attn::AttentionSpec spec;
  if (!fuzz::expect_ok_or_error([&] { spec = attn::AttentionSpec::parse(text); })) return 0;
  const std::string canonical = spec.str();
  const attn::AttentionSpec again = attn::AttentionSpec::parse(canonical);
  LINEA_FUZZ_ASSERT(again.name == spec.name && again.options == spec.options, "spec '", text, "' prints as '",
                    canonical, "', which parses differently");
  LINEA_FUZZ_ASSERT(again.str() == canonical, "str() is not canonical for '", text, "'");

  manual_seed(0);
  std::shared_ptr<attn::AttentionMechanism> m;
  if (!fuzz::expect_ok_or_error([&] { m = attn::make_attention(spec, heads, head_dim, use); })) return 0;
  LINEA_FUZZ_ASSERT(m != nullptr && m->heads() == heads && m->head_dim() == head_dim, "make_attention('", canonical,
                    "') built a mechanism of the wrong size");
  if (!forward) return 0;
  for (const auto& [key, value] : spec.options) {
    const bool small_int = value.size() <= 3 && value.find_first_not_of("0123456789") == std::string::npos;
    const bool number = value.find_first_not_of("0123456789+-.eE") == std::string::npos;
    if (number && !(small_int && std::stoi(value) <= 64)) return 0;
  }
  if (eval) m->eval();
  const int64_t N = 3, M = use == attn::AttentionUse::Cross ? 2 : N;
  const Tensor q = randn({1, heads, N, head_dim}), k = randn({1, heads, M, head_dim}), v = randn({1, heads, M, 2});
  attn::AttentionOptions opts;
  opts.causal = use == attn::AttentionUse::CausalSelf;
  std::vector<int64_t> pad(static_cast<size_t>(M), 0);
  pad.back() = 1;
  opts.key_padding_mask = from_vector<int64_t>(pad, {1, M});
  fuzz::expect_ok_or_error([&] {
    const Tensor out = (*m)(q, k, v, opts);
    LINEA_FUZZ_ASSERT(out.shape() == Shape({1, heads, N, 2}), "'", canonical, "' forward gave ",
                      shape_str(out.shape()));
  });
  return 0;
}
