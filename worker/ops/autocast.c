/* autocast: which ops run in low precision, and how many calls did.
 *
 * The policy is process-wide: a low-precision type (none, bf16, fp16) set
 * by the runtime from --precision, and a lower list of ops that run in it;
 * every other op is in the fp32 list. The defaults lower the matrix
 * products and convolutions (linear, matmul, bmm, conv2d, attention), as
 * torch's and Habana's autocast do; the files named by LOWER_LIST and
 * FP32_LIST (one op name per line, '#' comments) move ops between them.
 *
 * The counters are relaxed atomics: ops run on the training thread only
 * (the loader thread calls none), so plain counters would do, but the
 * atomics cost little and keep a model that calls ops from its own
 * threads correct. The scratch buffers are process-wide for the same
 * reason the ops are single-threaded: one training thread uses them.
 */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/lowp.h"
#include "common/num.h"
#include "common/simd.h"

static const char *const op_names[HPU_OP_COUNT] = {
	"linear", "matmul", "bmm", "conv2d", "maxpool2d", "avgpool2d",
	"relu", "gelu", "tanh", "softmax", "softmax_xent", "layernorm",
	"embedding", "dropout", "attention",
};

static const hpu__op default_lower[] = {HPU_OP_LINEAR, HPU_OP_MATMUL, HPU_OP_BMM,
					HPU_OP_CONV2D, HPU_OP_ATTENTION};

static int lowp_in_force; /* HPU_AUTOCAST_NONE / _BF16 / _FP16 / _FP8 */
static hpu_fp8_mode fp8_mode; /* hpu__ac_set_fp8 */
static hpu_fp8_recipe fp8_recipe = {16, 0, HPU_FP8_AMAX_MAX};
static unsigned char lower[HPU_OP_COUNT]; /* 1: in the lower list */
/* [op][0]: fp32 calls, [1]: bf16/fp16, [2]: fp8 */
static _Atomic uint64_t counts[HPU_OP_COUNT][3];

static struct {
	float *p;
	size_t cap;
} scratch[HPU__AC_SLOTS];

static struct {
	uint16_t *p;
	size_t cap;
} scratch16[HPU__AC_SLOTS];

/* The runtime's 16-bit working copies of parameters and the fp32 copies
 * made from them on demand (hpu__ac_param16_add): a few live at a time
 * (the running layer's, a tied owner's, ZeRO-3's prefetched ones). */
#define P16_CHUNK HPU__AC_P16_CHUNK
typedef struct param16 {
	float *base;
	const uint16_t *p16;
	size_t len;
	int fp16;
	unsigned char *made; /* per chunk: base holds p16's values */
} param16;
static param16 *p16s;
static int np16, cap16;

/* hpu__ac_twin_add: fp32 activations and the bf16 values they hold. */
typedef struct twin {
	const float *f;
	const uint16_t *h;
	size_t n;
} twin;
static twin *twins;
static int ntwins, captwins;

/* hpu__ac_fresh_add: gradients owed zeros. */
typedef struct fresh {
	float *g;
	size_t len;
	uint16_t *g16; /* NULL, or the bf16 form's place (hpu__ac_fresh_add16) */
	int taken;     /* claimed by hpu__ac_fresh_claim16: written in g16 only */
} fresh;
static fresh *freshes;
static int nfresh, capfresh;

int hpu__autocast_ops(void)
{
	return HPU_OP_COUNT;
}

const char *hpu__autocast_op_name(int op)
{
	return op >= 0 && op < HPU_OP_COUNT ? op_names[op] : NULL;
}

static int op_index(const char *name)
{
	for (int i = 0; i < HPU_OP_COUNT; i++)
		if (strcmp(op_names[i], name) == 0)
			return i;
	return -1;
}

/* PyTorch's op names (aten, as Habana's and Optimum Habana's list files
 * write them) that are one of ours. */
