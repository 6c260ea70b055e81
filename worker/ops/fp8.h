/* fp8: the two 8-bit float formats, per-tensor scaling, and the op
 * instances that fp8 training and fp8 inference keep state for.
 *
 * Formats (OCP 8-bit floating point, as Gaudi2, H100 and Transformer
 * Engine use them):
 *   E4M3: 4 exponent bits (bias 7), 3 mantissa bits; max 448, smallest
 *         normal 2^-6, smallest subnormal 2^-9; no infinity.
 *   E5M2: 5 exponent bits (bias 15), 2 mantissa bits; max 57344, smallest
 *         normal 2^-14, smallest subnormal 2^-16; IEEE-like infinities.
 * Conversions round to nearest even and saturate finite values to +-max
 * (Transformer Engine's "satfinite"); NaN stays NaN.
 *
 * Scaling: a tensor x is stored as fp8(x * s) and read back as that / s.
 * Our scales are powers of two, 2^(floor(log2(max / amax)) - margin), as
 * Gaudi's hardware scaling is: reading back is then exact, so computing on
 * the read-back values in fp32 gives what an fp8 GEMM with fp32
 * accumulation gives. This is emulation: no fp8 arithmetic unit is used.
 *
 * Op instances: one op call site of one layer, named
 * "<layer>/<op>#<k>" (the k-th call of that op in the layer's forward).
 * The runtime says which layer runs (hpu__op_layer) so that the ops can
 * find their instance. Three uses:
 *   TRAIN    (--precision fp8): linear runs E4M3 x E4M3 forward and E5M2
 *            gradients backward, with delayed scaling: each tensor's scale
 *            comes from the amax history of earlier steps (max or most
 *            recent of the last `history` steps, minus `margin` powers of
 *            two); outputs are rounded to bf16. A new instance's first
 *            scale comes from its first tensor.
 *   MEASURE  (QUANT_CONFIG, mode MEASURE): linear, conv2d, matmul and bmm
 *            run unchanged; each instance records the max |x| of its two
 *            inputs and its output while measuring is on.
 *   QUANTIZE (QUANT_CONFIG, mode QUANTIZE): those ops run with both
 *            inputs in E4M3 at the scales of the loaded max-abs figures,
 *            outputs in bf16.
 */
#ifndef HPU_FP8_H
#define HPU_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "worker/ops/autocast.h"

enum { HPU_FP8_E4M3 = 0, HPU_FP8_E5M2 = 1 };

float hpu__fp8_max(int fmt);
uint8_t hpu__fp8_encode(float v, int fmt);
float hpu__fp8_decode(uint8_t b, int fmt);
/* y[i] = fp8(x[i] * scale) / scale; x and y may be the same. */
void hpu__fp8_fake_quant(const float *x, float *y, size_t n, float scale, int fmt);
/* max |x[i]| (NaN ignored); 0 for n == 0. */
float hpu__fp8_amax(const float *x, size_t n);
/* The power-of-two scale for amax: 2^(floor(log2(max / amax)) - margin),
 * or 0 when amax is 0, negative or not finite (no scale can be had). */
float hpu__fp8_scale_for(float amax, int fmt, int margin);

/* Sets the mode (recipe: TRAIN only; NULL for the defaults 16, 0, max) and
 * forgets every instance. The mode and recipe are kept by autocast
 * (hpu__ac_set_fp8), which fp8 stands on: autocast calls nothing of fp8. */
void hpu__fp8_set_mode(hpu_fp8_mode mode, const hpu_fp8_recipe *recipe);
hpu_fp8_mode hpu__fp8_mode(void);
const hpu_fp8_recipe *hpu__fp8_recipe(void);

/* The layer whose forward (backward = 0) or backward (1) runs now, index
 * -1 for none; resets the per-op call numbers. pbase[0..plen) are its
 * parameters: a linear's weight is found again in backward by its offset
 * there. */
void hpu__op_layer(int index, const char *name, const float *pbase, size_t plen,
		   int backward);

/* The name of the layer running now ("" for none), and whether it runs
 * its backward (cpu-strict's fault names them). */
const char *hpu__op_layer_name(void);
int hpu__op_layer_backward(void);
/* The layer the ops run for now (its index, -1: none) and whether in its
 * backward, read from any thread (--hang-warning's watch). */
