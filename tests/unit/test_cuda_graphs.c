/* The CUDA device's recording of a step (worker/device/device.h's
 * hpu__device.recorder, worker/cuda/cuda_device.c: CUDA's stream capture
 * into a CUDA graph, --graphs of issue 36), on a GPU:
 *
 *   - a step's kinds of work recorded (a product through the kernel
 *     table, an eltwise op, loss_seed, a copy from a pinned block, a
 *     fill): nothing runs while recording, the graph holds nodes (named:
 *     the kernels by function, the copy and fill by node type), a launch
 *     gives the eager run's bytes, and a launch after the pinned block
 *     changed copies the new values;
 *   - each refusal (a copy into host memory, an op returning a value, a
 *     wait, dropout, an op reading its result back, a copy from pageable
 *     memory, the all-reduce over CUDA IPC, the kernels' scratch growing,
 *     a sync the module does not guard) makes the end answer 1 with its sentence, and eager
 *     work on the device's stream runs right after it;
 *   - the data checks writing their findings into device slots
 *     (findings_dev: xent_pos_fwd, bce_fwd, ids_first_bad, ids_in_range)
 *     inside a recording, found after the launch with no host copy inside
 *     the step, the same as the CPU's table finds;
 *   - a gpt_lm-like step through the public ops (token and position
 *     embeddings, add, layer norm, the tied head, cross-entropy over
 *     positions, their backwards; no dropout) with the ops' checks armed
 *     on device slots: an id outside the vocabulary is reported after an
 *     eager step with the CPU's sentence (its row zero, as the CPU's);
 *     the step records with no refusal, replays to the eager step's
 *     bytes, and a replay after a bad id was written into the batch
 *     reports it with the CPU's sentence;
 *   - a graph whose ops took the kernels' scratch, replayed after an
 *     eager call outgrew it: the old buffer is kept for the graph (no
 *     block allocated after the growth is written) and the replay gives
 *     the eager sums.
 *
 * Skipped (77, with the reason) where no GPU is visible. Every step
 * prints a line, so that a failure can be read from the log alone. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "tests/unit/cuda_testlib.h"

#include "worker/cuda/cuda_device.h"
#include "worker/device/device.h"
#include "worker/ops/backend.h"
#include "worker/ops/checks.h"
#include "worker/ops/fp8.h"

#include "hpu/ops.h"

/* cuda_device.c's entry (built into this program) */
const hpu__device *hpu_cuda_device_v1(int *ngpus, char *err, size_t errlen);

enum { M = 64, N = 64, KD = 64, NE = M * N, NB = 4096 };

static const hpu__device *D;
static const hpu__backend *be;

#define CU(call) cu_ok((call), cudaSuccess, #call)

static void cu_ok(int got, int want, const char *what)
{
	if (got != want)
		fail_msg("%s: %d (%s)", what, got, cudaGetErrorString((cudaError_t)got));
}

static void sync_dev(void)
{
	CU(cudaStreamSynchronize(hpu__cuda_stream()));
}

static void get(void *h, const void *d, size_t bytes)
{
	sync_dev();
	CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static void put(void *d, const void *h, size_t bytes)
{
	CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
	CU(cudaDeviceSynchronize());
}

static float frand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* The recorder's end, and the graph's nodes (0 without one). */
static int end_rec(void **g, size_t *nodes, char *why, size_t len)
{
	int rc = D->recorder->end(g, why, len);
	*nodes = *g ? D->recorder->nodes(*g) : 0;
	return rc;
}

/* ---- a step's work, recorded and replayed ---- */

typedef struct stepbufs {
	float *a, *b, *c, *e, *g, *h, *m; /* device */
	double *sums;
	hpu__dev_stepvars *sv;
	float *pinned; /* NB floats, pinned host memory */
} stepbufs;

static stepbufs B;

/* The outputs c, e, g, h, m to a pattern, on the device's stream. */
static void reset_outputs(void)
{
	cudaStream_t s = hpu__cuda_stream();
	CU(cudaMemsetAsync(B.c, 0x11, NE * 4, s));
	CU(cudaMemsetAsync(B.e, 0x22, NE * 4, s));
	CU(cudaMemsetAsync(B.g, 0, NE * 4, s));
	CU(cudaMemsetAsync(B.h, 0x33, NB * 4, s));
	CU(cudaMemsetAsync(B.m, 0x44, NB * 4, s));
	sync_dev();
}

/* c = a b, e = relu(c), g += loss_seed, h = pinned, m = 0x5a bytes. */
static void step_work(void)
{
	hpu__gemm gm = {.dt = HPU_DT_F32, .count = 1, .m = M, .n = N, .k = KD, .a = B.a,
			.b = B.b, .c = B.c, .stride_a = M * KD, .stride_b = KD * N,
			.stride_c = M * N};
	assert_int_equal(be->gemm(&gm), HPU_BE_OK);
	assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, B.c, B.e, NE), HPU_BE_OK);
	D->rt->loss_seed(B.g, NE, B.sums, 2, 0.5f, 0.75f, 32, B.sv);
	D->copy(NULL, B.h, B.pinned, NB * 4);
	D->fill(NULL, B.m, 0x5a, NB * 4);
}

typedef struct outs {
	float c[NE], e[NE], g[NE], h[NB], m[NB];
} outs;

static void fetch(outs *o)
{
	get(o->c, B.c, sizeof o->c);
	get(o->e, B.e, sizeof o->e);
	get(o->g, B.g, sizeof o->g);
	get(o->h, B.h, sizeof o->h);
	get(o->m, B.m, sizeof o->m);
}

