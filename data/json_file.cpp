#include "data/json_file.h"

#include "data/mapped_file.h"
#include "tensor/error.h"

namespace mu::data {

nlohmann::json load_json_object(const std::string& path) {
  const MappedFile file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(file.data(), file.data() + file.size());
  } catch (const nlohmann::json::exception& e) {
    MU_FAIL(path, ": not valid JSON: ", e.what());
  }
  MU_CHECK(j.is_object(), path, ": expected a JSON object");
  return j;
}

const nlohmann::json& json_field(const nlohmann::json& j, const std::string& path, const char* name) {
  MU_CHECK(j.contains(name), path, ": missing field \"", name, "\"");
  return j[name];
}

}  // namespace mu::data
