/* device_kernels: the kernels-only mode of the CPU devices: cpu-strict's
 * (HPU_STRICT_KERNELS=1, or --graphs: hpu__dev_config.graphs), and the
 * cpu device's under --graphs (hpu__dev_cpu_rec: the same table, its
 * device calls nothing, as its memory is always open).
 *
 * On a GPU only the kernel table (worker/ops/backend.h) and the runtime's
 * ops (hpu__dev_rtops) touch device memory. This mode proves the same of
 * the CPU: the strategy's bracket around a layer's forward or backward
 * (hpu__dev_layer_enter) leaves device memory closed, and the ops use a
 * table each of whose functions opens it around the CPU's kernel (the
 * backend's, else the host table's: the ops' C loops moved into
 * hpu__be_host). A C loop left in an op or a layer then faults at once
 * with cpu-strict's message.
 *
 * Recording (device.h, hpu__dev_capture_begin): while the calling thread
 * records, each entry appends a node to the graph instead of running and
 * answers HPU_BE_OK. A node holds the entry's arguments as a struct made
 * from its parameter list (device_klist.h): scalars and device pointers by
 * value, the host structs passed by pointer (hpu__gemm and the
 * convolutions' shapes) and permute's host arrays copied into the graph
 * (the embedding's kernels take the vocabulary as an argument, so a node
 * holds everything its kernel reads on the host). Any other pointer
 * to host memory is host output (or input the kernel reads when it runs):
 * the recording is refused, naming the entry; so is dropout_fwd, whose
 * seed and stream the host gives each step, and dropout_rows with keys
 * the host drew (host memory: hpu_dropout_rows). dropout_rows with keys
 * in device memory records: dropout_keys made them there, from the
 * device's step and the batch's sample indices (ops.h hpu_dropout_ctx,
 * worker/ops/dropkeys.h), values a launch reads when it runs. A launch
 * calls each node's kernel as an eager call would (impl's, else the
 * fallback). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/ops/autocast.h"
#include "worker/ops/fp8.h"
#include "common/env.h"

static hpu__backend impl; /* the CPU's kernel for each entry */
static hpu__backend tab;  /* each entry: enter, impl's, leave */

static hpu__backend fallback; /* where impl's answers HPU_BE_UNSUPPORTED */

/* The device the table is built for: its device call (cpu-strict's
 * enter and leave; NULL on hpu__dev_cpu_rec, whose memory is open) and
 * what tells its memory from the host's (owns). */
static void (*dev_enter)(void), (*dev_leave)(void);
static int (*dev_owns)(const void *p);

static int is_host(const void *p)
{
	return p && !dev_owns(p);
}

#define KL_ARG(x) node_->a.x
#define KL_PIN(x) _Generic((node_->a.x), KL_PINS)(&pin_c_, #x, &node_->a.x);

/* ---- pinning a node's arguments at record time ---- */

typedef struct pin {
	const char *entry;
	int last_int; /* the int argument before: a host array's length */
	int bad;      /* refused already */
} pin;

static void refuse(pin *c, const char *what, const char *arg)
{
	if (!c->bad)
		hpu__dev_capture_refuse("the kernel %s %s (its argument %s)", c->entry, what, arg);
	c->bad = 1;
}

static void pin_none(pin *c, const char *arg, const void *v)
{
	(void)c;
	(void)arg;
	(void)v;
}

static void pin_int(pin *c, const char *arg, const int *v)
{
	(void)arg;
	c->last_int = *v;
}

/* A pointer the kernel reads (in) or writes (out): device memory or NULL. */
static void check_in(pin *c, const char *arg, const void *p)
{
	if (is_host(p))
		refuse(c, "reads host memory when it runs", arg);
}

static void check_out(pin *c, const char *arg, const void *p)
{
	if (is_host(p))
		refuse(c, "writes host memory", arg);
}

static void pin_in(pin *c, const char *arg, const void *field)
{
	check_in(c, arg, *(const void *const *)field);
}

static void pin_out(pin *c, const char *arg, const void *field)
{
	check_out(c, arg, *(const void *const *)field);
}

/* A host struct or array the kernel reads: copied into the graph. */
static const void *keep(pin *c, const char *arg, const void *p, size_t bytes)
{
	(void)arg;
	if (!p)
		return NULL;
	const void *k = hpu__dev_rec_keep(p, bytes);
	if (!k)
		c->bad = 1; /* refused by the graph (out of memory) */
	return k;
}

