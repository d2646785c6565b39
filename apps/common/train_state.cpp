// The run's state besides model and optimizer, saved and resumed (see train_state.h).
#include "apps/common/train_state.h"

#include <filesystem>

#include "apps/common/metrics.h"
#include "apps/common/progress.h"
#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "nn/io_util.h"
#include "nn/safetensors.h"

namespace fs = std::filesystem;

namespace linea::apps {

WeightAverage::WeightAverage(const nn::Module& model, double decay) : decay_(decay) {
  LINEA_CHECK(decay >= 0 && decay < 1, "train: ema_decay must be in [0, 1), got ", decay);
  if (decay == 0) return;
  NoGradGuard ng;
  for (auto& [name, p] : model.named_parameters()) {
    names_.push_back(name);
    params_.push_back(p);
    avg_.push_back(clone(p.detach()));
  }
}

void WeightAverage::update(const Tensor& guard) {
  if (!on()) return;
  NoGradGuard ng;
  const TensorOptions f64(DType::Float64, params_[0].device());
  if (!count_.defined() || count_.device() != f64.device) {
    LongLivedAllocations long_lived;
    count_ = full({}, static_cast<double>(updates_), f64);
  }
  const Tensor ok = gt(select(guard, 0, 2), 0.5);
  const Tensor d = where(ok, minimum(full({}, decay_, f64), (count_ + 1.0) / (count_ + 10.0)), 1.0);
  const Tensor one_minus_d = 1.0 - d;
  for (size_t i = 0; i < avg_.size(); ++i)
    avg_[i].copy_(avg_[i] * d.to(avg_[i].dtype()) + params_[i].detach() * one_minus_d.to(avg_[i].dtype()));
  count_.copy_(count_ + ok.to(DType::Float64));
}

void WeightAverage::swap() {
  if (!on()) return;
  NoGradGuard ng;
  for (size_t i = 0; i < avg_.size(); ++i) {
    Tensor w = clone(params_[i].detach());
    params_[i].copy_(avg_[i]);
    avg_[i].copy_(w);
  }
}

void WeightAverage::save_to(nn::TrainState& st) const {
  if (!on()) return;
  for (size_t i = 0; i < avg_.size(); ++i) st.tensors["ema." + names_[i]] = avg_[i].to(kCPU);
  st.extra["ema_updates"] = std::to_string(count_.defined() ? count_.item<int64_t>() : updates_);
}

void WeightAverage::load_from(const nn::TrainState& st, const std::string& app) {
  if (!on()) return;
  for (size_t i = 0; i < avg_.size(); ++i) {
    auto it = st.tensors.find("ema." + names_[i]);
    LINEA_CHECK(it != st.tensors.end() && it->second.shape() == avg_[i].shape(), app,
                ": --resume: the checkpoint has no moving average of '", names_[i], "' (saved without ema?)");
    avg_[i].copy_(it->second);
  }
  updates_ = std::stoll(st.extra.at("ema_updates"));
  count_ = Tensor();
}

bool Selection::consider(double value, bool maximize, int64_t step) {
  if (!have || (maximize ? value > best : value < best)) {
    *this = Selection{true, value, step, 0};
    return true;
  }
  ++since;
  return false;
}

void Selection::save_to(nn::TrainState& st) const {
  if (!have) return;
  st.extra["select_best"] = format_number("%.17g", best);
  st.extra["select_best_step"] = std::to_string(best_step);
  st.extra["select_since"] = std::to_string(since);
}

void Selection::load_from(const nn::TrainState& st) {
  auto it = st.extra.find("select_best");
  if (it == st.extra.end()) return;
  have = true;
  best = std::stod(it->second);
  best_step = std::stoll(st.extra.at("select_best_step"));
  since = std::stoll(st.extra.at("select_since"));
}

void save_best(const TrainSetup& setup, const std::string& dir, int64_t step, double value) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LINEA_CHECK(!ec, setup.app, ": cannot create '", dir, "': ", ec.message());
  std::map<std::string, std::string> files = setup.files;
  files["config.json"] = setup.config.dump(2) + "\n";
  for (const auto& [name, bytes] : files) nn::write_text_file_atomic(dir + "/" + name, bytes);
  nn::save_module(dir + "/model.safetensors", *setup.model,
                  {{"step", std::to_string(step)}, {setup.select.metric, format_number("%.17g", value)}});
}

