// Tests of apps/common: format_duration, ProgressBar (plain and terminal output into a file: the
// terminal lines' widths, padding and cut; the text's edges),
// MetricsLog (fresh, resume trimming, append, read, invalid UTF-8), length_summary, the training
// loop's records (running sums per unit in each stat's dtype, profile means, stats text, the
// curves from metrics.jsonl) and plot_png (a real PNG when gnuplot is installed; clear failures
// otherwise), RunOptions, the prepared-data folders (`prepare --out`, data.json), the run
// plumbing (start_run, eval-only and model commands on best/, report_run) and the interrupt guard.
// Not here: the apps that use these helpers (their own tests run them end to end).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "apps/common/app_run.h"
#include "apps/common/device.h"
#include "apps/common/interrupt.h"
#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/prepared_data.h"
#include "apps/common/progress.h"
#include "apps/common/run_options.h"
#include "apps/common/train_records.h"
#include "core/error.h"
#include "core/runtime.h"
#include "tests/test_util.h"

using namespace linea::apps;
using linea::test::TempDir;

namespace {

// Everything written to a tmpfile() so far.
std::string contents(std::FILE* f) {
  std::fflush(f);
  long end = std::ftell(f);
  std::string s(static_cast<size_t>(end), '\0');
  std::rewind(f);
  size_t got = std::fread(s.data(), 1, s.size(), f);
  s.resize(got);
  std::fseek(f, 0, SEEK_END);
  return s;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_all(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

// The numeric flag checks: a message for what is refused, nothing for what is taken.
TEST(RunOptions, NumericFlagChecksAndUnknownCommands) {
  const auto check = [](CLI::Validator v, std::string in) { return v(in); };
  EXPECT_EQ(check(positive_number(), "0.5"), "");
  EXPECT_EQ(check(positive_number(), "0"), "0 is not > 0");
  EXPECT_EQ(check(positive_number(), "-2"), "-2 is not > 0");
  EXPECT_EQ(check(positive_number(), "nan"), "nan is not a finite number");
  EXPECT_EQ(check(positive_number(), "inf"), "inf is not a finite number");
  EXPECT_EQ(check(positive_number(), "ten"), "'ten' is not a number");
  EXPECT_EQ(check(non_negative_number(), "0"), "");
  EXPECT_EQ(check(non_negative_number(), "-1"), "-1 is not >= 0");
  EXPECT_EQ(check(non_negative_number(), "1e300"), "");
  EXPECT_EQ(check(finite_range(0.0, 0.999999), "0"), "");
  EXPECT_EQ(check(finite_range(0.0, 0.999999), "0.999999"), "");
  EXPECT_EQ(check(finite_range(0.0, 0.999999), "1"), "1 is not in [0, 0.999999]");
  EXPECT_EQ(check(finite_range(0.5, 1.0), "0.25"), "0.25 is not in [0.5, 1]");
  CLI::App app("toy");
  app.add_subcommand("train", "");
  app.add_subcommand("predict", "");
  const auto unknown = [&](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return unknown_command(app, static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(unknown({"toy", "trian"}), "unknown command 'trian' (commands: train, predict)");
  EXPECT_EQ(unknown({"toy", "predict"}), "");
  EXPECT_EQ(unknown({"toy", "--help"}), "");  // flags are CLI11's to judge
  EXPECT_EQ(unknown({"toy"}), "");
}

TEST(FormatDuration, MinutesAndHours) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(7.9), "0:07");
  EXPECT_EQ(format_duration(62), "1:02");
  EXPECT_EQ(format_duration(59 * 60 + 59), "59:59");
  EXPECT_EQ(format_duration(3600), "1:00:00");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(100 * 3600 + 5), "100:00:05");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_duration(std::nan("")), "--:--");
  EXPECT_EQ(format_duration(1.0 / 0.0), "--:--");
  EXPECT_EQ(format_duration(1e300), "99999:59:59");  // an absurd ETA, clamped
}

TEST(ProgressBar, PlainLinesHaveCountsRateEta) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("train", 1000, "img", f, /*plain_interval_s=*/0.0);
    EXPECT_FALSE(ProgressBar::is_terminal(f));
    double now = 10;
    bar.set_clock([&] { return now; });
    EXPECT_EQ(bar.rate(), 0.0);
    now = 12.5;
    bar.update(250, "loss 0.512");
    EXPECT_EQ(bar.rate(), 100.0);  // 250 img in 2.5 s
    EXPECT_EQ(bar.elapsed_s(), 2.5);
    bar.update(500, "loss 0.400");
    bar.finish("loss 0.300");
    bar.finish("again");  // a second finish prints nothing
  }
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), '\n');
  const auto lines = split_lines(out);
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_EQ(lines[0].rfind("train 250/1000 img (25.0%)  ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(" img/s"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("ETA "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("loss 0.512"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("500/1000 img (50.0%)"), std::string::npos) << lines[1];
  // The final line: the last count, total elapsed time instead of an ETA, the final extra.
  EXPECT_NE(lines[2].find("500/1000 img"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("200 img/s  in 0:02"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[2].find("ETA"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("loss 0.300"), std::string::npos) << lines[2];
  EXPECT_EQ(out.find("again"), std::string::npos);
}

TEST(ProgressBar, PlainLinesAreRateLimited) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressBar bar("eval", 100, "seq", f, /*plain_interval_s=*/3600.0);
  for (int i = 1; i <= 100; ++i) bar.update(i);
  EXPECT_EQ(contents(f), "");  // nothing before the interval has passed
  bar.finish();
  const auto lines = split_lines(contents(f));
  std::fclose(f);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("eval 100/100 seq (100.0%)  ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(" seq/s"), std::string::npos) << lines[0];
}

// The drawn lines of a terminal bar's output (the text after each '\r').
std::vector<std::string> drawn_lines(const std::string& out) {
  std::vector<std::string> lines;
  for (size_t start = out.find('\r'); start != std::string::npos;) {
    size_t end = out.find_first_of("\r\n", start + 1);
    lines.push_back(out.substr(start + 1, (end == std::string::npos ? out.size() : end) - start - 1));
    start = end == std::string::npos ? end : out.find('\r', end);
  }
  return lines;
}

TEST(ProgressBar, TerminalModeRedrawsInPlace) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("train", 60000, "img", f);
    double now = 0;
    bar.set_clock([&] { return now; });
    bar.set_terminal(true);
    now = 1.0;
    bar.update(12345, "loss 0.512");
    now = 1.05;
    bar.update(12346, "loss 0.511");  // within 0.1 s of the last draw: skipped
    now = 1.2;
    bar.update(30000, "loss 0.4");
    bar.update(60000, "loss 0.3");  // completion always draws
    bar.finish("loss 0.25");
  }
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 4) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_EQ(out.back(), '\n');
  EXPECT_NE(out.find("train ["), std::string::npos) << out;
  EXPECT_NE(out.find("] 12345/60000 img  "), std::string::npos) << out;
  EXPECT_EQ(out.find("12346/60000"), std::string::npos) << out;
  EXPECT_NE(out.find("#"), std::string::npos) << out;
  EXPECT_NE(out.find("....."), std::string::npos) << out;
  EXPECT_NE(out.find("ETA "), std::string::npos) << out;
  // Each drawn line fits the width (100 columns when the stream is no terminal), so '\r' can redraw it.
  const auto lines = drawn_lines(out);
  ASSERT_EQ(lines.size(), 4u) << out;
  for (const auto& line : lines) EXPECT_LT(line.size(), 100u) << line;
  // The full bar at the end, with the total time.
  const std::string& last = lines.back();
  EXPECT_NE(last.find("[##########"), std::string::npos) << last;
  const size_t open = last.find('['), close = last.find(']');
  ASSERT_TRUE(open != std::string::npos && close != std::string::npos) << last;
  EXPECT_EQ(last.substr(open + 1, close - open - 1), std::string(close - open - 1, '#')) << last;
  EXPECT_NE(last.find("50000 img/s  in 0:01"), std::string::npos) << last;
}

// On a terminal, an unknown total is never "complete" (each update within 0.1 s of the last draw
// is skipped), and a count past the total draws a full bar.
TEST(ProgressBar, TerminalUnknownTotalAndCountPastTheTotal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("stream", 0, "tok", f);
    double now = 0;
    bar.set_clock([&] { return now; });
    bar.set_terminal(true);
    now = 1.0;
    bar.update(10);
    now = 1.05;
    bar.update(20);
    bar.finish();
  }
  std::string out = contents(f);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 2) << out;  // the first update and finish
  EXPECT_EQ(out.find(" 20 tok"), out.rfind(" 20 tok")) << out;
  {
    ProgressBar bar("over", 10, "img", f);
    double now = 0;
    bar.set_clock([&] { return now; });
    bar.set_terminal(true);
    now = 1.0;
    bar.update(12);
  }
  out = contents(f);
  std::fclose(f);
  const std::string last = drawn_lines(out).back();
  EXPECT_NE(last.find("12/10 img"), std::string::npos) << last;
  const size_t open = last.find('['), close = last.find(']');
  ASSERT_TRUE(open != std::string::npos && close != std::string::npos) << last;
  EXPECT_EQ(last.substr(open + 1, close - open - 1), std::string(close - open - 1, '#')) << last;
  EXPECT_LT(last.size(), 100u) << last;
}

