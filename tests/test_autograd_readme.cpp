// autograd/README.md's rule table names exactly the ops declared in autograd/ops.h: every op has
// a row (its derivative rule, or "none" for an op without a gradient), and no row names an op that
// ops.h does not declare. Both files are read from the source tree (LINEA_SOURCE_DIR, set in
// CMakeLists.txt), so the test fails as soon as one of them changes without the other.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
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

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The functions declared in ops.h: a line that starts with a return type, then the name and "(".
// The operators are left out: each one is spelled by a named op (+ is add, == is eq, ...).
std::set<std::string> declared_ops() {
  static const std::regex declaration(R"(^(?:const )?[\w:]+(?:<[^>]*>)?&? (\w+)\()");
  std::set<std::string> ops;
  std::istringstream in(read_source("autograd/ops.h"));
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, declaration)) ops.insert(m[1]);
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
  static const std::regex name(R"(^[A-Za-z_]\w*)");
  std::set<std::string> ops;
  while (std::getline(in, line) && line.rfind("|", 0) == 0) {
    const std::string cell = line.substr(1, line.find('|', 1) - 1);
    for (size_t start = 0; start <= cell.size();) {
      size_t slash = cell.find(" / ", start);
      if (slash == std::string::npos) slash = cell.size();
      const std::string piece = trim(cell.substr(start, slash - start));
      std::smatch m;
      if (std::regex_search(piece, m, name))
        ops.insert(m[0]);
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
