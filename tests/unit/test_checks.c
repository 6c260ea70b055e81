/* Unit tests for the ops' deferred checks (worker/ops/checks.h) on the
 * CPU: armed, an op whose input is bad (a cross-entropy's label, an
 * embedding's id, a probability, a key mask's value) returns HPU_OK and
 * runs on without reading outside its tables, and the slots, copied
 * after the "step", name the layer, the op, the row and its dataset
 * sample, the value; good input reports nothing; past the last slot an
 * op checks eagerly; disarmed, the ops answer as before. The same on a
 * table other than the CPU's whose check entries write device memory
 * (findings_dev, as CUDA's): the embedding's kernels are told the
 * vocabulary. The slots are host memory here (the strategy gives device
 * memory). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/ops/backend.h"
#include "worker/ops/checks.h"
#include "worker/ops/fp8.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

#define ROWS 4
#define CLASSES 3

static const uint32_t samples[ROWS] = {10, 11, 12, 13};
static const float logits[ROWS * CLASSES] = {0.5f, -1.0f, 2.0f,  1.5f, 0.25f, -0.5f,
					     -2.0f, 1.0f, 0.75f, 0.0f, 3.0f,  1.0f};

static hpu__check_slot slots[8];

/* Arms 'n' slots for a batch of ROWS rows, layer `layer` running. */
static void arm(int n, const char *layer)
{
	memset(slots, 0xa5, sizeof slots); /* as device memory: not zeroed */
	hpu__checks_arm(slots, n);
	hpu__checks_batch(samples, ROWS);
	hpu__op_layer(0, layer, NULL, 0, 0);
}

/* The step's end: disarmed, the used slots copied, the report. */
static int report(char *msg, size_t len)
{
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	hpu__checks_disarm();
	hpu__check_slot copy[8];
	memcpy(copy, slots, (size_t)hpu__checks_used() * sizeof *copy);
	msg[0] = 0;
	int rc = hpu__checks_report(copy, msg, len);
	printf("  %d slot(s) used; report %d: %s\n", hpu__checks_used(), rc, msg);
	return rc;
}

static int teardown(void **state)
{
	(void)state;
	hpu__checks_disarm();
	hpu__checks_batch(NULL, 0);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	hpu__be_set(NULL);
	return 0;
}

static void test_xent_bad_label_deferred(void **state)
{
	(void)state;
	int32_t labels[ROWS] = {0, 2, 7, 1}, good[ROWS] = {0, 2, -100, 1};
	float lse[ROWS], loss[ROWS], want_lse[ROWS], want[ROWS];
	long bad = 5;
	int32_t y = 0;
	char msg[512];
	assert_int_equal(hpu_cross_entropy_positions_forward(logits, good, want_lse, want, ROWS, 1,
							     CLASSES, &bad, &y),
			 HPU_OK);
	arm(8, "xent");
	assert_int_equal(hpu_cross_entropy_positions_forward(logits, labels, lse, loss, ROWS, 1,
							     CLASSES, &bad, &y),
			 HPU_OK);
	assert_int_equal(bad, -1);
	/* the good rows as the eager op gives them; the bad one as ignored */
	assert_memory_equal(loss, want, sizeof loss);
	float dx[ROWS * CLASSES], want_dx[ROWS * CLASSES], dl[ROWS] = {1, 1, 1, 1};
	assert_int_equal(hpu_cross_entropy_positions_backward(logits, labels, lse, dl, dx, ROWS, 1,
							      CLASSES),
			 HPU_OK);
	assert_int_equal(hpu_cross_entropy_positions_backward(logits, good, want_lse, dl, want_dx,
							      ROWS, 1, CLASSES),
			 HPU_OK);
	assert_memory_equal(dx, want_dx, sizeof dx);
	assert_int_equal(report(msg, sizeof msg), 1);
	assert_int_equal(hpu__checks_used(), 1);
	assert_string_equal(msg, "layer xent: label 7 at row 2 (dataset sample 12), position 0 is "
				 "outside [0, 3) and not -100 (ignored): found after the step (the "
				 "cross-entropy's check, deferred)");
}

static void test_good_labels_report_nothing(void **state)
{
	(void)state;
	int32_t labels[ROWS] = {0, 2, 1, -100};
	float lse[ROWS], loss[ROWS];
	long bad;
	int32_t y;
	char msg[512];
	arm(8, "xent");
	assert_int_equal(hpu_cross_entropy_positions_forward(logits, labels, lse, loss, ROWS, 1,
							     CLASSES, &bad, &y),
			 HPU_OK);
	assert_int_equal(hpu_cross_entropy_forward(logits, labels, NULL, ROWS - 1, CLASSES) < 0, 0);
	assert_int_equal(report(msg, sizeof msg), 0);
	assert_int_equal(hpu__checks_used(), 2);
}