// Terminal lines stay within 99 of the 100 columns: the count padded to the total's width, the bar
// narrowed (not below 10) while the text after it is long, its width otherwise kept from the first
// draw, a shorter line padded over the longer one before it, text beyond the width cut.
TEST(ProgressBar, TerminalLinesFitAndKeepTheirShape) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("train", 60000, "img", f);
    double now = 0;
    bar.set_clock([&] { return now; });
    bar.set_terminal(true);
    now = 1.0;
    bar.update(5);
    now = 2.0;
    bar.update(10000, std::string(30, 'x') + "|end");
    now = 3.0;
    bar.update(20000);
    now = 4.0;
    bar.update(30000, std::string(200, 'y'));
    now = 5.0;
    bar.update(40000);
  }
  const std::string out = contents(f);
  std::fclose(f);
  const auto lines = drawn_lines(out);
  ASSERT_EQ(lines.size(), 5u) << out;
  const auto bar_width = [](const std::string& l) { return l.find(']') - l.find('[') - 1; };
  EXPECT_NE(lines[0].find("[" + std::string(40, '.') + "]     5/60000 img  "), std::string::npos) << lines[0];
  EXPECT_LT(bar_width(lines[1]), 40u);  // narrowed, so that the whole text fits
  EXPECT_NE(lines[1].find("|end"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[1].size(), 99u);
  EXPECT_EQ(bar_width(lines[2]), 40u);          // back to the width of the first draw
  EXPECT_EQ(lines[2].size(), lines[1].size());  // padded over the longer line before it
  EXPECT_EQ(bar_width(lines[3]), 10u);          // never narrower than 10
  EXPECT_EQ(lines[3].size(), 99u);              // cut at the width
  for (const std::string& l : lines) EXPECT_LE(l.find_last_not_of(' ') + 1, 99u) << l;
  // A bar first drawn narrow stays so: its width does not jitter with the text after it.
  std::FILE* g = std::tmpfile();
  ASSERT_NE(g, nullptr);
  {
    ProgressBar bar("train", 60000, "img", g);
    double now = 0;
    bar.set_clock([&] { return now; });
    bar.set_terminal(true);
    now = 1.0;
    bar.update(10000, std::string(30, 'x'));
    now = 2.0;
    bar.update(20000);
  }
  const auto narrow = drawn_lines(contents(g));
  std::fclose(g);
  ASSERT_EQ(narrow.size(), 2u);
  EXPECT_LT(bar_width(narrow[0]), 40u);
  EXPECT_EQ(bar_width(narrow[1]), bar_width(narrow[0]));
}

