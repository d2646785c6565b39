// Attention spec strings ("softmax", "performer:features=128,feature_map=relu") and the registry
// that builds a mechanism from one: make_attention(spec, heads, head_dim). The built-in
// mechanisms (softmax, performer, ra, lara, nprf_rpe) are registered here, in attention/, so
// that nothing below attention/ depends on the mechanisms.
// Not here: the mechanism interface (attention/mechanism.h), the layers that use it
// (attention/multihead.h, attention/transformer.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "attention/mechanism.h"

namespace linea::attn {

// A parsed spec "name[:key=value[,key=value...]]". Getters return the default when the key is
// absent and throw when its value does not parse; each key a getter asks about becomes known,
// and check_all_used() then rejects any key no getter asked about (a typo such as
// "performer:feature=64" is an error, not a silently ignored option).
struct AttentionSpec {
  std::string name;
  std::map<std::string, std::string> options;

  // Throws linea::Error for malformed specs: empty name or key, a missing '=' or value,
  // duplicate keys, characters outside [A-Za-z0-9_.+-] in names, keys and values.
  static AttentionSpec parse(const std::string& spec);
  std::string str() const;  // canonical form: name, then key=value sorted by key

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;  // 1/0, true/false, yes/no, on/off
  std::string get_string(const std::string& key, const std::string& def) const;
  // Throws naming every key no getter has asked about, and the keys that were asked about.
  void check_all_used() const;

 private:
  const std::string* lookup(const std::string& key) const;  // marks key as known
  mutable std::set<std::string> known_;
};

using AttentionFactory =
    std::function<std::shared_ptr<AttentionMechanism>(const AttentionSpec& spec, int64_t heads, int64_t head_dim)>;

// Adds a mechanism under `name` (throws if the name is taken or malformed).
void register_attention(const std::string& name, AttentionFactory factory);
std::vector<std::string> registered_attentions();  // sorted names
// Parses the spec, builds the mechanism, checks every option was used and that the mechanism
// supports `use` (so "lara" as a causal decoder fails here, saying what lara supports). Throws
// "unknown attention 'x' (known: lara, ...)" for an unregistered name.
std::shared_ptr<AttentionMechanism> make_attention(const std::string& spec, int64_t heads, int64_t head_dim,
                                                   AttentionUse use = AttentionUse::Self);
std::shared_ptr<AttentionMechanism> make_attention(const AttentionSpec& spec, int64_t heads, int64_t head_dim,
                                                   AttentionUse use = AttentionUse::Self);

}  // namespace linea::attn
