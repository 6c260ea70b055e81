/* hpu.h: the contract between a model (train.so) and the hputrain runtime.
 *
 * A model is a shared library that exports one symbol, `hpu_model_entry`,
 * an hpu_model whose abi_version is HPU_ABI_VERSION (use HPU_MODEL()).
 * The runtime calls its setup() once per worker; setup declares
 *   - a sequence of layers, each with its parameters and its forward and
 *     backward callbacks;
 *   - the train and test datasets (size + "fetch sample i");
 *   - the loss (and optionally a metric such as accuracy).
 * The runtime owns all parameter, gradient and activation memory (flat
 * buffers; each parameter is a view), the data sampling, the training loop,
 * communication and the optimizer. The model owns the math.
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

#define HPU_ABI_VERSION 1u
#define HPU_MODEL_ENTRY_SYMBOL "hpu_model_entry"
#define HPU_MAX_DIMS 4

/* Errors. These functions return HPU_OK (0) or one of the codes below:
 * hpu_param_add (the index on success), hpu_dataset_set, hpu_loss_set,
 * hpu_layer_checkpoint, hpu_error, hpu_layer_error, hpu_device_stats_get,
 * and in ops.h hpu_embedding_forward and hpu_autocast_init. The codes are
 * negative, as the -1 they replace was, so a model that tests `rc < 0`
 * reads them right under the same ABI version (one that tested `== -1`
 * should test `< 0`). A model's callbacks may return them too: the
 * runtime takes any non-zero return as a failure. */
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
} hpu_err;

/* A static sentence naming an hpu_err code ("Unknown error code." for
 * any other value). */
HPU_API const char *hpu_strerror(int err);

typedef struct hpu_builder hpu_builder; /* the runtime, during setup */
typedef struct hpu_layer hpu_layer;     /* one declared layer */

typedef enum hpu_init {
	HPU_INIT_ZEROS = 0,
	HPU_INIT_ONES,
	/* U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = product of shape[1..];
	 * for a 1-D parameter (a bias) fan_in is the layer's in_size. This is
	 * what torch.nn.Linear does by default. */
	HPU_INIT_FAN_IN_UNIFORM,
} hpu_init;

typedef enum hpu_split {
	HPU_SPLIT_TRAIN = 0,
	HPU_SPLIT_TEST,
} hpu_split;

typedef struct hpu_layer_ops {
	/* out[batch, out_size] = f(in[batch, in_size]). Return 0, or -1 after
	 * hpu_layer_error(). */
	int (*forward)(hpu_layer *layer, const float *in, float *out, int batch);
	/* Given the forward's in and out and dout = dL/dout, ACCUMULATE into
	 * the parameter gradients (hpu_grad) and WRITE din = dL/din. din is
	 * NULL for the first layer. Return 0, or -1 after hpu_layer_error(). */
	int (*backward)(hpu_layer *layer, const float *in, const float *out,
			const float *dout, float *din, int batch);
} hpu_layer_ops;

typedef struct hpu_dataset {
	size_t size;        /* number of samples */
	size_t sample_size; /* floats of input per sample */
	size_t label_size;  /* int32 labels per sample (at least 1) */
	/* Writes sample `index` (< size) into x[sample_size] and
	 * labels[label_size]. Training batches are fetched on the runtime's
	 * loader thread while the layers compute, so fetch must not touch
	 * state the layers use; calls never overlap each other. Returns 0,
	 * or -1 on failure. */
	int (*fetch)(void *user, size_t index, float *x, int32_t *labels);
	void *user;
} hpu_dataset;

typedef struct hpu_loss {
	/* Mean loss of out[batch, out_size] against labels; writes
	 * dout = d(mean loss)/d(out). Returns a negative value on bad labels. */
	float (*loss)(void *user, const float *out, const int32_t *labels,
		      float *dout, int batch);
	/* Optional: the metric's numerator for a batch (e.g. the number of
	 * correct predictions); the runtime sums it over all test samples and
	 * ranks and divides by the number of samples. */
	double (*metric)(void *user, const float *out, const int32_t *labels,
			 int batch);
	const char *metric_name; /* e.g. "accuracy" */
	void *user;
} hpu_loss;

