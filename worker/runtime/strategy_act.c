/* strategy_act: where the strategy keeps the layers' outputs, and which
 * of them activation checkpointing drops (strategy_pass.c recomputes
 * them before backward).
 *
 * Layer i's output is acts[i] (fp32, what the layers read and write).
 * Under bf16-mixed and fp8 (s->act16) an output kept for backward is
 * stored in bf16 when every value of it is a bf16 value (the lowered ops
 * round their outputs; ReLU and pooling keep them so): a16[i] at half the
 * bytes, made once the next layer has read acts[i] in forward, which is
 * then freed; backward expands it into acts[i] again while it is needed.
 * The last layer's output (the loss reads it) stays fp32, and so does an
 * output with any value off the bf16 grid (an fp32 op's). */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "devmem.h"
#include "simd.h"
#include "strategy_impl.h"

/* Activation checkpointing. A marked layer followed by a marked layer
 * need not keep its output: the next layer has read it, and backward can
 * recompute it from the last output kept below. In a run of m such
 * layers every ceil(sqrt(m))-th output is kept all the same, so that
 * backward recomputes one segment at a time (Chen et al., 2016): about
 * 2 sqrt(m) outputs alive instead of m, for one extra forward. The last
 * layer's output feeds the loss and is always kept. */
void hpu__act_plan(hpu_strat *s)
{
	hpu_layer **ls = s->b->layers;
	int L = s->nlayers;
	for (int a = 0; a < L;) {
		if (!(ls[a]->ckpt && a + 1 < L && ls[a + 1]->ckpt)) {
			a++;
			continue;
		}
		int z = a; /* the run of marked layers a .. z */
		while (z + 1 < L && ls[z + 1]->ckpt)
			z++;
		/* layers a .. z-1 may drop their outputs */
		int m = z - a, seg = (int)ceil(sqrt((double)m));
		for (int j = a; j < z; j++)
			s->transient[j] = (j - a + 1) % seg != 0;
		a = z;
	}
}

int hpu__act_ensure(hpu_strat *s, int i)
{
	if (s->acts[i])
		return 0;
	hpu_layer *l = s->b->layers[i];
	char what[128];
	snprintf(what, sizeof what, "activations of %s", l->name);
	size_t bytes = (size_t)s->maxbatch * l->out_size * 4;
	/* act16: made per step and overwritten by the forward (or the
	 * expansion) for the rows in use; rows past them are never read */
	s->acts[i] = s->act16 ? hpu__dalloc_uninit(HPU_MEM_ACTS, bytes, what)
			      : hpu__dalloc(HPU_MEM_ACTS, bytes, what);
	if (!s->acts[i])
		return hpu__strat_fail(s, "%s", hpu__devmem_error());
	return 0;
}

void hpu__act_drop(hpu_strat *s, int i)
{
	hpu__dfree(s->acts[i]);
	s->acts[i] = NULL;
	if (s->a16) {
		hpu__dfree(s->a16[i]);
		s->a16[i] = NULL;
	}
}

/* Layer i's output is kept (fp32 or bf16). */
int hpu__act_kept(const hpu_strat *s, int i)
{
	return s->acts[i] || (s->a16 && s->a16[i]);
}

/* dst[k] = the bf16 of x[k]; returns 1 when every x[k] was a bf16 value
 * (so that dst holds x exactly). */
HPU_CLONES static int bf16_exact(uint16_t *restrict dst, const float *restrict x, size_t n)
{
	uint32_t off = 0;
	for (size_t k = 0; k < n; k++) {
		uint32_t v;
		memcpy(&v, &x[k], 4);
		off |= v & 0xffffu;
		dst[k] = (uint16_t)(v >> 16);
	}
	return off == 0;
}

HPU_CLONES static void bf16_expand(float *restrict dst, const uint16_t *restrict src, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		uint32_t v = (uint32_t)src[k] << 16;
		memcpy(&dst[k], &v, 4);
	}
}

/* act16: stores layer i's output (n rows) in bf16 if it is exact there,
 * freeing the fp32 one; else keeps the fp32 one. */
int hpu__act_compress(hpu_strat *s, int i, int n)
{
	if (!s->act16 || i == s->nlayers - 1 || !s->acts[i])
		return 0;
	hpu_layer *l = s->b->layers[i];
	if (!s->a16[i]) {
		char what[128];
		snprintf(what, sizeof what, "bf16 activations of %s", l->name);
		if (!(s->a16[i] = hpu__dalloc(HPU_MEM_ACTS, (size_t)s->maxbatch * l->out_size * 2,
						 what)))
			return hpu__strat_fail(s, "%s", hpu__devmem_error());
	}
	if (!bf16_exact(s->a16[i], s->acts[i], (size_t)n * l->out_size)) {
		hpu__dfree(s->a16[i]); /* an fp32 op's output: keep fp32 */
		s->a16[i] = NULL;
		return 0;
	}
	hpu__dfree(s->acts[i]);
	s->acts[i] = NULL;
	return 0;
}

/* act16: layer i's output as fp32 again (for backward). */
int hpu__act_expand(hpu_strat *s, int i, int n)
{
	if (s->acts[i] || !s->a16 || !s->a16[i])
		return 0;
	if (hpu__act_ensure(s, i) < 0)
		return -1;
	bf16_expand(s->acts[i], s->a16[i], (size_t)n * s->b->layers[i]->out_size);
	return 0;
}

/* act16, after layer i's backward: its fp32 output is not needed again. */
void hpu__act_release(hpu_strat *s, int i)
{
	if (s->a16 && s->a16[i]) {
		hpu__dfree(s->acts[i]);
		s->acts[i] = NULL;
	}
}
