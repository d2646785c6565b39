// The checks every attention mechanism passes, whatever its formula, run on each of its
// registered test specs (AttentionInfo::test_specs, attention/registry.h):
//  - what it declares is what it is: the options its factory reads and their defaults, its support;
//  - MultiHeadAttention with it passes a float64 gradcheck (samples frozen, keys padded);
//  - the content of padded keys never reaches an output;
//  - training draws new random quantities, eval is deterministic (unless it says it draws in eval);
//  - float32 stays finite for |q~|, |k~| up to 5 and for fully padded rows;
//  - on the CPU, identical forward+backward calls give the same bits while another thread
//    competes for the cores (sums whose order does not depend on timing);
//  - cross-attention (when supported) takes keys of another length.
// tests/test_attention_claims.cpp runs it on the built-in mechanisms; a mechanism defined outside
// the library runs it on its own (apps/examples/custom_attention/test_custom_attention.cpp):
//
//   INSTANTIATE_TEST_SUITE_P(Cosine, AttentionSuite, ::testing::ValuesIn(linea::test::suite_specs({"cosine"})),
//                            linea::test::spec_test_name);
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace linea::test {

class AttentionSuite : public ::testing::TestWithParam<std::string> {};

// The test specs of the named mechanisms (all registered ones when empty); a mechanism that
// declares none is run with its bare name.
std::vector<std::string> suite_specs(const std::vector<std::string>& names = {});

// "performer:features=8" -> "performer_features_8": a spec as a test name.
std::string spec_test_name(const ::testing::TestParamInfo<std::string>& info);

}  // namespace linea::test
