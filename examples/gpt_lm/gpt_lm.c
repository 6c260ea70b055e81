/* gpt_lm: a character-level GPT (GPT-2's pre-norm transformer) on the
 * license texts every Debian machine has, built from the layer library.
 *
 * Data: the regular files of /usr/share/common-licenses in name order,
 * concatenated (examples/common/corpus.c); the last 10% is the test
 * split; the vocabulary is the bytes that occur. A sample is a window of T
 * characters, fields "tokens", "targets" (the next ids) and "pos"
 * (examples/common/lm.h, which also samples the text after training).
 *
 * The graph, per sample:
 *   x = wte(tokens) + wpe(pos)      two tables N(0, 0.02)       [T, D]
 *   each block:  x = x + dropout(attention(ln1(x)))    causal, H heads
 *                x = x + dropout(fc2(gelu(fc1(ln2(x)))))   D -> 4D -> D
 *   logits = ln_f(x) wte.weight^T                  [T, V], the tied head
 *   loss = the mean over the T positions of -log softmax(logits)[target]
 * The test loss is thus the last tenth's cross-entropy in nats a character;
 * a hook after evaluation prints it by the unigram baseline, one after training generates text.
 *
 * With --tokens FILE the text is instead an llm.c token file (dev/data's
 * .bin: a header of 256 int32: magic 20240520, version 1 and the token
 * count, then uint16 tokens; LLaMA-3's magic 20240801, version 7, uint32
 * tokens), read by <hpu/data.h>; the vocabulary is --vocab N (else the
 * largest token + 1); nothing is generated (no tokenizer to decode with).
 *
 * Model arguments (after "--"):
 *   --data DIR        the corpus directory (/usr/share/common-licenses)
 *   --tokens FILE     an llm.c token file instead of the corpus
 *   --vocab N         --tokens: the vocabulary size (the largest token + 1)
 *   --ctx T           context length (64)
 *   --dim D           model width (128)
 *   --heads H         attention heads (4; D must be a multiple)
 *   --layers N        transformer blocks (2)
 *   --dropout P       dropout after attention and after the MLP (0.1)
 *   --checkpoint      activation checkpointing on the blocks
 *   --gen N           characters generated after training (200; 0: none)
 *   --temperature X   sampling temperature (0.8; 0: greedy)
 *   --prompt TEXT     the generation's start ("The ")
 *   --gen-seed N      the sampler's seed (1; not with --temperature 0)
 */
#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common/args.h"
#include "examples/common/lm.h"

#define LN_EPS 1e-5f
#define NAME_LEN 24 /* "h<n>.<part>" */

typedef struct args {
	const char *dir, *prompt, *tokens;
	double t, d, heads, layers, dropout, gen, temp, seed, vocab;
	int ckpt;
} args;

typedef struct gpt { args a; ex_lm lm; } gpt;

/* A layer checkpointed with --checkpoint. No check after a declaration:
 * errors are sticky, setup's hpu_builder_status() reports the first. */
#define CKPT(call) hpu_layer_checkpoint((call), m->a.ckpt)

/* Block n: the tensor y = block(x). Each layer writes the tensor of its
 * own name, "h<n>.<part>". */
#define PART(v) char v[NAME_LEN]; snprintf(v, sizeof v, "h%d." #v, n)

