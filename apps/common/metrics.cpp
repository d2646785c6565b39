// MetricsLog (see metrics.h): append-and-flush writer, resume trimming, reader.
// Not here: fsync per line — a flushed line survives a crash of the process, which is the
// failure that matters for a training run; surviving a power cut is the checkpoint's job.
#include "apps/common/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <cstring>
#include <sys/stat.h>

#include "core/error.h"
#include "nn/io_util.h"

namespace linea::apps {
namespace {

// Calls fn(json) for each line of `text` that parses as a JSON object; other lines (blank,
// malformed, half-written, or valid JSON that is not an object) are skipped.
template <typename Fn> void for_each_record(const std::string& text, Fn&& fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) fn(std::move(j));
  }
}

std::string read_text(const std::string& path, const char* op) {
  const std::vector<char> bytes = nn::detail::read_file_bytes(path, op);
  return std::string(bytes.begin(), bytes.end());
}

// One record as a line; invalid UTF-8 in a string is replaced rather than thrown on, since a
// metrics line must never stop a run.
std::string to_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step) : path_(path) {
  LINEA_CHECK(!path_.empty(), "MetricsLog: empty path");
  const char* mode = "w";
  if (resume_step >= 0) {
    mode = "a";
    struct stat st;
    if (::stat(path_.c_str(), &st) == 0) {
      // Keep what the checkpoint we resume from had already seen; drop what came after it.
      std::string kept;
      for_each_record(read_text(path_, "MetricsLog"), [&](nlohmann::json j) {
        auto it = j.find("step");
        if (it != j.end() && it->is_number() && it->get<double>() > static_cast<double>(resume_step)) return;
        kept += to_line(j);
      });
      nn::write_text_file_atomic(path_, kept);
    }
  }
  file_ = std::fopen(path_.c_str(), mode);
  LINEA_CHECK(file_ != nullptr, "MetricsLog: cannot open '", path_, "' for ", resume_step >= 0 ? "appending" : "writing",
              ": ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record) {
  LINEA_CHECK(record.is_object(), "MetricsLog::write: a record must be a JSON object, got ", record.type_name(),
              " (file '", path_, "')");
  const std::string line = to_line(record);
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  LINEA_CHECK(ok, "MetricsLog::write: write to '", path_, "' failed: ", std::strerror(errno));
}

const std::string& MetricsLog::path() const { return path_; }

std::vector<nlohmann::json> MetricsLog::read(const std::string& path) {
  std::vector<nlohmann::json> out;
  for_each_record(read_text(path, "MetricsLog::read"), [&](nlohmann::json j) { out.push_back(std::move(j)); });
  return out;
}

nlohmann::json read_json_file(const std::string& path, const std::string& who) {
  std::ifstream f(path);
  LINEA_CHECK(f.good(), who, ": cannot read '", path, "'");
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    LINEA_FAIL(who, ": '", path, "' is not valid JSON: ", e.what());
  }
}

nlohmann::json length_summary(std::vector<int64_t> v) {
  if (v.empty()) return {{"mean", 0}, {"median", 0}, {"p90", 0}, {"max", 0}};
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (int64_t x : v) sum += static_cast<double>(x);
  const auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {{"mean", std::round(sum / v.size() * 100) / 100}, {"median", at(0.5)}, {"p90", at(0.9)}, {"max", v.back()}};
}

}  // namespace linea::apps
