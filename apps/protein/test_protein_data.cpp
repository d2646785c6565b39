// The protein app's data: the ESM-2 alphabet, masking (BERT proportions; evaluation masks that do
// not depend on batching, windows or packing; training masks that change every epoch), windows
// (whole sequences, crops, packed streams), padded batches, and `prepare` end to end with the real
// mmseqs2 on generated families of related sequences (clusters kept whole, counts, byte-identical
// reruns, what a random split leaks, clear errors).
// Not here: the model, training and metrics (test_protein_model.cpp, test_protein.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "alphabet.h"
#include "core/error.h"
#include "dataset.h"
#include "prepare.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using linea::test::error_of;
using linea::test::read_all;
using linea::test::TempDir;
using linea::test::write_all;
using namespace protein;

namespace {

// |count - n p| within 5 binomial standard deviations.
::testing::AssertionResult near_binomial(int64_t count, int64_t n, double p) {
  const double mean = n * p, sd = std::sqrt(n * p * (1 - p));
  if (std::fabs(count - mean) <= 5 * sd) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << count << " of " << n << " is not near p = " << p << " (expected " << mean
                                       << " +- 5 x " << sd << ")";
}

// n random sequences of lengths [min_len, max_len]: mostly standard residues, now and then an X.
std::shared_ptr<const Sequences> random_sequences(int n, int min_len, int max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  auto s = std::make_shared<Sequences>();
  for (int i = 0; i < n; ++i) {
    const int len = min_len + static_cast<int>(rng() % (max_len - min_len + 1));
    std::vector<int8_t> r(len);
    for (int8_t& x : r) x = static_cast<int8_t>(rng() % 50 == 0 ? residue_id('X') : kFirstResidue + rng() % 20);
    s->names.push_back("s" + std::to_string(i));
    s->residues.push_back(std::move(r));
  }
  return s;
}

DatasetOptions opts(bool train, int64_t max_len, int64_t pack = 0, uint64_t seed = 5) {
  DatasetOptions o;
  o.train = train;
  o.max_len = max_len;
  o.pack = pack;
  o.seed = seed;
  return o;
}

// What the model saw at one residue: its input token and its target.
struct Cell {
  int64_t input = 0, target = 0;
  bool operator==(const Cell& o) const { return input == o.input && target == o.target; }
};
using Cells = std::map<std::pair<int64_t, int64_t>, Cell>;  // (sequence, position) -> cell

// Reads a batch back against the windows it was made from: <cls>/<eos> where the pieces say,
// never chosen (target <pad>); padding after each example and nowhere else; a residue's target is
// <pad> (and its input the residue itself) or the residue. Adds every residue to `cells`; a
// residue seen twice is a failure. Returns the batch's tokens of all examples, in order, without
// padding, and with each residue's true id in place of its input (the unmasked stream).
std::vector<int64_t> read_batch(const MaskedLMDataset& ds, const std::vector<int64_t>& idx, Cells& cells) {
  const linea::nn::Batch b = ds.get_batch(idx);
  const int64_t B = static_cast<int64_t>(idx.size()), T = b.at("tokens").size(1);
  EXPECT_EQ(b.at("tokens").shape(), linea::Shape({B, T}));
  EXPECT_EQ(b.at("targets").shape(), linea::Shape({B, T}));
  EXPECT_EQ(b.at("pad").shape(), linea::Shape({B, T}));
  EXPECT_EQ(b.at("pad").dtype(), linea::DType::Bool);
  EXPECT_EQ(b.at("tokens").dtype(), linea::DType::Int64);
  EXPECT_EQ(b.at("index").to_vector<int64_t>(), idx);
  const auto tok = b.at("tokens").to_vector<int64_t>(), tgt = b.at("targets").to_vector<int64_t>(),
             pad = b.at("pad").to_vector<int64_t>();
  std::vector<int64_t> plain;
  int64_t longest = 0;
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = r * T;
    for (const Piece& p : ds.window(idx[r])) {
      if (p.cls) {
        EXPECT_EQ(tok[t], kCls);
        EXPECT_EQ(tgt[t++], kPad);
        plain.push_back(kCls);
      }
      for (int64_t pos = p.begin; pos < p.end; ++pos, ++t) {
        const int64_t res = ds.sequences().residues[p.seq][pos];
        EXPECT_TRUE(tgt[t] == kPad || tgt[t] == res) << "target " << tgt[t] << " at residue " << res;
        if (tgt[t] == kPad) { EXPECT_EQ(tok[t], res); }
        EXPECT_TRUE(cells.insert({{p.seq, pos}, Cell{tok[t], tgt[t]}}).second)
            << "sequence " << p.seq << " position " << pos << " seen twice";
        plain.push_back(res);
      }
      if (p.eos) {
        EXPECT_EQ(tok[t], kEos);
        EXPECT_EQ(tgt[t++], kPad);
        plain.push_back(kEos);
      }
    }
    const int64_t used = t - r * T;
    EXPECT_EQ(used, ds.lengths()[idx[r]]) << "example " << idx[r];
    longest = std::max(longest, used);
    for (int64_t k = 0; k < T; ++k) {
      EXPECT_EQ(pad[r * T + k], k >= used ? 1 : 0);
      if (k >= used) {
        EXPECT_EQ(tok[r * T + k], kPad);
        EXPECT_EQ(tgt[r * T + k], kPad);
      }
    }
  }
  EXPECT_EQ(T, std::max<int64_t>(longest, 1));  // padded to the longest example only
  return plain;
}

