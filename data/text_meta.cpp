#include "data/text_meta.h"

#include <nlohmann/json.hpp>

#include "data/json_file.h"
#include "tensor/atomic_file.h"
#include "tensor/error.h"

namespace mu::data {

using json = nlohmann::json;

void save_text_meta(const std::string& path, const TextMeta& meta) {
  json j;
  j["tokenizer"] = meta.tokenizer;
  j["vocab_size"] = meta.vocab_size;
  j["train_tokens"] = meta.train_tokens;
  j["val_tokens"] = meta.val_tokens;
  j["source"] = meta.source;
  json chars = json::array();
  if (meta.chars) {
    for (const std::string& c : meta.chars->chars()) {
      json bytes = json::array();
      for (unsigned char b : c) bytes.push_back(int(b));
      chars.push_back(bytes);
    }
  }
  std::string text;
  try {
    text = j.dump(1);
    // The vocabulary on one line (one byte value a line would run to thousands of lines),
    // put in before the closing brace.
    if (meta.chars) text.insert(text.size() - 2, ",\n \"chars\": " + chars.dump());
    text += "\n";
  } catch (const json::exception& e) {
    MU_FAIL("save_text_meta: ", path, ": cannot encode (the source must be valid UTF-8): ", e.what());
  }
  write_file_atomically(path, {{text.data(), text.size()}}, "save_text_meta");
}

TextMeta load_text_meta(const std::string& path) {
  const json j = load_json_object(path);
  auto field = [&](const char* name) -> const json& { return json_field(j, path, name); };
  auto count = [&](const char* name) {
    const json& v = field(name);
    MU_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, path, ": field \"", name,
             "\" must be a non-negative integer, got ", v.dump());
    return v.get<int64_t>();
  };
  TextMeta m;
  MU_CHECK(field("tokenizer").is_string(), path, ": field \"tokenizer\" must be a string");
  m.tokenizer = j["tokenizer"].get<std::string>();
  MU_CHECK(m.tokenizer == "gpt2" || m.tokenizer == "char", path, ": field \"tokenizer\" is \"", m.tokenizer,
           "\", expected \"gpt2\" or \"char\"");
  m.vocab_size = count("vocab_size");
  m.train_tokens = count("train_tokens");
  m.val_tokens = count("val_tokens");
  if (j.contains("source") && j["source"].is_string()) m.source = j["source"].get<std::string>();
  if (m.tokenizer == "char") {
    const json& chars = field("chars");
    MU_CHECK(chars.is_array(), path, ": field \"chars\" must be an array");
    std::vector<std::string> list;
    for (size_t i = 0; i < chars.size(); ++i) {
      const json& c = chars[i];
      MU_CHECK(c.is_array() && !c.empty(), path, ": chars[", i, "] must be a non-empty array of byte values");
      std::string s;
      for (const json& b : c) {
        MU_CHECK(b.is_number_integer() && b.get<int64_t>() >= 0 && b.get<int64_t>() <= 255, path, ": chars[", i,
                 "] holds ", b.dump(), ", not a byte value 0..255");
        s.push_back(char(b.get<int>()));
      }
      list.push_back(std::move(s));
    }
    try {
      m.chars.emplace(std::move(list));
    } catch (const Error& e) {
      MU_FAIL(path, ": ", e.what());
    }
    MU_CHECK(m.chars->vocab_size() == m.vocab_size, path, ": \"vocab_size\" is ", m.vocab_size, " but \"chars\" holds ",
             m.chars->vocab_size());
  }
  return m;
}

}  // namespace mu::data
