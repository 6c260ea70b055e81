/* device_fp: what a recording's host code gave the kernels (device.h,
 * hpu__dev_graph_same_calls), on any device.
 *
 * A recorded step keeps every value the host passed to a kernel: a
 * launch repeats them. A custom layer that passes a value computed from
 * the step (a temperature annealed by ctx->step, a crop offset from the
 * host's random numbers) is then replayed with the recorded step's value,
 * silently. While a thread records, the ops' table is wrapped (for
 * whichever device: the wrapper only reads the arguments, then calls the
 * device's entry): each call notes its entry, the layer and pass running,
 * and a hash of its values (scalars; the host structs' sizes and flags;
 * permute's host shape and order; whether each pointer is NULL, never
 * what it points at, which the device holds). The runtime records the
 * step a second time at the next step and keeps the recording only where
 * both saw the same calls with the same values (worker/runtime/graphs.c).
 * device_graph.c calls it; it calls no other file of the folder. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/ops/fp8.h"

#define LAYER_MAX 48

typedef struct call {
	const char *entry; /* the entry's name (a literal) */
	uint64_t hash;
	int backward;
	char layer[LAYER_MAX];
} call;

struct hpu__dev_calls {
	call *c;
	size_t n, cap;
	int lost; /* out of host memory: compares as different */
};

static const hpu__backend *dev_table; /* the device's table, while wrapped */
static hpu__backend wrap;
static hpu__dev_calls *into;      /* the recording's calls */

typedef struct fp {
	uint64_t h;
	int last_int; /* the int before: permute's ndim */
	int permute;
} fp;

static void mix(fp *f, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		f->h ^= b[i];
		f->h *= 1099511628211ull; /* FNV-1a */
	}
}

static void fp_int(fp *f, int v)
{
	f->last_int = v;
	mix(f, &v, sizeof v);
}

static void fp_unsigned(fp *f, unsigned v)
{
	mix(f, &v, sizeof v);
}

static void fp_long(fp *f, long v)
{
	mix(f, &v, sizeof v);
}

static void fp_ulong(fp *f, unsigned long v)
{
	mix(f, &v, sizeof v);
}

static void fp_float(fp *f, float v)
{
	mix(f, &v, sizeof v);
}

static void fp_double(fp *f, double v)
{
	mix(f, &v, sizeof v);
}

/* Device memory, or host output: only whether it is there. */
static void fp_ptr(fp *f, const void *p)
{
	unsigned char there = p != NULL;
	mix(f, &there, 1);
}

static void fp_gemm(fp *f, const hpu__gemm *g)
{
	int v[9] = {(int)g->dt, g->count, g->m, g->n, g->k, g->trans_a, g->trans_b,
		    g->accumulate, (g->bias != NULL) | (g->c16 != NULL) << 1};
	size_t s[3] = {g->stride_a, g->stride_b, g->stride_c};
	mix(f, v, sizeof v);
	mix(f, s, sizeof s);
}

static void fp_conv(fp *f, const hpu_conv2d_shape *s)
{
	int v[8] = {s->batch, s->in_ch, s->height, s->width, s->out_ch, s->kernel, s->stride, s->pad};
	mix(f, v, sizeof v);
}

static void fp_rect(fp *f, const hpu_conv2d_rect_shape *s)
{
	int v[11] = {s->batch,    s->in_ch,  s->height,   s->width,  s->out_ch, s->kernel_h,
		     s->kernel_w, s->stride_h, s->stride_w, s->pad_h, s->pad_w};
	mix(f, v, sizeof v);
}

/* permute's shape and order are host memory, ndim values (backend.h);
 * any other entry's int arrays are the device's (ids, labels). */
static void fp_i64s(fp *f, const int64_t *a)
{
	if (f->permute && a && f->last_int > 0 && f->last_int <= 8)
		mix(f, a, (size_t)f->last_int * sizeof *a);
	else
		fp_ptr(f, a);
}

static void fp_ints(fp *f, const int *a)
{
	if (f->permute && a && f->last_int > 0 && f->last_int <= 8)
		mix(f, a, (size_t)f->last_int * sizeof *a);
	else
		fp_ptr(f, a);
}

#define FP_KINDS                                                                             \
	int: fp_int, unsigned: fp_unsigned, long: fp_long, unsigned long: fp_ulong,          \
	float: fp_float, double: fp_double, const hpu__gemm *: fp_gemm,                      \
	const hpu_conv2d_shape *: fp_conv, const hpu_conv2d_rect_shape *: fp_rect,           \
	const int64_t *: fp_i64s, const int *: fp_ints, default: fp_ptr
#define FP_ARG(x) _Generic((x), FP_KINDS)(&f_, (x));

static void note(const char *entry, uint64_t h)
{
	if (!into || into->lost || !hpu__dev_capturing()) /* another thread's: not recorded */
		return;
	if (into->n == into->cap) {
		size_t cap = into->cap ? 2 * into->cap : 256;
		call *c = realloc(into->c, cap * sizeof *c);
		if (!c) {
			into->lost = 1;
			return;
		}
		into->c = c;
		into->cap = cap;
	}
	call *c = &into->c[into->n++];
	c->entry = entry;
	c->hash = h;
	c->backward = hpu__op_layer_backward();
	snprintf(c->layer, sizeof c->layer, "%s", hpu__op_layer_name());
}

