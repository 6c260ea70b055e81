#!/usr/bin/env bash
# Installs the Debian packages hputrain needs to build, test and run the
# demo -- only those that are missing -- then checks that every program
# and file the build and the suite rely on is really there, and says which
# one is not. Run as root (or with sudo).
#
#   install-deps.sh [PACKAGE...]   install what is missing (the build, the
#                                  tests, the optional groups), then check
#   install-deps.sh --build-only [PACKAGE...]
#                                  the build packages alone, as
#                                  deploy/Dockerfile's build stage wants them
#                                  (configure with -DHPU_TESTS=OFF)
#   install-deps.sh --bench [PACKAGE...]
#                                  also the peers make bench compares with
#                                  (PyTorch, Open MPI), checked as required
#   install-deps.sh --check GROUP...
#                                  install nothing; print what GROUP lacks
#                                  (build, test, slurm, containers, bench
#                                  or all);
#                                  exit 1 if anything is missing. The tests
#                                  that need an optional group ask this and
#                                  skip with its answer.
#
# A package installed is not enough: podman only recommends catatonit,
# which its --init runs, so a machine with podman and no catatonit fails
# every container test. Each group therefore lists what it needs, as
# programs (found on PATH, /usr/sbin and /sbin), files and Python modules
# (of Debian's /usr/bin/python3), and after the
# install every required group must have them all (else exit 1, naming
# each one), every optional one is reported with the test that will skip.
# HPU_DEPS_ROOT, for the self-test only, is prepended to every file checked
# and to /usr/sbin and /sbin.
set -euo pipefail

# What compiles the programs, libraries and models.
build=(
  build-essential cmake pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libev-dev libssl-dev
  libopenblas-dev libdnnl-dev zlib1g-dev libcjson-dev liburing-dev
  libsystemd-dev
  scdoc
)
build_needs=(
  prog:cc prog:make prog:cmake prog:pkg-config prog:protoc-c prog:scdoc
  file:/usr/include/zmq.h file:/usr/include/protobuf-c/protobuf-c.h
  file:/usr/include/ev.h file:/usr/include/openssl/hmac.h
  file:/usr/include/cjson/cJSON.h file:/usr/include/zlib.h
  file:/usr/include/liburing.h file:/usr/include/systemd/sd-daemon.h
  file:/usr/include/oneapi/dnnl/dnnl.h
)
# What the tests and the demo need besides.
testing=(
  libcmocka-dev
  clang libclang-rt-14-dev iproute2 iptables
  gnuplot-nox
  man-db
  dataset-fashion-mnist
)
test_needs=(
  file:/usr/include/cmocka.h prog:clang prog:ip prog:iptables prog:unshare prog:gnuplot prog:man
  file:/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
  file:/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz
)
# Nice to have; a failure to install these is reported, not fatal:
# a real single-node Slurm for test_slurm_real, and podman with runc
# (crun cannot run on cgroup v1 hybrid hosts), catatonit (the small init
# that podman's --init runs; podman only recommends it) and debootstrap
# (the base image, without a registry) for test_containers. Either test
# is skipped, naming what is missing, without them.
# Each group is installed on its own, so that one failing keeps the other.
slurm=(slurmctld slurmd slurm-client munge)
slurm_needs=(prog:slurmctld prog:slurmd prog:srun prog:sinfo prog:scontrol prog:squeue
  prog:scancel prog:munged)
containers=(podman runc catatonit debootstrap)
containers_needs=(prog:podman prog:runc prog:debootstrap podman-init)
optional_groups=(slurm containers)
# The peers make bench compares with (--bench): PyTorch (gloo, the CPU
# models) and Open MPI (mpirun, and mpicc for bench/mpi-allreduce).
bench=(python3-torch openmpi-bin libopenmpi-dev)
bench_needs=(prog:mpirun prog:mpicc py:torch)
declare -A used_by=([build]="the build" [test]="make test"
  [slurm]="test_slurm_real" [containers]="test_containers" [bench]="make bench")

