// Training checkpoints: everything `--resume` needs to continue a run exactly, in a directory
// of two safetensors files (nn/safetensors.h), so the model opens anywhere on its own:
//
//   <dir>/model.safetensors     the model's state_dict(); __metadata__ {"step", "epoch", "save_id"}
//   <dir>/<name>                TrainState::files: other files of the save (e.g. config.json)
//   <dir>/training.safetensors  "optim.<key>"            the optimizer's state_dict() (moments, "optim.step")
//                               "optim_groups.lr"         F64 [groups]: each group's lr and
//                               "optim_groups.weight_decay"  weight decay (restored, as PyTorch does)
//                               "rng.cpu", "rng.cuda"     I64 [2]: {seed, offset} of the CPU / CUDA
//                                                         generator (CUDA only when available)
//                               "train.step", "train.epoch"  I64 0-d
//                               "state.<name>"            TrainState::tensors (e.g. an EMA of the weights)
//                               __metadata__: TrainState::extra (e.g. schedule name, app flags)
//                                             plus "linea_checkpoint": "training/1" and
//                                             "linea_save_id" (equal to model's "save_id"),
//                                             "linea_file.<name>": size and FNV-1a hash of each extra file
//
// Saving writes every file completely (temp files, fsync'ed) before renaming any over the old
// ones, so a failed save (full disk, unwritable directory) leaves the previous checkpoint intact,
// and temps left by processes killed while saving are removed by the next save. A kill between
// the renames leaves a mix of two saves: loading detects it (the model file records the save id,
// the training file the save id and each extra file's hash) and finishes that save from its
// remaining temps, which are complete; a mix it cannot finish is a clear error. Loading restores
// model, optimizer, RNG states and returns the TrainState; on CPU a resumed run is bit-for-bit
// the uninterrupted one (data order comes from DataLoader's own (seed, epoch) permutation, not
// the global RNG).
// Not here: the file format itself (nn/safetensors.h), learning-rate schedules (pure functions
// of the step: nn/schedule.h), data loader position (resume with DataLoader::reset(epoch, batch)).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "nn/module.h"
#include "nn/optim.h"

namespace linea::nn {

struct TrainState {
  int64_t step = 0;   // completed training steps (the next step to run)
  int64_t epoch = 0;  // current epoch
  // Free-form strings: schedule name, app flags, ... (keys "linea_checkpoint" and
  // "linea_save_id" are reserved).
  std::map<std::string, std::string> extra;
  // Whole files saved beside the safetensors in the same atomic save and loaded back, by plain
  // file name (no '/'; not model.safetensors or training.safetensors): an app's config.json, a
  // tokenizer model, ...
  std::map<std::string, std::string> files;
  // More tensors of the training state (e.g. "ema.<param>": a moving average of the weights),
  // saved in training.safetensors as "state.<name>" and loaded back on the CPU.
  std::map<std::string, Tensor> tensors;
};

// Writes <dir>/model.safetensors, <dir>/training.safetensors and state.files (creating dir as needed).
void save_checkpoint(const std::string& dir, const Module& model, const Optimizer& opt, const TrainState& state);

// Restores model (strict state_dict), optimizer state and learning rates, and the RNG states
// from dir; returns the saved TrainState (with its files). The model and optimizer must be built the same way
// as when saving (same names, shapes and parameter groups); any mismatch throws linea::Error
// naming the file and listing the bad keys, and leaves model and optimizer unchanged.
TrainState load_checkpoint(const std::string& dir, Module& model, Optimizer& opt);

// True when dir holds a checkpoint file (for --resume, which then loads it: one file without
// the other is an error there, not a fresh start).
bool checkpoint_exists(const std::string& dir);

}  // namespace linea::nn
