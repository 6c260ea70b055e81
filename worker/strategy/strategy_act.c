/* strategy_act: where the strategy keeps the graph's tensors, their
 * gradients and the layers' saved memory, and which of them activation
 * checkpointing drops (strategy_pass.c recomputes them before backward
 * needs them).
 *
 * Tensor t is t_data[t]: a dataset field points into the batch, a layer's
 * output is device memory of the strategy (maxbatch rows), allocated on
 * first use and kept across steps unless checkpointing drops it, or no
 * backward reads it (s->unread, hpu_layer_backward_reads: freed after its
 * last reader's forward, neither kept nor compressed; issue 38). Under
 * bf16-mixed and fp8 (s->act16) an f32 output kept for backward is stored
 * in bf16 when every value of it is a bf16 value (the lowered ops round
 * their outputs; ReLU and pooling keep them so), or under bf16-mixed
 * rounded to bf16 when its backwards read it only as the linear op's x,
 * which rounds it so itself (s->round16, hpu_layer_backward_reads_linear:
 * a GELU's output before the next linear layer): a16[t] at half the
 * bytes, made once its last reader has run in forward, the fp32 one then
 * freed; backward expands it again while it is needed. Loss and metric
 * tensors, i32 tensors and other outputs with any value off the bf16 grid
 * stay fp32, and so does a tensor only the first backward reads
 * (s->keep32).
 * While both forms are there after an expansion, the fp32 one lends the
 * ops its bf16 twin (hpu__ac_twin_add): their bf16 products read a16
 * instead of converting the activations again (issue 38). */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "worker/ops/autocast.h"
#include "common/simd.h"
#include "worker/strategy/strategy_impl.h"

/* The tensors a forward (training's or evaluation's) frees after their
 * last reader: those
 * no backward reads (hpu_layer_backward_reads; a layer that said nothing
 * reads all of its inputs and outputs), made by a layer training runs,
 * neither a loss nor a metric (read after forward), nor an input of a
 * layer activation checkpointing may run again (recompute() reads it),
 * nor dropped by checkpointing already. Under bf16-mixed they are neither
 * compressed nor expanded; under fp32 they are not kept either. */
static void plan_reads(hpu_strat *s)
{
	hpu_builder *b = s->b;
	for (int t = 0; t < b->ntensors; t++) {
		const hpu_tinfo *ti = &b->tensors[t];
		int p = ti->producer;
		s->nobwd[t] = (char)(p >= 0 && b->layers[p]->for_loss && !ti->loss && !ti->metric);
	}
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		for (int k = 0; k < l->nin; k++)
			if (l->backward && hpu__act_reads_in(l, k))
				s->nobwd[l->in[k]] = 0;
		for (int k = 0; k < l->nout && l->backward; k++)
			if (hpu__act_reads_out(l, k))
				s->nobwd[l->out[k]] = 0;
	}
	for (int t = 0; t < b->ntensors; t++)
		s->unread[t] = (char)(s->nobwd[t] && !s->transient[t]);
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		if (s->saved_transient[i] || s->seg_start[i] != i) /* may run again */
			for (int k = 0; k < l->nin; k++)
				s->unread[l->in[k]] = 0;
	}
}

/* Whether layer i's backward may write the gradient of its input k over
 * the input (hpu_layer_backward_in_place): the input is an fp32 tensor a
 * layer made, needs a gradient, is neither a loss nor a metric nor
 * dropped by checkpointing, is no other input of i, i's backward reads it
 * and is the first to write its gradient (no later layer's backward
 * takes it), and nothing that runs after i's backward reads it: neither
 * an earlier reader's backward nor its producer's (its output), nor the
 * forward of a reader that checkpointing runs again (plan_reads keeps
 * those inputs too). */
static int in_place_ok(const hpu_strat *s, int i, int k)
{
	hpu_builder *b = s->b;
	const hpu_layer *l = b->layers[i];
	int t = l->in[k];
	const hpu_tinfo *ti = &b->tensors[t];
	if (!l->backward || !(l->in_place >> k & 1u) || !hpu__act_reads_in(l, k) || !ti->grad ||
	    ti->dtype != HPU_F32 || ti->producer < 0 || ti->loss || ti->metric || s->transient[t])
		return 0;
	for (int q = 0; q < l->nin; q++)
		if (q != k && l->in[q] == t)
			return 0;
	for (int j = 0; j < s->nlayers; j++) {
		const hpu_layer *o = b->layers[j];
		if (j == i)
			continue;
		for (int q = 0; q < o->nin; q++) /* recomputed in backward */
			if (o->in[q] == t && (s->saved_transient[j] || s->seg_start[j] != j))
				return 0;
		if (!o->backward)
			continue;
		for (int q = 0; q < o->nin; q++)
			if (o->in[q] == t && (j > i || hpu__act_reads_in(o, q)))
				return 0;
		for (int q = 0; q < o->nout; q++)
			if (o->out[q] == t && hpu__act_reads_out(o, q))
				return 0;
	}
	return 1;
}

