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
	size_t offset;           /* in floats, into the flat buffers */
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
	float *param_buf;  /* numel floats */
	float *grad_buf;   /* numel + extra floats */
	size_t numel;      /* total parameter floats */
	size_t grad_extra; /* floats after the gradients, for the runtime */
	char err[512];
};

/* Loads the model at `path`: dlopen, the entry symbol, the ABI version.
 * On failure returns -1 with a sentence saying which check failed. */
int hpu__model_load(hpu_builder **out, const char *path, int rank, int world,
		    char *err, size_t errlen);

/* Runs the model's setup() and checks what it declared (layer sizes chain,
 * datasets and loss present), then allocates the flat buffers with
 * `grad_extra` spare floats after the gradients. */
int hpu__model_setup(hpu_builder *b, int argc, char **argv, size_t grad_extra,
		     char *err, size_t errlen);

/* Initializes every parameter from its initializer with `seed`. */
void hpu__model_init_params(hpu_builder *b, uint64_t seed);

/* Calls teardown, frees everything and unloads the library; *b = NULL. */
void hpu__model_destroy(hpu_builder **b);

#endif
