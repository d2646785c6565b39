// Fuzz target: the safetensors reader (nn/safetensors.h). The input is a whole file's bytes,
// parsed in memory by nn::detail::parse_safetensors. A file that parses must then
//  - survive a round trip: written back by serialize_safetensors and parsed again, it gives the
//    same tensors (dtype, shape, bytes) and metadata;
//  - load, or be refused with linea::Error, through the strict and the non-strict state-dict
//    path of a small module (Module::load_state_dict).
#include <cstring>

#include "fuzz_util.h"
#include "nn/safetensors.h"

using namespace linea;

namespace {

class Tiny : public nn::Module {
 public:
  Tiny() : Module("Tiny") {
    register_parameter("weight", zeros({2, 3}));
    register_parameter("bias", zeros({3}));
    register_buffer("count", zeros({}, TensorOptions(DType::Int64)));
  }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const size_t n = static_cast<size_t>(a.numel()) * a.element_size();
  return n == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), n) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  nn::SafetensorsFile f;
  if (!fuzz::expect_ok_or_error(
          [&] { f = nn::detail::parse_safetensors(reinterpret_cast<const char*>(data), size, "fuzz.safetensors"); }))
    return 0;

  // A parsed file is one Linea can write back, and reading that gives the same values.
  const std::string again = nn::detail::serialize_safetensors(f.tensors, f.metadata);
  nn::SafetensorsFile g = nn::detail::parse_safetensors(again.data(), again.size(), "round trip");
  LINEA_FUZZ_ASSERT(g.metadata == f.metadata, "metadata changed in a round trip");
  LINEA_FUZZ_ASSERT(g.tensors.size() == f.tensors.size(), "tensor count changed in a round trip");
  for (const auto& [name, t] : f.tensors) {
    auto it = g.tensors.find(name);
    LINEA_FUZZ_ASSERT(it != g.tensors.end() && same_bytes(t, it->second), "tensor '", name,
                      "' changed in a round trip");
  }

  Tiny strict_model, loose_model;
  fuzz::expect_ok_or_error([&] { strict_model.load_state_dict(f.tensors, /*strict=*/true); });
  fuzz::expect_ok_or_error([&] { loose_model.load_state_dict(f.tensors, /*strict=*/false); });
  return 0;
}