typedef struct hpu_model {
	uint32_t abi_version; /* HPU_ABI_VERSION */
	const char *name;
	/* Declares the model. argv holds the model arguments (after "--"),
	 * argv[0] being the model's path. Returns 0, or -1 after
	 * hpu_error(). */
	int (*setup)(hpu_builder *b, int argc, char **argv);
	/* Optional: frees what setup() made; gets hpu_set_user()'s pointer. */
	void (*teardown)(void *user);
} hpu_model;

#define HPU_EXPORT HPU_API /* the model's entry symbol: visible */

/* Defines the model's entry symbol: HPU_MODEL(.name = "mlp", .setup = f). */
#define HPU_MODEL(...)                                                      \
	HPU_EXPORT const hpu_model hpu_model_entry = {                      \
		.abi_version = HPU_ABI_VERSION, __VA_ARGS__}

/* --- during setup --- */

/* Adds a layer after the previous one; its in_size must equal the previous
 * layer's out_size (the first layer's, the dataset's sample_size).
 * Returns NULL (and records an error) on bad arguments. */
HPU_API hpu_layer *hpu_layer_add(hpu_builder *b, const char *name, size_t in_size,
			 size_t out_size, const hpu_layer_ops *ops, void *user);

/* Declares a parameter of `layer`; returns its index in the layer (0, 1,
 * ...), or HPU_EINVAL (bad arguments) or HPU_ENOMEM, the error recorded. */
HPU_API int hpu_param_add(hpu_layer *layer, const char *name, int ndim,
		  const int64_t *shape, hpu_init init);

/* Sets a dataset split. The struct is copied; `user` stays the model's.
 * Returns HPU_OK, or HPU_EINVAL (error recorded). */
HPU_API int hpu_dataset_set(hpu_builder *b, hpu_split split, const hpu_dataset *ds);

/* Sets the loss. The struct is copied. Returns HPU_OK, or HPU_EINVAL
 * (error recorded). */
HPU_API int hpu_loss_set(hpu_builder *b, const hpu_loss *loss);

/* Keeps a pointer that teardown() gets back. */
HPU_API void hpu_set_user(hpu_builder *b, void *user);

/* Records a setup error (printf format); returns HPU_ERROR (-1). */
HPU_API int hpu_error(hpu_builder *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

HPU_API int hpu_rank(const hpu_builder *b);
HPU_API int hpu_world_size(const hpu_builder *b);

/* Marks `layer` for activation checkpointing: its output is not kept
 * through the forward pass when the next layer is marked too; backward
 * recomputes a run of marked layers from the run's input. Costs one more
 * forward of those layers; saves their activation memory. Returns
 * HPU_OK. */
HPU_API int hpu_layer_checkpoint(hpu_layer *layer, int on);

/* --- inside forward/backward --- */

/* The parameter / its gradient, as a view into the runtime's flat buffers.
 * Valid from the first forward on. */
HPU_API float *hpu_param(hpu_layer *layer, int index);
HPU_API float *hpu_grad(hpu_layer *layer, int index);
HPU_API void *hpu_layer_user(hpu_layer *layer);
HPU_API const char *hpu_layer_name(const hpu_layer *layer);

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
	return (hpu_profile_scope){action};
}

#define HPU__PROFILE_CAT2(a, b) a##b
#define HPU__PROFILE_CAT(a, b) HPU__PROFILE_CAT2(a, b)
#define HPU_PROFILE_SCOPE(action)                                               \
	__attribute__((cleanup(hpu__profile_scope_end), unused))                \
	hpu_profile_scope HPU__PROFILE_CAT(hpu__profile_scope_, __LINE__) =     \
		hpu__profile_scope_begin(action)

/* Records a layer error (printf format); returns HPU_ERROR (-1). */
HPU_API int hpu_layer_error(hpu_layer *layer, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
