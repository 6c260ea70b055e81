#!/bin/bash
# test_install.sh BUILD_DIR [LIBDIR]: what a model author outside the tree
# sees. The build is installed into a temporary prefix (cmake --install);
# a small model written here, outside the tree, is built against the
# installed headers through pkg-config (no libhpu: the worker provides
# the hpu_* names), exactly as README.md's
# quick start says, and trained for a few steps on 2 workers by the
# INSTALLED hpulaunch, which must find hpu-worker, libhpucoll and libhpu
# through the install's rpaths alone: no installed file names the build
# tree, and where a mount namespace can be had (root), the build tree's
# lib dir is hidden under an empty tmpfs for the run.
set -u
build=$(cd "${1:?usage: test_install.sh BUILD_DIR [LIBDIR]}" && pwd) || exit 1
libdir=${2:-lib} # GNUInstallDirs' CMAKE_INSTALL_LIBDIR, relative
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
unset LD_LIBRARY_PATH LD_PRELOAD

fail()
{
	echo "test_install: FAIL: $*" >&2
	exit 1
}

# ---- install ----
if ! cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log" >&2
	fail "cmake --install $build --prefix $prefix failed"
fi
for f in bin/hpulaunch bin/hpu-worker bin/hpud bin/hpu-ckpt bin/hpu-trace bin/hpu-plot \
	 bin/hpucoll-bench \
	 "$libdir/libhpu.so" "$libdir/libhpucoll.so" \
	 include/hpu/hpu.h include/hpu/layers.h include/hpu/ops.h include/hpu/coll.h \
	 include/hpu/export.h \
	 "$libdir/pkgconfig/hpu.pc" "$libdir/pkgconfig/hpucoll.pc" \
	 "$libdir/hputrain/fmnist_mlp.so" "$libdir/hputrain/fmnist_cnn.so" \
	 "$libdir/hputrain/resnet.so" "$libdir/hputrain/gpt_lm.so"; do
	[ -e "$prefix/$f" ] || fail "not installed: $f"
done
# The SOVERSION chain: libX.so -> libX.so.0 -> the file whose SONAME is
# libX.so.0.
for l in hpu hpucoll; do
	[ "$(readlink "$prefix/$libdir/lib$l.so")" = "lib$l.so.0" ] ||
		fail "lib$l.so is not a link to lib$l.so.0"
	real=$(readlink "$prefix/$libdir/lib$l.so.0")
	[[ $real == lib$l.so.0.* && -f $prefix/$libdir/$real ]] ||
		fail "lib$l.so.0 is not a link to the versioned file (it is '$real')"
	readelf -d "$prefix/$libdir/$real" | grep -q "(SONAME).*\[lib$l.so.0\]" ||
		fail "$real has no SONAME lib$l.so.0"
done

