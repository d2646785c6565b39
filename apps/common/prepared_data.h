// The data folder an app's `prepare` command writes and its `train` command reads (translate,
// protein): the files are staged in a temporary folder (nn::StagingDir) with data.json written
// last, so a folder holding data.json is complete, then moved into place.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace linea::apps {

// --out without trailing slashes; an error naming `op` (e.g. "protein prepare") when it is empty
// or names something that exists and is not a prepared data folder (an empty folder is fine).
std::string prepared_data_out(const std::string& op, const std::string& out);

// `dir` as a run records its data: absolute, normalized and without a trailing separator, so that
// `data`, `data/` and `./data` are one folder when a --resume compares them.
std::string recorded_data_dir(const std::string& dir);

// <data_dir>/data.json, parsed; `app` starts the errors, which say how to make the folder
// (`<app> prepare --out <data_dir>`).
nlohmann::json read_data_json(const std::string& app, const std::string& data_dir);

// f(), with a std::filesystem error (a path that cannot be created, renamed or removed) turned
// into a linea::Error naming `op`: a prepare step's staging and moves.
template <typename F> auto naming_filesystem_errors(const std::string& op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::filesystem::filesystem_error& e) {
    LINEA_FAIL(op, ": ", e.what());
  }
}

}  // namespace linea::apps
