/* model_params: a layer's parameters (its own and shared), buffers,
 * memory and flags, declared during setup, and what its forward and
 * backward reach of them. */
#include "worker/hpu/model.h"
#include "worker/hpu/model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ops/autocast.h"

static int grow_pidx(hpu_layer *l, int g)
{
	int *grown = realloc(l->pidx, (size_t)(l->npidx + 1) * sizeof *grown);
	if (!grown)
		return hpu__model_refuse(l->b, HPU_ENOMEM, "out of memory");
	l->pidx = grown;
	l->pidx[l->npidx] = g;
	return l->npidx++;
}

static int check_init(hpu_builder *b, const char *name, const hpu_init *init)
{
	if (init->kind < HPU_INIT_ZEROS || init->kind > HPU_INIT_CUSTOM)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: unknown initializer %d", name, (int)init->kind);
	if (init->kind == HPU_INIT_CUSTOM && !init->fn)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: HPU_INIT_CUSTOM needs fn", name);
	if ((init->kind == HPU_INIT_NORMAL || init->kind == HPU_INIT_TRUNC_NORMAL) &&
	    !(init->b >= 0))
		return hpu__model_refuse(b, HPU_EINVAL, "%s: a normal initializer needs std b >= 0", name);
	if (init->kind == HPU_INIT_UNIFORM && !(init->a <= init->b))
		return hpu__model_refuse(b, HPU_EINVAL, "%s: HPU_INIT_UNIFORM needs a <= b", name);
	return HPU_OK;
}

/* The checks a parameter and a buffer declaration share (`what` says
 * which): right after its layer, a good name not taken, a shape, an
 * initializer. Sets full ("layer.name") and *numel; HPU_OK or the code. */
static int check_decl(hpu_layer *l, const char *what, const char *name, int ndim,
		      const int64_t *shape, const hpu_init *init, char *full, size_t fulllen,
		      size_t *numel)
{
	hpu_builder *b = l->b;
	char plural[32];
	snprintf(plural, sizeof plural, "%ss", what);
	int rc = hpu__model_check_last(l, plural);
	if (rc < 0)
		return rc;
	if (hpu__model_bad_name(name))
		return hpu__model_refuse(b, HPU_EINVAL, "layer %s: %s name missing, too long or with "
					 "characters other than letters, digits and _-/.", l->name, what);
	char why[128];
	if (!(*numel = hpu__model_shape_numel(ndim, shape, 0, why, sizeof why)))
		return hpu__model_refuse(b, HPU_EINVAL, "layer %s: %s %s %s", l->name, what, name, why);
	snprintf(full, fulllen, "%s.%s", l->name, name);
	if (hpu__model_param(b, full) >= 0 || hpu__model_buffer(b, full) >= 0)
		return hpu__model_refuse(b, HPU_EINVAL, "layer %s: %s is declared twice", l->name, full);
	return check_init(b, full, init);
}

int hpu_param_add(hpu_layer *l, const char *name, int ndim, const int64_t *shape,
		  hpu_init init)
{
	HPU__LAYER_DECL(l, "hpu_param_add");
	hpu_builder *b = l->b;
	char full[sizeof b->params[0].name];
	size_t numel;
	int rc = check_decl(l, "parameter", name, ndim, shape, &init, full, sizeof full, &numel);
	if (rc < 0)
		return rc;
	hpu_param_info *grown = realloc(b->params, (size_t)(b->nparams + 1) * sizeof *grown);
	if (!grown)
		return hpu__model_refuse(b, HPU_ENOMEM, "out of memory adding parameter %s", full);
	b->params = grown;
	hpu_param_info *p = &b->params[b->nparams];
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s", full);
	p->ndim = ndim;
	memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
	p->numel = numel;
	p->offset = b->numel;
	p->rel = b->numel - l->decl_off;
	p->init = init;
	p->layer = l->index;
	p->users = 1;
	if ((rc = grow_pidx(l, b->nparams)) < 0)
		return rc;
	/* Keep every parameter 16-float (64-byte) aligned in the flat buffer. */
	b->numel += (numel + 15) & ~(size_t)15;
	b->psi += numel;
	l->plen = b->numel - l->decl_off;
	b->nparams++;
	l->nparams++;
	return rc;
}

int hpu_param_init(hpu_builder *b, const char *param, hpu_init init)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_param_init", HPU_EINVAL);
	int g = param ? hpu__model_param(b, param) : -1;
	if (g < 0)
		return hpu__model_refuse(b, HPU_ENOENT, "hpu_param_init: no parameter named %s declared so far",
					 param ? param : "(null)");
	int rc = check_init(b, param, &init);
	if (rc < 0)
		return rc;
	b->params[g].init = init;
	return HPU_OK;
}

