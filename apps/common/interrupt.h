// SIGINT and SIGTERM while training (Ctrl-C, `kill`, a scheduler's preemption notice): the
// training loop finishes the step it is in, saves a checkpoint and throws Interrupted, and the
// app exits with 128 + the signal (the shell's convention: 130, 143) after saying how to resume.
//
// InterruptGuard catches the two signals for its lifetime (the loop holds one while it trains)
// and only records them; a second signal of either kind gets the default action and ends the
// process at once (the checkpoint on disk is always whole: nn/checkpoint.h writes atomically).
// Not here: when the loop looks at the flag (apps/common/train_loop.cpp).
#pragma once

#include <signal.h>

#include <stdexcept>
#include <string>

namespace linea::apps {

// Thrown by the loop after it saved the checkpoint of an interrupted run; apps::fail() prints
// the message (not as an error) and returns exit_code().
class Interrupted : public std::runtime_error {
 public:
  Interrupted(const std::string& what, int signal) : std::runtime_error(what), signal_(signal) {}
  int signal() const { return signal_; }
  int exit_code() const { return 128 + signal_; }

 private:
  int signal_;
};

class InterruptGuard {
 public:
  // app: the prefix of the note printed when the first signal arrives (e.g. "vit").
  explicit InterruptGuard(const std::string& app);
  ~InterruptGuard();  // the previous handlers again
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_, old_term_;
};

// The signal received while a guard is alive (SIGINT or SIGTERM), or 0.
int pending_interrupt();

// "SIGINT", "SIGTERM", else "signal N".
std::string signal_name(int signal);

}  // namespace linea::apps
