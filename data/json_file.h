// The small JSON metadata files beside datasets (meta.json of token files and of image
// arrays): the whole file as one JSON object, and its fields, each problem a mu::Error
// naming the file (and the field). Internal to the library's readers; it needs
// nlohmann/json, which the library builds with.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace mu::data {

// A missing or unreadable file, invalid JSON, or a value that is not an object is refused.
nlohmann::json load_json_object(const std::string& path);
// j[name], or a mu::Error "<path>: missing field "<name>"".
const nlohmann::json& json_field(const nlohmann::json& j, const std::string& path, const char* name);

}  // namespace mu::data
