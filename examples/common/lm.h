/* lm: what a language model example needs besides its graph: the text
 * (a directory of text files as characters, examples/common/corpus.h, or
 * an llm.c token file through <hpu/data.h>) cut into windows of T ids as
 * the train and test splits, and sampling text from the trained model.
 *
 * A sample is a window of T ids: every window of the first 90% of the
 * text for training, the rest cut into windows that do not overlap for
 * the test split. Its fields:
 *   tokens  i32 [T]  the ids
 *   targets i32 [T]  the id that follows each of them
 *   pos     i32 [T]  0 .. T-1, for a learned position embedding
 */
#ifndef EXAMPLES_LM_H
#define EXAMPLES_LM_H

#include <hpu/data.h>
#include <hpu/hpu.h>

#include "examples/common/corpus.h"

/* Windows of t ids starting every `stride` ids from `first`: of the
 * corpus's ids, or of a token file's. */
typedef struct ex_windows {
	const uint8_t *ids;   /* the corpus, or NULL: */
	const hpu_array *tok; /* the token file: U16 or U32, 1-D */
	size_t first, stride;
	int t;
} ex_windows;

typedef struct ex_lm {
	const char *tokens; /* the token file, or NULL: the corpus */
	const char *dir;    /* the corpus's directory (ex_lm_read) */
	ex_corpus text;
	hpu_array tok;
	int vocab;          /* ids are 0 .. vocab-1 */
	ex_windows train, val;
	double unigram;     /* the corpus's unigram baseline, nats per
			     * character (NAN for a token file) */
	/* generation (the corpus only): ex_lm_generate */
	const char *prompt;
	long gen;           /* characters to generate */
	double temp;        /* 0: greedy */
	unsigned long long seed;
} ex_lm;

/* The corpus directory without --data. */
#define EX_LM_CORPUS "/usr/share/common-licenses"

/* Reads the text: the token file `tokens` (every token below `vocab`;
 * vocab 0: the largest + 1) or, with tokens NULL, the corpus in dir
 * (NULL: EX_LM_CORPUS). Both given is refused (--data and --tokens).
 * Returns 0, or hpu_error's -1 naming the file. */
int ex_lm_read(hpu_builder *b, ex_lm *m, const char *dir, const char *tokens, long vocab);

/* The sample's arguments against what is sampled: --gen N > 0 with
 * --tokens (no tokenizer to decode a sample), or `given` (the name of a
 * sample option given: --prompt, --temperature, --gen-seed; NULL: none)
 * with nothing sampled (--tokens, or gen 0), are refused; so is a
 * --gen-seed (seed >= 0: given) with --temperature 0 (greedy: no draw).
 * -1 after hpu_error. */
int ex_lm_sample_args(hpu_builder *b, int tokens, double gen, const char *given, double temp,
		      double seed);

/* Declares the train and test splits of windows of t ids (and computes
 * the unigram baseline). Returns the builder's status. */
int ex_lm_datasets(hpu_builder *b, ex_lm *m, int t);

/* A hook (hpu_hook_after_train, user = the ex_lm) that generates m->gen
 * characters after m->prompt from the model's "logits" [T, vocab] at
 * temperature m->temp. Every rank runs the same forwards and draws; rank
 * 0 prints the text. */
int ex_lm_generate(hpu_run *run, void *user);

/* Frees what ex_lm_read read. */
void ex_lm_free(ex_lm *m);

#endif