static void same(const char *what, const outs *got, const outs *want)
{
	check_bits("c = a b (gemm)", got->c, want->c, sizeof got->c);
	check_bits("e = relu(c)", got->e, want->e, sizeof got->e);
	check_bits("g (loss_seed)", got->g, want->g, sizeof got->g);
	check_bits("h (copy from pinned memory)", got->h, want->h, sizeof got->h);
	check_bits("m (fill)", got->m, want->m, sizeof got->m);
	printf("  %s: the same bytes as the eager run\n", what);
}

static int setup_step(void **state)
{
	(void)state;
	uint64_t rng = 36;
	float *ha = malloc(NE * 4), *hb = malloc(NE * 4);
	assert_non_null(ha);
	assert_non_null(hb);
	for (int i = 0; i < NE; i++) {
		ha[i] = frand(&rng);
		hb[i] = frand(&rng);
	}
	B.a = dput(ha, NE * 4);
	B.b = dput(hb, NE * 4);
	B.c = dnan(NE * 4);
	B.e = dnan(NE * 4);
	B.g = dnan(NE * 4);
	B.h = dnan(NB * 4);
	B.m = dnan(NB * 4);
	const double s2[2] = {1.25, 2.5};
	B.sums = dput(s2, sizeof s2);
	hpu__dev_stepvars sv = {.lr = 1e-3, .loss_scale = 1.0, .gscale = 1.0f};
	B.sv = dput(&sv, sizeof sv);
	B.pinned = D->host_alloc(NB * 4);
	assert_non_null(B.pinned);
	for (int i = 0; i < NB; i++)
		B.pinned[i] = (float)i * 0.5f;
	CU(cudaDeviceSynchronize());
	free(ha);
	free(hb);
	return 0;
}

static int teardown_step(void **state)
{
	(void)state;
	sync_dev();
	dfree(B.a), dfree(B.b), dfree(B.c), dfree(B.e), dfree(B.g), dfree(B.h), dfree(B.m);
	dfree(B.sums), dfree(B.sv);
	D->host_free(B.pinned);
	return 0;
}

/* The count of names that contain `part` among c[n]. */
static size_t named(const hpu__dev_node_count *c, size_t n, const char *part)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strstr(c[i].name, part))
			k += c[i].count;
	return k;
}

/* The recorder's nodes by name (the profiler's graph_replay args): every
 * node named, the counts adding up to the nodes; step_work's relu and
 * loss_seed kernels by their functions' names, its copy and fill by
 * their nodes' types. */
static void check_names(void *g, size_t nodes)
{
	const hpu__dev_node_count *c = NULL;
	assert_non_null(D->recorder->names);
	size_t n = D->recorder->names(g, &c), sum = 0;
	printf("  the graph's %zu nodes by name (%zu names):\n", nodes, n);
	for (size_t i = 0; i < n; i++) {
		printf("    %-60s %zu\n", c[i].name, c[i].count);
		assert_true(c[i].name && c[i].name[0]);
		sum += c[i].count;
	}
	assert_true(n > 0);
	assert_int_equal(sum, nodes);
	if (!named(c, n, "k_eltwise_fwd") || !named(c, n, "k_loss_seed") ||
	    !named(c, n, "memcpy") || !named(c, n, "memset"))
		fail_msg("wanted k_eltwise_fwd, k_loss_seed, memcpy and memset among the names "
			 "above");
	printf("  named: k_eltwise_fwd, k_loss_seed, memcpy, memset\n");
}

static void test_record_replay(void **state)
{
	(void)state;
	static outs eager, before, got;
	char err[512] = "";
	/* eager: the first call also makes the kernels' plans and scratch */
	reset_outputs();
	step_work();
	fetch(&eager);
	reset_outputs();
	fetch(&before);

	assert_int_equal(D->recorder->begin(err, sizeof err), 0);
	step_work();
	void *g = NULL;
	size_t nodes = 0;
	int rc = end_rec(&g, &nodes, err, sizeof err);
	printf("  recorded: end %d, %zu nodes%s%s\n", rc, nodes, rc ? ": " : "", rc ? err : "");
	assert_int_equal(rc, 0);
	assert_non_null(g);
	assert_true(nodes >= 5);
	check_names(g, nodes);
	fetch(&got);
	check_bits("nothing ran while recording (c)", got.c, before.c, sizeof got.c);
	check_bits("nothing ran while recording (g)", got.g, before.g, sizeof got.g);
	check_bits("nothing ran while recording (h)", got.h, before.h, sizeof got.h);
	check_bits("nothing ran while recording (m)", got.m, before.m, sizeof got.m);
	printf("  nothing ran while recording\n");

	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	fetch(&got);
	same("launch 1", &got, &eager);

	/* the batch changes between steps: the graph reads the pinned block */
	for (int i = 0; i < NB; i++)
		B.pinned[i] = (float)i * -0.25f + 3.0f;
	reset_outputs();
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	fetch(&got);
	check_bits("h after the pinned block changed", got.h, B.pinned, sizeof got.h);
	check_bits("c again", got.c, eager.c, sizeof got.c);
	check_bits("g again (loss_seed adds onto the reset g)", got.g, eager.g, sizeof got.g);
	printf("  launch 2 after the pinned block changed: the new values copied\n");

	/* rebound (a replay reading the loader's buffer, hpu__dev_graph_rebind):
	 * the copy reads another pinned block from the next launch on */
	assert_non_null(D->recorder->rebind);
	float *other = D->host_alloc(NB * 4);
	assert_non_null(other);
	for (int i = 0; i < NB; i++)
		other[i] = (float)i * 0.125f - 1.0f;
	assert_int_equal(D->recorder->rebind(g, B.pinned, other, NB * 4 - 4, err, sizeof err), 0);
	assert_int_equal(D->recorder->rebind(g, other, B.pinned, NB * 4, err, sizeof err), 0);
	int r = D->recorder->rebind(g, B.pinned, other, NB * 4, err, sizeof err);
	if (r != 1)
		fail_msg("rebind answered %d (%s), not the one copy", r, err);
	reset_outputs();
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	fetch(&got);
	check_bits("h after the copy was pointed at another block", got.h, other, sizeof got.h);
	check_bits("c with the copy pointed elsewhere", got.c, eager.c, sizeof got.c);
	assert_int_equal(D->recorder->rebind(g, other, B.pinned, NB * 4, err, sizeof err), 1);
	reset_outputs();
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	fetch(&got);
	check_bits("h pointed back", got.h, B.pinned, sizeof got.h);
	printf("  launch 3 and 4: the copy pointed at another pinned block, then back\n");
	sync_dev();
	D->host_free(other);
	D->recorder->free(g);
}

