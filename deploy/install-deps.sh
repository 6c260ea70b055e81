#!/usr/bin/env bash
# Installs the Debian packages hputrain needs to build, test and run the
# demo -- only those that are missing. Run as root (or with sudo).
set -euo pipefail

# What compiles the programs, libraries and models.
build=(
  build-essential cmake pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libev-dev libssl-dev
  libopenblas-dev libdnnl-dev zlib1g-dev libcjson-dev liburing-dev
  libsystemd-dev
  scdoc
)
# What the tests and the demo need besides.
testing=(
  libcmocka-dev
  clang libclang-rt-14-dev iproute2
  gnuplot-nox
  man-db
  dataset-fashion-mnist
)
# Nice to have; a failure to install these is reported, not fatal:
# a real single-node Slurm for test_slurm_real, and podman with runc
# (crun cannot run on cgroup v1 hybrid hosts) and debootstrap (the base
# image, without a registry) for test_containers. Either test is skipped
# without them.
# Each group is installed on its own, so that one failing keeps the other.
optional_groups=("slurmctld slurmd slurm-client munge" "podman runc debootstrap")
optional=(${optional_groups[*]})

# --build-only: the build packages alone, as deploy/Dockerfile's build
# stage wants them (configure with -DHPU_TESTS=OFF).
if [ "${1:-}" = --build-only ]; then
  shift
  packages=("${build[@]}")
  optional_groups=()
  optional=()
else
  packages=("${build[@]}" "${testing[@]}")
fi
# Extra packages for a caller that wants them (e.g. bench: python3-torch).
packages+=("$@")

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
for group in "${optional_groups[@]}"; do
  want=()
  for p in $group; do
    installed "$p" || want+=("$p")
  done
  [ ${#want[@]} -gt 0 ] || continue
  echo "install-deps: installing ${want[*]} (optional: for test_slurm_real or test_containers)"
  $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" ||
    echo "install-deps: could not install ${want[*]}; the test that needs them will be skipped" >&2
done
