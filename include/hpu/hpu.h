/* hpu.h: the contract between a model (train.so) and the hputrain runtime,
 * ABI 3 (the runtime loads ABI 2 models too; their forms, kept for one
 * version, are marked deprecated and warn on a rebuild).
 *
 * A model is a shared library that exports one symbol, `hpu_model_entry`,
 * an hpu_model whose abi_version is HPU_ABI_VERSION (use HPU_MODEL()).
 * The runtime calls its setup() once per worker; setup declares a graph
 * of layers over named tensors:
 *   - the datasets (train, optionally test): a size, the named fields of
 *     a sample (f32 or i32, each with its shape), and "fetch sample i";
 *     each field is a tensor the layers can read;
 *   - layers, in an order in which every layer reads only tensors declared
 *     before it (dataset fields or earlier layers' outputs), so residuals,
 *     skips and several inputs are plain; each layer names its outputs
 *     and declares its parameters (trainable, or shared with an earlier
 *     layer's: tied weights), its buffers (non-trainable state) and the
 *     memory it keeps between forward and backward;
 *   - the loss (one or more per-sample tensors, weighted) and metrics.
 * Ready-made layers are in <hpu/layers.h>; a custom layer gives forward
 * and backward callbacks.
 * The runtime owns all parameter, gradient, buffer and activation memory
 * (flat buffers; each tensor is a view), the data sampling, the training
 * loop, communication and the optimizer. The model owns the math.
 *
 * Ownership: pointers passed to hpu_* functions are copied unless said
 * otherwise; `user` pointers stay the model's and are handed back as given.
 */
#ifndef HPU_HPU_H
#define HPU_HPU_H

#include <hpu/export.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HPU_ABI_VERSION 3u
/* The oldest ABI version the runtime still loads: ABI 2's forms are kept
 * one version (deprecated) and go in the version after. */
#define HPU_ABI_VERSION_MIN 2u
#define HPU_MODEL_ENTRY_SYMBOL "hpu_model_entry"
#define HPU_MAX_DIMS 4  /* dimensions of one sample of a tensor */
#define HPU_MAX_IO 8    /* inputs, outputs of a layer; fields of a sample */
#define HPU_NAME_MAX 64 /* bytes of a layer, tensor or field name, with NUL */

/* Errors. Functions that return int return HPU_OK (0) or one of these
 * (negative) codes; a model's callbacks may return them too: the runtime
 * takes any non-zero return as a failure. */
typedef enum hpu_err {
	HPU_OK = 0,
	HPU_ERROR = -1,  /* failed; a message says why: the one given to
			  * hpu_error() / hpu_layer_error(), or the err
			  * buffer of the call */
	HPU_EINVAL = -2, /* a bad argument or declaration (the builder's
			  * error names it) */
	HPU_ENOMEM = -3, /* out of memory */
	HPU_ERANGE = -4, /* an index out of range (an embedding id) */
	HPU_ENODEV = -5, /* no device memory is set up */
	HPU_ENOENT = -6, /* no such name (a tensor, parameter or buffer) */
} hpu_err;

/* A static sentence naming an hpu_err code ("Unknown error code." for
 * any other value). */
HPU_API const char *hpu_strerror(int err);

typedef struct hpu_builder hpu_builder; /* the runtime, during setup */
typedef struct hpu_layer hpu_layer;     /* one declared layer */
typedef struct hpu_run hpu_run;         /* the runtime, in a hook */

/* ---- tensors ---- */

typedef enum hpu_dtype {
	HPU_F32 = 0,
	HPU_I32 = 1,
} hpu_dtype;

/* A tensor: `batch` samples (rows) of `shape` each, row-major, dense.
 * ndim 0 is one value per sample (a per-sample loss). In declarations
 * (hpu_tensor_info) data is NULL and batch 0. */
typedef struct hpu_tensor {
	void *data;          /* NULL: not wanted (a gradient nobody needs) */
	hpu_dtype dtype;
	int batch;
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
	size_t sample_numel; /* product of shape (1 when ndim is 0) */
	const char *name;
} hpu_tensor;

static inline float *hpu_f32(const hpu_tensor *t)
{
	return (float *)t->data;
}

static inline int32_t *hpu_i32(const hpu_tensor *t)
{
	return (int32_t *)t->data;
}

/* Elements of the whole tensor: batch * sample_numel. */
static inline size_t hpu_numel(const hpu_tensor *t)
{
	return (size_t)t->batch * t->sample_numel;
}

/* ---- the run context: what every callback is told ----
 *
 * One context type for layers (losses and metrics are layers) and hooks:
 * forward and backward get it as `c`, a hook from hpu_run_ctx(run). */

