// The data folder an app's `prepare` command writes and its `train` command reads (translate,
// protein): the files are staged in a temporary folder (nn::StagingDir) with data.json written
// last, so a folder holding data.json is complete, then moved into place.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace linea::apps {

// --out without trailing slashes; an error naming `op` (e.g. "protein prepare") when it is empty
// or names something that exists and is not a prepared data folder (an empty folder is fine).
std::string prepared_data_out(const std::string& op, const std::string& out);

// <data_dir>/data.json, parsed; `app` starts the errors, which say how to make the folder
// (`<app> prepare --out <data_dir>`).
nlohmann::json read_data_json(const std::string& app, const std::string& data_dir);

}  // namespace linea::apps