// Every example of `ds` read in batches of `batch` in the order `order`.
Cells read_all_cells(const MaskedLMDataset& ds, std::vector<int64_t> order, size_t batch) {
  Cells cells;
  for (size_t k = 0; k < order.size(); k += batch)
    read_batch(ds, std::vector<int64_t>(order.begin() + k, order.begin() + std::min(order.size(), k + batch)), cells);
  return cells;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// ---- alphabet ------------------------------------------------------------------------------------

TEST(ProteinDataAlphabet, IdsMatchEsm2) {
  // fair-esm's Alphabet.from_architecture("ESM-1b"): prepend <cls> <pad> <eos> <unk>, the
  // proteinseq_toks, then <null_1> and <mask> (ESM-2 uses the same list).
  const std::vector<std::string> esm2 = {"<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R",
                                         "T",     "I",     "D",     "P",     "K", "Q", "N", "F", "Y", "M", "H",
                                         "W",     "C",     "X",     "B",     "U", "Z", "O", ".", "-", "<null_1>",
                                         "<mask>"};
  ASSERT_EQ(static_cast<int64_t>(esm2.size()), kVocabSize);
  for (int64_t id = 0; id < kVocabSize; ++id) {
    EXPECT_EQ(token_text(id), esm2[id]) << id;
    EXPECT_EQ(is_residue(id), id >= 4 && id <= 30) << id;
    EXPECT_EQ(is_standard(id), id >= 4 && id <= 23) << id;
    if (esm2[id].size() == 1) { EXPECT_EQ(residue_id(esm2[id][0]), id); }
  }
  EXPECT_EQ(kCls, 0);
  EXPECT_EQ(kPad, 1);
  EXPECT_EQ(kEos, 2);
  EXPECT_EQ(kUnk, 3);
  EXPECT_EQ(kNull, 31);
  EXPECT_EQ(kMask, 32);
  for (char c : std::string("*lajx1 <>\n")) EXPECT_EQ(residue_id(c), -1) << c;
  EXPECT_LINEA_ERROR(token_text(33), "33");
  EXPECT_LINEA_ERROR(token_text(-1), "-1");
}

TEST(ProteinDataAlphabet, EncodeNamesTheSequenceAndPosition) {
  const std::vector<int8_t> ids = encode_residues("MKTXB-.", "seq");
  EXPECT_EQ(ids, std::vector<int8_t>({20, 15, 11, 24, 25, 30, 29}));
  EXPECT_EQ(decode(std::vector<int64_t>(ids.begin(), ids.end())), "MKTXB-.");
  EXPECT_EQ(decode({kCls, 20, kMask, 15, kEos, kPad}), "<cls>M<mask>K<eos><pad>");
  EXPECT_LINEA_ERROR(encode_residues("MKV*A", "db.fa: record 3 'sp|P1|X'"), "db.fa: record 3 'sp|P1|X'", "'*'",
                     "position 4");
  EXPECT_LINEA_ERROR(encode_residues("MKVaA", "rec"), "rec", "'a'", "position 4");
  EXPECT_LINEA_ERROR(encode_residues("MK\x01", "rec"), "0x01", "position 3");
  EXPECT_LINEA_ERROR(encode_residues("", "db.fa: record 9 'empty'"), "record 9 'empty'", "empty");
}

TEST(ProteinDataAlphabet, ParseTokensWithMasks) {
  EXPECT_EQ(parse_tokens("MKT<mask>LL<mask>A"),
            std::vector<int64_t>({20, 15, 11, kMask, 4, 4, kMask, 5}));
  EXPECT_EQ(parse_tokens("<cls>M K\nT<eos>"), std::vector<int64_t>({kCls, 20, 15, 11, kEos}));
  EXPECT_EQ(parse_tokens("<null_1><unk><pad>"), std::vector<int64_t>({kNull, kUnk, kPad}));
  EXPECT_EQ(decode(parse_tokens("AC<mask>D")), "AC<mask>D");
  EXPECT_LINEA_ERROR(parse_tokens("MK<msk>A"), "<msk>", "position 3");
  EXPECT_LINEA_ERROR(parse_tokens("MKT1"), "'1'", "position 4");
  EXPECT_LINEA_ERROR(parse_tokens("MK<mask"), "position 3", "not closed");
  EXPECT_LINEA_ERROR(parse_tokens("mk"), "'m'", "position 1");
}

// ---- masking -------------------------------------------------------------------------------------

TEST(ProteinDataMasking, BertProportions) {
  const MaskingOptions m;  // 0.15, of which 0.8 <mask>, 0.1 random, 0.1 kept
  int64_t n = 0, chosen = 0, masked = 0, replaced = 0, kept = 0;
  std::vector<int64_t> replacement(kVocabSize, 0);
  for (int64_t seq = 0; seq < 2000; ++seq)
    for (int64_t pos = 0; pos < 200; ++pos) {
      const int64_t res = kFirstResidue + (seq * 7 + pos) % kNumResidueTokens;  // all 27, X B U Z O . - too
      const MaskDraw d = mask_draw(11, 3, seq, pos, res, m);
      ++n;
      if (!d.chosen) {
        ASSERT_EQ(d.input, res);
        continue;
      }
      ++chosen;
      if (d.input == kMask) {
        ++masked;
      } else if (d.input == res) {
        ++kept;
      } else {
        ++replaced;
        ++replacement[d.input];
        ASSERT_TRUE(is_standard(d.input)) << "replacement " << d.input;
      }
    }
  EXPECT_TRUE(near_binomial(chosen, n, 0.15));
  EXPECT_TRUE(near_binomial(masked, chosen, 0.8));
  // A random replacement equal to the residue itself (1 in 20, for a standard one) looks kept.
  int64_t standard_chosen = 0;
  for (int64_t seq = 0; seq < 2000; ++seq)
    for (int64_t pos = 0; pos < 200; ++pos) {
      const int64_t res = kFirstResidue + (seq * 7 + pos) % kNumResidueTokens;
      standard_chosen += is_standard(res) && mask_draw(11, 3, seq, pos, res, m).chosen;
    }
  const double same = 0.1 * (static_cast<double>(standard_chosen) / chosen) / 20;
  EXPECT_TRUE(near_binomial(replaced, chosen, 0.1 - same));
  EXPECT_TRUE(near_binomial(kept, chosen, 0.1 + same));
  for (int64_t id = kFirstResidue; id < kFirstResidue + kNumStandard; ++id) EXPECT_GT(replacement[id], 0) << id;

  // All chosen, all replaced at random: uniform over the 20 standard residues, never a special.
  MaskingOptions all;
  all.prob = 1;
  all.mask_token = 0;
  all.random_token = 1;
  std::vector<int64_t> counts(kVocabSize, 0);
  const int64_t draws = 100000;
  for (int64_t pos = 0; pos < draws; ++pos) {
    const MaskDraw d = mask_draw(1, 0, 0, pos, residue_id('X'), all);
    ASSERT_TRUE(d.chosen);
    ++counts[d.input];
  }
  for (int64_t id = 0; id < kVocabSize; ++id) {
    if (is_standard(id))
      EXPECT_TRUE(near_binomial(counts[id], draws, 1.0 / 20)) << token_text(id);
    else
      EXPECT_EQ(counts[id], 0) << token_text(id);
  }
  MaskingOptions none;
  none.prob = 0;
  EXPECT_FALSE(mask_draw(1, 0, 0, 0, 4, none).chosen);
}

TEST(ProteinDataMasking, DrawsArePureFunctionsOfSeedStreamSequencePosition) {
  const MaskingOptions m;
  int64_t differ_seed = 0, differ_stream = 0, differ_seq = 0;
  for (int64_t pos = 0; pos < 2000; ++pos) {
    const MaskDraw a = mask_draw(7, 2, 40, pos, 9, m), b = mask_draw(7, 2, 40, pos, 9, m);
    EXPECT_EQ(a.chosen, b.chosen);
    EXPECT_EQ(a.input, b.input);
    differ_seed += a.chosen != mask_draw(8, 2, 40, pos, 9, m).chosen;
    differ_stream += a.chosen != mask_draw(7, 3, 40, pos, 9, m).chosen;
    differ_seq += a.chosen != mask_draw(7, 2, 41, pos, 9, m).chosen;
  }
  // Independent draws disagree with probability 2 x 0.15 x 0.85 = 0.255.
  EXPECT_TRUE(near_binomial(differ_seed, 2000, 0.255));
  EXPECT_TRUE(near_binomial(differ_stream, 2000, 0.255));
  EXPECT_TRUE(near_binomial(differ_seq, 2000, 0.255));
}

TEST(ProteinDataMasking, EvalMasksIgnoreBatchingWindowsAndPacking) {
  const auto seqs = random_sequences(40, 5, 300, 1);
  // Whole sequences in windows of 64 tokens, one example per batch, in order.
  const MaskedLMDataset a(seqs, opts(false, 64));
  const Cells ref = read_all_cells(a, iota(a.size()), 1);
  EXPECT_EQ(static_cast<int64_t>(ref.size()), seqs->total_residues());  // every residue scored once
  int64_t chosen = 0;
  for (const auto& [key, cell] : ref) {
    const int64_t res = seqs->residues[key.first][key.second];
    const MaskDraw d = mask_draw(5, kEvalStream, key.first, key.second, res, MaskingOptions());
    EXPECT_EQ(cell.input, d.input);
    EXPECT_EQ(cell.target, d.chosen ? res : kPad);
    chosen += d.chosen;
  }
  EXPECT_TRUE(near_binomial(chosen, seqs->total_residues(), 0.15));
  // Longer windows, shuffled, batches of 7; packed streams of 100 and 37 tokens; and training
  // mode's set_epoch has no say in evaluation.
  MaskedLMDataset b(seqs, opts(false, 128));
  std::vector<int64_t> order = iota(b.size());
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  b.set_epoch(9);
  EXPECT_TRUE(read_all_cells(b, order, 7) == ref);
  const MaskedLMDataset c(seqs, opts(false, 0, 100)), d(seqs, opts(false, 0, 37));
  EXPECT_TRUE(read_all_cells(c, iota(c.size()), 5) == ref);
  EXPECT_TRUE(read_all_cells(d, iota(d.size()), 64) == ref);
  // Another seed, other masks.
  const MaskedLMDataset e(seqs, opts(false, 64, 0, 6));
  EXPECT_FALSE(read_all_cells(e, iota(e.size()), 16) == ref);
}

TEST(ProteinDataMasking, TrainMasksChangeWithTheEpoch) {
  const auto seqs = random_sequences(30, 20, 100, 2);
  MaskedLMDataset ds(seqs, opts(true, 1000));  // long enough: no crops, every residue once
  const Cells e0 = read_all_cells(ds, iota(ds.size()), 8);
  EXPECT_TRUE(read_all_cells(ds, iota(ds.size()), 3) == e0);  // same epoch, same masks
  ds.set_epoch(1);
  EXPECT_EQ(ds.epoch(), 1);
  const Cells e1 = read_all_cells(ds, iota(ds.size()), 8);
  ASSERT_EQ(e0.size(), e1.size());
  int64_t differ = 0;
  for (const auto& [key, cell] : e0) {
    const bool c0 = cell.target != kPad, c1 = e1.at(key).target != kPad;
    differ += c0 != c1;
    const int64_t res = seqs->residues[key.first][key.second];
    EXPECT_EQ(e1.at(key).input, mask_draw(5, 1, key.first, key.second, res, MaskingOptions()).input);
  }
  EXPECT_TRUE(near_binomial(differ, static_cast<int64_t>(e0.size()), 0.255));
}

// ---- windows -------------------------------------------------------------------------------------

TEST(ProteinDataWindows, SequenceWindowsCoverEachResidueOnce) {
  for (int64_t len = 0; len <= 300; ++len)
    for (int64_t max : {1, 2, 3, 7, 64, 510}) {
      const auto w = sequence_windows(len, max);
      ASSERT_EQ(static_cast<int64_t>(w.size()), (len + max - 1) / max) << len << " " << max;
      int64_t next = 0, lo = len, hi = 0;
      for (const auto& [b, e] : w) {
        EXPECT_EQ(b, next);
        EXPECT_LE(e - b, max);
        EXPECT_GE(e - b, 1);
        lo = std::min(lo, e - b);
        hi = std::max(hi, e - b);
        next = e;
      }
      EXPECT_EQ(next, len);
      if (!w.empty()) { EXPECT_LE(hi - lo, 1) << len << " " << max; }
    }
  EXPECT_EQ(sequence_windows(1000, 510), (std::vector<std::pair<int64_t, int64_t>>{{0, 500}, {500, 1000}}));
  EXPECT_LINEA_ERROR(sequence_windows(5, 0), "max_residues");
}

TEST(ProteinDataWindows, EvalSplitsLongSequencesIntoFramedWindows) {
  const auto seqs = random_sequences(25, 1, 200, 4);
  const MaskedLMDataset ds(seqs, opts(false, 50));
  int64_t expected = 0;
  for (const auto& r : seqs->residues) expected += (static_cast<int64_t>(r.size()) + 47) / 48;
  ASSERT_EQ(ds.size(), expected);
  int64_t i = 0;
  for (int64_t s = 0; s < seqs->size(); ++s)
    for (const auto& [b, e] : sequence_windows(static_cast<int64_t>(seqs->residues[s].size()), 48)) {
      const Window w = ds.window(i);
      ASSERT_EQ(w.size(), 1u);
      EXPECT_EQ(w[0].seq, s);
      EXPECT_EQ(w[0].begin, b);
      EXPECT_EQ(w[0].end, e);
      EXPECT_TRUE(w[0].cls && w[0].eos);
      EXPECT_LE(ds.lengths()[i], 50);
      EXPECT_EQ(ds.lengths()[i++], e - b + 2);
    }
  EXPECT_LINEA_ERROR(ds.window(expected), "out of range");
  EXPECT_LINEA_ERROR(MaskedLMDataset(seqs, opts(false, 2)), "max_len");
}

TEST(ProteinDataWindows, TrainCropsStayWithinMaxLenAndMoveEveryEpoch) {
  const auto seqs = random_sequences(20, 10, 400, 5);
  MaskedLMDataset ds(seqs, opts(true, 64));
  ASSERT_EQ(ds.size(), seqs->size());
  const std::vector<int64_t> lengths = ds.lengths();
  std::map<int64_t, std::set<int64_t>> begins;  // per long sequence, over epochs
  for (int64_t epoch = 0; epoch < 12; ++epoch) {
    ds.set_epoch(epoch);
    EXPECT_EQ(ds.lengths(), lengths);
    Cells cells;
    read_batch(ds, iota(ds.size()), cells);  // layout, padding and targets of the whole epoch
    for (int64_t i = 0; i < ds.size(); ++i) {
      const int64_t len = static_cast<int64_t>(seqs->residues[i].size());
      const Window w = ds.window(i);
      ASSERT_EQ(w.size(), 1u);
      EXPECT_EQ(w[0].seq, i);
      EXPECT_TRUE(w[0].cls && w[0].eos);
      EXPECT_EQ(lengths[i], std::min<int64_t>(len + 2, 64));
      EXPECT_EQ(w[0].tokens(), lengths[i]);
      EXPECT_GE(w[0].begin, 0);
      EXPECT_LE(w[0].end, len);
      if (len <= 62) {
        EXPECT_EQ(w[0].begin, 0);
      } else {
        EXPECT_EQ(w[0].end - w[0].begin, 62);
        begins[i].insert(w[0].begin);
      }
    }
  }
  ASSERT_GT(begins.size(), 10u);
  for (const auto& [i, b] : begins) {
    const size_t offsets = seqs->residues[i].size() - 61;  // the crop's possible offsets
    EXPECT_GE(b.size(), std::min<size_t>(3, offsets)) << "sequence " << i << ": the crop hardly moves";
  }
  // The same epoch again: the same crops.
  ds.set_epoch(3);
  const Window w3 = ds.window(begins.begin()->first);
  ds.set_epoch(4);
  ds.set_epoch(3);
  EXPECT_EQ(ds.window(begins.begin()->first)[0].begin, w3[0].begin);
}

// Every offset a crop can take comes up: sequences one and two residues past the crop (max_len 64:
// crops of 62 residues at offsets 0..1 or 0..2), over 32 epochs.
TEST(ProteinDataWindows, TrainCropsTakeEveryOffset) {
  const auto seqs = random_sequences(6, 63, 64, 9);
  MaskedLMDataset ds(seqs, opts(true, 64));
  std::map<int64_t, std::set<int64_t>> begins;
  for (int64_t epoch = 0; epoch < 32; ++epoch) {
    ds.set_epoch(epoch);
    for (int64_t i = 0; i < ds.size(); ++i) begins[i].insert(ds.window(i)[0].begin);
  }
  for (const auto& [i, b] : begins) {
    const int64_t offsets = static_cast<int64_t>(seqs->residues[i].size()) - 62 + 1;
    EXPECT_EQ(static_cast<int64_t>(b.size()), offsets) << "sequence " << i;
    EXPECT_EQ(*b.rbegin(), offsets - 1) << "sequence " << i;
  }
}

// ---- packing -------------------------------------------------------------------------------------

// The unmasked stream <cls> s <eos> ... of `seqs` in `order`.
std::vector<int64_t> stream_of(const Sequences& seqs, const std::vector<int64_t>& order) {
  std::vector<int64_t> s;
  for (int64_t i : order) {
    s.push_back(kCls);
    s.insert(s.end(), seqs.residues[i].begin(), seqs.residues[i].end());
    s.push_back(kEos);
  }
  return s;
}

TEST(ProteinDataPacking, EvalStreamCoversEveryResidueOnceInFileOrder) {
  const auto seqs = random_sequences(30, 1, 150, 6);
  const int64_t L = 64;
  const MaskedLMDataset ds(seqs, opts(false, 0, L));
  const std::vector<int64_t> stream = stream_of(*seqs, iota(seqs->size()));
  const int64_t S = static_cast<int64_t>(stream.size());
  ASSERT_EQ(ds.size(), (S + L - 1) / L);
  for (int64_t i = 0; i + 1 < ds.size(); ++i) EXPECT_EQ(ds.lengths()[i], L);
  EXPECT_EQ(ds.lengths().back(), S - (ds.size() - 1) * L);
  Cells cells;
  std::vector<int64_t> plain;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const std::vector<int64_t> p = read_batch(ds, {i}, cells);
    plain.insert(plain.end(), p.begin(), p.end());
  }
  EXPECT_EQ(plain, stream);  // windows back to back rebuild the stream: separators in place
  EXPECT_EQ(static_cast<int64_t>(cells.size()), seqs->total_residues());
  // A piece has <cls> only at a sequence's start and <eos> only at its end.
  for (int64_t i = 0; i < ds.size(); ++i)
    for (const Piece& p : ds.window(i)) {
      const int64_t len = static_cast<int64_t>(seqs->residues[p.seq].size());
      if (p.cls) { EXPECT_EQ(p.begin, 0); }
      if (p.eos) { EXPECT_EQ(p.end, len); }
      EXPECT_GT(p.tokens(), 0);
    }
}

