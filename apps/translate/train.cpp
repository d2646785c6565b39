// The translate app's training run (see train.h): what is about text lives here (data, the
// token-level loss, BLEU evaluation); the loop is apps/common/train_loop.
#include "train.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/common/app_run.h"
#include "apps/common/device.h"
#include "apps/common/prepared_data.h"
#include "apps/common/progress.h"
#include "apps/common/train_loop.h"
#include "apps/tools/bleu.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/random.h"
#include "core/runtime.h"
#include "dataset.h"
#include "nn/checkpoint.h"
#include "nn/io_util.h"
#include "nn/optim.h"
#include "translator.h"

using namespace linea;
using json = nlohmann::json;
namespace fs = std::filesystem;
namespace bleu = linea::apps::bleu;

namespace translate {

namespace {

std::string fmt(const char* f, double v) { return apps::format_number(f, v); }

// Teacher-forced cross-entropy (no smoothing) of a split, in nats per target token.
double split_loss(Seq2Seq& model, const TranslationDataset& data, int64_t max_tokens, Device device) {
  nn::TokenBudgetBatchSampler sampler(data.lengths(), {max_tokens, 0, /*shuffle=*/false, 0});
  double nll = 0;
  int64_t tokens = 0;
  const int64_t pad = model.config().pad_id;
  for (const auto& idx : sampler.batches(0)) {
    nn::Batch b = data.get_batch(idx);
    Tensor tgt_out = b.at("tgt_out").to(device);
    Tensor logits = model.forward(b.at("src").to(device), b.at("src_pad").to(device), b.at("tgt_in").to(device));
    nll += cross_entropy(logits, tgt_out, pad, 0.0, Reduction::Sum).item();
    tokens += static_cast<int64_t>(sum(tgt_out != static_cast<double>(pad)).item());
  }
  return tokens > 0 ? nll / static_cast<double>(tokens) : 0.0;
}

std::vector<std::string> first_lines(const std::vector<std::string>& v, int64_t n) {
  if (n <= 0 || n >= static_cast<int64_t>(v.size())) return v;
  return {v.begin(), v.begin() + n};
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  nn::write_text_file_atomic(path, text);
}

// The first hypothesis of each sentence.
std::vector<std::string> best_of(const std::vector<std::vector<std::string>>& nbest) {
  std::vector<std::string> out;
  for (const auto& h : nbest) out.push_back(h.front());
  return out;
}

}  // namespace

// The flags that define a run (config.json's "run", with the data and the seed).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrainOptions, max_tokens, epochs, lr, warmup, weight_decay, label_smoothing, clip,
                                   ema, patience)