/* One slot: the second check is the eager one, and it says nothing in
 * the report (its op answered at once). */
static void test_slots_exhausted_check_eagerly(void **state)
{
	(void)state;
	int32_t good[ROWS] = {0, 1, 2, 1}, labels[ROWS] = {0, 1, 2, 9};
	float lse[ROWS], loss[ROWS];
	long bad;
	int32_t y = 0;
	char msg[512];
	arm(1, "xent");
	assert_int_equal(hpu_cross_entropy_positions_forward(logits, good, lse, loss, ROWS, 1,
							     CLASSES, &bad, &y),
			 HPU_OK);
	assert_int_equal(hpu_cross_entropy_positions_forward(logits, labels, lse, loss, ROWS, 1,
							     CLASSES, &bad, &y),
			 HPU_ERANGE);
	assert_int_equal(bad, 3);
	assert_int_equal(y, 9);
	assert_int_equal(report(msg, sizeof msg), 0);
	assert_int_equal(hpu__checks_used(), 1);
}

/* ids 9 and -3 outside a table of 4 rows (allocated to its size: under
 * ASan a read or write outside it fails the test): forward gives zero
 * rows for them and backward adds nothing for them, on the table the ops
 * use now. */
static void embedding_bad_id_deferred(void)
{
	enum { VOCAB = 4, DIM = 2, N = 4 };
	float *table = malloc(VOCAB * DIM * sizeof *table);
	float *dtable = calloc(VOCAB * DIM, sizeof *dtable);
	int32_t *ids = malloc(N * sizeof *ids);
	assert_non_null(table);
	assert_non_null(dtable);
	assert_non_null(ids);
	for (int i = 0; i < VOCAB * DIM; i++)
		table[i] = (float)(i + 1);
	memcpy(ids, (int32_t[]){1, 9, -3, 0}, N * sizeof *ids);
	float y[N * DIM], dy[N * DIM];
	for (int i = 0; i < N * DIM; i++)
		dy[i] = 1.0f;
	char msg[512];
	/* 2 rows of 2 ids */
	memset(slots, 0xa5, sizeof slots);
	hpu__checks_arm(slots, 8);
	hpu__checks_batch(samples, 2);
	hpu__op_layer(3, "tok", NULL, 0, 0);
	assert_int_equal(hpu_embedding_forward(table, ids, y, N, VOCAB, DIM), HPU_OK);
	float want[N * DIM] = {3, 4, 0, 0, 0, 0, 1, 2};
	assert_memory_equal(y, want, sizeof y);
	hpu_embedding_backward(ids, dy, dtable, N, DIM);
	float want_d[VOCAB * DIM] = {1, 1, 1, 1, 0, 0, 0, 0};
	assert_memory_equal(dtable, want_d, sizeof want_d);
	assert_int_equal(report(msg, sizeof msg), 1);
	assert_string_equal(msg, "layer tok: id 9 at position 1 of row 0 (dataset sample 10) is "
				 "outside the vocabulary [0, 4): found after the step (the "
				 "embedding's check, deferred)");
	free(table);
	free(dtable);
	free(ids);
}

static void test_embedding_bad_id_deferred(void **state)
{
	(void)state;
	embedding_bad_id_deferred();
}

/* The vocabulary each embedding kernel of the device-like table was
 * told (the host's loops stand for the device's kernels). */
static int told_fwd, told_bwd;

static int spy_embedding_fwd(const float *table, const int32_t *ids, float *y, int n, int vocab,
			     int dim)
{
	told_fwd = vocab;
	return hpu__be_host()->embedding_fwd(table, ids, y, n, vocab, dim);
}

static int spy_embedding_bwd(const int32_t *ids, const float *dy, float *dtable, int n,
			     int vocab, int dim)
{
	told_bwd = vocab;
	return hpu__be_host()->embedding_bwd(ids, dy, dtable, n, vocab, dim);
}

/* A table other than the CPU's whose check entries write their findings
 * into device memory (findings_dev, as CUDA's): the embedding's check
 * defers there too, its kernels told the vocabulary. */
