#!/bin/bash
# check_docs: the documentation is true where a machine can tell.
#   (a) Every relative link in README.md and docs/*.md names a file that
#       exists, and a link with #anchor names a heading of that file
#       (GitHub's anchors: lower case, punctuation dropped, spaces to '-').
#   (b) Every runnable block of those files runs. A fenced block whose
#       info string has the word `runnable` (```sh runnable) is a shell
#       block to run; a fenced block with `file=NAME` (```c file=my.c) is
#       written to NAME in the directory the blocks have reached. A file's
#       blocks run in order, in one bash (set -e -o pipefail), in a fresh
#       temporary directory that is also $HOME, with HPU_BUILD set to the
#       build tree (the blocks default it to build/, where `make test` and
#       `make demo` build). A block that fails fails the check, naming the
#       file and the block's line.
#
# usage: check_docs.sh [--self-test] SOURCE_DIR BUILD_DIR
#   HPU_DOCS_FILTER=REGEX: run the blocks of matching files only (links
#   are always checked).
#   --self-test: afterwards, a copy with a broken link, a broken anchor and
#   a failing block must fail, naming each (a check that sees nothing
#   would pass them).
set -u
. "$(dirname "$0")/selftest.sh"

self=0
[[ ${1:-} == --self-test ]] && { self=1; shift; }
usage="usage: check_docs.sh [--self-test] SOURCE_DIR BUILD_DIR"
src=$(cd "${1:?$usage}" && pwd) || exit 2
build=$(cd "${2:?$usage}" && pwd) || exit 2

# anchors FILE: the GitHub anchors of FILE's headings, one a line.
anchors() {
	awk '
	/^(```|~~~)/ { code = !code; next }
	code || !/^#+ / { next }
	{
		s = $0
		sub(/^#+ +/, "", s)
		s = tolower(s)
		gsub(/[^a-z0-9 _-]/, "", s)
		gsub(/ /, "-", s)
		n = seen[s]++
		print (n ? s "-" n : s)
	}' "$1"
}

# links FILE: "LINE TARGET" for each inline link outside code.
links() {
	awk '
	/^(```|~~~)/ { code = !code; next }
	code || /^    / { next }
	{
		s = $0
		gsub(/`[^`]*`/, "", s)
		while (match(s, /\]\([^) ]+\)/)) {
			print NR " " substr(s, RSTART + 2, RLENGTH - 3)
			s = substr(s, RSTART + RLENGTH)
		}
	}' "$1"
}

# check_links DIR: prints a line a problem; returns 1 if any.
check_links() (
	cd "$1" || exit 2
	local fails=0 f line target path anchor dest
	for f in README.md docs/*.md; do
		[ -f "$f" ] || continue
		while read -r line target; do
			case $target in
			http://* | https://* | mailto:*) continue ;;
			esac
			path=${target%%#*}
			anchor=
			[[ $target == *#* ]] && anchor=${target#*#}
			if [ -z "$path" ]; then
				dest=$f
			else
				dest=$(realpath -m --relative-to=. "$(dirname "$f")/$path")
			fi
			if [ ! -e "$dest" ]; then
				echo "check_docs: $f:$line: link to $target: $dest does not exist"
				fails=$((fails + 1))
			elif [ -n "$anchor" ] && [[ $dest == *.md ]] &&
				! anchors "$dest" | grep -qx -- "$anchor"; then
				echo "check_docs: $f:$line: link to $target: $dest has no heading with anchor #$anchor"
				fails=$((fails + 1))
			fi
		done < <(links "$f")
	done
	[ $fails = 0 ] || { echo "check_docs: $fails broken link(s)"; exit 1; }
)

# script FILE STATE: FILE's runnable and file= blocks as one bash script;
# each runnable block first writes its line number to STATE.
script() {
	echo 'set -e -o pipefail'
	awk -v file="$1" -v state="$2" '
	/^(```|~~~)/ {
		if (!inb) {
			inb = 1
			info = substr($0, 4)
			mode = ""
			if (info ~ /(^|[ \t])runnable([ \t]|$)/) {
				mode = "run"
				print "echo " NR " > \"" state "\""
				print "echo \"check_docs: " file ":" NR "\""
			} else if (match(info, /file=[^ \t]+/)) {
				mode = "file"
				print "cat > \"" substr(info, RSTART + 5, RLENGTH - 5) "\" <<'"'"'HPU_DOCS_EOF'"'"'"
			}
		} else {
			if (mode == "file")
				print "HPU_DOCS_EOF"
			inb = 0
			mode = ""
		}
		next
	}
	inb && mode != "" { print }' "$1"
}