/* ---- refusals ---- */

static float *rx, *ry, *rref; /* an eager relu's input, output, and its right answer */
static float rhost[NE];

static int refused_dropout(void)
{
	return be->dropout_fwd(B.a, B.c, (uint8_t *)B.e, NE, 0.1f, 42, 7);
}

static void r_d2h(void) { D->copy(NULL, rhost, B.a, 64); }
static void r_value(void) { assert_true(D->rt->sumsq(B.a, NE) == 0.0); }
static void r_wait(void)
{
	hpu__dev_event ev;
	D->record(NULL, &ev);
	D->wait(&ev);
}
static void r_dropout(void) { assert_int_equal(refused_dropout(), HPU_BE_UNSUPPORTED); }
static void r_readback(void)
{
	float loss = 0;
	/* labels: b's bits (the kernel is recorded, never run) */
	assert_int_equal(be->softmax_xent(B.a, (const int32_t *)B.b, NULL, 8, 10, &loss),
			 HPU_BE_UNSUPPORTED);
}
/* (refused before the group is touched: no group is needed) */
static void r_allreduce(void)
{
	assert_int_equal(D->coll->all_reduce(NULL, B.a, B.c, 64, HPU__DEV_F32), 0);
}
/* attention's backward wants 16 MiB of scratch (t 2048): more than any
 * op before needed; refused at the growth, its kernel never recorded */
static void r_scratch(void)
{
	assert_int_equal(be->attention_bwd(B.a, B.c, B.e, B.g, 1, 2048, 1, 16),
			 HPU_BE_UNSUPPORTED);
}
static void r_pageable(void) { D->copy(NULL, B.h, rhost, 64); }
static void r_unguarded(void) { (void)cudaStreamSynchronize(hpu__cuda_stream()); }

typedef struct refusal {
	const char *name;
	void (*run)(void);
	const char *says; /* in the sentence; NULL: any sentence */
} refusal;

static const refusal refusals[] = {
	{"a copy into host memory", r_d2h, "hpu__dev_d2h"},
	{"an op returning a value (sumsq)", r_value, "sumsq"},
	/* refused at the record already: a host wait on an event captured
	 * into the graph would fail after the recording */
	{"an event recorded, then waited for", r_wait, "hpu__dev_event_record"},
	{"dropout", r_dropout, "dropout draws its keys on the host"},
	{"an op reading its result back (softmax_xent)", r_readback,
	 "its result comes back to the host"},
	{"a copy from pageable host memory", r_pageable, "pageable"},
	{"the all-reduce over CUDA IPC", r_allreduce, "all-reduce over CUDA IPC"},
	{"the kernels' scratch growing", r_scratch, "the kernels' scratch"},
	{"a sync the module does not guard (the test's own)", r_unguarded, NULL},
};

static void eager_relu_ok(const char *after)
{
	static float got[NE];
	CU(cudaMemsetAsync(ry, 0x77, NE * 4, hpu__cuda_stream()));
	assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, rx, ry, NE), HPU_BE_OK);
	get(got, ry, sizeof got);
	get(rhost, rref, sizeof rhost);
	check_bits(after, got, rhost, sizeof got);
}

static void test_refusals(void **state)
{
	(void)state;
	rx = B.a;
	ry = dnan(NE * 4);
	rref = dnan(NE * 4);
	CU(cudaDeviceSynchronize()); /* (dnan's memset is on the legacy stream) */
	assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, rx, rref, NE), HPU_BE_OK);
	/* softmax_xent once eagerly: its slot's scratch is there before the
	 * recording (else the refusal would be the scratch's growth) */
	int32_t lab[8] = {0, 1, 2, 3, 4, 5, 6, 7};
	int32_t *dlab = dput(lab, sizeof lab);
	CU(cudaDeviceSynchronize());
	float loss = -1;
	assert_int_equal(be->softmax_xent(B.a, dlab, NULL, 8, 10, &loss), HPU_BE_OK);
	printf("  an eager softmax_xent's loss: %g\n", (double)loss);
	dfree(dlab);
	sync_dev();
	for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
		const refusal *r = &refusals[i];
		char err[512] = "";
		printf("  %-52s ", r->name);
		fflush(stdout);
		assert_int_equal(D->recorder->begin(err, sizeof err), 0);
		assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, rx, ry, NE), HPU_BE_OK);
		r->run();
		void *g = (void *)1;
		size_t nodes = 99;
		int rc = end_rec(&g, &nodes, err, sizeof err);
		printf("end %d: %s\n", rc, err);
		if (rc != 1)
			fail_msg("%s: the recording's end answered %d, not 1 (refused)", r->name, rc);
		assert_null(g);
		assert_int_equal(nodes, 0);
		assert_true(err[0] != '\0');
		if (r->says && !strstr(err, r->says))
			fail_msg("%s: the sentence \"%s\" does not say \"%s\"", r->name, err, r->says);
		char after[160];
		snprintf(after, sizeof after, "an eager relu after refusing %s", r->name);
		eager_relu_ok(after);
	}
	/* after them all, a recording still works */
	char err[512] = "";
	assert_int_equal(D->recorder->begin(err, sizeof err), 0);
	assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, rx, ry, NE), HPU_BE_OK);
	void *g = NULL;
	size_t nodes = 0;
	assert_int_equal(end_rec(&g, &nodes, err, sizeof err), 0);
	CU(cudaMemsetAsync(ry, 0x77, NE * 4, hpu__cuda_stream()));
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	static float got[NE];
	get(got, ry, sizeof got);
	get(rhost, rref, sizeof rhost);
	check_bits("a relu recorded and launched after the refusals", got, rhost, sizeof got);
	D->recorder->free(g);
	printf("  a recording after the refusals records and replays\n");
	dfree(ry), dfree(rref);
}

