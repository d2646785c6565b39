// SIGINT / SIGTERM recording for the training loop (see interrupt.h).
#include "apps/common/interrupt.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>

namespace linea::apps {

namespace {

volatile std::sig_atomic_t g_signal = 0;
// The note the handler writes (write(2) is async-signal-safe; formatting is not): made up front.
char g_note_int[256], g_note_term[256];
size_t g_note_int_len = 0, g_note_term_len = 0;

void on_signal(int sig) {
  g_signal = sig;
  // SA_RESETHAND has restored the default action: a second signal ends the process.
  const char* note = sig == SIGINT ? g_note_int : g_note_term;
  const size_t len = sig == SIGINT ? g_note_int_len : g_note_term_len;
  ssize_t ignored = ::write(STDERR_FILENO, note, len);
  (void)ignored;
}

size_t make_note(char* buf, size_t cap, const std::string& app, const char* sig) {
  const std::string s =
      "\n" + app + ": " + sig + ": finishing this step and saving a checkpoint (send it again to stop at once)\n";
  const size_t n = std::min(s.size(), cap);
  std::memcpy(buf, s.data(), n);
  return n;
}

}  // namespace

InterruptGuard::InterruptGuard(const std::string& app) {
  g_signal = 0;
  g_note_int_len = make_note(g_note_int, sizeof g_note_int, app, "SIGINT");
  g_note_term_len = make_note(g_note_term, sizeof g_note_term, app, "SIGTERM");
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;  // interrupted reads and writes carry on
  // A signal the process was started ignoring stays ignored (as `cmd &` does with SIGINT in a
  // script, and nohup-like launchers do).
  sigaction(SIGINT, nullptr, &old_int_);
  sigaction(SIGTERM, nullptr, &old_term_);
  if (old_int_.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, nullptr);
  if (old_term_.sa_handler != SIG_IGN) sigaction(SIGTERM, &sa, nullptr);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  g_signal = 0;
}

int pending_interrupt() { return g_signal; }

std::string signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signal);
}

}  // namespace linea::apps