TEST(ProteinDataPacking, TrainWindowsAreFullAndMoveEveryEpoch) {
  const auto seqs = random_sequences(40, 1, 120, 7);
  const int64_t L = 50;
  MaskedLMDataset ds(seqs, opts(true, 0, L));
  const int64_t S = seqs->total_residues() + 2 * seqs->size();
  const int64_t count = ds.size();
  ASSERT_EQ(count, (S + 1) / L - 1);
  std::vector<int64_t> master;  // the stream's sequence order, as epoch 0 shows it
  std::set<std::tuple<int64_t, int64_t, bool>> starts;  // where each epoch's first window starts
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    ds.set_epoch(epoch);
    ASSERT_EQ(ds.size(), count);
    for (int64_t l : ds.lengths()) EXPECT_EQ(l, L);
    Cells cells;  // layout, masks and padding; no residue twice in an epoch
    const std::vector<int64_t> plain = read_batch(ds, iota(count), cells);
    EXPECT_EQ(static_cast<int64_t>(plain.size()), count * L);  // every window exactly L tokens
    // Consecutive pieces continue one another through the stream: the same sequence cut between
    // two windows, or the next sequence after an <eos>.
    std::vector<Window> windows;
    for (int64_t i = 0; i < count; ++i) windows.push_back(ds.window(i));
    std::vector<int64_t> order;
    const Piece* prev = nullptr;
    for (const Window& w : windows) {
      int64_t tokens = 0;
      for (const Piece& p : w) {
        tokens += p.tokens();
        if (p.cls) { EXPECT_EQ(p.begin, 0); }
        if (p.eos) { EXPECT_EQ(p.end, static_cast<int64_t>(seqs->residues[p.seq].size())); }
        if (prev != nullptr && prev->seq == p.seq) {
          EXPECT_EQ(prev->end, p.begin);
          EXPECT_FALSE(prev->eos || p.cls);
        } else {
          if (prev != nullptr) {
            EXPECT_TRUE(prev->eos && p.cls) << "epoch " << epoch << " sequence " << p.seq;
          }
          order.push_back(p.seq);
        }
        prev = &p;
      }
      EXPECT_EQ(tokens, L);
    }
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), order.size());
    EXPECT_GE(order.size(), 35u);  // at most 2L-2 tokens of the stream sit out
    // The same sequence order every epoch (only the cuts move).
    if (epoch == 0) master = order;
    for (size_t k = 0; k + 1 < order.size(); ++k) {
      const auto at = std::find(master.begin(), master.end(), order[k]);
      if (at != master.end() && at + 1 != master.end()) {
        EXPECT_EQ(*(at + 1), order[k + 1]) << "epoch " << epoch;
      }
    }
    starts.emplace(windows[0][0].seq, windows[0][0].begin, windows[0][0].cls);
  }
  std::vector<int64_t> sorted = master;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(master, sorted);     // training streams are shuffled (by seed)
  EXPECT_GE(starts.size(), 4u);  // the cuts move
  EXPECT_LINEA_ERROR(MaskedLMDataset(random_sequences(2, 10, 10, 1), opts(true, 0, 20)), "39", "24");
}

