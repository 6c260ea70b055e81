#!/bin/bash
# stitch.sh TEMPLATE.scd OUT.scd OUT SCDOC COMMAND...: the manual page OUT
# from TEMPLATE.scd, whose line "@OPTIONS@" is replaced by what COMMAND
# prints (a program's --help-doc scdoc: its options from the table it
# parses with), compiled by SCDOC. OUT.scd keeps the stitched source.
set -euo pipefail
tpl=$1 scd=$2 out=$3 scdoc=$4
shift 4
[ "$(grep -c '^@OPTIONS@$' "$tpl")" = 1 ] || {
	echo "stitch.sh: $tpl must have one line @OPTIONS@" >&2
	exit 1
}
"$@" >"$scd.options"
while IFS= read -r line; do
	if [ "$line" = "@OPTIONS@" ]; then
		cat "$scd.options"
	else
		printf '%s\n' "$line"
	fi
done <"$tpl" >"$scd.tmp"
"$scdoc" <"$scd.tmp" >"$out.tmp"
mv "$scd.tmp" "$scd"
mv "$out.tmp" "$out"
rm -f "$scd.options"
