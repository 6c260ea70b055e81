#!/bin/bash
# test_pkgconfig.sh BUILD_DIR: a model built outside the tree against the
# BUILD tree's hpu.pc (PKG_CONFIG_PATH=BUILD/worker/hpu), as
# docs/writing-a-model.md says: `cc -shared -fPIC my.c $(pkg-config
# --cflags --libs hpu)`. The .pc's include directory must hold hpu/hpu.h;
# the model must not need libhpu.so (hpu-worker provides the hpu_* names:
# a model linked with -lhpu loads a second, unused copy of libhpu, and
# without an rpath does not load at all), so readelf shows no NEEDED
# libhpu; and the build's hpulaunch trains it for a step.
set -u
build=$(cd "${1:?usage: test_pkgconfig.sh BUILD_DIR}" && pwd) || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
unset LD_LIBRARY_PATH LD_PRELOAD
export PKG_CONFIG_PATH=$build/worker/hpu

fail()
{
	echo "test_pkgconfig: FAIL: $*" >&2
	exit 1
}

inc=$(pkg-config --variable=includedir hpu) || fail "pkg-config knows no hpu in $PKG_CONFIG_PATH"
[ -f "$inc/hpu/hpu.h" ] || fail "the build tree's hpu.pc says includedir=$inc, which has no hpu/hpu.h"

cd "$tmp" || exit 1
cat >my.c <<'EOF'
/* y = 2 x0 - 3 x1 + 1 by a linear layer, from made-up samples. */
#include <hpu/hpu.h>
#include <hpu/layers.h>

static int fetch(void *user, size_t i, void *const *out)
{
	float *x = out[0], *y = out[1];
	(void)user;
	x[0] = (float)(i % 7) / 7.0f;
	x[1] = (float)(i % 5) / 5.0f;
	y[0] = 2 * x[0] - 3 * x[1] + 1;
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	(void)argc;
	(void)argv;
	hpu_dataset train = {.size = 64, .nfields = 2, .fetch = fetch,
			     .fields = {{"x", HPU_F32, 1, {2}}, {"y", HPU_F32, 1, {1}}}};
	if (hpu_dataset_set(b, HPU_SPLIT_TRAIN, &train) != HPU_OK ||
	    !hpu_linear(b, "fc", "x", "pred", 1, 1) || !hpu_mse(b, "mse", "pred,y", "err") ||
	    hpu_loss_add(b, "err", 1.0f) != HPU_OK)
		return HPU_ERROR;
	return HPU_OK;
}

HPU_MODEL(.name = "pcmodel", .setup = setup);
EOF
flags=$(pkg-config --cflags --libs hpu) || fail "pkg-config --cflags --libs hpu failed"
echo "test_pkgconfig: pkg-config --cflags --libs hpu: $flags"
cc -shared -fPIC my.c $flags -o my.so || fail "the model did not build with: $flags"
needed=$(readelf -d my.so | grep '(NEEDED)')
echo "$needed"
if grep -q 'libhpu\.so' <<<"$needed"; then
	fail "my.so has NEEDED libhpu.so: a model must not link libhpu (hpu-worker provides the hpu_* names)"
fi
# The examples are built the same way (examples/CMakeLists.txt): none
# NEEDs libhpu, and one of them trains below as this model does.
for ex in fmnist_mlp fmnist_cnn resnet gpt_lm; do
	[ -f "$build/lib/$ex.so" ] || fail "no $build/lib/$ex.so"
	if readelf -d "$build/lib/$ex.so" | grep '(NEEDED)' | grep -q 'libhpu\.so'; then
		fail "examples/$ex has NEEDED libhpu.so: the examples must build as docs/writing-a-model.md says, without -lhpu"
	fi
