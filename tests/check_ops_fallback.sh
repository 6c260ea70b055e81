#!/bin/bash
# check_ops_fallback: no op of worker/ops runs its C loops after its
# table's refusal without asking hpu__be_refused first (backend.h): on a
# table that is not the host's (CUDA's) those loops would touch device
# memory. Every call of a C-loop fallback -- a reference kernel
# (hpu__ref_*), a host kernel (hpu__host_*), an op's own loops
# (fake_quant_c, amax_c, dropout_backward_c, conv2d_backward) -- inside
# the ops' files must be
#   - inside a reference or host kernel itself (one loop calling another),
#   - or within the 6 lines after an hpu__be_refused in the same function
#     (the guard: "entry() == OK || hpu__be_refused(...)", or "... &&
#     !hpu__be_refused(...)"),
#   - or one of the few listed below, each with its reason.
# The kernel-or-host ops pass the host kernel's name to HPU__BE_RUN, which
# is not a call here.
#
# usage: check_ops_fallback.sh [--self-test] SOURCE_DIR
set -u
. "$(dirname "$0")/selftest.sh"
self=0
[[ ${1:-} == --self-test ]] && { self=1; shift; }
src=${1:?usage: check_ops_fallback.sh [--self-test] SOURCE_DIR}
src=$(cd "$src" && pwd) || exit 2

# "function:callee" calls that need no guard, and why:
#   bcel_bwd_row:hpu__host_sigmoid_fwd   a helper of the host's bce_bwd (a host loop itself)
#   hpu__fp8_encode:fake_quant_c         one host float, not a tensor
#   hpu_linear_backward:hpu__ref_linear_backward
#                                        an empty product (batch <= 0): no table call refused
allowed="bcel_bwd_row:hpu__host_sigmoid_fwd hpu__fp8_encode:fake_quant_c
hpu_linear_backward:hpu__ref_linear_backward"

# scan DIR: "FILE:LINE: CALLEE in FUNCTION" for each unguarded call
scan() {
	ALLOWED="$allowed" perl -e '
	my %ok = map { $_ => 1 } split /\s+/, $ENV{ALLOWED};
	my $fallback = qr/\b(hpu__ref_\w+|hpu__host_\w+|fake_quant_c|amax_c|dropout_backward_c|conv2d_backward)\s*\(/;
	for my $f (@ARGV) {
		open(my $h, "<", $f) or die "$f: $!\n";
		my @l = <$h>;
		my ($fn, $start) = ("", 0);
		for my $i (0 .. $#l) {
			my $t = $l[$i];
			if ($t !~ /^\s/ && $t =~ /^[A-Za-z_][\w\s\*]*?\b(\w+)\(/) {
				($fn, $start) = ($1, $i);
			}
			next unless $t =~ /^\s/ && $t =~ $fallback;
			my $callee = $1;
			next if $fn =~ /^(hpu__ref_|hpu__host_)/ || $fn =~ /_c$/ || $callee eq $fn;
			next if $ok{"$fn:$callee"};
			my $from = $i - 6 > $start ? $i - 6 : $start;
			next if join("", @l[$from .. $i]) =~ /hpu__be_refused\s*\(/;
			my $rel = $f;
			$rel =~ s{.*/worker/ops/}{worker/ops/};
			print "$rel:", $i + 1, ": $callee in $fn runs without hpu__be_refused\n";
		}
	}' "$1"/ops*.c "$1"/autocast.c "$1"/fp8.c
}

check() {
	local out
	out=$(scan "$1") || return 2
	if [[ -n $out ]]; then
		echo "$out"
		echo "check_ops_fallback: C loops reached after a table's refusal without the check" \
			"(worker/ops/backend.h, hpu__be_refused)"
		return 1
	fi
	return 0
}

check "$src/worker/ops"
rc=$?
[[ $rc == 0 ]] && echo "check_ops_fallback: every fallback to the ops' C loops asks hpu__be_refused"
if [[ $self == 1 && $rc == 0 ]]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	cp "$src"/worker/ops/*.c "$tmp"/
	# relu's forward without its guard, as before the check existed
	perl -0pi -e 's/!= HPU_BE_OK &&\n\t    !hpu__be_refused\("hpu_relu_forward", "eltwise_fwd ReLU, %zu values", n\)\)/!= HPU_BE_OK)/' \
		"$tmp"/ops.c
	expect_caught check_ops_fallback "relu's reference loop unguarded" \
		"hpu__ref_relu_forward in relu_fwd runs without hpu__be_refused" check "$tmp" || rc=1
fi
exit $rc