// A bar that never drew leaves no line behind; nothing is drawn after finish(); a bar without a
// unit counts "it"; a count past the total has nothing left (ETA 0:00); rates of 10..100 get one
// decimal.
TEST(ProgressBar, EdgesOfTheText) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar silent("x", 10, "it", f);
    silent.set_terminal(true);
  }
  EXPECT_EQ(contents(f), "");
  {
    ProgressBar bar("x", 10, "", f, 0.0);
    double now = 0;
    bar.set_clock([&] { return now; });
    now = 0.5;
    bar.update(12);
    bar.finish();
    bar.update(13, "late");
  }
  const auto lines = split_lines(contents(f));
  std::fclose(f);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "x 12/10 (120.0%)  24.0 it/s  ETA 0:00");
  EXPECT_EQ(lines[1], "x 12/10 (120.0%)  24.0 it/s  in 0:00");
}

TEST(ProgressBar, TerminalBarEndsItsLineWhenAbandoned) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("x", 10, "it", f);
    bar.set_terminal(true);
    bar.update(3);
  }
  const std::string out = contents(f);
  std::fclose(f);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.front(), '\r');
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressBar, UnknownTotalAndBadArguments) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ProgressBar bar("stream", 0, "tok", f, 0.0);
  bar.update(42);
  bar.finish();
  const std::string out = contents(f);
  std::fclose(f);
  EXPECT_NE(out.find("stream 42 tok  "), std::string::npos) << out;
  EXPECT_EQ(out.find("ETA"), std::string::npos) << out;
  EXPECT_EQ(out.find('%'), std::string::npos) << out;
  EXPECT_THROW(ProgressBar("x", -1, "img", stdout), linea::Error);
  EXPECT_THROW(ProgressBar("x", 10, "img", nullptr), linea::Error);
  EXPECT_THROW(ProgressBar("x", 10, "img", stdout, -1.0), linea::Error);
  EXPECT_THROW(ProgressBar("x", 10, "img", stdout, INFINITY), linea::Error);
  ProgressBar later("x", 10, "img", stdout);
  EXPECT_LINEA_ERROR(later.set_total(-1), "ProgressBar: total must be >= 0 (0 = unknown), got -1 for 'x'");
}

TEST(MetricsLog, FreshRunTruncatesAndWritesLines) {
  const TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  write_all(path, "{\"step\": 99, \"old\": true}\n");
  {
    MetricsLog log(path);
    EXPECT_EQ(log.path(), path);
    log.write({{"step", 1}, {"loss", 2.5}});
    // Flushed per line: visible to a reader while the log is still open.
    EXPECT_EQ(read_all(path), "{\"loss\":2.5,\"step\":1}\n");
    log.write({{"epoch", 1}, {"test_acc", 0.875}});
    EXPECT_THROW(log.write(nlohmann::json::array({1, 2})), linea::Error);
  }
  EXPECT_EQ(read_all(path), "{\"loss\":2.5,\"step\":1}\n{\"epoch\":1,\"test_acc\":0.875}\n");
  const auto recs = MetricsLog::read(path);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0]["step"], 1);
  EXPECT_DOUBLE_EQ(recs[1]["test_acc"].get<double>(), 0.875);
}

TEST(MetricsLog, ResumeDropsLinesAfterTheCheckpointAndAppends) {
  const TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  write_all(path,
            "{\"run\": \"config\"}\n"
            "{\"step\": 10, \"loss\": 1.0}\n"
            "{\"step\": 20, \"loss\": 0.8}\n"
            "\n"
            "{\"step\": 20, \"epoch\": 1, \"test_acc\": 0.5}\n"
            "{\"step\": 30, \"loss\": 0.7}\n"
            "{\"step\": 40, \"loss\": 0.6}\n"
            "{\"step\": \"late\", \"note\": 1}\n"  // a step that is no number: kept
            "{\"step\": 50, \"lo");                // the interrupted run's half-written last line
  {
    MetricsLog log(path, /*resume_step=*/20);
    log.write({{"step", 30}, {"loss", 0.65}});
  }
  const auto recs = MetricsLog::read(path);
  ASSERT_EQ(recs.size(), 6u) << read_all(path);
  EXPECT_EQ(recs[0]["run"], "config");  // no "step": kept
  EXPECT_EQ(recs[1]["step"], 10);
  EXPECT_EQ(recs[2]["step"], 20);
  EXPECT_EQ(recs[3]["test_acc"], 0.5);
  EXPECT_EQ(recs[4]["step"], "late");
  EXPECT_EQ(recs[5]["step"], 30);
  EXPECT_DOUBLE_EQ(recs[5]["loss"].get<double>(), 0.65);
  // The file itself holds exactly these lines, each complete.
  const std::string text = read_all(path);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find("\"lo\""), std::string::npos);
  EXPECT_EQ(text.find("0.7"), std::string::npos) << text;
  // No temp file left beside it.
  EXPECT_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
}

// A string that is not UTF-8 (a file name, a tokenizer's piece) is written with replacement
// characters rather than stopping the run.
TEST(MetricsLog, InvalidUtf8IsReplacedNotThrown) {
  const TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    MetricsLog log(path);
    EXPECT_NO_THROW(log.write({{"step", 1}, {"piece", std::string("ab\xff")}}));
  }
  const auto recs = MetricsLog::read(path);
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0]["piece"], "ab\xef\xbf\xbd");  // U+FFFD
}

