// linea::Error and the checking macros used for every user-facing argument check.
// Not for internal invariants of a kernel (those are bugs, not user errors). Also join(), for
// messages that list names.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace linea {

// The one exception type Linea throws for bad input: shape/dtype/device mismatches,
// bad files, bad flags. The message names the op and the values at fault.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void concat_into(std::ostringstream&) {}
template <typename T, typename... Rest> void concat_into(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  concat_into(os, rest...);
}
template <typename... Args> std::string concat(const Args&... args) {
  std::ostringstream os;
  concat_into(os, args...);
  return os.str();
}
}  // namespace detail

// "a, b, c": the parts of a message listing names (keys, options, files).
inline std::string join(const std::vector<std::string>& parts, const std::string& sep = ", ") {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? sep : std::string()) + parts[i];
  return s;
}

}  // namespace linea

// LINEA_CHECK(cond, "op: ", "message parts", ...) throws linea::Error built from the parts.
#define LINEA_CHECK(cond, ...)                                               \
  do {                                                                       \
    if (!(cond)) throw ::linea::Error(::linea::detail::concat(__VA_ARGS__)); \
  } while (0)

#define LINEA_FAIL(...) throw ::linea::Error(::linea::detail::concat(__VA_ARGS__))