static void pin_gemm(pin *c, const char *arg, const hpu__gemm **g)
{
	*g = keep(c, arg, *g, sizeof **g);
	if (!*g)
		return;
	check_in(c, "gemm's a", (*g)->a);
	check_in(c, "gemm's b", (*g)->b);
	check_in(c, "gemm's bias", (*g)->bias);
	check_out(c, "gemm's c", (*g)->c);
	check_out(c, "gemm's c16", (*g)->c16);
}

static void pin_conv(pin *c, const char *arg, const hpu_conv2d_shape **s)
{
	*s = keep(c, arg, *s, sizeof **s);
}

static void pin_rect(pin *c, const char *arg, const hpu_conv2d_rect_shape **s)
{
	*s = keep(c, arg, *s, sizeof **s);
}

/* A const int array: device memory (ids, labels, indices) by value, or
 * permute's host shape and perm, ndim values (the int before them, at
 * most 8) copied; host memory elsewhere is refused. */
static const void *host_array(pin *c, const char *arg, const void *p, size_t elem)
{
	if (!is_host(p))
		return p;
	if (strcmp(c->entry, "permute")) {
		check_in(c, arg, p);
		return p;
	}
	if (c->last_int < 0 || c->last_int > 8) {
		if (!c->bad)
			hpu__dev_capture_refuse("the kernel %s takes %d dimensions (at most 8)",
						c->entry, c->last_int);
		c->bad = 1;
		return p;
	}
	return keep(c, arg, p, (size_t)c->last_int * elem);
}

static void pin_i64s(pin *c, const char *arg, const int64_t **a)
{
	*a = host_array(c, arg, *a, sizeof **a);
}

static void pin_ints(pin *c, const char *arg, const int **a)
{
	*a = host_array(c, arg, *a, sizeof **a);
}

/* dropout_rows' keys: device memory (dropout_keys made them), or the
 * host's, drawn for this step only. */
static void pin_keys(pin *c, const char *arg, const uint64_t *const *keys)
{
	(void)arg;
	if (is_host(*keys) && !c->bad) {
		hpu__dev_capture_refuse("the kernel %s takes dropout's keys, which the host draws "
					"each step: a replay would repeat the recorded step's mask",
					c->entry);
		c->bad = 1;
	}
}

/* What each argument's type asks: scalars by value (an int noted),
 * the host structs copied, const int arrays (int32_t is int) as
 * host_array says, other pointers the kernel reads checked as inputs,
 * any other pointer as output. */
#define KL_PINS                                                                              \
	int: pin_int, unsigned: pin_none, long: pin_none, unsigned long: pin_none,           \
	float: pin_none, double: pin_none, const hpu__gemm *: pin_gemm,                      \
	const hpu_conv2d_shape *: pin_conv, const hpu_conv2d_rect_shape *: pin_rect,         \
	const int64_t *: pin_i64s, const int *: pin_ints, const void *: pin_in,              \
	const float *: pin_in, const uint16_t *: pin_in,                                     \
	const uint8_t *: pin_in, const uint32_t *: pin_in, const uint64_t *: pin_keys,        \
	default: pin_out

/* ---- a host-only layer's staged call handing its tensors to a kernel ----
 *
 * Eager, while hpu__dev_staged_name is set: every pointer a kernel reads
 * or writes must be device memory (the host structs and permute's arrays
 * are the host's, and dropout's keys may be). A host-only layer's tensors
 * are staged host copies, which ops run on device memory cannot take. */
typedef struct chk {
	const char *entry;
} chk;

static void staged_fault(const chk *c, const char *arg, const void *p)
{
	hpu__dev_fatal("layer %s is host-only (HPU_LAYER_HOST_ONLY) and gave its staged host "
		       "copies to an op in its %s (the kernel %s, its argument %s: host memory at "
		       "%p) under --device %s: ops run on device memory, as on a GPU. A layer that "
		       "only calls ops is HPU_LAYER_ANY_DEVICE (the default); a host-only layer "
		       "computes with its own loops",
		       hpu__dev_staged_name, hpu__op_layer_backward() ? "backward" : "forward",
		       c->entry, arg, p, hpu__dev_cur->name);
}

static void chk_none(const chk *c, const char *arg, const void *v)
{
	(void)c;
	(void)arg;
	(void)v;
}