/* Per tensor whether it is kept as its bf16 rounding after forward
 * (s->round16): under bf16-mixed, with the linear op in bf16, when every
 * backward that reads it reads it only as hpu_linear_backward's x
 * (hpu_layer_backward_reads_linear), which rounds it to bf16 itself, its
 * producer's backward does not read it (its output), and no layer that
 * checkpointing runs again reads it (a forward of fp32 values). A GELU's
 * output read by the next linear layer: half the bytes, and the products
 * see the same bf16 values. */
static void plan_rounded(hpu_strat *s)
{
	hpu_builder *b = s->b;
	memset(s->round16, 0, (size_t)b->ntensors);
	if (!s->round_ok || hpu__ac_fallback(HPU_OP_LINEAR) != HPU_AUTOCAST_BF16)
		return;
	/* 1: read by backwards, all as linear x; 2: some other way */
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		int again = s->saved_transient[i] || s->seg_start[i] != i;
		for (int k = 0; k < l->nin; k++) {
			int t = l->in[k];
			if (again)
				s->round16[t] = 2;
			else if (l->backward && hpu__act_reads_in(l, k))
				s->round16[t] = (char)(l->linear_in >> k & 1u && s->round16[t] != 2 ? 1 : 2);
		}
		for (int k = 0; k < l->nout && l->backward; k++)
			if (hpu__act_reads_out(l, k))
				s->round16[l->out[k]] = 2;
	}
	for (int t = 0; t < b->ntensors; t++)
		s->round16[t] = (char)(s->round16[t] == 1);
}

/* Per layer the inputs its backward overwrites with their gradients;
 * per tensor whether it stays fp32 after forward under bf16-mixed: when
 * the only backward that reads it is the first to run, putting it into
 * bf16 after forward only to expand it again at once would cost both
 * forms together (a language model's logits: their fp32 form is there
 * at the loss's backward either way). */
static void plan_in_place(hpu_strat *s)
{
	hpu_builder *b = s->b;
	int last_bwd = -1;
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		s->inplace[i] = 0;
		for (int k = 0; k < l->nin; k++)
			if (in_place_ok(s, i, k))
				s->inplace[i] |= 1u << k;
		if (l->backward)
			last_bwd = i;
	}
	/* 1: read by the first backward only; 0: by no backward, or another */
	memset(s->keep32, 0, (size_t)b->ntensors);
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		if (!l->backward)
			continue;
		for (int k = 0; k < l->nin + l->nout; k++) {
			int in = k < l->nin, t = in ? l->in[k] : l->out[k - l->nin];
			if (in ? !hpu__act_reads_in(l, k) : !hpu__act_reads_out(l, k - l->nin))
				continue;
			s->keep32[t] = (char)(i == last_bwd && s->keep32[t] != 2 ? 1 : 2);
		}
	}
	for (int t = 0; t < b->ntensors; t++)
		s->keep32[t] = (char)(s->keep32[t] == 1);
}

void hpu__act_describe(const hpu_strat *s, FILE *f)
{
	hpu_builder *b = s->b;
	int kept = 0, exact = 0, rounded = 0, fp32 = 0, freed = 0, again = 0;
	int packed = s->act16 && !s->vars.recordable; /* compressed after forward */
	for (int t = 0; t < b->ntensors; t++) {
		const hpu_tinfo *ti = &b->tensors[t];
		if (ti->producer < 0 || !b->layers[ti->producer]->for_loss)
			continue;
		if (s->transient[t]) {
			again++;
			continue;
		}
		if (s->unread[t]) {
			freed++;
			continue;
		}
		if (s->nobwd[t] || ti->loss || ti->metric)
			continue; /* read after forward, not by backward */
		kept++;
		if (!packed || ti->dtype != HPU_F32)
			continue;
		if (s->keep32[t])
			fp32++;
		else if (s->round16[t])
			rounded++;
		else
			exact++;
	}
	fprintf(f, "  activations kept for backward: %d tensor%s", kept, kept == 1 ? "" : "s");
	if (packed)
		fprintf(f, " (after forward: %d in bf16 if every value is a bf16 value, else fp32; "
			   "%d as their bf16 rounding (read as linear products' x); %d in fp32 (read "
			   "by the first backward only))",
			exact, rounded, fp32);
	else if (s->act16)
		fprintf(f, " (in fp32: a recordable step keeps them so)");
	fprintf(f, "; %d freed after forward (no backward reads them), %d recomputed "
		   "(activation checkpointing)\n",
		freed, again);
	for (int i = 0; i < s->nlayers; i++)
		for (int k = 0; k < b->layers[i]->nin; k++)
			if (s->inplace[i] >> k & 1u)
				fprintf(f, "  %s's backward writes the gradient of %s over it\n",
					b->layers[i]->name, b->tensors[b->layers[i]->in[k]].name);
}

