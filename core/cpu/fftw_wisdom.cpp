// The machine's FFTW wisdom files (see fftw.h): where they live, the lock that makes planning a
// shape and recording it one step across processes, and their atomic replacement.
//
// Folder: $LINEA_FFTW_WISDOM (a folder; "off" turns measured plans off), else
// $XDG_CACHE_HOME/linea, else $HOME/.cache/linea; created if missing. Files
// fftw-wisdom-float / fftw-wisdom-double, each with a .lock beside it. A file that FFTW cannot
// read (torn, another FFTW version) is ignored and replaced at the next measurement.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/cpu/fftw.h"

namespace linea::cpu::fftw {

namespace {

// The folder for wisdom files, "" when measured plans are off or no folder is known.
std::string wisdom_folder() {
  if (const char* dir = std::getenv("LINEA_FFTW_WISDOM"); dir != nullptr && *dir != '\0')
    return std::string(dir) == "off" ? std::string() : std::string(dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/')
    return std::string(xdg) + "/linea";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/')
    return std::string(home) + "/.cache/linea";
  return {};
}

// mkdir -p; true if `dir` is a folder afterwards.
bool make_folders(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos < dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

WisdomFile::WisdomFile(const char* precision) {
  const std::string dir = wisdom_folder();
  if (dir.empty() || !make_folders(dir)) return;
  path_ = dir + "/fftw-wisdom-" + precision;
  const int fd = ::open((path_ + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    ::close(fd);
    return;
  }
  lock_fd_ = fd;
}

WisdomFile::~WisdomFile() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void WisdomFile::save(int (*write)(const char*)) const {
  if (!ok()) return;
  const std::string tmp = path_ + ".tmp." + std::to_string(::getpid());
  bool done = write(tmp.c_str()) != 0;
  if (done) {
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    done = fd >= 0 && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
  }
  if (!done || std::rename(tmp.c_str(), path_.c_str()) != 0) ::unlink(tmp.c_str());
}

int64_t& measured_plan_count() {
  static int64_t count = 0;  // changed under planner_mutex()
  return count;
}

}  // namespace linea::cpu::fftw
