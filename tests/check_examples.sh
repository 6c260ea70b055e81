#!/bin/bash
# check_examples.sh [SRC]: every example model (examples/*/*.c, not
# examples/common/) stays under 200 lines, so it reads as a model and not
# as plumbing: argument parsing, datasets and text generation belong in
# examples/common/ (hpuexamples) or the model API.
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
rc=0
for f in "$src"/examples/*/*.c; do
	case $f in */examples/common/*) continue ;; esac
	n=$(wc -l <"$f")
	if [ "$n" -ge 200 ]; then
		echo "check_examples: ${f#"$src"/} has $n lines: an example stays under 200 (move the reusable parts to examples/common/)" >&2
		rc=1
	fi
done
[ $rc = 0 ] && echo "check_examples: every example is under 200 lines"
exit $rc
