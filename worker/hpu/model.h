/* model: loads a train.so, runs its setup() through the builder API of
 * <hpu/hpu.h>, and owns the flat parameter and gradient buffers. */
#ifndef HPU_MODEL_H
#define HPU_MODEL_H

#include <hpu/hpu.h>
#include <stddef.h>

typedef struct hpu_param_info {
	char name[160];          /* "layer.param" */
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
	size_t numel;
	size_t offset;           /* in floats, into the declared flat layout */
	size_t rel;              /* in floats, from its layer's first float */
	hpu_init init;
	size_t fan_in;
} hpu_param_info;

struct hpu_layer {
	hpu_builder *b;
	char name[64];
	size_t in_size, out_size; /* floats per sample */
	hpu_layer_ops ops;
	void *user;
	int first_param, nparams; /* into b->params */
	size_t decl_off;         /* first float in the declared layout */
	size_t plen;             /* floats of its parameters, each padded to 16 */
	/* Set by the strategy: where the layer's parameters and gradients
	 * are now (hpu_param(l, i) is pbase + rel of parameter i), and the
	 * layer's first float in the strategy's layout. */
	float *pbase, *gbase;
	size_t off;
	int unit;                /* the strategy's unit holding it, or -1 */
	int ckpt;                /* activation checkpointing */
	char err[256];
};

struct hpu_builder {
	int rank, world;
	void *dl;
	const hpu_model *model;
	char path[512];
	struct hpu_layer **layers;
	int nlayers;
	hpu_param_info *params;
	int nparams;
	hpu_dataset data[2];
	int has_data[2];
	hpu_loss loss;
	int has_loss;
	void *user;
	size_t numel;      /* parameter floats, each parameter padded to 16 */
	size_t psi;        /* parameter floats, unpadded (the ZeRO paper's Ψ) */
	char err[512];
};

/* Loads the model at `path`: dlopen, the entry symbol, the ABI version.
 * On failure returns -1 with a sentence saying which check failed. */
int hpu__model_load(hpu_builder **out, const char *path, int rank, int world,
		    char *err, size_t errlen);

/* Runs the model's setup() and checks what it declared (layer sizes chain,
 * datasets and loss present). Memory for parameters is the strategy's. */
int hpu__model_setup(hpu_builder *b, int argc, char **argv, char *err,
		     size_t errlen);

/* Writes layer `li`'s parameters, initialized from their initializers with
 * `seed`, to dst[0 .. plen) (padding zeroed). Every rank computes the same
 * values. */
void hpu__model_init_layer(hpu_builder *b, int li, uint64_t seed, float *dst);

/* --load-params: opens a file of consolidated fp32 parameters (what
 * --save-params writes: every parameter's floats unpadded, in declaration
 * order) and checks that its size fits the model. Returns the descriptor,
 * or -1 with a sentence in err. */
int hpu__model_params_open(hpu_builder *b, const char *path, char *err, size_t errlen);

/* Reads layer li's parameters from that file into dst[0 .. plen) (padding
 * zeroed), as hpu__model_init_layer would initialize them. Returns 0, or
 * -1 on a read error. */
int hpu__model_read_layer(hpu_builder *b, int li, int fd, float *dst);

/* Calls teardown, frees everything and unloads the library; *b = NULL. */
void hpu__model_destroy(hpu_builder **b);

#endif
