#!/bin/bash
# No circles between the files of a folder. For each folder below, the
# file-level graph "calls a function defined in" is read from the build's
# object files: a file A calls a file B when one of A's undefined symbols
# (nm: U) is a function B defines (nm: T or W). The objects of every
# target of the folder (its library and, for a program, its main) form one
# graph. Two files that call each other, directly or through a longer
# cycle, fail the check, which names the cycle and the functions on each
# of its arrows.
#
# worker/strategy's files (the strategy engine and its placement plan)
# stand in layers (strategy_impl.h says which calls which).
#
#   check_circles.sh BUILD               check every folder of FOLDERS
#   check_circles.sh --self-test BUILD   that, then planted objects (two
#       files that call each other, three in a ring) compiled with cc in a
#       temporary folder must fail, naming their cycle, and a one-way chain
#       must pass (so that a check that sees nothing fails)
#   check_circles.sh --objs NAME OBJ...  check the given objects as one
#       folder called NAME; the self-test's way in
#
# Exit status: 0 when no folder has a circle, 1 when one has (a line per
# circle, then one per arrow in it), 2 when the check cannot run (no build,
# a folder without objects, nm failing).
set -u -f -o pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd -P)
FOLDERS="common collectives options worker/ops worker/layers worker/hpu worker/device worker/cuda worker/strategy worker/runtime agent ckpt daemon launcher tools"

die() {
	echo "check_circles: $*" >&2
	exit 2
}

# symbols NODE OBJ: "D NODE SYM" for each function OBJ defines, "U NODE SYM"
# for each symbol it needs from elsewhere.
symbols() {
	local node=$1 obj=$2 out
	out=$(nm "$obj") || die "nm cannot read $obj"
	awk -v n="$node" '
	$1 == "U" { print "U", n, $2; next }
	NF == 3 && $2 ~ /^[TWi]$/ { print "D", n, $3 }
	' <<<"$out"
}

# graph NAME: reads symbols() lines on stdin; prints the circles of the
# graph, or a line saying there is none. Returns 1 on a circle.
graph() {
	awk -v name="$1" '
	$1 == "D" { if (!($3 in def)) def[$3] = $2; node[$2] = 1; next }
	$1 == "U" { node[$2] = 1; need[++nu] = $2 SUBSEP $3; next }
	END {
		n = 0
		for (v in node) names[++n] = v
		# a fixed order, so the output does not change between runs
		for (i = 2; i <= n; i++)
			for (j = i; j > 1 && names[j - 1] > names[j]; j--) {
				t = names[j]; names[j] = names[j - 1]; names[j - 1] = t
			}
		for (i = 1; i <= n; i++) idx[names[i]] = i
		ne = 0
		for (k = 1; k <= nu; k++) {
			split(need[k], p, SUBSEP)
			if (!(p[2] in def) || def[p[2]] == p[1]) continue
			a = idx[p[1]]; b = idx[def[p[2]]]
			if (!((a, b) in edge)) { edge[a, b] = 1; ne++; syms[a, b] = p[2]; cnt[a, b] = 1 }
			else if (index(" " syms[a, b] " ", " " p[2] " ") == 0) {
				if (++cnt[a, b] <= 3) syms[a, b] = syms[a, b] " " p[2]
			}
		}
		for (i = 1; i <= n; i++) for (j = 1; j <= n; j++) reach[i, j] = ((i, j) in edge)
		for (k = 1; k <= n; k++) for (i = 1; i <= n; i++) if (reach[i, k])
			for (j = 1; j <= n; j++) if (reach[k, j]) reach[i, j] = 1
		bad = 0
		for (i = 1; i <= n; i++) {
			if (done[i] || !reach[i, i]) continue
			# i and everything it reaches and is reached by: one circle
			m = 0
			for (j = 1; j <= n; j++) if (reach[i, j] && reach[j, i]) { comp[++m] = j; done[j] = 1; in_c[j] = i }
			# the shortest cycle through any of them, by breadth first
			best = ""
			for (s = 1; s <= m; s++) {
				c = shortest(comp[s], i)
				if (best == "" || split(c, q1, " ") < split(best, q2, " ")) best = c
			}
			line = ""
			k = split(best, q, " ")
			for (j = 1; j <= k; j++) line = line names[q[j]] " -> "
			line = line names[q[1]]
			printf "check_circles: %s: circle %s", name, line
			if (m > k) printf " (%d files in all)", m
			printf "\n"
			for (a = 1; a <= n; a++) for (b = 1; b <= n; b++)
				if ((a, b) in edge && in_c[a] == i && in_c[b] == i)
					printf "check_circles:   %s calls %s: %s%s\n", names[a], names[b], syms[a, b], (cnt[a, b] > 3 ? " ..." : "")
			bad = 1
		}
		if (!bad) printf "check_circles: %s: %d files, %d arrows, no circle\n", name, n, ne
		exit bad
	}
	# The nodes of a shortest cycle from s back to s inside circle c,
	# space separated, starting with s.
	function shortest(s, c,    head, tail, qq, v, w, from, seen, path) {
		delete seen; delete from
		head = 1; tail = 0
		for (w = 1; w <= n; w++) if ((s, w) in edge && in_c[w] == c) {
			if (w == s) return s
			if (!(w in seen)) { seen[w] = 1; from[w] = s; qq[++tail] = w }
		}
		while (head <= tail) {
			v = qq[head++]
			if ((v, s) in edge) {
				path = ""
				for (w = v; w != s; w = from[w]) path = w " " path
				return s " " path
			}
			for (w = 1; w <= n; w++) if ((v, w) in edge && in_c[w] == c && !(w in seen)) {
				seen[w] = 1; from[w] = v; qq[++tail] = w
			}
		}
		return s
	}
	'
}

