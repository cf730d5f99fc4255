#!/usr/bin/env bash
# Gathers the header-only build dependencies (doctest, nlohmann-json, CLI11) and zlib's
# headers into .gpu_deps/, with small CMake package files of their own, for a GPU machine
# that has CUDA, CMake and a compiler but no Debian -dev packages and no network:
#   bash scripts/gpu_deps.sh            # here, after scripts/setup.sh
#   (carry .gpu_deps; there:) bash scripts/gpu_check.sh
# .gpu_deps/ is listed in .gitignore.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu_deps
rm -rf "$out"
mkdir -p "$out/include" "$out/cmake"
cp -r /usr/include/doctest /usr/include/nlohmann /usr/include/CLI "$out/include/"
cp /usr/include/zlib.h /usr/include/zconf.h "$out/include/"
# One CMake package file per dependency, each an imported header-only target whose
# include directory is found relative to the file (the folder may live anywhere).
package() {  # package NAME TARGET
  cat >"$out/cmake/$1Config.cmake" <<CMAKE
get_filename_component(_dir "\${CMAKE_CURRENT_LIST_DIR}/../include" ABSOLUTE)
if(NOT TARGET $2)
  add_library($2 INTERFACE IMPORTED)
  set_target_properties($2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_dir}")
endif()
set($1_FOUND TRUE)
CMAKE
  # Any version asked for is met (the headers are the Debian packages' of this machine).
  printf 'set(PACKAGE_VERSION "%s")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' "$3" >"$out/cmake/$1ConfigVersion.cmake"
}
package doctest doctest::doctest "$(dpkg-query -W -f='${Version}' doctest-dev | cut -d- -f1)"
package nlohmann_json nlohmann_json::nlohmann_json "$(dpkg-query -W -f='${Version}' nlohmann-json3-dev | cut -d- -f1)"
package CLI11 CLI11::CLI11 "$(dpkg-query -W -f='${Version}' libcli11-dev | cut -d- -f1)"
du -sh "$out"