int hpu__op_layer_now(int *backward);

/* MEASURE: records only while on (calibration batches). */
void hpu__fp8_measuring(int on);

/* QUANTIZE: the max-abs figures of instance `name` (inputs a, b; the
 * output), and whether it runs quantized (0: blocklisted). Call before the
 * first forward. Returns 0, or -1 when out of memory. */
int hpu__fp8_preload(const char *name, const float maxabs[3], int quantize);

/* The first error seen by an op (an instance missing from the loaded
 * figures), or NULL. */
const char *hpu__fp8_error(void);

typedef struct hpu_fp8_info {
	const char *name;
	int op;          /* hpu__op */
	float maxabs[3]; /* MEASURE: inputs a, b and the output */
	float scale[3];  /* TRAIN: x, w, dy; QUANTIZE: a, b */
	int used;        /* calls that ran in fp8 (TRAIN, QUANTIZE) or were
			  * measured (MEASURE) */
} hpu_fp8_info;

/* The instances, in the order they were first called. */
int hpu__fp8_count(void);
int hpu__fp8_info_get(int i, hpu_fp8_info *out);
/* MEASURE: instance i's figures replaced (after a reduction over ranks). */
void hpu__fp8_set_maxabs(int i, const float maxabs[3]);

/* TRAIN: this step's amax of x, w, dy for every instance, 3 floats each
 * (-1 where not seen), brought back from the device into host memory, to
 * be reduced with MAX over ranks in place (more than one rank); then
 * hpu__fp8_roll() (which first puts values so taken back on the device)
 * pushes them into the histories and sets the scales for the next step,
 * on the device. One rank needs only the roll: nothing comes back. */
float *hpu__fp8_step_amax(size_t *n);
void hpu__fp8_roll(void);

/* TRAIN's scaling state lives on the device (in the ops' scratch memory,
 * hpu__ac_alloc), in chunks of HPU_FP8_CHUNK instances that never move
 * once made (a recorded step holds their addresses), and only the
 * table's kernels touch it (backend.h: fp8_amax_scale, fp8_quant_at,
 * fp8_roll; fp8_state_copy for the host's reads): nothing comes back to
 * the host inside a step, so a step in fp8 records (--graphs). A chunk of
 * `cap` instances and `history` steps, in floats, made all zeros:
 *   step  [cap][3][2]  per tensor (x, w, dy): this step's amax so far,
 *                      and 1 once the tensor was seen this step
 *   scale [cap][3][2]  per tensor: the scale (0: none yet), and a
 *                      kernel's scratch
 *   hist  [cap][2 + 3 * history]  per instance: the history's slots
 *                      filled and its next slot, then the amax histories
 *                      of x, w and dy */
enum { HPU_FP8_CHUNK = 256 };
static inline size_t hpu__fp8_off_step(int i, int t)
{
	return ((size_t)i * 3 + (size_t)t) * 2;
}
static inline size_t hpu__fp8_off_scale(int cap, int i, int t)
{
	return (size_t)cap * 6 + ((size_t)i * 3 + (size_t)t) * 2;
}
static inline size_t hpu__fp8_off_hist(int cap, int history, int i)
{
	return (size_t)cap * 12 + (size_t)i * (2 + 3 * (size_t)history);
}
static inline size_t hpu__fp8_chunk_floats(int cap, int history)
{
	return hpu__fp8_off_hist(cap, history, cap);
}

/* TRAIN, checkpoints: an instance's delayed-scaling state. hist holds
 * 3 x history floats (x, w, dy), pos the next slot, nhist those filled. */
typedef struct hpu_fp8_saved {
	const char *name;
	int layer, op, k;
	float scale[3];
	const float *hist;
	int nhist, pos;
} hpu_fp8_saved;

/* Instance i's state (pointers into the instance); -1 if none. */
int hpu__fp8_saved_get(int i, hpu_fp8_saved *out);
/* Recreates an instance from a checkpoint (TRAIN, before the first
 * forward; in the saved order). Returns 0, or -1 when out of memory. */
int hpu__fp8_saved_put(const hpu_fp8_saved *in);

/* ---- for the ops ---- */