typedef struct hpu_ctx {
	int train;      /* 1: training (forward, backward, recompute);
			 * 0: evaluation (forward only; dropout off) */
	int recompute;  /* 1: a forward that recomputes outputs activation
			 * checkpointing dropped; it must produce what the
			 * first forward did (hpu_rand gives the same values) */
	long step;      /* the optimizer step being computed, from 0 (in
			 * evaluation: the steps done) */
	int micro;      /* the micro-step in the step, from 0 */
	int accum;      /* micro-steps per step */
	long epoch;     /* from 0 */
	int batch;      /* samples (rows) in this call */
	int rank, world;
	int layer;      /* the layer's index: its random stream (-1 in a
			 * hook) */
	uint64_t seed;  /* the run's --seed (a resumed run's: its checkpoint's) */
	const uint32_t *samples; /* the dataset index of each row */
} hpu_ctx;

/* Counter-based random numbers for the layer that got `c`: value k of
 * row `row`, a pure function of (seed, layer, step, the row's dataset
 * index, k). The same whenever it is asked for: on every rank and at any
 * world size (it follows the sample, not the rank), under recompute and
 * after a restart. hpu_rand_u32 is uniform over 32 bits, hpu_rand_uniform
 * over [0, 1). */
HPU_API uint32_t hpu_rand_u32(const hpu_ctx *c, int row, uint64_t k);
HPU_API float hpu_rand_uniform(const hpu_ctx *c, int row, uint64_t k);
/* out[i] = hpu_rand_u32(c, row, k0 + i) for i < n, faster. */
HPU_API void hpu_rand_fill(const hpu_ctx *c, int row, uint64_t k0, uint32_t *out, size_t n);
/* Row `row`'s key: hpu_rand_u32(c, row, k) is the top 32 bits of
 * mix64(key + (k + 1) * 0x9e3779b97f4a7c15), mix64 splitmix64's
 * finalizer; what a device kernel draws from (hpu_dropout_rows). */
HPU_API uint64_t hpu_rand_key(const hpu_ctx *c, int row);

/* ---- parameters and buffers ---- */

typedef enum hpu_init_kind {
	HPU_INIT_ZEROS = 0,
	HPU_INIT_ONES,
	HPU_INIT_CONSTANT,        /* a */
	HPU_INIT_UNIFORM,         /* U(a, b) */
	HPU_INIT_NORMAL,          /* N(mean a, std b) */
	HPU_INIT_TRUNC_NORMAL,    /* N(a, b) redrawn outside [a-2b, a+2b] */
	HPU_INIT_XAVIER_UNIFORM,  /* U(+-gain*sqrt(6/(fan_in+fan_out))),
				   * gain a (0 means 1) */
	HPU_INIT_XAVIER_NORMAL,   /* N(0, gain*sqrt(2/(fan_in+fan_out))) */
	HPU_INIT_KAIMING_UNIFORM, /* U(+-sqrt(6/((1+a^2) fan_in))), a the
				   * negative slope (0: ReLU) */
	HPU_INIT_KAIMING_NORMAL,  /* N(0, sqrt(2/((1+a^2) fan_in))) */
	HPU_INIT_FAN_IN_UNIFORM,  /* U(+-1/sqrt(fan_in)): torch.nn.Linear's
				   * and Conv2d's default */
	HPU_INIT_CUSTOM,          /* fn */
} hpu_init_kind;

/* What an initializer is told about its tensor. fan_in and fan_out come
 * from a shape as torch.nn.init computes them: for 2 or more dims, fan_in
 * = shape[1] * prod(shape[2..]), fan_out = shape[0] * prod(shape[2..]).
 * The shape is the tensor's own, but for a parameter of 1 dim (a bias)
 * declared after one of 2 or more dims in the same layer: it takes the
 * fans of the last such parameter before it (its layer's weight), as
 * torch.nn.Linear's and Conv2d's biases are drawn from U(+-1/sqrt(the
 * weight's fan_in)). A 1-dim parameter with no such weight before it (and
 * every buffer) uses its own length for both. */
typedef struct hpu_init_info {
	const char *name; /* "layer.param" */
	int ndim;
	const int64_t *shape;
	size_t numel;
	size_t fan_in, fan_out;
} hpu_init_info;

/* The seeded generator a custom initializer draws from (the same on
 * every rank); draw with hpu_init_uniform / hpu_init_normal. */
typedef struct hpu_init_rng {
	uint64_t s[4];
} hpu_init_rng;

HPU_API float hpu_init_uniform(hpu_init_rng *r); /* [0, 1) */
HPU_API float hpu_init_normal(hpu_init_rng *r);  /* N(0, 1) */