/* ---- the checks' findings in device slots ---- */

enum { ROWS = 2, POS = 8, CLS = 5, NIDS = 40, LIMIT = 7, NP = 16 };

static void test_check_slots(void **state)
{
	(void)state;
	const hpu__backend *cpu = hpu__be_host();
	assert_int_equal(be->findings_dev, 1);
	uint64_t rng = 7;
	static float logits[ROWS * POS * CLS], p[ROWS * NP], t[ROWS * NP];
	int32_t labels[ROWS * POS], ids[NIDS];
	for (size_t i = 0; i < sizeof logits / 4; i++)
		logits[i] = frand(&rng);
	for (int i = 0; i < ROWS * POS; i++)
		labels[i] = i % CLS;
	labels[3] = -100;  /* ignored */
	labels[11] = 7;    /* the first bad label */
	labels[13] = -3;
	for (int i = 0; i < NIDS; i++)
		ids[i] = i % LIMIT;
	ids[17] = LIMIT + 3; /* the first bad id */
	ids[25] = -1;
	for (int i = 0; i < ROWS * NP; i++) {
		p[i] = (frand(&rng) + 1.0f) * 0.5f;
		t[i] = i % 2 ? 1.0f : 0.0f;
	}
	p[20] = 1.5f; /* the first bad probability */
	p[27] = -0.25f;

	/* the CPU's findings */
	static float lse_h[ROWS * POS], loss_h[ROWS];
	long want_x = 0, want_b = 0, want_i = 0;
	int32_t want_label = 0, want_id = 0;
	float want_p = 0;
	assert_int_equal(cpu->xent_pos_fwd(logits, labels, lse_h, loss_h, ROWS, POS, CLS, &want_x,
					   &want_label),
			 HPU_BE_OK);
	assert_int_equal(cpu->bce_fwd(0, p, t, loss_h, ROWS, NP, &want_b, &want_p), HPU_BE_OK);
	assert_int_equal(cpu->ids_first_bad(ids, NIDS, LIMIT, &want_i, &want_id), HPU_BE_OK);
	printf("  the CPU finds: label %d at %ld, probability %g at %ld, id %d at %ld\n",
	       want_label, want_x, (double)want_p, want_b, want_id, want_i);
	assert_int_equal(want_x, 11);
	assert_int_equal(want_b, 20);
	assert_int_equal(want_i, 17);

	float *dlogits = dput(logits, sizeof logits), *dp = dput(p, sizeof p),
	      *dt = dput(t, sizeof t);
	int32_t *dlabels = dput(labels, sizeof labels), *dids = dput(ids, sizeof ids);
	float *dlse = dnan(sizeof lse_h), *dloss = dnan(sizeof loss_h);
	int *dok = dnan(sizeof(int));
	hpu__check_slot zero[3];
	memset(zero, 0, sizeof zero);
	hpu__check_slot *slots = dput(zero, sizeof zero);
	CU(cudaDeviceSynchronize());

	/* eager first (scratch), then recorded: nothing comes back inside */
	for (int pass = 0; pass < 2; pass++) {
		char err[512] = "";
		void *g = NULL;
		size_t nodes = 0;
		put(slots, zero, sizeof zero);
		if (pass)
			assert_int_equal(D->recorder->begin(err, sizeof err), 0);
		assert_int_equal(be->xent_pos_fwd(dlogits, dlabels, dlse, dloss, ROWS, POS, CLS,
						  &slots[0].bad, &slots[0].bad_id),
				 HPU_BE_OK);
		assert_int_equal(be->bce_fwd(0, dp, dt, dloss, ROWS, NP, &slots[1].bad,
					     &slots[1].bad_value),
				 HPU_BE_OK);
		assert_int_equal(be->ids_first_bad(dids, NIDS, LIMIT, &slots[2].bad,
						   &slots[2].bad_id),
				 HPU_BE_OK);
		assert_int_equal(be->ids_in_range(dids, NIDS, LIMIT, dok), HPU_BE_OK);
		hpu__check_slot got[3];
		if (pass) {
			int rc = end_rec(&g, &nodes, err, sizeof err);
			printf("  the checks recorded: end %d, %zu nodes%s%s\n", rc, nodes,
			       rc ? ": " : "", rc ? err : "");
			assert_int_equal(rc, 0);
			get(got, slots, sizeof got);
			check_bits("the slots untouched while recording", got, zero, sizeof got);
			assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
		}
		int ok = -1;
		get(got, slots, sizeof got);
		get(&ok, dok, sizeof ok);
		printf("  %s: label %d at %ld, probability %g at %ld, id %d at %ld, ids ok %d\n",
		       pass ? "replayed" : "eager", got[0].bad_id, got[0].bad,
		       (double)got[1].bad_value, got[1].bad, got[2].bad_id, got[2].bad, ok);
		assert_int_equal(got[0].bad, want_x);
		assert_int_equal(got[0].bad_id, want_label);
		assert_int_equal(got[1].bad, want_b);
		check_bits("the bad probability's bits", &got[1].bad_value, &want_p, 4);
		assert_int_equal(got[2].bad, want_i);
		assert_int_equal(got[2].bad_id, want_id);
		assert_int_equal(ok, 0);
		if (g)
			D->recorder->free(g);
	}

	/* good inputs: -1 in every slot, the ids in range */
	labels[11] = 1, labels[13] = 2, ids[17] = 3, ids[25] = 4, p[20] = 0.5f, p[27] = 0.25f;
	put(dlabels, labels, sizeof labels);
	put(dids, ids, sizeof ids);
	put(dp, p, sizeof p);
	put(slots, zero, sizeof zero);
	assert_int_equal(be->xent_pos_fwd(dlogits, dlabels, dlse, dloss, ROWS, POS, CLS,
					  &slots[0].bad, &slots[0].bad_id),
			 HPU_BE_OK);
	assert_int_equal(be->bce_fwd(0, dp, dt, dloss, ROWS, NP, &slots[1].bad,
				     &slots[1].bad_value),
			 HPU_BE_OK);
	assert_int_equal(be->ids_first_bad(dids, NIDS, LIMIT, &slots[2].bad, &slots[2].bad_id),
			 HPU_BE_OK);
	assert_int_equal(be->ids_in_range(dids, NIDS, LIMIT, dok), HPU_BE_OK);
	hpu__check_slot got[3];
	int ok = -1;
	get(got, slots, sizeof got);
	get(&ok, dok, sizeof ok);
	printf("  good inputs: bad %ld %ld %ld, ids ok %d\n", got[0].bad, got[1].bad, got[2].bad,
	       ok);
	assert_int_equal(got[0].bad, -1);
	assert_int_equal(got[1].bad, -1);
	assert_int_equal(got[2].bad, -1);
	assert_int_equal(ok, 1);
	dfree(dlogits), dfree(dp), dfree(dt), dfree(dlabels), dfree(dids), dfree(dlse);
	dfree(dloss), dfree(dok), dfree(slots);
}

