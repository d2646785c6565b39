// File helpers shared by the nn/ readers and writers: atomic writes (temp file in the same
// directory, fsync, rename over the target, fsync the directory) and whole-file reads, both
// throwing linea::Error that names the operation, the path and the OS error.
// StagingDir builds a whole folder beside its destination and renames it into place.
// Not here: any file format (nn/safetensors.h, nn/data.h parse their own bytes).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace linea::nn::detail {

// One piece of a file's contents (the pieces are written back to back).
struct ByteSpan {
  const void* data;
  size_t size;
};

inline std::string errno_str(int err) { return std::string(std::strerror(err)); }

inline std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

inline std::string temp_path_for(const std::string& path) {
  return path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
}

// First half of an atomic write: the concatenation of `pieces` goes to temp_path_for(path)
// ("<path>.tmp.<pid>", in the same directory so the later rename stays on one filesystem),
// flushed and fsync'ed. Returns the temp path. On failure the temp file is removed and
// linea::Error names `op`, both paths and the OS error; `path` is never touched.
inline std::string write_temp_file(const std::string& path, const std::vector<ByteSpan>& pieces, const char* op) {
  LINEA_CHECK(!path.empty(), op, ": empty file path");
  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  LINEA_CHECK(f != nullptr, op, ": cannot create '", tmp, "' (temporary file for '", path, "'): ", errno_str(errno),
              "; '", path, "' was not modified");
  auto fail = [&](const char* what, int err) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    LINEA_FAIL(op, ": ", what, " '", tmp, "' (temporary file for '", path, "'): ", errno_str(err), "; '", path,
               "' was not modified");
  };
  for (const ByteSpan& p : pieces) {
    if (p.size == 0) continue;
    if (std::fwrite(p.data, 1, p.size, f) != p.size) fail("write failed on", errno);
  }
  if (std::fflush(f) != 0) fail("flush failed on", errno);
  if (::fsync(::fileno(f)) != 0) fail("fsync failed on", errno);
  int rc = std::fclose(f);
  f = nullptr;
  if (rc != 0) fail("close failed on", errno);
  return tmp;
}

// Second half: renames the finished temp file over `path`, then fsyncs the directory so the
// rename itself is durable (a directory that cannot be fsync'ed, as on some filesystems, is
// not an error: the file is complete either way). On failure the temp file is removed.
inline void commit_temp_file(const std::string& tmp, const std::string& path, const char* op) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    LINEA_FAIL(op, ": cannot rename '", tmp, "' to '", path, "': ", errno_str(err), "; '", path, "' was not modified");
  }
  int dfd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

// Writes the concatenation of `pieces` to `path` so that readers see either the old file or
// the complete new one, never a partial write (write_temp_file + commit_temp_file).
inline void write_file_atomic(const std::string& path, const std::vector<ByteSpan>& pieces, const char* op) {
  commit_temp_file(write_temp_file(path, pieces, op), path, op);
}

inline void write_file_atomic(const std::string& path, const std::string& bytes, const char* op) {
  write_file_atomic(path, {ByteSpan{bytes.data(), bytes.size()}}, op);
}

// The whole file as bytes (one read); linea::Error naming `op` when it cannot be read.
inline std::vector<char> read_file_bytes(const std::string& path, const char* op) {
  struct stat st;
  LINEA_CHECK(::stat(path.c_str(), &st) == 0, op, ": cannot open '", path, "': ", errno_str(errno));
  LINEA_CHECK(!S_ISDIR(st.st_mode), op, ": '", path, "' is a directory, not a file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  LINEA_CHECK(f != nullptr, op, ": cannot open '", path, "': ", errno_str(errno));
  // One read of the expected size, then whatever the file grew by since stat().
  std::vector<char> bytes(st.st_size > 0 ? static_cast<size_t>(st.st_size) : 0);
  size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  bytes.resize(got);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  bool err = std::ferror(f) != 0;
  int e = errno;
  std::fclose(f);
  LINEA_CHECK(!err, op, ": read error on '", path, "': ", errno_str(e));
  return bytes;
}

}  // namespace linea::nn::detail

namespace linea::nn {
// Writes `text` to `path` atomically (temp file + rename): readers see the old file or the new
// one, never half of it. For apps' outputs (CSV, JSON summaries).
inline void write_text_file_atomic(const std::string& path, const std::string& text) {
  detail::write_file_atomic(path, text, "write_text_file_atomic");
}

// A folder written in full before it appears: created empty at `path` (e.g. "<out>.tmp.<pid>",
// a sibling of the destination, so the rename stays on one filesystem), removed with its
// contents at scope exit unless install() moved it into place.
class StagingDir {
 public:
  explicit StagingDir(std::filesystem::path path) : path_(std::move(path)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directory(path_);
  }
  ~StagingDir() {
    std::error_code ec;
    if (!installed_) std::filesystem::remove_all(path_, ec);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

  // Renames the finished folder to `out`; an existing `out` is moved aside first and removed
  // after, so `out` is always the old folder, absent, or the new complete one.
  void install(const std::filesystem::path& out) {
    const std::filesystem::path old = out.string() + ".old." + std::to_string(static_cast<long>(::getpid()));
    const bool exists = std::filesystem::exists(out);
    if (exists) std::filesystem::rename(out, old);
    std::filesystem::rename(path_, out);
    installed_ = true;
    if (exists) std::filesystem::remove_all(old);
  }

 private:
  std::filesystem::path path_;
  bool installed_ = false;
};
}  // namespace linea::nn
