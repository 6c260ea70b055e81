#!/bin/bash
# The include rules of ARCHITECTURE.md, checked on the headers the compiler
# really reads. Every product source (common proto collectives options ckpt
# agent worker tools launcher daemon examples; not tests/ or bench/) is run
# through its own compile command from BUILD/compile_commands.json with
# -MM, which lists
# every header it reads, the headers' own includes too, found the way the
# build finds them; each header's folder must be one the source's folder
# may use, and of a folder in OPEN only the headers it opens to others.
#
#   check_includes.sh BUILD               check every product source
#   check_includes.sh --self-test BUILD   that, then the same check on a
#       copy of a source with a forbidden include put in must fail, naming
#       the header and the rule (so that a check that sees nothing fails)
#   check_includes.sh --as SRC FILE BUILD check FILE as if it were SRC
#       (SRC's command, folder and rule); the self-test's way in
#
# Exit status: 0 when every include is allowed, 1 when one is not (a line
# per include: the source, the header, the rule), 2 when the check cannot
# run (no compile_commands.json, a command that fails, no rule for a
# folder).
set -u -f -o pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd -P)
PRODUCT="common proto collectives options ckpt agent worker tools launcher daemon examples"

# What each folder may include, its own folder aside: one line per folder
# (a folder of worker/ counts on its own), the
# arrows of ARCHITECTURE.md. include/ is the public API (<hpu/...>).
declare -A ALLOW=(
	[common]=""
	[proto]="common"
	[collectives]="proto common include"
	[worker/ops]="common include"
	[worker/layers]="include"
	[worker/hpu]="worker/ops common include"
	[worker/device]="worker/hpu worker/ops common include"
	[worker/cuda]="worker/device worker/hpu worker/ops common include"
	[options]="common include"
	[ckpt]="options common include"
	[agent]="proto common include"
	[worker/strategy]="worker/device worker/hpu worker/ops options ckpt common include"
	[worker/runtime]="worker/strategy worker/device worker/hpu worker/ops options ckpt proto common include"
	[tools]="ckpt options common include"
	[launcher]="agent options proto common include"
	[daemon]="agent proto common include"
	[examples]="include"
	[include]=""
)

# A folder whose headers are not all for others: the ones other folders
# may read (the rest are the folder's own). The strategy engine's internals
# (strategy_impl.h, its modules' headers) stay inside worker/strategy;
# strategy.h brings the plan's types (plan.h, copies.h) with it. The
# checkpoint format's shared internals (ckpt_impl.h) stay inside ckpt/,
# the device's and devmem's (device_impl.h, devmem_impl.h) inside
# worker/device and worker/hpu, the builder's (model_impl.h) inside
# worker/hpu, the option table's and the config file's
# (config_internal.h) inside options/, and the agent's state and its
# files' internals (agent_impl.h) inside agent/.
declare -A OPEN=(
	[worker/strategy]="strategy.h plan.h copies.h"
	[ckpt]="ckpt.h safetensors.h"
	[worker/device]="device.h"
	[worker/hpu]="devmem.h model.h prof.h dataio.h"
	[options]="config.h"
	[agent]="agent.h coord.h gpus.h nodejob.h output.h progress.h restart.h uidproc.h zwatch.h"
)

die() {
	echo "check_includes: $*" >&2
	exit 2
}

# The folder a path inside the tree belongs to, for the table above:
# worker/ops/fp8.h -> worker/ops, agent/coord.h -> agent,
# examples/common/fmnist.h -> examples, proto/hpu.pb-c.h (generated) -> proto.
folder_of() {
	local rel=$1
	case $rel in
	worker/*/*) echo "${rel%%/*}/$(echo "$rel" | cut -d/ -f2)" ;;
	*/*) echo "${rel%%/*}" ;;
	*) echo . ;;
	esac
}

