/* runlib: building and running an hpulaunch command line of the MLP
 * model in the integration tests (cmocka assertions inside). */
#ifndef HPU_TEST_RUNLIB_H
#define HPU_TEST_RUNLIB_H

#include <stddef.h>

#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
/* the MLP with the fault knobs and a probe layer (tests/fixtures/fault_mlp.c) */
#define FAULT_MODEL h_build("lib/fault_mlp.so")
#define MAXARGS 64

typedef struct run {
	const char *argv[MAXARGS];
	int n;
} run;

/* Appends one argument / a NULL-terminated list of them. */
void arg(run *r, const char *a);
void args(run *r, ...);

/* hpulaunch -q --devices N --no-eval --log-every 0: options follow with
 * arg()/args(). */
void start(run *r, int devices);

/* Runs it with the MLP and model arguments (space-separated, or NULL);
 * asserts exit code `want`; returns the output (caller frees). */
char *finish(run *r, int want, const char *model_args);
/* The same with another model (a path). */
char *finish_with(run *r, int want, const char *model, const char *model_args);

/* The parameters a run saved with --save-params, safetensors or raw
 * (caller frees). */
float *load_params(const char *path, size_t *n);

/* A tmpfs of `size` (mount's size=, e.g. "40k") mounted at mnt, made
 * first: the full-disk cases. Skips the test where this is not root;
 * fails where the mount does. The caller unmounts it. */
void mount_small_fs(const char *mnt, const char *size);

/* Whether files a and b hold the same bytes (cmp -s). */
int files_same(const char *a, const char *b);

/* Fails the test, showing out, where it lacks text. */
void out_has(const char *out, const char *text);

#endif
