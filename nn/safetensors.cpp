// safetensors writer and validating reader (format described in nn/safetensors.h).
// The reader never trusts a number from the file before checking it against the file size,
// and converts every problem into a linea::Error that names the file.
// Not here: training checkpoints (nn/checkpoint.cpp).
#include "nn/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/ops.h"
#include "nn/io_util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nn/safetensors.cpp assumes a little-endian host (safetensors data is little-endian)"
#endif

namespace linea::nn {

namespace {

using ordered_json = nlohmann::ordered_json;
using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "F32";
    case DType::Float64:
      return "F64";
    case DType::Int64:
      return "I64";
    case DType::Bool:
      return "BOOL";
  }
  return "?";
}

// A dtype name of the safetensors spec, with its element size and the Linea dtype it loads as.
struct FileDType {
  const char* name;
  size_t size;
  DType loads_as;
  bool supported;
};

const FileDType kFileDTypes[] = {
    {"BOOL", 1, DType::Bool, true},    {"U8", 1, DType::Int64, true},         {"I8", 1, DType::Int64, true},
    {"I16", 2, DType::Int64, true},    {"U16", 2, DType::Int64, true},        {"I32", 4, DType::Int64, true},
    {"U32", 4, DType::Int64, true},    {"I64", 8, DType::Int64, true},        {"F16", 2, DType::Float32, true},
    {"BF16", 2, DType::Float32, true}, {"F32", 4, DType::Float32, true},      {"F64", 8, DType::Float64, true},
    {"U64", 8, DType::Int64, false},   {"F8_E4M3", 1, DType::Float32, false}, {"F8_E5M2", 1, DType::Float32, false},
    {"C64", 8, DType::Float32, false},
};

const FileDType* find_file_dtype(const std::string& name) {
  for (const FileDType& d : kFileDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const FileDType& d : kFileDTypes)
    if (d.supported) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// IEEE half -> float (handles subnormals, inf and NaN).
float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Decodes `count` elements of file dtype `fd` at `src` into the contiguous CPU tensor `dst`.
void decode_into(const FileDType& fd, const char* src, int64_t count, const Tensor& dst) {
  const std::string n = fd.name;
  if (n == "F32" || n == "F64" || n == "I64") {
    if (count > 0) std::memcpy(dst.data_ptr(), src, static_cast<size_t>(count) * fd.size);
    return;
  }
  if (n == "BOOL") {  // stored as bytes; anything non-zero is true
    auto* d = static_cast<uint8_t*>(dst.data_ptr());
    for (int64_t i = 0; i < count; ++i) d[i] = src[i] != 0 ? 1 : 0;
    return;
  }
  if (n == "F16" || n == "BF16") {
    float* d = dst.data<float>();
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if (n == "F16") {
        d[i] = half_to_float(h);
      } else {
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&d[i], &bits, 4);
      }
    }
    return;
  }
  int64_t* d = dst.data<int64_t>();
  auto load = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t i = 0; i < count; ++i) {
      T v;
      std::memcpy(&v, src + sizeof(T) * i, sizeof(T));
      d[i] = static_cast<int64_t>(v);
    }
  };
  if (n == "U8")
    load(uint8_t{});
  else if (n == "I8")
    load(int8_t{});
  else if (n == "I16")
    load(int16_t{});
  else if (n == "U16")
    load(uint16_t{});
  else if (n == "I32")
    load(int32_t{});
  else if (n == "U32")
    load(uint32_t{});
}

