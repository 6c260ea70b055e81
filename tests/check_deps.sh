#!/bin/bash
# check_deps: deploy/install-deps.sh ran before the build (make test runs
# it), so every program and file of the required groups (build, test) must
# be there: `install-deps.sh --check build test` names any that is not. The
# optional groups (slurm, containers) are reported, not failed: their tests
# skip with the same answer.
#
# usage: check_deps.sh [--self-test] SOURCE_DIR
#   --self-test: the check must also catch, naming it, podman's init missing
#   (a root with no catatonit), a program of a group missing from PATH, and
#   an init_path that containers.conf moves elsewhere.
set -u
. "$(dirname "$0")/selftest.sh"
self=0
[[ ${1:-} == --self-test ]] && { self=1; shift; }
src=${1:?usage: check_deps.sh [--self-test] SOURCE_DIR}
deps=$src/deploy/install-deps.sh
fails=0

if out=$(bash "$deps" --check build test 2>&1); then
	echo "check_deps: the build's and the tests' programs and files are all there"
else
	echo "$out"
	echo "check_deps: FAILED: install-deps.sh installed the packages but the above are missing"
	fails=1
fi
for g in slurm containers; do
	if out=$(bash "$deps" --check "$g" 2>&1); then
		echo "check_deps: optional group $g: complete"
	else
		echo "check_deps: optional group $g is incomplete (its test skips):"
		echo "$out"
	fi
done
[[ $self == 1 ]] || exit $fails

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A machine whose podman and runc are there (stand-ins on PATH) but whose
# root has no catatonit: the fresh machine of issue 32.
mkdir -p "$tmp/bin" "$tmp/root" "$tmp/home/.config/containers"
for p in podman runc debootstrap; do
	printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/$p"
	chmod +x "$tmp/bin/$p"
done
for p in bash sed tail cat; do ln -s "$(command -v $p)" "$tmp/bin/$p"; done
run() { env -i PATH="$tmp/bin" HOME="$tmp/home" "$@" 2>&1; }
expect_caught check_deps "podman's init missing" \
	"containers: missing podman's init $tmp/root/usr/libexec/podman/catatonit" \
	run HPU_DEPS_ROOT="$tmp/root" bash "$deps" --check containers || fails=1
# With catatonit in that root the group is complete...
mkdir -p "$tmp/root/usr/libexec/podman"
printf '#!/bin/sh\n' >"$tmp/root/usr/libexec/podman/catatonit"
chmod +x "$tmp/root/usr/libexec/podman/catatonit"
if ! o=$(run HPU_DEPS_ROOT="$tmp/root" bash "$deps" --check containers); then
	echo "check_deps: self-test FAILED: a complete containers group was refused: $o"
	fails=1
fi
# ...until containers.conf points podman's init somewhere else.
printf '[containers]\ninit_path = "/opt/init/tini"\n' >"$tmp/home/.config/containers/containers.conf"
expect_caught check_deps "init_path of containers.conf" \
	"missing podman's init $tmp/root/opt/init/tini" \
	run HPU_DEPS_ROOT="$tmp/root" bash "$deps" --check containers || fails=1
rm "$tmp/home/.config/containers/containers.conf"
# A program of a group missing from PATH.
rm "$tmp/bin/runc"
expect_caught check_deps "runc missing" "containers: missing program runc (needed by test_containers)" \
	run HPU_DEPS_ROOT="$tmp/root" bash "$deps" --check containers || fails=1
expect_caught check_deps "slurmd missing" "slurm: missing program slurmd (needed by test_slurm_real)" \
	run HPU_DEPS_ROOT="$tmp/root" bash "$deps" --check slurm || fails=1
expect_caught check_deps "an unknown group" "unknown group 'podman'" \
	bash -c "bash '$deps' --check podman 2>&1; [ \$? = 2 ] && exit 1" || fails=1
exit $fails