// The length summaries of prepared data: mean to 2 decimals, the median and 90th percentile as
// the values at ranks n/2 and 9n/10 of the sorted lengths, the maximum; zeros when empty.
TEST(LengthSummary, MeanMedianP90Max) {
  EXPECT_EQ(length_summary({7, 1, 3, 9, 2, 5, 10, 4, 6, 8}),
            (nlohmann::json{{"mean", 5.5}, {"median", 6}, {"p90", 10}, {"max", 10}}));
  EXPECT_EQ(length_summary({1, 1, 2}), (nlohmann::json{{"mean", 1.33}, {"median", 1}, {"p90", 2}, {"max", 2}}));
  EXPECT_EQ(length_summary({}), (nlohmann::json{{"mean", 0}, {"median", 0}, {"p90", 0}, {"max", 0}}));
}

// ---- the training loop's records ----------------------------------------------------------------

// Stats summed in their own dtype (float32 as float32 additions: 2^24 + 1 is 2^24 there), their
// means per unit; the loss's mean per step.
TEST(TrainRecords, RunningSumsPerUnitInEachDtype) {
  RunningSums sums(/*reduce=*/false);
  const std::vector<std::pair<std::string, linea::DType>> names = {
      {"correct", linea::DType::Int64}, {"f32", linea::DType::Float32}, {"f64", linea::DType::Float64}};
  const double a[] = {3, 16777216.0, 16777216.0}, b[] = {5, 1.0, 1.0};
  sums.add(1.0, names, a, 8);
  sums.add(2.0, names, b, 8);
  EXPECT_EQ(sums.steps(), 2);
  EXPECT_EQ(sums.units(), 16);
  EXPECT_EQ(sums.mean_loss(), 1.5);
  const std::map<std::string, double> m = sums.stat_means();
  EXPECT_EQ(m.at("correct"), 0.5);
  EXPECT_EQ(m.at("f32"), 16777216.0 / 16);
  EXPECT_EQ(m.at("f64"), 16777217.0 / 16);
  EXPECT_TRUE(RunningSums(false).stat_means().empty());
  EXPECT_EQ(RunningSums(false).mean_loss(), 0.0);
}

TEST(TrainRecords, ProfileMeansAndStatsText) {
  ProfileSums p;
  linea::cuda::Counters c;
  EXPECT_EQ(p.per_step().at("kernel_launches"), 0.0);  // no steps yet
  // Each counter its own value, so that one summed into another's place shows.
  int64_t* fields[] = {&c.kernel_launches, &c.library_calls, &c.graph_launches, &c.host_syncs,
                       &c.host_waits,      &c.device_allocs, &c.device_copies,  &c.h2d_copies,
                       &c.h2d_bytes,       &c.d2h_copies,    &c.d2h_bytes};
  const char* names[] = {"kernel_launches", "library_calls", "graph_launches", "host_syncs",
                         "host_waits",      "device_allocs", "device_copies",  "h2d_copies",
                         "h2d_bytes",       "d2h_copies",    "d2h_bytes"};
  for (int k = 0; k < 11; ++k) *fields[k] = 10 * (k + 1);
  p.add(c, 0.002);
  nlohmann::json j = p.per_step();  // one step: its own counts
  for (int k = 0; k < 11; ++k) EXPECT_EQ(j.at(names[k]), 10.0 * (k + 1)) << names[k];
  EXPECT_NEAR(j.at("host_ms").get<double>(), 2.0, 1e-12);
  for (int k = 0; k < 11; ++k) *fields[k] = 20 * (k + 1);
  p.add(c, 0.004);
  j = p.per_step();  // the mean over two
  for (int k = 0; k < 11; ++k) EXPECT_EQ(j.at(names[k]), 15.0 * (k + 1)) << names[k];
  EXPECT_NEAR(j.at("host_ms").get<double>(), 3.0, 1e-12);
  EXPECT_EQ(j.size(), 12u);
  TrainHooks hooks;
  EXPECT_EQ(stats_text(hooks, {{"accuracy", 0.91234}, {"f1", 0.5}}), "accuracy 0.9123  f1 0.5");
  hooks.format_stats = [](const std::map<std::string, double>& m) { return "acc " + std::to_string(m.size()); };
  EXPECT_EQ(stats_text(hooks, {{"accuracy", 0.9}}), "acc 1");
}

// The curves read from metrics.jsonl: steps' losses at their epoch position, each epoch's mean
// training loss, evaluation loss and metric (scaled, on the right axis); records without their
// numbers are left out.
TEST(TrainRecords, CurvesFromTheRecords) {
  const TempDir dir;
  write_all(dir.file("metrics.jsonl"),
            "{\"type\": \"step\", \"epoch_progress\": 0.5, \"loss\": 2.0}\n"
            "{\"type\": \"step\", \"epoch_progress\": 1.0, \"loss\": \"?\"}\n"
            "{\"type\": \"epoch\", \"epoch\": 1, \"train_loss\": 1.5, \"test_loss\": 1.25, \"test_accuracy\": 0.5}\n"
            "{\"type\": \"epoch\", \"epoch\": 2, \"train_loss\": 1.0, \"test_accuracy\": 0.75}\n");
  TrainSetup setup;
  setup.app = "toy";
  setup.curves.eval_loss = "test_loss";
  setup.curves.metric = "test_accuracy";
  setup.curves.metric_scale = 100;
  const Figure fig = training_curves(setup, dir.path.string());
  EXPECT_EQ(fig.title, "toy: training");
  EXPECT_EQ(fig.y2label, "test accuracy (%)");
  ASSERT_EQ(fig.series.size(), 4u);
  EXPECT_EQ(fig.series[0].x, std::vector<double>{0.5});
  EXPECT_EQ(fig.series[0].y, std::vector<double>{2.0});
  EXPECT_EQ(fig.series[1].x, (std::vector<double>{1, 2}));
  EXPECT_EQ(fig.series[1].y, (std::vector<double>{1.5, 1.0}));
  EXPECT_EQ(fig.series[2].name, "test loss");
  EXPECT_EQ(fig.series[2].y, std::vector<double>{1.25});
  EXPECT_EQ(fig.series[3].y, (std::vector<double>{50, 75}));
  EXPECT_TRUE(fig.series[3].right_axis);
  // Per-epoch curves are drawn with points, the steps' loss as a line.
  EXPECT_FALSE(fig.series[0].points);
  for (int k = 1; k < 4; ++k) EXPECT_TRUE(fig.series[k].points) << k;
  setup.curves = CurveOptions();  // no evaluation curves: the training losses only, no right axis
  const Figure plain = training_curves(setup, dir.path.string());
  EXPECT_EQ(plain.series.size(), 2u);
  EXPECT_EQ(plain.y2label, "");
}