// The stream's first window starts at every offset 0..slack (the tokens the windows leave over)
// over enough epochs: windows of 5 tokens, where the slack is 4 to 8.
TEST(ProteinDataPacking, TrainWindowsStartAtEveryOffset) {
  const auto seqs = random_sequences(12, 1, 3, 3);
  const int64_t L = 5;
  MaskedLMDataset ds(seqs, opts(true, 0, L));
  const int64_t slack = seqs->total_residues() + 2 * seqs->size() - ds.size() * L;
  ASSERT_GE(slack, L - 1);
  std::set<std::tuple<int64_t, int64_t, bool>> starts;  // the first piece: where the window starts
  for (int64_t epoch = 0; epoch < 96; ++epoch) {
    ds.set_epoch(epoch);
    const Window w = ds.window(0);
    starts.emplace(w[0].seq, w[0].begin, w[0].cls);
  }
  EXPECT_EQ(static_cast<int64_t>(starts.size()), slack + 1);
}

// ---- batches -------------------------------------------------------------------------------------

TEST(ProteinDataBatch, PaddingTargetsAndExamples) {
  auto seqs = std::make_shared<Sequences>();
  for (const char* s : {"MKTAYIAKQR", "GA", "LLLLLVVVVVAAAAAGGGGG"}) {
    seqs->names.push_back(s);
    seqs->residues.push_back(encode_residues(s, s));
  }
  DatasetOptions o = opts(false, 64);
  o.masking.prob = 0.5;  // enough chosen positions in 32 residues
  const MaskedLMDataset ds(seqs, o);
  ASSERT_EQ(ds.lengths(), std::vector<int64_t>({12, 4, 22}));
  Cells cells;
  read_batch(ds, {1, 2, 0}, cells);
  const linea::nn::Batch b = ds.get_batch({1, 0});
  ASSERT_EQ(b.at("tokens").shape(), linea::Shape({2, 12}));
  const auto tok = b.at("tokens").to_vector<int64_t>(), tgt = b.at("targets").to_vector<int64_t>();
  // Row 0 is "GA": <cls> G A <eos> then 8 pads; row 1 "MKTAYIAKQR" framed, no padding.
  EXPECT_EQ(tok[0], kCls);
  EXPECT_EQ(tok[3], kEos);
  for (int k = 4; k < 12; ++k) EXPECT_EQ(tok[k], kPad);
  int64_t chosen = 0;
  for (int64_t s : {1, 0})
    for (size_t pos = 0; pos < seqs->residues[s].size(); ++pos) {
      const int64_t res = seqs->residues[s][pos];
      const int64_t col = (s == 1 ? 0 : 12) + 1 + static_cast<int64_t>(pos);
      const MaskDraw d = mask_draw(5, kEvalStream, s, static_cast<int64_t>(pos), res, o.masking);
      EXPECT_EQ(tok[col], d.input);
      EXPECT_EQ(tgt[col], d.chosen ? res : kPad);
      chosen += d.chosen;
    }
  EXPECT_GT(chosen, 0);
  EXPECT_LT(chosen, 12);
  EXPECT_EQ(tok[12], kCls);
  EXPECT_EQ(tok[23], kEos);
  // One example: the batch's entries without the batch dim and without padding.
  const linea::nn::Example e = ds.get(1);
  EXPECT_EQ(e.at("tokens").shape(), linea::Shape({4}));
  EXPECT_EQ(e.at("pad").to_vector<int64_t>(), std::vector<int64_t>({0, 0, 0, 0}));
  EXPECT_EQ(e.at("index").item<int64_t>(), 1);
  EXPECT_EQ(e.at("tokens").to_vector<int64_t>(), std::vector<int64_t>(tok.begin(), tok.begin() + 4));
  EXPECT_LINEA_ERROR(ds.get_batch({3}), "out of range");
  DatasetOptions bad = o;
  bad.masking.mask_token = 0.95;
  EXPECT_LINEA_ERROR(MaskedLMDataset(seqs, bad), "mask_token");
}

