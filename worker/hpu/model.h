/* model: loads a train.so, runs its setup() through the builder API of
 * <hpu/hpu.h> (ABI 3, and 2: a graph of layers over named tensors), checks and
 * plans the graph. Memory for parameters, buffers and tensors is the
 * strategy's (worker/strategy). */
#ifndef HPU_MODEL_H
#define HPU_MODEL_H

#include <hpu/hpu.h>
#include <stddef.h>

/* A tensor of the graph: a dataset field or a layer's output. */
typedef struct hpu_tinfo {
	char name[HPU_NAME_MAX];
	hpu_dtype dtype;
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
	size_t sample_numel;
	int producer;     /* layer index, or -1: dataset field `field` */
	int field;
	int last_reader;  /* the last layer reading it in forward, or -1 */
	int grad;         /* its gradient is needed (f32, and some parameter
			   * lies upstream of it) */
	int loss, metric; /* read by the runtime as a loss / metric */
} hpu_tinfo;

typedef struct hpu_param_info {
	char name[2 * HPU_NAME_MAX + 1]; /* "layer.param" */
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
	size_t numel;
	size_t offset;    /* in floats, into the declared flat layout */
	size_t rel;       /* in floats, from its layer's first float */
	hpu_init init;
	int layer;        /* the owner */
	int users;        /* layers that use it, the owner included */
} hpu_param_info;

typedef struct hpu_buffer_info {
	char name[2 * HPU_NAME_MAX + 1];
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
	size_t numel;
	size_t offset;    /* in floats, into the flat buffer layout */
	hpu_init init;
	hpu_buffer_sync sync;
	int layer;
} hpu_buffer_info;

struct hpu_layer {
	hpu_builder *b;
	int index;
	char name[HPU_NAME_MAX];
	hpu_layer_ops ops;
	void *user;
	int nin, nout;
	int in[HPU_MAX_IO], out[HPU_MAX_IO]; /* tensor ids */
	/* Parameters: the layer's k-th is params[pidx[k]]; its own ones are
	 * b->params[first_param .. first_param + nparams) (owner == this). */
	int *pidx, npidx;
	int first_param, nparams;
	int *uses, nuses;     /* the other layers whose parameters it uses */
	int first_buffer, nbuffers;
	size_t decl_off;      /* first float in the declared layout */
	size_t plen;          /* floats of its own parameters, each padded to 16 */
	size_t saved_ps, saved_fixed, scratch_ps, scratch_fixed;
	int ckpt;             /* marked for activation checkpointing */
	int params_in_ops;    /* hpu_layer_params_in_ops() */
	int grads_in_ops;     /* hpu_layer_grads_in_ops() */
	unsigned reads_in, reads_out; /* what its backward reads, bit k for
				       * in[k] / out[k] (hpu_layer_backward_reads;
				       * every bit set until it is called) */
	unsigned in_place;    /* bit k: its backward may write din[k] over
			       * in[k] (hpu_layer_backward_in_place) */
	unsigned linear_in;   /* bit k: its backward reads in[k] only as
			       * hpu_linear_backward's x (..._reads_linear) */
	hpu_layer_device device; /* ops.device (ABI 3; ABI 2: any device) */
	int backward;         /* its backward must run (parameters, or an
			       * input that needs a gradient) */
	int for_loss;         /* training runs it: a loss depends on it */
	int for_eval;         /* evaluation runs it (losses and metrics) */
	/* Set by the strategy: where the layer's own parameters and
	 * gradients are now (its parameter i is pbase + rel of it), its
	 * buffers, saved and scratch memory, and its first float in the
	 * strategy's layout. */
	float *pbase, *gbase, *bbase;
	void *saved, *scratch;
	size_t off;
	int unit;             /* the strategy's unit holding it, or -1 */
	char err[256];
};

typedef struct hpu_hook_ent {
	hpu_hook fn;
	void *user;
} hpu_hook_ent;

typedef struct hpu_loss_ent {
	int tensor;
	float weight;
} hpu_loss_ent;

typedef struct hpu_metric_ent {
	char name[HPU_NAME_MAX];
	int tensor;
} hpu_metric_ent;

/* The builder's phase. Declarations (hpu_layer_add, hpu_param_add, ...)
 * belong in setup; parameters, gradients, buffers and a layer's saved and
 * scratch memory (hpu_param, ...) exist once setup has returned and the
 * strategy has placed them. A call in the other phase is refused naming
 * the call and the phase (model.c, wrong_phase). */
typedef enum hpu__phase {
	HPU__PHASE_SETUP = 0, /* a new builder; setup() runs */
	HPU__PHASE_RUN = 1,   /* after setup: training, evaluation, hooks */
} hpu__phase;

struct hpu_builder {
	int rank, world, max_batch;
	hpu__phase phase;
	uint32_t abi;      /* the model's ABI version (2 or 3) */
	int status;        /* HPU_OK, or the first setup error's code: from
			    * then on declarations do nothing (sticky) */
	/* calls made while the model runs that belong in setup: each
	 * fails the layer's forward or backward, or the hook, that made it,
	 * though it went on (it returned 0: the mistake was silent) */
	long late_calls;
	void *dl;
	const hpu_model *model;
	size_t model_size; /* bytes of the entry symbol (its ELF st_size) */
	char path[512];
	struct hpu_layer **layers;
	int nlayers;
	hpu_tinfo *tensors;
	int ntensors;
	hpu_param_info *params;
	int nparams;
	hpu_buffer_info *buffers;
	int nbuffers;
	size_t buffer_numel;  /* floats of all buffers, each padded to 16 */
	hpu_dataset data[2];
	char field_names[HPU_MAX_IO][HPU_NAME_MAX];
	int has_data[2];
	size_t overlap[2];    /* hpu_dataset_overlap's span (0: none said) */
	hpu_loss_ent loss[HPU_MAX_IO];
	int nloss;
	hpu_metric_ent metrics[HPU_MAX_IO];
	int nmetrics;
	hpu_hook_ent after_eval[4], after_train[4];
	int nafter_eval, nafter_train;
	void *user;
	size_t numel;      /* parameter floats, each parameter padded to 16 */
	size_t psi;        /* parameter floats, unpadded (the ZeRO paper's Ψ) */
	uint64_t *load_at; /* --load-params by name: parameter i's byte offset in the file; NULL: raw order */
	char err[512];
};