/* ---- a gpt_lm-like step: an embedding's check deferred, recorded ---- */

enum { GV = 50, GD = 32, GT = 8, GR = 2, GN = GR * GT, GSLOTS = 8, BAD_AT = 5, BAD_ID = GV + 7 };

static const uint32_t gsamples[GR] = {40, 41};

/* The step's tensors, all on the host or all on the device. */
typedef struct gnet {
	float *wte, *wpe, *gamma, *beta, *dloss; /* inputs */
	int32_t *ids, *pos, *targets;
	float *tok, *pe, *x, *h, *mean, *rstd, *logits, *lse, *loss, *dlogits, *dh, *dx;
	float *dwte, *dwpe, *dgamma, *dbeta; /* gradients: zeroed before each step */
} gnet;

enum { G_IN, G_OUT, G_GRAD };
#define GF(f, n, kind) {#f, offsetof(gnet, f), (size_t)(n) * 4, kind}
static const struct {
	const char *name;
	size_t off, bytes;
	int kind;
} gfields[] = {
	GF(wte, GV * GD, G_IN), GF(wpe, GT * GD, G_IN), GF(gamma, GD, G_IN), GF(beta, GD, G_IN),
	GF(dloss, GR, G_IN), GF(ids, GN, G_IN), GF(pos, GN, G_IN), GF(targets, GN, G_IN),
	GF(tok, GN * GD, G_OUT), GF(pe, GN * GD, G_OUT), GF(x, GN * GD, G_OUT),
	GF(h, GN * GD, G_OUT), GF(mean, GN, G_OUT), GF(rstd, GN, G_OUT),
	GF(logits, GN * GV, G_OUT), GF(lse, GN, G_OUT), GF(loss, GR, G_OUT),
	GF(dlogits, GN * GV, G_OUT), GF(dh, GN * GD, G_OUT), GF(dx, GN * GD, G_OUT),
	GF(dwte, GV * GD, G_GRAD), GF(dwpe, GT * GD, G_GRAD), GF(dgamma, GD, G_GRAD),
	GF(dbeta, GD, G_GRAD),
};
#define NGF (sizeof gfields / sizeof *gfields)

static void **gfield(gnet *g, size_t i)
{
	return (void **)((char *)g + gfields[i].off);
}

/* The inputs' values (good ids), on the host. */
static gnet gvals;

static void gvals_make(void)
{
	uint64_t rng = 1124;
	for (size_t i = 0; i < NGF; i++) {
		void **p = gfield(&gvals, i);
		*p = calloc(1, gfields[i].bytes);
		assert_non_null(*p);
		if (gfields[i].kind == G_IN && gfields[i].off < offsetof(gnet, ids)) /* floats */
			for (size_t j = 0; j < gfields[i].bytes / 4; j++)
				((float *)*p)[j] = frand(&rng) * 0.5f;
	}
	for (int i = 0; i < GD; i++)
		gvals.gamma[i] += 1.0f;
	for (int i = 0; i < GN; i++) {
		gvals.ids[i] = (int32_t)((i * 7 + 3) % GV);
		gvals.pos[i] = i % GT;
		gvals.targets[i] = (int32_t)((i * 11 + 1) % GV);
	}
}

/* A host copy of the values (host), or a device one. */
static void gnet_make(gnet *g, int dev)
{
	for (size_t i = 0; i < NGF; i++) {
		void **p = gfield(g, i), *v = *gfield(&gvals, i);
		size_t b = gfields[i].bytes;
		if (!dev) {
			*p = malloc(b);
			assert_non_null(*p);
			if (gfields[i].kind == G_OUT)
				memset(*p, 0xff, b);
			else
				memcpy(*p, v, b);
		} else {
			*p = gfields[i].kind == G_OUT ? dnan(b) : dput(v, b);
		}
	}
	if (dev)
		CU(cudaDeviceSynchronize()); /* (dput and dnan: the legacy stream) */
}