// Settings a dataset cannot run with, and indices and epochs outside its range, are named.
TEST(ProteinDataBatch, BadSettingsIndicesAndEpochsAreNamed) {
  const auto seqs = random_sequences(3, 5, 9, 1);
  const std::string masking = "MaskedLMDataset: masking probabilities must be in [0, 1] with mask_token + random_token";
  for (const auto& edit : std::vector<std::function<void(MaskingOptions&)>>{
           [](MaskingOptions& m) { m.prob = -0.1; }, [](MaskingOptions& m) { m.prob = 1.5; },
           [](MaskingOptions& m) { m.mask_token = -0.1; }, [](MaskingOptions& m) { m.random_token = -0.1; }}) {
    DatasetOptions o = opts(true, 16);
    edit(o.masking);
    EXPECT_LINEA_ERROR(MaskedLMDataset(seqs, o), masking);
  }
  EXPECT_LINEA_ERROR(MaskedLMDataset(nullptr, opts(true, 16)), "MaskedLMDataset: the sequences are null");
  EXPECT_LINEA_ERROR(MaskedLMDataset(seqs, opts(true, 16, -1)), "MaskedLMDataset: pack must be >= 0, got -1");
  EXPECT_LINEA_ERROR(MaskedLMDataset(seqs, opts(true, 16, 2)), "MaskedLMDataset: pack must be >= 3 tokens, got 2");
  EXPECT_LINEA_ERROR(sequence_windows(-1, 5), "protein sequence_windows: negative length -1");
  MaskedLMDataset ds(seqs, opts(true, 16));
  EXPECT_LINEA_ERROR(ds.get_batch({-1}), "MaskedLMDataset: index -1 out of range [0, 3)");
  ds.set_epoch(-1);
  EXPECT_LINEA_ERROR(ds.get_batch({0}), "MaskedLMDataset: epoch must be >= 0, got -1");
}

// Packed training windows: as many as fit whatever the offset, (S + 1) / L - 1 for a stream of S
// tokens; at S = kL - 1 that is k - 1, every one full at every offset.
TEST(ProteinDataPacking, TrainWindowCountAtTheEdge) {
  auto seqs = std::make_shared<Sequences>();
  for (int64_t len : {12, 13}) {  // 14 + 15 = 29 tokens framed
    seqs->residues.push_back(std::vector<int8_t>(static_cast<size_t>(len), static_cast<int8_t>(kFirstResidue)));
    seqs->names.push_back("s" + std::to_string(len));
  }
  MaskedLMDataset ds(seqs, opts(true, 0, 10));
  ASSERT_EQ(ds.size(), 2);
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    ds.set_epoch(epoch);
    for (int64_t i = 0; i < 2; ++i) {
      int64_t tokens = 0;
      for (const Piece& p : ds.window(i)) tokens += p.tokens();
      EXPECT_EQ(tokens, 10) << "epoch " << epoch << " window " << i;
    }
  }
}

// A manifest without its training file, a split data.json lacks or gives another type, and an
// unknown split are named.
TEST(ProteinDataManifest, MissingAndMistypedFilesAreNamed) {
  TempDir dir;
  const std::string d = dir.path.string();
  write_all(d + "/data.json", std::string(R"({"format": ")") + kDataFormat + R"(", "files": {}})");
  EXPECT_LINEA_ERROR(read_manifest(d),
                     "protein: cannot read '" + d + "/data.json': ", "; run `protein prepare --out " + d + "` again");
  write_all(d + "/data.json", R"({"format": 7, "files": {"train": "train.fa"}})");
  EXPECT_LINEA_ERROR(read_manifest(d), "protein: cannot read '" + d + "/data.json': ");
  Manifest m;
  m.dir = d;
  m.json = {{"files", {{"train", "train.fa"}, {"valid", 5}}}};
  EXPECT_EQ(split_path(m, "train"), d + "/train.fa");
  EXPECT_EQ(split_path(m, "query"), "");  // optional
  EXPECT_LINEA_ERROR(split_path(m, "test"), "protein: '" + d + "/data.json' lists no test file");
  EXPECT_LINEA_ERROR(split_path(m, "valid"), "protein: cannot read the valid file of '" + d + "/data.json': ");
  EXPECT_LINEA_ERROR(split_path(m, "dev"), "protein: no split 'dev' (train, valid, test, query)");
  m.json = {{"files", json::array()}};
  EXPECT_EQ(split_path(m, "query"), "");
  EXPECT_LINEA_ERROR(split_path(m, "train"), "lists no train file");
}

// ---- prepare -------------------------------------------------------------------------------------

const char* kStandard = "LAGVSERTIDPKQNFYMHWC";

// `families` families of mutated copies of a random ancestor (60..200 residues, 1..6 members with
// 8% substitutions each, so members share ~85% identity), records shuffled. mmseqs at 50% identity
// puts each family in one cluster; unrelated random sequences share ~6% and stay apart. Returns
// each record's family by id.
std::map<std::string, int> write_families(const std::string& path, int families, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::pair<std::string, std::string>> records;  // header, sequence
  std::map<std::string, int> family_of;
  for (int f = 0; f < families; ++f) {
    std::string ancestor(60 + rng() % 141, 'A');
    for (char& c : ancestor) c = kStandard[rng() % 20];
    const int members = 1 + static_cast<int>(rng() % 6);
    for (int m = 0; m < members; ++m) {
      std::string s = ancestor;
      for (char& c : s)
        if (rng() % 100 < 8) c = kStandard[rng() % 20];
      if (m == 1) s[s.size() / 2] = 'X';
      const std::string id = "fam" + std::to_string(f) + "_" + std::to_string(m);
      records.push_back({id + " family " + std::to_string(f) + " member " + std::to_string(m), s});
      family_of[id] = f;
    }
  }
  std::shuffle(records.begin(), records.end(), rng);
  std::string text;
  for (const auto& [h, s] : records) text += ">" + h + "\n" + s.substr(0, 50) + "\n" + s.substr(50) + "\n\n";
  write_all(path, text);
  return family_of;
}

struct Fasta {
  std::vector<std::string> headers, sequences;
};
Fasta read_fasta_lines(const std::string& path) {
  Fasta f;
  std::istringstream in(read_all(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '>')
      f.headers.push_back(line.substr(1));
    else
      f.sequences.push_back(line);
  }
  return f;
}
std::string id_of(const std::string& header) { return header.substr(0, header.find(' ')); }

std::map<std::string, std::string> read_clusters(const std::string& path) {  // member -> representative
  std::map<std::string, std::string> rep;
  std::istringstream in(read_all(path));
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    rep[line.substr(tab + 1)] = line.substr(0, tab);
  }
  return rep;
}

