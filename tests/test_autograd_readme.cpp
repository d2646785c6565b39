// autograd/README.md's rule table names exactly the ops declared in autograd/ops.h: every op has
// a row (its derivative rule, or "none" for an op without a gradient), and no row names an op that
// ops.h does not declare. Both files are read from the source tree (LINEA_SOURCE_DIR, set in
// CMakeLists.txt), so the test fails as soon as one of them changes without the other.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_source(const std::string& path) {
  std::ifstream f(std::string(LINEA_SOURCE_DIR) + "/" + path);
  EXPECT_TRUE(f.good()) << "cannot open " << LINEA_SOURCE_DIR << "/" << path;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The name at the start of s ("pow" in "pow(x, a)", "gelu" in "gelu (erf)"); "" when s starts
// with something else.
std::string leading_name(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return "";
  size_t n = 0;
  while (n < s.size() && name_char(s[n])) ++n;
  return s.substr(0, n);
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The functions declared in ops.h: a line that starts with the return type (not indented, not a
// comment), then the name and "(". The operators are left out: each one is spelled by a named op
// (+ is add, == is eq, ...), and "operator+(" has no name right before its "(".
std::set<std::string> declared_ops() {
  std::set<std::string> ops;
  std::istringstream in(read_source("autograd/ops.h"));
  for (std::string line; std::getline(in, line);) {
    const size_t paren = line.find('(');
    if (line.empty() || !name_char(line[0]) || paren == std::string::npos) continue;
    size_t start = paren;
    while (start > 0 && name_char(line[start - 1])) --start;
    if (start > 0 && start < paren && line[start - 1] == ' ') ops.insert(line.substr(start, paren - start));
  }
  return ops;
}

// The ops the table's first column names: one or more per row, separated by " / ", each maybe
// followed by its arguments or a note ("pow(x, a)", "gelu (erf)", "max / min (amax)"). A piece
// that does not start with a name goes to `unreadable`.
std::set<std::string> table_ops(std::vector<std::string>* unreadable) {
  std::istringstream in(read_source("autograd/README.md"));
  std::string line;
  while (std::getline(in, line) && line != "| op | forward | gradient(s) |") {
  }
  EXPECT_TRUE(in.good()) << "autograd/README.md has no table headed | op | forward | gradient(s) |";
  std::getline(in, line);  // |---|---|---|
  std::set<std::string> ops;
  while (std::getline(in, line) && line.rfind("|", 0) == 0) {
    const std::string cell = line.substr(1, line.find('|', 1) - 1);
    for (size_t start = 0; start <= cell.size();) {
      size_t slash = cell.find(" / ", start);
      if (slash == std::string::npos) slash = cell.size();
      const std::string piece = trim(cell.substr(start, slash - start)), op = leading_name(piece);
      if (!op.empty())
        ops.insert(op);
      else
        unreadable->push_back(piece + "  (in the row: " + line + ")");
      start = slash + 3;
    }
  }
  return ops;
}

TEST(AutogradReadme, RuleTableNamesExactlyTheOpsOfOpsH) {
  const std::set<std::string> declared = declared_ops();
  std::vector<std::string> unreadable;
  const std::set<std::string> table = table_ops(&unreadable);
  // Both readers found something like the whole op set (neither file moved or changed format).
  EXPECT_GT(declared.size(), 50u);
  EXPECT_GT(table.size(), 50u);
  for (const std::string& u : unreadable) ADD_FAILURE() << "the rule table's first column: no op name in '" << u << "'";

  std::set<std::string> missing, extra;
  for (const std::string& op : declared)
    if (!table.count(op)) missing.insert(op);
  for (const std::string& op : table)
    if (!declared.count(op)) extra.insert(op);
  EXPECT_TRUE(missing.empty()) << "declared in autograd/ops.h but without a row in autograd/README.md's rule table: "
                               << join(missing);
  EXPECT_TRUE(extra.empty()) << "in autograd/README.md's rule table but not declared in autograd/ops.h: "
                             << join(extra);
}

}  // namespace