// A JSON value as a non-negative integer that fits in uint64 (false if it is anything else).
bool as_u64(const json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// The tensors of a state dict in the order they are written: element size descending, then
// name (as the reference writer does, so every tensor's bytes are aligned to its element size).
struct Prepared {
  std::string header;        // 8-byte length + padded JSON
  std::vector<Tensor> data;  // contiguous CPU tensors, in data order
};

Prepared prepare(const StateDict& tensors, const Metadata& metadata, const char* op) {
  std::vector<std::pair<std::string, Tensor>> items;
  for (const auto& [name, t] : tensors) {
    LINEA_CHECK(name != "__metadata__", op, ": the tensor name \"__metadata__\" is reserved for the metadata");
    LINEA_CHECK(t.defined(), op, ": tensor '", name, "' is undefined");
    items.emplace_back(name, t);
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.second.element_size() > b.second.element_size(); });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json md = ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = md;
  }
  Prepared p;
  uint64_t offset = 0;
  for (auto& [name, t] : items) {
    Tensor c = t.detach().to(kCPU).contiguous();
    uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    ordered_json entry = ordered_json::object();
    entry["dtype"] = st_dtype_name(c.dtype());
    entry["shape"] = c.shape();
    entry["data_offsets"] = {offset, offset + nbytes};
    header[name] = entry;
    offset += nbytes;
    p.data.push_back(c);
  }
  std::string js;
  try {
    js = header.dump();
  } catch (const nlohmann::json::exception& e) {
    LINEA_FAIL(op, ": a tensor name or metadata string is not valid UTF-8 (", e.what(), ")");
  }
  js.append((8 - js.size() % 8) % 8, ' ');
  uint64_t n = js.size();
  p.header.resize(8);
  for (int i = 0; i < 8; ++i) p.header[i] = static_cast<char>((n >> (8 * i)) & 0xffu);
  p.header += js;
  return p;
}

}  // namespace

namespace detail {

std::string serialize_safetensors(const StateDict& tensors, const Metadata& metadata) {
  Prepared p = prepare(tensors, metadata, "save_safetensors");
  std::string out = p.header;
  for (const Tensor& t : p.data)
    out.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  return out;
}

SafetensorsFile parse_safetensors(const char* bytes, size_t size, const std::string& name) {
  auto fail = [&](const auto&... parts) -> void { LINEA_FAIL("load_safetensors: '", name, "': ", parts...); };
  if (size < 8)
    fail("file is ", size, " bytes, too short for the 8-byte header length (truncated or not a safetensors file)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxHeaderBytes)
    fail("header length ", n, " is larger than the ", kMaxHeaderBytes,
         "-byte limit (corrupted or not a safetensors file)");
  if (n > size - 8) fail("header length ", n, " exceeds the ", size - 8, " bytes after it (truncated file?)");

  json header;
  // nlohmann keeps the last of duplicate keys silently; a header naming a tensor twice is corrupt.
  std::set<std::string> top_keys;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !top_keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(bytes + 8, bytes + 8 + n, on_event);
  } catch (const json::exception& e) {
    fail("invalid JSON header: ", e.what());
  }
  if (!duplicate.empty()) fail("the JSON header names '", duplicate, "' more than once");
  if (!header.is_object()) fail("the JSON header must be an object, got ", header.type_name());

  struct Entry {
    std::string name;
    const FileDType* dtype;
    Shape shape;
    int64_t numel;
    uint64_t begin, end;
  };
  const uint64_t data_len = size - 8 - n;
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail("\"__metadata__\" must be an object of strings, got ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail("\"__metadata__\" entry '", m.key(), "' must be a string, got ", m.value().type_name());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail("tensor '", key, "': entry must be an object, got ", v.type_name());
    Entry e{key, nullptr, {}, 0, 0, 0};
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) fail("tensor '", key, "': missing or non-string \"dtype\"");
    const std::string dname = dt->get<std::string>();
    e.dtype = find_file_dtype(dname);
    if (e.dtype == nullptr) fail("tensor '", key, "': unknown dtype '", dname, "' (supported: ", known_dtypes(), ")");
    if (!e.dtype->supported)
      fail("tensor '", key, "': dtype ", dname, " is not supported by Linea (supported: ", known_dtypes(), ")");

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array())
      fail("tensor '", key, "': missing \"shape\" (expected an array of non-negative integers)");
    for (const json& d : *sh) {
      uint64_t dim = 0;
      if (!as_u64(d, dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("tensor '", key, "': \"shape\" ", sh->dump(), " is not an array of non-negative 64-bit integers");
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    // numel (and so numel * element size) must fit in the data section; checking each factor
    // keeps the product from overflowing.
    uint64_t numel = 1;
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      numel = 0;
      // No data needed, but huge other dims would still overflow a tensor's strides.
      if (!shape_fits(e.shape))
        fail("tensor '", key, "': shape ", shape_str(e.shape),
             " is too large for a tensor (its product overflows int64)");
    } else {
      for (int64_t dim : e.shape) {
        if (numel > data_len / static_cast<uint64_t>(dim))
          fail("tensor '", key, "': shape ", shape_str(e.shape), " needs more bytes than the ", data_len,
               "-byte data section (truncated file?)");
        numel *= static_cast<uint64_t>(dim);
      }
    }
    e.numel = static_cast<int64_t>(numel);

    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], e.begin) ||
        !as_u64((*off)[1], e.end))
      fail("tensor '", key,
           "': missing or malformed \"data_offsets\" (expected [begin, end] with non-negative integers)");
    if (e.begin > e.end) fail("tensor '", key, "': data_offsets [", e.begin, ", ", e.end, "] end before they begin");
    if (e.end > data_len)
      fail("tensor '", key, "': data_offsets [", e.begin, ", ", e.end, "] lie outside the data section of ", data_len,
           " bytes (truncated file?)");
    // numel <= data_len here, so the product cannot overflow.
    uint64_t need = numel * e.dtype->size;
    if (e.end - e.begin != need)
      fail("tensor '", key, "': data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin, " bytes, but dtype ",
           dname, " and shape ", shape_str(e.shape), " need ", need);
    entries.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly: no overlaps, no gaps, nothing left over.
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    if (e->begin < pos)
      fail("tensors '", prev->name, "' [", prev->begin, ", ", prev->end, "] and '", e->name, "' [", e->begin, ", ",
           e->end, "] overlap");
    if (e->begin > pos) fail("gap of ", e->begin - pos, " bytes before tensor '", e->name, "' at offset ", e->begin);
    pos = e->end;
    prev = e;
  }
  if (pos != data_len)
    fail("the data section is ", data_len, " bytes, but the tensors in the header account for ", pos,
         pos < data_len ? " (trailing bytes: corrupted file?)" : "");

  const char* data = bytes + 8 + n;
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, TensorOptions(e.dtype->loads_as));
    decode_into(*e.dtype, data + e.begin, e.numel, t);
    out.tensors[e.name] = t;
  }
  return out;
}

}  // namespace detail