// The generated input, written once per process, and its cluster split, prepared once on first
// use (each mmseqs run takes seconds, mostly three prefilter index builds).
class ProteinDataPrepare : public ::testing::Test {
 protected:
  struct Input {
    TempDir dir;  // in.fasta, query.fa, and the shared prepared folder "base"
    std::map<std::string, int> family_of;
  };
  static const Input& input() {
    if (!input_) {
      input_ = std::make_unique<Input>();
      input_->family_of = write_families(input_->dir.file("in.fasta"), 45, 17);
      write_all(input_->dir.file("query.fa"), ">q1 first query\nMKTAYIAKQRQISFVKSHFSRQ\n>q2\nGAVLI\n");
    }
    return *input_;
  }
  // Options on the generated input, writing `dir`/`out`.
  static PrepareOptions options(const TempDir& dir, const std::string& out) {
    PrepareOptions o;
    o.fasta = input().dir.file("in.fasta");
    o.query = input().dir.file("query.fa");
    o.out = dir.file(out);
    o.valid_size = 15;
    o.test_size = 15;
    o.threads = 1;
    return o;
  }
  static const PrepareResult& base() {
    if (!base_) {
      std::ostringstream log;
      base_ = std::make_unique<PrepareResult>(prepare(options(input().dir, "base"), &log));
      base_log_ = log.str();
    }
    return *base_;
  }
  static void TearDownTestSuite() {
    base_.reset();
    input_.reset();
  }
  static std::unique_ptr<Input> input_;
  static std::unique_ptr<PrepareResult> base_;
  static std::string base_log_;
};
std::unique_ptr<ProteinDataPrepare::Input> ProteinDataPrepare::input_;
std::unique_ptr<PrepareResult> ProteinDataPrepare::base_;
std::string ProteinDataPrepare::base_log_;

TEST_F(ProteinDataPrepare, ClusterSplitKeepsClustersWhole) {
  const PrepareResult& r = base();
  const PrepareOptions o = options(input().dir, "base");
  const std::map<std::string, int>& family_of = input().family_of;
  const int64_t n = static_cast<int64_t>(family_of.size());
  EXPECT_EQ(r.out, o.out);
  EXPECT_EQ(r.train + r.valid + r.test, n);
  EXPECT_EQ(r.query, 2);
  for (const char* f : {"train.fasta", "valid.fasta", "test.fasta", "query.fasta", "clusters.tsv", "data.json"})
    EXPECT_TRUE(fs::is_regular_file(fs::path(o.out) / f)) << f;
  EXPECT_EQ(std::distance(fs::directory_iterator(o.out), fs::directory_iterator()), 6);
  // No temporary folders left beside it: just the inputs and the folder.
  std::set<std::string> beside;
  for (const auto& entry : fs::directory_iterator(input().dir.path)) beside.insert(entry.path().filename().string());
  EXPECT_EQ(beside, std::set<std::string>({"base", "in.fasta", "query.fa"}));

  // mmseqs found the families: every cluster inside one family, one cluster per family.
  const std::map<std::string, std::string> rep = read_clusters(o.out + "/clusters.tsv");
  ASSERT_EQ(static_cast<int64_t>(rep.size()), n);
  std::map<std::string, int64_t> cluster_size;
  for (const auto& [member, r0] : rep) {
    EXPECT_EQ(family_of.at(member), family_of.at(r0)) << member << " with " << r0;
    EXPECT_EQ(rep.at(r0), r0);
    ++cluster_size[r0];
  }
  EXPECT_EQ(static_cast<int64_t>(cluster_size.size()), 45);
  json d = json::parse(read_all(o.out + "/data.json"));
  EXPECT_EQ(d, r.data);
  EXPECT_EQ(d["format"], "linea-protein-data/1");
  EXPECT_EQ(d["clusters"]["count"], cluster_size.size());
  int64_t largest = 0, singletons = 0;
  for (const auto& [r0, size] : cluster_size) {
    largest = std::max(largest, size);
    singletons += size == 1;
  }
  EXPECT_EQ(d["clusters"]["largest"], largest);
  EXPECT_EQ(d["clusters"]["singletons"], singletons);
  EXPECT_GT(largest, 1);
  EXPECT_NE(d["mmseqs"]["command"].get<std::string>().find("easy-cluster input.fasta clu tmp --min-seq-id 0.5 -c 0.8 "
                                                           "--threads 1"),
            std::string::npos);
  EXPECT_FALSE(d["mmseqs"]["version"].get<std::string>().empty());

  // Splits: whole clusters; test then valid filled to at least their sizes; counts add up;
  // records in input order.
  std::map<std::string, size_t> input_index;
  for (const std::string& h : read_fasta_lines(o.fasta).headers) {
    const size_t k = input_index.size();
    input_index[id_of(h)] = k;
  }
  std::map<std::string, std::string> split_of;
  std::map<std::string, std::set<std::string>> split_clusters;
  int64_t residues = 0;
  for (const char* s : {"train", "valid", "test"}) {
    const Fasta f = read_fasta_lines(o.out + "/" + s + ".fasta");
    const json& st = d["splits"][s];
    EXPECT_EQ(st["sequences"], f.headers.size()) << s;
    int64_t res = 0, longest = 0;
    for (size_t k = 0; k < f.headers.size(); ++k) {
      const std::string id = id_of(f.headers[k]);
      if (k > 0) { EXPECT_LT(input_index.at(id_of(f.headers[k - 1])), input_index.at(id)) << s; }
      split_of[id] = s;
      split_clusters[s].insert(rep.at(id));
      res += static_cast<int64_t>(f.sequences[k].size());
      longest = std::max<int64_t>(longest, f.sequences[k].size());
      const std::string member = id.substr(id.find('_') + 1);  // headers as written, description too
      EXPECT_EQ(f.headers[k], id + " family " + std::to_string(family_of.at(id)) + " member " + member);
    }
    EXPECT_EQ(st["residues"], res);
    EXPECT_EQ(st["clusters"], split_clusters[s].size());
    EXPECT_EQ(st["length"]["max"], longest);
    residues += res;
    if (std::string(s) != "train") {
      EXPECT_EQ(st["with_cluster_mate_in_train"], 0);
      EXPECT_GE(st["sequences"].get<int64_t>(), 15);
      EXPECT_LT(st["sequences"].get<int64_t>(), 15 + largest);
    }
    // Read back as the dataset does, in the file's order.
    const Sequences seqs = read_sequences(split_path(read_manifest(o.out), s));
    ASSERT_EQ(seqs.size(), static_cast<int64_t>(f.headers.size()));
    for (int64_t k = 0; k < seqs.size(); ++k) {
      EXPECT_EQ(seqs.names[k], id_of(f.headers[k]));
      EXPECT_EQ(decode(std::vector<int64_t>(seqs.residues[k].begin(), seqs.residues[k].end())), f.sequences[k]);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(split_of.size()), n);
  for (const auto& [member, r0] : rep) EXPECT_EQ(split_of.at(member), split_of.at(r0)) << "cluster " << r0 << " split";
  EXPECT_EQ(d["inputs"]["sequences"], n);
  EXPECT_EQ(d["inputs"]["residues"], residues);
  int64_t counted = 0;
  for (const auto& [c, k] : d["residue_counts"].items()) {
    EXPECT_EQ(c.size(), 1u);
    EXPECT_GE(residue_id(c[0]), kFirstResidue);
    counted += k.get<int64_t>();
  }
  EXPECT_EQ(d["residue_counts"].size(), 27u);
  EXPECT_EQ(counted, d["splits"]["train"]["residues"].get<int64_t>());
  EXPECT_GT(d["residue_counts"]["X"].get<int64_t>(), 0);
  EXPECT_EQ(d["residue_counts"]["B"], 0);
  EXPECT_EQ(d["splits"]["query"]["sequences"], 2);
  EXPECT_EQ(read_all(o.out + "/query.fasta"), ">q1 first query\nMKTAYIAKQRQISFVKSHFSRQ\n>q2\nGAVLI\n");
  EXPECT_EQ(split_path(read_manifest(o.out), "query"), o.out + "/query.fasta");
  const std::string text = describe(r);
  EXPECT_NE(text.find(std::to_string(r.train) + " sequences"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(cluster_size.size()) + " clusters"), std::string::npos) << text;
  EXPECT_NE(base_log_.find("clustering 1"), std::string::npos) << base_log_;
}

TEST_F(ProteinDataPrepare, SameSeedSameBytesOtherSeedOtherSplit) {
  const std::string a = base().out;
  TempDir dir;
  const PrepareOptions b = options(dir, "b");
  prepare(b);
  for (const auto& entry : fs::directory_iterator(a)) {
    const std::string name = entry.path().filename().string();
    std::string x = read_all(entry.path().string()), y = read_all(b.out + "/" + name);
    if (name == "data.json") {  // identical but for the time taken
      json jx = json::parse(x), jy = json::parse(y);
      EXPECT_TRUE(jx.contains("seconds"));
      jx.erase("seconds");
      jy.erase("seconds");
      x = jx.dump();
      y = jy.dump();
    }
    EXPECT_EQ(x, y) << name << " differs between two runs";
  }
  // Another seed, no query, no test set, into a folder that holds prepared data: replaced.
  PrepareOptions c = options(dir, "c");
  fs::copy(a, c.out, fs::copy_options::recursive);
  c.seed = 1;
  c.query = "";
  c.test_size = 0;
  const PrepareResult r = prepare(c);
  EXPECT_EQ(r.test, 0);
  EXPECT_EQ(r.data.at("split").at("seed"), 1);
  EXPECT_EQ(read_all(a + "/clusters.tsv"), read_all(c.out + "/clusters.tsv"));
  EXPECT_NE(read_all(a + "/valid.fasta"), read_all(c.out + "/valid.fasta"));
  EXPECT_FALSE(fs::exists(c.out + "/query.fasta"));
  EXPECT_EQ(split_path(read_manifest(c.out), "query"), "");
  EXPECT_EQ(read_all(c.out + "/test.fasta"), "");
  EXPECT_EQ(read_sequences(c.out + "/test.fasta").size(), 0);
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path)) left.insert(entry.path().filename().string());
  EXPECT_EQ(left, std::set<std::string>({"b", "c"}));  // the old folder is gone too
}

