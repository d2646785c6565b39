// Line plots as PNG pictures, drawn by gnuplot: the apps' loss/accuracy curves.
// Not here: reading metrics (metrics.h) or choosing what to plot — the apps build a Figure.
// gnuplot is an optional runtime tool, not a build dependency: without it plot_png returns false.
#pragma once

#include <string>
#include <vector>

namespace linea::apps {

struct Series {
  std::string name;              // legend entry
  std::vector<double> x, y;
  bool right_axis = false;       // plot against the right-hand y axis (y2)
  bool points = false;           // lines (false) or lines+points (true)
};

struct Figure {
  std::string title, xlabel, ylabel, y2label;
  std::vector<Series> series;
  int width = 960, height = 600;
};

// Renders fig as a PNG with gnuplot (Debian package gnuplot-nox; terminal pngcairo, falling back to
// png): the data and the script go to temporary files, `gnuplot <script>` runs under popen with
// its messages read back (reading rather than writing a pipe: a gnuplot that dies early cannot
// SIGPIPE the training process), the picture is written to a temporary name and renamed onto
// `path` (atomic). Returns true on success; on failure
// (gnuplot missing, gnuplot error) returns false and sets *error to a one-line reason — the apps
// print a warning and go on, since a missing picture must not lose a training run.
// Empty series are skipped; NaN/inf points are skipped. A series with a single point is drawn
// with a point marker (a line needs two). Nothing is thrown.
bool plot_png(const std::string& path, const Figure& fig, std::string* error = nullptr);

// Whether an executable `gnuplot` is on PATH.
bool gnuplot_available();

}  // namespace linea::apps