typedef struct hpu_init {
	hpu_init_kind kind;
	float a, b; /* as the kind says */
	/* HPU_INIT_CUSTOM: writes w[0 .. info->numel). Returns 0, or
	 * non-zero (setup then fails, "the initializer of L.P failed"). It
	 * runs after setup() has returned; to say why, call hpu_error() on
	 * the builder setup() got (user can carry it) before returning: its
	 * message follows. */
	int (*fn)(void *user, const hpu_init_info *info, float *w,
		  hpu_init_rng *rng);
	void *user;
} hpu_init;

/* Shorthands: HPU_INIT(ZEROS), HPU_INIT(UNIFORM, -0.1f, 0.1f), ...
 * In C++ the same, by a function (a compound literal is an extension
 * there, and C++ does not mix designated and positional fields): its
 * arguments are positional, a and b; a custom initializer is an hpu_init
 * with .kind = HPU_INIT_CUSTOM and .fn set. */
#ifdef __cplusplus
static inline hpu_init hpu__init_of(hpu_init_kind kind, float a = 0.0f, float b = 0.0f)
{
	hpu_init i = {};
	i.kind = kind;
	i.a = a;
	i.b = b;
	return i;
}
#define HPU_INIT(kind_, ...) (hpu__init_of(HPU_INIT_##kind_, ##__VA_ARGS__))
#else
#define HPU_INIT(kind_, ...) \
	((hpu_init){.kind = HPU_INIT_##kind_, ##__VA_ARGS__})
#endif

/* How a buffer (non-trainable state, e.g. batch norm's running
 * statistics) is kept in step across ranks after every optimizer step. */
typedef enum hpu_buffer_sync {
	HPU_BUFFER_BROADCAST = 0, /* rank 0's values (DDP's broadcast_buffers) */
	HPU_BUFFER_MEAN,          /* the mean over the ranks */
	HPU_BUFFER_LOCAL,         /* each rank its own; checkpoints keep
				   * rank 0's */
} hpu_buffer_sync;

/* ---- datasets ---- */

typedef enum hpu_split {
	HPU_SPLIT_TRAIN = 0,
	HPU_SPLIT_TEST,
} hpu_split;

/* One field of a sample: a tensor the layers can read by its name. */
typedef struct hpu_field {
	const char *name;
	hpu_dtype dtype;
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
} hpu_field;

typedef struct hpu_dataset {
	size_t size; /* samples: 1 to UINT32_MAX (the sampler numbers them with 32 bits) */
	int nfields;
	hpu_field fields[HPU_MAX_IO];
	/* Writes sample `index` (< size): field f into out[f] (its
	 * sample_numel values, of its dtype). Training batches are fetched on
	 * the runtime's loader thread while the layers compute, so fetch must
	 * not touch state the layers use; calls never overlap each other.
	 * Returns 0, or non-zero on failure. */
	int (*fetch)(void *user, size_t index, void *const *out);
	void *user;
} hpu_dataset;

/* ---- layers ---- */

/* Where a custom layer's forward and backward may run. */
typedef enum hpu_layer_device {
	HPU_LAYER_ANY_DEVICE = 0, /* the default: the callbacks only call ops
				   * (<hpu/ops.h>), which run where the
				   * tensors are, so the layer runs on any
				   * device (a GPU worker's too) */
	HPU_LAYER_HOST_ONLY = 1,  /* the callbacks read or write the tensors'
				   * memory themselves: where the host may
				   * not read device memory (a GPU,
				   * cpu-strict) the runtime stages each
				   * call through pinned host memory: host
				   * copies of the inputs, outputs and their
				   * gradients, hpu_param/hpu_grad/
				   * hpu_buffer/hpu_saved/hpu_scratch,
				   * copied back after the call (correct,
				   * slow; rank 0 warns once per layer).
				   * --device cpu stages nothing;
				   * cpu-strict stages as a GPU does */
} hpu_layer_device;

typedef struct hpu_layer_ops {
	/* Writes out[0 .. nout) from in[0 .. nin) (as declared, in order).
	 * Return 0, or non-zero after hpu_error(layer, ...). */
	int (*forward)(hpu_layer *layer, const hpu_ctx *c, const hpu_tensor *in,
		       hpu_tensor *out);
	/* Given the forward's in and out and dout[k] = dL/dout[k],
	 * ACCUMULATES into the parameter gradients (hpu_grad) and WRITES
	 * din[k] = dL/din[k] (overwriting it); din[k].data is NULL where no
	 * gradient is wanted (a dataset field, an i32 tensor). dout[k].data
	 * is never NULL (zeros where nothing used the output). May be NULL
	 * for a layer with no parameters whose inputs need no gradient (it
	 * is then never called). Return 0, or non-zero after
	 * hpu_error(layer, ...). */
	int (*backward)(hpu_layer *layer, const hpu_ctx *c, const hpu_tensor *in,
			const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din);
	/* Optional: frees the layer's `user` when the model is unloaded
	 * (library layers keep their sizes there). */
	void (*destroy)(void *user);
	/* ABI 3: where the callbacks may run; left out (0) it is
	 * HPU_LAYER_ANY_DEVICE. (The runtime reads this field only from ABI
	 * 3 models: an ABI 2 model's struct ends before it.) */
	hpu_layer_device device;
} hpu_layer_ops;

/* ABI 3: the training settings a model was tuned for (what Lightning's
 * configure_optimizers says), in HPU_MODEL(..., .defaults = {...}). Each
 * one declared replaces the runtime's built-in default; a --config file
 * and a flag replace it in turn (built-in < model < config < flag), and
 * --verbose says where each setting came from. A field left out (0 or
 * NULL) keeps the runtime's default. Names are spelt as the flags' values;
 * a value the flag would refuse stops the job, naming the model and the
 * field. Every rank loads the same model, so all agree. */
typedef struct hpu_train_defaults {
	int epochs;            /* --epochs */
	int batch_size;        /* --batch-size: the global batch, all ranks */
	const char *optimizer; /* --optimizer: "sgd", "adamw", "adam" */
	double lr;             /* --lr: the peak under warm-up */
	double weight_decay;   /* --weight-decay (0: the optimizer's default) */
	const char *scheduler; /* --scheduler: "constant", "step", "cosine",
				* "warmup", "warmup_decay" */
	long warmup_steps;     /* --warmup-steps */
	double min_lr;         /* --min-lr: where cosine ends */
	const char *precision; /* --precision: "fp32", "bf16-mixed", "16-mixed", "fp8" */
} hpu_train_defaults;

typedef struct hpu_model {
	uint32_t abi_version; /* HPU_ABI_VERSION */
	const char *name;
	/* Declares the model. argv holds the model arguments (after "--"),
	 * argv[0] being the model's path. Returns 0, or non-zero after
	 * hpu_error(). */
	int (*setup)(hpu_builder *b, int argc, char **argv);
	/* Optional: frees what setup() made; gets hpu_set_user()'s pointer. */
	void (*teardown)(void *user);
	/* ABI 3, optional: the model's training defaults (above). The
	 * runtime reads them only from a model whose hpu_model_entry is
	 * large enough to hold them. */
	hpu_train_defaults defaults;
} hpu_model;

/* Deprecated: one export macro marks what a library or model makes
 * visible (hpu/export.h), and HPU_MODEL uses it. HPU_EXPORT stays an
 * alias of it for one version, for models written `HPU_EXPORT const
 * hpu_model hpu_model_entry = {...}`; it goes in the version after. */
#define HPU_EXPORT HPU_API

/* Defines the model's entry symbol: HPU_MODEL(.name = "mlp", .setup = f).
 * In C++ (20, for the designated fields, given in the struct's order) the
 * symbol is extern "C": a namespace-scope const would have internal
 * linkage, and no entry symbol would be exported; the fields left out are
 * zero, as in C, without -Wextra's missing-initializer warning. */
#ifdef __cplusplus
#define HPU_MODEL(...)                                                      \
	_Pragma("GCC diagnostic push")                                      \
	_Pragma("GCC diagnostic ignored \"-Wmissing-field-initializers\"") \
	extern "C" HPU_API const hpu_model hpu_model_entry = {              \
		.abi_version = HPU_ABI_VERSION, __VA_ARGS__};               \
	_Pragma("GCC diagnostic pop")
#else
#define HPU_MODEL(...)                                                      \
	HPU_API const hpu_model hpu_model_entry = {                         \
		.abi_version = HPU_ABI_VERSION, __VA_ARGS__}
#endif

/* --- during setup ---
 *
 * Errors are sticky: the first declaration that fails records its error
 * (naming the layer, tensor or parameter and what was wrong), and from
 * then on every declaration (hpu_dataset_set, hpu_layer_add and what
 * follows a layer, the library's layers, hpu_param_init, hpu_loss_add,
 * hpu_metric_add, the hooks) does nothing and returns the error (NULL
 * for a layer; the calls taking a layer accept that NULL). A setup
 * therefore reads top to bottom without checks and ends with
 *
 *     return hpu_builder_status(b);
 *
 * and the job reports that first error alone. hpu_error() records the
 * model's own error the same way (the first error wins). Queries
 * (hpu_tensor_info, hpu_param_shape, hpu_rank, ...) record nothing. */

/* HPU_OK while every declaration so far succeeded; else the first
 * failure's code (HPU_ERROR for hpu_error()). */
HPU_API int hpu_builder_status(const hpu_builder *b);

/* Sets a dataset split. The struct is copied (names too); `user` stays
 * the model's. The test split must have the training split's fields.
 * Each field becomes a tensor of that name. */
HPU_API int hpu_dataset_set(hpu_builder *b, hpu_split split, const hpu_dataset *ds);

/* Says that the training split's samples overlap (split HPU_SPLIT_TRAIN,
 * after hpu_dataset_set; newer than ABI 3's first runtimes, so a model
 * may test HPU_HAS_DATASET_OVERLAP, and an older runtime refuses to load
 * one that calls it, naming the symbol): sample i
 * shares data with the samples less than `span` away (i - span + 1 ..
 * i + span - 1), as sliding windows do (a window of T + 1 tokens taken at
 * every token: span T + 1). --val-fraction then holds out one run of
 * samples and trains on none that shares data with it, instead of
 * samples drawn at random, each of which would sit between trained
 * neighbours. span 1: no overlap (the default). */
#define HPU_HAS_DATASET_OVERLAP 1
HPU_API int hpu_dataset_overlap(hpu_builder *b, hpu_split split, size_t span);

/* Adds a layer reading the tensors named in `inputs`, a comma-separated
 * list ("x" or "h,skip"; each a dataset field or an earlier layer's
 * output; NULL or "" for none). Its outputs follow with
 * hpu_layer_output(), its parameters with hpu_param_add(). Returns NULL
 * (the error recorded) on bad arguments; `user` then stays the caller's.
 * Once added, ops->destroy (if set) frees `user` at unload. */
HPU_API hpu_layer *hpu_layer_add(hpu_builder *b, const char *name, const char *inputs,
				 const hpu_layer_ops *ops, void *user);
/* (hpu_layer_output, hpu_param_add, hpu_param_share, hpu_buffer_add,
 * hpu_layer_memory, hpu_layer_checkpoint and hpu_layer_params_in_ops
 * take a NULL layer, a failed declaration's, and return HPU_EINVAL or the
 * builder's first error without recording another.) */

/* Declares the layer's next output: a new tensor named `tensor` with
 * one sample of `shape`. Returns its index, or an error code. */
HPU_API int hpu_layer_output(hpu_layer *layer, const char *tensor, hpu_dtype dtype,
			     int ndim, const int64_t *shape);

/* Describes a tensor declared so far (data NULL, batch 0). Returns
 * HPU_OK, or HPU_ENOENT. */
HPU_API int hpu_tensor_info(const hpu_builder *b, const char *tensor, hpu_tensor *out);

/* Declares a trainable parameter of `layer` (named "layer.name") with
 * its initializer; returns its index in the layer (0, 1, ...), or an
 * error code. */
HPU_API int hpu_param_add(hpu_layer *layer, const char *name, int ndim,
			  const int64_t *shape, hpu_init init);

/* Sets the initializer of a parameter declared so far ("layer.name"),
 * as torch.nn.init does to a module's weight after construction: e.g.
 * hpu_param_init(b, "wte.weight", HPU_INIT(NORMAL, 0, 0.02f)) for a
 * library embedding. HPU_OK, HPU_ENOENT or HPU_EINVAL. */
HPU_API int hpu_param_init(hpu_builder *b, const char *param, hpu_init init);

/* The shape of a parameter declared so far ("layer.name"): HPU_OK, or
 * HPU_ENOENT. */
HPU_API int hpu_param_shape(const hpu_builder *b, const char *param, int *ndim,
			    int64_t shape[HPU_MAX_DIMS]);

/* Ties: `layer` uses the parameter named `param` ("layer.name") of an
 * earlier layer as its next parameter, one tensor with one gradient (the
 * uses' contributions summed). Returns its index in `layer`, or an error
 * code (HPU_ENOENT: no such parameter). */
HPU_API int hpu_param_share(hpu_layer *layer, const char *param);

/* Declares a buffer of `layer`: non-trainable state ("layer.name"),
 * initialized like a parameter, the same on every rank at start, kept
 * across ranks as `sync` says, saved in checkpoints. Returns its index
 * among the layer's buffers, or an error code. */
HPU_API int hpu_buffer_add(hpu_layer *layer, const char *name, int ndim,
			   const int64_t *shape, hpu_init init, hpu_buffer_sync sync);

/* Memory the runtime keeps for the layer, in 4-byte elements, per sample
 * of the micro-batch plus fixed: `saved` from its forward to its backward
 * (hpu_saved: what backward needs besides the inputs and outputs, e.g.
 * statistics or a mask; dropped and recomputed with the outputs under
 * activation checkpointing), `scratch` for the duration of one call
 * (hpu_scratch). Counted in device memory. Returns HPU_OK; sizes whose
 * bytes at the largest batch pass what a size_t holds fail the run at
 * setup, naming the layer. */
HPU_API int hpu_layer_memory(hpu_layer *layer, size_t saved_per_sample,
			     size_t saved_fixed, size_t scratch_per_sample,
			     size_t scratch_fixed);

/* Marks `layer` for activation checkpointing: in a run of consecutive
 * marked layers, outputs that only layers of the run read are not kept
 * through the forward pass (nor the layers' saved memory); backward
 * recomputes them from the run's inputs. Costs one more forward of those
 * layers; saves their activation memory. Returns HPU_OK. */
HPU_API int hpu_layer_checkpoint(hpu_layer *layer, int on);

/* Promises that `layer` hands its parameters (hpu_param) only to
 * hpu_linear_forward/backward and hpu_conv2d_forward/backward, as their w
 * and b, and never reads them itself. Under bf16-mixed precision the
 * runtime then makes no fp32 copy of the weights for the layer: the
 * products read the bf16 working copy, and whatever an op needs in fp32
 * (a bias, a fallback) is made when it is read. The library's linear,
 * conv2d and attention layers make this promise. Returns HPU_OK. */
HPU_API int hpu_layer_params_in_ops(hpu_layer *layer);

/* Promises that `layer` hands its parameters' gradients (hpu_grad) only
 * to hpu_linear_backward and hpu_conv2d_backward, as their dw and db
 * (each gradient whole, from its first float), and never reads or writes
 * them itself. The runtime may then leave a step's gradients of the layer
 * unzeroed (on --device cpu, where no other layer uses its parameters):
 * the linear op writes the weight gradient's product instead of adding
 * it to zeros, and the ops zero what they add to; the values are those
 * of zeroed gradients. A layer that adds to a gradient itself must not
 * promise this. Under bf16-mixed the weight gradient's product may go
 * straight into the 16-bit gradients, rounded; a second
 * hpu_linear_backward into the same dw in one backward then adds onto
 * those rounded values. The library's linear, conv2d and attention layers
 * make this promise. Returns HPU_OK. */
HPU_API int hpu_layer_grads_in_ops(hpu_layer *layer);

/* Says which of `layer`'s forward inputs and outputs its backward reads
 * the values of: bit k of `inputs` for in[k], bit k of `outputs` for
 * out[k] (e.g. a ReLU reads only its output: 0, 1u << 0; a linear layer
 * only its input: 1u << 0, 0). In backward, in[k].data and out[k].data of
 * a tensor not named are NULL (their shapes are there). When no backward
 * reads a tensor and no loss, metric or recomputation (activation
 * checkpointing) needs it, the runtime frees it after its last reader's
 * forward instead of keeping it for backward. A wrong promise makes
 * backward read NULL. Without this call backward reads all of them.
 * Returns HPU_OK, or HPU_EINVAL for a bit past the layer's inputs (or
 * past HPU_MAX_IO outputs; setup then refuses one past those it
 * declared). */
HPU_API int hpu_layer_backward_reads(hpu_layer *layer, unsigned inputs, unsigned outputs);

/* Says that `layer`'s backward may write the gradient din[k] over the
 * forward input in[k] (bit k of `inputs`): it reads each value of in[k]
 * only before writing the same value of din[k], as an elementwise
 * gradient does (the cross-entropy's softmax minus one-hot). Where
 * nothing reads in[k] after this backward (no earlier layer's backward
 * reads it, nor the backward of the layer that made it; it is neither a
 * loss nor a metric, nor another input of this layer, nor dropped by
 * activation checkpointing) and this backward is the first to write its
 * gradient, the runtime passes din[k].data == in[k].data: one buffer of
 * that size fewer while backward runs. Elsewhere they are apart, as
 * without this call. Returns HPU_OK, or HPU_EINVAL for a bit past the
 * layer's inputs. */
HPU_API int hpu_layer_backward_in_place(hpu_layer *layer, unsigned inputs);

/* Says that `layer`'s backward reads the values of in[k] (bit k of
 * `inputs`) only as the input x of hpu_linear_backward, whose products
 * under bf16-mixed round x to bf16 before they use it. Under bf16-mixed,
 * where the linear op runs in bf16 (autocast's lists) and every backward
 * that reads the tensor says this of it (and no layer that activation
 * checkpointing runs again reads it), the runtime keeps the tensor from
 * forward to backward as its bf16 rounding, half the bytes, and backward
 * reads those values widened: the products see the same bf16 values.
 * The library's linear layers and attention say it of their input.
 * Returns HPU_OK, or HPU_EINVAL for a bit past the layer's inputs. */
HPU_API int hpu_layer_backward_reads_linear(hpu_layer *layer, unsigned inputs);

/* The loss the optimizer minimizes: the mean over samples of the
 * per-sample f32 tensor `tensor` (one value a sample: ndim 0, as loss
 * layers output, or a shape of one element), times
 * `weight`. Call it again to add auxiliary losses. Returns HPU_OK or an
 * error code. */
HPU_API int hpu_loss_add(hpu_builder *b, const char *tensor, float weight);

/* A metric the evaluation reports as `name`: the mean over the test
 * samples of the per-sample f32 tensor `tensor` (e.g. 1 for a correct
 * prediction). The evaluation always reports the test loss too: "loss",
 * "samples" and "test_loss" are no metric's name. */
HPU_API int hpu_metric_add(hpu_builder *b, const char *name, const char *tensor);

/* Hooks with access to the trained model on every rank (parameters
 * gathered under ZeRO-3): after the final evaluation (the test split's,
 * not each --eval-every validation) and after training. The
 * hook returns 0, or non-zero to fail the job (message by
 * hpu_error(run, ...)); hpu_run_ctx(run) is its context. */
typedef int (*hpu_hook)(hpu_run *run, void *user);
HPU_API int hpu_hook_after_eval(hpu_builder *b, hpu_hook fn, void *user);
HPU_API int hpu_hook_after_train(hpu_builder *b, hpu_hook fn, void *user);

/* Keeps a pointer that teardown() gets back. */
HPU_API void hpu_set_user(hpu_builder *b, void *user);

/* Records a setup error (printf format), unless one is recorded already
 * (the first error wins); returns HPU_ERROR (-1). */
HPU_API int hpu_error(hpu_builder *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

HPU_API int hpu_rank(const hpu_builder *b);
HPU_API int hpu_world_size(const hpu_builder *b);
/* The largest micro-batch the runtime will run (known during setup). */
HPU_API int hpu_max_batch(const hpu_builder *b);

/* --- inside forward/backward --- */

/* The layer's parameter `index` / its gradient / its buffer, as views
 * into the runtime's flat buffers (a shared parameter is the owner's). */
HPU_API float *hpu_param(hpu_layer *layer, int index);
HPU_API float *hpu_grad(hpu_layer *layer, int index);
HPU_API float *hpu_buffer(hpu_layer *layer, int index);
/* The layer's saved and scratch memory (hpu_layer_memory), or NULL when
 * it declared none; given in every call, evaluation included. */
HPU_API void *hpu_saved(hpu_layer *layer);
HPU_API void *hpu_scratch(hpu_layer *layer);
HPU_API void *hpu_layer_user(hpu_layer *layer);
HPU_API const char *hpu_layer_name(const hpu_layer *layer);

/* Records a layer error (printf format); returns HPU_ERROR (-1). */
HPU_API int hpu_layer_error(hpu_layer *layer, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* --- in a hook ---
 *
 * An hpu_run is valid only while the hook it was given to runs: these
 * calls refuse NULL or one kept after its hook returned and used outside
 * a hook, saying so on stderr (NULL, HPU_EINVAL, NAN, -1 or HPU_ERROR, as
 * each returns). One kept and used in a later hook is not told apart
 * from that hook's own (it may be the same object): it reads that
 * hook's run. */

/* A parameter or buffer by its full name ("layer.name"), with its shape
 * in *info (info may be NULL): the whole tensor, fp32, valid until the
 * hook returns. For an unknown name (or NULL), or a buffer asked for in
 * a model without buffers: NULL, with "no parameter named NAME" / "no
 * buffer named NAME" recorded as the hook's error (hpu_run_error), which
 * the job reports if the hook then returns non-zero. */
HPU_API const float *hpu_run_param(hpu_run *run, const char *name, hpu_tensor *info);
HPU_API const float *hpu_run_buffer(hpu_run *run, const char *name, hpu_tensor *info);
/* Runs the model's forward in evaluation mode on `batch` samples (1 to
 * the micro-batch, hpu_max_batch(); more in several calls) given
 * as one pointer per dataset field (in the dataset's field order), and
 * points *out at tensor `tensor` of the result (valid until the next
 * call or the hook's return). For generation: feed, read logits, feed
 * again. Every rank must call it the same number of times (ZeRO-3
 * gathers). Returns HPU_OK or an error code (hpu_run_error). */
HPU_API int hpu_run_forward(hpu_run *run, const void *const *fields, int batch,
			    const char *tensor, hpu_tensor *out);
/* The hook's run context, the type the layers get: train 0, the steps
 * done (step), the epoch, rank, world, seed; layer -1, batch 0, samples
 * NULL. Valid until the hook returns. */
HPU_API const hpu_ctx *hpu_run_ctx(const hpu_run *run);
/* ABI 2's accessors of the same facts, deprecated (gone in the next
 * version). */
HPU_API int hpu_run_rank(const hpu_run *run)
	__attribute__((deprecated("use hpu_run_ctx(run)->rank")));
HPU_API int hpu_run_world_size(const hpu_run *run)
	__attribute__((deprecated("use hpu_run_ctx(run)->world")));
HPU_API long hpu_run_step(const hpu_run *run)
	__attribute__((deprecated("use hpu_run_ctx(run)->step")));
/* The last evaluation's figures: test loss and metric `name` (NAN when
 * none). */
HPU_API double hpu_run_metric(const hpu_run *run, const char *name);
HPU_API int hpu_run_error(hpu_run *run, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* One error recorder: hpu_error(x, fmt, ...) records a printf-formatted
 * error on a builder (setup; sticky), a layer (its forward or backward)
 * or a run (a hook) and returns HPU_ERROR, for the callback to return.
 * It calls the function of x's type: hpu_error (the builder's),
 * hpu_layer_error or hpu_run_error. (C11 _Generic; C++ calls those.) */
#ifndef __cplusplus
#define hpu_error(x, ...)                                                   \
	_Generic((x), hpu_layer *: hpu_layer_error, hpu_run *: hpu_run_error, \
		 default: (hpu_error))((x), __VA_ARGS__)
#endif

/* --- device memory, at any time --- */

/* The worker's device-memory statistics, named as Habana's DeviceStats.
 * Every allocation of the runtime (parameters, gradients, optimizer state,
 * activations, communication buffers) is counted, in bytes. */
typedef struct hpu_device_stats {
	uint64_t limit;               /* Limit: --device-memory */
	uint64_t in_use;              /* InUse: bytes allocated now */
	uint64_t max_in_use;          /* MaxInUse: the peak of InUse */
	uint64_t num_allocs;          /* NumAllocs: allocations so far */
	uint64_t num_frees;           /* NumFrees: frees so far */
	uint64_t active_allocs;       /* ActiveAllocs: NumAllocs - NumFrees */
	uint64_t max_alloc_size;      /* MaxAllocSize: the largest allocation */
	uint64_t total_system_allocs; /* TotalSystemAllocs: blocks taken from
				       * the system (freed blocks are reused) */
	uint64_t total_system_frees;  /* TotalSystemFrees */
	uint64_t total_active_allocs; /* TotalActiveAllocs: system blocks held */
} hpu_device_stats;

/* Fills *out; returns HPU_OK, or HPU_ENODEV when no device memory is
 * set up. */
HPU_API int hpu_device_stats_get(hpu_device_stats *out);

/* --- profiling, at any time (hpulaunch --profile) --- */

/* Opens a range named `action` on the calling thread; it appears in the
 * rank's trace (category "user") from here to hpu_profile_stop(action),
 * which closes the innermost open range of that name. Ranges nest. While
 * the run does not profile, both do nothing and cost a branch. */
HPU_API void hpu_profile_start(const char *action);
HPU_API void hpu_profile_stop(const char *action);

/* The scoped form (GCC and Clang): profiles `action` from here to the end
 * of the enclosing block, however the block is left:
 *
 *     { HPU_PROFILE_SCOPE("my_custom_action"); ...; }
 */
typedef struct hpu_profile_scope {
	const char *action;
} hpu_profile_scope;

static inline void hpu__profile_scope_end(hpu_profile_scope *s)
{
	hpu_profile_stop(s->action);
}

static inline hpu_profile_scope hpu__profile_scope_begin(const char *action)
{
	hpu_profile_start(action);
	hpu_profile_scope s = {action}; /* no compound literal: C++ has none */
	return s;
}

#define HPU__PROFILE_CAT2(a, b) a##b
#define HPU__PROFILE_CAT(a, b) HPU__PROFILE_CAT2(a, b)
#define HPU_PROFILE_SCOPE(action)                                               \
	__attribute__((cleanup(hpu__profile_scope_end), unused))                \
	hpu_profile_scope HPU__PROFILE_CAT(hpu__profile_scope_, __LINE__) =     \
		hpu__profile_scope_begin(action)

#ifdef __cplusplus
}
#endif
#endif
