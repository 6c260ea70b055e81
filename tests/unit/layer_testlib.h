/* layer_testlib: the cmocka helpers test_layers.c and test_layers_shape.c
 * share on top of layer_harness: harnesses over given fields, a
 * finite-difference check that must pass, a declaration that must be
 * refused, and the run of one PyTorch reference case
 * (tests/fixtures/refs, *.ref files) to LT_REF_TOL relative.
 *
 * Every helper fails the running cmocka test (assert_*) on a wrong
 * outcome. Built into each test program that uses it, which defines
 * HPU_REFS_DIR (the folder of the reference files).
 */
#ifndef HPU_TESTS_UNIT_LAYER_TESTLIB_H
#define HPU_TESTS_UNIT_LAYER_TESTLIB_H

#include <stddef.h>
#include <stdint.h>

#include <hpu/hpu.h>

#include "tests/unit/layer_harness.h"

#define LT_REF_TOL 1e-5 /* relative to the largest |reference| */

/* An f32 field of the given shape. */
hpu_field lt_field(const char *name, int ndim, const int64_t *shape);

/* A harness with one training field per entry of f. */
lh_harness *lt_harness(int max_batch, int nfields, const hpu_field *f);

/* The same with one f32 field "x" of the given shape. */
lh_harness *lt_harness_x(int max_batch, int ndim, const int64_t *shape);

/* lh_gradcheck (verbose) must agree; o may be NULL. */
void lt_gradcheck_ok(lh_harness *h, hpu_layer *l, int batch, void *const *in,
		     const lh_check_opts *o);

/* A declaration that must fail: NULL, and the builder's error names the
 * layer (and `also` when not NULL). */
void lt_refused(lh_harness *h, hpu_layer *l, const char *name, const char *also);

/* x[0..n) in a pseudo-random order given by seed (the same for the same
 * seed). */
void lt_shuffle(float *x, size_t n, uint64_t seed);

/* n zeroed floats (at least one). */
float *lt_alloc_f(size_t n);

/* got within LT_REF_TOL of want, relative; prints the difference. */
void lt_compare(const char *what, const float *got, const float *want, size_t n);

/* HPU_REFS_DIR/file, loaded. */
lh_ref *lt_load_ref(const char *file);

/* One reference case: its input arrays (each also the field's name, the
 * first dimension the batch; f32 or i32) and the names of their
 * gradients (NULL: not checked, none wanted). */
typedef struct lt_ref_case {
	const char *file;
	int nin;
	const char *in[2], *din[2];
	hpu_layer *(*declare)(hpu_builder *b, const lh_ref *r);
} lt_ref_case;

/* Declares the case's layer on the reference's inputs, sets its
 * parameters from the file ("layer.weight" from "weight"), runs forward
 * and backward with the file's "dy", and compares "y", the named input
 * gradients and the parameter gradients ("dweight") with the file's. */
void lt_run_ref(const lt_ref_case *rc);

#endif
