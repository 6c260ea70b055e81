/* Unit tests for recording a step and replaying it on the CPU (device.h's
 * hpu__dev_capture_begin ... hpu__dev_graph_free; --graphs, issue 36):
 * cpu-strict on its kernels-only table records kernels, runtime ops,
 * copies and fills without running them, and a launch gives the eager
 * run's bytes, reading the pinned source of a copy when it runs; every
 * entry of the kernel table records and replays with its arguments
 * (device_klist.h walked through a spy table); each refusal names its
 * call and nothing runs; memory freed while recording is not handed out
 * again until the graph is freed; a small training step through the
 * public ops replays bit for bit. --device cpu records under --graphs
 * only, on the same table (its memory open, told from the host's): the
 * refusals and the training step there too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>

#include <cmocka.h>

#include "hpu/ops.h"
#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/ops/checks.h"
#include "worker/ops/fp8.h"

#define MiB (1024ull * 1024)

static void open_dev(const char *name, int graphs)
{
	char err[256] = "", note[256];
	uint64_t cap;
	if (hpu__dev_capturing()) { /* a failed test's leftovers */
		hpu__dev_graph *g;
		hpu__dev_capture_end(&g, err, sizeof err);
	}
	hpu__devmem_shutdown();
	hpu__dev_close();
	if (hpu__dev_open(name, 0, err, sizeof err) < 0)
		fail_msg("%s", err);
	hpu__dev_config c = {.graphs = graphs};
	assert_int_equal(
	    hpu__dev_configure(&c, &cap, note, sizeof note, err, sizeof err),
	    0);
	assert_int_equal(hpu__devmem_init(256 * MiB, 0), 0);
}

static void close_dev(void)
{
	hpu__devmem_shutdown();
	hpu__dev_close();
}

static void *dev_in(const void *src, size_t n)
{
	void *d = hpu__dev_alloc(HPU_MEM_OTHER, n, "test buffer");
	assert_non_null(d);
	if (src)
		hpu__dev_h2d(NULL, d, src, n);
	return d;
}

static void fill(float *x, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 4.0f;
	}
}

static int begin(void)
{
	char err[512] = "";
	int rc = hpu__dev_capture_begin(err, sizeof err);
	if (rc < 0)
		printf("  capture_begin: %s\n", err);
	return rc;
}

/* Ends the recording: its answer, the reason in why. */
static int end(hpu__dev_graph **g, char *why, size_t len)
{
	why[0] = '\0';
	return hpu__dev_capture_end(g, why, len);
}

static void launch(hpu__dev_graph *g)
{
	char err[512] = "";
	if (hpu__dev_graph_launch(g, err, sizeof err) < 0)
		fail_msg("launch: %s", err);
}

/* ---- where recording is: cpu-strict's kernels-only table ---- */

static void test_where(void **state)
{
	(void)state;
	char err[512] = "";
	open_dev("cpu", 0); /* eager: its own table, host_can_read */
	assert_int_equal(hpu__dev_caps_get()->can_capture, 0);
	assert_int_equal(hpu__dev_caps_get()->host_can_read, 1);
	assert_int_equal(hpu__dev_kernels_on(), 0);
	assert_int_equal(hpu__dev_capture_begin(err, sizeof err), -1);
	assert_string_equal(err, "--device cpu records a step under --graphs only (its "
				 "kernels-only table is set up with the device)");
	assert_int_equal(hpu__dev_capturing(), 0);
	close_dev();
	open_dev("cpu", 1); /* --graphs: the kernels-only table, no protection */
	assert_int_equal(hpu__dev_caps_get()->can_capture, 1);
	assert_int_equal(hpu__dev_caps_get()->host_can_read, 0);
	assert_string_equal(hpu__dev_name(), "cpu");
	assert_string_equal(hpu__be()->name, "cpu kernels");
	float *d = dev_in(NULL, 16);
	assert_int_equal(hpu__dev_owns(d), 1);
	assert_int_equal(hpu__dev_owns(err), 0);
	d[0] = 1.5f; /* the host reads and writes it without a device call */
	assert_true(d[0] == 1.5f);
	hpu__dev_free(d);
	close_dev();
	open_dev("cpu-strict",
	         0); /* no --graphs: ops run on the host's loops */
	assert_int_equal(hpu__dev_caps_get()->can_capture, 0);
	assert_int_equal(hpu__dev_capture_begin(err, sizeof err), -1);
	assert_non_null(strstr(err, "kernels-only table only"));
	close_dev();
	open_dev("cpu-strict", 1);
	assert_int_equal(hpu__dev_caps_get()->can_capture, 1);
	assert_string_equal(hpu__be()->name, "cpu-strict kernels");
	assert_int_equal(begin(), 0);
	assert_int_equal(hpu__dev_capturing(), 1);
	/* one recording at a time */
	assert_int_equal(hpu__dev_capture_begin(err, sizeof err), -1);
	assert_non_null(strstr(err, "one recording at a time"));
	hpu__dev_graph *g;
	char why[512];
	assert_int_equal(end(&g, why, sizeof why), 0);
	assert_int_equal(hpu__dev_graph_nodes(g), 0);
	assert_int_equal(hpu__dev_capturing(), 0);
	hpu__dev_graph_free(&g);
	assert_null(g);
	assert_int_equal(hpu__dev_capture_end(&g, why, sizeof why), -1);
	close_dev();
}

/* ---- a sequence recorded, then launched ---- */

#define M 24
#define K 40
#define NN 16
#define NC (M * NN)

typedef struct seq {
	float *a, *b, *c, *y, *e, *f, *p;
	hpu__dev_stepvars *sv;
	float *pin; /* pinned: b's values, copied in by the sequence */
} seq;

static const float init_p = 0.25f;