int hpu_param_shape(const hpu_builder *b, const char *param, int *ndim,
		    int64_t shape[HPU_MAX_DIMS])
{
	int g = param ? hpu__model_param(b, param) : -1;
	if (g < 0)
		return HPU_ENOENT;
	*ndim = b->params[g].ndim;
	memcpy(shape, b->params[g].shape, sizeof b->params[g].shape);
	return HPU_OK;
}

int hpu_param_share(hpu_layer *l, const char *param)
{
	HPU__LAYER_DECL(l, "hpu_param_share");
	hpu_builder *b = l->b;
	int g = param ? hpu__model_param(b, param) : -1;
	if (g < 0)
		return hpu__model_refuse(b, HPU_ENOENT, "layer %s: shares parameter %s, which no earlier layer "
					 "declared", l->name, param ? param : "(null)");
	int owner = b->params[g].layer;
	for (int k = 0; k < l->npidx; k++)
		if (l->pidx[k] == g)
			return hpu__model_refuse(b, HPU_EINVAL, "layer %s: uses parameter %s twice", l->name,
						 param);
	int rc = grow_pidx(l, g);
	if (rc < 0)
		return rc;
	b->params[g].users++;
	if (owner == l->index)
		return rc;
	for (int k = 0; k < l->nuses; k++)
		if (l->uses[k] == owner)
			return rc;
	int *grown = realloc(l->uses, (size_t)(l->nuses + 1) * sizeof *grown);
	if (!grown)
		return hpu__model_refuse(b, HPU_ENOMEM, "out of memory");
	l->uses = grown;
	l->uses[l->nuses++] = owner;
	return rc;
}

int hpu_buffer_add(hpu_layer *l, const char *name, int ndim, const int64_t *shape,
		   hpu_init init, hpu_buffer_sync sync)
{
	HPU__LAYER_DECL(l, "hpu_buffer_add");
	hpu_builder *b = l->b;
	char full[sizeof b->buffers[0].name];
	size_t numel;
	int rc = check_decl(l, "buffer", name, ndim, shape, &init, full, sizeof full, &numel);
	if (rc < 0)
		return rc;
	if (sync < HPU_BUFFER_BROADCAST || sync > HPU_BUFFER_LOCAL)
		return hpu__model_refuse(b, HPU_EINVAL, "layer %s: buffer %s has an unknown sync %d", l->name,
					 name, (int)sync);
	hpu_buffer_info *grown = realloc(b->buffers, (size_t)(b->nbuffers + 1) * sizeof *grown);
	if (!grown)
		return hpu__model_refuse(b, HPU_ENOMEM, "out of memory adding buffer %s", full);
	b->buffers = grown;
	hpu_buffer_info *bi = &b->buffers[b->nbuffers];
	memset(bi, 0, sizeof *bi);
	snprintf(bi->name, sizeof bi->name, "%s", full);
	bi->ndim = ndim;
	memcpy(bi->shape, shape, (size_t)ndim * sizeof *shape);
	bi->numel = numel;
	bi->offset = b->buffer_numel;
	bi->init = init;
	bi->sync = sync;
	bi->layer = l->index;
	b->buffer_numel += (numel + 15) & ~(size_t)15;
	b->nbuffers++;
	return l->nbuffers++;
}

int hpu_layer_memory(hpu_layer *l, size_t saved_ps, size_t saved_fixed, size_t scratch_ps,
		     size_t scratch_fixed)
{
	HPU__LAYER_DECL(l, "hpu_layer_memory");
	l->saved_ps = saved_ps;
	l->saved_fixed = saved_fixed;
	l->scratch_ps = scratch_ps;
	l->scratch_fixed = scratch_fixed;
	return HPU_OK;
}

int hpu_layer_checkpoint(hpu_layer *l, int on)
{
	HPU__LAYER_DECL(l, "hpu_layer_checkpoint");
	l->ckpt = on != 0;
	return HPU_OK;
}

int hpu_layer_params_in_ops(hpu_layer *l)
{
	HPU__LAYER_DECL(l, "hpu_layer_params_in_ops");
	l->params_in_ops = 1;
	return HPU_OK;
}

int hpu_layer_grads_in_ops(hpu_layer *l)
{
	HPU__LAYER_DECL(l, "hpu_layer_grads_in_ops");
	l->grads_in_ops = 1;
	return HPU_OK;
}