static void chk_ptr(const chk *c, const char *arg, const void *field)
{
	const void *p = *(const void *const *)field;
	if (is_host(p))
		staged_fault(c, arg, p);
}

static void chk_gemm(const chk *c, const char *arg, const hpu__gemm *const *g)
{
	(void)arg;
	if (!*g)
		return;
	const void *p[5] = {(*g)->a, (*g)->b, (*g)->bias, (*g)->c, (*g)->c16};
	static const char *const name[5] = {"gemm's a", "gemm's b", "gemm's bias", "gemm's c",
					    "gemm's c16"};
	for (int i = 0; i < 5; i++)
		if (is_host(p[i]))
			staged_fault(c, name[i], p[i]);
}

static void chk_array(const chk *c, const char *arg, const void *field)
{
	if (strcmp(c->entry, "permute")) /* permute's shape and order are the host's */
		chk_ptr(c, arg, field);
}

#define KL_CHKS                                                                              \
	int: chk_none, unsigned: chk_none, long: chk_none, unsigned long: chk_none,          \
	float: chk_none, double: chk_none, const hpu__gemm *: chk_gemm,                      \
	const hpu_conv2d_shape *: chk_none, const hpu_conv2d_rect_shape *: chk_none,         \
	const int64_t *: chk_array, const int *: chk_array, const uint64_t *: chk_none,      \
	default: chk_ptr
#define KL_CHK(x) _Generic((x), KL_CHKS)(&chk_c_, #x, &(x));

/* The entries whose kernels take host values that change every step
 * (dropout_rows' host keys: pin_keys). */
static int host_keyed(const char *entry)
{
	return !strcmp(entry, "dropout_fwd");
}

/* (The device call is the device's enter and leave directly, where it
 * has them: nothing on hpu__dev_cpu_rec but a test.) e_: impl's
 * kernel, else (HPU_BE_UNSUPPORTED) the host table's reference kernel,
 * which the op would have run: both inside the device call. k_: the
 * table's entry, e_ or, recording, a node whose run (r_) calls e_ with
 * the node's arguments. An entry neither kernel serves (gemm and the
 * convolutions have no host kernel: the op's own C loops stand in,
 * eagerly, where the host may touch the memory: hpu__be_refused) is
 * marked (unsup_) at its first refusal; recording, a marked entry answers
 * HPU_BE_UNSUPPORTED, as it did eagerly, so that the op refuses the
 * recording naming itself, rather than recording a node its launch could
 * not run (per entry, not per case: a step with any call of it then runs
 * eagerly). */
