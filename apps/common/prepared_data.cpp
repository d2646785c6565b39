// Prepared data folders (see prepared_data.h).
#include "apps/common/prepared_data.h"

#include <filesystem>

#include "core/error.h"
#include "nn/io_util.h"

namespace fs = std::filesystem;

namespace linea::apps {

std::string prepared_data_out(const std::string& op, const std::string& out_arg) {
  std::string out = out_arg;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  LINEA_CHECK(!out.empty(), op, ": --out is empty");
  const fs::path p(out);
  LINEA_CHECK(!fs::exists(p) || (fs::is_directory(p) && (fs::is_empty(p) || fs::exists(p / "data.json"))), op,
              ": refusing to replace '", out,
              "': it exists and is not a prepared data folder (no data.json); remove it or choose another --out");
  return out;
}

std::string recorded_data_dir(const std::string& dir) {
  const fs::path p = fs::absolute(dir).lexically_normal();
  return (p.has_filename() ? p : p.parent_path()).string();  // "/a/b/" has no filename: "/a/b"
}

nlohmann::json read_data_json(const std::string& app, const std::string& data_dir) {
  const std::string path = (fs::path(data_dir) / "data.json").string();
  LINEA_CHECK(fs::is_regular_file(path), app, ": '", data_dir, "' holds no prepared data (no data.json); run `", app,
              " prepare --out ", data_dir, "` first");
  const std::string who = app + ": data manifest";
  const std::vector<char> bytes = nn::detail::read_file_bytes(path, who.c_str());
  try {
    return nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    LINEA_FAIL(app, ": cannot read '", path, "': ", e.what(), "; run `", app, " prepare --out ", data_dir, "` again");
  }
}

}  // namespace linea::apps