static const struct {
	const char *torch;
	hpu__op op;
} torch_ops[] = {
	{"addmm", HPU_OP_LINEAR},
	{"mm", HPU_OP_LINEAR},
	{"addmv", HPU_OP_LINEAR},
	{"mv", HPU_OP_LINEAR},
	{"einsum", HPU_OP_MATMUL},
	{"chain_matmul", HPU_OP_MATMUL},
	{"linalg_multi_dot", HPU_OP_MATMUL},
	{"baddbmm", HPU_OP_BMM},
	{"addbmm", HPU_OP_BMM},
	{"convolution", HPU_OP_CONV2D},
	{"convolution_overrideable", HPU_OP_CONV2D},
	{"cudnn_convolution", HPU_OP_CONV2D},
	{"mkldnn_convolution", HPU_OP_CONV2D},
	{"max_pool2d", HPU_OP_MAXPOOL2D},
	{"max_pool2d_with_indices", HPU_OP_MAXPOOL2D},
	{"avg_pool2d", HPU_OP_AVGPOOL2D},
	{"cross_entropy", HPU_OP_SOFTMAX_XENT},
	{"cross_entropy_loss", HPU_OP_SOFTMAX_XENT},
	{"log_softmax", HPU_OP_SOFTMAX_XENT},
	{"nll_loss", HPU_OP_SOFTMAX_XENT},
	{"layer_norm", HPU_OP_LAYERNORM},
	{"native_layer_norm", HPU_OP_LAYERNORM},
	{"native_dropout", HPU_OP_DROPOUT},
	{"feature_dropout", HPU_OP_DROPOUT},
	{"scaled_dot_product_attention", HPU_OP_ATTENTION},
	{"multi_head_attention_forward", HPU_OP_ATTENTION},
};

/* The op a list file's name means: ours, or PyTorch's ("aten::addmm.out",
 * "_softmax", "relu_": namespace, overload, leading '_' and in-place '_'
 * dropped); -1 when it is neither. */
static int list_op(const char *name)
{
	char n[96];
	const char *s = strstr(name, "::") ? strstr(name, "::") + 2 : name;
	while (*s == '_')
		s++;
	size_t len = strcspn(s, ".");
	if (len >= sizeof n)
		return -1;
	memcpy(n, s, len);
	n[len] = '\0';
	while (len > 1 && n[len - 1] == '_')
		n[--len] = '\0';
	int op = op_index(n);
	for (size_t i = 0; op < 0 && i < sizeof torch_ops / sizeof *torch_ops; i++)
		if (!strcmp(n, torch_ops[i].torch))
			op = torch_ops[i].op;
	return op;
}

/* What the last hpu__autocast_init had to say: names that mean no op
 * here, a line per list file. */
static char warnings[2048];

const char *hpu__autocast_warnings(void)
{
	return warnings;
}

/* One of our names within a typo of name (case aside), for "did you
 * mean"; NULL if none. */
static const char *near_op(const char *name)
{
	for (int i = 0; i < HPU_OP_COUNT; i++) {
		size_t la = strlen(name), lb = strlen(op_names[i]);
		/* short names are all near each other: "silu" is not "relu" */
		if (hpu__edit_distance(name, op_names[i]) <= (la >= 8 && lb >= 8 ? 2u : 1u))
			return op_names[i];
	}
	return NULL;
}

/* "linear, matmul, ..." into buf */
static void all_names(char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < HPU_OP_COUNT && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", op_names[i]);
}

/* Where a list file names an op: its first line naming it (0: none) and
 * the name as the file spells it (PyTorch's names map onto ours). */
struct list_hit {
	int line;
	char name[129];
};

/* Reads the list file named by environment variable id (unset or empty:
 * none) into in[] (for each op it names, where); names that mean no op
 * here are named in one line of warnings[]. */