/* Activation checkpointing. In a run of consecutive marked layers, a
 * tensor whose readers all come after its producer within the same
 * segment of the run need not be kept: backward recomputes the segment
 * from its inputs. A run of m layers is cut into segments of
 * ceil(sqrt(m)) layers, and the outputs of each segment's last layer are
 * kept, so that backward recomputes one segment at a time (Chen et al.,
 * 2016): about 2 sqrt(m) outputs alive instead of m, for one extra
 * forward. A layer's saved memory goes with its outputs. */
void hpu__act_plan(hpu_strat *s)
{
	hpu_builder *b = s->b;
	hpu_layer **ls = b->layers;
	int L = s->nlayers;
	for (int a = 0; a < L;) {
		if (!(ls[a]->ckpt && a + 1 < L && ls[a + 1]->ckpt)) {
			a++;
			continue;
		}
		int z = a; /* the run of marked layers a .. z */
		while (z + 1 < L && ls[z + 1]->ckpt)
			z++;
		int m = z - a + 1, seg = (int)ceil(sqrt((double)m));
		for (int c0 = a; c0 <= z; c0 += seg) {
			int c1 = c0 + seg - 1 < z ? c0 + seg - 1 : z;
			for (int p = c0; p < c1; p++) {
				s->seg_start[p] = c0;
				s->saved_transient[p] = 1;
				for (int k = 0; k < ls[p]->nout; k++) {
					int t = ls[p]->out[k];
					const hpu_tinfo *ti = &b->tensors[t];
					int inside = !ti->loss && !ti->metric;
					for (int j = 0; j < L && inside; j++)
						for (int q = 0; q < ls[j]->nin; q++)
							if (ls[j]->in[q] == t && (j <= p || j > c1))
								inside = 0;
					s->transient[t] = (char)inside;
				}
			}
			s->seg_start[c1] = c0;
		}
		a = z + 1;
	}
	plan_reads(s);
	plan_in_place(s);
	plan_rounded(s);
}

static int owned(const hpu_strat *s, int t)
{
	return s->b->tensors[t].producer >= 0;
}

static size_t tensor_bytes(const hpu_strat *s, int t, int rows, size_t elem)
{
	return (size_t)rows * s->b->tensors[t].sample_numel * elem;
}

int hpu__act_ensure(hpu_strat *s, int t)
{
	if (s->t_data[t]) /* about to be written: no longer a16's values */
		hpu__ac_twin_remove(s->t_data[t]);
	if (s->t_data[t] || !owned(s, t))
		return 0;
	char what[128];
	snprintf(what, sizeof what, "activations %s", s->b->tensors[t].name);
	/* overwritten by the forward (or the expansion) for the rows in use;
	 * rows past them are never read */
	s->t_data[t] = hpu__dalloc_uninit(HPU_MEM_ACTS, tensor_bytes(s, t, s->maxbatch, 4), what);
	if (!s->t_data[t])
		return hpu__strat_fail(s, "%s", hpu__devmem_error());
	return 0;
}

void hpu__act_drop(hpu_strat *s, int t)
{
	if (!owned(s, t))
		return;
	hpu__ac_twin_remove(s->t_data[t]);
	hpu__dfree(s->t_data[t]);
	s->t_data[t] = NULL;
	if (s->a16) {
		hpu__dfree(s->a16[t]);
		s->a16[t] = NULL;
	}
}

int hpu__act_kept(const hpu_strat *s, int t)
{
	return s->t_data[t] || (s->a16 && s->a16[t]);
}