static void block(hpu_builder *b, const gpt *m, int n, const char *x, char *y)
{
	PART(ln1); PART(attn); PART(drop1); PART(res1);
	PART(ln2); PART(fc1); PART(gelu); PART(fc2); PART(drop2);
	char in[2 * HPU_NAME_MAX];
	const int64_t d = (int64_t)m->a.d;
	const hpu_dropout_opts drop = {.p = (float)m->a.dropout};
	snprintf(y, NAME_LEN, "h%d.res2", n);
	CKPT(hpu_layernorm(b, ln1, x, ln1, (hpu_layernorm_opts){.eps = LN_EPS}));
	CKPT(hpu_attention(b, attn, ln1, attn,
			   (hpu_attention_opts){.heads = (int64_t)m->a.heads, .causal = true}));
	CKPT(hpu_dropout(b, drop1, attn, drop1, drop));
	snprintf(in, sizeof in, "%s,%s", x, drop1);
	CKPT(hpu_add(b, res1, in, res1));
	CKPT(hpu_layernorm(b, ln2, res1, ln2, (hpu_layernorm_opts){.eps = LN_EPS}));
	CKPT(hpu_linear(b, fc1, ln2, fc1, (hpu_linear_opts){.out = 4 * d, .bias = true}));
	CKPT(hpu_gelu(b, gelu, fc1, gelu));
	CKPT(hpu_linear(b, fc2, gelu, fc2, (hpu_linear_opts){.out = d, .bias = true}));
	CKPT(hpu_dropout(b, drop2, fc2, drop2, drop));
	snprintf(in, sizeof in, "%s,%s", res1, drop2);
	CKPT(hpu_add(b, y, in, y));
}

static void declare(hpu_builder *b, const gpt *m)
{
	char x[NAME_LEN] = "emb", y[NAME_LEN];
	const int64_t d = (int64_t)m->a.d;
	/* GPT-2's N(0, 0.02) tables, not torch's N(0, 1): position vectors
	 * that large drown the tokens', and the head tied to the token table
	 * would start with logits of size sqrt(D) */
	hpu_embedding(b, "wte", "tokens", "wte", (hpu_embedding_opts){.vocab = m->lm.vocab, .dim = d});
	hpu_embedding(b, "wpe", "pos", "wpe", (hpu_embedding_opts){.vocab = (int64_t)m->a.t, .dim = d});
	hpu_param_init(b, "wte.weight", HPU_INIT(NORMAL, 0, 0.02f));
	hpu_param_init(b, "wpe.weight", HPU_INIT(NORMAL, 0, 0.02f));
	hpu_add(b, "emb", "wte,wpe", "emb");
	for (int n = 0; n < (int)m->a.layers; n++) {
		block(b, m, n, x, y);
		memcpy(x, y, sizeof x);
	}
	hpu_layernorm(b, "ln_f", x, "ln_f", (hpu_layernorm_opts){.eps = LN_EPS});
	hpu_linear_tied(b, "head", "ln_f", "logits", (hpu_linear_tied_opts){.weight = "wte.weight"});
	hpu_cross_entropy(b, "xent", "logits,targets", "xent");
	hpu_loss_add(b, "xent", 1.0f);
}

/* After evaluation: the test split's loss (the corpus's last tenth). */
static int report(hpu_run *run, void *user)
{
	const gpt *m = user;
	double loss = hpu_run_metric(run, "test_loss");
	if (hpu_run_ctx(run)->rank == 0 && m->a.tokens)
		printf("test split's loss %.4f nats/token (%.3f bits/token)\n", loss, loss / log(2.0));
	else if (hpu_run_ctx(run)->rank == 0)
		printf("test split's loss %.4f nats/char (%.3f bits/char; unigram baseline %.4f)\n",
		       loss, loss / log(2.0), m->lm.unigram);
	return 0;
}