TEST(MetricsLog, ResumeWithoutAFileStartsOne) {
  const TempDir dir;
  const std::string path = dir.file("fresh.jsonl");
  std::remove(path.c_str());
  {
    MetricsLog log(path, 0);
    log.write({{"step", 1}});
  }
  EXPECT_EQ(read_all(path), "{\"step\":1}\n");
}

// An empty path, a failed write (a full disk) and a JSON file that cannot be read are named.
TEST(MetricsLog, BadPathsAndFailedWritesAreNamed) {
  EXPECT_LINEA_ERROR(MetricsLog(""), "MetricsLog: empty path");
  const TempDir tmp;
  const std::string missing = tmp.path.string() + "/missing.json";
  EXPECT_LINEA_ERROR(read_json_file(missing, "points"), "points: cannot read '" + missing + "'");
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full to fill";
  MetricsLog full("/dev/full");
  EXPECT_LINEA_ERROR(full.write({{"step", 1}}), "MetricsLog::write: write to '/dev/full' failed: ");
}

TEST(MetricsLog, ReadSkipsMalformedLinesAndErrorsNameThePath) {
  const TempDir tmp;
  const std::string dir = tmp.path.string();
  const std::string path = dir + "/m.jsonl";
  write_all(path, "{\"a\":1}\nnot json\n[1,2]\n{\"b\":2}\n{\"c\":");
  const auto recs = MetricsLog::read(path);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0]["a"], 1);
  EXPECT_EQ(recs[1]["b"], 2);
  try {
    MetricsLog::read(dir + "/missing.jsonl");
    FAIL() << "no error for a missing file";
  } catch (const linea::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.jsonl"), std::string::npos) << e.what();
  }
  try {
    MetricsLog log(dir + "/no/such/dir/m.jsonl");
    FAIL() << "no error for a missing directory";
  } catch (const linea::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MetricsLog"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no/such/dir/m.jsonl"), std::string::npos) << e.what();
  }
}

// An app's folders named when they are not what it needs: prepared data without its data.json,
// --eval-only's output folder under a file.
TEST(AppFolders, MissingDataAndUncreatableOutputAreNamed) {
  const TempDir tmp;
  const std::string data = tmp.path.string();
  EXPECT_LINEA_ERROR(
      read_data_json("points", data),
      "points: '" + data + "' holds no prepared data (no data.json); run `points prepare --out " + data + "` first");
  RunOptions run;
  run.checkpoint_dir = data + "/ckpt";
  std::filesystem::create_directories(run.checkpoint_dir);
  write_all(run.checkpoint_dir + "/model.safetensors", "");  // only its presence is checked first
  write_all(data + "/file", "x");
  run.out_dir = data + "/file/out";
  bool evaluated = false;
  EXPECT_LINEA_ERROR(eval_only("points", run,
                               [&](const std::string&) {
                                 evaluated = true;
                                 return Metrics{};
                               }),
                     "points: cannot create the output folder '" + run.out_dir + "' (--out): ");
  EXPECT_FALSE(evaluated);
  // A prepare step's file system errors name the step; its result passes through.
  EXPECT_LINEA_ERROR(
      naming_filesystem_errors("points prepare", [&] { return std::filesystem::create_directories(data + "/file/x"); }),
      "points prepare: filesystem error: ", data + "/file/x");
  EXPECT_EQ(naming_filesystem_errors("points prepare", [] { return 7; }), 7);
}

// prepare --out: trailing slashes dropped; a new folder, an empty one or an earlier prepare's is
// taken, anything else refused by name; a manifest that does not parse says to prepare again; the
// data folder as a run records it.
TEST(AppFolders, PrepareOutAndDataManifest) {
  namespace fs = std::filesystem;
  const TempDir tmp;
  const std::string d = tmp.path.string();
  EXPECT_EQ(prepared_data_out("p prepare", d + "/new//"), d + "/new");
  fs::create_directories(d + "/empty");
  EXPECT_EQ(prepared_data_out("p prepare", d + "/empty/"), d + "/empty");
  EXPECT_LINEA_ERROR(prepared_data_out("p prepare", ""), "p prepare: --out is empty");
  const std::string refused = "': it exists and is not a prepared data folder (no data.json)";
  EXPECT_LINEA_ERROR(prepared_data_out("p prepare", "//"), "p prepare: refusing to replace '/" + refused);
  fs::create_directories(d + "/other");
  write_all(d + "/other/x", "x");
  EXPECT_LINEA_ERROR(prepared_data_out("p prepare", d + "/other"), "refusing to replace '" + d + "/other" + refused);
  write_all(d + "/empty_file", "");
  EXPECT_LINEA_ERROR(prepared_data_out("p prepare", d + "/empty_file"),
                     "refusing to replace '" + d + "/empty_file" + refused);
  write_all(d + "/other/data.json", "{\"n\": 3");
  EXPECT_EQ(prepared_data_out("p prepare", d + "/other"), d + "/other");
  EXPECT_LINEA_ERROR(read_data_json("p", d + "/other"), "p: cannot read '" + d + "/other/data.json': ");
  EXPECT_LINEA_ERROR(read_data_json("p", d + "/other"), "; run `p prepare --out " + d + "/other` again");
  write_all(d + "/other/data.json", "{\"n\": 3}");
  EXPECT_EQ(read_data_json("p", d + "/other").at("n"), 3);
  // What a run records of its data folder: one spelling for each way to name it.
  for (const std::string& spelling : {d + "/other", d + "/other/", d + "/other/./", d + "/x/../other//"})
    EXPECT_EQ(recorded_data_dir(spelling), d + "/other") << spelling;
  EXPECT_EQ(recorded_data_dir("rel/"), (fs::current_path() / "rel").string());
  EXPECT_EQ(recorded_data_dir("/"), "/");
}

