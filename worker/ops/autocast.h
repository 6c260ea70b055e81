/* autocast: the runtime's side of the autocast policy (include/hpu/ops.h
 * has the public half: the description and hpu_autocast_lowered). Each
 * public op calls hpu__ac_enter once; when it returns a low-precision
 * type the op rounds its inputs into scratch with hpu__ac_round, runs
 * its fp32 kernel (fp32 accumulation) and rounds its overwritten outputs
 * with hpu__ac_round_inplace. */
#ifndef HPU_AUTOCAST_INTERNAL_H
#define HPU_AUTOCAST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hpu/ops.h"

/* The runtime's controls of the policy (include/hpu/ops.h describes it
 * for model authors; only the runtime sets it). */
enum {
	HPU_AUTOCAST_NONE = 0, /* fp32: no op is lowered */
	HPU_AUTOCAST_BF16 = 1,
	HPU_AUTOCAST_FP16 = 2,
	/* --precision fp8: linear in fp8 (E4M3 forward, E5M2 backward,
	 * delayed scaling, bf16 outputs), the other lowered ops in bf16 */
	HPU_AUTOCAST_FP8 = 3,
};

/* hpu__autocast_count's `low` for the calls that ran in fp8. */
#define HPU_AUTOCAST_COUNT_FP8 2

/* Sets the policy: low type `lowp`, the default lower list (linear,
 * matmul, bmm, conv2d, attention), then the ops named in the files of the
 * LOWER_LIST / PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST and FP32_LIST /
 * PT_HPU_AUTOCAST_FP32_OPS_LIST environment variables moved into the lower
 * / fp32 list (one name a line; blank lines and '#' comments allowed). A
 * name is one of ours or PyTorch's for one of ours ("addmm", "layer_norm",
 * "aten::bmm.out"); a name that means no op here is ignored and named in
 * hpu__autocast_warnings(). On an unreadable file or an op in both lists,
 * returns HPU_ERROR with a message naming the file (and line) in err, and
 * leaves the policy as it was; HPU_OK otherwise. */
int hpu__autocast_init(int lowp, char *err, size_t errlen);

/* What the last hpu__autocast_init ignored: a line per list file naming
 * the names that mean no op here; "" when there were none. */
const char *hpu__autocast_warnings(void);

/* Prints the policy in force (low type, both lists, the files) to f. */
void hpu__autocast_print(FILE *f);

/* How many calls of the named op (forward and backward functions alike)
 * ran in fp32 (low == 0), in bf16/fp16 (low == 1) or in fp8 (low ==
 * HPU_AUTOCAST_COUNT_FP8) in this process; 0 for an unknown name. */
uint64_t hpu__autocast_count(const char *op, int low);

/* The number of ops, and the name of op i (0 <= i < count), NULL outside. */
int hpu__autocast_ops(void);
const char *hpu__autocast_op_name(int op);


/* fp8's modes and recipe (see fp8.h): defined here because the policy
 * keeps the ones in force, for hpu__ac_enter and hpu__autocast_print. */
typedef enum hpu_fp8_mode {
	HPU_FP8_OFF = 0,
	HPU_FP8_TRAIN,
	HPU_FP8_MEASURE,
	HPU_FP8_QUANTIZE,
} hpu_fp8_mode;

enum { HPU_FP8_AMAX_MAX = 0, HPU_FP8_AMAX_MOST_RECENT = 1 };

typedef struct hpu_fp8_recipe {
	int history; /* amax history length, >= 1 */
	int margin;  /* scale divided by 2^margin */
	int algo;    /* HPU_FP8_AMAX_MAX or _MOST_RECENT */
} hpu_fp8_recipe;

/* The fp8 mode and recipe in force: hpu__fp8_set_mode sets them (fp8.c
 * stands above autocast.c; autocast calls nothing of fp8); a copy of
 * *recipe is kept. Initially HPU_FP8_OFF and 16, 0, max. */
void hpu__ac_set_fp8(hpu_fp8_mode mode, const hpu_fp8_recipe *recipe);
hpu_fp8_mode hpu__ac_fp8_mode(void);
const hpu_fp8_recipe *hpu__ac_fp8_recipe(void);

/* The ops, in the order of their names in autocast.c. */
typedef enum hpu__op {
	HPU_OP_LINEAR = 0,
	HPU_OP_MATMUL,
	HPU_OP_BMM,
	HPU_OP_CONV2D,
	HPU_OP_MAXPOOL2D,
	HPU_OP_AVGPOOL2D,
	HPU_OP_RELU,
	HPU_OP_GELU,
	HPU_OP_TANH,
	HPU_OP_SOFTMAX,
	HPU_OP_SOFTMAX_XENT,
	HPU_OP_LAYERNORM,
	HPU_OP_EMBEDDING,
	HPU_OP_DROPOUT,
	HPU_OP_ATTENTION,
	HPU_OP_COUNT
} hpu__op;

