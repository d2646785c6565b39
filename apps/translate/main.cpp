// translate: English->Spanish (or any line-aligned pair) translation with an encoder-decoder
// transformer and any attention mechanism; three commands:
//
//   translate prepare [--out data/translate]          the Bible pairs (SWORD modules), splits,
//                                                    SentencePiece; or --src FILE --tgt FILE
//   translate train [--data data/translate] [--out runs/translate] [--dec-attention performer] ...
//   translate decode --checkpoint runs/translate/checkpoint [--input FILE] [--beam 5] [--nbest 3]
//                                                    from a file, or line by line from stdin
//
// Flags and defaults: translate CMD --help. What a run writes: train.h; the data: prepare.h.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "apps/common/app_main.h"
#include "apps/common/app_run.h"
#include "apps/common/device.h"
#include "apps/common/progress.h"
#include "apps/common/run_options.h"
#include "attention/registry.h"
#include "core/error.h"
#include "core/runtime.h"
#include "prepare.h"
#include "train.h"
#include "translator.h"

using namespace linea;
namespace fs = std::filesystem;

namespace {

struct DecodeOptions {
  apps::ModelOptions model;  // --checkpoint --device --threads
  std::string input, output;
  translate::SearchOptions search;
  int64_t batch = 64;     // sentences per batch
  int64_t buffer = 0;     // lines read before translating (0: 1 on a terminal, else --batch-size)
};

void add_search_flags(CLI::App& app, translate::SearchOptions& s, const std::string& group) {
  app.add_option("--beam", s.beam, "beam size (1: greedy search)")->group(group)->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--lenpen", s.len_penalty, "length penalty: hypotheses scored log P / length^lenpen")
      ->group(group)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 10.0));
  app.add_option("--max-len-ratio", s.max_len_ratio, "at most RATIO * source tokens + --max-len-extra output tokens")
      ->group(group)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 100.0));
  app.add_option("--max-len-extra", s.max_len_extra, "see --max-len-ratio")->group(group)->capture_default_str()
      ->check(CLI::Range(0, 100000));
}