// --eval-only evaluates the best weights when model selection kept some, else the last ones;
// prints the metrics' text naming the folder and writes them to <out>/eval.json. A command that
// uses a model takes the same folder, with its --threads.
TEST(AppRun, EvalOnlyAndModelRunsTakeTheBestWeights) {
  const TempDir tmp;
  RunOptions run;
  run.checkpoint_dir = (tmp.path / "ckpt").string();
  run.out_dir = (tmp.path / "out").string();
  const std::string ck = run.checkpoint_dir;
  std::string seen;
  const auto evaluate = [&](const std::string& dir) {
    seen = dir;
    return Metrics{{{"acc", 0.5}}, "acc 50%"};
  };
  std::filesystem::create_directories(ck);
  EXPECT_LINEA_ERROR(eval_only("p", run, evaluate), "p: --eval-only needs a checkpoint, but '" + ck + "' holds none");
  EXPECT_EQ(seen, "");
  write_all(ck + "/model.safetensors", "");
  for (const std::string weights : {ck, ck + "/best"}) {
    EXPECT_EQ(best_weights_dir(ck), weights);
    ModelOptions model;
    model.checkpoint = ck;
    model.device = "cpu";
    EXPECT_EQ(start_model_run("p", model).weights_dir, weights);
    testing::internal::CaptureStdout();
    const Metrics m = eval_only("p", run, evaluate);
    EXPECT_EQ(testing::internal::GetCapturedStdout(), "p: acc 50% (weights from " + weights + ")\n");
    EXPECT_EQ(seen, weights);
    EXPECT_EQ(nlohmann::json::parse(read_all(run.out_dir + "/eval.json")), m.values);
    std::filesystem::create_directories(ck + "/best");
    write_all(ck + "/best/model.safetensors", "");
  }
}

// start_run and start_model_run set --threads; start_run refuses --precision tf32/bf16 on the
// CPU, and a --resume from another app's checkpoint by name (a run that does not resume, or
// finds no checkpoint, is not looked at).
TEST(AppRun, StartRunSetsThreadsPrecisionAndRefusesAnotherAppsCheckpoint) {
  const TempDir tmp;
  const int before = linea::num_threads();
  const int other = before == 1 ? 2 : 1;
  RunOptions run;
  run.device = "cpu";
  run.threads = other;
  run.checkpoint_dir = (tmp.path / "ckpt").string();
  EXPECT_EQ(start_run("p", run, "linea-p/1"), linea::kCPU);
  EXPECT_EQ(linea::num_threads(), other);
  ModelOptions model;
  model.device = "cpu";
  model.checkpoint = run.checkpoint_dir;
  model.threads = before;
  start_model_run("p", model);
  EXPECT_EQ(linea::num_threads(), before);
  run.threads = 0;
  run.precision = "bf16";
  EXPECT_LINEA_ERROR(start_run("p", run, "linea-p/1"), "p: --precision bf16 needs --device cuda");
  run.precision = "fp32";
  run.resume = true;
  start_run("p", run, "linea-p/1");  // nothing to resume from yet
  std::filesystem::create_directories(run.checkpoint_dir);
  write_all(run.checkpoint_dir + "/model.safetensors", "");
  write_all(run.checkpoint_dir + "/config.json", R"({"format": "linea-q/1"})");
  EXPECT_LINEA_ERROR(start_run("p", run, "linea-p/1"),
                     "p: '" + run.checkpoint_dir + "' is not a p checkpoint (its config.json has format 'linea-q/1'");
  run.resume = false;
  start_run("p", run, "linea-p/1");
}

// The run's last two lines: headline, wall time, rate and device; the outputs, the app's own
// files among them, and where the best weights are when a metric selects them.
TEST(AppRun, ReportRunNamesTheOutputs) {
  TrainSetup setup;
  setup.app = "p";
  setup.unit = "points";
  setup.device = linea::kCPU;
  RunOptions run;
  run.out_dir = "/o";
  TrainResult r;
  r.wall_s = 65;
  r.units_per_s = 1234.4;
  const std::string first =
      "\np: acc 50%; " + format_duration(65) + " wall, 1234 train points/s on " + device_name(linea::kCPU) + "\n";
  for (const bool select : {false, true}) {
    setup.select.metric = select ? "acc" : "";
    testing::internal::CaptureStdout();
    report_run(setup, run, r, "acc 50%", {"hyp.txt", "bleu.json"});
    EXPECT_EQ(testing::internal::GetCapturedStdout(),
              first + "p: outputs in /o: metrics.jsonl, summary.json, curves.png, hyp.txt, bleu.json; checkpoint " +
                  "/o/checkpoint" + (select ? " (best weights in /o/checkpoint/best)" : "") + "\n");
  }
}

namespace {
// A handler of our own, to see the guard put it back.
void count_signal(int) {}

struct sigaction handler_of(int sig) {
  struct sigaction sa;
  sigaction(sig, nullptr, &sa);
  return sa;
}
}  // namespace