static int read_list(hpu_env_id id, struct list_hit *in, char *err, size_t errlen)
{
	char unknown[1024] = "";
	size_t nu = 0;
	int nunknown = 0;
	const char *var = hpu__env_name(id), *path = hpu__env_str(id), *why = NULL;
	if (path == NULL || *path == '\0')
		return 0;
	FILE *f = hpu__open_input(path, &why); /* a FIFO would block */
	if (f == NULL) {
		snprintf(err, errlen, "%s file %s: cannot read it: %s", var, path, why);
		return -1;
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	int no = 0, rc = 0;
	while ((n = getline(&line, &cap, f)) >= 0) {
		no++;
		if (memchr(line, '\0', (size_t)n)) {
			snprintf(err, errlen, "%s file %s line %d: a NUL byte: not a text file",
				 var, path, no);
			rc = -1;
			break;
		}
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		char *s = line, *e = line + strlen(line);
		while (*s && isspace((unsigned char)*s))
			s++;
		while (e > s && isspace((unsigned char)e[-1]))
			*--e = '\0';
		if (*s == '\0')
			continue;
		int op = list_op(s);
		if (op < 0) {
			const char *near = near_op(s);
			if (nu < sizeof unknown) {
				int k = snprintf(unknown + nu, sizeof unknown - nu, "%s'%.64s'%s%s%s",
						 nunknown ? ", " : "", s, near ? " (did you mean '" : "",
						 near ? near : "", near ? "'?)" : "");
				nu += k > 0 ? (size_t)k : 0;
			}
			nunknown++;
			continue;
		}
		if (in[op].line == 0) {
			in[op].line = no;
			snprintf(in[op].name, sizeof in[op].name, "%.128s", s);
		}
	}
	if (rc == 0 && ferror(f)) {
		snprintf(err, errlen, "%s file %s: cannot read it: %s", var, path,
			 strerror(errno));
		rc = -1;
	}
	free(line);
	fclose(f);
	if (rc == 0 && nunknown) {
		char names[256];
		size_t at = strlen(warnings);
		all_names(names, sizeof names);
		snprintf(warnings + at, sizeof warnings - at,
			 "%s file %s: %d name%s mean%s no op here and %s ignored: %s%s (ops: %s)\n",
			 var, path, nunknown, nunknown == 1 ? "" : "s", nunknown == 1 ? "s" : "",
			 nunknown == 1 ? "is" : "are", unknown, nu >= sizeof unknown ? "..." : "",
			 names);
	}
	return rc;
}

/* The error for op i in a lower-precision list and an fp32 list, naming
 * each file's line and, where it differs, its spelling: "mm" and "linear"
 * are two ops in PyTorch and one here. */
static void both_lists(int i, hpu_env_id lv, const struct list_hit *l, hpu_env_id fv,
		       const struct list_hit *f, char *err, size_t errlen)
{
	int l_as = strcmp(l->name, op_names[i]) != 0, f_as = strcmp(f->name, op_names[i]) != 0;
	char as[2 * sizeof l->name + 64] = "";
	if (l_as && f_as && strcmp(l->name, f->name) != 0)
		snprintf(as, sizeof as, "'%s' and '%s' are op '%s' here, and ", l->name, f->name,
			 op_names[i]);
	else if (l_as || f_as)
		snprintf(as, sizeof as, "'%s' is op '%s' here, and ", l_as ? l->name : f->name,
			 op_names[i]);
	snprintf(err, errlen,
		 "op '%s' is in both the %s file %s (line %d%s%s%s) and the %s file %s (line "
		 "%d%s%s%s): %san op runs in one precision; take it out of one list",
		 op_names[i], hpu__env_name(lv), hpu__env_str(lv), l->line, l_as ? ", as '" : "",
		 l_as ? l->name : "", l_as ? "'" : "", hpu__env_name(fv), hpu__env_str(fv), f->line,
		 f_as ? ", as '" : "", f_as ? f->name : "", f_as ? "'" : "", as);
}

int hpu__autocast_init(int lowp, char *err, size_t errlen)
{
	if (lowp < HPU_AUTOCAST_NONE || lowp > HPU_AUTOCAST_FP8) {
		snprintf(err, errlen, "autocast: unknown low-precision type %d", lowp);
		return HPU_ERROR;
	}
	/* Habana's older names and the ones Optimum Habana sets now: both
	 * are read */
	static const hpu_env_id low_vars[] = {HPU_ENV_LOWER_LIST,
					      HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST};
	static const hpu_env_id fp32_vars[] = {HPU_ENV_FP32_LIST,
					       HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST};
	static struct list_hit to_low[2][HPU_OP_COUNT], to_fp32[2][HPU_OP_COUNT];
	memset(to_low, 0, sizeof to_low);
	memset(to_fp32, 0, sizeof to_fp32);
	warnings[0] = '\0';
	for (int v = 0; v < 2; v++)
		if (read_list(low_vars[v], to_low[v], err, errlen) < 0 ||
		    read_list(fp32_vars[v], to_fp32[v], err, errlen) < 0)
			return HPU_ERROR;
	for (int i = 0; i < HPU_OP_COUNT; i++)
		for (int a = 0; a < 2; a++)
			for (int b = 0; b < 2; b++)
				if (to_low[a][i].line && to_fp32[b][i].line) {
					both_lists(i, low_vars[a], &to_low[a][i], fp32_vars[b],
						   &to_fp32[b][i], err, errlen);
					return HPU_ERROR;
				}
	memset(lower, 0, sizeof lower);
	for (size_t i = 0; i < sizeof default_lower / sizeof *default_lower; i++)
		lower[default_lower[i]] = 1;
	for (int i = 0; i < HPU_OP_COUNT; i++) {
		if (to_low[0][i].line || to_low[1][i].line)
			lower[i] = 1;
		if (to_fp32[0][i].line || to_fp32[1][i].line)
			lower[i] = 0;
	}
	lowp_in_force = lowp;
	return HPU_OK;
}

static const char *lowp_name(int lowp)
{
	return lowp == HPU_AUTOCAST_BF16   ? "bf16"
	       : lowp == HPU_AUTOCAST_FP16 ? "fp16"
	       : lowp == HPU_AUTOCAST_FP8  ? "fp8 (linear) and bf16 (the other lowered ops)"
					   : "none";
}

/* The index into counts[op] of a low type. */
static int slot_of(int lp)
{
	return lp == HPU_AUTOCAST_NONE ? 0 : lp == HPU_AUTOCAST_FP8 ? 2 : 1;
}

/* The ops fp8 inference quantizes. */
static int quantizable(hpu__op op)
{
	return op == HPU_OP_LINEAR || op == HPU_OP_CONV2D || op == HPU_OP_MATMUL ||
	       op == HPU_OP_BMM;
}

void hpu__autocast_print(FILE *f)
{
	fprintf(f, "autocast: low precision %s%s\n", lowp_name(lowp_in_force),
		lowp_in_force ? "" : " (every op runs in fp32)");
	for (int l = 1; l >= 0; l--) {
		fprintf(f, "autocast: %s list:", l ? "lower" : "fp32");
		for (int i = 0; i < HPU_OP_COUNT; i++)
			if (lower[i] == l)
				fprintf(f, " %s", op_names[i]);
		fputc('\n', f);
	}
	static const hpu_env_id vars[] = {HPU_ENV_LOWER_LIST, HPU_ENV_FP32_LIST,
					  HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST,
					  HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST};
	fprintf(f, "autocast:");
	for (int i = 0; i < 4; i++) {
		const char *v = hpu__env_str(vars[i]);
		fprintf(f, "%s %s %s", i ? "," : "", hpu__env_name(vars[i]), v && *v ? v : "(unset)");
	}
	fputc('\n', f);
	if (lowp_in_force == HPU_AUTOCAST_FP8) {
		const hpu_fp8_recipe *r = hpu__ac_fp8_recipe();
		fprintf(f, "autocast: fp8 linear: E4M3 forward, E5M2 backward, bf16 outputs; "
			   "delayed scaling: amax history %d, %s, margin %d\n",
			r->history, r->algo == HPU_FP8_AMAX_MAX ? "max" : "most_recent", r->margin);
	}
}

int hpu_autocast_lowered(const char *op)
{
	int i = op_index(op);
	return i >= 0 && lowp_in_force != HPU_AUTOCAST_NONE && lower[i];
}

uint64_t hpu__autocast_count(const char *op, int low)
{
	int i = op_index(op);
	int k = low == HPU_AUTOCAST_COUNT_FP8 ? 2 : low ? 1 : 0;
	return i < 0 ? 0 : atomic_load_explicit(&counts[i][k], memory_order_relaxed);
}

void hpu__ac_set_fp8(hpu_fp8_mode mode, const hpu_fp8_recipe *recipe)
{
	fp8_mode = mode;
	fp8_recipe = *recipe;
}

hpu_fp8_mode hpu__ac_fp8_mode(void)
{
	return fp8_mode;
}

const hpu_fp8_recipe *hpu__ac_fp8_recipe(void)
{
	return &fp8_recipe;
}

int hpu__ac_fallback(hpu__op op)
{
	int lp = lower[op] ? lowp_in_force : HPU_AUTOCAST_NONE;
	return lp == HPU_AUTOCAST_FP8 ? HPU_AUTOCAST_BF16 : lp;
}

int hpu__ac_enter(hpu__op op)
{
	int lp = lower[op] ? lowp_in_force : HPU_AUTOCAST_NONE;
	if (lp == HPU_AUTOCAST_FP8 && op != HPU_OP_LINEAR)
		lp = HPU_AUTOCAST_BF16; /* fp8 training: only linear is fp8 */
	if (quantizable(op) && hpu__ac_fp8_mode() == HPU_FP8_QUANTIZE)
		lp = HPU_AUTOCAST_FP8;
	atomic_fetch_add_explicit(&counts[op][slot_of(lp)], 1, memory_order_relaxed);
	return lp;
}

void hpu__ac_recount(hpu__op op, int from, int to)
{
	atomic_fetch_sub_explicit(&counts[op][slot_of(from)], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&counts[op][slot_of(to)], 1, memory_order_relaxed);
}

void hpu__ac_calls_get(hpu__ac_calls *now)
{
	for (int op = 0; op < HPU_OP_COUNT; op++)
		for (int k = 0; k < 3; k++)
			now->n[op][k] = atomic_load_explicit(&counts[op][k], memory_order_relaxed);
}

void hpu__ac_calls_take_since(const hpu__ac_calls *then, hpu__ac_calls *d)
{
	for (int op = 0; op < HPU_OP_COUNT; op++)
		for (int k = 0; k < 3; k++) {
			uint64_t now = atomic_load_explicit(&counts[op][k], memory_order_relaxed);
			d->n[op][k] = now - then->n[op][k];
			atomic_fetch_sub_explicit(&counts[op][k], d->n[op][k], memory_order_relaxed);
		}
}

void hpu__ac_calls_add(const hpu__ac_calls *d)
{
	for (int op = 0; op < HPU_OP_COUNT; op++)
		for (int k = 0; k < 3; k++)
			atomic_fetch_add_explicit(&counts[op][k], d->n[op][k], memory_order_relaxed);
}

/* The scratch buffers' allocator: the C heap, or a device's
 * (hpu__ac_set_scratch_allocator). */
static void *(*scratch_alloc)(size_t bytes);
static void (*scratch_release)(void *p);

/* *p grown to hold n elements of `size` bytes (contents not kept); aborts
 * when out of memory (the ops cannot fail). */
static void grow(void **p, size_t *cap, size_t n, size_t size)
{
	if (n <= *cap && *p != NULL)
		return;
	/* on the host half again, for the next larger call (pages not
	 * touched cost nothing); in a device's memory, which commits what it
	 * gives and counts it, exactly what is asked (a language model's
	 * head converts its [B T, V] gradient here: half of that again was
	 * 0.8 GB at GPT-2's batch 16) */
	size_t c = n < 1024 ? 1024 : scratch_alloc ? n : n + n / 2;
	void *q;
	if (scratch_alloc) {
		if (*p)
			scratch_release(*p);
		q = scratch_alloc(c * size);
	} else {
		q = realloc(*p, c * size);
	}
	if (q == NULL)
		abort();
	*p = q;
	*cap = c;
}

void hpu__ac_set_scratch_allocator(void *(*alloc)(size_t bytes), void (*release)(void *p))
{
	for (int i = 0; i < HPU__AC_SLOTS; i++) {
		void *bufs[2] = {scratch[i].p, scratch16[i].p};
		for (int j = 0; j < 2; j++)
			if (bufs[j])
				scratch_alloc ? scratch_release(bufs[j]) : free(bufs[j]);
		scratch[i].p = NULL;
		scratch16[i].p = NULL;
		scratch[i].cap = scratch16[i].cap = 0;
	}
	scratch_alloc = alloc && release ? alloc : NULL;
	scratch_release = alloc && release ? release : NULL;
}

void *hpu__ac_alloc(size_t bytes, void (**release)(void *p))
{
	*release = scratch_alloc ? scratch_release : free;
	return scratch_alloc ? scratch_alloc(bytes) : malloc(bytes);
}

float *hpu__ac_scratch(int slot, size_t n)
{
	grow((void **)&scratch[slot].p, &scratch[slot].cap, n, sizeof(float));
	return scratch[slot].p;
}

/* Rounding loops: bf16's is integer arithmetic that vectorizes as it is;
 * fp16's uses the CPU's F16C conversions where it has them (the same
 * rounding as lowp.h's, which the plain loop uses). */
HPU_CLONES static void round_bf16(const float *restrict x, float *restrict y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = hpu_from_bf16(hpu_to_bf16(x[i]));
}

HPU_CLONES static void round_bf16_inplace(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = hpu_from_bf16(hpu_to_bf16(x[i]));
}

HPU_CLONES static void to_bf16(const float *restrict x, uint16_t *restrict y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = hpu_to_bf16(x[i]);
}

static void round_fp16(const float *x, float *y, size_t n)
{
	if (hpu_have_f16c()) {
		hpu__f16c_round_fp16(y, x, n);
		return;
	}
	for (size_t i = 0; i < n; i++)
		y[i] = hpu_from_fp16(hpu_to_fp16(x[i]));
}

/* fp8's ops keep bf16 outputs: HPU_AUTOCAST_FP8 rounds to bf16 here. */
static void round_to(const float *x, float *y, size_t n, int lowp)
{
	const hpu__backend *be = hpu__be();
	if ((be->round && be->round(lowp == HPU_AUTOCAST_FP16, x, y, n) == HPU_BE_OK) ||
	    hpu__be_refused("autocast's rounding (hpu__ac_round)", "round, %zu values", n))
		return;
	hpu__host_round(lowp == HPU_AUTOCAST_FP16, x, y, n);
}

int hpu__ac_twin_add(const float *f, const uint16_t *h, size_t n)
{
	hpu__ac_twin_remove(f);
	if (ntwins == captwins) {
		int cap = captwins ? 2 * captwins : 8;
		twin *t = realloc(twins, (size_t)cap * sizeof *t);
		if (t == NULL)
			return -1;
		twins = t;
		captwins = cap;
	}
	twins[ntwins++] = (twin){f, h, n};
	return 0;
}

void hpu__ac_twin_remove(const float *f)
{
	for (int i = 0; f && i < ntwins; i++)
		if (twins[i].f == f) {
			twins[i] = twins[--ntwins];
			return;
		}
}

/* The bf16 values of x[0..n) where x lies in a twin, else NULL. */
static const uint16_t *twin_of(const float *x, size_t n)
{
	for (int i = 0; i < ntwins; i++) {
		const twin *t = &twins[i];
		if (x >= t->f && n <= t->n && (size_t)(x - t->f) <= t->n - n)
			return t->h + (x - t->f);
	}
	return NULL;
}

void hpu__ac_zero(void *p, size_t bytes)
{
	const hpu__backend *be = hpu__be();
	if (!p || !bytes)
		return;
	if ((be->zero && be->zero(p, bytes) == HPU_BE_OK) ||
	    hpu__be_refused("autocast's owed zeros (hpu__ac_zero)", "zero, %zu bytes", bytes))
		return;
	memset(p, 0, bytes);
}

int hpu__ac_fresh_add(float *g, size_t len)
{
	if (nfresh == capfresh) {
		int cap = capfresh ? 2 * capfresh : 8;
		fresh *f = realloc(freshes, (size_t)cap * sizeof *f);
		if (f == NULL)
			return -1;
		freshes = f;
		capfresh = cap;
	}
	freshes[nfresh++] = (fresh){g, len, NULL, 0};
	return 0;
}

int hpu__ac_fresh_add16(float *g, size_t len, uint16_t *g16)
{
	if (hpu__ac_fresh_add(g, len) < 0)
		return -1;
	freshes[nfresh - 1].g16 = g16;
	return 0;
}

/* The record of owed zeros (or of a taken claim) that starts at g, or -1. */
static int fresh_find(const float *g)
{
	for (int i = 0; g && i < nfresh; i++)
		if (freshes[i].g == g)
			return i;
	return -1;
}

int hpu__ac_fresh_claim(float *g, size_t n)
{
	int i = fresh_find(g);
	if (i < 0 || n > freshes[i].len)
		return 0;
	fresh *f = &freshes[i];
	if (f->taken) /* a second writer: the first's values in fp32, added to */
		hpu__ac_from16(0, g, f->g16, f->len);
	else
		hpu__ac_zero(g + n, (f->len - n) * sizeof *g);
	int owed = !f->taken;
	*f = freshes[--nfresh];
	return owed;
}

uint16_t *hpu__ac_fresh_claim16(float *g, size_t n)
{
	int i = fresh_find(g);
	if (i < 0 || n > freshes[i].len || !freshes[i].g16 || freshes[i].taken)
		return NULL;
	fresh *f = &freshes[i];
	hpu__ac_zero(f->g16 + n, (f->len - n) * sizeof *f->g16);
	f->taken = 1;
	return f->g16;
}

int hpu__ac_fresh_taken16(const float *g)
{
	int i = fresh_find(g);
	if (i < 0 || !freshes[i].taken)
		return 0;
	freshes[i] = freshes[--nfresh];
	return 1;
}

/* Drops the owed zeros in base[0..len), zeroing them first when `zero`;
 * `zero` leaves the taken claims for hpu__ac_fresh_taken16. */
static void fresh_drop(const float *base, size_t len, int zero)
{
	for (int i = 0; base && i < nfresh;)
		if (freshes[i].g >= base && freshes[i].g < base + len &&
		    !(zero && freshes[i].taken)) {
			if (zero)
				hpu__ac_zero(freshes[i].g, freshes[i].len * sizeof *base);
			freshes[i] = freshes[--nfresh];
		} else {
			i++;
		}
}

void hpu__ac_fresh_flush(float *base, size_t len)
{
	fresh_drop(base, len, 1);
}

void hpu__ac_fresh_forget(const float *base, size_t len)
{
	fresh_drop(base, len, 0);
}

const uint16_t *hpu__ac_bf16(int slot, const float *x, size_t n)
{
	if (x == NULL)
		return NULL;
	const uint16_t *h = twin_of(x, n);
	if (h)
		return h;
	grow((void **)&scratch16[slot].p, &scratch16[slot].cap, n, sizeof(uint16_t));
	const hpu__backend *be = hpu__be();
	if ((!be->to_bf16 || be->to_bf16(x, scratch16[slot].p, n) != HPU_BE_OK) &&
	    !hpu__be_refused("autocast's bf16 operand (hpu__ac_bf16)", "to_bf16, %zu values", n))
		hpu__host_to_bf16(x, scratch16[slot].p, n);
	return scratch16[slot].p;
}

int hpu__ac_param16_add(float *base, const uint16_t *p16, size_t len, int fp16, int ready)
{
	if (np16 == cap16) {
		int cap = cap16 ? 2 * cap16 : 8;
		param16 *n = realloc(p16s, (size_t)cap * sizeof *n);
		if (n == NULL)
			return -1;
		p16s = n;
		cap16 = cap;
	}
	size_t chunks = (len + P16_CHUNK - 1) / P16_CHUNK;
	unsigned char *made = malloc(chunks ? chunks : 1);
	if (made == NULL)
		return -1;
	memset(made, ready != 0, chunks);
	p16s[np16++] = (param16){base, p16, len, fp16, made};
	return 0;
}

void hpu__ac_param16_remove(const float *base)
{
	for (int i = 0; i < np16; i++)
		if (p16s[i].base == base) {
			free(p16s[i].made);
			p16s[i] = p16s[--np16];
			return;
		}
}

/* The registered copy w[0..n) lies in, or NULL. */
static param16 *find16(const float *w, size_t n)
{
	for (int i = 0; i < np16; i++) {
		param16 *p = &p16s[i];
		if (w >= p->base && n <= p->len && (size_t)(w - p->base) <= p->len - n)
			return p;
	}
	return NULL;
}

HPU_CLONES static void from16_plain(int fp16, float *restrict dst,
				    const uint16_t *restrict src, size_t n)
{
	if (fp16)
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_from_fp16(src[i]);
	else
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_from_bf16(src[i]);
}

void hpu__ac_from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	const hpu__backend *be = hpu__be();
	if ((be->from16 && be->from16(fp16, src, dst, n) == HPU_BE_OK) ||
	    hpu__be_refused("autocast's widening (hpu__ac_from16)", "from16, %zu values", n))
		return;
	hpu__host_from16(fp16, src, dst, n);
}