/* Every buffer back to its starting bytes (eager copies). */
static void seq_reset(seq *s)
{
	static float a[M * K], zero[NC], p[NC];
	fill(a, M * K, 3);
	for (size_t i = 0; i < NC; i++)
		p[i] = init_p + (float)i / 64.0f;
	hpu__dev_h2d(NULL, s->a, a, sizeof a);
	hpu__dev_memset(NULL, s->b, 0, K * NN * sizeof(float));
	hpu__dev_h2d(NULL, s->c, zero, sizeof zero);
	hpu__dev_h2d(NULL, s->y, zero, sizeof zero);
	hpu__dev_h2d(NULL, s->e, zero, sizeof zero);
	hpu__dev_h2d(NULL, s->f, zero, sizeof zero);
	hpu__dev_h2d(NULL, s->p, p, sizeof p);
	hpu__dev_stepvars sv = {
	    .lr = 0.5, .gscale = 0.75f, .t = 3, .loss_scale = 1};
	hpu__dev_h2d(NULL, s->sv, &sv, sizeof sv);
}

/* b = the pinned block (h2d); c = a b + 0 (gemm through the table); y =
 * relu(c); e = 0x3f bytes (memset); f = y (d2d); p -= lr gscale f (SGD,
 * its lr and gscale from sv: a runtime op with a host struct). */
static void seq_run(seq *s)
{
	const hpu__backend *be = hpu__be();
	hpu__dev_h2d(NULL, s->b, s->pin, K * NN * sizeof(float));
	hpu__gemm g = {.dt = HPU_DT_F32,
	               .count = 1,
	               .m = M,
	               .n = NN,
	               .k = K,
	               .a = s->a,
	               .b = s->b,
	               .c = s->c};
	assert_int_equal(be->gemm(&g), HPU_BE_OK);
	memset(&g, 0, sizeof g); /* the recording kept its copy */
	assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, s->c, s->y, NC),
	                 HPU_BE_OK);
	hpu__dev_memset(NULL, s->e, 0x3f, NC * sizeof(float));
	hpu__dev_d2d(NULL, s->f, s->y, NC * sizeof(float));
	hpu__dev_optim k = {.kind = HPU__DEV_SGD, .sv = s->sv};
	hpu__dev_optim_update(&k, s->p, s->f, NULL, NULL, NC);
	memset(&k, 0xff, sizeof k);
}

/* The buffers' bytes, in host memory. */
typedef struct snap {
	float c[NC], y[NC], e[NC], f[NC], p[NC], b[K * NN];
} snap;

static void seq_snap(seq *s, snap *o)
{
	hpu__dev_d2h(NULL, o->c, s->c, sizeof o->c);
	hpu__dev_d2h(NULL, o->y, s->y, sizeof o->y);
	hpu__dev_d2h(NULL, o->e, s->e, sizeof o->e);
	hpu__dev_d2h(NULL, o->f, s->f, sizeof o->f);
	hpu__dev_d2h(NULL, o->p, s->p, sizeof o->p);
	hpu__dev_d2h(NULL, o->b, s->b, sizeof o->b);
}

static void test_record_launch(void **state)
{
	(void)state;
	static snap before, eager1, eager2, now;
	open_dev("cpu-strict", 1);
	seq s = {.a = dev_in(NULL, M * K * 4),
	         .b = dev_in(NULL, K * NN * 4),
	         .c = dev_in(NULL, NC * 4),
	         .y = dev_in(NULL, NC * 4),
	         .e = dev_in(NULL, NC * 4),
	         .f = dev_in(NULL, NC * 4),
	         .p = dev_in(NULL, NC * 4),
	         .sv = dev_in(NULL, sizeof(hpu__dev_stepvars)),
	         .pin = hpu__dev_host_alloc(K * NN * 4)};
	assert_non_null(s.pin);
	/* eager, with the pinned block's first and second values */
	fill(s.pin, K * NN, 11);
	seq_reset(&s);
	seq_run(&s);
	seq_snap(&s, &eager1);
	fill(s.pin, K * NN, 12);
	seq_reset(&s);
	seq_run(&s);
	seq_snap(&s, &eager2);
	assert_true(memcmp(eager1.p, eager2.p, sizeof eager1.p) != 0);

	/* recorded: nothing runs */
	fill(s.pin, K * NN, 11);
	seq_reset(&s);
	seq_snap(&s, &before);
	uint64_t h2d0, d2h0, h2d1, d2h1;
	hpu__dev_copied(&h2d0, &d2h0);
	assert_int_equal(begin(), 0);
	seq_run(&s);
	hpu__dev_graph *g;
	char why[512];
	assert_int_equal(end(&g, why, sizeof why), 0);
	assert_int_equal(hpu__dev_graph_nodes(g), 6);
	/* its calls by name, in order (the profiler's graph_replay args) */
	static const char *const names[] = {"h2d", "gemm", "eltwise_fwd", "memset", "d2d", "optim"};
	const hpu__dev_node_count *nc = NULL;
	assert_int_equal(hpu__dev_graph_names(g, &nc), 6);
	for (int i = 0; i < 6; i++) {
		assert_string_equal(nc[i].name, names[i]);
		assert_int_equal(nc[i].count, 1);
	}
	hpu__dev_copied(&h2d1, &d2h1);
	assert_true(h2d1 == h2d0); /* no bytes crossed */
	seq_snap(&s, &now);
	assert_memory_equal(&now, &before, sizeof now);

	/* launched: the eager bytes; the copy reads the pinned block now */
	launch(g);
	seq_snap(&s, &now);
	assert_memory_equal(&now, &eager1, sizeof now);
	fill(s.pin, K * NN, 12);
	seq_reset(&s);
	hpu__dev_copied(&h2d0, &d2h0);
	launch(g);
	hpu__dev_copied(&h2d1, &d2h1);
	assert_true(h2d1 - h2d0 == K * NN * 4);
	seq_snap(&s, &now);
	assert_memory_equal(&now, &eager2, sizeof now);

	/* rebound (a replay reading the loader's buffer): the copy reads the
	 * other pinned block, its old source no more */
	float *pin2 = hpu__dev_host_alloc(K * NN * 4);
	assert_non_null(pin2);
	fill(pin2, K * NN, 12);
	fill(s.pin, K * NN, 11);
	char err[512] = "";
	static float pageable[K * NN];
	assert_int_equal(hpu__dev_graph_rebind(g, s.pin, pageable, sizeof pageable, err, sizeof err),
			 0); /* not pinned: nothing changes */
	assert_int_equal(hpu__dev_graph_rebind(g, s.pin, pin2, K * NN * 4 - 4, err, sizeof err),
			 0); /* smaller than the copy */
	assert_int_equal(hpu__dev_graph_rebind(g, pin2, s.pin, K * NN * 4, err, sizeof err),
			 0); /* no copy reads pin2 yet */
	assert_int_equal(hpu__dev_graph_rebind(g, s.pin, pin2, K * NN * 4, err, sizeof err), 1);
	seq_reset(&s);
	launch(g);
	seq_snap(&s, &now);
	assert_memory_equal(&now, &eager2, sizeof now); /* pin2's values, not s.pin's */
	assert_int_equal(hpu__dev_graph_rebind(g, pin2, s.pin, K * NN * 4, err, sizeof err), 1);
	seq_reset(&s);
	launch(g);
	seq_snap(&s, &now);
	assert_memory_equal(&now, &eager1, sizeof now);
	hpu__dev_graph_free(&g);
	hpu__dev_host_free(pin2);
	hpu__dev_host_free(s.pin);
	close_dev();
}

