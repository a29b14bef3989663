#!/usr/bin/env bash
# Installs what troupe needs from Debian's packages, only what is missing.
set -euo pipefail
pkgs=(cmake ninja-build clang ccache libcaf-dev libsqlite3-dev nlohmann-json3-dev catch2 libfmt-dev
      libssl-dev openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "troupe: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