done
# trains MODEL.so (WHAT names it in a failure) for a step
train_one()
{
	timeout 120 "$build/bin/hpulaunch" -q --devices 1 --max-steps 1 --log-every 1 --batch-size 16 \
		--optimizer sgd --lr 0.1 "./$1" >"$1.log" 2>&1
	local rc=$?
	cat "$1.log"
	[ $rc = 0 ] || fail "hpulaunch exited $rc on $2"
	grep -q 'trained 1 step' "$1.log" || fail "no 'trained 1 step' line from $2"
}
train_one my.so "the pkg-config-built model"

# The same model in C++ (20: designated fields in the structs' order):
# HPU_MODEL's symbol must be extern "C" there, or the namespace-scope
# const has internal linkage and nothing is exported ("has no entry
# symbol 'hpu_model_entry'", though the model used HPU_MODEL).
cat >my.cpp <<'EOF'
#include <hpu/hpu.h>
#include <hpu/layers.h>

static int fetch(void *user, size_t i, void *const *out)
{
	float *x = static_cast<float *>(out[0]), *y = static_cast<float *>(out[1]);
	(void)user;
	x[0] = (float)(i % 7) / 7.0f;
	x[1] = (float)(i % 5) / 5.0f;
	y[0] = 2 * x[0] - 3 * x[1] + 1;
	return 0;
}

static int setup(hpu_builder *b, int, char **)
{
	hpu_dataset train = {.size = 64, .nfields = 2,
			     .fields = {{"x", HPU_F32, 1, {2}}, {"y", HPU_F32, 1, {1}}},
			     .fetch = fetch, .user = nullptr};
	const hpu_linear_opts fc = {.out = 1, .bias = true}; /* C++ names the _v3 form */
	if (hpu_dataset_set(b, HPU_SPLIT_TRAIN, &train) != HPU_OK ||
	    !hpu_linear_v3(b, "fc", "x", "pred", fc) || !hpu_mse(b, "mse", "pred,y", "err") ||
	    hpu_loss_add(b, "err", 1.0f) != HPU_OK ||
	    /* the initializer shorthand, positional (C++ mixes no
	     * designated and positional fields; it was a compound literal) */
	    hpu_param_init(b, "fc.weight", HPU_INIT(UNIFORM, -0.1f, 0.1f)) != HPU_OK ||
	    hpu_param_init(b, "fc.bias", HPU_INIT(ZEROS)) != HPU_OK)
		return HPU_ERROR;
	return HPU_OK;
}

HPU_MODEL(.name = "pcmodel_cxx", .setup = setup);
EOF
c++ -std=c++20 -Wall -Wextra -Wpedantic -Werror -shared -fPIC my.cpp $flags -o mycxx.so || fail "the C++ model did not build with: $flags"
nm -D --defined-only mycxx.so | grep -q ' hpu_model_entry$' ||
	fail "the C++ model exports no hpu_model_entry (HPU_MODEL must make it extern \"C\")"
train_one mycxx.so "the C++ model"

# libhpucoll used on its own (coll.h, hpucoll.pc): a program built
# against the build tree's .pc runs with its library, whose version
# (hpucoll_version) is the header's and the .pc's.
cat >ver.c <<'EOF'
#include <hpu/coll.h>
#include <stdio.h>
int main(void)
{
	int v = hpucoll_version();
	printf("%d.%d.%d %d\n", v / 10000, v / 100 % 100, v % 100, v == HPUCOLL_VERSION_CODE);
	return 0;
}
EOF
cflags=$(PKG_CONFIG_PATH=$build/collectives pkg-config --cflags --libs hpucoll) ||
	fail "pkg-config knows no hpucoll in $build/collectives"
pcver=$(PKG_CONFIG_PATH=$build/collectives pkg-config --modversion hpucoll)
cc ver.c $cflags -Wl,-rpath,"$build/lib" -o ver || fail "a libhpucoll program did not build with: $cflags"
got=$(./ver) || fail "the libhpucoll program failed"
[ "$got" = "$pcver 1" ] ||
	fail "hpucoll_version() and HPUCOLL_VERSION_CODE say '$got', hpucoll.pc says $pcver (want '$pcver 1')"
echo "test_pkgconfig: libhpucoll $got"
echo "test_pkgconfig: PASS"