/* Counts one call of op and returns the low type it runs in:
 * HPU_AUTOCAST_NONE (fp32), HPU_AUTOCAST_BF16, HPU_AUTOCAST_FP16 or
 * HPU_AUTOCAST_FP8 (fp8 training's linear; fp8 inference's quantized ops:
 * see fp8.h, which may move the call to another type). */
int hpu__ac_enter(hpu__op op);

/* The type op runs in when fp8 does not apply to a call: the lists'
 * type, bf16 for fp8 training's linear. */
int hpu__ac_fallback(hpu__op op);

/* Moves one counted call of op from low type `from` to `to`. */
void hpu__ac_recount(hpu__op op, int from, int to);

/* Every op's counted calls, [op][0: fp32, 1: bf16/fp16, 2: fp8]. A
 * recorded step (--graphs) runs no host code when it is replayed, so the
 * recording takes back what its host code counted
 * (hpu__ac_calls_take_since: d = the counts now - then, and the counts
 * are then's again) and each replay counts it (hpu__ac_calls_add), as
 * the eager step it stands for does (worker/runtime/graphs.c). */
typedef struct hpu__ac_calls {
	uint64_t n[HPU_OP_COUNT][3];
} hpu__ac_calls;
void hpu__ac_calls_get(hpu__ac_calls *now);
void hpu__ac_calls_take_since(const hpu__ac_calls *then, hpu__ac_calls *d);
void hpu__ac_calls_add(const hpu__ac_calls *d);

/* A copy of x[n] rounded to lowp (round to nearest even; bf16 for
 * HPU_AUTOCAST_FP8), in scratch
 * buffer `slot` (0..HPU__AC_SLOTS-1; valid until the slot is used again).
 * NULL when x is NULL. Aborts when out of memory (ops cannot fail). */
#define HPU__AC_SLOTS 8
const float *hpu__ac_round(int slot, const float *x, size_t n, int lowp);

/* Scratch buffer `slot` of at least n floats, uninitialized. */
float *hpu__ac_scratch(int slot, size_t n);

/* Where the scratch buffers above (and hpu__ac_bf16's) live: the C heap,
 * unless a device whose memory the CPU cannot use sets its allocator (a
 * GPU's) before ops run; NULL, NULL: the heap again. The buffers made so
 * far are released. `release` may be called while kernels queued earlier
 * still read the buffer: a device's must wait for them, or be ordered
 * after them on its stream. Not thread-safe. */
void hpu__ac_set_scratch_allocator(void *(*alloc)(size_t bytes), void (*release)(void *p));

/* `bytes` of memory from that allocator (the device's where one is set,
 * else the C heap), uninitialized, for state the ops keep across calls
 * (fp8's scaling): NULL when out of memory. *release is set to what gives
 * it back (the allocator may change later: keep it with the memory). */
void *hpu__ac_alloc(size_t bytes, void (**release)(void *p));

/* A bf16 copy of x[n] (round to nearest even) in uint16 scratch buffer
 * `slot` (0..HPU__AC_SLOTS-1, separate from the float slots; valid until
 * the slot is used again). NULL when x is NULL. Aborts when out of memory. */
const uint16_t *hpu__ac_bf16(int slot, const float *x, size_t n);

/* Activations the runtime holds in fp32 and in bf16 at once: f[0..n) are
 * the exact fp32 values of h[0..n) (expanded from it). hpu__ac_bf16 of
 * data within f then returns h itself instead of converting again. Until
 * hpu__ac_twin_remove(f), which the runtime calls before f is freed or
 * written. Returns 0, or -1 when out of memory (then nothing is
 * registered and the ops convert as before). Host memory only (a device
 * whose memory the host reads); training thread only. */
int hpu__ac_twin_add(const float *f, const uint16_t *h, size_t n);
void hpu__ac_twin_remove(const float *f);

