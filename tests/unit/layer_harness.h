/* layer_harness: runs library layers (<hpu/layers.h>) or custom ones
 * in-process, without the training runtime: a builder from
 * hpu__model_new(), a dataset whose fields are the layers' inputs, the
 * layers declared with the library functions, then memory for every
 * layer's parameters, gradients, buffers, saved and scratch memory, and
 * forward / backward calls on caller-given data. No loss is needed:
 * hpu__model_setup() is never called, so tensors' `grad` flags and
 * layers' `backward` flags are not planned; the caller decides what to
 * run.
 *
 * Also: a finite-difference gradient checker and a reader for the
 * PyTorch reference files that tests/fixtures/torch_layers_*.py write.
 *
 * Typical use:
 *
 *	lh_harness *h = lh_new(4);
 *	hpu_field f = {"x", HPU_F32, 1, {8}};
 *	lh_dataset(h, 1, &f, NULL, 0);
 *	hpu_layer *l = hpu_linear(lh_builder(h), "fc", "x", "y", (hpu_linear_opts){.out = 3, .bias = true});
 *	lh_alloc(h, 1234);
 *	hpu_ctx c = lh_ctx(h, l, 1, 0, 4);
 *	void *in[] = {x}, *out[] = {y};
 *	lh_forward(h, l, &c, in, out);
 *	lh_gradcheck(h, l, 4, NULL, NULL, msg, sizeof msg);
 *	lh_free(&h);
 */
#ifndef HPU_LAYER_HARNESS_H
#define HPU_LAYER_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <hpu/hpu.h>

#include "worker/hpu/model.h" /* worker/hpu: hpu_builder, hpu_layer internals */

typedef struct lh_harness lh_harness;

/* A builder (rank 0 of 1) whose hpu_max_batch() is max_batch, and the
 * harness around it. NULL when out of memory. */
lh_harness *lh_new(int max_batch);

/* Frees the memory of lh_alloc, destroys the builder (each layer's
 * ops.destroy runs) and sets *h to NULL; safe on NULL. */
void lh_free(lh_harness **h);

/* The builder, to declare layers on (hpu_linear(lh_builder(h), ...)). */
hpu_builder *lh_builder(lh_harness *h);

/* The builder's error (hpu_error, a failed declaration: the first one,
 * errors being sticky), "" if none; lh_clear_error() empties it and lets
 * declarations run again (before a declaration that should fail, to see
 * that it set one). */
const char *lh_error(lh_harness *h);
void lh_clear_error(lh_harness *h);

/* Declares the training dataset: `nfields` fields (each a tensor the
 * layers can read) and `size` samples. data[f] (may be NULL, then zeros
 * are fetched) holds size * sample_numel values of field f; the harness
 * copies them, and its fetch copies sample i out of them (it is never
 * called by the harness itself: lh_fetch calls it, as the runtime's
 * loader would). Call before declaring layers. Returns HPU_OK or the
 * builder's error code (lh_error says why). */
int lh_dataset(lh_harness *h, int nfields, const hpu_field *fields,
	       const void *const *data, size_t size);

/* Fetches sample `index` through the dataset's fetch into out[f] (one
 * pointer per field). Returns fetch's return value. */
int lh_fetch(lh_harness *h, size_t index, void *const *out);

/* After every layer is declared: allocates and sets each layer's pbase,
 * gbase (zeroed), bbase, saved and scratch (sized for max_batch), and
 * initializes parameters (hpu__model_init_layer with `seed`) and buffers
 * (hpu__model_init_buffers). Saved and scratch memory are filled with a
 * NaN pattern, so a layer that reads what it did not write shows it. May
 * be called again (after more declarations, or to reinitialize): the old
 * memory is freed. Returns 0, or -1 with lh_error set. */
int lh_alloc(lh_harness *h, uint64_t seed);

/* The layer named `name`, or NULL. */
hpu_layer *lh_layer(lh_harness *h, const char *name);

/* A run context for `l`: train flag, step, batch; layer = l->index,
 * seed = the seed given to lh_alloc, samples = 0, 1, ... (or what
 * lh_set_samples gave), rank 0 of world 1, micro 0 of accum 1, epoch 0,
 * recompute 0. */
hpu_ctx lh_ctx(lh_harness *h, const hpu_layer *l, int train, long step, int batch);

/* Sets the dataset indices lh_ctx puts in ctx.samples (n <= max_batch;
 * copied). */
void lh_set_samples(lh_harness *h, const uint32_t *samples, int n);

/* The tensor `name` of the graph as a layer sees it: batch rows of data
 * (data may be NULL). Fails the process (abort with a message) on an
 * unknown name: a test bug. */
