#!/bin/bash
# check_names.sh BUILD_DIR SOURCE_DIR: the prefix says public or internal
# (issue 33, "Internal names"; ARCHITECTURE.md's naming rule, libuv's).
#
# nm over every static library (lib*.a) and every program built from a
# product folder (common proto collectives options ckpt agent worker tools
# launcher daemon; not examples/, bench/ or tests/: a model's, a
# benchmark's or a test's own names are not the runtime's). Every defined
# non-static name must be one of:
#
#   - public API: declared `HPU_API` in include/hpu/*.h (hpu.h, ops.h,
#     layers.h, coll.h; read the way check_exports.sh reads them);
#   - internal: hpu__*, hpucoll__*, or a module's hpuX__* (hpud__*);
#   - allowed: main, the model entry point the ABI names
#     (HPU_MODEL_ENTRY_SYMBOL in hpu.h), protobuf-c's generated code
#     (the names defined by proto's *.pb-c.c objects), and the C
#     run-time's and libgcc's own (_start, _init, __bss_start, __cpu_model
#     of target_clones, ...; a name with '@' is a shared library's copy),
#     and the sanitizers' (__asan_*, __odr_asan*, __local_asan_preinit,
#     __ubsan_*, __lsan_*, __sanitizer_*: make test-asan's build).
#
# A compiler-made name with a suffix (hpu__sumsq.resolver of target_clones)
# counts as its base name.
#
# Anything else is listed, with the library or program it is in, and fails
# the check. Before the real check, an object compiled with cc holding a
# bad global name (and a good internal and a static one) is run through
# the same test and must be caught, so the check cannot pass blind.
set -u
build=${1:?usage: check_names.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: check_names.sh BUILD_DIR SOURCE_DIR}
build=$(cd "$build" && pwd -P) || exit 2
src=$(cd "$src" && pwd -P) || exit 2
PRODUCT="common proto collectives options ckpt agent worker tools launcher daemon"
INTERNAL='^hpu[a-z]*__[A-Za-z0-9]'
CRT='^(_start|_init|_fini|_edata|_end|__bss_start|__data_start|data_start|__dso_handle|_IO_stdin_used|__TMC_END__|__libc_csu_init|__libc_csu_fini|_dl_relocate_static_pie|__GNU_EH_FRAME_HDR|__cpu_model|__cpu_features2|__(local_)?asan_[A-Za-z0-9_]*|__odr_asan[A-Za-z0-9_.]*|__ubsan_[A-Za-z0-9_]*|__lsan_[A-Za-z0-9_]*|__sanitizer_[A-Za-z0-9_]*)$'

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# The names declared `HPU_API ... name(` in the given headers (as
# check_exports.sh reads them: each declaration joined up to its '(').
declared()
{
	local h
	for h in "$@"; do
		awk '/^HPU_API /{d=""; on=1} on{d=d" "$0; if (index($0, "(")) {print d; on=0}}' "$h" |
			sed -E 's/^[^(]*[^A-Za-z0-9_(]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\(.*/\1/'
	done | sort -u
}

# defined FILE: "name<TAB>FILE" for each defined non-static name of an
# object, archive or program.
defined()
{
	nm -g --defined-only "$1" 2>/dev/null | awk -v f="${1#"$build"/}" \
		'NF >= 3 && $3 !~ /@/ {sub(/\..*/, "", $3); print $3 "\t" f}'
}

# bad LIST ALLOW: the lines of LIST (name<TAB>where) whose name is neither
# internal nor in the file ALLOW (one name a line).
bad()
{
	awk -F'\t' -v internal="$INTERNAL" -v crt="$CRT" \
		'NR == FNR {ok[$1]; next} !($1 in ok) && $1 !~ internal && $1 !~ crt' "$2" "$1" |
		sort -u
}

# The allowed names: the public API, main, the model entry point and the
# generated protobuf-c names.
inc=$src/include/hpu
declared "$inc"/*.h >"$tmp/allow"
for n in hpu_strerror hpu_linear_backward hpucoll_comm_init_env; do
	grep -qx "$n" "$tmp/allow" || { echo "check_names: the header parser missed $n" >&2; exit 2; }
done
echo main >>"$tmp/allow"
sed -n 's/^#define HPU_MODEL_ENTRY_SYMBOL "\([A-Za-z_0-9]*\)".*/\1/p' "$inc/hpu.h" >>"$tmp/allow"
for o in $(find "$build/proto" -name '*.pb-c.c.o'); do
	nm -g --defined-only "$o" | awk 'NF >= 3 {print $3}' >>"$tmp/allow"
done

# Self-test: a bad global function and a bad global variable must be
# caught; the internal, the public and the static names must not.
cat >"$tmp/planted.c" <<'EOF'
int check_names_planted_bad(void) { return 1; }
int hpu_planted_global = 1;
int hpu__planted_ok(void) { return 2; }
static int planted_static(void) { return 3; }
int hpu_strerror(void) { return planted_static(); }
EOF
cc -c -o "$tmp/planted.o" "$tmp/planted.c" ||
	{ echo "check_names: self-test: cc cannot compile the planted object" >&2; exit 2; }
defined "$tmp/planted.o" >"$tmp/planted.list"
bad "$tmp/planted.list" "$tmp/allow" | cut -f1 >"$tmp/planted.bad"
if [ "$(tr '\n' ' ' <"$tmp/planted.bad")" != "check_names_planted_bad hpu_planted_global " ]; then
	echo "check_names: self-test FAILED: the planted object's bad names were not caught" \
	     "as expected; it found: $(tr '\n' ' ' <"$tmp/planted.bad")" >&2
	exit 1
fi
echo "check_names: self-test: caught check_names_planted_bad, hpu_planted_global"

# Every static library and program of the product folders.
: >"$tmp/targets"
for d in $PRODUCT; do
	[ -d "$build/$d" ] || continue
	find "$build/$d" -name 'lib*.a' >>"$tmp/targets"
	for t in $(find "$build/$d" -path '*/CMakeFiles/*.dir' -prune -name '*.dir' -printf '%f\n'); do
		t=${t%.dir}
		[ -f "$build/bin/$t" ] && [ -x "$build/bin/$t" ] && echo "$build/bin/$t" >>"$tmp/targets"
	done
done
sort -u -o "$tmp/targets" "$tmp/targets"
for p in hpulaunch hpud hpu-worker hpu-ckpt; do
	grep -qx "$build/bin/$p" "$tmp/targets" ||
		{ echo "check_names: $build/bin/$p is missing: build it first" >&2; exit 2; }
done
: >"$tmp/names"
while read -r f; do
	defined "$f" >>"$tmp/names"
done <"$tmp/targets"
bad "$tmp/names" "$tmp/allow" >"$tmp/bad"
if [ -s "$tmp/bad" ]; then
	echo "check_names: $(cut -f1 "$tmp/bad" | sort -u | wc -l) non-static name(s) are neither" \
	     "public API (HPU_API in include/hpu/) nor internal (hpu__, hpucoll__, hpuX__):" >&2
	awk -F'\t' '{w[$1] = w[$1] (w[$1] == "" ? "" : ", ") $2} END {for (n in w) print "  " n " (" w[n] ")"}' \
		"$tmp/bad" | sort >&2
	exit 1
fi
echo "check_names: $(wc -l <"$tmp/targets") libraries and programs," \
     "$(cut -f1 "$tmp/names" | sort -u | wc -l) non-static names: all public or internal"
