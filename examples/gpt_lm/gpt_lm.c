/* gpt_lm: a character-level GPT (GPT-2's pre-norm transformer) on the
 * license texts every Debian machine has, built from the layer library.
 *
 * Data: the regular files of /usr/share/common-licenses in name order,
 * concatenated (examples/common/corpus.c); the last 10% is the validation
 * text; the vocabulary is the bytes that occur. A sample is a window of T
 * characters: every window of the training text, the validation text cut
 * into windows that do not overlap. Its fields:
 *   tokens  i32 [T]  the characters' ids
 *   targets i32 [T]  the id that follows each of them
 *   pos     i32 [T]  0 .. T-1, for the learned position embedding
 *
 * The graph, per sample:
 *   x = wte(tokens) + wpe(pos)      two tables N(0, 0.02)       [T, D]
 *   each block:  x = x + dropout(attention(ln1(x)))    causal, H heads
 *                x = x + dropout(fc2(gelu(fc1(ln2(x)))))   D -> 4D -> D
 *   logits = ln_f(x) wte.weight^T                  [T, V], the tied head
 *   loss = the mean over the T positions of -log softmax(logits)[target]
 * The test loss is thus the validation text's cross-entropy in nats per
 * character; a hook after evaluation prints it next to the unigram
 * baseline, and a hook after training generates text.
 *
 * With --tokens FILE the text is instead an llm.c token file (dev/data's
 * .bin: a header of 256 int32: magic 20240520, version 1 and the token
 * count, then uint16 tokens; LLaMA-3's magic 20240801, version 7, uint32
 * tokens), read by <hpu/data.h>;
 * the vocabulary is --vocab N (else the largest token + 1), and nothing
 * is generated (there is no tokenizer to decode with).
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
 *   --gen N           characters to generate after training (200; 0: none;
 *                     none with --tokens)
 *   --temperature X   sampling temperature (0.8; 0: greedy)
 *   --prompt TEXT     the generation's start ("The ")
 *   --gen-seed N      the sampler's seed (1)
 */
#include <hpu/data.h>
#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common/args.h"
#include "examples/common/corpus.h"

#define DEFAULT_DATA "/usr/share/common-licenses"
#define LN_EPS 1e-5f
#define NAME_LEN 24 /* "h<n>.<part>" */

typedef struct args {
	const char *dir, *prompt, *tokens;
	double t, d, heads, layers, dropout, gen, temp, seed, vocab;
	int ckpt;
} args;

/* Windows of T ids starting every `stride` ids from `first`: of the
 * corpus's ids, or of a --tokens file's. */
typedef struct windows {
	const uint8_t *ids;   /* the corpus, or NULL: */
	const hpu_array *tok; /* --tokens: U16 or U32, 1-D */
	size_t first, stride;
	int t;
} windows;

typedef struct lm {
	args a;
	ex_corpus text;
	hpu_array tok; /* --tokens */
	int vocab;
	windows train, val;
	double unigram; /* nats per character (the corpus only) */
} lm;

/* ---- data ---- */

static uint32_t id_at(const windows *w, size_t k)
{
	if (w->ids)
		return w->ids[k];
	if (w->tok->type == HPU_DATA_U16)
		return ((const uint16_t *)w->tok->data)[k];
	return ((const uint32_t *)w->tok->data)[k];
}

static int fetch(void *user, size_t i, void *const *out)
{
	const windows *w = user;
	size_t s = w->first + i * w->stride;
	int32_t *tokens = out[0], *targets = out[1], *pos = out[2];
	for (int t = 0; t < w->t; t++) {
		tokens[t] = (int32_t)id_at(w, s + (size_t)t);
		targets[t] = (int32_t)id_at(w, s + (size_t)t + 1);
		pos[t] = t;
	}
	return 0;
}

/* --tokens FILE: an llm.c token file, through <hpu/data.h>; every token
 * below --vocab, which defaults to the largest + 1. */
