// ProgressBar and format_duration (see progress.h for the output formats).
// Not here: colours or cursor control beyond '\r' — the line is blanked by padding with spaces,
// which every terminal understands.
#include "apps/common/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace linea::apps {
namespace {

// Terminal redraws at most this often; more is flicker and wasted writes over ssh.
constexpr double kRedrawInterval_s = 0.1;
constexpr int kDefaultColumns = 100;
constexpr size_t kMinBarWidth = 10;
constexpr size_t kMaxBarWidth = 40;

int terminal_columns(std::FILE* out) {
  struct winsize ws;
  if (::ioctl(::fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return kDefaultColumns;
}

std::string format_rate(double r) {
  char buf[64];
  std::snprintf(buf, sizeof buf, r < 10 ? "%.2f" : r < 100 ? "%.1f" : "%.0f", r);
  return buf;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  // Clamp absurd ETAs (a rate near zero) so the cast below stays defined.
  const long long s = static_cast<long long>(std::min(seconds, 359999999.0));
  char buf[64];
  if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, std::FILE* out, double plain_interval_s)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      out_(out),
      plain_interval_s_(plain_interval_s),
      terminal_(false),
      now_([] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }),
      start_(now_()) {
  LINEA_CHECK(out_ != nullptr, "ProgressBar: null output stream for '", label_, "'");
  LINEA_CHECK(total_ >= 0, "ProgressBar: total must be >= 0 (0 = unknown), got ", total_, " for '", label_, "'");
  LINEA_CHECK(std::isfinite(plain_interval_s_) && plain_interval_s_ >= 0,
              "ProgressBar: plain_interval_s must be a finite value >= 0, got ", plain_interval_s_);
  terminal_ = is_terminal(out_);
}

ProgressBar::~ProgressBar() {
  if (terminal_ && drawn_ && !finished_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

bool ProgressBar::is_terminal(std::FILE* out) { return out != nullptr && ::isatty(::fileno(out)) == 1; }

void ProgressBar::set_terminal(bool on) { terminal_ = on; }

void ProgressBar::set_total(int64_t total) {
  LINEA_CHECK(total >= 0, "ProgressBar: total must be >= 0 (0 = unknown), got ", total, " for '", label_, "'");
  total_ = total;
}

double ProgressBar::elapsed_s() const { return now_() - start_; }

void ProgressBar::set_clock(std::function<double()> now) {
  now_ = std::move(now);
  start_ = now_();
}

double ProgressBar::rate() const {
  const double t = elapsed_s();
  if (done_ <= 0 || t <= 0) return 0.0;
  return static_cast<double>(done_) / t;
}

void ProgressBar::update(int64_t done, const std::string& extra) {
  if (finished_) return;
  done_ = done;
  const double t = elapsed_s();
  const bool complete = total_ > 0 && done_ >= total_;
  if (terminal_) {
    if (complete || t - last_output_s_ >= kRedrawInterval_s) {
      draw_terminal(false, extra);
      last_output_s_ = t;
    }
  } else {
    // The first plain line comes one interval after the start, not at once: short loops print
    // only their final line.
    if (t - std::max(last_output_s_, 0.0) >= plain_interval_s_) {
      print_plain(false, extra);
      last_output_s_ = t;
    }
  }
}

void ProgressBar::finish(const std::string& extra) {
  if (finished_) return;
  if (terminal_)
    draw_terminal(true, extra);
  else
    print_plain(true, extra);
  finished_ = true;
}

std::string ProgressBar::status_text(bool final) const {
  const double r = rate();
  std::string s = std::to_string(done_);
  if (total_ > 0) {
    // On a terminal the count is padded to the total's width so the text does not shift.
    const std::string t = std::to_string(total_);
    if (terminal_ && s.size() < t.size()) s.insert(0, t.size() - s.size(), ' ');
    s += "/" + t;
  }
  if (!unit_.empty()) s += " " + unit_;
  if (!terminal_ && total_ > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (%.1f%%)", 100.0 * static_cast<double>(done_) / static_cast<double>(total_));
    s += pct;
  }
  s += "  " + format_rate(r) + " " + (unit_.empty() ? std::string("it") : unit_) + "/s";
  if (final) {
    s += "  in " + format_duration(elapsed_s());
  } else if (total_ > 0) {
    const double left = static_cast<double>(std::max<int64_t>(total_ - done_, 0));
    s += "  ETA " + (r > 0 ? format_duration(left / r) : std::string("--:--"));
  }
  return s;
}

void ProgressBar::draw_terminal(bool final, const std::string& extra) {
  // One column short of the width: writing the last column makes some terminals wrap, and a
  // wrapped line can no longer be redrawn with '\r'.
  const size_t max_len = static_cast<size_t>(std::max(terminal_columns(out_) - 1, 20));
  const std::string tail = status_text(final) + (extra.empty() ? "" : "  " + extra);
  std::string line;
  if (total_ > 0) {
    const size_t fixed = label_.size() + 4 + tail.size();  // "label [" and "] " around the bar
    const size_t avail = max_len > fixed ? max_len - fixed : 0;
    // The width is chosen at the first draw and kept, so the bar does not jitter as the text
    // after it changes length; it only narrows while a line would not fit.
    if (bar_width_ == 0) bar_width_ = std::min(std::max(avail, kMinBarWidth), kMaxBarWidth);
    const size_t width = std::max(std::min(bar_width_, avail), kMinBarWidth);
    const double frac = std::min(1.0, std::max(0.0, static_cast<double>(done_) / static_cast<double>(total_)));
    const size_t filled = static_cast<size_t>(frac * static_cast<double>(width));
    line = label_ + " [" + std::string(filled, '#') + std::string(width - filled, '.') + "] " + tail;
  } else {
    line = label_ + " " + tail;
  }
  if (line.size() > max_len) line.resize(max_len);  // a narrow terminal loses the end of `extra`
  const size_t visible = line.size();
  if (visible < last_width_) line.append(last_width_ - visible, ' ');
  last_width_ = visible;
  std::fputc('\r', out_);
  std::fputs(line.c_str(), out_);
  if (final) std::fputc('\n', out_);
  std::fflush(out_);
  drawn_ = !final;
}

void ProgressBar::print_plain(bool final, const std::string& extra) {
  std::string line = label_ + " " + status_text(final);
  if (!extra.empty()) line += "  " + extra;
  line += "\n";
  std::fputs(line.c_str(), out_);
  std::fflush(out_);
}

std::string format_number(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace linea::apps