TEST_F(ProteinDataPrepare, RandomSplitCountsWhatItLeaks) {
  TempDir dir;
  PrepareOptions o = options(dir, "random");
  o.split = "random";
  o.valid_size = 20;
  o.test_size = 25;
  const PrepareResult r = prepare(o);
  EXPECT_EQ(r.valid, 20);
  EXPECT_EQ(r.test, 25);
  const std::map<std::string, std::string> rep = read_clusters(o.out + "/clusters.tsv");
  std::set<std::string> train_clusters;
  for (const std::string& h : read_fasta_lines(o.out + "/train.fasta").headers) train_clusters.insert(rep.at(id_of(h)));
  int64_t total_leak = 0;
  for (const char* s : {"valid", "test"}) {
    int64_t leak = 0;
    for (const std::string& h : read_fasta_lines(o.out + "/" + s + ".fasta").headers)
      leak += train_clusters.count(rep.at(id_of(h)));
    EXPECT_EQ(r.data.at("splits").at(s).at("with_cluster_mate_in_train"), leak) << s;
    total_leak += leak;
  }
  // Each split in the input's order, as the cluster split's are.
  std::map<std::string, size_t> input_index;
  for (const std::string& h : read_fasta_lines(o.fasta).headers) input_index.emplace(id_of(h), input_index.size());
  for (const char* s : {"train", "valid", "test"}) {
    const std::vector<std::string> headers = read_fasta_lines(o.out + "/" + s + ".fasta").headers;
    for (size_t k = 1; k < headers.size(); ++k)
      EXPECT_LT(input_index.at(id_of(headers[k - 1])), input_index.at(id_of(headers[k]))) << s;
  }
  // Families of up to 6: most held-out sequences have a relative in train.
  EXPECT_GT(total_leak, 20);
  EXPECT_EQ(r.data.at("split").at("method"), "random");
}

