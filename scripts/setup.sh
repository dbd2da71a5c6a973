#!/usr/bin/env bash
# Installs every build and test dependency of moekit from Debian packages (idempotent: does
# nothing when all are present). The CUDA toolkit is optional: the CUDA backend is built when nvcc
# is found (MOEKIT_CUDA=AUTO), e.g. /usr/local/cuda/bin/nvcc.
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache googletest libgtest-dev libcli11-dev nlohmann-json3-dev python3 python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present"