# ---- rpaths: relative to the installed files, none into the build tree ----
elves=$(ls "$prefix"/bin/* "$prefix/$libdir"/lib*.so.0.* "$prefix/$libdir"/hputrain/*.so)
for f in $elves; do
	paths=$(readelf -d "$f" | grep -E '\((RPATH|RUNPATH)\)')
	case $paths in
	*"$build"*) fail "$f keeps a path of the build tree: $paths" ;;
	esac
done
for f in "$prefix"/bin/hpulaunch "$prefix"/bin/hpu-worker "$prefix"/bin/hpud; do
	readelf -d "$f" | grep -E '\((RPATH|RUNPATH)\)' | grep -qF '$ORIGIN/' ||
		fail "$f has no \$ORIGIN-relative rpath"
done
# The loader's own answer: hpu-worker's libhpucoll is the installed one.
where()
{
	ldd "$1" | awk -v lib="$2" '$1 == lib {print $3}'
}
coll=$(where "$prefix/bin/hpu-worker" libhpucoll.so.0)
[ "$(realpath "$coll" 2>/dev/null)" = "$(realpath "$prefix/$libdir/libhpucoll.so.0")" ] ||
	fail "the installed hpu-worker loads libhpucoll.so.0 from '$coll', not from $prefix/$libdir"
# A model needs no libhpu (hpu-worker provides the hpu_* names): the
# installed examples link none.
! readelf -d "$prefix/$libdir/hputrain/fmnist_mlp.so" | grep '(NEEDED)' | grep -q 'libhpu\.so' ||
	fail "the installed fmnist_mlp.so has NEEDED libhpu.so: a model must not link libhpu"

# ---- the manual pages (man/, built by scdoc) ----
mandir=$prefix/share/man
if [ ! -f "$build/man/hpulaunch.1" ]; then
	echo "test_install: scdoc was not found at configure time: no manual pages built, none checked"
else
	for p in man1/hpulaunch.1 man8/hpud.8 man5/hpud.conf.5 man1/hpu-ckpt.1 man1/hpu-trace.1 \
		 man1/hpu-plot.1 man1/hpucoll-bench.1; do
		[ -s "$mandir/$p" ] || fail "manual page not installed: share/man/$p"
	done
	if command -v man >/dev/null 2>&1; then
		page=$(MANWIDTH=100 MANPATH=$mandir man -P cat hpulaunch 2>&1) ||
			fail "man -M $mandir hpulaunch did not render: $page"
		for want in 'hpulaunch - start and supervise' OPTIONS '--max-restarts K' \
			    'Training options' '--strategy NAME' 'EXIT STATUS'; do
			grep -qF -- "$want" <<<"$page" || fail "man hpulaunch has no '$want': $page"
		done
		page=$(MANWIDTH=100 MANPATH=$mandir man -P cat 5 hpud.conf 2>&1) ||
			fail "man 5 hpud.conf did not render: $page"
		grep -qF 'submitter_timeout = S' <<<"$page" || fail "man 5 hpud.conf has no submitter_timeout: $page"
		echo "test_install: man hpulaunch and man 5 hpud.conf render from $mandir"
	else
		grep -qF -- '--max-restarts' "$mandir/man1/hpulaunch.1" ||
			fail "share/man/man1/hpulaunch.1 has no --max-restarts"
		echo "test_install: no man program: checked the installed pages' files only"
	fi
fi

# ---- a model outside the tree: a linear regression on made-up samples ----
mkdir "$tmp/model" && cd "$tmp/model" || exit 1
cat >my.c <<'EOF'
/* y = 2 x0 - 3 x1 + 0.5 x2 + 1, learned by a linear layer (3 -> 1) from
 * made-up samples: a dataset of two fields, two library layers, a loss. */
#include <hpu/hpu.h>
#include <hpu/layers.h>

enum { IN = 3, SAMPLES = 512 };

/* Sample i: its features x[3] and its target y[1]. */
static int fetch(void *user, size_t i, void *const *out)
{
	float *x = out[0], *y = out[1];
	(void)user;
	for (int k = 0; k < IN; k++)
		x[k] = (float)((i * (size_t)(k + 3)) % 17) / 17.0f - 0.5f;
	y[0] = 2 * x[0] - 3 * x[1] + 0.5f * x[2] + 1;
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	(void)argc;
	(void)argv;
	hpu_dataset train = {.size = SAMPLES, .nfields = 2, .fetch = fetch,
			     .fields = {{"x", HPU_F32, 1, {IN}}, {"y", HPU_F32, 1, {1}}}};
	hpu_dataset_set(b, HPU_SPLIT_TRAIN, &train);
	hpu_linear(b, "fc", "x", "pred", (hpu_linear_opts){.out = 1, .bias = true}); /* x W^T + b */
	hpu_mse(b, "mse", "pred,y", "err"); /* (pred - y)^2 per sample */
	hpu_loss_add(b, "err", 1.0f);       /* minimize its mean */
	/* HPU_OK, or the first declaration that failed (it said why): after a
	 * failure the declarations do nothing, so none needs a check */
	return hpu_builder_status(b);
}

HPU_MODEL(.name = "linreg", .setup = setup);
EOF
# The headers must come from the prefix, not from a system-wide install.
inc=$(PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig pkg-config --cflags hpu) ||
	fail "pkg-config knows no hpu in $prefix/$libdir/pkgconfig"
read -r inc <<<"$inc" # pkg-config ends it with a space
[ "$(realpath "${inc#-I}")" = "$(realpath "$prefix/include")" ] ||
	fail "pkg-config --cflags hpu gives '$inc', not -I$prefix/include"
# README.md's quick start, word for word (but the output's name).
cc -shared -fPIC my.c $(PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig pkg-config --cflags --libs hpu) -o my.so ||
	fail "the model did not build against the installed tree"
# No libhpu: hpu-worker provides the hpu_* names (hpu.pc's Libs is empty).
! readelf -d my.so | grep '(NEEDED)' | grep -q 'libhpu\.so' ||
	fail "my.so has NEEDED libhpu.so: hpu.pc must not make a model link libhpu"

# ---- train it with the installed hpulaunch ----
run=("$prefix/bin/hpulaunch" --devices 2 --max-steps 12 --log-every 4 --batch-size 32
     --optimizer sgd --lr 0.1 ./my.so)
hidden=no
if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
	# Only this run sees the build's lib dir empty; other tests do not.
	hidden=yes
	unshare -m --propagation private bash -c \
		'mount -t tmpfs hpu-hidden "$1" && shift && exec "$@"' \
		_ "$build/lib" "${run[@]}" >out.log 2>&1
else
	"${run[@]}" >out.log 2>&1
fi
rc=$?
cat out.log
[ $rc = 0 ] || fail "the installed hpulaunch exited $rc (build lib dir hidden: $hidden)"
grep -Eq '^\[rank 0\] .*step [0-9]+/[0-9]+ loss [0-9]+\.[0-9]+' out.log ||
	fail "no loss line from rank 0"
grep -Eq '^\[rank 0\] trained 12 steps on 2 workers .*final loss [0-9]+\.[0-9]+' out.log ||
	fail "no final loss line for 12 steps on 2 workers"
echo "test_install: PASS (installed in $prefix, build lib dir hidden: $hidden)"