int hpu__act_compress(hpu_strat *s, int t, int n)
{
	const hpu_tinfo *ti = &s->b->tensors[t];
	/* Recordable: whether a tensor's values are all bf16 is the data's
	 * to say, and the host may not read it inside the step; kept in
	 * fp32 (the same values their readers see: exact ones, or ones
	 * they round to bf16 themselves), at the cost of the memory
	 * compression saves. (Not even the rounded ones: in a recording the
	 * fp32 block a compression frees stays held for the graph, so the
	 * bf16 one only adds; measured: gpt_lm 458 -> 521 MiB.) */
	if (!s->act16 || !owned(s, t) || ti->dtype != HPU_F32 || ti->loss || ti->metric ||
	    !s->t_data[t] || s->vars.recordable || s->keep32[t])
		return 0;
	if (!s->a16[t]) {
		char what[128];
		snprintf(what, sizeof what, "bf16 activations %s", ti->name);
		if (!(s->a16[t] = hpu__dalloc(HPU_MEM_ACTS, tensor_bytes(s, t, s->maxbatch, 2), what)))
			return hpu__strat_fail(s, "%s", hpu__devmem_error());
	}
	int exact = 1;
	if (s->round16[t]) /* its readers round it so themselves */
		hpu__dev_to16(0, s->a16[t], s->t_data[t], tensor_bytes(s, t, n, 1));
	else
		exact = hpu__dev_bf16_exact(s->a16[t], s->t_data[t], tensor_bytes(s, t, n, 1));
	if (!exact) {
		hpu__dfree(s->a16[t]); /* an fp32 op's output: keep fp32 */
		s->a16[t] = NULL;
		return 0;
	}
	hpu__ac_twin_remove(s->t_data[t]);
	hpu__dfree(s->t_data[t]);
	s->t_data[t] = NULL;
	return 0;
}

int hpu__act_expand(hpu_strat *s, int t, int n)
{
	if (s->t_data[t] || !s->a16 || !s->a16[t])
		return 0;
	if (hpu__act_ensure(s, t) < 0)
		return -1;
	hpu__dev_bf16_expand(s->t_data[t], s->a16[t], tensor_bytes(s, t, n, 1));
	/* the lowered ops read a16 itself for their bf16 products (host
	 * memory on the CPU devices; a failure only costs the conversion) */
	if (hpu__dev_host_can_read())
		(void)hpu__ac_twin_add(s->t_data[t], s->a16[t], tensor_bytes(s, t, n, 1));
	return 0;
}

void hpu__act_release(hpu_strat *s, int t)
{
	if (s->a16 && s->a16[t]) {
		hpu__ac_twin_remove(s->t_data[t]);
		hpu__dfree(s->t_data[t]);
		s->t_data[t] = NULL;
	}
}

/* Tensor t's memory becomes its gradient (a backward that writes it over
 * the tensor, s->inplace): its bf16 form and twin go, its values are no
 * longer kept. */
float *hpu__act_grad_in_place(hpu_strat *s, int t)
{
	hpu__ac_twin_remove(s->t_data[t]);
	if (s->a16) {
		hpu__dfree(s->a16[t]);
		s->a16[t] = NULL;
	}
	s->t_grad[t] = s->t_data[t];
	s->t_data[t] = NULL;
	return s->t_grad[t];
}

/* ---- the layers' saved memory ---- */

int hpu__act_saved(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	size_t n = hpu__strat_saved_floats(s, l);
	if (!n || s->saved[i])
		return 0;
	char what[128];
	snprintf(what, sizeof what, "saved memory of %s", l->name);
	if (!(s->saved[i] = hpu__dalloc(HPU_MEM_ACTS, n * 4, what)))
		return hpu__strat_fail(s, "%s", hpu__devmem_error());
	return 0;
}

void hpu__act_saved_drop(hpu_strat *s, int i)
{
	hpu__dfree(s->saved[i]);
	s->saved[i] = NULL;
}

/* ---- gradients of tensors ---- */

float *hpu__act_grad(hpu_strat *s, int t, int zero)
{
	if (s->t_grad[t])
		return s->t_grad[t];
	char what[128];
	snprintf(what, sizeof what, "gradient of %s", s->b->tensors[t].name);
	size_t bytes = tensor_bytes(s, t, s->maxbatch, 4);
	s->t_grad[t] = zero ? hpu__dalloc(HPU_MEM_ACTS, bytes, what)
			    : hpu__dalloc_uninit(HPU_MEM_ACTS, bytes, what);
	if (!s->t_grad[t])
		hpu__strat_fail(s, "%s", hpu__devmem_error());
	return s->t_grad[t];
}

void hpu__act_grad_drop(hpu_strat *s, int t)
{
	hpu__dfree(s->t_grad[t]);
	s->t_grad[t] = NULL;
}
