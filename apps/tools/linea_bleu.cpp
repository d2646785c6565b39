// linea-bleu: corpus BLEU and chrF of a hypothesis file against reference files, printed as
// sacreBLEU 2.3.1's command line prints them (default `--format json`), with its rules for
// reading files, so that its output can be compared with sacreBLEU's byte for byte.
//
//   linea-bleu REF [REF...] [-i HYP] [-m bleu chrf] [-w 1] [-b] [-f json|text]
//
// Reading, as sacreBLEU does: files are UTF-8 (.gz ones gunzipped), lines end at '\n' only (a
// '\r' stays in the line, where it is whitespace), each line is right-stripped of Python's
// whitespace. The hypothesis comes from stdin when -i is absent or '-'; there sacreBLEU reads
// with universal newlines ('\r', '\r\n' and '\n' all end a line) and an empty stdin is one empty
// line. Tabs on stdin would make sacreBLEU score several systems, which is refused here.
// Metrics are printed in sacreBLEU's order (BLEU, then chrF), several as a JSON list.
// Not here: test sets (-t), several systems, --num-refs, tokenizers other than 13a, lowercasing,
// sentence-level scores, confidence intervals.
// Errors print "error: linea-bleu: <message>" on stderr and exit with status 1.
#include <zlib.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/tools/bleu.h"
#include "core/error.h"

using namespace linea;
namespace bl = linea::apps::bleu;

namespace {

struct Args {
  std::vector<std::string> refs;
  std::string input = "-";
  std::vector<std::string> metrics = {"bleu"};
  int width = 1;
  bool score_only = false;
  std::string format = "json";
  bl::ChrfOptions chrf;
};

std::string read_file(const std::string& path) {
  LINEA_CHECK(!std::filesystem::is_directory(path), "cannot read '", path, "': it is a directory");
  std::string data;
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    gzFile f = gzopen(path.c_str(), "rb");
    LINEA_CHECK(f, "cannot open '", path, "': ", std::strerror(errno));
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) data.append(buf, n);
    // A stream cut short ends like a complete one (n == 0) but leaves Z_BUF_ERROR behind.
    int err = Z_OK;
    const std::string msg = gzerror(f, &err);
    gzclose(f);
    LINEA_CHECK(n == 0 && err == Z_OK, "cannot read '", path, "': ", msg, " (a truncated or corrupt gzip file?)");
    return data;
  }
  std::ifstream f(path, std::ios::binary);
  LINEA_CHECK(f, "cannot open '", path, "': ", std::strerror(errno));
  data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  LINEA_CHECK(!f.bad(), "cannot read '", path, "'");
  return data;
}

// Splits at '\n' (and, with universal newlines, at '\r\n' and '\r'); no line after a final
// terminator. Each line is right-stripped (which also checks that it is UTF-8).
std::vector<std::string> split_lines(const std::string& data, bool universal, const std::string& name) {
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\n' || (universal && data[i] == '\r')) {
      lines.push_back(data.substr(b, i - b));
      if (universal && data[i] == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
      b = i + 1;
    }
  }
  if (b < data.size()) lines.push_back(data.substr(b));
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      lines[i] = bl::rstrip(lines[i]);
    } catch (const Error& e) {
      LINEA_FAIL(name, " line ", i + 1, ": ", e.what());
    }
  }
  return lines;
}