# The rule ARCHITECTURE.md states for this pair, in its words.
rule_for() {
	local from=$1 to=$2
	case $to in daemon) echo "nothing includes daemon/"; return ;; esac
	case $from:$to in
	collectives:worker* | collectives:launcher* | collectives:daemon*)
		echo "collectives/ includes nothing of worker/, launcher/, daemon/" ;;
	worker/*:launcher* | worker/*:daemon*)
		echo "worker/ includes nothing of launcher/ or daemon/" ;;
	common:* | proto:* | collectives:* | options:* | ckpt:* | agent:*)
		case $to in worker* | launcher | tools)
			echo "a library ($from/) includes no program's folder ($to/)"; return ;;
		esac
		echo "$from/ may include only $from/${ALLOW[$from]:+ }$(echo "${ALLOW[$from]}" | sed 's#\([^ ]*\)#\1/#g')" ;;
	examples:*)
		echo "examples include only include/ (and examples/common/)" ;;
	*)
		echo "$from/ may include only $from/${ALLOW[$from]:+ }$(echo "${ALLOW[$from]}" | sed 's#\([^ ]*\)#\1/#g')" ;;
	esac
}

# The compile commands as lines "FILE<tab>DIRECTORY<tab>COMMAND". CMake
# writes one key per line, so awk reads them without a JSON parser.
commands() {
	awk '
	function val(s) {
		sub(/^[^:]*: "/, "", s); sub(/",?[ \t\r]*$/, "", s)
		gsub(/\\\\/, "\001", s); gsub(/\\"/, "\"", s); gsub(/\001/, "\\", s)
		return s
	}
	/^[ \t]*"directory":/ { d = val($0) }
	/^[ \t]*"command":/   { c = val($0) }
	/^[ \t]*"file":/      { f = val($0) }
	/^[ \t]*}/ { if (f != "" && c != "") print f "\t" d "\t" c; f = c = d = "" }
	' "$1"
}

# The tree-relative path of a file (build outputs relative to the build
# directory), or nothing for a file outside both (a system header).
relpath() {
	case $1 in
	"$BUILD"/*) echo "${1#"$BUILD"/}" ;;
	"$SRC"/*) echo "${1#"$SRC"/}" ;;
	esac
}

# check FILE DIR COMMAND AS: runs COMMAND (which compiles AS) on FILE with
# -MM and checks every header it reads against AS's folder. Prints one
# line per forbidden include; returns 1 if any, 2 if the command fails.
check_one() {
	local file=$1 dir=$2 cmd=$3 as=$4
	local rel from deps hdr hrel to bad=0
	rel=$(relpath "$as")
	from=$(folder_of "$rel")
	[[ -v ALLOW[$from] ]] || { echo "check_includes: no rule for $from/ ($rel): add it to" \
		"tests/check_includes.sh and ARCHITECTURE.md"; return 2; }
	# Dependencies to stdout: no object file, no depfile of the build's own.
	cmd=$(sed -E 's/ -o +[^ ]+/ /; s/ -M[TQF] +[^ ]+/ /g; s/ -MM?D( |$)/ /g' <<<"$cmd")
	if [[ $file != "$as" ]]; then
		cmd="${cmd/" $as"/" $file"} -iquote $(dirname "$as")"
	fi
	if ! deps=$(cd "$dir" && eval "$cmd -MM" 2>/dev/null); then
		printf 'check_includes: cannot list the headers of %s:\n%s\n' "$rel" \
			"$(cd "$dir" && eval "$cmd -MM" 2>&1 >/dev/null)"
		return 2
	fi
	deps=$(sed -e 's/\\$//' -e 's/^[^:]*://' <<<"$deps" | tr ' ' '\n' | sed '/^$/d' | tail -n +2)
	[[ -z $deps ]] && return 0
	while read -r hdr; do
		hrel=$(relpath "$hdr")
		[[ -z $hrel ]] && continue
		to=$(folder_of "$hrel")
		[[ $to == "$from" ]] && continue
		if [[ " ${ALLOW[$from]} " == *" $to "* ]]; then
			[[ ! -v OPEN[$to] || " ${OPEN[$to]} " == *" ${hrel##*/} "* ]] && continue
			echo "check_includes: $rel reads $hrel: forbidden ($to/'s own header: other" \
				"folders include only $(echo "${OPEN[$to]}" | sed "s#\([^ ]*\)#$to/\1#g"))"
			bad=1
			continue
		fi
		echo "check_includes: $rel reads $hrel: forbidden ($(rule_for "$from" "$to"))"
		bad=1
	done < <(cd "$dir" && realpath -m -- $deps)
	return $bad
}