/* What a hook gets (hpu_run_*, worker/hpu/run.c); the runtime fills it. */
struct hpu_run {
	hpu_builder *b;
	int rank, world;
	long step;
	hpu_ctx ctx;          /* hpu_run_ctx(): the strategy's, as a hook's */
	const float *params;  /* every parameter, consolidated, in the
			       * canonical order (unpadded, declared order) */
	const float *buffers; /* the builder's buffer layout, or NULL */
	int evaluated;        /* the figures below are set */
	double test_loss, metric[HPU_MAX_IO];
	int (*forward)(hpu_run *run, const void *const *fields, int batch, const char *tensor,
		       hpu_tensor *out);
	void *impl;           /* the runtime's */
	char err[512];
};

/* The hpu_run a hook runs with, set by the runtime while it runs (NULL
 * otherwise): hpu_run_* refuse any other, saying why on stderr (a NULL
 * one, or one a model kept after its hook returned, crashed the worker). */
extern hpu_run *hpu__run_live;

/* Loads the model at `path`: dlopen, the entry symbol, the ABI version.
 * `max_batch` is what hpu_max_batch() tells setup. On failure returns -1
 * with a sentence saying which check failed. */
int hpu__model_load(hpu_builder **out, const char *path, int rank, int world,
		    int max_batch, char *err, size_t errlen);

/* The model's declared training defaults (hpu_model.defaults): NULL for
 * an ABI 2 model, an in-process one, or an entry symbol too small to hold
 * them (a model built before they existed). Set max_batch (b->max_batch)
 * after applying them: the batch sizes depend on them. */
const hpu_train_defaults *hpu__model_defaults(const hpu_builder *b);

/* A builder with no library behind it, for tests that declare a graph
 * in-process (hpu__model_setup_fn runs their setup). NULL when out of
 * memory. */
hpu_builder *hpu__model_new(int rank, int world, int max_batch);

/* Runs the model's setup() and checks and plans what it declared (the
 * datasets and a loss present, tensors read exist and were declared
 * before, what runs in training and evaluation, which tensors need
 * gradients). */
int hpu__model_setup(hpu_builder *b, int argc, char **argv, char *err,
		     size_t errlen);
/* The same with a setup function of the caller's. */
int hpu__model_setup_fn(hpu_builder *b, int (*setup)(hpu_builder *, int, char **),
			int argc, char **argv, char *err, size_t errlen);

/* Why a model's function (setup, a layer's forward or backward, a hook)
 * failed: the message it recorded (its layer's `lerr` when not NULL, else
 * the builder's), or, where it recorded none, the code it returned
 * ("it returned -2 (Invalid argument.) without a message (hpu_error
 * records one)"). Returns buf or a recorded message. */
const char *hpu__model_why(const hpu_builder *b, const char *lerr, int rc, char *buf, size_t n);

/* The tensor named `name`, or -1. */
int hpu__model_tensor(const hpu_builder *b, const char *name);
/* The parameter / buffer named `name`, or -1. */
int hpu__model_param(const hpu_builder *b, const char *name);
int hpu__model_buffer(const hpu_builder *b, const char *name);

/* fan_in / fan_out of a shape, as torch.nn.init computes them. */
void hpu__model_fans(int ndim, const int64_t *shape, size_t *fan_in, size_t *fan_out);

/* Fills w[numel] from `init` (name, shape for the fans and messages)
 * with the generator seeded by (seed, stream). `fans_of` (NULL: `shape`)
 * is the shape the fans come from: for a bias, its layer's weight's
 * (hpu__model_init_layer). Returns 0, or -1 with a sentence in err (a
 * custom initializer failed). */
int hpu__model_init_values(const hpu_init *init, const char *name, int ndim,
			   const int64_t *shape, size_t numel, uint64_t seed,
			   uint64_t stream, const hpu_param_info *fans_of, float *w,
			   char *err, size_t errlen);

/* Writes layer `li`'s own parameters, initialized with `seed`, to dst[0
 * .. plen) (padding zeroed). Every rank computes the same values. 0, or
 * -1 with err. */
int hpu__model_init_layer(hpu_builder *b, int li, uint64_t seed, float *dst,
			  char *err, size_t errlen);

/* Every buffer's initial values into dst[0 .. buffer_numel). */
int hpu__model_init_buffers(hpu_builder *b, uint64_t seed, float *dst, char *err,
			    size_t errlen);

/* --load-params: opens a file of consolidated fp32 parameters (what
 * --save-params writes: every parameter's floats unpadded, in declaration
 * order) and checks that its size fits the model. Returns the descriptor,
 * or -1 with a sentence in err. */
int hpu__model_params_open(hpu_builder *b, const char *path, char *err, size_t errlen);

/* Reads layer li's own parameters from that file into dst[0 .. plen)
 * (padding zeroed). Returns 0, or -1 on a read error. */
int hpu__model_read_layer(hpu_builder *b, int li, int fd, float *dst);

/* Calls teardown, frees everything and unloads the library; *b = NULL. */
void hpu__model_destroy(hpu_builder **b);

#endif