static void gnet_free(gnet *g, int dev)
{
	for (size_t i = 0; i < NGF; i++) {
		if (dev)
			dfree(*gfield(g, i));
		else
			free(*gfield(g, i));
	}
}

/* Before a step, on the device's stream (not recorded): the gradients
 * zeroed, the outputs NaN (so that a replay that wrote nothing fails). */
static void gnet_reset(gnet *g)
{
	for (size_t i = 0; i < NGF; i++)
		if (gfields[i].kind != G_IN)
			CU(cudaMemsetAsync(*gfield(g, i), gfields[i].kind == G_GRAD ? 0 : 0xff,
					   gfields[i].bytes, hpu__cuda_stream()));
}

static void gnet_fetch(gnet *host, gnet *dev)
{
	for (size_t i = 0; i < NGF; i++)
		if (gfields[i].kind != G_IN)
			get(*gfield(host, i), *gfield(dev, i), gfields[i].bytes);
}

/* Every output and gradient of got the same bytes as want's. */
static void gnet_same(const char *what, gnet *got, gnet *want)
{
	for (size_t i = 0; i < NGF; i++) {
		if (gfields[i].kind == G_IN)
			continue;
		char line[160];
		snprintf(line, sizeof line, "%s: %s", what, gfields[i].name);
		check_bits(line, *gfield(got, i), *gfield(want, i), gfields[i].bytes);
	}
	printf("  %s: every output and gradient the same bytes\n", what);
}

/* While on (recording), each op of gpt_step is named before it runs:
 * where the table refuses an op while recording, the ops run their C
 * loops on device memory instead, which faults; the log then names it. */
static int gtrace;

static void op(int index, const char *layer, int backward, const char *what)
{
	hpu__op_layer(index, layer, NULL, 0, backward);
	if (gtrace) {
		printf("    recording %s's %s\n", layer, what);
		fflush(stdout);
	}
}

/* Forward and backward, each op as its layer (the names the reports
 * give); every op answers as with good data (the checks deferred). */
static void gpt_step(const gnet *g)
{
	long bad = -2;
	int32_t bad_label = 0;
	op(0, "wte", 0, "hpu_embedding_forward");
	assert_int_equal(hpu_embedding_forward(g->wte, g->ids, g->tok, GN, GV, GD), HPU_OK);
	op(1, "wpe", 0, "hpu_embedding_forward");
	assert_int_equal(hpu_embedding_forward(g->wpe, g->pos, g->pe, GN, GT, GD), HPU_OK);
	op(2, "add", 0, "hpu_add_forward");
	assert_int_equal(hpu_add_forward(g->tok, g->pe, g->x, (size_t)GN * GD), HPU_OK);
	op(3, "ln_f", 0, "hpu_layernorm_forward");
	hpu_layernorm_forward(g->x, g->gamma, g->beta, g->h, g->mean, g->rstd, GN, GD, 1e-5f);
	op(4, "lm_head", 0, "hpu_matmul (tied to wte)");
	hpu_matmul(g->h, g->wte, g->logits, GN, GV, GD, 0, 1, 0);
	op(5, "xent", 0, "hpu_cross_entropy_positions_forward");
	assert_int_equal(hpu_cross_entropy_positions_forward(g->logits, g->targets, g->lse, g->loss,
							     GR, GT, GV, &bad, &bad_label),
			 HPU_OK);
	assert_int_equal(bad, -1);
	op(5, "xent", 1, "hpu_cross_entropy_positions_backward");
	assert_int_equal(hpu_cross_entropy_positions_backward(g->logits, g->targets, g->lse,
							      g->dloss, g->dlogits, GR, GT, GV),
			 HPU_OK);
	op(4, "lm_head", 1, "hpu_matmul (dh)");
	hpu_matmul(g->dlogits, g->wte, g->dh, GN, GD, GV, 0, 0, 0);
	op(4, "lm_head", 1, "hpu_matmul (dwte)");
	hpu_matmul(g->dlogits, g->h, g->dwte, GV, GD, GN, 1, 0, 1);
	op(3, "ln_f", 1, "hpu_layernorm_backward");
	hpu_layernorm_backward(g->x, g->gamma, g->mean, g->rstd, g->dh, g->dx, g->dgamma, g->dbeta,
			       GN, GD);
	op(1, "wpe", 1, "hpu_embedding_backward");
	hpu_embedding_backward(g->pos, g->dx, g->dwpe, GN, GD);
	op(0, "wte", 1, "hpu_embedding_backward");
	hpu_embedding_backward(g->ids, g->dx, g->dwte, GN, GD);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
}

static void arm_checks(hpu__check_slot *slots)
{
	hpu__checks_arm(slots, GSLOTS);
	hpu__checks_batch(gsamples, GR);
}

/* After a step: disarmed, the used slots (device memory where dev)
 * copied and reported into msg; 1 with a finding. */
static int report_checks(const char *what, const hpu__check_slot *slots, int dev, char *msg,
			 size_t len)
{
	hpu__checks_disarm();
	hpu__check_slot copy[GSLOTS];
	int used = hpu__checks_used();
	assert_true(used > 0 && used <= GSLOTS);
	if (dev)
		get(copy, slots, (size_t)used * sizeof *copy);
	else
		memcpy(copy, slots, (size_t)used * sizeof *copy);
	msg[0] = '\0';
	int rc = hpu__checks_report(copy, msg, len);
	printf("  %s: %d slot(s) used; report %d: %s\n", what, used, rc, rc ? msg : "(nothing)");
	return rc;
}

