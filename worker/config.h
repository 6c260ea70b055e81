/* config: the training options, parsed the same way by hpulaunch (which
 * checks them before starting anything and forwards them) and hpu-worker. */
#ifndef HPU_CONFIG_H
#define HPU_CONFIG_H

#include <stdint.h>
#include <stdio.h>

typedef enum hpu_optim_kind {
	HPU_OPTIM_SGD = 0,
	HPU_OPTIM_ADAMW,
} hpu_optim_kind;

typedef enum hpu_strategy {
	HPU_STRATEGY_FAST_DDP = 0,
	HPU_STRATEGY_DDP,
	HPU_STRATEGY_ZERO1,
	HPU_STRATEGY_ZERO2,
	HPU_STRATEGY_ZERO3,
} hpu_strategy;

typedef struct hpu_train_opts {
	int epochs;             /* passes over the training set */
	long max_steps;         /* stop after this many steps; -1: no limit */
	int batch_size;         /* global batch, summed over all ranks */
	double lr;              /* learning rate */
	hpu_optim_kind optimizer;
	double momentum;        /* SGD momentum */
	int nesterov;           /* SGD: Nesterov momentum */
	double weight_decay;    /* < 0: the optimizer's default */
	double beta1, beta2, eps; /* AdamW */
	uint64_t seed;          /* parameter init and data shuffling */
	hpu_strategy strategy;
	int log_every;          /* log every N steps (0: never) */
	char metrics[512];      /* JSON-lines file written by rank 0, or "" */
	int eval;               /* evaluate on the test split at the end */
} hpu_train_opts;

/* Fills o with the defaults (1 epoch, batch 256, AdamW lr 1e-3, ...). */
void hpu_opts_defaults(hpu_train_opts *o);

/* Whether `name` (without leading dashes) is a training option, and
 * whether it takes a value. Returns -1 if it is not one, else 0 or 1. */
int hpu_opts_takes_value(const char *name);

/* Sets option `name` (without dashes) from `value` (NULL for a flag).
 * Returns 0, or -1 with a sentence naming the option and value in err. */
int hpu_opts_set(hpu_train_opts *o, const char *name, const char *value,
		 char *err, size_t errlen);

/* Parses "--name value" / "--name=value" options from argv[*i] on, up to
 * the first argument that is not an option; leaves *i there. */
int hpu_opts_parse(hpu_train_opts *o, int argc, char **argv, int *i,
		   char *err, size_t errlen);

/* Checks the options against a world size (e.g. batch divisibility). */
int hpu_opts_check(const hpu_train_opts *o, int world_size, char *err,
		   size_t errlen);

/* The weight decay in force (resolving the optimizer's default). */
double hpu_opts_weight_decay(const hpu_train_opts *o);

const char *hpu_strategy_name(hpu_strategy s);
const char *hpu_optim_name(hpu_optim_kind k);

/* Prints the training options' help. */
void hpu_opts_help(FILE *f);

#endif
