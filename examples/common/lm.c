/* lm: see lm.h. */
#include "examples/common/lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t id_at(const ex_windows *w, size_t k)
{
	if (w->ids)
		return w->ids[k];
	if (w->tok->type == HPU_DATA_U16)
		return ((const uint16_t *)w->tok->data)[k];
	return ((const uint32_t *)w->tok->data)[k];
}

static int fetch(void *user, size_t i, void *const *out)
{
	const ex_windows *w = user;
	size_t s = w->first + i * w->stride;
	int32_t *tokens = out[0], *targets = out[1], *pos = out[2];
	for (int t = 0; t < w->t; t++) {
		tokens[t] = (int32_t)id_at(w, s + (size_t)t);
		targets[t] = (int32_t)id_at(w, s + (size_t)t + 1);
		pos[t] = t;
	}
	return 0;
}

/* An llm.c token file, through <hpu/data.h>; every token below vocab,
 * which defaults to the largest + 1. */
static int read_tokens(hpu_builder *b, ex_lm *m, const char *f, long vocab)
{
	char err[4200];
	if (hpu_array_load(&m->tok, f, NULL, err, sizeof err) != HPU_OK)
		return hpu_error(b, "--tokens: %s", err);
	if (m->tok.ndim != 1 || (m->tok.type != HPU_DATA_U16 && m->tok.type != HPU_DATA_U32))
		return hpu_error(b, "--tokens %s: not a token file but a %d-dimensional %s array", f,
				 m->tok.ndim, hpu_data_type_name(m->tok.type));
	ex_windows w = {NULL, &m->tok, 0, 1, 0};
	uint32_t most = 0;
	for (size_t k = 0; k < m->tok.count; k++) {
		uint32_t v = id_at(&w, k);
		if (vocab > 0 && v >= (uint32_t)vocab)
			return hpu_error(b, "--tokens %s: token %u at position %zu is not below "
					 "--vocab %ld", f, v, k, vocab);
		most = v > most ? v : most;
	}
	if (vocab <= 0 && most >= 10000000)
		return hpu_error(b, "--tokens %s: its largest token is %u: give --vocab N", f, most);
	m->vocab = vocab > 0 ? (int)vocab : (int)most + 1;
	return 0;
}

int ex_lm_read(hpu_builder *b, ex_lm *m, const char *dir, const char *tokens, long vocab)
{
	char err[4200];
	m->tokens = tokens;
	if (tokens && dir)
		return hpu_error(b, "--data %s and --tokens %s: the text comes from one of them; "
				 "give one", dir, tokens);
	if (!dir)
		dir = EX_LM_CORPUS;
	m->dir = dir;
	if (tokens)
		return read_tokens(b, m, tokens, vocab);
	if (ex_corpus_read(&m->text, dir, err, sizeof err) < 0)
		return hpu_error(b, "%s", err);
	m->vocab = m->text.vocab;
	return 0;
}

int ex_lm_datasets(hpu_builder *b, ex_lm *m, int t)
{
	size_t n = m->tokens ? m->tok.count : m->text.n;
	size_t ut = (size_t)t, nval = n / 10, ntrain = n - nval;
	/* n / 10 > t needs n >= 10 (t + 1), and then n - n / 10 > t too */
	if (ntrain <= ut || nval <= ut)
		return hpu_error(b, "the %s %s (%zu %s) is too small for --ctx %zu: it needs at least "
				 "%zu %s (the last tenth is held out for validation, and it and the "
				 "rest must each be longer than --ctx)",
				 m->tokens ? "token file" : "corpus in", m->tokens ? m->tokens : m->dir,
				 n, m->tokens ? "tokens" : "characters", ut, 10 * (ut + 1),
				 m->tokens ? "tokens" : "characters");
	const uint8_t *ids = m->tokens ? NULL : m->text.ids;
	m->train = (ex_windows){ids, &m->tok, 0, 1, t};
	m->val = (ex_windows){ids, &m->tok, ntrain, ut, t};
	m->unigram = m->tokens ? NAN
			       : ex_unigram_nats(m->text.ids, ntrain, m->text.ids + ntrain, nval,
						 m->text.vocab);
	hpu_dataset ds = {.size = ntrain - ut, .nfields = 3, .fetch = fetch, .user = &m->train,
			  .fields = {{"tokens", HPU_I32, 1, {t}},
				     {"targets", HPU_I32, 1, {t}},
				     {"pos", HPU_I32, 1, {t}}}};
	hpu_dataset_set(b, HPU_SPLIT_TRAIN, &ds);
	/* a window at every token: windows up to t apart share tokens */
	hpu_dataset_overlap(b, HPU_SPLIT_TRAIN, ut + 1);
	ds.size = (nval - 1) / ut; /* the last window's targets end the text */
	ds.user = &m->val;
	hpu_dataset_set(b, HPU_SPLIT_TEST, &ds);
	return hpu_builder_status(b);
}

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

