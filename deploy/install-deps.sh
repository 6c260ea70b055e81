#!/usr/bin/env bash
# Installs the Debian packages hputrain needs to build, test and run the
# demo -- only those that are missing. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libev-dev libssl-dev
  libcmocka-dev libopenblas-dev zlib1g-dev libcjson-dev
  clang libclang-rt-14-dev iproute2
  dataset-fashion-mnist
)
# Extra packages for a caller that wants them (e.g. bench: python3-torch).
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "install-deps: these packages are missing and I am not root: ${missing[*]}" >&2
    echo "install-deps: run as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
