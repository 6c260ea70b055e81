#!/bin/bash
# check_exports.sh BUILD_DIR SOURCE_DIR: the shared libraries export their
# public API and nothing else (issue 17, "What a library user should see").
#
#   libhpu.so      exports exactly the HPU_API declarations of
#                  include/hpu/hpu.h, ops.h, layers.h and data.h;
#   libhpucoll.so  exactly those of include/hpu/coll.h;
#   hpu-worker     exports the same hpu_* names as libhpu.so (a model's
#                  calls resolve to the worker's one copy of the runtime).
#
# Both directions: a defined dynamic symbol that no header declares with
# HPU_API is a leak (an internal hpu__ or hpucoll__ name, protobuf-c code
# linked in), and a declaration that is not exported is a model that
# fails to load. The version nodes (HPU_0, HPUCOLL_0) are not names.
# Before the real check, the comparison is run on a list with one name
# leaked and one missing, and must fail on both, so it cannot pass blind.
set -u
build=${1:?usage: check_exports.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: check_exports.sh BUILD_DIR SOURCE_DIR}
fail=0

# The names declared `HPU_API ... name(` in the given headers. A
# declaration starts its line with "HPU_API " (as worker/runtime's export
# list reads them); any other line naming HPU_API, but the deprecated
# HPU_EXPORT alias and the entry symbol HPU_MODEL defines (extern "C" in
# C++), is refused
# rather than skipped.
declared()
{
	local h odd
	for h in "$@"; do
		odd=$(grep -n 'HPU_API' "$h" | grep -v ':HPU_API ' |
		      grep -v ':#define HPU_EXPORT HPU_API' |
		      grep -Ev ':[[:space:]]+(extern "C" )?HPU_API const hpu_model hpu_model_entry = \{')
		if [ -n "$odd" ]; then
			echo "check_exports: $h: HPU_API not at a declaration's start:" >&2
			echo "$odd" >&2
			return 1
		fi
		# join each declaration up to its '(' and keep the identifier before it
		awk '/^HPU_API /{d=""; on=1} on{d=d" "$0; if (index($0, "(")) {print d; on=0}}' "$h" |
			sed -E 's/^[^(]*[^A-Za-z0-9_(]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*/\1/'
	done | sort -u
}

# The defined dynamic symbols of an ELF file, without version suffixes,
# without the version nodes; with a prefix pattern, only those names.
exported()
{
	nm -D --defined-only "$1" | awk '{print $NF}' | sed 's/@.*//' |
		grep -Ev '^(HPU_0|HPUCOLL_0)$' | grep -E "${2:-.}" | sort -u
}

# compare WHAT WANT_FILE GOT_FILE [WANT_NAME]: the two lists must be
# equal; says which names are extra (leaked) and which are missing.
compare()
{
	local what=$1 ref=${4:-"the HPU_API declarations"} extra missing
	extra=$(comm -13 "$2" "$3")
	missing=$(comm -23 "$2" "$3")
	if [ -n "$extra" ]; then
		echo "check_exports: $what exports names not among $ref:" >&2
		echo "$extra" | sed 's/^/  /' >&2
	fi
	if [ -n "$missing" ]; then
		echo "check_exports: $what does not export these of $ref:" >&2
		echo "$missing" | sed 's/^/  /' >&2
	fi
	[ -z "$extra" ] && [ -z "$missing" ]
}

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
inc=$src/include/hpu
declared "$inc/hpu.h" "$inc/ops.h" "$inc/layers.h" "$inc/data.h" >"$tmp/hpu.want" || exit 1
declared "$inc/coll.h" >"$tmp/coll.want" || exit 1
for f in hpu coll; do
	if [ ! -s "$tmp/$f.want" ]; then
		echo "check_exports: no HPU_API declaration found for $f" >&2
		exit 1
	fi
done
# Spot checks of the parser: a one-line, a multi-line and a pointer-
# returning declaration.
for n in hpu_strerror hpu_layer_add hpu_linear hpu_linear_backward; do
	grep -qx "$n" "$tmp/hpu.want" || { echo "check_exports: parser missed $n" >&2; exit 1; }
done
grep -qx hpucoll_comm_init_env "$tmp/coll.want" ||
	{ echo "check_exports: parser missed hpucoll_comm_init_env" >&2; exit 1; }

# Self-test: a leaked name and a missing one must each fail the comparison.
{ cat "$tmp/hpu.want"; echo hpu__leaked; } | sort >"$tmp/leak"
sed 1d "$tmp/hpu.want" >"$tmp/short"
if compare "self-test (leak)" "$tmp/hpu.want" "$tmp/leak" 2>/dev/null ||
   compare "self-test (missing)" "$tmp/hpu.want" "$tmp/short" 2>/dev/null; then
	echo "check_exports: self-test: the comparison passed a wrong list" >&2
	exit 1
fi

for f in "$build/lib/libhpu.so" "$build/lib/libhpucoll.so" "$build/bin/hpu-worker"; do
	[ -e "$f" ] || { echo "check_exports: $f is missing: build it first" >&2; exit 1; }
done
exported "$build/lib/libhpu.so" >"$tmp/hpu.got"
exported "$build/lib/libhpucoll.so" >"$tmp/coll.got"
exported "$build/bin/hpu-worker" '^hpu_' >"$tmp/worker.got"
compare libhpu.so "$tmp/hpu.want" "$tmp/hpu.got" || fail=1
compare libhpucoll.so "$tmp/coll.want" "$tmp/coll.got" || fail=1
compare "hpu-worker" "$tmp/hpu.got" "$tmp/worker.got" "libhpu.so's names" || fail=1
if [ $fail = 0 ]; then
	echo "check_exports: libhpu.so $(wc -l <"$tmp/hpu.got") names, libhpucoll.so" \
	     "$(wc -l <"$tmp/coll.got") names, hpu-worker $(wc -l <"$tmp/worker.got") hpu_* names: all public, all exported"
fi
exit $fail