// Translates lines from a file or stdin; with --nbest N > 1 each line gives N lines
// "<line number> ||| <translation> ||| <score>" (the Moses n-best format).
int run_decode(const DecodeOptions& o) {
  const apps::ModelRun m = apps::start_model_run("translate", o.model);
  translate::Translator tr = translate::Translator::load(m.weights_dir, m.device);
  std::fprintf(stderr, "translate: weights from %s on %s; beam %lld\n", m.weights_dir.c_str(),
               apps::device_name(m.device).c_str(), static_cast<long long>(o.search.beam));

  std::ifstream file;
  if (!o.input.empty() && o.input != "-") {
    // A folder opens as a stream that reads nothing: say so instead of translating no lines.
    LINEA_CHECK(!fs::is_directory(o.input), "translate decode: --input '", o.input, "' is a folder, not a file");
    file.open(o.input);
    LINEA_CHECK(file.good(), "translate decode: cannot read --input '", o.input, "'");
  }
  std::istream& in = file.is_open() ? static_cast<std::istream&>(file) : std::cin;
  std::ofstream out_file;
  if (!o.output.empty()) {
    out_file.open(o.output);
    LINEA_CHECK(out_file.good(), "translate decode: cannot write --output '", o.output, "'");
  }
  std::ostream& out = out_file.is_open() ? static_cast<std::ostream&>(out_file) : std::cout;
  const bool terminal = !file.is_open() && ::isatty(0);
  const int64_t buffer = o.buffer > 0 ? o.buffer : terminal ? 1 : o.batch;

  translate::DecodeStats stats;
  int64_t line_no = 0;
  std::vector<std::string> lines;
  auto flush = [&] {
    if (lines.empty()) return;
    for (size_t i = 0; i < lines.size(); ++i)  // errors name the line of the whole input
      tr.encode_source(lines[i], "line " + std::to_string(line_no - lines.size() + i + 1));
    std::vector<std::vector<double>> scores;
    const auto hyps = tr.translate(lines, o.search, o.batch, &stats, &scores);
    for (size_t i = 0; i < hyps.size(); ++i) {
      if (o.search.nbest == 1) {
        out << hyps[i][0] << "\n";
        continue;
      }
      for (size_t k = 0; k < hyps[i].size(); ++k)
        out << (line_no - lines.size() + i + 1) << " ||| " << hyps[i][k] << " ||| "
            << apps::format_number("%.4f", scores[i][k]) << "\n";
    }
    out.flush();
    lines.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ++line_no;
    lines.push_back(line);
    if (static_cast<int64_t>(lines.size()) >= buffer) flush();
  }
  LINEA_CHECK(!in.bad(), "translate decode: reading ", file.is_open() ? "--input '" + o.input + "'" : "stdin",
              " failed after line ", line_no);
  flush();
  std::fprintf(stderr, "translate: %lld sentences, %lld tokens in %.2f s: %.1f sentences/s, %.0f tokens/s\n",
               static_cast<long long>(stats.sentences), static_cast<long long>(stats.tokens), stats.seconds,
               stats.sentences_per_s(), stats.tokens_per_s());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  apps::start_app(argv);  // first: may restart the process; joins an MPI job (app_main.h)
  CLI::App app{"translate: train and run an encoder-decoder transformer translator with any attention mechanism"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "all flags, grouped");

  // ---- prepare ----
  translate::PrepareOptions prep;
  CLI::App* prepare_cmd = app.add_subcommand("prepare", "read the Bible (or --src/--tgt files), split, train SentencePiece");
  translate::add_prepare_flags(*prepare_cmd, prep);

  // ---- train ----
  translate::TrainOptions t;
  CLI::App* train_cmd = app.add_subcommand("train", "train on prepared data, then report test BLEU");
  const std::string data = "Data", model = "Model", train = "Training", eval = "Evaluation";
  train_cmd->add_option("--data", t.data_dir, "folder written by `translate prepare`")->group(data)->capture_default_str();
  train_cmd
      ->add_option("--enc-attention", t.model.enc_attention,
                   "encoder self-attention: " + attn::attention_flag_help(attn::AttentionUse::Self))
      ->group(model)
      ->capture_default_str();
  train_cmd
      ->add_option("--dec-attention", t.model.dec_attention,
                   "decoder causal self-attention: " + attn::attention_flag_help(attn::AttentionUse::CausalSelf))
      ->group(model)
      ->capture_default_str();
  train_cmd
      ->add_option("--cross-attention", t.model.cross_attention,
                   "decoder cross-attention on the source: " + attn::attention_flag_help(attn::AttentionUse::Cross))
      ->group(model)
      ->capture_default_str();
  train_cmd->add_option("--dim", t.model.dim, "model width")->group(model)->capture_default_str()->check(CLI::Range(1, 16384));
  train_cmd->add_option("--heads", t.model.heads, "attention heads (must divide --dim)")->group(model)
      ->capture_default_str()->check(CLI::Range(1, 256));
  train_cmd->add_option("--enc-layers", t.model.enc_layers, "encoder layers")->group(model)->capture_default_str()
      ->check(CLI::Range(1, 256));
  train_cmd->add_option("--dec-layers", t.model.dec_layers, "decoder layers")->group(model)->capture_default_str()
      ->check(CLI::Range(1, 256));
  train_cmd->add_option("--mlp-hidden", t.model.mlp_hidden, "feed-forward hidden width")->group(model)
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  train_cmd->add_option("--dropout", t.model.dropout, "dropout on embeddings, residual branches and feed-forward")
      ->group(model)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 0.99));
  train_cmd->add_option("--positions", t.model.positions, "sinusoidal, learned or none (nprf_rpe has relative ones)")
      ->group(model)->capture_default_str()->check(CLI::IsMember({"sinusoidal", "learned", "none"}));
  train_cmd->add_option("--max-len", t.model.max_len, "longest source or target in tokens (with the end token)")
      ->group(model)->capture_default_str()->check(CLI::Range(2, 1 << 20));
  train_cmd->add_option("--max-tokens", t.max_tokens, "tokens per batch (longest sentence x sentences; "
                        "sentences are bucketed by length)")->group(train)->capture_default_str()->check(CLI::Range(1, 1 << 24));
  train_cmd->add_option("--epochs", t.epochs, "training epochs (at most; see --patience)")->group(train)
      ->capture_default_str()->check(CLI::Range(1, 100000));
  train_cmd->add_option("--lr", t.lr, "peak learning rate (AdamW, betas 0.9 0.98)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  train_cmd->add_option("--warmup", t.warmup, "linear warmup steps, then inverse square root decay")->group(train)
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  train_cmd->add_option("--weight-decay", t.weight_decay, "AdamW weight decay (not on biases and norms)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  train_cmd->add_option("--label-smoothing", t.label_smoothing, "label smoothing of the training loss")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 0.99));
  apps::add_clip_flag(*train_cmd, t.clip, train);
  apps::add_selection_flags(*train_cmd, t.ema, t.patience, "valid BLEU", train);
  add_search_flags(*train_cmd, t.search, eval);
  train_cmd->add_option("--valid-sentences", t.valid_sentences, "greedy valid BLEU on the first N valid pairs (0: all)")
      ->group(eval)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  train_cmd->add_option("--decode-batch", t.decode_batch, "sentences per decoding batch")->group(eval)
      ->capture_default_str()->check(CLI::Range(1, 100000));
  apps::add_run_flags(*train_cmd, t.run, train, "Running");

  // ---- decode ----
  DecodeOptions d;
  CLI::App* decode_cmd = app.add_subcommand("decode", "translate a file, or stdin line by line, with a checkpoint");
  apps::add_model_flags(*decode_cmd, d.model);
  decode_cmd->add_option("--input", d.input, "source lines (default or '-': stdin)");
  decode_cmd->add_option("--output", d.output, "translations (default: stdout)");
  add_search_flags(*decode_cmd, d.search, "Search");
  decode_cmd->add_option("--nbest", d.search.nbest, "hypotheses per line (> 1: 'LINE ||| TEXT ||| SCORE' lines)")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  decode_cmd->add_option("--batch-size", d.batch, "sentences per decoding batch")->capture_default_str()
      ->check(CLI::Range(1, 100000));
  decode_cmd
      ->add_option("--buffer-size", d.buffer,
                   "lines read before translating (0: 1 on a terminal, else "
                   "--batch-size)")
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  if (const std::string bad = apps::unknown_command(app, argc, argv); !bad.empty())
    return apps::fail(Error("translate: " + bad));
  CLI11_PARSE(app, argc, argv);

  try {
    if (*prepare_cmd) std::printf("%s\n", translate::describe(translate::prepare(prep, &std::cout)).c_str());
    if (*train_cmd) translate::run_training(t);
    if (*decode_cmd) {
      LINEA_CHECK(d.search.nbest <= d.search.beam, "translate decode: --nbest ", d.search.nbest,
                  " is larger than --beam ", d.search.beam);
      return run_decode(d);
    }
  } catch (const std::exception& e) {
    return linea::apps::fail(e);
  }
  return 0;
}
