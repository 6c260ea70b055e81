#!/bin/bash
# check_env: the table of environment variables (common/env.c) is the one
# list of what the system reads. Fails, naming the variable, when
#   (a) a getenv() in the sources (bench/ too), or a setenv()/unsetenv()
#       in the product's, names a variable the table lacks, or a getenv()
#       outside common/env.c reads a name that is not a literal (read it
#       through common/env.h);
#   (b) an entry lacks its row in docs/configuration.md's "Environment
#       variables", or a row there names no entry;
#   (c) an entry is missing from `hpulaunch --help-env`;
# or when env.h's ids and env.c's entries (VAR(NAME, ...)) disagree.
#
# usage: check_env.sh [--self-test] SOURCE_DIR HPULAUNCH
#   --self-test: after the check, the same check on copies with a variable
#   missing from each place must fail, naming it (a check that sees
#   nothing would pass them).
set -u
. "$(dirname "$0")/selftest.sh"
self=0
[[ ${1:-} == --self-test ]] && { self=1; shift; }
usage="usage: check_env.sh [--self-test] SOURCE_DIR HPULAUNCH"
src=${1:?$usage}
launch=${2:?$usage}
[[ $launch == /* ]] || launch=$PWD/$launch
src=$(cd "$src" && pwd) || exit 2

# check SRC HPULAUNCH: prints a line a problem; returns 1 if any.
check() (
	cd "$1" || exit 2
	local launch=$2 fails=0
	fail() {
		echo "check_env: $*"
		fails=$((fails + 1))
	}

	# The table: env.c's entries "VAR(NAME, ...", for HPU_ENV_NAME named
	# NAME; env.h's ids.
	local names ids dups
	names=$(sed -n 's/^[[:space:]]*VAR(\([A-Za-z0-9_]*\),.*/\1/p' common/env.c | sort)
	[ -n "$names" ] || { echo "check_env: no entries VAR(NAME, ...) found in common/env.c"; exit 1; }
	ids=$(sed -n '/^typedef enum hpu_env_id {/,/^} hpu_env_id;/p' common/env.h |
		grep -o '^[[:space:]]*HPU_ENV_[A-Z0-9_]*' | sed 's/^[[:space:]]*HPU_ENV_//' |
		grep -vx COUNT | sort)
	for x in $(comm -3 <(echo "$ids") <(echo "$names") | tr -d '\t'); do
		fail "HPU_ENV_$x is in only one of common/env.h's ids and common/env.c's table"
	done
	dups=$(echo "$names" | uniq -d)
	[ -z "$dups" ] || fail "common/env.c names these twice: $dups"
	in_table() { echo "$names" | grep -qx -- "$1"; }

	# (a) the sources.
	local dirs="" d hit file line call arg
	for d in collectives options ckpt agent worker launcher daemon proto tools common examples bench include; do
		[ -d "$d" ] && dirs="$dirs $d"
	done
	while IFS= read -r hit; do
		file=${hit%%:*}
		line=${hit#*:}
		line=${line#*:}
		for call in $(echo "$line" | grep -oE '\b(secure_getenv|getenv|setenv|unsetenv)[[:space:]]*\([^,)]*' |
			tr -d ' \t'); do
			arg=${call#*(}
			if [[ $file == bench/* && $call != *getenv* ]]; then
				continue # a benchmark setting up its own process
			elif [[ $arg =~ ^\"([^\"]*)\"$ ]]; then
				in_table "${BASH_REMATCH[1]}" ||
					fail "$file: ${call%%(*}(\"${BASH_REMATCH[1]}\"): ${BASH_REMATCH[1]} is not in common/env.c's table"
			elif [[ $call == *getenv* && $file != common/env.c ]]; then
				fail "$file: ${call%%(*}($arg): read the variable by its id (common/env.h)"
			fi
		done
	done < <(grep -rnE '\b(secure_getenv|getenv|setenv|unsetenv)[[:space:]]*\(' \
		--include='*.c' --include='*.h' $dirs | grep -v -e '^common/env\.h:')

	# (b) docs/configuration.md: the section's rows, one a variable:
	# "| `NAME` | ...".
	local rows n doc=docs/configuration.md
	rows=$(sed -n '/^## Environment variables$/,/^## /p' $doc |
		sed -n 's/^| `\([A-Za-z0-9_]*\)` |.*/\1/p' | sort)
	[ -n "$rows" ] || fail "$doc has no \"## Environment variables\" section with a row a variable"
	for n in $(comm -23 <(echo "$names") <(echo "$rows")); do
		fail "$doc's Environment variables lacks a row for $n"
	done
	for n in $(comm -13 <(echo "$names") <(echo "$rows")); do
		fail "$doc's Environment variables lists $n, which common/env.c's table lacks"
	done

	# (c) hpulaunch --help-env, in an environment that cannot make it fail.
	local help rc
	help=$(env -i PATH=/usr/bin:/bin "$launch" --help-env 2>&1)
	rc=$?
	[ $rc -eq 0 ] || fail "hpulaunch --help-env exited $rc: $help"
	for n in $names; do
		echo "$help" | grep -qE "^  $n( \(|:)" || fail "hpulaunch --help-env does not list $n"
	done

	if [ $fails -gt 0 ]; then
		echo "check_env: $fails problem(s)"
		exit 1
	fi
	echo "check_env: $(echo "$names" | wc -l) variables: the sources, docs/configuration.md and hpulaunch --help-env agree"
)

# must_fail WHAT WANT: the check on the copy in $tmp must fail saying WANT.
must_fail() {
	expect_caught check_env "$1" "$2" check "$tmp" "${fake:-$launch}"
}

self_test() (
	tmp=$(mktemp -d) || exit 2
	trap 'rm -rf "$tmp"' EXIT
	ok=0
	fresh() {
		rm -rf "${tmp:?}"/*
		mkdir -p "$tmp/collectives" "$tmp/docs" && cp -r "$src/common" "$tmp/" &&
			cp "$src/docs/configuration.md" "$tmp/docs/" &&
			cp "$src/collectives/comm.c" "$tmp/collectives/"
	}
	fresh && check "$tmp" "$launch" >/dev/null ||
		{ echo "check_env: self-test: the unchanged copy does not pass"; exit 1; }
	echo 'static const char *k(void) { return getenv("HPU_NOT_IN_TABLE"); }' >>"$tmp/collectives/comm.c"
	must_fail "a getenv of a variable the table lacks" \
		'collectives/comm.c: getenv("HPU_NOT_IN_TABLE"): HPU_NOT_IN_TABLE is not in' || ok=1
	fresh && echo 'static const char *k(const char *n) { return getenv(n); }' >>"$tmp/collectives/comm.c"
	must_fail "a getenv of a name that is not a literal" 'collectives/comm.c: getenv(n): read the variable by its id' || ok=1
	fresh && sed -i '/^| `HPUCOLL_TIMEOUT_MS` |/d' "$tmp/docs/configuration.md"
	must_fail "a variable missing from docs/configuration.md" "lacks a row for HPUCOLL_TIMEOUT_MS" || ok=1
	fresh && sed -i '/^[[:space:]]*VAR(TMPDIR,/,+1d' "$tmp/common/env.c"
	must_fail "an id without a table entry" "HPU_ENV_TMPDIR is in only one of" || ok=1
	fresh && printf '#!/bin/bash\n"%s" "$@" | grep -v "^  HPU_KEY_FILE"\n' "$launch" >"$tmp/fake" &&
		chmod +x "$tmp/fake"
	fake=$tmp/fake must_fail "a variable missing from --help-env" "does not list HPU_KEY_FILE" || ok=1
	exit $ok
)

check "$src" "$launch"
rc=$?
if [[ $self == 1 ]]; then
	self_test || rc=1
fi
exit $rc