/* The CPU's from16 (hpu__be_host). */
int hpu__host_from16(int fp16, const uint16_t *src, float *dst, size_t n)
{
	if (fp16 && hpu_have_f16c())
		hpu__f16c_from_fp16(dst, src, n);
	else
		from16_plain(fp16, dst, src, n);
	return HPU_BE_OK;
}

/* Makes the fp32 values of w[0..n), which lies in p, where not made yet:
 * one widening (one kernel on a GPU) per run of chunks not made. Chunk by
 * chunk, GPT-2's token table (38.6M values) was 37,728 launches a step,
 * 0.2 s on an H200. */
static void make_f32(param16 *p, const float *w, size_t n)
{
	size_t off = (size_t)(w - p->base);
	size_t c = off / P16_CHUNK, last = (off + n - 1) / P16_CHUNK;
	while (c <= last) {
		if (p->made[c]) {
			c++;
			continue;
		}
		size_t c1 = c;
		while (c1 + 1 <= last && !p->made[c1 + 1])
			c1++;
		size_t a = c * P16_CHUNK, b = (c1 + 1) * P16_CHUNK;
		if (b > p->len)
			b = p->len;
		hpu__ac_from16(p->fp16, p->base + a, p->p16 + a, b - a);
		memset(p->made + c, 1, c1 + 1 - c);
		c = c1 + 1;
	}
}

