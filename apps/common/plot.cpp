// plot_png and gnuplot_available (see plot.h): writes a gnuplot data file and script, runs
// gnuplot on them, and moves the finished picture into place.
// Not here: any drawing of our own — if gnuplot is missing there is no picture, only a reason.
#include "apps/common/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace linea::apps {
namespace {

// A temporary file (mkstemp under $TMPDIR or /tmp) removed when this goes out of scope.
struct TempFile {
  std::string path;
  TempFile() = default;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!path.empty()) std::remove(path.c_str());
  }
  // Creates the file and writes `text` into it; false with *why on failure.
  bool create(const char* stem, const std::string& text, std::string* why) {
    const char* dir = std::getenv("TMPDIR");
    std::string templ = std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    int fd = ::mkstemp(buf.data());
    if (fd < 0) {
      *why = "cannot create a temporary file '" + templ + "': " + std::strerror(errno);
      return false;
    }
    path = buf.data();
    size_t off = 0;
    while (off < text.size()) {
      ssize_t n = ::write(fd, text.data() + off, text.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        *why = "cannot write the temporary file '" + path + "': " + std::strerror(errno);
        ::close(fd);
        return false;
      }
      off += static_cast<size_t>(n);
    }
    ::close(fd);
    return true;
  }
};

// A gnuplot single-quoted string: no escapes inside, a quote is written twice. Control
// characters (a newline would end the command) become spaces.
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out + "'";
}

// A POSIX shell single-quoted word.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

// The reason out of gnuplot's messages: its first error line (not a warning) without the
// script's path, plus the "system error" line that may follow; else the last line.
std::string gnuplot_reason(const std::string& messages) {
  std::vector<std::string> lines;
  std::istringstream in(messages);
  for (std::string l; std::getline(in, l);)
    if (l.find_first_not_of(" \t\r^") != std::string::npos) lines.push_back(l);
  if (lines.empty()) return "no message";
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    size_t at = l.find(" line ");
    if (at == std::string::npos || l.find(':', at) == std::string::npos || l.find("warning:") != std::string::npos)
      continue;
    std::string r = l.substr(at + 1);
    if (i + 1 < lines.size() && lines[i + 1].rfind("system error", 0) == 0) r += " (" + lines[i + 1] + ")";
    return r;
  }
  return lines.back();
}

bool fail(std::string* error, const std::string& why) {
  if (error) *error = "plot_png: " + why;
  return false;
}

}  // namespace

bool gnuplot_available() {
  const char* path_env = std::getenv("PATH");
  std::string paths = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= paths.size()) {
    size_t end = paths.find(':', pos);
    if (end == std::string::npos) end = paths.size();
    std::string dir = paths.substr(pos, end - pos);
    if (dir.empty()) dir = ".";
    if (::access((dir + "/gnuplot").c_str(), X_OK) == 0) return true;
    pos = end + 1;
  }
  return false;
}