# Every product source in compile_commands.json; each one must be there
# (a product .c the build does not compile would go unchecked).
check_all() {
	local list f d c n=0 rc=0 out
	list=$(commands "$BUILD/compile_commands.json" | sort -u) || exit 2
	for f in $(cd "$SRC" && find $PRODUCT -name '*.c' | sort); do
		# worker/cuda is built only where the CUDA toolkit is, and never
		# in the sanitizers' build: one that did not configure it skips it
		if [[ $f == worker/cuda/* && ! -d $BUILD/worker/cuda ]]; then
			[[ -n ${cuda_said:-} ]] ||
				echo "check_includes: worker/cuda: not built in this build (the CUDA device is optional): skipped"
			cuda_said=1
			continue
		fi
		grep -q "^$SRC/$f	" <<<"$list" ||
			die "$f has no compile command in $BUILD/compile_commands.json (is it built?)"
	done
	local tmp
	tmp=$(mktemp -d) || exit 2
	# Two at a time: the preprocessor is most of the cost.
	while IFS=$'\t' read -r f d c; do
		local rel top
		rel=$(relpath "$f")
		top=${rel%%/*}
		[[ " $PRODUCT " == *" $top "* ]] || continue
		n=$((n + 1))
		( check_one "$f" "$d" "$c" "$f" >"$tmp/$n.out"; echo $? >"$tmp/$n.rc" ) &
		(( n % 2 == 0 )) && wait
	done <<<"$list"
	wait
	(( n > 0 )) || die "no product source in $BUILD/compile_commands.json"
	for ((i = 1; i <= n; i++)); do
		cat "$tmp/$i.out"
		out=$(cat "$tmp/$i.rc")
		(( out > rc )) && rc=$out
	done
	rm -rf "$tmp"
	(( rc == 0 )) && echo "check_includes: $n product sources, every header they read is allowed"
	return $rc
}

# --as SRC FILE: FILE checked with SRC's compile command and rule.
check_as() {
	local as=$1 file=$2 line f d c
	line=$(commands "$BUILD/compile_commands.json" | grep "^$as	") ||
		die "$as has no compile command"
	line=${line%%$'\n'*}
	IFS=$'\t' read -r f d c <<<"$line"
	check_one "$file" "$d" "$c" "$as"
}

# A forbidden include put into a copy of a source must be caught, with the
# header and the rule named; a direct one and one reached only through
# another header.
self_test() {
	local tmp out rc ok=0
	tmp=$(mktemp -d) || exit 2
	trap 'rm -rf "$tmp"' RETURN
	# collectives/ -> worker/ops/, written as a path relative to the source
	{ echo '#include "../worker/ops/fp8.h"'; cat "$SRC/collectives/reduce.c"; } >"$tmp/reduce.c"
	# examples/ -> a header of its own that includes worker/hpu/model.h
	mkdir "$tmp/ex"
	echo "#include \"$SRC/worker/hpu/model.h\"" >"$tmp/ex/sneaky.h"
	{ echo "#include \"$tmp/ex/sneaky.h\""; cat "$SRC/examples/fmnist_mlp/fmnist_mlp.c"; } >"$tmp/ex/mlp.c"
	# ckpt/ (a library) -> launcher/ (a program's folder)
	{ echo "#include \"$SRC/launcher/hostfile.h\""; cat "$SRC/ckpt/open.c"; } >"$tmp/open.c"
	# tools/ -> the checkpoint format's own header
	{ echo '#include "ckpt/ckpt_impl.h"'; cat "$SRC/tools/hpu_ckpt.c"; } >"$tmp/hpu_ckpt.c"
	# worker/runtime/ -> the strategy engine's own header
	{ echo '#include "worker/strategy/strategy_impl.h"'; cat "$SRC/worker/runtime/train.c"; } >"$tmp/train.c"
	# daemon/ -> the agent's own header
	{ echo '#include "agent/agent_impl.h"'; cat "$SRC/daemon/launch.c"; } >"$tmp/launch.c"
	local -a cases=(
		"$SRC/worker/runtime/train.c|$tmp/train.c|worker/runtime/train.c reads worker/strategy/strategy_impl.h: forbidden (worker/strategy/'s own header: other folders include only worker/strategy/strategy.h worker/strategy/plan.h worker/strategy/copies.h)"
		"$SRC/daemon/launch.c|$tmp/launch.c|daemon/launch.c reads agent/agent_impl.h: forbidden (agent/'s own header: other folders include only agent/agent.h agent/coord.h agent/gpus.h agent/nodejob.h agent/output.h agent/progress.h agent/restart.h agent/uidproc.h agent/zwatch.h)"
		"$SRC/collectives/reduce.c|$tmp/reduce.c|collectives/reduce.c reads worker/ops/fp8.h: forbidden (collectives/ includes nothing of worker/"
		"$SRC/examples/fmnist_mlp/fmnist_mlp.c|$tmp/ex/mlp.c|examples/fmnist_mlp/fmnist_mlp.c reads worker/hpu/model.h: forbidden (examples include only include/"
		"$SRC/ckpt/open.c|$tmp/open.c|ckpt/open.c reads launcher/hostfile.h: forbidden (a library (ckpt/) includes no program's folder (launcher/)"
		"$SRC/tools/hpu_ckpt.c|$tmp/hpu_ckpt.c|tools/hpu_ckpt.c reads ckpt/ckpt_impl.h: forbidden (ckpt/'s own header: other folders include only ckpt/ckpt.h ckpt/safetensors.h)"
	)
	local c as file want
	for c in "${cases[@]}"; do
		IFS='|' read -r as file want <<<"$c"
		out=$(check_as "$as" "$file")
		rc=$?
		if [[ $rc == 1 && $out == *"$want"* ]]; then
			echo "check_includes: self-test: caught: ${out%%$'\n'*}"
		else
			echo "check_includes: self-test FAILED: a forbidden include in a copy of" \
				"${as#"$SRC"/} was not caught as expected (exit $rc, wanted 1 and" \
				"\"$want\"); it said:"
			echo "$out"
			ok=1
		fi
	done
	return $ok
}

mode=check
case ${1:-} in
--self-test) mode=self; shift ;;
--as) mode=as; AS=$2 FILE=$3; shift 3 ;;
esac
[[ $# == 1 ]] || die "usage: check_includes.sh [--self-test | --as SRC FILE] BUILD"
BUILD=$(cd "$1" && pwd -P) || die "no build directory $1"
[[ -f $BUILD/compile_commands.json ]] ||
	die "no $BUILD/compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS is set in CMakeLists.txt: run cmake)"

case $mode in
check) check_all ;;
as) check_as "$(realpath -m "$AS")" "$(realpath -m "$FILE")" ;;
self)
	check_all
	rc=$?
	self_test || rc=1
	exit $rc
	;;
esac
