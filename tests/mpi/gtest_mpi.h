// GoogleTest's main for tests that run as an MPI job (every rank runs every test): only rank 0
// prints gtest's progress, and a failure on any rank fails every rank's exit code.
//   int main(int argc, char** argv) {
//     ::testing::InitGoogleTest(&argc, argv);
//     linea::dist::init();
//     return linea::test::run_all_tests_on_every_rank();
//   }
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "core/ops.h"
#include "nn/dist.h"

namespace linea::test {

inline int run_all_tests_on_every_rank() {
  if (dist::rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  Tensor failed = from_vector<int64_t>({rc != 0 ? 1 : 0}, {1});
  dist::all_reduce(failed, dist::ReduceOp::Max);
  if (failed.item() != 0 && rc == 0) std::fprintf(stderr, "rank %d: another rank failed\n", dist::rank());
  return failed.item() != 0 ? 1 : 0;
}

}  // namespace linea::test