static void put_bad_id(gnet *g, int dev)
{
	int32_t bad = BAD_ID;
	if (dev)
		put(g->ids + BAD_AT, &bad, sizeof bad);
	else
		g->ids[BAD_AT] = bad;
}

static void test_gpt_like_recorded(void **state)
{
	(void)state;
	char want[512], msg[512], err[512] = "";
	static hpu__check_slot hslots[GSLOTS];
	gnet cpu, dev, out, eager;
	gvals_make();

	/* the CPU's step with a bad id: its sentence and its outputs */
	hpu__be_set(NULL);
	gnet_make(&cpu, 0);
	put_bad_id(&cpu, 0);
	memset(hslots, 0xa5, sizeof hslots);
	arm_checks(hslots);
	gpt_step(&cpu);
	assert_int_equal(report_checks("the CPU, id out of range", hslots, 0, want, sizeof want), 1);
	assert_non_null(strstr(want, "layer wte: id 57 at position 5 of row 0 (dataset sample 40) "
				     "is outside the vocabulary [0, 50)"));

	/* the GPU's eager step with the same bad id: the same sentence, the
	 * bad id's row zero as the CPU's (the embedding's rows bit for bit) */
	hpu__be_set(be);
	gnet_make(&dev, 1);
	gnet_make(&out, 0);
	gnet_make(&eager, 0);
	hpu__check_slot *slots = dnan(GSLOTS * sizeof *slots);
	CU(cudaDeviceSynchronize());
	put_bad_id(&dev, 1);
	arm_checks(slots);
	gpt_step(&dev);
	assert_int_equal(report_checks("the GPU, eager, id out of range", slots, 1, msg, sizeof msg),
			 1);
	assert_string_equal(msg, want);
	gnet_fetch(&out, &dev);
	check_bits("the token rows (the bad id's zero) as the CPU's", out.tok, cpu.tok,
		   (size_t)GN * GD * 4);
	check("the loss, against the CPU's", out.loss, cpu.loss, GR, 1e-4);

	/* good ids: the eager step the replays must equal, nothing reported */
	put(dev.ids, gvals.ids, (size_t)GN * 4);
	gnet_reset(&dev);
	arm_checks(slots);
	gpt_step(&dev);
	assert_int_equal(report_checks("the GPU, eager, good ids", slots, 1, msg, sizeof msg), 0);
	gnet_fetch(&eager, &dev);

	/* recorded: no refusal (an embedding's check deferred, no dropout) */
	gnet_reset(&dev);
	sync_dev();
	arm_checks(slots);
	assert_int_equal(D->recorder->begin(err, sizeof err), 0);
	gtrace = 1;
	gpt_step(&dev);
	gtrace = 0;
	void *g = NULL;
	size_t nodes = 0;
	int rc = end_rec(&g, &nodes, err, sizeof err);
	printf("  the gpt_lm-like step recorded: end %d, %zu nodes%s%s\n", rc, nodes,
	       rc ? ": " : "", rc ? err : "");
	if (rc != 0)
		fail_msg("the gpt_lm-like step was refused: %s", err);
	assert_non_null(g);
	hpu__checks_disarm(); /* the records stay: the replays' report reads them */
	float first = 0;
	get(&first, dev.tok, sizeof first);
	assert_true(isnan(first));
	printf("  nothing ran while recording\n");

	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	assert_int_equal(report_checks("replay 1, good ids", slots, 1, msg, sizeof msg), 0);
	gnet_fetch(&out, &dev);
	gnet_same("replay 1 against the eager step", &out, &eager);

	/* a bad id written into the batch: the replay finds it */
	put_bad_id(&dev, 1);
	gnet_reset(&dev);
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	assert_int_equal(report_checks("replay 2, id out of range", slots, 1, msg, sizeof msg), 1);
	assert_string_equal(msg, want);
	gnet_fetch(&out, &dev);
	check_bits("replay 2: the token rows (the bad id's zero) as the CPU's", out.tok, cpu.tok,
		   (size_t)GN * GD * 4);
	check("replay 2: the loss, against the CPU's", out.loss, cpu.loss, GR, 1e-4);
	printf("  replay 2: the bad id reported with the CPU's sentence\n");

	D->recorder->free(g);
	hpu__be_set(NULL);
	hpu__checks_free();
	dfree(slots);
	gnet_free(&dev, 1);
	gnet_free(&cpu, 0), gnet_free(&out, 0), gnet_free(&eager, 0), gnet_free(&gvals, 0);
}

/* ---- a graph's scratch outgrown by a later eager call ---- */

enum { SG_ROWS = 1000, SG_COLS = 64, SG_N = SG_ROWS * SG_COLS, AT_T = 2048, AT_H = 8, AT_HD = 16 };

/* db = the column sums of dy (bias_grad, its partials in the kernels'
 * scratch), from zero, on the device's stream. */
static void sg_step(const float *dy, float *db)
{
	CU(cudaMemsetAsync(db, 0, SG_COLS * 4, hpu__cuda_stream()));
	assert_int_equal(be->bias_grad(HPU_DT_F32, dy, db, SG_ROWS, SG_COLS), HPU_BE_OK);
}

/* An eager attention backward whose dS (AT_H * AT_T^2 floats, 128 MiB)
 * is more scratch than any op before asked for: the scratch grows. */