std::string detail::write_safetensors_temp(const std::string& path, const StateDict& tensors,
                                           const Metadata& metadata) {
  Prepared p = prepare(tensors, metadata, "save_safetensors");
  std::vector<detail::ByteSpan> pieces{{p.header.data(), p.header.size()}};
  for (const Tensor& t : p.data) pieces.push_back({t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size()});
  return detail::write_temp_file(path, pieces, "save_safetensors");
}

void save_safetensors(const std::string& path, const StateDict& tensors, const Metadata& metadata) {
  detail::commit_temp_file(detail::write_safetensors_temp(path, tensors, metadata), path, "save_safetensors");
}

SafetensorsFile load_safetensors(const std::string& path, Device device) {
  std::vector<char> bytes = detail::read_file_bytes(path, "load_safetensors");
  SafetensorsFile f = detail::parse_safetensors(bytes.data(), bytes.size(), path);
  if (!device.is_cpu())
    for (auto& [_, t] : f.tensors) t = t.to(device);
  return f;
}

void save_module(const std::string& path, const Module& module, const Metadata& metadata) {
  save_safetensors(path, module.state_dict(), metadata);
}

Metadata load_module(const std::string& path, Module& module, bool strict) {
  SafetensorsFile f = load_safetensors(path);
  try {
    module.load_state_dict(f.tensors, strict);
  } catch (const Error& e) {
    LINEA_FAIL("load_module: '", path, "': ", e.what());
  }
  return f.metadata;
}

}  // namespace linea::nn