// The guard records SIGINT and SIGTERM and prints its note for each (cut to its buffer when the
// app's name is long); its handler restarts interrupted calls and is reset by the first signal
// (a second one ends the process); a signal the process was ignoring stays ignored; the old
// handlers come back after.
TEST(Interrupt, GuardRecordsPrintsAndRestores) {
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGUSR1), "signal " + std::to_string(SIGUSR1));
  struct sigaction mine, old_int, old_term;
  std::memset(&mine, 0, sizeof mine);
  mine.sa_handler = count_signal;
  sigaction(SIGINT, &mine, &old_int);
  sigaction(SIGTERM, &mine, &old_term);
  {
    InterruptGuard guard("pts");
    EXPECT_EQ(pending_interrupt(), 0);
    for (const int sig : {SIGINT, SIGTERM}) {
      EXPECT_NE(handler_of(sig).sa_flags & SA_RESTART, 0);
      testing::internal::CaptureStderr();
      raise(sig);
      EXPECT_EQ(testing::internal::GetCapturedStderr(),
                "\npts: " + signal_name(sig) +
                    ": finishing this step and saving a checkpoint (send it again to stop at once)\n");
      EXPECT_EQ(pending_interrupt(), sig);
      EXPECT_EQ(handler_of(sig).sa_handler, SIG_DFL);  // the next one ends the process
    }
  }
  EXPECT_EQ(pending_interrupt(), 0);
  EXPECT_EQ(handler_of(SIGINT).sa_handler, count_signal);
  EXPECT_EQ(handler_of(SIGTERM).sa_handler, count_signal);
  for (const int ignored : {SIGINT, SIGTERM}) {
    signal(ignored, SIG_IGN);
    {
      InterruptGuard guard("pts");
      EXPECT_EQ(handler_of(ignored).sa_handler, SIG_IGN);
      const int caught = ignored == SIGINT ? SIGTERM : SIGINT;
      EXPECT_NE(handler_of(caught).sa_handler, count_signal);
      EXPECT_NE(handler_of(caught).sa_handler, SIG_IGN);
    }
    signal(ignored, count_signal);
  }
  {
    InterruptGuard guard(std::string(300, 'a'));
    testing::internal::CaptureStderr();
    raise(SIGTERM);
    const std::string note = testing::internal::GetCapturedStderr();
    EXPECT_EQ(note.size(), 256u);
    EXPECT_EQ(note.substr(0, 4), "\naaa");
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
}

namespace {
Figure sample_figure() {
  Figure fig;
  fig.title = "Linea's ViT on Fashion-MNIST (attention softmax)";
  fig.xlabel = "step";
  fig.ylabel = "loss";
  fig.y2label = "accuracy";
  Series train{"train_loss", {}, {}, false, false};
  Series test{"test accuracy", {}, {}, true, true};
  for (int i = 0; i <= 200; ++i) {
    train.x.push_back(i * 10);
    train.y.push_back(2.3 * std::exp(-i / 60.0) + 0.3 + 0.05 * std::sin(i));
  }
  train.y[50] = std::nan("");  // skipped, not an error
  for (int e = 1; e <= 4; ++e) {
    test.x.push_back(e * 500);
    test.y.push_back(0.7 + 0.05 * e);
  }
  fig.series = {train, test, Series{"empty", {}, {}, false, false}};
  return fig;
}
}  // namespace

TEST(PlotPng, WritesAPngWhenGnuplotIsInstalled) {
  if (!gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (Debian package gnuplot-nox)";
  const TempDir tmp;
  const std::string dir = tmp.path.string();
  const std::string path = dir + "/curves.png";
  write_all(path, "old picture");  // replaced as a whole
  std::string err = "stale";
  ASSERT_TRUE(plot_png(path, sample_figure(), &err)) << err;
  EXPECT_EQ(err, "");
  const std::string png = read_all(path);
  ASSERT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(png.size(), 5000u);  // a drawn 960x600 plot, not an empty canvas
  EXPECT_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
  // Quotes and spaces in the path survive both the shell and gnuplot's string syntax.
  const std::string odd = dir + "/it's a \"plot\".png";
  ASSERT_TRUE(plot_png(odd, sample_figure(), &err)) << err;
  EXPECT_EQ(read_all(odd).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  if (const char* keep = std::getenv("LINEA_KEEP_PLOT")) {
    std::ofstream(keep, std::ios::binary) << png;
  }
}

TEST(PlotPng, FailuresReturnFalseWithAReason) {
  const TempDir dir;
  std::string err;
  Figure fig = sample_figure();
  EXPECT_FALSE(plot_png(dir.file("no/such/dir/curves.png"), fig, &err));
  if (gnuplot_available()) {
    EXPECT_NE(err.find("no/such/dir/curves.png"), std::string::npos) << err;
  }
  EXPECT_EQ(err.rfind("plot_png: ", 0), 0u) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_FALSE(plot_png(dir.file("no/such/dir/curves.png"), fig));  // no error string: still false

  Figure empty;
  empty.series = {Series{"nan", {1, 2}, {std::nan(""), std::nan("")}, false, false}};
  err.clear();
  EXPECT_FALSE(plot_png(dir.file("empty.png"), empty, &err));
  EXPECT_NE(err.find("nothing to plot"), std::string::npos) << err;

  Figure ragged;
  ragged.series = {Series{"ragged", {1, 2, 3}, {1, 2}, false, false}};
  err.clear();
  EXPECT_FALSE(plot_png(dir.file("ragged.png"), ragged, &err));
  EXPECT_NE(err.find("ragged"), std::string::npos) << err;
}

// With a gnuplot of our own first on PATH (a shell script that keeps the script and data it is
// given, and draws or fails as told by $FAKE_GNUPLOT): what plot_png asks of gnuplot, and how
// it reports gnuplot's failures.
TEST(PlotPng, WhatGnuplotIsGivenAndItsFailures) {
  const TempDir tmp;
  const std::string bin = tmp.file("bin"), kept = tmp.file("kept");
  ::mkdir(bin.c_str(), 0755);
  // The script and data file it was given kept at $FAKE_KEPT.gp and .dat.
  write_all(bin + "/gnuplot", R"SH(#!/bin/sh
cp "$1" "$FAKE_KEPT.gp"
cp "$(sed -n "s/^plot '\([^']*\)'.*/\1/p" "$1")" "$FAKE_KEPT.dat"
out=$(sed -n "s/^set output '\(.*\)'$/\1/p" "$1")
case "$FAKE_GNUPLOT" in
  draw) printf 'PNG' > "$out" ;;
  fail) echo "\"$1\" line 3: warning: font not found"; echo "\"$1\" line 7: cannot open file"
        echo 'system error: No such file or directory'; exit 1 ;;
  odd) printf 'first words\nlast words\n  \t^\n'; exit 2 ;;
  kill) kill -9 $$ ;;