static void sg_outgrow(void)
{
	size_t nq = (size_t)AT_T * 3 * AT_H * AT_HD, na = (size_t)AT_H * AT_T * AT_T;
	size_t nd = (size_t)AT_T * AT_H * AT_HD;
	float *qkv, *att, *dout, *dqkv;
	CU(cudaMalloc((void **)&qkv, nq * 4));
	CU(cudaMalloc((void **)&att, na * 4));
	CU(cudaMalloc((void **)&dout, nd * 4));
	CU(cudaMalloc((void **)&dqkv, nq * 4));
	CU(cudaMemset(qkv, 0, nq * 4));
	CU(cudaMemset(att, 0, na * 4));
	CU(cudaMemset(dout, 0, nd * 4));
	CU(cudaDeviceSynchronize());
	assert_int_equal(be->attention_bwd(qkv, att, dout, dqkv, 1, AT_T, AT_H, AT_HD), HPU_BE_OK);
	sync_dev();
	CU(cudaFree(qkv));
	CU(cudaFree(att));
	CU(cudaFree(dout));
	CU(cudaFree(dqkv));
}

/* A graph recorded with the scratch of its time (bias_grad's partials),
 * then an eager call that outgrows the scratch: the old buffer must stay
 * the graph's (cuops_core.c keeps it while a graph holds it), so that a
 * replay writes no freed memory. Blocks allocated after the growth (of
 * 4 KiB to 32 MiB, where freed memory would be reused first) are filled
 * with a pattern that the replay must leave alone, and the replay must
 * give the eager sums. Last of the tests: the scratch is large after it. */
static void test_scratch_outgrown(void **state)
{
	(void)state;
	enum { NV = 14 };
	uint64_t rng = 77;
	static float hdy[SG_N];
	float eager[SG_COLS], got[SG_COLS];
	char err[512] = "";
	for (int i = 0; i < SG_N; i++)
		hdy[i] = frand(&rng);
	float *dy = dput(hdy, sizeof hdy), *db = dnan(SG_COLS * 4);
	CU(cudaDeviceSynchronize());
	sg_step(dy, db); /* eager: the scratch is there before recording */
	get(eager, db, sizeof eager);

	assert_int_equal(D->recorder->begin(err, sizeof err), 0);
	sg_step(dy, db);
	void *g = NULL;
	size_t nodes = 0;
	int rc = end_rec(&g, &nodes, err, sizeof err);
	printf("  bias_grad recorded: end %d, %zu nodes%s%s\n", rc, nodes, rc ? ": " : "",
	       rc ? err : "");
	assert_int_equal(rc, 0);
	CU(cudaMemsetAsync(db, 0xff, SG_COLS * 4, hpu__cuda_stream()));
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	get(got, db, sizeof got);
	check_bits("a replay before the scratch grew", got, eager, sizeof got);

	sg_outgrow();
	printf("  an eager attention backward grew the scratch to %zu MiB\n",
	       ((size_t)AT_H * AT_T * AT_T * 4) >> 20);
	unsigned char *victim[NV];
	size_t vbytes[NV];
	for (int i = 0; i < NV; i++) {
		vbytes[i] = (size_t)4096 << i;
		CU(cudaMalloc((void **)&victim[i], vbytes[i]));
		CU(cudaMemset(victim[i], 0xa5, vbytes[i]));
	}
	CU(cudaDeviceSynchronize());
	CU(cudaMemsetAsync(db, 0xff, SG_COLS * 4, hpu__cuda_stream()));
	assert_int_equal(D->recorder->launch(g, err, sizeof err), 0);
	CU(cudaStreamSynchronize(hpu__cuda_stream()));
	CU(cudaGetLastError());
	get(got, db, sizeof got);
	check_bits("a replay after an eager call outgrew the graph's scratch", got, eager,
		   sizeof got);
	unsigned char *h = malloc(vbytes[NV - 1]);
	assert_non_null(h);
	for (int i = 0; i < NV; i++) {
		CU(cudaMemcpy(h, victim[i], vbytes[i], cudaMemcpyDeviceToHost));
		for (size_t k = 0; k < vbytes[i]; k++)
			if (h[k] != 0xa5)
				fail_msg("a block of %zu bytes allocated after the growth: byte %zu is "
					 "0x%02x, not 0xa5 (the replay wrote freed scratch)",
					 vbytes[i], k, h[k]);
		CU(cudaFree(victim[i]));
	}
	free(h);
	printf("  the replay after the growth: the eager sums, and no block allocated "
	       "after it written\n");

	D->recorder->free(g); /* the last graph: the old scratch freed */
	sg_step(dy, db);
	get(got, db, sizeof got);
	check_bits("an eager bias_grad after the graph was freed", got, eager, sizeof got);
	printf("  the graph freed (and the old scratch with it): eager sums the same\n");
	dfree(dy), dfree(db);
}

int main(void)
{
	char err[512] = "";
	int ngpus = 0;
	D = hpu_cuda_device_v1(&ngpus, err, sizeof err);
	if (ngpus <= 0) {
		printf("test_cuda_graphs: skipped: no GPU is visible (%s)\n", err);
		return 77;
	}
	if (D->setup(0, err, sizeof err) < 0) {
		printf("test_cuda_graphs: FAIL: the CUDA device did not set up: %s\n", err);
		return 1;
	}
	if (!D->recorder) {
		printf("test_cuda_graphs: FAIL: the CUDA device has no recorder\n");
		return 1;
	}
	be = D->ops();
	cu_test_set_stream(hpu__cuda_stream());
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_record_replay, setup_step, teardown_step),
		cmocka_unit_test_setup_teardown(test_refusals, setup_step, teardown_step),
		cmocka_unit_test(test_check_slots),
		cmocka_unit_test(test_gpt_like_recorded),
		cmocka_unit_test(test_scratch_outgrown),
	};
	int rc = cmocka_run_group_tests_name("cuda graphs", tests, NULL, NULL);
	D->teardown();
	return rc;
}