/* ---- refusals: the first reason, nothing run ---- */

static float *rbuf; /* device memory the refused recordings would write */
static float *rsrc;

static void refuse_d2h(void)
{
	float h[4];
	hpu__dev_d2h(NULL, h, rsrc, sizeof h);
}

static void refuse_d2d_host(void)
{
	float h[4];
	hpu__dev_d2d(NULL, h, rsrc, sizeof h);
}

static void refuse_copy(void)
{
	float h[4];
	hpu__dev_copy(h, rsrc, sizeof h);
}

static void refuse_value(void)
{
	assert_int_equal(hpu__dev_nonfinite(rsrc, 4), 0); /* 0, not run */
	assert_true(hpu__dev_sumsq(rsrc, 4) == 0.0);
}

static void refuse_wait(void)
{
	hpu__dev_event ev;
	hpu__dev_event_record(NULL, &ev);
	hpu__dev_event_wait(&ev);
}

static void refuse_sync(void)
{
	hpu__dev_queue_sync(NULL);
}

static void refuse_caller(void)
{
	hpu__dev_capture_refuse(
	    "the strategy's collective %d runs through the host", 3);
}

static void refuse_amax(void)
{
	float amax = 0;
	assert_int_equal(hpu__be()->amax(rsrc, 4, &amax), HPU_BE_OK);
}

static void refuse_dropout(void)
{
	hpu_dropout_forward(rsrc, rbuf, (uint8_t *)rbuf + 64, 4, 0.5f, 1, 2);
}

/* A custom layer's keys, drawn on the host (hpu_rand_key): host memory. */
static void refuse_host_keys(void)
{
	static const uint64_t keys[2] = {1, 2};
	hpu_dropout_rows(rsrc, rbuf, keys, 2, 2, 1u << 31, 2.0f);
}

static void *other_thread(void *arg)
{
	(void)arg;
	hpu__dev_memset(NULL, rbuf, 0, 64 * 4); /* runs now, unrecorded */
	return NULL;
}

static void refuse_other_thread(void)
{
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
	pthread_join(t, NULL);
}

static void refuse_enter(void)
{
	hpu__dev_enter();
	hpu__dev_leave();
}

static void refuse_stack_h2d(void)
{
	float h[4] = {1, 2, 3, 4};
	hpu__dev_h2d(NULL, rbuf, h, sizeof h);
}

static void refusals_on(const char *dev)
{
	static const struct {
		void (*call)(void);
		const char *why;
	} cases[] = {
	    {refuse_d2h, "hpu__dev_d2h: a copy into host memory"},
	    {refuse_d2d_host, "hpu__dev_d2d: a copy into host memory"},
	    {refuse_copy, "hpu__dev_copy: a copy into host memory"},
	    {refuse_value,
	     "hpu__dev_nonfinite: an op that returns a value to the host"},
	    {refuse_wait, "hpu__dev_event_wait: a wait on the host"},
	    {refuse_sync, "hpu__dev_queue_sync: a wait on the host"},
	    {refuse_caller,
	     "the strategy's collective 3 runs through the host"},
	    {refuse_amax,
	     "the kernel amax writes host memory (its argument amax)"},
	    {refuse_dropout,
	     "the kernel dropout_fwd takes dropout's keys, which the host "
	     "draws "
	     "each step: a replay would repeat the recorded step's mask"},
	    {refuse_host_keys,
	     "the kernel dropout_rows takes dropout's keys, which the host "
	     "draws each step: a replay would repeat the recorded step's mask"},
	    {refuse_other_thread,
	     "hpu__dev_memset ran on another thread while a step was recorded "
	     "(only the "
	     "recording thread's device work is recorded)"},
	    {refuse_enter, "hpu__dev_enter: host code opened device memory "
	                   "while a step was recorded (its "
	                   "work runs now, not at each launch)"},
	    {refuse_stack_h2d,
	     "hpu__dev_h2d: a copy from host memory that is not pinned memory "
	     "(hpu__dev_host_alloc): a replay reads its source when it runs"},
	};
	/* with the step guard on (cpu-strict): a recording refuses, the
	 * worker lives */
	setenv("HPU_STRICT_STEP", "1", 1);
	open_dev(dev, 1);
	unsetenv("HPU_STRICT_STEP");
	hpu__dev_step_guard(1);
	const float ones[64] = {1, 1, 1, 1};
	rbuf = dev_in(NULL, 64 * 4);
	rsrc = dev_in(ones, sizeof ones);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		assert_int_equal(begin(), 0);
		hpu__dev_memset(NULL, rbuf, 0x7f,
		                64 * 4); /* recorded before: never runs */
		cases[i].call();
		hpu__dev_capture_refuse(
		    "a second reason"); /* the first one is kept */
		hpu__dev_memset(NULL, rbuf, 0x7e, 64 * 4);
		hpu__dev_graph *g = (hpu__dev_graph *)&g;
		char why[512];
		assert_int_equal(end(&g, why, sizeof why), 1);
		assert_null(g);
		printf("  refused: %s\n", why);
		assert_string_equal(why, cases[i].why);
		hpu__dev_step_guard(0);
		float back[64];
		hpu__dev_d2h(NULL, back, rbuf, sizeof back);
		for (int j = 0; j < 64; j++)
			assert_true(back[j] == 0.0f);
		hpu__dev_step_guard(1);
	}
	hpu__dev_step_guard(0);
	hpu__dev_free(rbuf);
	hpu__dev_free(rsrc);
	close_dev();
}