static int load_tokens(hpu_builder *b, lm *m)
{
	const char *f = m->a.tokens;
	char err[4200];
	if (hpu_array_load(&m->tok, f, NULL, err, sizeof err) != HPU_OK)
		return hpu_error(b, "--tokens: %s", err);
	if (m->tok.ndim != 1 || (m->tok.type != HPU_DATA_U16 && m->tok.type != HPU_DATA_U32))
		return hpu_error(b, "--tokens %s: not a token file but a %d-dimensional %s array", f,
				 m->tok.ndim, hpu_data_type_name(m->tok.type));
	windows w = {NULL, &m->tok, 0, 1, 0};
	uint32_t most = 0;
	for (size_t k = 0; k < m->tok.count; k++) {
		uint32_t v = id_at(&w, k);
		if (m->a.vocab > 0 && v >= (uint32_t)m->a.vocab)
			return hpu_error(b, "--tokens %s: token %u at position %zu is not below "
					 "--vocab %g", f, v, k, m->a.vocab);
		most = v > most ? v : most;
	}
	if (!(m->a.vocab > 0) && most >= 10000000)
		return hpu_error(b, "--tokens %s: its largest token is %u: give --vocab N", f, most);
	m->vocab = m->a.vocab > 0 ? (int)m->a.vocab : (int)most + 1;
	return 0;
}

/* The training split: every window of the first 90%; the test split: the
 * rest, in non-overlapping windows. */
static int set_data(hpu_builder *b, lm *m)
{
	size_t n = m->a.tokens ? m->tok.count : m->text.n;
	size_t t = (size_t)m->a.t, nval = n / 10, ntrain = n - nval;
	if (ntrain <= t || nval <= t)
		return hpu_error(b, "the %s (%zu %s) is too small for --ctx %zu",
				 m->a.tokens ? "token file" : "corpus", n,
				 m->a.tokens ? "tokens" : "characters", t);
	const uint8_t *ids = m->a.tokens ? NULL : m->text.ids;
	m->train = (windows){ids, &m->tok, 0, 1, (int)t};
	m->val = (windows){ids, &m->tok, ntrain, t, (int)t};
	m->unigram = m->a.tokens ? NAN
				 : ex_unigram_nats(m->text.ids, ntrain, m->text.ids + ntrain,
						   nval, m->text.vocab);
	hpu_dataset ds = {.size = ntrain - t, .nfields = 3, .fetch = fetch, .user = &m->train,
			  .fields = {{"tokens", HPU_I32, 1, {(int64_t)t}},
				     {"targets", HPU_I32, 1, {(int64_t)t}},
				     {"pos", HPU_I32, 1, {(int64_t)t}}}};
	hpu_dataset_set(b, HPU_SPLIT_TRAIN, &ds);
	ds.size = (nval - 1) / t; /* the last window's targets end the text */
	ds.user = &m->val;
	return hpu_dataset_set(b, HPU_SPLIT_TEST, &ds);
}

/* ---- the model ---- */

/* A layer marked for activation checkpointing with --checkpoint. A
 * failed declaration makes the ones after it do nothing (sticky errors):
 * setup's hpu_builder_status() reports it, so none is checked here. */
#define CKPT(call) hpu_layer_checkpoint((call), m->a.ckpt)

/* Block n: the tensor y = block(x). Each layer writes the tensor of its
 * own name, "h<n>.<part>". */
#define PART(v) char v[NAME_LEN]; snprintf(v, sizeof v, "h%d." #v, n)

static void block(hpu_builder *b, const lm *m, int n, const char *x, char *y)
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