std::vector<std::string> read_hypotheses(const std::string& input) {
  if (input != "-") {
    auto lines = split_lines(read_file(input), false, "'" + input + "'");
    LINEA_CHECK(!lines.empty(), "'", input, "' has no lines (nothing to score)");
    return lines;
  }
  std::string data((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto lines = split_lines(data, true, "stdin");
  if (lines.empty()) lines.emplace_back();  // sacreBLEU's first readline() of an empty stdin
  for (size_t i = 0; i < lines.size(); ++i)
    LINEA_CHECK(lines[i].find('\t') == std::string::npos, "stdin line ", i + 1,
                " has a tab: sacreBLEU would read tab-separated systems, which linea-bleu does not score "
                "(give the file with -i)");
  return lines;
}

int run(const Args& a) {
  LINEA_CHECK(!a.refs.empty(), "no reference files (usage: linea-bleu REF [REF...] -i HYP)");
  // A huge width would make printf write billions of digits (a hang, not an error).
  LINEA_CHECK(a.width >= 0 && a.width <= 100, "-w must be >= 0 and <= 100, got ", a.width);
  // chrF keeps char_order counters per sentence and squares beta in an int.
  LINEA_CHECK(a.chrf.char_order >= 1 && a.chrf.char_order <= 1000, "--chrf-char-order must be in [1, 1000], got ",
              a.chrf.char_order);
  LINEA_CHECK(a.chrf.beta >= 0 && a.chrf.beta <= 1000, "--chrf-beta must be in [0, 1000], got ", a.chrf.beta);
  std::vector<std::vector<std::string>> refs;
  for (auto& path : a.refs) refs.push_back(split_lines(read_file(path), false, "'" + path + "'"));
  const auto hyps = read_hypotheses(a.input);
  const std::string hyp_name = a.input == "-" ? "stdin" : "'" + a.input + "'";
  for (size_t r = 0; r < refs.size(); ++r)
    LINEA_CHECK(refs[r].size() == hyps.size(), "the hypothesis (", hyp_name, ") has ", hyps.size(),
                " lines but reference '", a.refs[r], "' has ", refs[r].size());

  std::vector<std::string> results;
  const std::set<std::string> metrics(a.metrics.begin(), a.metrics.end());  // sorted: bleu, chrf
  for (auto& m : metrics) {
    bl::Score s = m == "bleu" ? bl::Score(bl::corpus_bleu(hyps, refs)) : bl::Score(bl::corpus_chrf(hyps, refs, a.chrf));
    results.push_back(a.score_only         ? bl::format_score(s.score, a.width)
                      : a.format == "json" ? bl::to_json(s, a.width)
                                           : bl::to_text(s, a.width));
  }

  // utils.print_single_results
  if (a.format == "json") {
    if (results.size() == 1)
      std::cout << results[0] << "\n";
    else
      std::cout << "[\n" << CLI::detail::join(results, ",\n") << "\n]\n";
  } else if (a.score_only || results.size() == 1) {
    for (auto& r : results) std::cout << r << "\n";
  } else {  // several text lines: right-align what comes before " = "
    size_t w = 0;
    for (auto& r : results) w = std::max(w, r.find('=') - 1);
    for (auto& r : results) {
      const size_t k = r.find('=') - 1;
      std::cout << std::string(w - k, ' ') << r << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Corpus BLEU and chrF exactly as sacreBLEU " + std::string(bl::kSacrebleuVersion) +
                   " computes them with its defaults (13a tokenization, exp smoothing; chrF2), printed as "
                   "sacreBLEU prints them.",
               "linea-bleu"};
  Args a;
  app.add_option("refs", a.refs, "reference files, one segment per line (several: multi-reference)");
  app.add_option("-i,--input", a.input, "hypothesis file; '-' or absent: stdin");
  app.add_option("-m,--metrics", a.metrics, "bleu, chrf or both (default bleu)")
      ->check(CLI::IsMember({"bleu", "chrf"}));
  app.add_option("-w,--width", a.width, "decimals of the score (default 1)");
  app.add_flag("-b,--score-only", a.score_only, "print only the score");
  app.add_option("-f,--format", a.format, "json (default) or text")->check(CLI::IsMember({"json", "text"}));
  app.add_option("--chrf-char-order", a.chrf.char_order, "chrF character n-gram order (default 6)");
  app.add_option("--chrf-beta", a.chrf.beta, "chrF recall weight beta (default 2)");
  app.add_flag("--chrf-whitespace", a.chrf.whitespace, "keep whitespace in chrF's character n-grams");
  app.add_flag("--chrf-eps-smoothing", a.chrf.eps_smoothing, "chrF++.py's epsilon smoothing (signature eff:no)");
  app.set_version_flag("-V,--version", std::string("linea-bleu (sacreBLEU ") + bl::kSacrebleuVersion + ")");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "error: linea-bleu: " << e.what() << " (see --help)\n";
    return 1;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "error: linea-bleu: " << e.what() << "\n";
    return 1;
  }
}
