// Attention spec strings ("softmax", "performer:features=128,feature_map=relu") and the registry,
// the one list of mechanisms: make_attention(spec, heads, head_dim) builds one, attention_info
// says what it is. The built-in mechanisms register in their folders (<name>_info()) and are
// listed once in registry.cpp; a program adds its own with register_attention
// (apps/examples/custom_attention).
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
  std::vector<std::string> asked() const { return {known_.begin(), known_.end()}; }  // the keys getters asked about

 private:
  const std::string* lookup(const std::string& key) const;  // marks key as known
  mutable std::set<std::string> known_;
};

using AttentionFactory =
    std::function<std::shared_ptr<AttentionMechanism>(const AttentionSpec& spec, int64_t heads, int64_t head_dim)>;

// One option of a mechanism's spec: its key, its default as a spec would write it, its meaning.
struct AttentionOption {
  std::string key, default_value, meaning;
};

// What a mechanism registers: the one place that says what it is. The apps' --help, linea-attn,
// the benchmarks and the shared test suites (tests/attention_suite.h) read it from here.
struct AttentionInfo {
  std::string name;                      // the spec's name, e.g. "performer"
  std::string summary;                   // one line: what it computes and its cost
  AttentionSupport support;              // what it can be built for (the suite checks the built one says the same)
  std::vector<AttentionOption> options;  // every key its factory reads, with the defaults it uses
  AttentionFactory factory;
  // Small settings for the shared suites (few features or samples keep float64 gradchecks fast).
  std::vector<std::string> test_specs;
  std::string count_option;   // the option that sets its random features or samples ("": exact)
  std::string length_option;  // the option bounding the sequence length it is built for ("": none)
};

// Adds a mechanism (throws if the name is taken or malformed, or the factory is empty).
void register_attention(AttentionInfo info);
// The short form: a name and a factory, nothing declared.
void register_attention(const std::string& name, AttentionFactory factory);
std::vector<std::string> registered_attentions();  // sorted names
AttentionInfo attention_info(const std::string& name);  // throws "unknown attention 'x' (known: ...)"
// The registered mechanisms that support `use`, sorted.
std::vector<std::string> attentions_for(AttentionUse use);
// --help text of a flag taking a spec for `use`: "softmax, performer, ..., with options as
// name:key=value,... (e.g. performer:features=64)".
std::string attention_flag_help(AttentionUse use);
// Every mechanism with its summary, support and options, as linea-attn --list prints it.
std::string describe_attentions();
// `spec` with its mechanism's length option set to `length` when the spec does not set it (e.g.
// nprf_rpe's max_len for a benchmark at one sequence length); other specs as they are.
std::string with_length(const std::string& spec, int64_t length);

// Parses the spec, builds the mechanism, checks every option was used and that the mechanism
// supports `use` (so "lara" as a causal decoder fails here, saying what lara supports). Throws
// "unknown attention 'x' (known: lara, ...)" for an unregistered name.
std::shared_ptr<AttentionMechanism> make_attention(const std::string& spec, int64_t heads, int64_t head_dim,
                                                   AttentionUse use = AttentionUse::Self);
std::shared_ptr<AttentionMechanism> make_attention(const AttentionSpec& spec, int64_t heads, int64_t head_dim,
                                                   AttentionUse use = AttentionUse::Self);

}  // namespace linea::attn