/* Byte c as a C string literal writes it, into buf[8]. */
static const char *shown(uint8_t c, char *buf)
{
	if (c == '\n' || c == '\t' || c == '"' || c == '\\')
		snprintf(buf, 8, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : c);
	else if (c < 0x20 || c >= 0x7f)
		snprintf(buf, 8, "\\x%02x", c);
	else
		snprintf(buf, 8, "%c", c);
	return buf;
}

int ex_lm_sample_args(hpu_builder *b, int tokens, double gen, const char *given, double temp,
		      double seed)
{
	if (tokens && gen > 0)
		return hpu_error(b, "--gen %g: a --tokens file has no tokenizer here to decode a "
				 "sample with; leave --gen out", gen);
	if (given && (tokens || gen == 0)) /* taken in silence */
		return hpu_error(b, "%s: %s; leave it out", given,
				 tokens ? "a --tokens file has no sample to generate (no tokenizer to "
					  "decode one)"
					: "--gen 0 generates no sample");
	if (temp == 0 && seed >= 0)
		return hpu_error(b, "--gen-seed: --temperature 0 samples greedily (the likeliest "
				 "character each time), which no seed changes; leave it out");
	return 0;
}

/* The length of the UTF-8 character at s[0 .. n) that a terminal shows
 * (2 to 4 bytes, not a C1 control U+0080..U+009F, an overlong form or a
 * surrogate), else 0. */
static size_t utf8_shown(const uint8_t *s, size_t n)
{
	size_t len = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
	if (s[0] >= 0xf5 || len == 0 || len > n)
		return 0;
	uint32_t cp = s[0] & (0x7f >> len);
	for (size_t k = 1; k < len; k++) {
		if ((s[k] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[k] & 0x3f);
	}
	static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < least[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f)
		return 0;
	return len;
}

/* Writes text[0 .. n) to stdout, its bytes that a terminal would act on
 * escaped (a NUL ended the sample, control bytes reached the terminal):
 * every one as shown() gives it in a quoted prompt, else all but newlines,
 * tabs and whole UTF-8 characters, which stay the text's own (a byte of
 * 0x80 or above outside one, a C1 control such as 0x90 among them, went
 * out raw); a newline after a sample. */
static void put_text(const char *text, size_t n, int quoted)
{
	char c[8];
	for (size_t i = 0; i < n; i++) {
		uint8_t b = (uint8_t)text[i];
		size_t u = !quoted && b >= 0x80 ? utf8_shown((const uint8_t *)text + i, n - i) : 0;
		if (u) {
			fwrite(text + i, 1, u, stdout);
			i += u - 1;
		} else if (!quoted && (b == '\n' || b == '\t' || (b >= 0x20 && b < 0x7f)))
			putchar(b);
		else
			fputs(shown(b, c), stdout);
	}
	if (!quoted)
		putchar('\n');
}

/* Each step feeds the last (up to) T characters, padded after them (a
 * causal model does not look ahead), and draws from the logits at the
 * last one. */
int ex_lm_generate(hpu_run *run, void *user)
{
	const ex_lm *m = user;
	const int t = m->train.t, v = m->text.vocab;
	const long gen = m->gen;
	size_t len = 0, cap = strlen(m->prompt) + (size_t)gen + 1;
	uint8_t *ids = malloc(cap);
	char *text = malloc(cap);
	int32_t *fields = calloc(3 * (size_t)t, sizeof *fields);
	unsigned long long rng = m->seed;
	int rc = HPU_ENOMEM;
	if (!ids || !text || !fields)
		goto out;
	for (const char *p = m->prompt; *p; p++) /* bytes not in the text: skipped */
		if (m->text.id_of[(uint8_t)*p] >= 0)
			ids[len++] = (uint8_t)m->text.id_of[(uint8_t)*p];
	size_t skipped = strlen(m->prompt) - len;
	/* nothing of the prompt to start from: the vocabulary's first
	 * character (id 0, the text's lowest byte), said to be that and not
	 * the prompt */
	int none = len == 0;
	if (none)
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
		ids[len++] = (uint8_t)pick(hpu_f32(&logits) + (n - 1) * v, v, m->temp, &rng);
	}
	for (size_t i = 0; i < len; i++)
		text[i] = (char)m->text.chars[ids[i]];
	char c[8];
	if (hpu_run_ctx(run)->rank == 0 && none) {
		printf("sample (%ld characters after \"%s\", the vocabulary's first character, as "
		       "the prompt %s; temperature %g):\n",
		       gen, shown((uint8_t)text[0], c),
		       *m->prompt ? "has no character of the text" : "is empty", m->temp);
		put_text(text, len, 0);
	} else if (hpu_run_ctx(run)->rank == 0) {
		printf("sample (%ld characters after the prompt \"", gen);
		put_text(text, start, 1);
		printf("\"%s, temperature %g):\n",
		       skipped ? " (its characters not in the text left out)" : "", m->temp);
		put_text(text, len, 0);
	}
	rc = HPU_OK;
out:
	if (rc == HPU_ENOMEM)
		hpu_error(run, "out of memory generating %ld characters", gen);
	free(ids), free(text), free(fields);
	return rc;
}

void ex_lm_free(ex_lm *m)
{
	ex_corpus_free(&m->text);
	hpu_array_free(&m->tok);
}
