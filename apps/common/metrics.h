// MetricsLog: the apps' metrics.jsonl (one JSON object per logged step/epoch), written line by
// line and flushed so a crash loses at most the line being written, and trimmed on --resume so
// the log matches the checkpoint the run continues from.
// Not here: what the records contain (each app picks its fields; "step" is the only one this
// class reads) or the final summary.json (written once with nn::write_text_file_atomic).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace linea::apps {

// metrics.jsonl: one JSON object per line, appended and flushed (fflush + fsync not needed per line)
// so a crash loses at most the line being written.
class MetricsLog {
 public:
  // Opens path for appending. resume_step < 0: a fresh run — the file is truncated.
  // resume_step >= 0: a resumed run — lines whose "step" is > resume_step (left by the interrupted run
  // after its last checkpoint) are dropped (the kept lines are rewritten atomically via
  // nn/io_util.h write_text_file_atomic), then new lines are appended. Lines without "step" are kept;
  // a malformed line (e.g. a half-written last line) is dropped.
  // Throws linea::Error naming the path when the file cannot be opened or rewritten.
  MetricsLog(const std::string& path, int64_t resume_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // One line, flushed. Throws linea::Error when record is not an object or the write fails.
  void write(const nlohmann::json& record);
  const std::string& path() const;
  // All records of a metrics.jsonl (malformed lines skipped), e.g. to redraw curves after a resume.
  // Throws linea::Error when the file cannot be read.
  static std::vector<nlohmann::json> read(const std::string& path);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// A whole JSON file (config.json, summary.json); throws linea::Error naming `who` and the path
// when it cannot be read or parsed.
nlohmann::json read_json_file(const std::string& path, const std::string& who);

// Mean (2 decimals), median, p90 and max of a list of lengths, as {"mean", "median", "p90", "max"}
// (all 0 for an empty list): the data statistics the apps' prepare steps write.
nlohmann::json length_summary(std::vector<int64_t> lengths);

}  // namespace linea::apps
