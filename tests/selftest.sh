# selftest.sh: sourced by the check_*.sh scripts for their --self-test.
#
# expect_caught CHECK WHAT WANT CMD [ARG...]: CMD, the check run on a copy
# broken on purpose, must exit 1 and print WANT (on stdout; CMD redirects
# stderr itself where the check writes there). CHECK names the script in
# what is printed. Returns 0 when it was caught, 1 otherwise.
expect_caught() {
	local check=$1 what=$2 want=$3 out rc
	shift 3
	out=$("$@")
	rc=$?
	if [[ $rc == 1 && $out == *"$want"* ]]; then
		echo "$check: self-test: $what: caught: $want"
		return 0
	fi
	echo "$check: self-test FAILED: $what was not caught (exit $rc, wanted 1 and \"$want\"); it said:"
	echo "$out"
	return 1
}
