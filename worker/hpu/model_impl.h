/* model_impl: what the files of the model builder share (worker/hpu's
 * own; other folders read model.h). The builder is in six files whose
 * calls run one way:
 *   model.c         loading a model, setup and its checks, destroying
 *   model_params.c  a layer's parameters, buffers and memory: declared
 *                   during setup, reached inside forward/backward; calls
 *   model_graph.c   tensors, datasets, layers and their outputs, losses,
 *                   metrics, hooks; which calls, as model.c does,
 *   model_base.c    errors and phases, names, lookups, the accessors
 *   model_init.c    initial values and --load-params (calls none of them)
 */
#ifndef HPU_MODEL_IMPL_H
#define HPU_MODEL_IMPL_H

#include "worker/hpu/model.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* model_base.c */

/* Records a builder error with its code. During setup errors are sticky:
 * the first one stays (its message and code), later ones are dropped. */
void hpu__model_record(hpu_builder *b, hpu_err code, const char *fmt, va_list ap);

/* Records the error as hpu_error() does (sticky during setup); returns
 * `code`. */
int hpu__model_refuse(hpu_builder *b, hpu_err code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A public call made in the wrong phase: records "CALL() called PHASE:
 * WHY" as the builder's error and, when there is one, the layer's.
 * Returns HPU_EINVAL. */
int hpu__model_wrong_phase(hpu_builder *b, hpu_layer *l, const char *call);

/* Whether name is not a good name for a layer, tensor, field, parameter
 * or buffer (1 to 63 bytes of letters, digits, '_', '-', '/', '.'). */
int hpu__model_bad_name(const char *name);

/* The most elements one tensor or parameter may have: 2^40 (4 TiB of
 * fp32), so that its bytes and a batch of it cannot wrap a size_t. */
#define HPU__MAX_NUMEL ((size_t)1 << 40)

/* The element count of a shape (ndim dims, each > 0, at most
 * HPU__MAX_NUMEL elements in all); 0 when bad, with why ("has ...",
 * "needs ..."). ndim 0 is one element when `scalar`. */
size_t hpu__model_shape_numel(int ndim, const int64_t *shape, int scalar, char *why, size_t whylen);

/* The highest bit set in v (v != 0). */
int hpu__model_high_bit(unsigned v);

/* Declarations: refused after setup, and no-ops once a declaration
 * failed (sticky errors: `fail` returned, nothing recorded). */
#define HPU__SETUP_ONLY(b, l, call, fail)                         \
	do {                                                      \
		if ((b)->phase != HPU__PHASE_SETUP) {             \
			hpu__model_wrong_phase((b), (l), (call)); \
			return (fail);                            \
		}                                                 \
		if ((b)->status != HPU_OK)                        \
			return (fail);                            \
	} while (0)

/* A declaration on a layer. A NULL layer is a failed declaration's (the
 * builder holds its error): HPU_EINVAL, nothing recorded. */
#define HPU__LAYER_DECL(l, call)                                \
	do {                                                     \
		if (!(l))                                        \
			return HPU_EINVAL;                       \
		HPU__SETUP_ONLY((l)->b, (l), (call), (l)->b->status ? (l)->b->status : HPU_EINVAL); \
	} while (0)

/* model_graph.c */

/* HPU_OK when l is the last layer declared, else the error that `what`
 * must be declared right after the layer. */
int hpu__model_check_last(hpu_layer *l, const char *what);

#endif
