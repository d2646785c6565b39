// Training checkpoints (layout in nn/checkpoint.h): two safetensors files written completely
// before either replaces the old one, and a validating load that restores model, optimizer and
// RNG or changes nothing.
// Not here: the safetensors format (nn/safetensors.cpp).
#include "nn/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <vector>

#include "core/random.h"
#include "nn/io_util.h"
#include "nn/safetensors.h"

namespace linea::nn {

namespace {

constexpr const char* kFormatKey = "linea_checkpoint";
constexpr const char* kFormat = "training/1";
constexpr const char* kSaveIdKey = "linea_save_id";
constexpr const char* kOptimPrefix = "optim.";
constexpr const char* kStatePrefix = "state.";
constexpr const char* kFilePrefix = "linea_file.";

// "<size>:<FNV-1a 64 hex>" of a file's contents: ties an extra file to its save.
std::string file_tag(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu:%016llx", bytes.size(), static_cast<unsigned long long>(h));
  return buf;
}

// An extra file's name as save_checkpoint allows it: a plain file in the checkpoint folder.
// Loading asks the same of the names a training file lists, since it reads those files ("../x"
// or "/dev/zero" would read outside the folder, or forever).
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         name != "model.safetensors" && name != "training.safetensors";
}

std::string join_path(const std::string& dir, const char* file) { return (std::filesystem::path(dir) / file).string(); }

Tensor rng_tensor(Device device) {
  std::vector<uint64_t> st = get_rng_state(device);
  std::vector<int64_t> v;
  for (uint64_t x : st) v.push_back(static_cast<int64_t>(x));  // bit pattern kept (two's complement)
  return from_vector<int64_t>(v, {static_cast<int64_t>(v.size())});
}

std::vector<uint64_t> rng_from_tensor(const Tensor& t) {
  std::vector<uint64_t> st;
  for (int64_t x : t.to_vector<int64_t>()) st.push_back(static_cast<uint64_t>(x));
  return st;
}

// The tensor `name` of a loaded file, checked for dtype and shape.
const Tensor& require(const SafetensorsFile& f, const std::string& file, const std::string& name, DType dtype,
                      const Shape& shape) {
  auto it = f.tensors.find(name);
  LINEA_CHECK(it != f.tensors.end(), "load_checkpoint: '", file, "': missing tensor '", name, "'");
  LINEA_CHECK(it->second.dtype() == dtype && it->second.shape() == shape, "load_checkpoint: '", file, "': tensor '",
              name, "' is ", dtype_name(it->second.dtype()), " ", shape_str(it->second.shape()), ", expected ",
              dtype_name(dtype), " ", shape_str(shape));
  return it->second;
}

std::string md_or(const Metadata& md, const std::string& key, const std::string& fallback) {
  auto it = md.find(key);
  return it == md.end() ? fallback : it->second;
}

// The temp files "<name>.tmp.<pid>" in dir (nn/io_util.h temp_path_for), of any process.
std::vector<std::string> temps_of(const std::string& dir, const std::string& name) {
  std::vector<std::string> out;
  std::error_code ec;
  const std::string prefix = name + ".tmp.";
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0) out.push_back(it->path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A safetensors file's metadata, or nothing when it cannot be read (a temp cut short by a kill).
std::optional<Metadata> metadata_of(const std::string& path) {
  try {
    return load_safetensors(path).metadata;
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<std::string> file_text(const std::string& path) {
  try {
    std::vector<char> bytes = detail::read_file_bytes(path, "load_checkpoint");
    return std::string(bytes.begin(), bytes.end());
  } catch (const Error&) {
    return std::nullopt;
  }
}

// A save killed between its renames (save_checkpoint renames the extra files, then training,
// then model; every temp is complete and fsync'ed before the first rename) leaves the files not
// yet renamed as temps. Finds a training file (the one in place, else a temp) whose model and
// extra files are all there, in place or as temps, and renames those temps into place: the save
// completes as if it had not been interrupted. Returns false when no such set exists.
bool finish_interrupted_save(const std::string& dir) {
  const std::string train_path = join_path(dir, "training.safetensors");
  const std::string model_path = join_path(dir, "model.safetensors");
  std::vector<std::string> trainings = {train_path};
  for (const std::string& t : temps_of(dir, "training.safetensors")) trainings.push_back(t);
  for (const std::string& tp : trainings) {
    const std::optional<Metadata> tmd = metadata_of(tp);
    if (!tmd || md_or(*tmd, kFormatKey, "") != kFormat) continue;
    const std::string id = md_or(*tmd, kSaveIdKey, "");
    std::vector<std::pair<std::string, std::string>> moves;  // {temp, final path}, model last
    bool complete = true;
    for (const auto& [key, tag] : *tmd) {
      if (key.rfind(kFilePrefix, 0) != 0) continue;
      const std::string name = key.substr(std::string(kFilePrefix).size());
      if (!plain_file_name(name)) {  // never read outside dir (a corrupt or hostile temp)
        complete = false;
        break;
      }
      const std::string path = join_path(dir, name.c_str());
      const std::optional<std::string> now = file_text(path);
      if (now && file_tag(*now) == tag) continue;
      std::string found;
      for (const std::string& t : temps_of(dir, name)) {
        const std::optional<std::string> text = file_text(t);
        if (text && file_tag(*text) == tag) found = t;
      }
      if (found.empty())
        complete = false;
      else
        moves.emplace_back(found, path);
    }
    if (tp != train_path) moves.emplace_back(tp, train_path);
    const std::optional<Metadata> mmd = metadata_of(model_path);
    if (!mmd || md_or(*mmd, "save_id", "") != id) {
      std::string found;
      for (const std::string& t : temps_of(dir, "model.safetensors")) {
        const std::optional<Metadata> md = metadata_of(t);
        if (md && md_or(*md, "save_id", "") == id) found = t;
      }
      if (found.empty())
        complete = false;
      else
        moves.emplace_back(found, model_path);
    }
    if (!complete) continue;
    for (const auto& [from, to] : moves) detail::commit_temp_file(from, to, "load_checkpoint");
    return true;
  }
  return false;
}

// Whether the model file and the extra files in place belong to the training file's save.
bool save_is_whole(const std::string& dir, const Metadata& model_md, const Metadata& train_md) {
  if (md_or(model_md, "save_id", "") != md_or(train_md, kSaveIdKey, "")) return false;
  for (const auto& [key, tag] : train_md) {
    if (key.rfind(kFilePrefix, 0) != 0) continue;
    const std::optional<std::string> text =
        file_text(join_path(dir, key.substr(std::string(kFilePrefix).size()).c_str()));
    if (!text || file_tag(*text) != tag) return false;
  }
  return true;
}

// Temps of the files a save writes, left by earlier processes killed while saving (finished
// saves and failed ones remove their own).
void remove_stale_temps(const std::string& dir, const std::vector<std::string>& names) {
  const std::string own = "." + std::to_string(static_cast<long>(::getpid()));
  for (const std::string& name : names)
    for (const std::string& t : temps_of(dir, name))
      if (t.size() < own.size() || t.compare(t.size() - own.size(), own.size(), own) != 0) std::remove(t.c_str());
}

}  // namespace

bool checkpoint_exists(const std::string& dir) {
  struct stat st;
  return ::stat(join_path(dir, "model.safetensors").c_str(), &st) == 0 ||
         ::stat(join_path(dir, "training.safetensors").c_str(), &st) == 0;
}

void save_checkpoint(const std::string& dir, const Module& model, const Optimizer& opt, const TrainState& state) {
  LINEA_CHECK(!dir.empty(), "save_checkpoint: empty checkpoint directory");
  for (const char* key : {kFormatKey, kSaveIdKey})
    LINEA_CHECK(!state.extra.count(key), "save_checkpoint: TrainState::extra key '", key, "' is reserved");
  for (const auto& kv : state.extra)
    LINEA_CHECK(kv.first.rfind(kFilePrefix, 0) != 0, "save_checkpoint: TrainState::extra keys starting with '",
                kFilePrefix, "' are reserved, got '", kv.first, "'");
  for (const auto& kv : state.files)
    LINEA_CHECK(plain_file_name(kv.first), "save_checkpoint: bad extra file name '", kv.first,
                "' (a plain file name other than model.safetensors and training.safetensors)");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LINEA_CHECK(!ec && std::filesystem::is_directory(dir), "save_checkpoint: cannot create directory '", dir,
              "': ", ec ? ec.message() : "a file of that name exists");

  // Both files carry the same save id, so a load can tell files of different saves apart.
  const std::string save_id =
      std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "-" + std::to_string(::getpid());
  Metadata model_md{{"step", std::to_string(state.step)}, {"epoch", std::to_string(state.epoch)}, {"save_id", save_id}};

  StateDict train;
  for (auto& [k, t] : opt.state_dict()) train[kOptimPrefix + k] = t;
  std::vector<double> lrs, wds;
  for (const ParamGroup& g : opt.param_groups()) {
    lrs.push_back(g.lr);
    wds.push_back(g.weight_decay);
  }
  const int64_t ngroups = static_cast<int64_t>(lrs.size());
  train["optim_groups.lr"] = from_vector<double>(lrs, {ngroups});
  train["optim_groups.weight_decay"] = from_vector<double>(wds, {ngroups});
  train["rng.cpu"] = rng_tensor(kCPU);
  if (cuda_available()) train["rng.cuda"] = rng_tensor(Device(DeviceType::CUDA));
  train["train.step"] = scalar_tensor(static_cast<double>(state.step), TensorOptions(DType::Int64));
  train["train.epoch"] = scalar_tensor(static_cast<double>(state.epoch), TensorOptions(DType::Int64));
  for (const auto& [name, t] : state.tensors) train[kStatePrefix + name] = t;
  Metadata train_md = state.extra;
  train_md[kFormatKey] = kFormat;
  train_md[kSaveIdKey] = save_id;
  for (const auto& [name, bytes] : state.files) train_md[kFilePrefix + name] = file_tag(bytes);

  std::vector<std::string> names = {"model.safetensors", "training.safetensors"};
  for (const auto& kv : state.files) names.push_back(kv.first);
  remove_stale_temps(dir, names);

  // Every file is written in full before any replaces its predecessor: a failure here leaves
  // the previous checkpoint as it was. The model file goes last: its save id marks a complete save.
  std::vector<std::pair<std::string, std::string>> temps;  // {temp, final path}
  try {
    for (const auto& [name, bytes] : state.files) {
      const std::string path = join_path(dir, name.c_str());
      temps.emplace_back(
          detail::write_temp_file(path, {detail::ByteSpan{bytes.data(), bytes.size()}}, "save_checkpoint"), path);
    }
    const std::string train_path = join_path(dir, "training.safetensors");
    temps.emplace_back(detail::write_safetensors_temp(train_path, train, train_md), train_path);
    const std::string model_path = join_path(dir, "model.safetensors");
    temps.emplace_back(detail::write_safetensors_temp(model_path, model.state_dict(), model_md), model_path);
  } catch (...) {
    for (const auto& t : temps) std::remove(t.first.c_str());
    throw;
  }
  for (size_t i = 0; i < temps.size(); ++i) {
    try {
      detail::commit_temp_file(temps[i].first, temps[i].second, "save_checkpoint");
    } catch (...) {
      for (size_t j = i + 1; j < temps.size(); ++j) std::remove(temps[j].first.c_str());
      throw;
    }
  }
}

TrainState load_checkpoint(const std::string& dir, Module& model, Optimizer& opt) {
  const std::string model_path = join_path(dir, "model.safetensors");
  const std::string train_path = join_path(dir, "training.safetensors");
  struct stat st;
  // A first save killed between its renames has training.safetensors and the model's temp only.
  if (::stat(model_path.c_str(), &st) != 0 && ::stat(train_path.c_str(), &st) == 0) finish_interrupted_save(dir);
  LINEA_CHECK(::stat(model_path.c_str(), &st) == 0 && ::stat(train_path.c_str(), &st) == 0,
              "load_checkpoint: ", checkpoint_exists(dir) ? "incomplete checkpoint" : "no checkpoint", " in '", dir,
              "' (expected model.safetensors and training.safetensors)");
  SafetensorsFile mf = load_safetensors(model_path);
  SafetensorsFile tf = load_safetensors(train_path);
  for (const auto& kv : tf.metadata) {
    if (kv.first.rfind(kFilePrefix, 0) != 0) continue;
    const std::string name = kv.first.substr(std::string(kFilePrefix).size());
    LINEA_CHECK(plain_file_name(name), "load_checkpoint: '", train_path, "' lists the extra file '", name,
                "', which is not a plain file name in '", dir, "'");
  }
  if (!save_is_whole(dir, mf.metadata, tf.metadata) && finish_interrupted_save(dir)) {
    mf = load_safetensors(model_path);
    tf = load_safetensors(train_path);
  }

  // ---- validate everything before changing anything -------------------------------------------
  std::string fmt = md_or(tf.metadata, kFormatKey, "");
  LINEA_CHECK(fmt == kFormat, "load_checkpoint: '", train_path, "' is not a Linea training checkpoint (metadata '",
              kFormatKey, "' is ", fmt.empty() ? std::string("missing") : "'" + fmt + "'", ", expected '", kFormat,
              "')");
  TrainState state;
  state.step = require(tf, train_path, "train.step", DType::Int64, {}).item<int64_t>();
  state.epoch = require(tf, train_path, "train.epoch", DType::Int64, {}).item<int64_t>();
  const std::string model_id = md_or(mf.metadata, "save_id", "");
  LINEA_CHECK(!model_id.empty() && model_id == md_or(tf.metadata, kSaveIdKey, ""), "load_checkpoint: '", model_path,
              "' (step ", md_or(mf.metadata, "step", "unknown"), ") and '", train_path, "' (step ", state.step,
              ") come from different saves (was a save interrupted?)");

  const int64_t ngroups = static_cast<int64_t>(opt.param_groups().size());
  auto lr_it = tf.tensors.find("optim_groups.lr");
  LINEA_CHECK(lr_it != tf.tensors.end() && lr_it->second.dim() == 1, "load_checkpoint: '", train_path,
              "': missing tensor 'optim_groups.lr'");
  LINEA_CHECK(lr_it->second.size(0) == ngroups, "load_checkpoint: '", train_path, "': the checkpoint has ",
              lr_it->second.size(0), " parameter groups, the optimizer has ", ngroups);
  std::vector<double> lrs = require(tf, train_path, "optim_groups.lr", DType::Float64, {ngroups}).to_vector<double>();
  std::vector<double> wds =
      require(tf, train_path, "optim_groups.weight_decay", DType::Float64, {ngroups}).to_vector<double>();
  // What the optimizer's constructor asks of them (a corrupt file could hold anything).
  for (int64_t g = 0; g < ngroups; ++g)
    LINEA_CHECK(std::isfinite(lrs[g]) && lrs[g] >= 0 && std::isfinite(wds[g]) && wds[g] >= 0, "load_checkpoint: '",
                train_path, "': parameter group ", g, " has lr ", lrs[g], " and weight_decay ", wds[g],
                " (both must be finite and >= 0)");
  std::vector<uint64_t> rng_cpu = rng_from_tensor(require(tf, train_path, "rng.cpu", DType::Int64, {2}));
  std::map<std::string, std::string> files;
  for (const auto& [key, tag] : tf.metadata) {
    if (key.rfind(kFilePrefix, 0) != 0) continue;
    const std::string name = key.substr(std::string(kFilePrefix).size());
    const std::string path = join_path(dir, name.c_str());
    std::vector<char> bytes = detail::read_file_bytes(path, "load_checkpoint");
    std::string text(bytes.begin(), bytes.end());
    LINEA_CHECK(file_tag(text) == tag, "load_checkpoint: '", path, "' and '", train_path,
                "' come from different saves (was a save interrupted?)");
    files[name] = std::move(text);
  }
  std::vector<uint64_t> rng_cuda;
  if (tf.tensors.count("rng.cuda")) rng_cuda = rng_from_tensor(require(tf, train_path, "rng.cuda", DType::Int64, {2}));

  StateDict optim_sd;
  const std::string prefix = kOptimPrefix, state_prefix = kStatePrefix;
  for (auto& [k, t] : tf.tensors) {
    if (k.compare(0, prefix.size(), prefix) == 0) optim_sd[k.substr(prefix.size())] = t;
    if (k.compare(0, state_prefix.size(), state_prefix) == 0) state.tensors[k.substr(state_prefix.size())] = t;
  }

  // ---- apply: optimizer, then model (restoring the optimizer if the model rejects its file) ------
  // Both load_state_dict calls validate fully before they modify anything.
  StateDict opt_backup = opt.state_dict();
  try {
    opt.load_state_dict(optim_sd);
  } catch (const Error& e) {
    LINEA_FAIL("load_checkpoint: '", train_path, "': ", e.what());
  }
  try {
    model.load_state_dict(mf.tensors, /*strict=*/true);
  } catch (const Error& e) {
    opt.load_state_dict(opt_backup);
    LINEA_FAIL("load_checkpoint: '", model_path, "': ", e.what());
  }
  for (int64_t g = 0; g < ngroups; ++g) {
    opt.param_groups()[g].lr = lrs[g];
    opt.param_groups()[g].weight_decay = wds[g];
  }
  set_rng_state(rng_cpu, kCPU);
  // A CUDA generator state is restored when a GPU is there to use it (a GPU run resumed on a
  // CPU-only machine has no CUDA generator to restore).
  if (!rng_cuda.empty() && cuda_available()) set_rng_state(rng_cuda, Device(DeviceType::CUDA));

  state.extra = tf.metadata;
  state.extra.erase(kFormatKey);
  state.extra.erase(kSaveIdKey);
  for (auto it = state.extra.begin(); it != state.extra.end();)
    it = it->first.rfind(kFilePrefix, 0) == 0 ? state.extra.erase(it) : std::next(it);
  state.files = std::move(files);
  return state;
}

}  // namespace linea::nn