static void declare(hpu_builder *b, const lm *m)
{
	char x[NAME_LEN] = "emb", y[NAME_LEN];
	const int64_t d = (int64_t)m->a.d;
	/* GPT-2's N(0, 0.02) tables, not torch's N(0, 1): position vectors
	 * that large drown the tokens', and the head tied to the token table
	 * would start with logits of size sqrt(D) */
	hpu_embedding(b, "wte", "tokens", "wte", (hpu_embedding_opts){.vocab = m->vocab, .dim = d});
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

/* ---- after evaluation: the validation loss ---- */

static int report(hpu_run *run, void *user)
{
	const lm *m = user;
	double loss = hpu_run_metric(run, "test_loss");
	if (hpu_run_ctx(run)->rank == 0 && m->a.tokens)
		printf("validation loss %.4f nats/token (%.3f bits/token)\n", loss, loss / log(2.0));
	else if (hpu_run_ctx(run)->rank == 0)
		printf("validation loss %.4f nats/char (%.3f bits/char; unigram baseline %.4f)\n",
		       loss, loss / log(2.0), m->unigram);
	return 0;
}

/* ---- after training: text generation ---- */

/* A uniform double in [0, 1), splitmix64. */
static double uniform(unsigned long long *state)
{
	unsigned long long z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* The next id from logits z[v]: the arg-max at temperature 0, else a draw
 * from softmax(z / temp). */
static int pick(const float *z, int v, double temp, unsigned long long *rng)
{
	int best = 0;
	for (int c = 1; c < v; c++)
		if (z[c] > z[best])
			best = c;
	if (temp <= 0)
		return best;
	double sum = 0, u;
	for (int c = 0; c < v; c++)
		sum += exp((z[c] - z[best]) / temp);
	u = uniform(rng) * sum;
	for (int c = 0; c < v; c++)
		if ((u -= exp((z[c] - z[best]) / temp)) < 0)
			return c;
	return best;
}

/* Every rank generates the same text (the same forwards, the same draws:
 * hpu_run_forward must be called as often on every rank); rank 0 prints
 * it. Each step feeds the last (up to) T characters, padded after them
 * (the causal model does not look ahead), and draws from the logits at
 * the last one. */
static int generate(hpu_run *run, void *user)
{
	const lm *m = user;
	const int t = (int)m->a.t, v = m->text.vocab;
	const long gen = (long)m->a.gen;
	size_t len = 0, cap = strlen(m->a.prompt) + (size_t)gen + 1;
	uint8_t *ids = malloc(cap);
	char *text = malloc(cap);
	int32_t *fields = calloc(3 * (size_t)t, sizeof *fields);
	unsigned long long rng = (unsigned long long)m->a.seed;
	int rc = HPU_ENOMEM;
	if (!ids || !text || !fields)
		goto out;
	for (const char *p = m->a.prompt; *p; p++) /* bytes not in the text: skipped */
		if (m->text.id_of[(uint8_t)*p] >= 0)
			ids[len++] = (uint8_t)m->text.id_of[(uint8_t)*p];
	if (len == 0)
		ids[len++] = 0;
	size_t start = len;
	int32_t *tokens = fields, *pos = fields + 2 * t; /* targets: unused zeros */
	const void *in[3] = {tokens, fields + t, pos};
	for (int i = 0; i < t; i++)
		pos[i] = i;
	for (long g = 0; g < gen; g++) {
		size_t n = len < (size_t)t ? len : (size_t)t;
		for (size_t i = 0; i < (size_t)t; i++)
			tokens[i] = i < n ? ids[len - n + i] : 0;
		hpu_tensor logits;
		if ((rc = hpu_run_forward(run, in, 1, "logits", &logits)) != HPU_OK)
			goto out;
		ids[len++] = (uint8_t)pick(hpu_f32(&logits) + (n - 1) * v, v, m->a.temp, &rng);
	}
	for (size_t i = 0; i < len; i++)
		text[i] = (char)m->text.chars[ids[i]];
	if (hpu_run_ctx(run)->rank == 0)
		printf("sample (%ld characters after the prompt \"%.*s\", temperature %g):\n%.*s\n",
		       gen, (int)start, text, m->a.temp, (int)len, text);
	rc = HPU_OK;
out:
	if (rc == HPU_ENOMEM)
		hpu_error(run, "out of memory generating %ld characters", gen);
	free(ids), free(text), free(fields);
	return rc;
}

/* ---- arguments and setup ---- */

static int parse_args(hpu_builder *b, int argc, char **argv, args *a)
{
	static const struct {
		const char *name;
		size_t off;
		double lo, hi;
	} nums[] = {
		{"--ctx", offsetof(args, t), 1, 4096},
		{"--dim", offsetof(args, d), 1, 8192},
		{"--heads", offsetof(args, heads), 1, 256},
		{"--layers", offsetof(args, layers), 0, 256},
		{"--dropout", offsetof(args, dropout), 0, 0.99},
		{"--gen", offsetof(args, gen), 0, 1e6},
		{"--temperature", offsetof(args, temp), 0, 100},
		{"--gen-seed", offsetof(args, seed), 0, 1e15},
		{"--vocab", offsetof(args, vocab), 1, 1e7},
	};
	for (int i = 1; i < argc; i++) {
		size_t k, nn = sizeof nums / sizeof nums[0];
		for (k = 0; k < nn; k++)
			if (!strcmp(argv[i], nums[k].name))
				break;
		if (k < nn && i + 1 < argc) {
			double *v = (double *)((char *)a + nums[k].off);
			if (ex_arg_double(b, argv[i], argv[i + 1], nums[k].lo, nums[k].hi, v) < 0)
				return -1;
			i++;
		} else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
			a->dir = argv[++i];
		} else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
			a->tokens = argv[++i];
		} else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) {
			a->prompt = argv[++i];
		} else if (!strcmp(argv[i], "--checkpoint")) {
			a->ckpt = 1;
		} else {
			return hpu_error(b, "unknown model argument %s (model arguments: --data DIR, --tokens FILE, --vocab N, --ctx T, --dim D, --heads H, --layers N, --dropout P, --checkpoint, --gen N, --temperature X, --prompt TEXT, --gen-seed N)",
					 argv[i]);
		}
	}
	if ((long)a->d % (long)a->heads)
		return hpu_error(b, "--dim %g is not a multiple of --heads %g", a->d, a->heads);
	if (a->vocab > 0 && !a->tokens)
		return hpu_error(b, "--vocab is for --tokens FILE (the corpus's vocabulary is its "
				 "bytes)");
	if (a->tokens && a->gen > 0)
		return hpu_error(b, "--gen %g: a --tokens file has no tokenizer here to decode a "
				 "sample with; leave --gen out", a->gen);
	if (a->gen < 0)
		a->gen = a->tokens ? 0 : 200;
	return 0;
}

