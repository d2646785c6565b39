// protein: masked language modeling on protein sequences with an encoder-only transformer and
// any attention mechanism; four commands:
//
//   protein prepare [--out data/protein]              UniProt sequences (mmseqs2-examples), split
//                                                    by mmseqs2 clusters; or --fasta FILE
//   protein train [--data data/protein] [--out runs/protein] [--attention performer] [--pack 8192] ...
//   protein fill --checkpoint runs/protein/checkpoint 'MKT<mask>LLIL<mask>AV'
//                                                    the top-k residues at each <mask>
//   protein embed --checkpoint runs/protein/checkpoint seqs.fasta --out emb.safetensors
//                                                    mean (and --per-residue) embeddings
//
// Flags and defaults: protein CMD --help. What a run writes: train.h; the data: prepare.h.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "apps/common/app_main.h"
#include "apps/common/app_run.h"
#include "apps/common/device.h"
#include "apps/common/progress.h"
#include "apps/common/run_options.h"
#include "attention/registry.h"
#include "core/error.h"
#include "core/runtime.h"
#include "predictor.h"
#include "prepare.h"
#include "train.h"

using namespace linea;

namespace {

protein::Predictor load_predictor(const apps::ModelOptions& o) {
  const apps::ModelRun m = apps::start_model_run("protein", o);
  protein::Predictor p = protein::Predictor::load(m.weights_dir, m.device);
  std::fprintf(stderr, "protein: weights from %s on %s\n", m.weights_dir.c_str(), apps::device_name(m.device).c_str());
  return p;
}

int run_fill(const apps::ModelOptions& o, const std::vector<std::string>& inputs, int64_t k) {
  protein::Predictor p = load_predictor(o);
  for (const std::string& text : inputs) {
    std::printf("%s\n", text.c_str());
    for (const protein::Fill& f : p.fill(text, k)) {
      std::printf("  <mask> at %lld:", static_cast<long long>(f.position));
      for (const auto& [residue, prob] : f.top) std::printf("  %s %.4f", residue.c_str(), prob);
      std::printf("\n");
    }
  }
  return 0;
}

int run_embed(const apps::ModelOptions& o, const std::string& fasta, const std::string& out, bool per_residue,
              int64_t batch_tokens) {
  protein::Predictor p = load_predictor(o);
  const protein::Sequences seqs = protein::read_sequences(fasta);
  LINEA_CHECK(seqs.size() > 0, "protein embed: '", fasta, "' holds no sequences (nothing to embed)");
  const auto t0 = std::chrono::steady_clock::now();
  const protein::Embeddings e = p.embed(seqs, per_residue, batch_tokens);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  protein::save_embeddings(out, e, {{"source", fasta}, {"checkpoint", o.checkpoint}});
  std::fprintf(stderr, "protein: %lld sequences (%lld residues) embedded in %.2f s: %.0f residues/s; wrote %s "
               "(\"mean\" [%lld, %lld]%s)\n",
               static_cast<long long>(seqs.size()), static_cast<long long>(seqs.total_residues()), s,
               seqs.total_residues() / std::max(s, 1e-9), out.c_str(), static_cast<long long>(e.mean.size(0)),
               static_cast<long long>(e.mean.size(1)), per_residue ? ", \"residues.<i>\" [length, dim]" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  apps::start_app(argv);  // first: may restart the process; joins an MPI job (app_main.h)
  CLI::App app{"protein: train and use a protein masked language model with any attention mechanism"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "all flags, grouped");

  // ---- prepare ----
  protein::PrepareOptions prep;
  CLI::App* prepare_cmd = app.add_subcommand("prepare", "read the sequences, cluster them with mmseqs2, split");
  protein::add_prepare_flags(*prepare_cmd, prep);

  // ---- train ----
  protein::TrainOptions t;
  CLI::App* train_cmd = app.add_subcommand("train", "train on prepared data, then report test accuracy and perplexity");
  const std::string data = "Data", model = "Model", train = "Training", eval = "Evaluation";
  train_cmd->add_option("--data", t.data_dir, "folder written by `protein prepare`")->group(data)->capture_default_str();
  train_cmd
      ->add_option("--pack", t.pack,
                   "train and evaluate on windows of this many tokens cut from the "
                   "concatenated sequences (0: one sequence per example)")
      ->group(data)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  train_cmd->add_option("--mask-prob", t.masking.prob, "fraction of residue positions chosen for the loss")
      ->group(data)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.001, 1.0));
  train_cmd
      ->add_option("--attention", t.model.attention,
                   "self-attention: " + attn::attention_flag_help(attn::AttentionUse::Self))
      ->group(model)
      ->capture_default_str();
  train_cmd->add_option("--dim", t.model.dim, "model width")->group(model)->capture_default_str()->check(CLI::Range(1, 16384));
  train_cmd->add_option("--heads", t.model.heads, "attention heads (must divide --dim)")->group(model)
      ->capture_default_str()->check(CLI::Range(1, 256));
  train_cmd->add_option("--layers", t.model.layers, "encoder layers")->group(model)->capture_default_str()
      ->check(CLI::Range(1, 256));
  train_cmd->add_option("--mlp-hidden", t.model.mlp_hidden, "feed-forward hidden width")->group(model)
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  train_cmd->add_option("--dropout", t.model.dropout, "dropout on embeddings, residual branches and feed-forward")
      ->group(model)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 0.99));
  train_cmd->add_option("--positions", t.model.positions, "learned or none (nprf_rpe has relative ones)")
      ->group(model)->capture_default_str()->check(CLI::IsMember({"learned", "none"}));
  train_cmd->add_option("--max-len", t.model.max_len, "tokens per window with <cls>/<eos>: longer sequences are "
                        "cropped at random in training and evaluated in windows")->group(model)->capture_default_str()
      ->check(CLI::Range(3, 1 << 20));
  train_cmd->add_option("--max-tokens", t.max_tokens, "tokens per batch (longest window x windows; windows are "
                        "bucketed by length)")->group(train)->capture_default_str()->check(CLI::Range(1, 1 << 26));
  train_cmd->add_option("--epochs", t.epochs, "training epochs (at most; see --patience)")->group(train)
      ->capture_default_str()->check(CLI::Range(1, 100000));
  train_cmd->add_option("--lr", t.lr, "peak learning rate (AdamW, betas 0.9 0.98)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  train_cmd->add_option("--schedule", t.schedule, "after the warmup: cosine (to 0 at the last step), inverse_sqrt "
                        "or constant")->group(train)->capture_default_str()
      ->check(CLI::IsMember({"cosine", "inverse_sqrt", "constant"}));
  train_cmd->add_option("--warmup", t.warmup, "linear warmup steps")->group(train)->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  train_cmd->add_option("--weight-decay", t.weight_decay, "AdamW weight decay (not on biases, norms, embeddings)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  apps::add_clip_flag(*train_cmd, t.clip, train);
  apps::add_selection_flags(*train_cmd, t.ema, t.patience, "valid perplexity", train);
  train_cmd->add_option("--eval-max-tokens", t.eval_max_tokens, "tokens per evaluation batch")->group(eval)
      ->capture_default_str()->check(CLI::Range(1, 1 << 26));
  apps::add_run_flags(*train_cmd, t.run, train, "Running");

  // ---- fill ----
  apps::ModelOptions fill_opts;
  std::vector<std::string> fill_inputs;
  int64_t top_k = 5;
  CLI::App* fill_cmd = app.add_subcommand("fill", "the most probable residues at each <mask> of a sequence");
  apps::add_model_flags(*fill_cmd, fill_opts);
  fill_cmd->add_option("sequences", fill_inputs, "sequences with <mask> tokens, e.g. 'MKT<mask>LLIL'")->required();
  fill_cmd->add_option("--top-k", top_k, "residues listed per <mask>")->capture_default_str()->check(CLI::Range(1, 27));

  // ---- embed ----
  apps::ModelOptions embed_opts;
  std::string embed_fasta, embed_out;
  bool per_residue = false;
  int64_t batch_tokens = 16384;
  CLI::App* embed_cmd = app.add_subcommand("embed", "per-sequence mean embeddings of a FASTA file (ESM's "
                                           "esm-extract --include mean)");
  apps::add_model_flags(*embed_cmd, embed_opts);
  embed_cmd->add_option("fasta", embed_fasta, "FASTA or FASTA.gz file")->required();
  embed_cmd->add_option("--out", embed_out, "safetensors file to write")->required();
  embed_cmd->add_flag("--per-residue", per_residue, "also every residue's embedding (\"residues.<i>\")");
  embed_cmd->add_option("--batch-tokens", batch_tokens, "tokens per forward batch")->capture_default_str()
      ->check(CLI::Range(1, 1 << 26));
  if (const std::string bad = apps::unknown_command(app, argc, argv); !bad.empty())
    return apps::fail(Error("protein: " + bad));
  CLI11_PARSE(app, argc, argv);

  try {
    if (*prepare_cmd) std::printf("%s\n", protein::describe(protein::prepare(prep, &std::cout)).c_str());
    if (*train_cmd) protein::run_training(t);
    if (*fill_cmd) return run_fill(fill_opts, fill_inputs, top_k);
    if (*embed_cmd) return run_embed(embed_opts, embed_fasta, embed_out, per_residue, batch_tokens);
  } catch (const std::exception& e) {
    return linea::apps::fail(e);
  }
  return 0;
}