Position resume_checkpoint(const TrainSetup& setup, const std::string& dir, WeightAverage& ema, Selection& sel) {
  const std::string cfg_path = dir + "/config.json";
  LINEA_CHECK(fs::is_regular_file(cfg_path), setup.app, ": --resume: '", dir, "' holds no config.json");
  const std::string diff = config_diff(read_json_file(cfg_path, setup.app), setup.config, setup.resume_keys);
  LINEA_CHECK(diff.empty(), setup.app, ": --resume: the checkpoint in '", dir,
              "' was made with other settings; use the same flags (or another --checkpoint/--out):", diff);
  nn::TrainState st = nn::load_checkpoint(dir, *setup.model, *setup.optimizer);
  nn::check_finite_weights(*setup.model, setup.app + ": --resume: '" + dir + "/model.safetensors'");
  Position pos{st.step, st.epoch, 0};
  ema.load_from(st, setup.app);
  sel.load_from(st);
  // Older checkpoints kept no "epoch_batch": the position is the step less the epochs before.
  auto it = st.extra.find("epoch_batch");
  pos.batch = it != st.extra.end() ? std::stoll(it->second) : st.step - planned_steps(*setup.loader, st.epoch);
  return pos;
}

void save_checkpoint(const TrainSetup& setup, const std::string& dir, const Position& pos, const WeightAverage& ema,
                     const Selection& sel) {
  nn::TrainState st;
  ema.save_to(st);
  sel.save_to(st);
  st.step = pos.step;
  st.epoch = pos.epoch;
  st.extra["epoch_batch"] = std::to_string(pos.batch);
  st.extra["schedule"] = nn::schedule_name(setup.schedule);
  st.files = setup.files;
  st.files["config.json"] = setup.config.dump(2) + "\n";
  nn::save_checkpoint(dir, *setup.model, *setup.optimizer, st);
}

namespace {

void flatten_diff(const std::string& path, const nlohmann::json& saved, const nlohmann::json& now, std::string& out) {
  if (now.is_object() && saved.is_object()) {
    for (auto it = now.begin(); it != now.end(); ++it)
      flatten_diff(path.empty() ? it.key() : path + "." + it.key(),
                   saved.contains(it.key()) ? saved.at(it.key()) : nlohmann::json(), it.value(), out);
    return;
  }
  const std::string s = saved.is_null() ? "(absent)" : saved.dump();
  if (s != now.dump()) out += "\n  " + path + ": checkpoint " + s + ", now " + now.dump();
}

}  // namespace

std::string config_diff(const nlohmann::json& saved, const nlohmann::json& now, const std::vector<std::string>& keys) {
  using json = nlohmann::json;
  std::string out;
  if (keys.empty()) {
    flatten_diff("", saved, now, out);
    return out;
  }
  for (const std::string& k : keys)
    flatten_diff(k, saved.contains(k) ? saved.at(k) : json(), now.contains(k) ? now.at(k) : json(), out);
  return out;
}

nlohmann::json read_checkpoint_config(const std::string& dir, const std::string& app, const std::string& format) {
  const std::string path = dir + "/config.json";
  LINEA_CHECK(fs::is_directory(dir), app, ": checkpoint folder '", dir, "' ",
              fs::exists(dir) ? "is a file, not a folder" : "does not exist");
  LINEA_CHECK(fs::is_regular_file(path), app, ": '", dir, "' is not a ", app,
              " checkpoint (no config.json; pass the checkpoint folder of a training run)");
  nlohmann::json j = read_json_file(path, app);
  const std::string found =
      j.is_object() && j.contains("format") && j["format"].is_string() ? j["format"].get<std::string>() : "";
  LINEA_CHECK(found == format, app, ": '", dir, "' is not a ", app, " checkpoint (its config.json has format '",
              found.empty() ? std::string("none") : found, "', expected '", format, "')");
  return j;
}

}  // namespace linea::apps
