#!/usr/bin/env bash
# Installs the Debian packages hputrain needs to build, test and run the
# demo -- only those that are missing. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libev-dev libssl-dev
  libcmocka-dev libopenblas-dev libdnnl-dev zlib1g-dev libcjson-dev liburing-dev
  libsystemd-dev
  clang libclang-rt-14-dev iproute2
  gnuplot-nox
  scdoc man-db
  dataset-fashion-mnist
)
# Extra packages for a caller that wants them (e.g. bench: python3-torch).
packages+=("$@")
# Nice to have: a real single-node Slurm for test_slurm_real (skipped
# without it). A failure to install these is reported, not fatal.
optional=(slurmctld slurmd slurm-client munge)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
missing_optional=()
for p in "${optional[@]}"; do
  installed "$p" || missing_optional+=("$p")
done

if [ ${#missing[@]} -eq 0 ] && [ ${#missing_optional[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if [ ${#missing[@]} -eq 0 ]; then
    exit 0 # only optional ones are missing: not worth asking for sudo
  elif command -v sudo >/dev/null 2>&1; then
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
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ${#missing_optional[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing_optional[*]} (optional: a real Slurm for its test)"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" ||
    echo "install-deps: could not install ${missing_optional[*]}; test_slurm_real will be skipped" >&2
fi