#define NUM(name, field, meta, lo, hi) {name, EX_ARG_NUM, offsetof(args, field), meta, lo, hi}
#define INT(name, field, meta, lo, hi) {name, EX_ARG_INT, offsetof(args, field), meta, lo, hi}
#define STR(name, field, meta) {name, EX_ARG_STR, offsetof(args, field), meta, 0, 0}
static const ex_arg arg_table[] = {
	STR("--data", dir, "DIR"), STR("--tokens", tokens, "FILE"), INT("--vocab", vocab, "N", 1, 1e7),
	INT("--ctx", t, "T", 1, 4096), INT("--dim", d, "D", 1, 8192), INT("--heads", heads, "H", 1, 256),
	INT("--layers", layers, "N", 0, 256), NUM("--dropout", dropout, "P", 0, 0.99),
	{"--checkpoint", EX_ARG_FLAG, offsetof(args, ckpt), NULL, 0, 0}, INT("--gen", gen, "N", 0, 1e6),
	NUM("--temperature", temp, "X", 0, 100), STR("--prompt", prompt, "TEXT"),
	INT("--gen-seed", seed, "N", 0, 1e15),
};
static const char default_prompt[] = "The ";
static int parse_args(hpu_builder *b, int argc, char **argv, args *a)
{
	if (ex_args_parse(b, argc, argv, arg_table, sizeof arg_table / sizeof *arg_table, a) < 0)
		return -1;
	if ((long)a->d % (long)a->heads)
		return hpu_error(b, "--dim %g is not a multiple of --heads %g", a->d, a->heads);
	if (a->vocab > 0 && !a->tokens)
		return hpu_error(b, "--vocab is for --tokens FILE (the corpus's vocabulary: its bytes)");
	/* -1s: not given (a value equal to the default passed as not given) */
	if (ex_lm_sample_args(b, a->tokens != NULL, a->gen, a->prompt != default_prompt ? "--prompt"
			      : a->temp >= 0 ? "--temperature" : a->seed >= 0 ? "--gen-seed" : NULL,
			      a->temp, a->seed))
		return -1;
	a->temp = a->temp < 0 ? 0.8 : a->temp;
	a->seed = a->seed < 0 ? 1 : a->seed;
	a->gen = a->gen >= 0 ? a->gen : a->tokens ? 0 : 200;
	return 0;
}

static void teardown(void *user)
{
	gpt *m = user;
	if (m)
		ex_lm_free(&m->lm);
	free(m);
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	gpt *m = calloc(1, sizeof *m);
	if (!m)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, m);
	args *a = &m->a;
	*a = (args){.prompt = default_prompt, .t = 64, .d = 128, .heads = 4, .layers = 2, .dropout = 0.1,
		    .gen = -1, .temp = -1, .seed = -1}; /* -1: not given (parse_args) */
	if (parse_args(b, argc, argv, a) < 0 ||
	    ex_lm_read(b, &m->lm, a->dir, a->tokens, (long)a->vocab) < 0)
		return -1;
	m->lm.prompt = a->prompt, m->lm.gen = (long)a->gen, m->lm.temp = a->temp;
	m->lm.seed = (unsigned long long)a->seed;
	ex_lm_datasets(b, &m->lm, (int)a->t);
	declare(b, m);
	hpu_hook_after_eval(b, report, m);
	if (a->gen > 0)
		hpu_hook_after_train(b, ex_lm_generate, &m->lm);
	if (hpu_builder_status(b) == HPU_OK && hpu_rank(b) == 0 && a->tokens)
		printf("gpt_lm: %zu tokens from %s (%s), vocabulary %d; T %g, D %g, %g heads, %g "
		       "blocks, dropout %g\n", m->lm.tok.count, a->tokens,
		       hpu_data_type_name(m->lm.tok.type), m->lm.vocab, a->t, a->d, a->heads,
		       a->layers, a->dropout);
	else if (hpu_builder_status(b) == HPU_OK && hpu_rank(b) == 0)
		printf("gpt_lm: %zu characters from %d files in %s, vocabulary %d; T %g, D %g, "
		       "%g heads, %g blocks, dropout %g; unigram baseline %.4f nats (%.3f bits) "
		       "per character\n", m->lm.text.n, m->lm.text.files,
		       a->dir ? a->dir : EX_LM_CORPUS, m->lm.vocab, a->t, a->d, a->heads, a->layers,
		       a->dropout, m->lm.unigram, m->lm.unigram / log(2.0));
	return hpu_builder_status(b);
}

HPU_MODEL(.name = "gpt_lm", .setup = setup, .teardown = teardown);