#define WRAP(name, params, args)                                                             \
	static int unsup_##name;                                                             \
	static int e_##name params                                                           \
	{                                                                                    \
		if (dev_enter)                                                               \
			dev_enter();                                                         \
		int r = impl.name args;                                                      \
		if (r == HPU_BE_UNSUPPORTED && fallback.name)                                \
			r = fallback.name args;                                              \
		if (dev_leave)                                                               \
			dev_leave();                                                         \
		if (r == HPU_BE_UNSUPPORTED)                                                 \
			unsup_##name = 1;                                                    \
		return r;                                                                    \
	}                                                                                    \
	struct n_##name {                                                                    \
		struct {                                                                     \
			KL_FE(KL_FIELD, KL_UNPAREN params)                                   \
		} a;                                                                         \
	};                                                                                   \
	static int r_##name(const void *p)                                                   \
	{                                                                                    \
		const struct n_##name *node_ = p;                                                \
		return e_##name(KL_FC(KL_ARG, KL_UNPAREN args));                             \
	}                                                                                    \
	static int k_##name params                                                           \
	{                                                                                    \
		if (!hpu__dev_capturing()) {                                                 \
			hpu__dev_rec_foreign("the kernel " #name);                           \
			if (hpu__dev_staged_name && dev_owns) {                              \
				chk chk_c_ = {.entry = #name};                               \
				KL_FE(KL_CHK, KL_UNPAREN args)                               \
			}                                                                    \
			return e_##name args;                                                \
		}                                                                            \
		if (host_keyed(#name)) {                                                     \
			hpu__dev_capture_refuse(                                             \
			    "the kernel " #name " takes dropout's keys, which the host "     \
			    "draws each step: a replay would repeat the recorded step's "    \
			    "mask");                                                         \
			return HPU_BE_OK;                                                    \
		}                                                                            \
		if (unsup_##name)                                                            \
			return HPU_BE_UNSUPPORTED;                                           \
		struct n_##name *node_ = hpu__dev_rec_node("the kernel " #name, r_##name, sizeof *node_);        \
		if (!node_)                                                                      \
			return HPU_BE_OK;                                                    \
		*node_ = (struct n_##name){{KL_UNPAREN args}};                                   \
		pin pin_c_ = {.entry = #name};                                                  \
		KL_FE(KL_PIN, KL_UNPAREN args)                                               \
		return HPU_BE_OK;                                                            \
	}

#include "worker/device/device_klist.h"
#undef WRAP

/* ---- both backward convolutions in one call (conv_bwd) ----
 *
 * Not in the list: its weights_done is host output. The table has it
 * where the backend has it (oneDNN: dy's layout change made once for
 * both, the same bits as the two calls), and its answer is always both
 * done: what the backend's call left (a refusal) is completed by the two
 * entries one by one (as the op would call them), so that a recorded
 * node, whose weights_done the host reads at the call, needs nothing
 * from the host when it runs. */
static int (*conv_bwd_impl)(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			    const void *w, const void *dy, float *dx, float *dw, float *db,
			    int *weights_done);

static int e_conv_bwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *w,
		      const void *dy, float *dx, float *dw, float *db, int *weights_done)
{
	*weights_done = 0;
	if (dev_enter)
		dev_enter();
	int r = conv_bwd_impl(s, dt, x, w, dy, dx, dw, db, weights_done);
	if (dev_leave)
		dev_leave();
	if (r == HPU_BE_OK)
		return r;
	if (!*weights_done) {
		if (e_conv_bwd_weights(s, dt, x, dy, dw, db) != HPU_BE_OK)
			return HPU_BE_UNSUPPORTED;
		*weights_done = 1;
	}
	return e_conv_bwd_data(s, dt, w, dy, dx);
}

struct n_conv_bwd {
	const hpu_conv2d_shape *s;
	hpu__dtype dt;
	const void *x, *w, *dy;
	float *dx, *dw, *db;
};

static int r_conv_bwd(const void *p)
{
	const struct n_conv_bwd *n = p;
	int wd;
	return e_conv_bwd(n->s, n->dt, n->x, n->w, n->dy, n->dx, n->dw, n->db, &wd);
}

static int k_conv_bwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *w,
		      const void *dy, float *dx, float *dw, float *db, int *weights_done)
{
	if (!hpu__dev_capturing()) {
		hpu__dev_rec_foreign("the kernel conv_bwd");
		return e_conv_bwd(s, dt, x, w, dy, dx, dw, db, weights_done);
	}
	if (unsup_conv_bwd_weights || unsup_conv_bwd_data) {
		*weights_done = 0; /* the op's entries one by one: it refuses */
		return HPU_BE_UNSUPPORTED;
	}
	*weights_done = 1; /* recorded (or refused): nothing left to the op */
	struct n_conv_bwd *n = hpu__dev_rec_node("the kernel conv_bwd", r_conv_bwd, sizeof *n);
	if (!n)
		return HPU_BE_OK;
	pin c = {.entry = "conv_bwd"};
	*n = (struct n_conv_bwd){keep(&c, "s", s, sizeof *s), dt, x, w, dy, dx, dw, db};
	check_in(&c, "x", x);
	check_in(&c, "w", w);
	check_in(&c, "dy", dy);
	check_out(&c, "dx", dx);
	check_out(&c, "dw", dw);
	check_out(&c, "db", db);
	return HPU_BE_OK;
}

/* Every kernel of hpu__backend is in the list: the struct holds the list's
 * entries, seven pointers more (name, describe, bf16_native, set_threads,
 * conv_bwd, and a GPU's flash16_fwd and flash16_bwd, which no CPU table
 * has: NULL here) and two ints in one pointer's room (gemm_c16,
 * findings_dev). An entry added to the struct and not to device_klist.h
 * fails here. */
#define WRAP(name, params, args) KL_N_##name,
enum {
#include "worker/device/device_klist.h"
	KL_NENTRIES
};
#undef WRAP
_Static_assert(sizeof(hpu__backend) == (KL_NENTRIES + 8) * sizeof(void *),
	       "an entry of hpu__backend is missing from device_klist.h");

/* Each entry: the backend's where it has one, else the host table's;
 * wrapped where either has it, NULL where neither. */
#define PICK(name)                                                                           \
	do {                                                                                 \
		impl.name = be->name ? be->name : host->name;                                \
		fallback.name = impl.name != host->name ? host->name : NULL;                 \
		tab.name = impl.name ? k_##name : NULL;                                      \
	} while (0)

static const hpu__backend *build(const hpu__device *d)
{
	const hpu__backend *be = hpu__be(), *host = hpu__be_host();
	dev_enter = d->enter;
	dev_leave = d->leave;
	dev_owns = d->owns;
	tab.name = d == &hpu__dev_cpu_strict ? "cpu-strict kernels" : "cpu kernels";
	tab.describe = be->describe;
	tab.bf16_native = be->bf16_native;
	tab.set_threads = be->set_threads;
	tab.findings_dev = 1; /* the check entries' kernels write the slots in a device call */
	PICK(gemm);
	PICK(conv_fwd);
	PICK(conv_bwd_data);
	PICK(conv_bwd_weights);
	PICK(maxpool_fwd);
	PICK(maxpool_bwd);
	PICK(avgpool_fwd);
	PICK(avgpool_bwd);
	PICK(eltwise_fwd);
	PICK(eltwise_bwd);
	PICK(softmax_fwd);
	PICK(softmax_bwd);
	PICK(layernorm_fwd);
	PICK(layernorm_bwd);
	PICK(dropout_fwd);
	PICK(dropout_bwd);
	PICK(embedding_fwd);
	PICK(embedding_bwd);
	PICK(softmax_xent);
	PICK(bias_grad);
	PICK(round);
	PICK(to_bf16);
	PICK(from16);
	PICK(add);
	PICK(amax);
	PICK(fp8_fake_quant);
	PICK(fp8_amax_scale);
	PICK(fp8_quant_at);
	PICK(fp8_roll);
	PICK(fp8_state_copy);
	PICK(fp8_quant8);
	PICK(gemm_fp8);
	PICK(ids_in_range);
	PICK(count_correct);
	PICK(xent_pos_fwd);
	PICK(xent_pos_bwd);
	PICK(accuracy_pos);
	PICK(copy);
	PICK(heads);
	PICK(mask_scores);
	PICK(dropout_rows);
	PICK(dropout_keys);
	PICK(batchnorm_fwd);
	PICK(batchnorm_bwd);
	PICK(reduce_fwd);
	PICK(reduce_bwd);
	PICK(copy_rows);
	PICK(zero);
	PICK(permute);
	PICK(sigmoid_fwd);
	PICK(sigmoid_bwd);
	PICK(pool1d_fwd);
	PICK(pool1d_bwd);
	PICK(conv_rect_fwd);
	PICK(conv_rect_bwd);
	PICK(mse_fwd);
	PICK(mse_bwd);
	PICK(bce_fwd);
	PICK(bce_bwd);
	PICK(ids_first_bad);
	PICK(attention_fwd);
	PICK(attention_bwd);
	PICK(flash_fwd);
	PICK(flash_bwd);
	conv_bwd_impl = be->conv_bwd;
	tab.conv_bwd = be->conv_bwd ? k_conv_bwd : NULL;
	/* a weight gradient's product writes the 16-bit gradient itself
	 * where the backend's gemm does (the ops ask for it only where
	 * that gemm takes it: bf16 native, no bias, no accumulation); the
	 * host table has no gemm to fall back on: a refusal there is the
	 * op's own fallback eagerly, the launch's error in a replay, as
	 * for any gemm */
	tab.gemm_c16 = impl.gemm == be->gemm && be->gemm_c16;
	return &tab;
}

static int kernels_only = -1;

int hpu__dev_strict_kernels(void)
{
	if (kernels_only < 0) {
		const char *e = hpu__env_str(HPU_ENV_HPU_STRICT_KERNELS);
		kernels_only = e && !strcmp(e, "1");
	}
	return kernels_only;
}

const hpu__backend *hpu__dev_kernels_table(const hpu__device *d)
{
	/* built anew at each open, over the backend then chosen (a test's
	 * table too); never over itself */
	if (hpu__be() != &tab)
		build(d);
	return &tab;
}

static void *scratch_alloc(size_t bytes)
{
	return hpu__dalloc_uninit(HPU_MEM_OTHER, bytes, "the ops' scratch (autocast, fp8)");
}

void hpu__dev_kernels_scratch(void)
{
	hpu__ac_set_scratch_allocator(scratch_alloc, hpu__dfree);
}
