// The vit command line as a function, so that a program can add to the library before it runs
// (apps/examples/custom_attention registers an attention mechanism, then calls run_cli).
// Starts the app (apps/common/app_main.h), parses the flags (vit --help), trains or predicts;
// returns the exit code.
#pragma once

namespace vit {

int run_cli(int argc, char** argv);

}  // namespace vit
