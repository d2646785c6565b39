// Using a trained protein model: load a checkpoint folder (its config.json, format
// "linea-protein/1", and model.safetensors), fill in masked residues, embed sequences.
//
//   Predictor p = Predictor::load("runs/protein/checkpoint/best");
//   auto fills = p.fill("MKT<mask>LLIA<mask>", 5);      // top-5 residues at each <mask>
//   Embeddings e = p.embed(read_sequences("my.fasta"), /*per_residue=*/false);
//
// Sequences longer than the model's windows are cut into sequence_windows (dataset.h), each
// framed <cls> ... <eos>, and their per-residue outputs put back together, so any length works.
// Not here: training (train.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "dataset.h"
#include "model.h"
#include "nn/safetensors.h"

namespace protein {

inline const char* kConfigFormat = "linea-protein/1";

struct Fill {
  int64_t position = 0;  // 1-based position of the <mask> in the input tokens
  std::vector<std::pair<std::string, double>> top;  // residue character, probability (the full softmax's)
};

// ESM's `esm-extract --include mean` convention: the final layer's hidden states (after the
// final LayerNorm) averaged over the residue positions (not <cls>/<eos>).
struct Embeddings {
  std::vector<std::string> names;
  linea::Tensor mean;                   // Float32 [N, dim]
  std::vector<linea::Tensor> residues;  // per_residue: Float32 [length_i, dim] each
};

inline const char* kEmbeddingsFormat = "linea-protein-embeddings/1";

// Writes `e` as a safetensors file, atomically: tensors "mean" [N, dim] and, when e.residues is
// filled, "residues.<i>" [length_i, dim] (i = 0-based index into e.names); metadata "format"
// (kEmbeddingsFormat), "dim", "names" (a JSON array of the ids, in order), plus `extra` (e.g.
// the checkpoint and input files; a key of its own is an error). Opens in Python with
// safetensors.torch.load_file; json.loads(metadata["names"]) gives the ids.
void save_embeddings(const std::string& path, const Embeddings& e, const linea::nn::Metadata& extra = {});

class Predictor {
 public:
  // Moves the model to `device` when it is elsewhere.
  Predictor(std::shared_ptr<ProteinLM> model, linea::Device device);
  static Predictor load(const std::string& dir, linea::Device device = linea::kCPU);

  // Every <mask> of `text` (parse_tokens): the k most probable residues (ids 4..30) there.
  // Text without <mask> is a linea::Error.
  std::vector<Fill> fill(const std::string& text, int64_t k = 5);
  // batch_tokens: tokens per forward batch (windows are grouped up to this, longest first; a
  // window longer than it goes alone). The model runs in eval mode without a graph.
  Embeddings embed(const Sequences& seqs, bool per_residue = false, int64_t batch_tokens = 16384);

  ProteinLM& model() { return *model_; }
  linea::Device device() const { return device_; }

 private:
  std::shared_ptr<ProteinLM> model_;
  linea::Device device_;
};

}  // namespace protein
