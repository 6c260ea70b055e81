/* model_base: the builder's errors and phases (hpu_error, the sticky
 * errors of setup, a call in the wrong phase), the accessors of
 * <hpu/hpu.h>, names and the lookups of tensors, parameters, buffers. */
#include "worker/hpu/model.h"
#include "worker/hpu/model_impl.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Records a builder error with its code. During setup errors are sticky:
 * the first one stays (its message and code), later ones are dropped. */
void hpu__model_record(hpu_builder *b, hpu_err code, const char *fmt, va_list ap)
{
	if (b->phase == HPU__PHASE_SETUP) {
		if (b->status != HPU_OK)
			return;
		b->status = code;
	}
	vsnprintf(b->err, sizeof b->err, fmt, ap);
}

int (hpu_error)(hpu_builder *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (b) {
		hpu__model_record(b, HPU_ERROR, fmt, ap);
	} else { /* no builder to hold it (a library constructor's call):
		  * said, not lost */
		fputs("error: hpu_error() without a builder: ", stderr);
		vfprintf(stderr, fmt ? fmt : "(no message)", ap);
		fputc('\n', stderr);
	}
	va_end(ap);
	return HPU_ERROR;
}

int hpu_builder_status(const hpu_builder *b)
{
	return b ? b->status : HPU_EINVAL;
}

int hpu_layer_error(hpu_layer *l, const char *fmt, ...)
{
	if (!l) /* a failed declaration's NULL: the builder holds its error */
		return HPU_ERROR;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->err, sizeof l->err, fmt, ap);
	va_end(ap);
	return HPU_ERROR;
}

/* Records the error as hpu_error() does (sticky during setup); returns
 * `code`. */
__attribute__((format(printf, 3, 4)))
int hpu__model_refuse(hpu_builder *b, hpu_err code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	hpu__model_record(b, code, fmt, ap);
	va_end(ap);
	return code;
}

/* A public call made in the wrong phase: records "CALL() called PHASE:
 * WHY" as the builder's error and, when there is one, the layer's (the
 * message a failed forward/backward is reported with). Returns
 * HPU_EINVAL. */
int hpu__model_wrong_phase(hpu_builder *b, hpu_layer *l, const char *call)
{
	const char *why = b->phase == HPU__PHASE_SETUP
		? "called during setup, but a layer's parameters, gradients, buffers and "
		  "memory exist only once setup has returned (use them in its forward and backward)"
		: "called after setup (while the model runs), but declarations belong in setup";
	if (l)
		snprintf(l->err, sizeof l->err, "%s() %s", call, why);
	if (b->phase != HPU__PHASE_SETUP)
		b->late_calls++;
	return hpu__model_refuse(b, HPU_EINVAL, "%s%s%s%s() %s", l ? "layer " : "", l ? l->name : "",
				 l ? ": " : "", call, why);
}

int hpu_rank(const hpu_builder *b)
{
	return b->rank;
}

int hpu_world_size(const hpu_builder *b)
{
	return b->world;
}

void hpu_set_user(hpu_builder *b, void *user)
{
	b->user = user;
}

int hpu_max_batch(const hpu_builder *b)
{
	return b->max_batch;
}

/* ---- names and tensors ---- */

/* A name for a layer, tensor, field, parameter or buffer: 1 to 63 bytes
 * of letters, digits, '_', '-', '/' and '.' (not "," which separates
 * inputs). */
int hpu__model_bad_name(const char *name)
{
	if (!name || !*name || strlen(name) >= HPU_NAME_MAX)
		return 1;
	for (const char *c = name; *c; c++)
		if (!isalnum((unsigned char)*c) && !strchr("_-/.", *c))
			return 1;
	return 0;
}

int hpu__model_tensor(const hpu_builder *b, const char *name)
{
	for (int i = 0; i < b->ntensors; i++)
		if (!strcmp(b->tensors[i].name, name))
			return i;
	return -1;
}

int hpu__model_param(const hpu_builder *b, const char *name)
{
	for (int i = 0; i < b->nparams; i++)
		if (!strcmp(b->params[i].name, name))
			return i;
	return -1;
}

int hpu__model_buffer(const hpu_builder *b, const char *name)
{
	for (int i = 0; i < b->nbuffers; i++)
		if (!strcmp(b->buffers[i].name, name))
			return i;
	return -1;
}

size_t hpu__model_shape_numel(int ndim, const int64_t *shape, int scalar, char *why, size_t whylen)
{
	if (ndim < (scalar ? 0 : 1) || ndim > HPU_MAX_DIMS) {
		snprintf(why, whylen, "needs %d..%d dimensions, not %d", scalar ? 0 : 1, HPU_MAX_DIMS, ndim);
		return 0;
	}
	if (ndim && !shape) { /* it said "needs 1..4 dimensions, not 1" */
		snprintf(why, whylen, "has %d dimension%s and a NULL shape", ndim, ndim == 1 ? "" : "s");
		return 0;
	}
	size_t n = 1;
	for (int d = 0; d < ndim; d++) {
		if (shape[d] <= 0) {
			snprintf(why, whylen, "has dimension %d of size %lld: each must be > 0", d,
				 (long long)shape[d]);
			return 0;
		}
		/* the product past 2^40 elements (4 TiB of fp32): refused before
		 * it can wrap (a [2^16]x4 shape made 0, a tensor of nothing
		 * written as one of 2^64) */
		if ((size_t)shape[d] > HPU__MAX_NUMEL || n > HPU__MAX_NUMEL / (size_t)shape[d]) {
			snprintf(why, whylen, "has more than 2^40 elements (dimension %d is %lld): too large", d,
				 (long long)shape[d]);
			return 0;
		}
		n *= (size_t)shape[d];
	}
	return n;
}

/* The highest bit set in v (v != 0). */
int hpu__model_high_bit(unsigned v)
{
	int k = 0;
	while (v >>= 1)
		k++;
	return k;
}
