// Config structs <-> JSON, each field written once: a struct lists its fields beside its
// definition with nlohmann's macro,
//
//   NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, dim, heads, layers, attention)
//
// which gives `nlohmann::json j = config;` (the checkpoint's config.json) and j.get<ModelConfig>().
// config_from_json reads one back with errors a user can act on: the file's key that is missing
// or of the wrong type is named (nlohmann's own type error does not say which key).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace linea::apps {

// j as a T. `what` starts the errors, e.g. "protein: the model config"; keys in `optional` may be
// absent (settings added later: older checkpoints get the default).
template <typename T>
T config_from_json(const nlohmann::json& j, const std::string& what, const std::vector<std::string>& optional = {}) {
  LINEA_CHECK(j.is_object(), what, " must be a JSON object, got ", j.type_name());
  const nlohmann::json defaults = T{};
  nlohmann::json full = j;
  for (const auto& [key, def] : defaults.items()) {
    if (!j.contains(key)) {
      bool may_miss = false;
      for (const std::string& k : optional) may_miss = may_miss || k == key;
      LINEA_CHECK(may_miss, what, " has no \"", key, "\"");
      full[key] = def;
      continue;
    }
    const nlohmann::json& v = j.at(key);
    const bool same_kind = (v.is_number() && def.is_number()) || v.type() == def.type();
    LINEA_CHECK(same_kind, what, "'s \"", key, "\" has the wrong type (", v.type_name(), ": ", v.dump(), ")");
  }
  try {
    return full.get<T>();
  } catch (const nlohmann::json::exception& e) {
    LINEA_FAIL(what, ": ", e.what());
  }
}

}  // namespace linea::apps
