#!/bin/bash
# check_troubleshooting: every message docs/troubleshooting.md explains is
# one the programs print, and one a test provokes and asserts on. Each
# entry of the guide is a heading
#     ### `fixed text with <VARIABLE> parts`
# where a <NAME> in capitals stands for what changes from run to run. The
# message, as a pattern (the fixed parts in order, anything but a quote or
# a line break for each <NAME>), must match
#   (a) a string literal of the product's sources (launcher/ daemon/
#       worker/ options/ ckpt/ agent/ collectives/ tools/ bench/ common/
#       proto/ examples/;
#       adjacent C literals joined, as the compiler joins them), so the
#       guide names real messages; and
#   (b) a string literal of a test under tests/ (a C test's expected text,
#       a shell test's line; not the fixtures, which are models), so that
#       a test makes the program print it and fails if the words change.
#
# usage: check_troubleshooting.sh [--self-test] SOURCE_DIR
#   --self-test: after the check, guides with a message no program prints
#   and with one no test asserts must fail, naming them.
set -u
. "$(dirname "$0")/selftest.sh"
self=0
[[ ${1:-} == --self-test ]] && { self=1; shift; }
src=${1:?usage: check_troubleshooting.sh [--self-test] SOURCE_DIR}
src=$(cd "$src" && pwd) || exit 2

# literals FILE...: "FILE<TAB>literal" for every string literal of C
# files (adjacent ones joined, "%" PRIu64 "" read as %u), every line of others.
literals() {
	perl -e '
	for my $f (@ARGV) {
		open(my $h, "<", $f) or next;
		local $/;
		my $t = <$h>;
		close $h;
		if ($f !~ /\.[ch]$/) {
			print "$f\t$_\n" for split /\n/, $t;
			next;
		}
		# strings, character constants and comments, left to right;
		# strings with only blanks (or a PRI macro) between are one
		my ($lit, $end) = (undef, -1);
		while ($t =~ m{"((?:[^"\\\n]|\\.)*)"|\x27(?:\\.|[^\x27\\\n])*\x27|/\*.*?\*/|//[^\n]*}gs) {
			next unless defined $1;
			my ($s, $b, $e) = ($1, $-[0], $+[0]);
			my $gap = $end >= 0 ? substr($t, $end, $b - $end) : "x";
			if (defined $lit && $gap =~ /^\s*(PRI[a-zA-Z0-9]+)?\s*$/) {
				$lit .= (defined $1 ? "u" : "") . $s;
			} else {
				print "$f\t$lit\n" if defined $lit;
				$lit = $s;
			}
			$end = $e;
		}
		print "$f\t$lit\n" if defined $lit;
	}' "$@"
}

# messages GUIDE: the headings' messages, one a line.
messages() {
	sed -n 's/^### `\(.*\)`[[:space:]]*$/\1/p' "$1"
}

# pattern MESSAGE: the Perl pattern of a message (see above).
pattern() {
	perl -e '
	my @p = split /<[A-Z][A-Z0-9_]*>/, $ARGV[0], -1;
	@p = grep { length } @p;
	print join("[^\"\\n]*?", map { quotemeta } @p);' -- "$1"
}

# check GUIDE: prints a line a problem; returns 1 if any.
check() (
	cd "$src" || exit 2
	local guide=$1 fails=0 n=0 msg pat where
	fail() {
		echo "check_troubleshooting: $*"
		fails=$((fails + 1))
	}
	local prod tests
	prod=$(mktemp) && tests=$(mktemp) || exit 2
	trap 'rm -f "$prod" "$tests"' EXIT
	literals $(find launcher daemon worker options ckpt agent collectives tools bench common proto examples \
		-name '*.[ch]' 2>/dev/null | sort) >"$prod"
	literals $(find tests \( -path tests/fixtures -o -path tests/fuzz \) -prune -o \
		-type f \( -name '*.c' -o -name '*.sh' -o -name '*.py' \) -print |
		grep -v '^tests/check_' | sort) >"$tests"

	while IFS= read -r msg; do
		n=$((n + 1))
		pat=$(pattern "$msg")
		if [[ -z $pat || ${#pat} -lt 12 ]]; then
			fail "\`$msg\`: too little fixed text to find"
			continue
		fi
		[[ $msg == *'"'* ]] && { fail "\`$msg\`: leave the double quotes out"; continue; }
		grep -qP -- "\t.*$pat" "$prod" ||
			fail "\`$msg\`: no program prints it (no string literal of the sources matches)"
		where=$(grep -P -- "\t.*$pat" "$tests" | cut -f1 | sort -u | tr '\n' ' ')
		[ -n "$where" ] ||
			fail "\`$msg\`: no test asserts it (no expected text under tests/ matches)"
	done < <(messages "$guide")

	[ $n -gt 0 ] || fail "$guide has no entries (### \`message\`)"
	if [ $fails -gt 0 ]; then
		echo "check_troubleshooting: $fails problem(s)"
		exit 1
	fi
	echo "check_troubleshooting: $n messages: each printed by the sources and asserted by a test"
)

# must_fail WHAT WANT: the check of the guide in $tmp/guide.md must fail
# saying WANT.
must_fail() {
	expect_caught check_troubleshooting "$1" "$2" check "$tmp/guide.md"
}

self_test() (
	tmp=$(mktemp -d) || exit 2
	trap 'rm -rf "$tmp"' EXIT
	ok=0
	guide=$src/docs/troubleshooting.md
	cp "$guide" "$tmp/guide.md" && printf '\n### `the flux capacitor of rank <N> overheated`\n' >>"$tmp/guide.md"
	must_fail "a message no program prints" \
		'`the flux capacitor of rank <N> overheated`: no program prints it' || ok=1
	# A message hpud prints that no test provokes.
	cp "$guide" "$tmp/guide.md" &&
		printf '\n### `cannot draw an instance id: the random generator failed`\n' >>"$tmp/guide.md"
	must_fail "a message no test asserts" \
		'`cannot draw an instance id: the random generator failed`: no test asserts it' || ok=1
	# A word changed in the program's text must be caught too: the
	# guide's first message with a word dropped matches no source.
	first=$(messages "$guide" | head -1)
	changed=$(echo "$first" | sed 's/ [a-z]\+ / /')
	if [[ $changed == "$first" ]]; then
		echo "check_troubleshooting: self-test: cannot alter \`$first\`"
		ok=1
	else
		sed "0,/^### \`.*\`/s//### \`$(printf '%s' "$changed" | sed 's/[&/\]/\\&/g')\`/" \
			"$guide" >"$tmp/guide.md"
		must_fail "a message whose words differ from the program's" "\`$changed\`: no program prints it" || ok=1
	fi
	printf '# Troubleshooting\n' >"$tmp/guide.md"
	must_fail "a guide without entries" "has no entries" || ok=1
	exit $ok
)

check "$src/docs/troubleshooting.md"
rc=$?
if [[ $self == 1 ]]; then
	self_test || rc=1
fi
exit $rc