esac
)SH");
  ::setenv("FAKE_KEPT", kept.c_str(), 1);
  ::chmod((bin + "/gnuplot").c_str(), 0755);
  const std::string saved = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", (bin + ":" + saved).c_str(), 1);
  Figure fig;
  fig.title = "it's\ta test";  // a quote doubled, a control character a space
  fig.xlabel = "epoch";
  fig.y2label = "accuracy (%)";
  fig.series = {Series{"acc", {3}, {75}, true, false},  // one point: drawn with points
                Series{"loss", {1, 2, 3, std::nan("")}, {0.5, std::nan(""), 0.25, 1}, false, false},
                Series{"none", {1}, {INFINITY}, false, false}};  // nothing finite: left out
  const std::string path = tmp.file("curves.png");
  std::string err;
  ::setenv("FAKE_GNUPLOT", "draw", 1);
  const bool drew = plot_png(path, fig, &err);
  const std::string gp = read_all(kept + ".gp"), dat = read_all(kept + ".dat");
  ::setenv("FAKE_GNUPLOT", "fail", 1);
  std::string fail_err;
  const bool failed = plot_png(path, fig, &fail_err);
  ::setenv("FAKE_GNUPLOT", "kill", 1);
  std::string kill_err;
  const bool killed = plot_png(path, fig, &kill_err);
  ::setenv("FAKE_GNUPLOT", "none", 1);
  std::string none_err;
  const bool none = plot_png(path, fig, &none_err);
  ::setenv("FAKE_GNUPLOT", "odd", 1);
  std::string odd_err;
  const bool odd = plot_png(path, fig, &odd_err);
  // Without a title, an x label or a right-axis label: none is set.
  Figure bare = fig;
  bare.title = bare.xlabel = bare.y2label = "";
  ::setenv("FAKE_GNUPLOT", "draw", 1);
  const bool bare_drew = plot_png(tmp.file("bare.png"), bare, &err);
  const std::string bare_gp = read_all(kept + ".gp");
  ::setenv("PATH", saved.c_str(), 1);
  ::unsetenv("FAKE_GNUPLOT");
  ::unsetenv("FAKE_KEPT");

  ASSERT_TRUE(bare_drew) << err;
  EXPECT_EQ(bare_gp.find("set title"), std::string::npos) << bare_gp;
  EXPECT_EQ(bare_gp.find("set xlabel"), std::string::npos) << bare_gp;
  EXPECT_EQ(bare_gp.find("y2label"), std::string::npos) << bare_gp;
  EXPECT_NE(bare_gp.find("set y2tics"), std::string::npos) << bare_gp;  // the right axis itself stays
  ASSERT_TRUE(drew);
  EXPECT_EQ(read_all(path), "PNG");
  EXPECT_NE(gp.find("set title 'it''s a test'\n"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set xlabel 'epoch'\n"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("set ylabel"), std::string::npos) << gp;  // none given
  EXPECT_NE(gp.find("set y2tics\nset y2label 'accuracy (%)'\n"), std::string::npos) << gp;
  EXPECT_NE(gp.find("index 0 using 1:2 with linespoints pointtype 7 pointsize 0.8 linewidth 2 axes x1y2 title 'acc'"),
            std::string::npos)
      << gp;
  EXPECT_NE(gp.find("index 1 using 1:2 with lines linewidth 2 axes x1y1 title 'loss'"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("'none'"), std::string::npos) << gp;
  EXPECT_NE(gp.find("size 960,600"), std::string::npos) << gp;
  EXPECT_EQ(dat, "3 75\n\n\n1 0.5\n3 0.25\n");  // points with a NaN left out; two blocks
  EXPECT_FALSE(failed);
  EXPECT_EQ(fail_err,
            "plot_png: gnuplot failed (exit status 1): line 7: cannot open file (system error: No such file "
            "or directory)");
  EXPECT_FALSE(killed);
  // (popen's shell outlives gnuplot and reports its signal as 128 + 9)
  EXPECT_EQ(kill_err.rfind("plot_png: gnuplot failed (exit status 137)", 0), 0u) << kill_err;
  EXPECT_FALSE(none);
  EXPECT_NE(none_err.find("gnuplot wrote no picture"), std::string::npos) << none_err;
  EXPECT_FALSE(odd);  // no "line N:" error: its last line (not the caret under it)
  EXPECT_EQ(odd_err, "plot_png: gnuplot failed (exit status 2): last words");
  EXPECT_EQ(read_all(path), "PNG");  // the failures left the picture before them alone
  EXPECT_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
  Figure tiny = fig;
  tiny.width = 15;
  EXPECT_FALSE(plot_png(path, tiny, &err));
  EXPECT_NE(err.find("picture size 15x600 out of range"), std::string::npos) << err;
}

TEST(PlotPng, MissingGnuplotIsAReasonNotACrash) {
  // With an empty PATH gnuplot cannot be found; the call must say so, not fail silently.
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", "/nonexistent-linea-dir", 1);
  const TempDir dir;
  std::string err;
  const bool available = gnuplot_available();
  const bool ok = plot_png(dir.file("x.png"), sample_figure(), &err);
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_FALSE(available);
  EXPECT_FALSE(ok);
  EXPECT_NE(err.find("gnuplot not found"), std::string::npos) << err;
}