static void test_refusals(void **state)
{
	(void)state;
	refusals_on("cpu-strict");
}

static void test_refusals_cpu(void **state)
{
	(void)state;
	refusals_on("cpu");
}

/* --device cpu --graphs: host code's own loops over device memory (a
 * custom layer's, which --device cpu allows) are no call a recording
 * holds: while recording the arena is closed, such an access runs (its
 * fault opens the page) and refuses the recording, naming the block; the
 * refusal puts back what it wrote in a block in use before the recording
 * began (the step runs again eagerly: once), not in one taken while
 * recording; the next recording without one is kept. */
static void test_host_touch_cpu(void **state)
{
	(void)state;
	open_dev("cpu", 1);
	float *d = hpu__dev_alloc(HPU_MEM_ACTS, 64 * 4, "touched");
	assert_non_null(d);
	hpu__dev_memset(NULL, d, 0, 64 * 4);
	assert_int_equal(begin(), 0);
	hpu__dev_memset(NULL, d, 0x7f, 64 * 4); /* recorded: never runs */
	((volatile float *)d)[3] = 5.0f;          /* the host's own write: runs now */
	assert_true(((volatile float *)d)[3] == 5.0f);
	float *n = hpu__dev_alloc(HPU_MEM_ACTS, 64 * 4, "taken while recording");
	assert_non_null(n);
	((volatile float *)n)[1] = 7.0f;
	hpu__dev_graph *g = NULL;
	char why[512];
	assert_int_equal(end(&g, why, sizeof why), 1);
	assert_null(g);
	printf("  refused: %s\n", why);
	assert_non_null(strstr(why, "host code touched device memory at "));
	assert_non_null(strstr(why, "(ACTS block 'touched') while a step was recorded"));
	/* open again; the write put back, the new block's kept */
	assert_true(((volatile float *)d)[3] == 0.0f && d[0] == 0.0f);
	assert_true(((volatile float *)n)[1] == 7.0f);
	hpu__dev_free(n);
	assert_int_equal(begin(), 0);
	hpu__dev_memset(NULL, d, 0, 64 * 4);
	assert_int_equal(end(&g, why, sizeof why), 0);
	assert_non_null(g);
	launch(g);
	assert_true(d[3] == 0.0f);
	hpu__dev_graph_free(&g);
	hpu__dev_free(d);
	close_dev();
}

/* ---- memory kept for a graph ---- */

static void stats(uint64_t *in_use, uint64_t *held)
{
	hpu_device_stats st;
	uint64_t blocks;
	hpu__devmem_stats(&st);
	*in_use = st.in_use;
	hpu__devmem_held(&blocks, held);
	assert_int_equal(st.active_allocs, st.num_allocs - st.num_frees);
}

static void test_memory(void **state)
{
	(void)state;
	const size_t B = 64 * 1024;
	uint64_t in_use0, in_use, held;
	char why[512];
	hpu__dev_graph *g1, *g2;
	open_dev("cpu-strict", 1);
	stats(&in_use0, &held);
	/* freed while recording: kept (still in use) until the graph goes */
	void *x = hpu__dev_alloc(HPU_MEM_ACTS, B, "x");
	assert_int_equal(begin(), 0);
	hpu__dev_free(x);
	void *y = hpu__dev_alloc(HPU_MEM_ACTS, B,
	                         "y"); /* allocated while recording */
	assert_ptr_not_equal(y, x);
	assert_int_equal(end(&g1, why, sizeof why), 0);
	stats(&in_use, &held);
	assert_true(in_use == in_use0 + 2 * B);
	assert_true(held == B);
	assert_true(hpu__devmem_kind_in_use(HPU_MEM_ACTS) == 2 * B);
	void *z = hpu__dev_alloc(HPU_MEM_ACTS, B, "z");
	assert_ptr_not_equal(z, x);
	hpu__dev_free(z);
	/* y, freed by its owner after the recording: kept too; and held by a
	 * second graph that records its free */
	assert_int_equal(begin(), 0);
	hpu__dev_free(y);
	assert_int_equal(end(&g2, why, sizeof why), 0);
	stats(&in_use, &held);
	assert_true(in_use == in_use0 + 2 * B);
	assert_true(held == 2 * B);
	hpu__dev_graph_free(&g1); /* x back; y still g2's */
	stats(&in_use, &held);
	assert_true(in_use == in_use0 + B);
	assert_true(held == B);
	void *a = hpu__dev_alloc(HPU_MEM_ACTS, B, "a");
	void *b = hpu__dev_alloc(HPU_MEM_ACTS, B, "b");
	assert_true(a == x || b == x); /* x reused */
	assert_true(a != y && b != y);
	hpu__dev_free(a);
	hpu__dev_free(b);
	hpu__dev_graph_free(&g2);
	stats(&in_use, &held);
	assert_true(in_use == in_use0);
	assert_true(held == 0);
	a = hpu__dev_alloc(HPU_MEM_ACTS, B, "a");
	assert_true(a == y); /* the most recently freed first */
	hpu__dev_free(a);
	/* a refused recording gives its blocks back at once */
	x = hpu__dev_alloc(HPU_MEM_ACTS, B, "x");
	assert_int_equal(begin(), 0);
	hpu__dev_free(x);
	hpu__dev_capture_refuse("no");
	assert_int_equal(end(&g1, why, sizeof why), 1);
	stats(&in_use, &held);
	assert_true(in_use == in_use0);
	a = hpu__dev_alloc(HPU_MEM_ACTS, B, "a");
	assert_true(a == x);
	hpu__dev_free(a);
	close_dev();
}