hpu_tensor lh_tensor(lh_harness *h, const char *name, int batch, void *data);

/* The per-sample element count of tensor `name` (aborts if unknown). */
size_t lh_numel(lh_harness *h, const char *name);

/* Calls l's forward with c->batch rows: in[k] is the data of its k-th
 * input, out[k] of its k-th output (as declared). Returns forward's
 * return value; on failure lh_layer_error() has the message. */
int lh_forward(lh_harness *h, hpu_layer *l, const hpu_ctx *c, void *const *in,
	       void *const *out);

/* Calls l's backward with c->batch rows: in and out as the forward had
 * them (data NULL where the layer's backward does not read them,
 * hpu_layer_backward_reads, as in the runtime), dout[k] = dL/dout[k] (never NULL), din[k] = where dL/din[k] goes
 * (NULL: not wanted). Parameter gradients accumulate in the harness's
 * gradient memory (lh_zero_grads clears it). Returns backward's return
 * value; -1 with a message in lh_layer_error if l has no backward. */
int lh_backward(lh_harness *h, hpu_layer *l, const hpu_ctx *c, void *const *in,
		void *const *out, void *const *dout, void *const *din);

/* The message of l's last hpu_layer_error(), "" if none. */
const char *lh_layer_error(const hpu_layer *l);

/* Zeroes every layer's parameter gradients. */
void lh_zero_grads(lh_harness *h);

/* Options of lh_gradcheck; a zero field takes the default. */
typedef struct lh_check_opts {
	double eps;      /* finite-difference step (default 1e-2) */
	double rtol;     /* allowed |analytic - numeric| relative to the
			  * largest |numeric| of the tensor (default 1e-2) */
	double atol;     /* plus this absolute slack (default 1e-4) */
	float lo, hi;    /* random f32 inputs uniform in [lo, hi)
			  * (default -1, 1) */
	int train;       /* ctx.train (default 0: only an explicit 1 trains;
			  * dropout needs it) */
	long step;       /* ctx.step */
	int skip_params; /* check only the input gradients */
	int verbose;     /* print each tensor's largest differences */
} lh_check_opts;

/* Checks l's backward against central finite differences of its forward
 * over batch rows. The objective is L = sum_k sum(out[k] * R[k]) over
 * l's f32 outputs, R random in [-1, 1), accumulated in double; the
 * analytic gradients are din[k] for every f32 input and hpu_grad(l, i)
 * for every parameter l uses (shared ones included), the numeric ones
 * (L(v + eps) - L(v - eps)) / (2 eps) per element v. in[k] (in may be
 * NULL, and in[k] NULL) gives input k's data, else f32 inputs are random
 * (opts) and i32 inputs an error (labels must be given). Also checks the
 * backward contract: din is overwritten (pre-filled with garbage) and
 * parameter gradients accumulate (a second backward doubles them) while
 * din stays the same. Returns 0 when everything agrees, else -1 with the
 * worst mismatch in msg. */
int lh_gradcheck(lh_harness *h, hpu_layer *l, int batch, void *const *in,
		 const lh_check_opts *opts, char *msg, size_t msglen);

/* The largest |got - want| over n, relative to max(max |want|, floor);
 * NaN in got counts as infinitely far. */
double lh_maxrel(const float *got, const float *want, size_t n, double floor);

/* Uniform fill of a[n] in [lo, hi) from a private xorshift generator
 * seeded by *state (advanced). */
void lh_fill(float *a, size_t n, float lo, float hi, uint64_t *state);

/* ---- PyTorch reference files ----
 *
 * A file of named arrays, little-endian:
 *	"HPUREF1\0"                 8 bytes
 *	u32 count                   arrays in the file
 *	count times:
 *		char name[32]       NUL-padded
 *		u32 dtype           0 f32, 1 i32
 *		u32 ndim            0..4 (0: one value)
 *		u32 shape[4]        unused dims 0
 *		values              prod(shape) of 4 bytes each
 */
typedef struct lh_ref lh_ref;

/* Reads the file at `path`; NULL (with a sentence on stderr) when it is
 * missing or malformed. */
lh_ref *lh_ref_load(const char *path);
void lh_ref_free(lh_ref **r);

/* The array `name`: its values (f32 or i32 per its dtype, which must be
 * `dtype`), *numel set when numel is not NULL, and its shape into
 * shape[4] / *ndim when those are not NULL. NULL when there is no such
 * array or its dtype differs. */
const void *lh_ref_get(const lh_ref *r, const char *name, hpu_dtype dtype, size_t *numel,
		       int *ndim, int64_t *shape);

/* An i32 array of one value (a size or an option), or `def` when absent. */
int32_t lh_ref_int(const lh_ref *r, const char *name, int32_t def);

#endif
