/* layer_testlib: see layer_testlib.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>

#include "tests/unit/layer_testlib.h"

#ifndef HPU_REFS_DIR
#error "HPU_REFS_DIR must name tests/fixtures/refs"
#endif

hpu_field lt_field(const char *name, int ndim, const int64_t *shape)
{
	hpu_field f = {.name = name, .dtype = HPU_F32, .ndim = ndim};
	memcpy(f.shape, shape, (size_t)ndim * sizeof *shape);
	return f;
}

lh_harness *lt_harness(int max_batch, int nfields, const hpu_field *f)
{
	lh_harness *h = lh_new(max_batch);
	assert_non_null(h);
	assert_int_equal(lh_dataset(h, nfields, f, NULL, 4), HPU_OK);
	return h;
}

lh_harness *lt_harness_x(int max_batch, int ndim, const int64_t *shape)
{
	hpu_field f = lt_field("x", ndim, shape);
	return lt_harness(max_batch, 1, &f);
}

void lt_gradcheck_ok(lh_harness *h, hpu_layer *l, int batch, void *const *in,
		     const lh_check_opts *o)
{
	char msg[512];
	lh_check_opts v = o ? *o : (lh_check_opts){0};
	v.verbose = 1;
	int rc = lh_gradcheck(h, l, batch, in, &v, msg, sizeof msg);
	if (rc)
		printf("  FAIL: %s\n", msg);
	assert_int_equal(rc, 0);
}

void lt_refused(lh_harness *h, hpu_layer *l, const char *name, const char *also)
{
	printf("  refused: %s\n", lh_error(h));
	assert_null(l);
	assert_non_null(strstr(lh_error(h), name));
	if (also)
		assert_non_null(strstr(lh_error(h), also));
	lh_clear_error(h);
}

void lt_shuffle(float *x, size_t n, uint64_t seed)
{
	if (n < 2)
		return;
	for (size_t i = n - 1; i > 0; i--) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		size_t j = (size_t)(seed >> 33) % (i + 1);
		float t = x[i];
		x[i] = x[j];
		x[j] = t;
	}
}

float *lt_alloc_f(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof *p);
	assert_non_null(p);
	return p;
}

void lt_compare(const char *what, const float *got, const float *want, size_t n)
{
	double d = lh_maxrel(got, want, n, 1e-6);
	printf("  %-10s rel maxdiff %.3g%s\n", what, d, d <= LT_REF_TOL ? "" : "  FAIL");
	assert_true(d <= LT_REF_TOL);
}

lh_ref *lt_load_ref(const char *file)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", HPU_REFS_DIR, file);
	lh_ref *r = lh_ref_load(path);
	assert_non_null(r);
	return r;
}

/* The array `name` of r, f32 or else i32 (its type in *dt). */
static const void *ref_array(const lh_ref *r, const char *name, hpu_dtype *dt, size_t *n,
			     int *ndim, int64_t *shape)
{
	const void *v = lh_ref_get(r, name, HPU_F32, n, ndim, shape);
	*dt = HPU_F32;
	if (!v) {
		v = lh_ref_get(r, name, HPU_I32, n, ndim, shape);
		*dt = HPU_I32;
	}
	if (!v)
		printf("  reference has no array %s\n", name);
	assert_non_null(v);
	return v;
}

/* The harness over the case's inputs (data, n: each input's values and
 * count; *batch: the first dimension), its layer declared and its
 * parameters set from the file. */
static hpu_layer *ref_setup(const lt_ref_case *rc, const lh_ref *r, lh_harness **hp,
			    const void **data, size_t *n, int *batch)
{
	hpu_field f[2];
	for (int k = 0; k < rc->nin; k++) {
		int ndim;
		int64_t shape[4];
		data[k] = ref_array(r, rc->in[k], &f[k].dtype, &n[k], &ndim, shape);
		f[k].name = rc->in[k];
		f[k].ndim = ndim - 1;
		memcpy(f[k].shape, shape + 1, 3 * sizeof *shape);
		*batch = (int)shape[0];
	}
	lh_harness *h = *hp = lh_new(*batch);
	assert_int_equal(lh_dataset(h, rc->nin, f, data, (size_t)*batch), HPU_OK);
	hpu_layer *l = rc->declare(lh_builder(h), r);
	if (!l)
		printf("  %s\n", lh_error(h));
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	hpu_builder *b = lh_builder(h);
	for (int p = 0; p < l->npidx; p++) { /* "layer.weight" -> "weight" */
		const hpu_param_info *pi = &b->params[l->pidx[p]];
		size_t pn;
		const float *v = lh_ref_get(r, strchr(pi->name, '.') + 1, HPU_F32, &pn, NULL, NULL);
		assert_non_null(v);
		assert_int_equal(pn, pi->numel);
		memcpy(hpu_param(l, p), v, pn * sizeof *v);
	}
	return l;
}

/* The parameter gradients against the file's "d<name>". */
static void compare_param_grads(const lh_ref *r, lh_harness *h, hpu_layer *l)
{
	hpu_builder *b = lh_builder(h);
	for (int p = 0; p < l->npidx; p++) {
		const hpu_param_info *pi = &b->params[l->pidx[p]];
		char name[64];
		snprintf(name, sizeof name, "d%s", strchr(pi->name, '.') + 1);
		const float *gwant = lh_ref_get(r, name, HPU_F32, NULL, NULL, NULL);
		assert_non_null(gwant);
		lt_compare(name, hpu_grad(l, p), gwant, pi->numel);
	}
}

void lt_run_ref(const lt_ref_case *rc)
{
	printf(" %s\n", rc->file);
	lh_ref *r = lt_load_ref(rc->file);
	lh_harness *h;
	const void *data[2] = {NULL, NULL};
	size_t n[2], yn, dyn;
	int batch = 0;
	hpu_layer *l = ref_setup(rc, r, &h, data, n, &batch);
	const float *want = lh_ref_get(r, "y", HPU_F32, &yn, NULL, NULL);
	const float *dy = lh_ref_get(r, "dy", HPU_F32, &dyn, NULL, NULL);
	assert_non_null(want);
	assert_non_null(dy);
	assert_int_equal(yn, lh_numel(h, "y") * (size_t)batch);
	float *y = lt_alloc_f(yn), *din[2] = {NULL, NULL};
	void *in[2] = {(void *)data[0], (void *)data[1]}, *out[1] = {y};
	hpu_ctx c = lh_ctx(h, l, 1, 0, batch);
	assert_int_equal(lh_forward(h, l, &c, in, out), 0);
	lt_compare("y", y, want, yn);
	for (int k = 0; k < rc->nin; k++)
		if (rc->din[k])
			din[k] = lt_alloc_f(n[k]);
	void *dout[1] = {(void *)dy}, *dinv[2] = {din[0], din[1]};
	lh_zero_grads(h);
	assert_int_equal(lh_backward(h, l, &c, in, out, dout, dinv), 0);
	for (int k = 0; k < rc->nin; k++) {
		if (!rc->din[k])
			continue;
		size_t dn;
		const float *dwant = lh_ref_get(r, rc->din[k], HPU_F32, &dn, NULL, NULL);
		assert_non_null(dwant);
		assert_int_equal(dn, n[k]);
		lt_compare(rc->din[k], din[k], dwant, dn);
		free(din[k]);
	}
	compare_param_grads(r, h, l);
	free(y);
	lh_free(&h);
	lh_ref_free(&r);
}