# check_objs NAME OBJ...: the objects as one folder; each node named by its
# file name without .o.
check_objs() {
	local name=$1 o
	shift
	for o in "$@"; do
		symbols "$(basename "${o%.o}")" "$o" || exit 2
	done | graph "$name"
}

# check_folder F: every object of every target built from folder F; a
# node is the source's path (collectives/comm.c).
check_folder() {
	local f=$1 o rel objs
	# worker/cuda is built only where the CUDA toolkit is, and never in
	# the sanitizers' build: a build that did not configure it skips it
	if [[ $f == worker/cuda && ! -d $BUILD/$f ]]; then
		echo "check_circles: $f: not built in this build (the CUDA device is optional): skipped"
		return 0
	fi
	[[ -d $BUILD/$f/CMakeFiles ]] || die "no $BUILD/$f/CMakeFiles (is $f/ built?)"
	objs=$(find "$BUILD/$f/CMakeFiles" -path '*.dir/*' -name '*.o' | sort)
	[[ -n $objs ]] || die "no object files under $BUILD/$f/CMakeFiles (is $f/ built?)"
	while read -r o; do
		rel=${o#*.dir/}
		# an object left over from a source since removed is not the code
		[[ -f $SRC/$f/${rel%.o} || -f $BUILD/$f/${rel%.o} ]] || continue
		symbols "$f/${rel%.o}" "$o" || exit 2
	done <<<"$objs" | graph "$f"
}

check_all() {
	local f rc=0
	for f in $FOLDERS; do
		check_folder "$f"
		case $? in 0) ;; 1) rc=1 ;; *) exit 2 ;; esac
	done
	return $rc
}

# Planted objects: a pair and a ring of three must be caught, named; a
# one-way chain must pass.
self_test() {
	local tmp out rc ok=0
	tmp=$(mktemp -d) || exit 2
	trap 'rm -rf "$tmp"' RETURN
	echo 'int pb(int); int pa(int x) { return x ? pb(x - 1) : 0; }' >"$tmp/pa.c"
	echo 'int pa(int); int pb(int x) { return x ? pa(x - 1) : 1; }' >"$tmp/pb.c"
	echo 'int ry(int); int rx(int x) { return x ? ry(x - 1) : 0; }' >"$tmp/rx.c"
	echo 'int rz(int); int ry(int x) { return x ? rz(x - 1) : 1; }' >"$tmp/ry.c"
	echo 'int rx(int); int rz(int x) { return x ? rx(x - 1) : 2; }' >"$tmp/rz.c"
	echo 'int ly(int); int lx(int x) { return ly(x) + 1; }' >"$tmp/lx.c"
	echo 'int lz(int); int ly(int x) { return lz(x) + 1; }' >"$tmp/ly.c"
	echo 'int lz(int x) { return x + 1; }' >"$tmp/lz.c"
	local c
	for c in pa pb rx ry rz lx ly lz; do
		cc -c -o "$tmp/$c.o" "$tmp/$c.c" || die "self-test: cc cannot compile $c.c"
	done
	local -a cases=(
		"pair|1|check_circles: pair: circle pa -> pb -> pa|$tmp/pa.o $tmp/pb.o $tmp/lz.o"
		"ring|1|check_circles: ring: circle rx -> ry -> rz -> rx|$tmp/rx.o $tmp/ry.o $tmp/rz.o $tmp/lx.o"
		"chain|0|check_circles: chain: 3 files, 2 arrows, no circle|$tmp/lx.o $tmp/ly.o $tmp/lz.o"
	)
	local name want_rc want objs
	for c in "${cases[@]}"; do
		IFS='|' read -r name want_rc want objs <<<"$c"
		# shellcheck disable=SC2086 # a list of paths without spaces
		out=$(check_objs "$name" $objs)
		rc=$?
		if [[ $rc == "$want_rc" && $out == *"$want"* ]]; then
			echo "check_circles: self-test: ${out%%$'\n'*}"
		else
			echo "check_circles: self-test FAILED: planted objects \"$name\" gave exit" \
				"$rc, wanted $want_rc and \"$want\"; it said:"
			echo "$out"
			ok=1
		fi
	done
	return $ok
}

mode=check
case ${1:-} in
--self-test) mode=self; shift ;;
--objs)
	shift
	[[ $# -ge 2 ]] || die "usage: check_circles.sh --objs NAME OBJ..."
	check_objs "$@"
	exit
	;;
esac
[[ $# == 1 ]] || die "usage: check_circles.sh [--self-test | --objs NAME OBJ...] BUILD"
BUILD=$(cd "$1" && pwd -P) || die "no build directory $1"

case $mode in
check) check_all ;;
self)
	check_all
	rc=$?
	self_test || rc=1
	exit $rc
	;;
esac