/* HPU_OK, or the refusal of `call` naming an input bit past the layer's. */
static int input_bits(hpu_layer *l, const char *call, unsigned inputs)
{
	if (inputs >> l->nin)
		return hpu__model_refuse(l->b, HPU_EINVAL, "layer %s: %s names input %d; the layer "
					 "has %d", l->name, call, hpu__model_high_bit(inputs), l->nin);
	return HPU_OK;
}

int hpu_layer_backward_reads(hpu_layer *l, unsigned inputs, unsigned outputs)
{
	HPU__LAYER_DECL(l, "hpu_layer_backward_reads");
	if (input_bits(l, "hpu_layer_backward_reads", inputs) != HPU_OK)
		return HPU_EINVAL;
	if (outputs >> HPU_MAX_IO)
		return hpu__model_refuse(l->b, HPU_EINVAL, "layer %s: hpu_layer_backward_reads names output %d; "
					 "a layer has at most %d", l->name, hpu__model_high_bit(outputs), HPU_MAX_IO);
	l->reads_in = inputs;
	l->reads_out = outputs;
	return HPU_OK;
}

int hpu_layer_backward_in_place(hpu_layer *l, unsigned inputs)
{
	HPU__LAYER_DECL(l, "hpu_layer_backward_in_place");
	if (input_bits(l, "hpu_layer_backward_in_place", inputs) != HPU_OK)
		return HPU_EINVAL;
	l->in_place = inputs;
	return HPU_OK;
}

int hpu_layer_backward_reads_linear(hpu_layer *l, unsigned inputs)
{
	HPU__LAYER_DECL(l, "hpu_layer_backward_reads_linear");
	if (input_bits(l, "hpu_layer_backward_reads_linear", inputs) != HPU_OK)
		return HPU_EINVAL;
	l->linear_in = inputs;
	return HPU_OK;
}

/* ---- inside forward/backward ---- */

/* Parameters, gradients, buffers, memory: refused during setup (and
 * NULL for the NULL a failed declaration returned: its error is the
 * builder's already). */
#define HPU__RUN_ONLY(l, call)                                  \
	do {                                                     \
		if (!(l))                                        \
			return NULL;                             \
		if ((l)->b->phase != HPU__PHASE_RUN) {           \
			hpu__model_wrong_phase((l)->b, (l), (call));        \
			return NULL;                             \
		}                                                \
	} while (0)

/* Index k of the layer's npidx parameters (or nbuffers buffers), else
 * the layer's error naming the call and the index. */
static int check_index(hpu_layer *l, const char *call, int k, int n, const char *what)
{
	if (k >= 0 && k < n)
		return 1;
	snprintf(l->err, sizeof l->err, "%s(): layer %s has %d %s, asked for index %d", call,
		 l->name, n, what, k);
	return 0;
}

float *hpu_param(hpu_layer *l, int k)
{
	HPU__RUN_ONLY(l, "hpu_param");
	if (!check_index(l, "hpu_param", k, l->npidx, "parameters"))
		return NULL;
	const hpu_param_info *p = &l->b->params[l->pidx[k]];
	float *v = l->b->layers[p->layer]->pbase + p->rel;
	/* under mixed precision: the fp32 values, made now unless the layer
	 * leaves that to the ops */
	if (!l->params_in_ops)
		hpu__ac_param_f32(v, p->numel);
	return v;
}

float *hpu_grad(hpu_layer *l, int k)
{
	HPU__RUN_ONLY(l, "hpu_grad");
	if (!check_index(l, "hpu_grad", k, l->npidx, "parameters"))
		return NULL;
	const hpu_param_info *p = &l->b->params[l->pidx[k]];
	return l->b->layers[p->layer]->gbase + p->rel;
}

float *hpu_buffer(hpu_layer *l, int k)
{
	HPU__RUN_ONLY(l, "hpu_buffer");
	if (!check_index(l, "hpu_buffer", k, l->nbuffers, "buffers"))
		return NULL;
	const hpu_buffer_info *bi = &l->b->buffers[l->first_buffer + k];
	return l->bbase + (bi->offset - l->b->buffers[l->first_buffer].offset);
}

void *hpu_saved(hpu_layer *l)
{
	HPU__RUN_ONLY(l, "hpu_saved");
	return l->saved;
}

void *hpu_scratch(hpu_layer *l)
{
	HPU__RUN_ONLY(l, "hpu_scratch");
	return l->scratch;
}

/* NULL, a failed declaration's layer: nothing (the builder holds the
 * error), as the calls that declare take it */
void *hpu_layer_user(hpu_layer *l)
{
	return l ? l->user : NULL;
}

const char *hpu_layer_name(const hpu_layer *l)
{
	return l ? l->name : "(no layer: its declaration failed)";
}