/* ---- every entry of the kernel table, through a spy ---- */

/* What the spy saw last: the entry and a hash of its arguments (the
 * contents of the host structs it points at). */
static int spy_entry = -1;
static int spy_answer = HPU_BE_OK;
static uint64_t spy_hash;

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	return h;
}

static uint64_t bytes_hash(const void *p, size_t n)
{
	const unsigned char *c = p;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 1099511628211ull;
	return h;
}

static uint64_t h_gemm(const hpu__gemm *g)
{
	return bytes_hash(g, sizeof *g);
}
static uint64_t h_conv(const hpu_conv2d_shape *s)
{
	return bytes_hash(s, sizeof *s);
}
static uint64_t h_rect(const hpu_conv2d_rect_shape *s)
{
	return bytes_hash(s, sizeof *s);
}
static uint64_t h_int(int v)
{
	return (uint64_t)v;
}
static uint64_t h_uns(unsigned v)
{
	return v;
}
static uint64_t h_long(long v)
{
	return (uint64_t)v;
}
static uint64_t h_ulong(unsigned long v)
{
	return v;
}
static uint64_t h_float(float v)
{
	return bytes_hash(&v, sizeof v);
}
static uint64_t h_double(double v)
{
	return bytes_hash(&v, sizeof v);
}
static uint64_t h_ptr(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

#define SPY_HASH(x)                                                            \
	hash_ = mix(hash_, _Generic((x), const hpu__gemm *: h_gemm, const hpu_conv2d_shape *: h_conv,   \
			    const hpu_conv2d_rect_shape *: h_rect, int: h_int, unsigned: h_uns,   \
			    long: h_long, unsigned long: h_ulong, float: h_float,                 \
			    double: h_double, default: h_ptr)(x));

/* The arguments of a walked call: scalars of each type, a distinct device
 * address for each pointer, the host structs (their pointers device
 * memory). */
static char *walk_base;
static int walk_next;
static hpu__gemm walk_gemm;
static hpu_conv2d_shape walk_conv = {2, 3, 8, 8, 4, 3, 1, 1};
static hpu_conv2d_rect_shape walk_rect = {2, 3, 8, 9, 4, 3, 2, 1, 1, 0, 1};

static void *walk_ptr(void)
{
	return walk_base + 64 * walk_next++;
}

#define WALK_SET(x)                                                            \
	x = _Generic((x), const hpu__gemm *: &walk_gemm, const hpu_conv2d_shape *: &walk_conv,  \
		     const hpu_conv2d_rect_shape *: &walk_rect, int: 3, unsigned: 5u,             \
		     long: 7l, unsigned long: 11ul, float: 1.5f, double: 2.5,                     \
		     default: walk_ptr());

enum {
#define WRAP(name, params, args) W_##name,
#include "worker/device/device_klist.h"
#undef WRAP
	W_N
};

/* spy_<entry>: notes what it was given; call_<entry>: calls the table's
 * entry with the walk's arguments. */
#define WRAP(name, params, args)                                               \
	static int spy_##name params                                           \
	{                                                                      \
		uint64_t hash_ = 0;                                            \
		KL_FE(SPY_HASH, KL_UNPAREN args)                               \
		spy_entry = W_##name;                                          \
		spy_hash = hash_;                                              \
		return spy_answer;                                             \
	}                                                                      \
	static int call_##name(const hpu__backend *table_)                     \
	{                                                                      \
		KL_FE(KL_FIELD, KL_UNPAREN params)                             \
		walk_next = 0;                                                 \
		KL_FE(WALK_SET, KL_UNPAREN args)                               \
		return table_->name args;                                      \
	}
#include "worker/device/device_klist.h"
#undef WRAP

static hpu__backend spy = {
    .name = "spy",
#define WRAP(name, params, args) .name = spy_##name,
#include "worker/device/device_klist.h"
#undef WRAP
};

static const struct {
	const char *name;
	int (*call)(const hpu__backend *t);
} walk[] = {
#define WRAP(name, params, args) {#name, call_##name},
#include "worker/device/device_klist.h"
#undef WRAP
};

static void test_every_entry(void **state)
{
	(void)state;
	close_dev();       /* (what a failed test left) */
	hpu__be_set(&spy); /* the kernels-only table wraps the spy */
	open_dev("cpu-strict", 1);
	const hpu__backend *t = hpu__be();
	assert_string_equal(t->name, "cpu-strict kernels");
	walk_base = hpu__dev_alloc(HPU_MEM_OTHER, MiB, "the walk's pointers");
	walk_gemm = (hpu__gemm){.dt = HPU_DT_BF16,
	                        .count = 2,
	                        .m = 3,
	                        .n = 4,
	                        .k = 5,
	                        .a = walk_base,
	                        .b = walk_base + 64,
	                        .c = (float *)(walk_base + 128),
	                        .stride_a = 15,
	                        .stride_b = 20,
	                        .stride_c = 12,
	                        .accumulate = 1};
	int recorded = 0, refused = 0;
	for (int e = 0; e < W_N; e++) {
		spy_entry = -1;
		assert_int_equal(walk[e].call(t),
		                 HPU_BE_OK); /* eager: the spy runs */
		assert_int_equal(spy_entry, e);
		uint64_t eager = spy_hash;
		spy_entry = -1;
		assert_int_equal(begin(), 0);
		assert_int_equal(walk[e].call(t), HPU_BE_OK);
		walk_gemm.m++; /* the graph holds its own copy */
		walk_conv.batch++;
		walk_rect.batch++;
		hpu__dev_graph *g;
		char why[512];
		int rc = end(&g, why, sizeof why);
		assert_int_equal(spy_entry, -1); /* recorded, not run */
		walk_gemm.m--;
		walk_conv.batch--;
		walk_rect.batch--;
		if (!strcmp(walk[e].name, "dropout_fwd")) { /* the host's seed */
			assert_int_equal(rc, 1);
			assert_non_null(strstr(why, "dropout's keys"));
			refused++;
			continue;
		}
		if (rc != 0)
			fail_msg("%s: %s", walk[e].name, why);
		assert_int_equal(hpu__dev_graph_nodes(g), 1);
		launch(g);
		if (spy_entry != e || spy_hash != eager)
			fail_msg("%s replayed with other arguments",
			         walk[e].name);
		hpu__dev_graph_free(&g);
		recorded++;
	}
	printf("  %d entries recorded and replayed, %d refused\n", recorded,
	       refused);
	assert_int_equal(recorded + refused, W_N);
	assert_int_equal(W_N, 64);
	/* a kernel that fails when replayed: the launch says which */
	assert_int_equal(begin(), 0);
	assert_int_equal(walk[W_eltwise_fwd].call(t), HPU_BE_OK);
	assert_int_equal(walk[W_gemm].call(t), HPU_BE_OK);
	hpu__dev_graph *g;
	char why[512], err[512] = "";
	assert_int_equal(end(&g, why, sizeof why), 0);
	spy_answer = HPU_BE_NOMEM;
	assert_int_equal(hpu__dev_graph_launch(g, err, sizeof err), -1);
	spy_answer = HPU_BE_OK;
	assert_string_equal(err, "a recorded step's node 1 of 2, the kernel "
	                         "eltwise_fwd, answered -2 "
	                         "when replayed");
	hpu__dev_graph_free(&g);
	hpu__dev_free(walk_base);
	close_dev();
	hpu__be_set(NULL);
}

/* ---- host arrays (permute), the embedding's bound, deferred checks ---- */

static void test_kernel_details(void **state)
{
	(void)state;
	open_dev("cpu-strict", 1);
	char why[512];
	hpu__dev_graph *g;
	/* permute's shape and perm: host memory, copied */
	float x[24], want[24], got[24];
	fill(x, 24, 5);
	float *dx = dev_in(x, sizeof x), *dy = dev_in(NULL, sizeof x);
	int64_t shape[3] = {2, 3, 4};
	int perm[3] = {2, 0, 1};
	assert_int_equal(hpu_permute_forward(dx, dy, 3, shape, perm), HPU_OK);
	hpu__dev_d2h(NULL, want, dy, sizeof want);
	hpu__dev_memset(NULL, dy, 0, sizeof x);
	assert_int_equal(begin(), 0);
	assert_int_equal(hpu_permute_forward(dx, dy, 3, shape, perm), HPU_OK);
	shape[0] = 99;
	perm[0] = 7;
	assert_int_equal(end(&g, why, sizeof why), 0);
	launch(g);
	hpu__dev_graph_free(&g);
	hpu__dev_d2h(NULL, got, dy, sizeof got);
	assert_memory_equal(got, want, sizeof got);

	/* an ids check deferred into device slots (findings_dev): recorded,
	 * the kernel writes the slot when launched */
	int32_t ids[6] = {0, 1, 2, 9, 1, 0};
	int32_t *did = dev_in(ids, sizeof ids);
	hpu__check_slot *slots = dev_in(NULL, 4 * sizeof *slots), host[4];
	hpu__checks_arm(slots, 4);
	long bad = 0;
	int32_t bad_value = 0;
	assert_int_equal(begin(), 0);
	int rc = hpu_ids_first_bad(did, 6, 4, &bad, &bad_value);
	if (end(&g, why, sizeof why) != 0)
		fail_msg("the deferred check was not recorded: %s", why);
	assert_int_equal(rc, HPU_OK);
	assert_true(bad == -1);
	assert_int_equal(hpu__checks_used(), 1);
	hpu__checks_disarm();
	launch(g);
	hpu__dev_graph_free(&g);
	hpu__dev_d2h(NULL, host, slots, sizeof host);
	assert_true(host[0].bad == 3);
	assert_int_equal(host[0].bad_id, 9);
	hpu__checks_free();

	/* an embedding whose ids' check is deferred: the replay skips the
	 * id past the vocabulary as the eager call did */
	const int vocab = 4, dim = 3;
	float table[40], ye[18],
	    yr[18]; /* rows past the vocabulary: not zero */
	fill(table, 40, 9);
	float *dt = dev_in(table, sizeof table), *dye = dev_in(NULL, sizeof ye);
	hpu__checks_arm(slots, 4);
	assert_int_equal(hpu_embedding_forward(dt, did, dye, 6, vocab, dim),
	                 HPU_OK);
	hpu__dev_d2h(NULL, ye, dye, sizeof ye);
	hpu__dev_memset(NULL, dye, 0x55, sizeof ye);
	assert_int_equal(begin(), 0);
	assert_int_equal(hpu_embedding_forward(dt, did, dye, 6, vocab, dim),
	                 HPU_OK);
	assert_int_equal(end(&g, why, sizeof why), 0);
	hpu__checks_disarm();
	launch(g);
	hpu__dev_graph_free(&g);
	hpu__dev_d2h(NULL, yr, dye, sizeof yr);
	assert_memory_equal(yr, ye, sizeof yr);
	assert_true(yr[9] == 0.0f && yr[10] == 0.0f &&
	            yr[11] == 0.0f); /* id 9: a zero row */
	hpu__checks_free();
	close_dev();
}

/* ---- a small training step through the public ops ---- */

#define BATCH 8
#define IN 12
#define OUT 5

typedef struct net {
	float *w, *b, *dw, *db, *x, *t, *h, *yr, *loss, *dloss, *dy, *dh, *m;
	hpu__dev_stepvars *sv;
	float *pin_x, *pin_t; /* the batch, pinned */
	hpu__dev_stepcfg cfg;
} net;

/* forward (linear, relu, MSE), backward, the step's decisions and SGD
 * with momentum from sv */
static void net_step(net *n)
{
	hpu__dev_h2d(NULL, n->x, n->pin_x, BATCH * IN * 4);
	hpu__dev_h2d(NULL, n->t, n->pin_t, BATCH * OUT * 4);
	hpu__dev_memset(NULL, n->dw, 0, OUT * IN * 4);
	hpu__dev_memset(NULL, n->db, 0, OUT * 4);
	hpu_linear_forward(n->x, n->w, n->b, n->h, BATCH, IN, OUT);
	hpu_relu_forward(n->h, n->yr, BATCH * OUT);
	assert_int_equal(hpu_mse_forward(n->yr, n->t, n->loss, BATCH, OUT),
	                 HPU_OK);
	assert_int_equal(
	    hpu_mse_backward(n->yr, n->t, n->dloss, n->dy, NULL, BATCH, OUT),
	    HPU_OK);
	hpu_relu_backward(n->yr, n->dy, n->dh, BATCH * OUT);
	hpu_linear_backward(n->x, n->w, n->dh, NULL, n->dw, n->db, BATCH, IN,
	                    OUT);
	hpu__dev_flag_nonfinite(&n->sv->bad, n->dw, OUT * IN);
	hpu__dev_sumsq_add(&n->sv->sumsq, n->dw, OUT * IN);
	hpu__dev_step_begin(n->sv, &n->cfg);
	hpu__dev_optim k = {.kind = HPU__DEV_SGD, .momentum = 0.9, .sv = n->sv};
	hpu__dev_optim_update(&k, n->w, n->dw, n->m, NULL, OUT * IN);
	hpu__dev_add(n->b, n->db, OUT); /* a runtime op of its own */
	hpu__dev_step_end(n->sv, &n->cfg);
}

static void net_reset(net *n)
{
	static float w[OUT * IN], b[OUT], dloss[BATCH];
	fill(w, OUT * IN, 21);
	fill(b, OUT, 22);
	for (int i = 0; i < BATCH; i++)
		dloss[i] = 1.0f / BATCH;
	hpu__dev_h2d(NULL, n->w, w, sizeof w);
	hpu__dev_h2d(NULL, n->b, b, sizeof b);
	hpu__dev_h2d(NULL, n->dloss, dloss, sizeof dloss);
	hpu__dev_memset(NULL, n->m, 0, OUT * IN * 4);
	hpu__dev_stepvars sv = {.lr = 0.1, .loss_scale = 1};
	hpu__dev_h2d(NULL, n->sv, &sv, sizeof sv);
}

static void net_batch(net *n, uint32_t seed)
{
	fill(n->pin_x, BATCH * IN, seed);
	fill(n->pin_t, BATCH * OUT, seed + 100);
}

typedef struct net_snap {
	float w[OUT * IN], b[OUT], m[OUT * IN], loss[BATCH];
	hpu__dev_stepvars sv;
} net_snap;

static void net_read(net *n, net_snap *s)
{
	hpu__dev_d2h(NULL, s->w, n->w, sizeof s->w);
	hpu__dev_d2h(NULL, s->b, n->b, sizeof s->b);
	hpu__dev_d2h(NULL, s->m, n->m, sizeof s->m);
	hpu__dev_d2h(NULL, s->loss, n->loss, sizeof s->loss);
	hpu__dev_d2h(NULL, &s->sv, n->sv, sizeof s->sv);
}

static void training_step_on(const char *dev)
{
	static net_snap eager[3], got;
	open_dev(dev, 1);
	net n = {.cfg = {.clip_norm = 0.5}};
	float **bufs[] = {&n.w,  &n.b,    &n.dw,    &n.db, &n.x,  &n.t, &n.h,
	                  &n.yr, &n.loss, &n.dloss, &n.dy, &n.dh, &n.m};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		*bufs[i] = dev_in(NULL, BATCH * IN * OUT * 4);
	n.sv = dev_in(NULL, sizeof *n.sv);
	n.pin_x = hpu__dev_host_alloc(BATCH * IN * 4);
	n.pin_t = hpu__dev_host_alloc(BATCH * OUT * 4);
	/* eager: three steps on three batches */
	net_reset(&n);
	for (int s = 0; s < 3; s++) {
		net_batch(&n, 31 + (uint32_t)s);
		net_step(&n);
		net_read(&n, &eager[s]);
	}
	assert_true(eager[2].sv.t == 3);
	/* recorded once, launched three times */
	net_reset(&n);
	hpu_device_stats st0, st1;
	assert_int_equal(begin(), 0);
	net_step(&n);
	hpu__dev_graph *g;
	char why[512];
	assert_int_equal(end(&g, why, sizeof why), 0);
	hpu__devmem_stats(&st0);
	printf("  the step: %zu nodes\n", hpu__dev_graph_nodes(g));
	for (int s = 0; s < 3; s++) {
		net_batch(&n, 31 + (uint32_t)s);
		launch(g);
		net_read(&n, &got);
		assert_memory_equal(&got, &eager[s], sizeof got);
	}
	hpu__devmem_stats(&st1);
	assert_true(st1.num_allocs ==
	            st0.num_allocs); /* a replay allocates nothing */
	hpu__dev_graph_free(&g);
	hpu__dev_host_free(n.pin_x);
	hpu__dev_host_free(n.pin_t);
	close_dev();
}

static void test_training_step(void **state)
{
	(void)state;
	training_step_on("cpu-strict");
}

static void test_training_step_cpu(void **state)
{
	(void)state;
	training_step_on("cpu");
}

/* ---- host nodes (hpu__dev_rec_host: the strategy's collectives) ---- */

typedef struct hostcall {
	float *buf;  /* device memory: the host call adds its value to buf[0] */
	float add;
	int fail;    /* 1: answers -1 with a sentence */
	float *seen; /* host memory: what buf[0] held when it ran */
} hostcall;

static int host_ran;

static int host_fn(const void *arg, char *err, size_t errlen)
{
	const hostcall *a = arg;
	host_ran++;
	if (a->fail) {
		snprintf(err, errlen, "an all-reduce between the 2 workers failed: rank 1 died");
		return -1;
	}
	float v;
	hpu__dev_copy(&v, a->buf, sizeof v);
	*a->seen = v;
	v += a->add;
	hpu__dev_copy(a->buf, &v, sizeof v);
	return 0;
}

/* A host node runs at each launch in its place among the device's calls,
 * on the recording's copy of its arguments; not while recording. A
 * failing one ends the launch with its own sentence (not "node N
 * answered -1") and runs nothing after it. Without a recording, none is
 * appended. */
static void test_host_node(void **state)
{
	(void)state;
	open_dev("cpu-strict", 1);
	float *pin = hpu__dev_host_alloc(4 * sizeof *pin), *buf = dev_in(NULL, 4 * sizeof *buf);
	float seen = -1;
	hostcall hc = {buf, 10.0f, 0, &seen};
	assert_int_equal(hpu__dev_rec_host("hpucoll_test", host_fn, &hc, sizeof hc), -1);
	pin[0] = 1.0f;
	host_ran = 0;
	assert_int_equal(begin(), 0);
	hpu__dev_h2d(NULL, buf, pin, sizeof *pin);                 /* buf[0] = pin[0] */
	assert_int_equal(hpu__dev_rec_host("hpucoll_test", host_fn, &hc, sizeof hc), 0);
	hpu__dev_add_scalar(buf, 0.5f, 1);                          /* after it */
	hc.add = 99.0f; /* the recording kept its own copy */
	hpu__dev_graph *g;
	char why[512];
	assert_int_equal(end(&g, why, sizeof why), 0);
	assert_int_equal(host_ran, 0);
	assert_int_equal(hpu__dev_graph_nodes(g), 3);
	assert_int_equal(hpu__dev_graph_host_calls(g), 1);
	const hpu__dev_node_count *nc = NULL;
	assert_int_equal(hpu__dev_graph_names(g, &nc), 3);
	assert_string_equal(nc[1].name, "hpucoll_test");
	float out;
	for (int k = 0; k < 2; k++) {
		pin[0] = 2.0f + (float)k;
		launch(g);
		hpu__dev_d2h(NULL, &out, buf, sizeof out);
		assert_true(seen == 2.0f + (float)k); /* after the h2d */
		assert_true(out == 2.0f + (float)k + 10.0f + 0.5f);
	}
	assert_int_equal(host_ran, 2);
	hpu__dev_graph_free(&g);

	/* a failing host node: its sentence, the calls after it not run */
	hc.fail = 1;
	assert_int_equal(begin(), 0);
	assert_int_equal(hpu__dev_rec_host("hpucoll_test", host_fn, &hc, sizeof hc), 0);
	hpu__dev_h2d(NULL, buf, pin, sizeof *pin);
	assert_int_equal(end(&g, why, sizeof why), 0);
	pin[0] = 7.0f;
	char err[512] = "";
	assert_int_equal(hpu__dev_graph_launch(g, err, sizeof err), -1);
	printf("  a failing host node: %s\n", err);
	assert_string_equal(err, "an all-reduce between the 2 workers failed: rank 1 died");
	hpu__dev_d2h(NULL, &out, buf, sizeof out);
	assert_true(out != 7.0f);
	hpu__dev_graph_free(&g);
	hpu__dev_host_free(pin);
	close_dev();
}

/* fp8 training's scaling state lives on the device in blocks of
 * HPU_FP8_CHUNK call sites, made eagerly: the first when fp8 training
 * is set up, the next at the first call site past a block. Past one while
 * recording, the recording is refused, naming fp8 (its zeros would be
 * made again at each launch), and nothing of that call site is kept;
 * eagerly the block is made, and the same calls then record. */
static void test_fp8_state_made_eagerly(void **state)
{
	(void)state;
	enum { F_B = 2, F_IN = 4, F_OUT = 3, F_SITES = HPU_FP8_CHUNK + 1 };
	char err[256], why[512];
	open_dev("cpu-strict", 1);
	hpu__dev_ops_hooks();
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_FP8, err, sizeof err), 0);
	hpu_fp8_recipe r = {2, 0, HPU_FP8_AMAX_MAX};
	hpu__fp8_set_mode(HPU_FP8_TRAIN, &r);
	static float hx[F_B * F_IN], hw[F_OUT * F_IN];
	fill(hx, F_B * F_IN, 41);
	fill(hw, F_OUT * F_IN, 42);
	float *x = dev_in(hx, sizeof hx), *w = dev_in(hw, sizeof hw);
	float *y = dev_in(NULL, F_B * F_OUT * 4);
	hpu__dev_graph *g;
	for (int pass = 0; pass < 3; pass++) { /* recorded, eager, recorded */
		if (pass != 1)
			assert_int_equal(begin(), 0);
		for (int i = 0; i < F_SITES; i++) {
			hpu__op_layer(i, "fc", w, F_OUT * F_IN, 0);
			hpu_linear_forward(x, w, NULL, y, F_B, F_IN, F_OUT);
		}
		hpu__op_layer(-1, NULL, NULL, 0, 0);
		if (pass == 1) {
			assert_int_equal(hpu__fp8_count(), F_SITES);
			continue;
		}
		int rc = end(&g, why, sizeof why);
		printf("  %d call sites, recorded: %s\n", F_SITES, rc ? why : "kept");
		assert_int_equal(rc, pass == 0 ? 1 : 0);
		if (pass == 0) {
			assert_non_null(strstr(why, "fp8: call site 257 is the first of a new block "
						    "of fp8's scaling state (256 call sites a block)"));
			assert_int_equal(hpu__fp8_count(), HPU_FP8_CHUNK);
		}
		hpu__dev_graph_free(&g);
	}
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
	hpu__be_set_dev_hooks(NULL);
	hpu__dev_free(x), hpu__dev_free(w), hpu__dev_free(y);
	close_dev();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_where),
	    cmocka_unit_test(test_record_launch),
	    cmocka_unit_test(test_refusals),
	    cmocka_unit_test(test_memory),
	    cmocka_unit_test(test_every_entry),
	    cmocka_unit_test(test_kernel_details),
	    cmocka_unit_test(test_training_step),
	    cmocka_unit_test(test_refusals_cpu),
	    cmocka_unit_test(test_host_touch_cpu),
	    cmocka_unit_test(test_training_step_cpu),
	    cmocka_unit_test(test_host_node),
	    cmocka_unit_test(test_fp8_state_made_eagerly),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