/* One op call's fp8 plan. */
typedef struct hpu__fp8_call {
	int on;            /* run in fp8: a and b are the read-back inputs */
	const float *a, *b;
	void *inst;
	const float *x, *w; /* TRAIN: the inputs, quantized when asked */
	size_t nx, nw;
} hpu__fp8_call;

/* The forward of linear/conv2d/matmul/bmm: a[na], b[nb] its two inputs
 * (x and the weight). TRAIN (linear) and QUANTIZE: when the call runs in
 * fp8, c->on = 1 and the op's autocast count moves to fp8; QUANTIZE's
 * c->a, c->b are then the quantized inputs in scratch slots 0 and 1,
 * TRAIN's are made by hpu__fp8_operands (or the product runs on fp8
 * arithmetic, hpu__fp8_forward_native). MEASURE: the inputs are
 * recorded. `lp` is what hpu__ac_enter returned; returns the type the
 * call runs in: HPU_AUTOCAST_FP8 when c->on, else lp, or
 * hpu__ac_fallback(op) where fp8 did not apply. */
int hpu__fp8_begin(hpu__fp8_call *c, hpu__op op, int lp, const float *a, size_t na,
		    const float *b, size_t nb);
/* After the forward: MEASURE records the output's max |y|. */
void hpu__fp8_end(hpu__fp8_call *c, const float *y, size_t ny);

/* TRAIN: c->a, c->b = the inputs quantized at their scales (E4M3, read
 * back: fp32 values exact in bf16) in scratch slots 0 and 1, for the
 * bf16 kernels; nothing where they are made already (QUANTIZE). */
void hpu__fp8_operands(hpu__fp8_call *c);

/* TRAIN, linear, on a table with fp8 products (backend.h gemm_fp8;
 * HPU_FP8_NATIVE not 0): y[batch, out] = x w^T (+ bias[out]) with x and
 * w as E4M3 bytes at their scales (scratch slots 4 and 5), summed in
 * fp32. 1 when done; 0, y untouched, where the table has none or declined
 * the case (the caller then takes hpu__fp8_operands). */
int hpu__fp8_forward_native(hpu__fp8_call *c, const float *bias, float *y, int batch, int in,
			    int out);

/* The backward of linear under TRAIN. */
typedef struct hpu__fp8_bwd {
	void *inst;
	int done, dx; /* hpu__fp8_bwd_native's answer; whether it had a dx */
} hpu__fp8_bwd;
/* Finds the forward's call site by w and records dy[ndy]'s amax: 1; 0
 * when the call cannot run in fp8 (no forward in fp8), its count then
 * moved to bf16. */
int hpu__fp8_bwd_begin(hpu__fp8_bwd *h, const float *w, const float *dy, size_t ndy);
/* On a table with fp8 products (as hpu__fp8_forward_native): dx[batch,
 * in] = dy w (unless dx is NULL) and dw[out, in] = dy^T x (+ dw unless
 * dw_fresh), dy E5M2, x and w E4M3 at the forward's scales (scratch slots
 * 4 to 7: dy, w transposed, dy transposed, x transposed). 2 when both
 * (or dw, dx being NULL) are done; 1 when dx alone (the table declined
 * dw: the caller makes it); 0 when neither. */
int hpu__fp8_bwd_native(hpu__fp8_bwd *h, const float *x, const float *w, const float *dy,
			float *dx, float *dw, int dw_fresh, int batch, int in, int out);
/* x, w (E4M3, the forward's scales) and dy (E5M2) read back into scratch
 * slots 0, 1, 2, for the bf16 kernels (the products hpu__fp8_bwd_native
 * left). */
void hpu__fp8_bwd_operands(const hpu__fp8_bwd *h, const float *x, size_t nx, const float *w,
			   size_t nw, const float *dy, size_t ndy, const float **xq,
			   const float **wq, const float **dyq);

/* TRAIN: the linear products this process ran on the table's fp8
 * arithmetic and on the bf16 kernels (forward 1, backward 2 or 1 each
 * call), as the ops ran: eager steps and recordings, not replays. A case
 * the table declined is not tried again at the same call site and rows. */
void hpu__fp8_products(uint64_t *fp8, uint64_t *bf16);

#endif