static void teardown(void *user)
{
	lm *m = user;
	if (m) {
		ex_corpus_free(&m->text);
		hpu_array_free(&m->tok);
	}
	free(m);
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	lm *m = calloc(1, sizeof *m);
	if (!m)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, m);
	m->a = (args){.dir = DEFAULT_DATA, .prompt = "The ", .t = 64, .d = 128, .heads = 4,
		      .layers = 2, .dropout = 0.1, .gen = -1, .temp = 0.8, .seed = 1};
	char err[4200];
	if (parse_args(b, argc, argv, &m->a) < 0)
		return -1;
	if (m->a.tokens && load_tokens(b, m) < 0)
		return -1;
	if (!m->a.tokens && ex_corpus_read(&m->text, m->a.dir, err, sizeof err) < 0)
		return hpu_error(b, "%s", err);
	if (!m->a.tokens)
		m->vocab = m->text.vocab;
	set_data(b, m);
	declare(b, m);
	hpu_hook_after_eval(b, report, m);
	if (m->a.gen > 0)
		hpu_hook_after_train(b, generate, m);
	if (hpu_builder_status(b) != HPU_OK)
		return hpu_builder_status(b);
	if (hpu_rank(b) == 0 && m->a.tokens)
		printf("gpt_lm: %zu tokens from %s (%s), vocabulary %d; T %g, D %g, %g heads, %g "
		       "blocks, dropout %g\n", m->tok.count, m->a.tokens,
		       hpu_data_type_name(m->tok.type), m->vocab, m->a.t, m->a.d, m->a.heads,
		       m->a.layers, m->a.dropout);
	else if (hpu_rank(b) == 0)
		printf("gpt_lm: %zu characters from %d files in %s, vocabulary %d; T %g, D %g, "
		       "%g heads, %g blocks, dropout %g; unigram baseline %.4f nats (%.3f bits) "
		       "per character\n", m->text.n, m->text.files, m->a.dir, m->text.vocab,
		       m->a.t, m->a.d, m->a.heads, m->a.layers, m->a.dropout, m->unigram,
		       m->unigram / log(2.0));
	return hpu_builder_status(b);
}

HPU_MODEL(.name = "gpt_lm", .setup = setup, .teardown = teardown);