TrainReport run_training(const TrainOptions& o) {
  const apps::RunOptions& run = o.run;
  const Device device = apps::start_run("translate", run, kConfigFormat);

  // ---- data and tokenizers ----
  const Manifest data = read_manifest(o.data_dir);
  auto src_tok = std::make_shared<const Tokenizer>(Tokenizer::from_file(data.src_model));
  auto tgt_tok = data.tgt_model == data.src_model ? src_tok
                                                  : std::make_shared<const Tokenizer>(Tokenizer::from_file(data.tgt_model));
  const std::string src_file = fs::path(data.src_model).filename().string();
  const std::string tgt_file = fs::path(data.tgt_model).filename().string();
  ModelConfig mc = o.model;
  mc.src_vocab = src_tok->vocab_size();
  mc.tgt_vocab = tgt_tok->vocab_size();
  mc.joint_vocab = data.vocab == "joint";
  mc.pad_id = tgt_tok->pad_id();
  mc.bos_id = tgt_tok->bos_id();
  mc.eos_id = tgt_tok->eos_id();
  auto train_set = std::make_shared<TranslationDataset>(read_split(o.data_dir, "train"), *src_tok, *tgt_tok, mc.max_len);
  auto valid_set = std::make_shared<TranslationDataset>(read_split(o.data_dir, "valid"), *src_tok, *tgt_tok, mc.max_len);
  auto test_set = std::make_shared<TranslationDataset>(read_split(o.data_dir, "test"), *src_tok, *tgt_tok, mc.max_len);
  const ParallelSplit& valid_text = valid_set->text();
  const ParallelSplit& test_text = test_set->text();
  LINEA_CHECK(train_set->size() > 0, "translate: '", o.data_dir, "' has no training pairs");

  // ---- the checkpoint's config: the model, the tokenizers (their files travel with it), the run ----
  std::map<std::string, std::string> files;
  files[src_file] = src_tok->bytes();
  files[tgt_file] = tgt_tok->bytes();
  json run_cfg = o;
  run_cfg.update(
      {{"data", apps::recorded_data_dir(o.data_dir)}, {"train_pairs", train_set->size()}, {"seed", run.seed}});
  json config = {{"format", kConfigFormat},
                 {"model", mc},
                 {"tokenizers", {{"source", src_file}, {"target", tgt_file}}},
                 {"languages", {{"source", data.src_lang}, {"target", data.tgt_lang}}},
                 {"data", data.json},
                 {"run", run_cfg}};

  // ---- model and optimizer ----
  manual_seed(run.seed);
  auto model = std::make_shared<Seq2Seq>(mc);
  model->to(device);
  nn::AdamW opt(nn::decay_groups(*model, o.lr, o.weight_decay), 0.9, 0.98, 1e-8);
  Translator translator(model, src_tok, tgt_tok, device);

  std::printf("translate: %s -> %s, %lld train / %lld valid / %lld test pairs from %s\n", data.src_lang.c_str(),
              data.tgt_lang.c_str(), static_cast<long long>(train_set->size()),
              static_cast<long long>(valid_set->size()), static_cast<long long>(test_set->size()), o.data_dir.c_str());
  std::printf("translate: transformer %lld+%lld layers, dim %lld, %lld heads, mlp %lld, vocabulary %lld%s; attention "
              "encoder %s, decoder %s, cross %s: %lld parameters\n",
              static_cast<long long>(mc.enc_layers), static_cast<long long>(mc.dec_layers),
              static_cast<long long>(mc.dim), static_cast<long long>(mc.heads), static_cast<long long>(mc.mlp_hidden),
              static_cast<long long>(mc.tgt_vocab), mc.joint_vocab ? " (joint)" : "", mc.enc_attention.c_str(),
              mc.dec_attention.c_str(), mc.cross_attention.c_str(), static_cast<long long>(model->num_parameters()));
  std::printf("translate: device %s\n", apps::device_name(device).c_str());
  std::fflush(stdout);

  // ---- evaluations ----
  const std::vector<std::string> valid_src = first_lines(valid_text.src, o.valid_sentences);
  const std::vector<std::string> valid_ref = first_lines(valid_text.tgt, o.valid_sentences);
  SearchOptions greedy = o.search;
  greedy.beam = greedy.nbest = 1;
  auto validate = [&](const std::string&) {
    const double loss = split_loss(*model, *valid_set, o.max_tokens, device);
    DecodeStats ds;
    const auto hyps = best_of(translator.translate(valid_src, greedy, o.decode_batch, &ds));
    const bleu::BleuScore b = bleu::corpus_bleu(hyps, {valid_ref});
    apps::Metrics m;
    m.values = {{"valid_loss", loss}, {"valid_ppl", std::exp(loss)}, {"valid_bleu", b.score},
                {"valid_decode_sentences_per_s", ds.sentences_per_s()}};
    m.text = "valid loss " + fmt("%.3f", loss) + " ppl " + fmt("%.2f", std::exp(loss)) + " bleu " +
             fmt("%.2f", b.score);
    return m;
  };
  // The final test of `tr`'s model: loss, greedy and beam BLEU, chrF, the hypotheses files.
  auto test_of = [&](Translator& translator) {
    const double loss = split_loss(translator.model(), *test_set, o.max_tokens, device);
    DecodeStats gs, bs;
    const auto g = best_of(translator.translate(test_text.src, greedy, o.decode_batch, &gs));
    const auto b = best_of(translator.translate(test_text.src, o.search, o.decode_batch, &bs));
    const std::string ext = "." + data.tgt_lang;
    write_lines(run.out_dir + "/test.greedy" + ext, g);
    write_lines(run.out_dir + "/test.beam" + ext, b);
    const bleu::BleuScore gb = bleu::corpus_bleu(g, {test_text.tgt}), bb = bleu::corpus_bleu(b, {test_text.tgt});
    const bleu::ChrfScore bc = bleu::corpus_chrf(b, {test_text.tgt});
    apps::Metrics m;
    m.values = {{"test_loss", loss},
                {"test_ppl", std::exp(loss)},
                {"test_bleu", bb.score},
                {"test_bleu_greedy", gb.score},
                {"test_chrf", bc.score},
                {"bleu_signature", bb.signature},
                {"bleu_verbose", bb.verbose_score},
                {"chrf_signature", bc.signature},
                {"beam", o.search.beam},
                {"len_penalty", o.search.len_penalty},
                {"decode_beam_sentences_per_s", bs.sentences_per_s()},
                {"decode_beam_tokens_per_s", bs.tokens_per_s()},
                {"decode_greedy_sentences_per_s", gs.sentences_per_s()},
                {"decode_greedy_tokens_per_s", gs.tokens_per_s()},
                {"hypotheses", {{"beam", run.out_dir + "/test.beam" + ext}, {"greedy", run.out_dir + "/test.greedy" + ext}}}};
    m.text = "test BLEU " + fmt("%.2f", bb.score) + " (beam " + std::to_string(o.search.beam) + "), " +
             fmt("%.2f", gb.score) + " (greedy); chrF " + fmt("%.2f", bc.score) + "; " + bb.signature + "; beam " +
             fmt("%.1f", bs.sentences_per_s()) + " sentences/s, greedy " + fmt("%.1f", gs.sentences_per_s()) +
             " sentences/s";
    return m;
  };

  TrainReport report;
  if (run.eval_only) {  // the best weights of the checkpoint (else its last), on the test split
    const apps::Metrics m = apps::eval_only("translate", run, [&](const std::string& dir) {
      Translator loaded = Translator::load(dir, device);
      LINEA_CHECK(loaded.source_tokenizer().bytes() == src_tok->bytes() &&
                      loaded.target_tokenizer().bytes() == tgt_tok->bytes(),
                  "translate: --eval-only: the checkpoint in '", dir,
                  "' was trained with other tokenizers than the data in '", o.data_dir,
                  "' (pass the --data it was trained on)");
      return apps::evaluate_forked(loaded.model(), device, [&] { return test_of(loaded); });
    });
    report.test_bleu = m.values["test_bleu"];
    report.test_bleu_greedy = m.values["test_bleu_greedy"];
    return report;
  }

  // ---- the shared loop ----
  nn::DataLoader loader(train_set, std::make_shared<nn::TokenBudgetBatchSampler>(
                                       train_set->lengths(), nn::TokenBudgetOptions{o.max_tokens, 0, true, run.seed}));
  const int64_t pad = mc.pad_id;
  apps::TrainSetup setup;
  setup.app = "translate";
  setup.unit = "tokens";
  setup.unit_short = "tok";
  setup.model = model.get();
  setup.optimizer = &opt;
  setup.schedule = nn::InverseSqrt(o.lr, o.warmup);
  setup.clip = o.clip;
  setup.loader = &loader;
  setup.epochs = o.epochs;
  setup.device = device;
  setup.config = config;
  setup.resume_keys = {"model", "tokenizers", "run"};
  setup.files = files;
  setup.ema_decay = o.ema;
  setup.select = {"valid_bleu", true, o.patience};
  setup.curves = {"translate: " + mc.enc_attention + " / " + mc.dec_attention + " / " + mc.cross_attention +
                      " attention, loss and valid BLEU",
                  "train loss, label-smoothed",
                  "valid_loss",
                  "valid_bleu",
                  1.0,
                  "loss (nats per token)",
                  "valid BLEU (greedy)"};

  apps::TrainHooks hooks;
  hooks.step = [&](const nn::Batch& b) { return train_step(*model, b, device, pad, o.label_smoothing); };
  hooks.units = [](const nn::Batch& b) { return std::pair<int64_t, double>(target_tokens(b), -1.0); };
  hooks.evaluate = validate;
  hooks.format_stats = [](const std::map<std::string, double>& s) {
    return "ppl " + fmt("%.2f", std::exp(s.at("nll")));
  };
  hooks.finish = [&] { return test_of(translator); };
  hooks.summary = [&](json& summary) { summary.update({{"model", mc}, {"run", run_cfg}, {"data", data.json}}); };
  const apps::TrainResult tr = apps::train(setup, hooks, run);

  report.test_bleu = tr.final_eval.values.value("test_bleu", 0.0);
  report.test_bleu_greedy = tr.final_eval.values.value("test_bleu_greedy", 0.0);
  report.best_valid_bleu = tr.best_value;
  report.steps = tr.final_step;
  report.train_tokens_per_s = tr.units_per_s;
  const std::string ext = "." + data.tgt_lang;
  apps::report_run(setup, run, tr,
                   "test BLEU " + fmt("%.2f", report.test_bleu) + " (beam " + std::to_string(o.search.beam) + "), " +
                       fmt("%.2f", report.test_bleu_greedy) + " (greedy); best valid BLEU " +
                       fmt("%.2f", tr.best_value) + " at step " + std::to_string(tr.best_step),
                   {"test.beam" + ext, "test.greedy" + ext});
  return report;
}

}  // namespace translate