const float *hpu__ac_param_f32(const float *w, size_t n)
{
	param16 *p = w && n ? find16(w, n) : NULL;
	if (p)
		make_f32(p, w, n);
	return w;
}

const float *hpu__ac_weight_round(int slot, const float *w, size_t n, int lowp)
{
	param16 *p = w && n ? find16(w, n) : NULL;
	if (p == NULL)
		return hpu__ac_round(slot, w, n, lowp);
	make_f32(p, w, n);
	if (p->fp16 == (lowp == HPU_AUTOCAST_FP16))
		return w; /* the values are of that type already */
	return hpu__ac_round(slot, w, n, lowp);
}

const uint16_t *hpu__ac_weight_bf16(int slot, const float *w, size_t n)
{
	if (w == NULL)
		return NULL;
	param16 *p = n ? find16(w, n) : NULL;
	if (p && !p->fp16)
		return p->p16 + (w - p->base);
	if (p)
		make_f32(p, w, n);
	return hpu__ac_bf16(slot, w, n);
}

const float *hpu__ac_round(int slot, const float *x, size_t n, int lowp)
{
	if (x == NULL)
		return NULL;
	float *y = hpu__ac_scratch(slot, n);
	round_to(x, y, n, lowp);
	return y;
}

void hpu__ac_round_inplace(float *x, size_t n, int lowp)
{
	const hpu__backend *be = hpu__be();
	if ((be->round && be->round(lowp == HPU_AUTOCAST_FP16, x, x, n) == HPU_BE_OK) ||
	    hpu__be_refused("autocast's rounding (hpu__ac_round_inplace)", "round, %zu values", n))
		return;
	hpu__host_round(lowp == HPU_AUTOCAST_FP16, x, x, n);
}

/* The CPU's round (hpu__be_host): in place where y is x. */
int hpu__host_round(int fp16, const float *x, float *y, size_t n)
{
	if (x != y && !fp16)
		round_bf16(x, y, n);
	else if (x != y)
		round_fp16(x, y, n);
	else if (!fp16)
		round_bf16_inplace(y, n);
	else if (hpu_have_f16c())
		hpu__f16c_round_fp16(y, y, n);
	else
		for (size_t i = 0; i < n; i++)
			y[i] = hpu_from_fp16(hpu_to_fp16(y[i]));
	return HPU_BE_OK;
}

/* The CPU's to_bf16 (hpu__be_host). */
int hpu__host_to_bf16(const float *x, uint16_t *y, size_t n)
{
	to_bf16(x, y, n);
	return HPU_BE_OK;
}
