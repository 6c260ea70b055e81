/* The files of --save-params and --load-params: safetensors (one F32
 * tensor per parameter, named "layer.param" as the model declares it) or
 * the raw array (every parameter's floats, unpadded, in declaration
 * order). */
#ifndef HPU_STRATEGY_PARAMS_FILE_H
#define HPU_STRATEGY_PARAMS_FILE_H

#include <stdio.h>

#include "worker/hpu/model.h"

/* Whether --save-params-format `format` (HPU_PARAMS_*) writes
 * safetensors to `path`. */
int hpu__params_is_safetensors(int format, const char *path);

/* Before the floats: the safetensors header of b's parameters into f when
 * the format says so (nothing for raw). 0, or -1 with errno. */
int hpu__params_write_header(hpu_builder *b, FILE *f, int format, const char *path);

/* --load-params: opens path, safetensors or raw. A safetensors file is
 * matched by name: every parameter must be there as F32 of its shape, and
 * every tensor must be a parameter's (or a buffer's, which is skipped);
 * b->load_at then says where each one is. Returns the descriptor for
 * hpu__model_read_layer, or -1 with a sentence naming the tensor in err. */
int hpu__params_open(hpu_builder *b, const char *path, char *err, size_t errlen);

#endif
