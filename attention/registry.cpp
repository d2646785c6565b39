// Attention specs and the mechanism registry, with the built-in mechanisms (see registry.h).
#include "attention/registry.h"

#include <cctype>
#include <cmath>
#include <mutex>

#include "attention/lara/lara.h"
#include "attention/nprf_rpe/nprf_rpe.h"
#include "attention/performer/performer.h"
#include "attention/ra/ra.h"
#include "attention/softmax/softmax.h"

namespace linea::attn {

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
  std::map<std::string, AttentionInfo> mechanisms;
  Registry() {
    // The built-in mechanisms, each described in its folder.
    for (AttentionInfo info : {softmax_info(), performer_info(), ra_info(), lara_info(), nprf_rpe_info()})
      mechanisms[info.name] = std::move(info);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

bool supports(const AttentionSupport& s, AttentionUse use) {
  return use == AttentionUse::Self || (use == AttentionUse::CausalSelf ? s.causal : s.cross);
}
}  // namespace

void register_attention(AttentionInfo info) {
  LINEA_CHECK(valid_token(info.name), "register_attention: invalid name '", info.name, "'");
  LINEA_CHECK(info.factory != nullptr, "register_attention: empty factory for '", info.name, "'");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  LINEA_CHECK(r.mechanisms.count(info.name) == 0, "register_attention: '", info.name, "' is already registered");
  const std::string name = info.name;
  r.mechanisms[name] = std::move(info);
}

void register_attention(const std::string& name, AttentionFactory factory) {
  AttentionInfo info;
  info.name = name;
  info.factory = std::move(factory);
  register_attention(std::move(info));
}

std::vector<std::string> registered_attentions() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (auto& [n, _] : r.mechanisms) names.push_back(n);
  return names;
}

AttentionInfo attention_info(const std::string& name) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.mechanisms.find(name);
    if (it != r.mechanisms.end()) return it->second;
  }
  LINEA_FAIL("unknown attention '", name, "' (known: ", join(registered_attentions()), ")");
}

std::vector<std::string> attentions_for(AttentionUse use) {
  std::vector<std::string> names;
  for (const std::string& n : registered_attentions())
    if (supports(attention_info(n).support, use)) names.push_back(n);
  return names;
}

std::string attention_flag_help(AttentionUse use) {
  return join(attentions_for(use)) + ", with options as name:key=value,... (e.g. performer:features=64; " +
         "linea-attn --list shows each one's options)";
}

std::string describe_attentions() {
  std::string out;
  for (const std::string& n : registered_attentions()) {
    const AttentionInfo info = attention_info(n);
    out += n + (info.summary.empty() ? "" : ": " + info.summary) + "\n";
    out += "  supports: " + info.support.str() + "\n";
    for (const AttentionOption& o : info.options)
      out += "  " + o.key + "=" + o.default_value + (o.meaning.empty() ? "" : "  " + o.meaning) + "\n";
  }
  return out;
}

std::string with_length(const std::string& spec_text, int64_t length) {
  AttentionSpec spec = AttentionSpec::parse(spec_text);
  const std::string key = attention_info(spec.name).length_option;
  if (key.empty() || spec.options.count(key)) return spec_text;
  spec.options[key] = std::to_string(length);
  return spec.str();
}

std::shared_ptr<AttentionMechanism> make_attention(const AttentionSpec& spec, int64_t heads, int64_t head_dim,
                                                   AttentionUse use) {
  LINEA_CHECK(heads > 0 && head_dim > 0, "make_attention('", spec.str(),
              "'): heads and head_dim must be positive, got ", heads, " and ", head_dim);
  const AttentionFactory factory = attention_info(spec.name).factory;
  std::shared_ptr<AttentionMechanism> m = factory(spec, heads, head_dim);
  LINEA_CHECK(m != nullptr, "make_attention: the factory of '", spec.name, "' returned null");
  spec.check_all_used();
  m->check_use(use, spec.str());
  return m;
}

std::shared_ptr<AttentionMechanism> make_attention(const std::string& spec, int64_t heads, int64_t head_dim,
                                                   AttentionUse use) {
  return make_attention(AttentionSpec::parse(spec), heads, head_dim, use);
}

}  // namespace linea::attn
