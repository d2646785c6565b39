// Progress display for the apps' long loops (training and evaluation epochs): ProgressBar and
// format_duration. On a terminal the bar redraws one line in place; into a file or a pipe it
// prints plain lines at a fixed interval so logs stay readable.
// Not here: logging of metrics (metrics.h) or any knowledge of what the loop computes — the
// caller passes the running numbers as the `extra` text.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace linea::apps {

// A progress bar for long loops (training/evaluation epochs). On a terminal (isatty(fileno(out)))
// it redraws one line in place ('\r', at most ~10 redraws/s, width fitted to the terminal via
// TIOCGWINSZ or 100 columns): "label [#######.....] 12345/60000 img  812 img/s  ETA 1:02  loss 0.512".
// When `out` is not a terminal it prints plain lines instead, one every `plain_interval_s`
// seconds (and the final one), e.g. "label 12345/60000 img (20.6%)  812 img/s  ETA 1:02  loss 0.512",
// so logs stay readable. finish() prints the final state with total elapsed time and a newline.
// total == 0 means "unknown": counts and rate are shown, no bar, percentage or ETA.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "img", std::FILE* out = stdout,
              double plain_interval_s = 15.0);
  // A bar left unfinished (an exception unwinding through the loop) ends its line, so the
  // error message that follows starts on a fresh one.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // done: units completed so far (cumulative); extra: text appended after the rate/ETA, e.g. "loss 0.512  lr 1.0e-03".
  void update(int64_t done, const std::string& extra = "");
  // Changes the total (e.g. once the first step tells how many units an epoch holds).
  void set_total(int64_t total);
  // Prints the final line (with the last `done` passed to update) and a newline; later calls do nothing.
  void finish(const std::string& extra = "");
  double elapsed_s() const;  // since construction (steady clock)
  double rate() const;       // units per second so far (0 before any progress)
  static bool is_terminal(std::FILE* out);
  // Forces the terminal/plain mode (for tests); default: detected from `out`.
  void set_terminal(bool on);
  // Replaces the steady clock (seconds, any origin) by `now`, restarting elapsed_s() from it
  // (for tests: rate limits and rates without sleeping).
  void set_clock(std::function<double()> now);

 private:
  using Clock = std::chrono::steady_clock;
  std::string status_text(bool final) const;  // "12345/60000 img  812 img/s  ETA 1:02"
  void draw_terminal(bool final, const std::string& extra);
  void print_plain(bool final, const std::string& extra);

  std::string label_, unit_;
  int64_t total_;
  std::FILE* out_;
  double plain_interval_s_;
  bool terminal_;
  std::function<double()> now_;  // seconds; the steady clock unless set_clock
  double start_;
  double last_output_s_ = -1e300;  // elapsed_s() of the last draw/print (-inf: nothing yet)
  int64_t done_ = 0;
  size_t bar_width_ = 0;   // chosen at the first terminal draw (0: not yet)
  size_t last_width_ = 0;  // visible length of the last terminal line, to blank its leftovers
  bool drawn_ = false;     // something is on the current terminal line
  bool finished_ = false;
};

// "0:07", "1:02", "1:02:03" (seconds rounded down); "--:--" for negative or non-finite input.
std::string format_duration(double seconds);

// One number through a printf format, e.g. format_number("%.2f%%", 12.345) == "12.35%".
std::string format_number(const char* format, double v);

// Seconds on the steady clock since t.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace linea::apps
