#!/usr/bin/env bash
# Installs what the build, the tests and the demos need, from Debian's packages; skips
# whatever is already installed. Run as root on Debian 12.
set -euo pipefail
packages=(cmake g++ make doctest-dev libopenblas-dev nlohmann-json3-dev libcli11-dev zlib1g-dev python3-torch dataset-fashion-mnist)
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