# run_blocks DIR: runs each file's blocks; prints a line a failure.
run_blocks() (
	cd "$1" || exit 2
	local fails=0 ran=0 f tmp rc
	for f in README.md docs/*.md; do
		[ -f "$f" ] || continue
		[[ $f =~ ${HPU_DOCS_FILTER:-.} ]] || continue
		grep -qE '^(```|~~~).*([[:space:]]runnable([[:space:]]|$)|file=)' "$f" || continue
		tmp=$(mktemp -d) || exit 2
		script "$f" "$tmp/.block" >"$tmp/.script"
		(cd "$tmp" && HOME=$tmp HPU_BUILD=$build timeout 500 bash .script) >"$tmp/.log" 2>&1
		rc=$?
		ran=$((ran + 1))
		if [ $rc != 0 ]; then
			echo "check_docs: $f:$(cat "$tmp/.block" 2>/dev/null || echo '?'): this block failed (exit $rc); the file's output ends:"
			tail -n 40 "$tmp/.log" | sed 's/^/    /'
			fails=$((fails + 1))
		else
			echo "check_docs: $f: $(grep -c '^check_docs: ' "$tmp/.log") runnable block(s) ran"
		fi
		rm -rf "$tmp"
	done
	[ $fails = 0 ] || { echo "check_docs: $fails file(s) with a failing block"; exit 1; }
)

# must_fail WHAT WANT: the check on the copy in $tmp must fail saying WANT.
must_fail() {
	expect_caught check_docs "$1" "$2" all_checks "$tmp"
}
all_checks() { { check_links "$1" && run_blocks "$1"; } 2>&1; }

self_test() (
	tmp=$(mktemp -d) || exit 2
	trap 'rm -rf "$tmp"' EXIT
	ok=0
	mkdir -p "$tmp/docs"
	cat >"$tmp/docs/guide.md" <<'EOF'
# A guide

## Two words

Back to [the front](../README.md) and [here](#two-words).
EOF
	cat >"$tmp/README.md" <<'EOF'
# Front

See [the guide](docs/guide.md#two-words) and [`x`](docs/guide.md).

```c file=hello.txt
hello
```

```sh runnable
grep -q hello hello.txt
test -n "$HPU_BUILD"
```
EOF
	out=$({ check_links "$tmp" && HPU_DOCS_FILTER= run_blocks "$tmp"; } 2>&1) ||
		{ echo "check_docs: self-test: the sound copy does not pass:"; echo "$out"; exit 1; }
	sed -i 's|docs/guide.md#two-words|docs/gide.md|' "$tmp/README.md"
	must_fail "a link to a missing file" "README.md:3: link to docs/gide.md" || ok=1
	sed -i 's|docs/gide.md|docs/guide.md#three-words|' "$tmp/README.md"
	must_fail "a link to a missing anchor" "README.md:3: link to docs/guide.md#three-words" || ok=1
	sed -i 's|#three-words||; s|^test -n|false \&\& true; false; test -n|' "$tmp/README.md"
	HPU_DOCS_FILTER= must_fail "a failing block" "README.md:9: this block failed" || ok=1
	exit $ok
)

check_links "$src"
rc=$?
run_blocks "$src" || rc=1
if [[ $self == 1 ]]; then
	self_test || rc=1
fi
[ $rc = 0 ] && echo "check_docs: links and runnable blocks of README.md and docs/*.md: OK"
exit $rc