/* Gradients owed zeros: g[0..len) is a parameter's gradient (with its
 * padding) that nothing has written yet, left unzeroed by the runtime
 * for a layer that hands its gradients only to the ops
 * (hpu_layer_grads_in_ops). An op about to accumulate into g[0..n)
 * claims it first: 1 when it was owed zeros (g[n..len) are zeroed now,
 * g[0..n) are the op's to overwrite, or to zero before it accumulates),
 * else 0 (accumulate as ever). hpu__ac_fresh_flush zeroes what nobody
 * claimed in base[0..len) when the layer's backward is over;
 * hpu__ac_fresh_forget drops the owed zeros in base[0..len) unzeroed
 * (memory about to be freed). Returns of _add: 0, or -1 when out of
 * memory (nothing registered: zero g as ever). Training thread only.
 * Every zero these make (and the op's, hpu__ac_zero) is the kernel
 * table's zero entry, where it has one (else the host's memset: a table
 * over memory the host may not touch refuses, hpu__be_refused), so that
 * a recorded step keeps them: the runtime registers owed zeros only
 * where such zeros reach the memory (worker/device: hpu__dev_ops_fill). */
int hpu__ac_fresh_add(float *g, size_t len);
int hpu__ac_fresh_claim(float *g, size_t n);
void hpu__ac_fresh_flush(float *base, size_t len);
void hpu__ac_fresh_forget(const float *base, size_t len);

/* Owed zeros whose bf16 rounding the runtime wants at g16[0..len) (the
 * 16-bit gradients, when nothing is to be added to them: bf16-mixed's
 * first micro-step), as hpu__ac_fresh_add. A bf16 product about to write
 * g[0..n) may claim it with hpu__ac_fresh_claim16 instead: it gets g16
 * (g16[n..len) zeroed now) and writes the bf16 rounding of its fp32 sums
 * there itself, leaving g unwritten; NULL when g is not owed zeros with a
 * 16-bit place (claim it with hpu__ac_fresh_claim as ever). Another op
 * that then claims g accumulates as ever, onto g[0..len) = the fp32
 * values of g16 (claim returns 0; the sum is then rounded twice).
 * hpu__ac_fresh_taken16(g): 1 when g was claimed by claim16 and is in
 * g16 alone (the record is dropped; the runtime converts nothing of it),
 * else 0. _flush leaves such claims alone; _forget drops them. */
int hpu__ac_fresh_add16(float *g, size_t len, uint16_t *g16);
uint16_t *hpu__ac_fresh_claim16(float *g, size_t n);
int hpu__ac_fresh_taken16(const float *g);

/* p[0..bytes) = 0 through the kernel table's zero entry, else memset
 * (hpu__be_refused where the table is not the host's): an op's zeros
 * on gradients it claimed owed zeros (hpu__ac_fresh_claim). */
void hpu__ac_zero(void *p, size_t bytes);

/* The bf16 form of parameter data w[n] for a bf16 product: the runtime's
 * bf16 working copy when w lies in one (hpu__ac_param16_add), else a copy
 * made into uint16 slot `slot`. NULL when w is NULL. */
const uint16_t *hpu__ac_weight_bf16(int slot, const float *w, size_t n);

/* Parameter data w[n] rounded to lowp for an fp32 product: w itself (its
 * fp32 values made) when it lies in a 16-bit working copy of that type
 * (the values are exact already), else hpu__ac_round(slot, w, n, lowp). */
const float *hpu__ac_weight_round(int slot, const float *w, size_t n, int lowp);

/* The runtime's 16-bit working copies of parameters under mixed
 * precision. base[0..len) are to hold the fp32 values of p16[0..len)
 * (bf16, or fp16 when fp16): when `ready` they do already, else they are
 * made on demand, by hpu__ac_param_f32() (hpu_param() of a layer, and the
 * ops that read a weight in fp32), so a bf16 product reads p16 and no fp32
 * copy of its weight is ever made. Until hpu__ac_param16_remove(base).
 * Returns 0, or -1 when out of memory. Training thread only. */
int hpu__ac_param16_add(float *base, const uint16_t *p16, size_t len, int fp16, int ready);
/* The fp32 values are made (and known made) in chunks of this many; a
 * call makes each run of chunks not made yet with one widening. */
#define HPU__AC_P16_CHUNK 1024
void hpu__ac_param16_remove(const float *base);

/* Makes the fp32 values of w[0..n) where it lies in a registered working
 * copy and they are not made yet; returns w. */
const float *hpu__ac_param_f32(const float *w, size_t n);

/* dst[n] = the fp32 values of 16-bit src[n]: fp16 when `fp16`, else bf16
 * (exact; F16C where the CPU has it). */
void hpu__ac_from16(int fp16, float *dst, const uint16_t *src, size_t n);

/* x[n] = round(x) to lowp, in place. HPU_AUTOCAST_FP8 rounds to bf16
 * (fp8 ops' outputs are bf16). */
void hpu__ac_round_inplace(float *x, size_t n, int lowp);

#endif