bool plot_png(const std::string& path, const Figure& fig, std::string* error) {
  if (path.empty()) return fail(error, "empty output path");
  if (fig.width < 16 || fig.height < 16 || fig.width > 20000 || fig.height > 20000)
    return fail(error, "picture size " + std::to_string(fig.width) + "x" + std::to_string(fig.height) +
                           " out of range [16, 20000] for '" + path + "'");

  // Data: one block per drawn series (gnuplot `index i`), blocks separated by two blank lines.
  std::string data;
  struct Drawn {
    const Series* s;
    size_t npoints;
  };
  std::vector<Drawn> drawn;
  bool any_right = false;
  for (const Series& s : fig.series) {
    if (s.x.size() != s.y.size())
      return fail(error, "series '" + s.name + "' has " + std::to_string(s.x.size()) + " x values but " +
                             std::to_string(s.y.size()) + " y values");
    size_t n = 0;
    std::string block;
    char buf[64];
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      std::snprintf(buf, sizeof buf, "%.10g %.10g\n", s.x[i], s.y[i]);
      block += buf;
      ++n;
    }
    if (n == 0) continue;
    if (!drawn.empty()) data += "\n\n";
    data += block;
    drawn.push_back({&s, n});
    any_right = any_right || s.right_axis;
  }
  if (drawn.empty()) return fail(error, "nothing to plot in '" + path + "' (every series is empty or non-finite)");
  if (!gnuplot_available()) return fail(error, "gnuplot not found on PATH (Debian package gnuplot-nox); '" + path +
                                                   "' not written");

  // The picture goes to a temporary name beside `path` (same filesystem, so the rename is
  // atomic). Creating it here first turns a missing or read-only directory into a clear reason.
  const std::string tmp_png = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  {
    std::FILE* f = std::fopen(tmp_png.c_str(), "wb");
    if (!f) return fail(error, "cannot write '" + tmp_png + "': " + std::strerror(errno));
    std::fclose(f);
  }
  auto fail_rm = [&](const std::string& why) {
    std::remove(tmp_png.c_str());
    return fail(error, why);
  };

  std::string why;
  TempFile data_file;
  if (!data_file.create("linea_plot_data_", data, &why)) return fail_rm(why);

  std::ostringstream gp;
  const std::string size = std::to_string(fig.width) + "," + std::to_string(fig.height);
  // noenhanced: names like "train_loss" must not turn into subscripts.
  gp << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
     << "  set terminal pngcairo size " << size << " noenhanced font 'sans,11' linewidth 1.5\n"
     << "} else {\n"
     << "  set terminal png size " << size << " noenhanced\n"
     << "}\n"
     << "set output " << gp_quote(tmp_png) << "\n";
  if (!fig.title.empty()) gp << "set title " << gp_quote(fig.title) << "\n";
  if (!fig.xlabel.empty()) gp << "set xlabel " << gp_quote(fig.xlabel) << "\n";
  if (!fig.ylabel.empty()) gp << "set ylabel " << gp_quote(fig.ylabel) << "\n";
  if (any_right) {
    gp << "set ytics nomirror\nset y2tics\n";
    if (!fig.y2label.empty()) gp << "set y2label " << gp_quote(fig.y2label) << "\n";
  }
  // The legend goes under the x label: a key inside the plot would cover a curve sooner or
  // later. x spans exactly the data; y keeps gnuplot's round tic-aligned range.
  gp << "set grid\nset key outside bottom center horizontal samplen 3\nset bmargin 5\nset autoscale xfix\n";
  gp << "plot ";
  for (size_t i = 0; i < drawn.size(); ++i) {
    const Series& s = *drawn[i].s;
    const bool with_points = s.points || drawn[i].npoints < 2;
    if (i) gp << ", \\\n     ";
    gp << gp_quote(data_file.path) << " index " << i << " using 1:2"
       << " with " << (with_points ? "linespoints pointtype 7 pointsize 0.8" : "lines") << " linewidth 2"
       << (s.right_axis ? " axes x1y2" : " axes x1y1") << " title " << gp_quote(s.name);
  }
  gp << "\nunset output\n";

  TempFile script;
  if (!script.create("linea_plot_script_", gp.str(), &why)) return fail_rm(why);

  // Reading gnuplot's output (not writing its stdin) means no SIGPIPE if it dies early.
  const std::string cmd = "gnuplot " + sh_quote(script.path) + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return fail_rm(std::string("cannot run gnuplot: ") + std::strerror(errno));
  std::string messages;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) messages.append(buf, n);
  const int status = ::pclose(p);
  if (status == -1) return fail_rm(std::string("gnuplot: ") + std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string code = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                         : "killed by signal " + std::to_string(WTERMSIG(status));
    return fail_rm("gnuplot failed (" + code + "): " + gnuplot_reason(messages));
  }
  // A PNG is never empty; an empty file means gnuplot never drew into it.
  std::FILE* f = std::fopen(tmp_png.c_str(), "rb");
  long png_size = -1;
  if (f) {
    std::fseek(f, 0, SEEK_END);
    png_size = std::ftell(f);
    std::fclose(f);
  }
  if (png_size <= 0) return fail_rm("gnuplot wrote no picture to '" + tmp_png + "'");
  if (std::rename(tmp_png.c_str(), path.c_str()) != 0)
    return fail_rm("cannot rename '" + tmp_png + "' to '" + path + "': " + std::strerror(errno));
  if (error) error->clear();
  return true;
}

}  // namespace linea::apps