static void test_embedding_deferred_on_device_table(void **state)
{
	(void)state;
	hpu__backend dev = *hpu__be_host();
	dev.findings_dev = 1;
	dev.embedding_fwd = spy_embedding_fwd;
	dev.embedding_bwd = spy_embedding_bwd;
	told_fwd = told_bwd = -1;
	hpu__be_set(&dev);
	embedding_bad_id_deferred();
	hpu__be_set(NULL);
	assert_int_equal(told_fwd, 4);
	assert_int_equal(told_bwd, 4);
}

/* softmax cross-entropy (hpu_cross_entropy_forward), a probability, a
 * key mask's value: each named. */
static void test_other_checks_deferred(void **state)
{
	(void)state;
	int32_t labels[ROWS] = {0, 2, 1, 3};
	float dlogits[ROWS * CLASSES];
	char msg[512];
	arm(8, "head");
	float l = hpu_cross_entropy_forward(logits, labels, dlogits, ROWS, CLASSES);
	assert_true(isfinite(l) && l >= 0);
	for (int c = 0; c < CLASSES; c++)
		assert_true(dlogits[3 * CLASSES + c] == 0.0f);
	assert_int_equal(report(msg, sizeof msg), 1);
	assert_string_equal(msg, "layer head: label 3 at row 3 (dataset sample 13), position 0 is "
				 "outside [0, 3) and not -100 (ignored): found after the step (the "
				 "cross-entropy's check, deferred)");

	float p[ROWS * 2] = {0.5f, 0.25f, 0.125f, 1.0f, 0.0f, 1.5f, 0.5f, 0.5f};
	float t[ROWS * 2] = {1, 0, 1, 0, 1, 0, 1, 0}, loss[ROWS];
	long bad;
	float v;
	arm(8, "bce");
	assert_int_equal(hpu_bce_forward(0, p, t, loss, ROWS, 2, &bad, &v), HPU_OK);
	assert_int_equal(bad, -1);
	assert_int_equal(report(msg, sizeof msg), 1);
	assert_string_equal(msg, "layer bce: probability 1.5 at row 2 (dataset sample 12), element "
				 "1 is outside [0, 1]: found after the step (the binary "
				 "cross-entropy's check, deferred)");

	int32_t mask[ROWS * 2] = {1, 1, 1, 0, 1, 1, 2, 1}, mv;
	arm(8, "attn");
	assert_int_equal(hpu_ids_first_bad(mask, ROWS * 2, 2, &bad, &mv), HPU_OK);
	assert_int_equal(report(msg, sizeof msg), 1);
	assert_string_equal(msg, "layer attn: value 2 at position 0 of row 3 (dataset sample 13) is "
				 "outside [0, 2): found after the step (the id check, deferred)");
}

/* Disarmed (and armed in an earlier step): every op answers at once, as
 * before, and takes no slot. */
static void test_disarmed_as_before(void **state)
{
	(void)state;
	int32_t labels[ROWS] = {0, 2, 7, 1};
	float lse[ROWS], loss[ROWS];
	long bad;
	int32_t y;
	arm(8, "xent");
	hpu__checks_disarm();
	assert_int_equal(hpu_cross_entropy_positions_forward(logits, labels, lse, loss, ROWS, 1,
							     CLASSES, &bad, &y),
			 HPU_ERANGE);
	assert_int_equal(bad, 2);
	assert_int_equal(y, 7);
	assert_true(hpu_cross_entropy_forward(logits, labels, NULL, ROWS, CLASSES) == -1.0f);
	float table[8] = {0}, out[4];
	int32_t ids[2] = {0, 4};
	assert_int_equal(hpu_embedding_forward(table, ids, out, 2, 4, 2), HPU_ERANGE);
	float p[2] = {0.5f, -0.5f}, t[2] = {0, 0}, l[1], v;
	assert_int_equal(hpu_bce_forward(0, p, t, l, 1, 2, &bad, &v), HPU_ERANGE);
	assert_int_equal(bad, 1);
	assert_int_equal(hpu__checks_used(), 0);
	assert_int_equal(hpu__checks_limit(ids), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_teardown(test_xent_bad_label_deferred, teardown),
	    cmocka_unit_test_teardown(test_good_labels_report_nothing, teardown),
	    cmocka_unit_test_teardown(test_slots_exhausted_check_eagerly, teardown),
	    cmocka_unit_test_teardown(test_embedding_bad_id_deferred, teardown),
	    cmocka_unit_test_teardown(test_embedding_deferred_on_device_table, teardown),
	    cmocka_unit_test_teardown(test_other_checks_deferred, teardown),
	    cmocka_unit_test_teardown(test_disarmed_as_before, teardown),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	hpu__checks_free();
	return rc;
}