#define WRAP(name, params, args)                                                             \
	static int w_##name params                                                           \
	{                                                                                    \
		fp f_ = {.h = 14695981039346656037ull, .permute = !strcmp(#name, "permute")}; \
		KL_FE(FP_ARG, KL_UNPAREN args)                                               \
		note(#name, f_.h);                                                           \
		return dev_table->name args;                                                     \
	}
#include "worker/device/device_klist.h"
/* A GPU's bf16 attention tiles (backend.h), not in the list (no CPU table
 * has them): as the list's. */
WRAP(flash16_fwd,
     (const float *qkv, const int32_t *mask, float *ctx, float *lse, int batch, int t, int heads,
      int hd, int causal),
     (qkv, mask, ctx, lse, batch, t, heads, hd, causal))
WRAP(flash16_bwd,
     (const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
      const float *dctx, float *dqkv, int batch, int t, int heads, int hd, int causal),
     (qkv, mask, ctx, lse, dctx, dqkv, batch, t, heads, hd, causal))
#undef WRAP

/* Not in the list (its weights_done is host output): as the list's. */
static int w_conv_bwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *w,
		      const void *dy, float *dx, float *dw, float *db, int *weights_done)
{
	fp f_ = {.h = 14695981039346656037ull};
	fp_conv(&f_, s);
	fp_unsigned(&f_, (unsigned)dt);
	fp_ptr(&f_, dx);
	fp_ptr(&f_, dw);
	fp_ptr(&f_, db);
	note("conv_bwd", f_.h);
	return dev_table->conv_bwd(s, dt, x, w, dy, dx, dw, db, weights_done);
}

void hpu__dev_fp_begin(hpu__dev_graph *g)
{
	if (!(g->calls = calloc(1, sizeof *g->calls)))
		return; /* compares as different: never kept unchecked */
	dev_table = hpu__be();
	wrap = *dev_table; /* its name, flags and non-kernel entries as they are */
#define WRAP(name, params, args) wrap.name = dev_table->name ? w_##name : NULL;
#include "worker/device/device_klist.h"
#undef WRAP
	wrap.conv_bwd = dev_table->conv_bwd ? w_conv_bwd : NULL;
	wrap.flash16_fwd = dev_table->flash16_fwd ? w_flash16_fwd : NULL;
	wrap.flash16_bwd = dev_table->flash16_bwd ? w_flash16_bwd : NULL;
	into = g->calls;
	hpu__be_set(&wrap);
}

void hpu__dev_fp_end(void)
{
	if (!dev_table)
		return;
	hpu__be_set(dev_table);
	dev_table = NULL;
	into = NULL;
}

hpu__dev_calls *hpu__dev_graph_take_calls(hpu__dev_graph *g)
{
	hpu__dev_calls *c = g ? g->calls : NULL;
	if (g)
		g->calls = NULL;
	return c;
}

void hpu__dev_calls_free(hpu__dev_calls **c)
{
	if (!c || !*c)
		return;
	free((*c)->c);
	free(*c);
	*c = NULL;
}

/* "layer attn's forward", or "host code outside a layer" */
static void where(const call *c, char *out, size_t len)
{
	if (c->layer[0])
		snprintf(out, len, "layer %s's %s", c->layer, c->backward ? "backward" : "forward");
	else
		snprintf(out, len, "host code outside a layer (the loss, the metrics)");
}

int hpu__dev_graph_same_calls(const hpu__dev_calls *before, const hpu__dev_graph *g,
			      char *why, size_t len)
{
	const hpu__dev_calls *a = before, *b = g ? g->calls : NULL;
	char w[128];
	if (!a || !b || a->lost || b->lost) {
		snprintf(why, len, "out of host memory for the check of the recording's calls");
		return 0;
	}
	size_t n = a->n < b->n ? a->n : b->n;
	for (size_t i = 0; i < n; i++) {
		const call *x = &a->c[i], *y = &b->c[i];
		int same_site = !strcmp(x->entry, y->entry) && x->backward == y->backward &&
				!strcmp(x->layer, y->layer);
		if (same_site && x->hash == y->hash)
			continue;
		where(y, w, sizeof w);
		if (same_site)
			snprintf(why, len,
				 "%s gave the kernel %s (call %zu) other values than in the "
				 "recording before: a value the host computes each step (from the "
				 "step or the epoch, or drawn from the host's random numbers) "
				 "would be replayed as recorded",
				 w, y->entry, i + 1);
		else
			snprintf(why, len,
				 "%s made another call than in the recording before (call %zu: the "
				 "kernel %s, where it was %s): host code that chooses its work each "
				 "step would be replayed as recorded",
				 w, i + 1, y->entry, x->entry);
		return 0;
	}
	if (a->n != b->n) {
		snprintf(why, len,
			 "the recording made %zu kernel calls, the recording before %zu: host "
			 "code that chooses its work each step would be replayed as recorded",
			 b->n, a->n);
		return 0;
	}
	return 1;
}