# podman's --init runs containers.conf's init_path (the last file that
# sets it wins), /usr/libexec/podman/catatonit by default.
podman_init_path() {
  local path=/usr/libexec/podman/catatonit f v
  for f in /usr/share/containers/containers.conf /etc/containers/containers.conf \
    "${XDG_CONFIG_HOME:-$HOME/.config}/containers/containers.conf"; do
    [ -r "$f" ] || continue
    v=$(sed -n 's/^[[:space:]]*init_path[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | tail -n 1)
    [ -z "$v" ] || path=$v
  done
  echo "$path"
}

# The needs of group $1 that are not met, one line each.
group_missing() {
  local -n needs=$1_needs
  local n p
  for n in "${needs[@]}"; do
    case $n in
    prog:*)
      p=${n#prog:}
      PATH=$PATH:${HPU_DEPS_ROOT:-}/usr/sbin:${HPU_DEPS_ROOT:-}/sbin command -v "$p" >/dev/null 2>&1 || echo "program $p"
      ;;
    file:*)
      p=${HPU_DEPS_ROOT:-}${n#file:}
      [ -e "$p" ] || echo "file $p"
      ;;
    py:*)
      p=${n#py:}
      /usr/bin/python3 -c "import $p" >/dev/null 2>&1 ||
        echo "Python module $p for /usr/bin/python3"
      ;;
    podman-init)
      p=${HPU_DEPS_ROOT:-}$(podman_init_path)
      [ -x "$p" ] || echo "podman's init $p (package catatonit; podman run --init needs it)"
      ;;
    esac
  done
}

# Prints what each named group lacks; returns 1 if any group lacks anything.
check_groups() {
  local g line bad=0
  for g in "$@"; do
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      echo "install-deps: $g: missing $line (needed by ${used_by[$g]})"
      bad=1
    done < <(group_missing "$g")
  done
  return $bad
}

if [ "${1:-}" = --check ]; then
  shift
  [ $# -gt 0 ] || set -- all
  groups=()
  for g in "$@"; do
    case $g in
    all) groups+=(build test "${optional_groups[@]}") ;;
    build | test | slurm | containers | bench) groups+=("$g") ;;
    *)
      echo "install-deps: --check: unknown group '$g' (build, test, slurm, containers, bench, all)" >&2
      exit 2
      ;;
    esac
  done
  check_groups "${groups[@]}"
  exit
fi

required_groups=(build test)
if [ "${1:-}" = --build-only ]; then
  shift
  packages=("${build[@]}")
  required_groups=(build)
  optional_groups=()
else
  packages=("${build[@]}" "${testing[@]}")
  if [ "${1:-}" = --bench ]; then
    shift
    packages+=("${bench[@]}")
    required_groups+=(bench)
  fi
fi
# Extra packages for a caller that wants them (e.g. bench: python3-torch).
packages+=("$@")

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
missing_optional=()
for g in "${optional_groups[@]}"; do
  declare -n pkgs=$g
  for p in "${pkgs[@]}"; do
    installed "$p" || missing_optional+=("$p")
  done
  unset -n pkgs
done

SUDO=
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_optional[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    if [ ${#missing[@]} -eq 0 ]; then
      missing_optional=() # only optional ones are missing: not worth asking for sudo
    elif command -v sudo >/dev/null 2>&1; then
      SUDO=sudo
    else
      echo "install-deps: these packages are missing and I am not root: ${missing[*]}" >&2
      echo "install-deps: run as root: apt-get install ${missing[*]}" >&2
      exit 1
    fi
  fi
fi
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_optional[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  for g in "${optional_groups[@]}"; do
    declare -n pkgs=$g
    want=()
    for p in "${pkgs[@]}"; do
      installed "$p" || want+=("$p")
    done
    unset -n pkgs
    [ ${#want[@]} -gt 0 ] || continue
    echo "install-deps: installing ${want[*]} (optional: for ${used_by[$g]})"
    $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" ||
      echo "install-deps: could not install ${want[*]}; ${used_by[$g]} will be skipped" >&2
  done
fi

# Installed is not enough: every program and file must be there.
if ! check_groups "${required_groups[@]}" >&2; then
  echo "install-deps: the packages above are installed but these are missing; nothing will build or test until they are there" >&2
  exit 1
fi
for g in "${optional_groups[@]}"; do
  check_groups "$g" >&2 || echo "install-deps: ${used_by[$g]} will be skipped, naming what is missing" >&2
done
exit 0
