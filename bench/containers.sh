#!/usr/bin/env bash
# containers.sh BUILD [REPEATS]: what the container cluster costs, as
# figures (bench/RESULTS.md records them). As root, with podman, runc and
# debootstrap (deploy/install-deps.sh installs them as optional packages).
#
#   - the base image from debootstrap, and the project image: fresh (no
#     cache), cached with nothing changed, cached after a source change;
#   - the time `podman-cluster.sh up N` takes until every hpud listens,
#     for N = 1..4;
#   - the same job's throughput on 2 node containers and on 2 netns nodes
#     (deploy/netns-cluster.sh with BUILD's hpud), 1 worker a node: the
#     Fashion-MNIST MLP (784-1024-1024-10), 300 steps, global batch 256,
#     REPEATS runs each (default 3), alternating; the samples/s rank 0
#     reports at the end.
#
# It removes and rebuilds the images it measures (localhost/hputrain:bench
# and, for the fresh figure, the base image localhost/debian:bookworm).
set -uo pipefail
build=$(cd "${1:?usage: containers.sh BUILD [REPEATS]}" && pwd) || exit 2
repeats=${2:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
pc=$src/deploy/podman-cluster.sh
nc=$src/deploy/netns-cluster.sh
export HPU_IMAGE=localhost/hputrain:bench
base=${HPU_BASE_IMAGE:-localhost/debian:bookworm}
pc_opts=(-n hpubench -s 10.91.55)
prefix=55
tmp=$(mktemp -d) || exit 1
cleanup() {
	# the README the cached-build step changed, put back if the script
	# ended in between (an interrupted build left the source tree changed)
	[ -f "$tmp/README.md.orig" ] && cp -a "$tmp/README.md.orig" "$src/README.md"
	bash "$pc" "${pc_opts[@]}" down >/dev/null 2>&1
	bash "$nc" down $prefix >/dev/null 2>&1
	rm -rf "$tmp"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || { echo "containers.sh: needs root" >&2; exit 1; }
command -v podman >/dev/null || { echo "containers.sh: needs podman" >&2; exit 1; }

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "# machine: $(nproc --all) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); podman $(podman --version | awk '{print $3}')"

# ---- images ----
podman rmi -f "$HPU_IMAGE" >/dev/null 2>&1
podman rmi -f "$base" >/dev/null 2>&1
t=$(now)
bash "$pc" base >/dev/null || exit 1
echo "base image (debootstrap --variant=minbase + podman import): $(since "$t") s"
podman image prune -f >/dev/null 2>&1
t=$(now)
bash "$pc" build >"$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; exit 1; }
echo "project image, fresh (packages, compile, runtime stage): $(since "$t") s"
t=$(now)
bash "$pc" build >/dev/null 2>&1 || exit 1
echo "project image, cached, nothing changed: $(since "$t") s"
# A changed source file: the context copy and the compile run again.
cp -a "$src/README.md" "$tmp/README.md.orig"
echo "<!-- bench/containers.sh $$ -->" >>"$src/README.md"
t=$(now)
bash "$pc" build >/dev/null 2>&1
rc=$?
cp -a "$tmp/README.md.orig" "$src/README.md" && rm -f "$tmp/README.md.orig"
[ $rc -eq 0 ] || exit 1
echo "project image, cached, one source file changed: $(since "$t") s"
echo "image size: $(podman image inspect -f '{{.Size}}' "$HPU_IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

# ---- start-up ----
for n in 1 2 3 4; do
	t=$(now)
	bash "$pc" "${pc_opts[@]}" up $n >/dev/null || exit 1
	echo "up $n: $(since "$t") s until every hpud listens"
done

# ---- throughput: containers against netns ----
job=(--devices 1 -q --max-steps 300 --batch-size 256 --no-eval --log-every 0)
rate() { sed -n 's/.*trained .* \([0-9.]*\) samples\/s.*/\1/p' | tail -1; }

bash "$pc" "${pc_opts[@]}" up 2 >/dev/null || exit 1
key=$tmp/secret.key
"$build/bin/hpud" --gen-key "$key" >/dev/null || exit 1
bash "$nc" up 2 $prefix >/dev/null || exit 1
: >"$tmp/hostfile"
for i in 0 1; do
	cat >"$tmp/hpud-$i.conf" <<EOF
listen = 10.77.$prefix.$((i + 1))
port = 29400
devices = 2
key = $key
user = nobody
EOF
	bash "$nc" -p $prefix start-hpud $i "$build/bin/hpud" "$tmp/hpud-$i.conf" >/dev/null || exit 1
	echo "10.77.$prefix.$((i + 1)) slots=2" >>"$tmp/hostfile"
done
sleep 1
c_rates=() n_rates=()
for r in $(seq "$repeats"); do
	c=$(bash "$pc" "${pc_opts[@]}" submit "${job[@]}" /opt/hputrain/lib/hputrain/fmnist_mlp.so 2>&1 | rate)
	n=$("$build/bin/hpulaunch" --hostfile "$tmp/hostfile" --key "$key" "${job[@]}" \
		"$build/lib/fmnist_mlp.so" 2>&1 | rate)
	echo "run $r: containers $c samples/s, netns $n samples/s"
	c_rates+=("$c") n_rates+=("$n")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
echo "median of $repeats: containers $(median "${c_rates[@]}") samples/s, netns $(median "${n_rates[@]}") samples/s (2 nodes x 1 worker, MLP 784-1024-1024-10, batch 256)"
