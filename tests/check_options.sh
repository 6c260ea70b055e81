#!/bin/bash
# check_options.sh SRC BUILD: the documentation of the commands' options
# against the commands themselves.
#   (b) docs/reference/*.md is what tools/gen-docs-ref.sh makes from the
#       programs' option tables now (it prints how to regenerate);
#   (a) every option of a manual page (BUILD/man/*.scd, the stitched scdoc
#       sources; without scdoc, docs/reference/) and of docs/reference/ is
#       taken by its program: run with it alone, the program does not call
#       it unknown (a flag then does its thing, an option with a value says
#       the value is missing); every key of hpud.conf(5) is one hpud knows;
#       and every option a program's --help lists is documented.
# Each program is first shown to call an option it lacks unknown, so that
# the check can fail. Exit status: 0 all agree, 1 not.
set -u -o pipefail
src=$(cd "${1:?usage: check_options.sh SRC BUILD}" && pwd) || exit 2
build=$(cd "${2:?usage: check_options.sh SRC BUILD}" && pwd) || exit 2
bin=$build/bin
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
bad=0
fail()
{
	echo "check_options: FAIL: $*" >&2
	bad=1
}
UNKNOWN='unknown (option|argument|key)'

# ---- (b) docs/reference up to date ----
bash "$src/tools/gen-docs-ref.sh" "$build" --check || fail "docs/reference/ is out of date (see above)"

# "SECTION OPTION" lines of a manual page's stitched source or a
# reference, SECTION the word after "hpu-ckpt " in a heading (its
# command), else "-".
from_scd()
{
	awk '/^# / {in_opts = $0 == "# OPTIONS"} !in_opts {next}
	/^## hpu-ckpt / {cmd = $3} /^\*/ {
		n = split($0, w, "*")
		for (i = 2; i <= n; i += 2) if (w[i] != "") print (cmd ? cmd : "-"), w[i]
	}' "$1" | sed 's/\\_/_/g'
}
from_md()
{
	awk '/^## hpu-ckpt / {cmd = $3} /^- `/ {
		split($0, w, "`"); n = split(w[2], t, /[ ,]+/)
		for (i = 1; i <= n; i++) if (t[i] ~ /^-/) print (cmd ? cmd : "-"), t[i]
	}' "$1"
}
# The options a --help text lists: the names on its option lines (two
# spaces, then a dash), before the gap to the help text.
from_help()
{
	grep -E '^  -' | sed -E 's/^  //; s/  .*//' | tr ', ' '\n\n' | grep -E '^-'
}

run()
{
	env -i PATH=/usr/bin:/bin timeout 30 "$@" 2>&1
}

# check PROGRAM PAGE: (a) for one program.
check()
{
	local prog=$1 page=$2 name=${1##*/} sec opt out where
	local scd=$build/man/$page.scd md=$src/docs/reference/${page%.*}.md
	{
		from_md "$md"
		if [ -f "$scd" ]; then from_scd "$scd"; fi
	} | sort -u >"$tmp/doc"
	[ -f "$scd" ] && where="$page.scd and ${md#"$src"/}" || where="${md#"$src"/} (no scdoc: no manual page built)"
	[ -s "$tmp/doc" ] || fail "$name: no options found in $where"
	# the check can fail
	sec=$(head -1 "$tmp/doc" | cut -d' ' -f1)
	out=$(run "$prog" ${sec#-} --no-such-option)
	echo "$out" | grep -qE "$UNKNOWN" || fail "$name does not call --no-such-option unknown: $out"
	local n=0
	while read -r sec opt; do
		out=$(run "$prog" ${sec#-} "$opt")
		if echo "$out" | grep -qE "$UNKNOWN"; then
			fail "$name ${sec#-} $opt is documented ($where) but $name does not take it: $out"
		fi
		n=$((n + 1))
	done <"$tmp/doc"
	# every option --help lists is documented
	local cmds=-
	[ "$name" = hpu-ckpt ] && cmds="info verify export reshard"
	for sec in $cmds; do
		run "$prog" ${sec#-} --help | from_help | while read -r opt; do
			grep -qxF -- "$sec $opt" "$tmp/doc" ||
				echo "$name ${sec#-} --help lists $opt, which $where do not document"
		done
	done >"$tmp/missing"
	[ -s "$tmp/missing" ] && fail "$(cat "$tmp/missing")"
	echo "check_options: $name: $n documented options taken, its --help all documented"
}

check "$bin/hpulaunch" hpulaunch.1
check "$bin/hpud" hpud.8
check "$bin/hpu-ckpt" hpu-ckpt.1
check "$bin/hpu-trace" hpu-trace.1
check "$bin/hpu-plot" hpu-plot.1
check "$bin/hpucoll-bench" hpucoll-bench.1

# ---- hpud.conf(5): every key is one hpud knows ----
conf_says()
{
	printf '%s = x\n' "$1" >"$tmp/hpud.conf"
	run "$bin/hpud" -c "$tmp/hpud.conf" --check
}
out=$(conf_says no_such_key)
echo "$out" | grep -qE "$UNKNOWN" || fail "hpud does not call the key no_such_key unknown: $out"
# the first word of each entry: "- `listen = ADDRESS`", "*listen* = _ADDRESS_"
keys=$( (awk '/^- `/ {split($0, w, "`"); split(w[2], t, " "); print t[1]}' \
	"$src/docs/reference/hpud.conf.md"
	if [ -f "$build/man/hpud.conf.5.scd" ]; then
		from_scd "$build/man/hpud.conf.5.scd" | cut -d' ' -f2
	fi) | sort -u)
[ -n "$keys" ] || fail "no keys found in hpud.conf's documentation"
for k in $keys; do
	out=$(conf_says "$k")
	echo "$out" | grep -qE "$UNKNOWN" && fail "hpud.conf key $k is documented but hpud does not know it: $out"
done
echo "check_options: hpud.conf: $(echo "$keys" | wc -l) documented keys known to hpud"

[ $bad = 0 ] && echo "check_options: PASS"
exit $bad
