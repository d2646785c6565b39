// Fuzz target: the apps' readers of their own files, which users can hand-edit or truncate:
//   0  translate: a prepared folder (apps/translate/dataset.h read_manifest, read_split)
//   1  protein: a prepared folder (apps/protein/dataset.h read_manifest, split_path, read_sequences)
//   2  metrics.jsonl (apps/common/metrics.h MetricsLog::read, and the trimming of a resume)
//   3  a checkpoint's config.json (apps/common/train_loop.h read_checkpoint_config, read_json_file)
// Input layout (FuzzedDataProvider): byte 0 picks the reader (mod 4); then
//   0  data.json, train.src, train.tgt, train.ref (each ConsumeRandomLengthString: up to a "\"
//      and another byte, "\\" stands for "\"), the split name from the last byte
//   1  data.json, then train.fasta (the rest)
//   2  the resume step (-1 .. 254) from the last byte, then metrics.jsonl (the rest)
//   3  config.json (the rest)
// Every problem with these files must be a linea::Error (not a JSON library exception).
#include <fuzzer/FuzzedDataProvider.h>

#include "apps/common/metrics.h"
#include "apps/common/train_loop.h"
#include "apps/protein/alphabet.h"
#include "apps/protein/dataset.h"
#include "apps/translate/dataset.h"
#include "fuzz_util.h"

using namespace linea;

namespace {

void translate_folder(FuzzedDataProvider& in) {
  const fuzz::fs::path dir = fuzz::fresh_dir("translate");
  fuzz::write_file(dir / "data.json", in.ConsumeRandomLengthString());
  for (const char* name : {"train.src", "train.tgt", "train.ref"})
    fuzz::write_file(dir / name, in.ConsumeRandomLengthString());
  const char* splits[] = {"train", "valid", "test"};
  const std::string split = splits[in.ConsumeIntegralInRange<int>(0, 2)];
  fuzz::expect_ok_or_error([&] { translate::read_manifest(dir.string()); });
  fuzz::expect_ok_or_error([&] {
    const translate::ParallelSplit s = translate::read_split(dir.string(), split);
    LINEA_FUZZ_ASSERT(s.src.size() == s.tgt.size() && s.src.size() == s.refs.size(), "read_split: ", s.src.size(),
                      " / ", s.tgt.size(), " / ", s.refs.size(), " lines");
  });
}

void protein_folder(FuzzedDataProvider& in) {
  const fuzz::fs::path dir = fuzz::fresh_dir("protein");
  fuzz::write_file(dir / "data.json", in.ConsumeRandomLengthString());
  fuzz::write_file(dir / "train.fasta", in.ConsumeRemainingBytesAsString());
  protein::Manifest m;
  if (!fuzz::expect_ok_or_error([&] { m = protein::read_manifest(dir.string()); })) return;
  for (const char* split : {"train", "valid", "test", "query"}) {
    std::string path;
    if (!fuzz::expect_ok_or_error([&] { path = protein::split_path(m, split); }) || path.empty()) continue;
    fuzz::expect_ok_or_error([&] {
      const protein::Sequences s = protein::read_sequences(path);
      for (const std::vector<int8_t>& r : s.residues)
        for (int8_t id : r) LINEA_FUZZ_ASSERT(protein::is_residue(id), "read_sequences: id ", int(id));
    });
  }
}

void metrics_log(FuzzedDataProvider& in) {
  const int64_t resume_step = static_cast<int64_t>(in.ConsumeIntegral<uint8_t>()) - 1;
  const fuzz::fs::path path = fuzz::fresh_dir("metrics") / "metrics.jsonl";
  fuzz::write_file(path, in.ConsumeRemainingBytesAsString());
  std::vector<nlohmann::json> before;
  fuzz::expect_ok_or_error([&] { before = apps::MetricsLog::read(path); });
  for (const nlohmann::json& r : before) LINEA_FUZZ_ASSERT(r.is_object(), "MetricsLog::read: a non-object record");
  fuzz::expect_ok_or_error([&] {
    {
      apps::MetricsLog log(path, resume_step);
      log.write({{"step", resume_step + 1}, {"type", "step"}});
    }
    // After the trim, only records up to resume_step remain, then the one just written.
    const std::vector<nlohmann::json> after = apps::MetricsLog::read(path);
    LINEA_FUZZ_ASSERT(!after.empty() && after.back().at("step") == resume_step + 1, "MetricsLog lost the new record");
    for (size_t i = 0; i + 1 < after.size(); ++i) {
      auto it = after[i].find("step");
      LINEA_FUZZ_ASSERT(resume_step >= 0 && (it == after[i].end() || !it->is_number() ||
                                             it->get<double>() <= static_cast<double>(resume_step)),
                        "MetricsLog(resume_step ", resume_step, ") kept ", after[i].dump());
    }
  });
}

void checkpoint_config(FuzzedDataProvider& in) {
  const fuzz::fs::path dir = fuzz::fresh_dir("config");
  fuzz::write_file(dir / "config.json", in.ConsumeRemainingBytesAsString());
  fuzz::expect_ok_or_error([&] { apps::read_json_file((dir / "config.json").string(), "fuzz"); });
  fuzz::expect_ok_or_error([&] {
    const nlohmann::json j = apps::read_checkpoint_config(dir.string(), "fuzz", "fuzz-checkpoint/1");
    LINEA_FUZZ_ASSERT(j.is_object() && j.at("format") == "fuzz-checkpoint/1", "read_checkpoint_config accepted ",
                      j.dump());
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Iteration iteration;
  if (size < 1) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      translate_folder(in);
      break;
    case 1:
      protein_folder(in);
      break;
    case 2:
      metrics_log(in);
      break;
    default:
      checkpoint_config(in);
  }
  return 0;
}