TEST_F(ProteinDataPrepare, BadInputsNameTheProblem) {
  TempDir dir;
  PrepareOptions o = options(dir, "out");
  const auto with_fasta = [&](const std::string& name, const std::string& text) {
    write_all(dir.file(name), text);
    PrepareOptions p = o;
    p.fasta = dir.file(name);
    return p;
  };
  EXPECT_LINEA_ERROR(prepare(with_fasta("star.fa", ">a\nMKV\n>b x\nMK*V\n")), "star.fa", "record 2 'b'", "'*'",
                     "position 3");
  EXPECT_LINEA_ERROR(prepare(with_fasta("lower.fa", ">a\nMKV\n>b\nMKV\n>c\nmkv\n")), "lower.fa", "record 3 'c'", "'m'",
                     "position 1");
  EXPECT_LINEA_ERROR(prepare(with_fasta("empty.fa", ">a\nMKV\n>gone\n>c\nMKV\n")), "empty.fa", "record 2 'gone'",
                     "empty");
  EXPECT_LINEA_ERROR(prepare(with_fasta("dup.fa", ">a\nMKV\n>a\nMKVL\n")), "dup.fa", "record 2 'a'", "unique");
  PrepareOptions p = o;
  p.fasta = dir.file("missing.fa");
  EXPECT_LINEA_ERROR(prepare(p), "missing.fa", "does not exist");
  p = o;
  p.query = dir.file("noquery.fa");
  EXPECT_LINEA_ERROR(prepare(p), "noquery.fa");
  p = o;
  p.valid_size = static_cast<int64_t>(input().family_of.size()) / 2;
  p.test_size = static_cast<int64_t>(input().family_of.size()) - p.valid_size;
  EXPECT_LINEA_ERROR(prepare(p), "--valid-size " + std::to_string(p.valid_size), "leaves no training sequences");
  p = o;
  p.mmseqs = "linea-no-such-mmseqs";
  EXPECT_LINEA_ERROR(prepare(p), "linea-no-such-mmseqs", "apt-get install mmseqs2");
  // An mmseqs that fails: the error shows the end of its output.
  write_all(dir.file("fake-mmseqs"), "#!/bin/sh\nif [ \"$1\" = version ]; then echo 9.9; exit 0; fi\n"
                                       "echo 'step 1 fine'; echo 'Error: out of cheese' >&2; exit 3\n");
  ::chmod(dir.file("fake-mmseqs").c_str(), 0755);
  p = o;
  p.mmseqs = dir.file("fake-mmseqs");
  EXPECT_LINEA_ERROR(prepare(p), "easy-cluster", "exit status 3", "out of cheese");
  // Of a long output, the last 15 lines; exit status 127 (the shell's "not found") says how to install.
  write_all(dir.file("fake-mmseqs"),
            "#!/bin/sh\nif [ \"$1\" = version ]; then echo 9.9; exit 0; fi\n"
            "for i in $(seq 1 20); do echo \"out $i.\"; done; exit 3\n");
  const std::string tail = error_of([&] { prepare(p); });
  EXPECT_NE(tail.find("| out 20."), std::string::npos) << tail;
  EXPECT_NE(tail.find("| out 6."), std::string::npos) << tail;
  EXPECT_EQ(tail.find("| out 5."), std::string::npos) << tail;
  write_all(dir.file("fake-mmseqs"), "#!/bin/sh\nif [ \"$1\" = version ]; then echo 9.9; exit 0; fi\nexit 127\n");
  EXPECT_LINEA_ERROR(prepare(p), "cannot run", "exit status 127", "apt-get install mmseqs2");
  // An mmseqs whose cluster table (copied from clu.tsv here; the input's n records are 0..n-1)
  // is malformed: each fault is named. A good one with --threads 0 leaves the flag out.
  write_all(dir.file("fake-mmseqs"),
            "#!/bin/sh\nif [ \"$1\" = version ]; then echo 9.9; exit 0; fi\n"
            "cp '" +
                dir.file("clu.tsv") + "' \"$3_cluster.tsv\"\n");
  const int64_t n = static_cast<int64_t>(input().family_of.size());
  // Every sequence its own representative but those in `rep` (member -> representative), less
  // `skip`, plus `extra` lines.
  const auto with_table = [&](std::map<int64_t, int64_t> rep, const std::string& extra, int64_t skip = -1) {
    std::string tsv;
    for (int64_t i = 0; i < n; ++i)
      if (i != skip) tsv += std::to_string(rep.count(i) ? rep[i] : i) + "\t" + std::to_string(i) + "\n";
    write_all(dir.file("clu.tsv"), tsv + extra);
    return error_of([&] { prepare(p); });
  };
  EXPECT_NE(with_table({}, std::to_string(n) + "\t0\n").find("unexpected id '" + std::to_string(n) + "'"),
            std::string::npos);
  EXPECT_NE(with_table({}, "0 1\n").find("expected 'representative<TAB>member'"), std::string::npos);
  EXPECT_NE(with_table({}, "0\t1\n").find("lists sequence 1 twice"), std::string::npos);
  EXPECT_NE(with_table({}, "", 5).find("does not list sequence 5 of " + std::to_string(n)), std::string::npos);
  EXPECT_NE(with_table({{0, 1}, {1, 2}}, "").find("representative 1 is itself in another cluster"), std::string::npos);
  p.threads = 0;
  EXPECT_EQ(with_table({{0, 1}}, ""), "(no error)");  // sequences 0 and 1 one cluster, the rest alone
  const json d = json::parse(read_all(p.out + "/data.json"));
  EXPECT_EQ(d["mmseqs"]["command"].get<std::string>().find("--threads"), std::string::npos);
  EXPECT_EQ(d["clusters"]["count"], n - 1);
  fs::remove_all(p.out);
  // One cluster of everything: the test split's first cluster takes all.
  std::map<int64_t, int64_t> all_one;
  for (int64_t i = 0; i < n; ++i) all_one[i] = 0;
  p.valid_size = 0;
  p.test_size = 1;
  EXPECT_NE(with_table(all_one, "").find("took all " + std::to_string(n) + " sequences"), std::string::npos);
  // Sequences repeated under other ids, and queries that repeat them: each held-out or query
  // sequence whose residues a training sequence has is counted (train has at least one of the
  // five, and the queries are all five).
  const std::vector<std::string> five = {"MKVLA", "GAVLIW", "PPRRK", "MKVLAA", "WYYHHE"};
  std::string fa, queries, table;
  for (int i = 0; i < 10; ++i) {
    fa += ">s" + std::to_string(i) + "\n" + five[i % 5] + "\n";
    table += std::to_string(i) + "\t" + std::to_string(i) + "\n";
  }
  for (int i = 0; i < 5; ++i) queries += ">q" + std::to_string(i) + "\n" + five[i] + "\n";
  write_all(dir.file("twins.fa"), fa);
  write_all(dir.file("queries.fa"), queries);
  write_all(dir.file("clu.tsv"), table);
  p.fasta = dir.file("twins.fa");
  p.query = dir.file("queries.fa");
  p.split = "random";
  p.valid_size = p.test_size = 3;
  const PrepareResult twins = prepare(p);
  std::set<std::string> train_seqs;
  for (const std::string& seq : read_fasta_lines(p.out + "/train.fasta").sequences) train_seqs.insert(seq);
  int64_t held_out_twins = 0;
  for (const char* split : {"valid", "test", "query"}) {
    int64_t identical = 0;
    for (const std::string& seq : read_fasta_lines(p.out + "/" + split + ".fasta").sequences)
      identical += train_seqs.count(seq);
    EXPECT_EQ(twins.data["splits"][split]["identical_in_train"], identical) << split;
    if (std::string(split) != "query")
      held_out_twins += identical;
    else
      EXPECT_GE(identical, 1);
  }
  EXPECT_GE(held_out_twins, 2);
  // Of ten singleton clusters, the cluster split takes exactly the sizes asked for.
  p.split = "cluster";
  const PrepareResult singletons = prepare(p);
  EXPECT_EQ(singletons.test, 3);
  EXPECT_EQ(singletons.valid, 3);
  fs::remove_all(p.out);
  // Flags out of their ranges, before anything is read.
  for (const auto& [bad, what] : std::vector<std::pair<std::function<void(PrepareOptions&)>, std::string>>{
           {[](PrepareOptions& q) { q.split = "books"; }, "--split must be cluster or random, got 'books'"},
           {[](PrepareOptions& q) { q.valid_size = -1; }, "--valid-size and --test-size must be >= 0"},
           {[](PrepareOptions& q) { q.test_size = -1; }, "--valid-size and --test-size must be >= 0"},
           {[](PrepareOptions& q) { q.min_seq_id = 1.5; }, "--min-seq-id and --coverage must be in [0, 1]"},
           {[](PrepareOptions& q) { q.min_seq_id = -0.5; }, "--min-seq-id and --coverage must be in [0, 1]"},
           {[](PrepareOptions& q) { q.coverage = 1.5; }, "--min-seq-id and --coverage must be in [0, 1]"},
           {[](PrepareOptions& q) { q.threads = -1; }, "--threads must be >= 0"},
           {[](PrepareOptions& q) { q.mmseqs = ""; }, "--mmseqs is empty"}}) {
    PrepareOptions q = o;
    bad(q);
    EXPECT_NE(error_of([&] { prepare(q); }).find(what), std::string::npos) << what;
  }
  // Nothing was left behind by the failures.
  EXPECT_FALSE(fs::exists(o.out));
  for (const auto& entry : fs::directory_iterator(dir.path))
    EXPECT_EQ(entry.path().filename().string().find("out."), std::string::npos) << entry.path();
  // A folder that is not prepared data is never replaced.
  fs::create_directories(o.out);
  write_all(o.out + "/precious.txt", "x");
  EXPECT_LINEA_ERROR(prepare(o), "refusing to replace");
  EXPECT_TRUE(fs::exists(o.out + "/precious.txt"));
  EXPECT_LINEA_ERROR(read_manifest(o.out), "protein prepare");
  EXPECT_LINEA_ERROR(read_manifest(dir.file("nowhere")), "nowhere", "protein prepare");
  write_all(o.out + "/data.json", R"({"format": "linea-translate-data"})");
  EXPECT_LINEA_ERROR(read_manifest(o.out), "linea-translate-data", "protein prepare");
  EXPECT_LINEA_ERROR(read_sequences(dir.file("star.fa")), "star.fa", "record 2 'b'", "position 3");
}

}  // namespace
