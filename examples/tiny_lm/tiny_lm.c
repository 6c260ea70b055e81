/* tiny_lm: a character-level causal transformer language model (GPT-2's
 * pre-norm block) on the license texts every Debian machine has.
 *
 * Data: the regular files of /usr/share/common-licenses in sorted order
 * (symbolic links, which repeat a file, are skipped), concatenated; the
 * last 10% is the validation set. The vocabulary is the bytes that occur.
 * A sample is a window of T characters: x holds their ids as floats (exact
 * below 2^24), labels the T ids that follow each one.
 *
 * Layers, each mapping a whole sequence per sample:
 *   embed   [T] ids          -> [T, D]  token + learned position
 *   blockN  [T, D]           -> [T, D]  x += attn(ln1(x)); x += mlp(ln2(x))
 *   head    [T, D]           -> [T, V]  logits = ln_f(x) W^T + b
 * A block keeps its intermediate activations in its own buffers, grown to
 * the largest batch it has seen (setup does not know the micro-batch).
 * Loss: mean cross-entropy over every position. Metric: the validation
 * loss, in nats per character (mean over the validation windows).
 *
 * After evaluation, rank 0 prints a sample of generated text (teardown):
 * the layers copy their parameters on rank 0 as they run forward, so the
 * last evaluation's parameters (the trained ones) are still there.
 *
 * Model arguments (after "--"):
 *   --data DIR        the corpus directory (/usr/share/common-licenses)
 *   --ctx T           context length (64)
 *   --dim D           model width (128)
 *   --heads H         attention heads (4; D must be a multiple)
 *   --layers N        transformer blocks (2)
 *   --checkpoint      activation checkpointing on the blocks
 *   --gen N           characters to generate after training (300; 0: none)
 *   --temperature X   sampling temperature (0.8; 0: greedy)
 *   --prompt TEXT     the generation's start ("The ")
 *   --gen-seed N      the sampler's seed (1)
 */
#include <hpu/hpu.h>
#include <hpu/ops.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "args.h"

#define DEFAULT_DATA "/usr/share/common-licenses"
#define MAX_BLOCKS 32
#define MAX_PARAMS 12
#define LN_EPS 1e-5f

typedef struct lm lm;

/* ---- data ---- */

typedef struct split {
	const uint8_t *ids; /* the text as vocabulary ids */
	size_t n;           /* its length */
	size_t stride;      /* between consecutive samples' starts */
	int t;
} split;

/* x[t] = ids[s + t], labels[t] = ids[s + t + 1], s = i * stride. */
static int fetch(void *user, size_t i, float *x, int32_t *labels)
{
	const split *s = user;
	const uint8_t *w = s->ids + i * s->stride;
	for (int t = 0; t < s->t; t++) {
		x[t] = (float)w[t];
		labels[t] = w[t + 1];
	}
	return 0;
}

/* ---- shapes and the parameter snapshot every layer keeps ---- */

typedef struct dims {
	int t, d, heads, vocab, ff; /* ff = 4 d */
} dims;

/* The layer's parameters as rank 0 last saw them in forward, for
 * generation after training. */
typedef struct snap {
	int n;
	size_t size[MAX_PARAMS];
	float *p[MAX_PARAMS];
} snap;

/* Backward's scratch, shared by all layers (backward runs one at a time). */
typedef struct scratch {
	int cap;
	float *mem, *da, *dx1, *dqkv, *dg;
} scratch;

typedef struct embed {
	lm *m;
	snap s;
	int cap;
	int32_t *ids;
} embed;

enum { LN1_G, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B,
       LN2_G, LN2_B, FC_W, FC_B, MP_W, MP_B, BLOCK_NPARAM };

typedef struct block {
	lm *m;
	snap s;
	int cap; /* samples the buffers hold */
	float *mem;
	/* per row of [B*T]: ln1 D, qkv 3D, ao D, x1 D, ln2 D, h 4D, g 4D;
	 * per row: mean1, rstd1, mean2, rstd2; per sample: att [H, T, T] */
	float *ln1, *qkv, *ao, *x1, *ln2, *h, *g;
	float *mean1, *rstd1, *mean2, *rstd2, *att;
} block;

enum { LNF_G, LNF_B, HEAD_W, HEAD_B, HEAD_NPARAM };

typedef struct head {
	lm *m;
	snap s;
	int cap;
	float *mem, *a, *mean, *rstd;
} head;

struct lm {
	dims k;
	int rank, nblocks;
	uint8_t *text; /* the corpus as ids */
	size_t ntext;
	split train, val;
	int vocab;
	uint8_t chars[256]; /* id -> byte */
	int16_t id_of[256]; /* byte -> id, or -1 */
	embed emb;
	block blk[MAX_BLOCKS];
	head hd;
	scratch sc;
	char names[MAX_BLOCKS][16];
	int evaluated; /* the metric ran: training and evaluation are done */
	long gen;
	double temperature;
	const char *prompt;
	unsigned long gen_seed;
};

/* Points p at the layer's parameters; on rank 0 also copies them into
 * the snapshot. */
static void params_of(hpu_layer *l, snap *s, int rank, const float **p)
{
	for (int i = 0; i < s->n; i++) {
		p[i] = hpu_param(l, i);
		if (rank == 0)
			memcpy(s->p[i], p[i], s->size[i] * sizeof(float));
	}
}

static void grads_of(hpu_layer *l, int n, float **g)
{
	for (int i = 0; i < n; i++)
		g[i] = hpu_grad(l, i);
}

/* Declares a parameter and its snapshot; returns -1 on failure. */
static int param(hpu_layer *l, snap *s, const char *name, int64_t d0,
		 int64_t d1, hpu_init init)
{
	int64_t shape[2] = {d0, d1};
	int ndim = d1 ? 2 : 1;
	if (hpu_param_add(l, name, ndim, shape, init) != s->n)
		return -1;
	s->size[s->n] = (size_t)d0 * (size_t)(d1 ? d1 : 1);
	if (!(s->p[s->n] = calloc(s->size[s->n], sizeof(float))))
		return -1;
	s->n++;
	return 0;
}

static void snap_free(snap *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->p[i]);
}

/* Carves `mem` into consecutive pieces of the given lengths. */
static float *carve(float **mem, size_t n)
{
	float *p = *mem;
	*mem += n;
	return p;
}

static void add_to(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
}

static int reserve_scratch(lm *m, int batch)
{
	scratch *s = &m->sc;
	if (batch <= s->cap)
		return 0;
	size_t rows = (size_t)batch * m->k.t, d = (size_t)m->k.d;
	float *mem = realloc(s->mem, rows * (d + d + 3 * d + 4 * d) * sizeof(float));
	if (!mem)
		return -1;
	s->mem = mem;
	s->da = carve(&mem, rows * d);
	s->dx1 = carve(&mem, rows * d);
	s->dqkv = carve(&mem, rows * 3 * d);
	s->dg = carve(&mem, rows * 4 * d);
	s->cap = batch;
	return 0;
}

/* ---- embed: [T] ids -> [T, D] = wte[id] + wpe[t] ---- */

/* The ids of x[rows] (floats); -1 for anything not a valid id. */
static void ids_of(const float *x, int32_t *ids, size_t rows, int vocab)
{
	for (size_t i = 0; i < rows; i++) {
		float v = x[i];
		ids[i] = v >= 0 && v < (float)vocab && v == (float)(int32_t)v ?
				 (int32_t)v : -1;
	}
}

static int embed_reserve(embed *e, int batch)
{
	if (batch <= e->cap)
		return 0;
	int32_t *ids = realloc(e->ids, (size_t)batch * e->m->k.t * sizeof *ids);
	if (!ids)
		return -1;
	e->ids = ids;
	e->cap = batch;
	return 0;
}

static int embed_compute(embed *e, const float **p, const float *in, float *out,
			 int batch)
{
	const dims *k = &e->m->k;
	size_t rows = (size_t)batch * k->t;
	ids_of(in, e->ids, rows, k->vocab);
	if (hpu_embedding_forward(p[0], e->ids, out, (int)rows, k->vocab, k->d) < 0)
		return -1;
	for (size_t r = 0; r < rows; r++)
		add_to(out + r * k->d, p[1] + (r % k->t) * k->d, (size_t)k->d);
	return 0;
}

static int embed_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	embed *e = hpu_layer_user(l);
	const float *p[2];
	params_of(l, &e->s, e->m->rank, p);
	if (embed_reserve(e, batch) < 0)
		return hpu_layer_error(l, "out of memory");
	if (embed_compute(e, p, in, out, batch) < 0)
		return hpu_layer_error(l, "a token id is out of range 0..%d", e->m->k.vocab - 1);
	return 0;
}

static int embed_backward(hpu_layer *l, const float *in, const float *out,
			  const float *dout, float *din, int batch)
{
	(void)out;
	embed *e = hpu_layer_user(l);
	const dims *k = &e->m->k;
	size_t rows = (size_t)batch * k->t;
	float *g[2];
	grads_of(l, 2, g);
	ids_of(in, e->ids, rows, k->vocab); /* checked in forward */
	hpu_embedding_backward(e->ids, dout, g[0], (int)rows, k->d);
	for (size_t r = 0; r < rows; r++)
		add_to(g[1] + (r % k->t) * k->d, dout + r * k->d, (size_t)k->d);
	if (din) /* ids have no gradient */
		memset(din, 0, rows * sizeof *din);
	return 0;
}

static const hpu_layer_ops embed_ops = {embed_forward, embed_backward};

/* ---- block: x1 = x + attn(ln1(x)); out = x1 + mlp(ln2(x1)) ---- */

static int block_reserve(block *b, int batch)
{
	if (batch <= b->cap)
		return 0;
	const dims *k = &b->m->k;
	size_t rows = (size_t)batch * k->t, d = (size_t)k->d;
	size_t att = (size_t)batch * k->heads * k->t * k->t;
	size_t n = rows * (d + 3 * d + d + d + d + 4 * d + 4 * d + 4) + att;
	float *mem = realloc(b->mem, n * sizeof(float));
	if (!mem)
		return -1;
	b->mem = mem;
	b->ln1 = carve(&mem, rows * d);
	b->qkv = carve(&mem, rows * 3 * d);
	b->ao = carve(&mem, rows * d);
	b->x1 = carve(&mem, rows * d);
	b->ln2 = carve(&mem, rows * d);
	b->h = carve(&mem, rows * 4 * d);
	b->g = carve(&mem, rows * 4 * d);
	b->mean1 = carve(&mem, rows);
	b->rstd1 = carve(&mem, rows);
	b->mean2 = carve(&mem, rows);
	b->rstd2 = carve(&mem, rows);
	b->att = carve(&mem, att);
	b->cap = batch;
	return 0;
}

static void block_compute(block *b, const float **p, const float *x, float *out,
			  int batch)
{
	const dims *k = &b->m->k;
	const int rows = batch * k->t, d = k->d, ff = k->ff;
	/* attention: x1[rows, D] = x + attn(ln1(x)) W_proj^T + b_proj */
	hpu_layernorm_forward(x, p[LN1_G], p[LN1_B], b->ln1, b->mean1, b->rstd1,
			      rows, d, LN_EPS);
	hpu_linear_forward(b->ln1, p[QKV_W], p[QKV_B], b->qkv, rows, d, 3 * d);
	hpu_attention_forward(b->qkv, b->ao, b->att, batch, k->t, k->heads,
			      d / k->heads);
	hpu_linear_forward(b->ao, p[PROJ_W], p[PROJ_B], b->x1, rows, d, d);
	add_to(b->x1, x, (size_t)rows * d);
	/* MLP: out[rows, D] = x1 + gelu(ln2(x1) W_fc^T + b_fc) W_mp^T + b_mp */
	hpu_layernorm_forward(b->x1, p[LN2_G], p[LN2_B], b->ln2, b->mean2,
			      b->rstd2, rows, d, LN_EPS);
	hpu_linear_forward(b->ln2, p[FC_W], p[FC_B], b->h, rows, d, ff);
	hpu_gelu_forward(b->h, b->g, (size_t)rows * ff);
	hpu_linear_forward(b->g, p[MP_W], p[MP_B], out, rows, ff, d);
	add_to(out, b->x1, (size_t)rows * d);
}

static int block_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	block *b = hpu_layer_user(l);
	const float *p[BLOCK_NPARAM];
	params_of(l, &b->s, b->m->rank, p);
	if (block_reserve(b, batch) < 0)
		return hpu_layer_error(l, "out of memory");
	block_compute(b, p, in, out, batch);
	return 0;
}

/* The forward in reverse; the residuals add their gradients back in. */
static int block_backward(hpu_layer *l, const float *in, const float *out,
			  const float *dout, float *din, int batch)
{
	(void)out;
	block *b = hpu_layer_user(l);
	lm *m = b->m;
	const dims *k = &m->k;
	const int rows = batch * k->t, d = k->d, ff = k->ff;
	if (reserve_scratch(m, batch) < 0)
		return hpu_layer_error(l, "out of memory");
	scratch *s = &m->sc;
	const float *p[BLOCK_NPARAM];
	float *g[BLOCK_NPARAM];
	for (int i = 0; i < BLOCK_NPARAM; i++)
		p[i] = hpu_param(l, i);
	grads_of(l, BLOCK_NPARAM, g);
	/* MLP: dx1 = dout + ln2'(fc'(gelu'(mp'(dout)))) */
	hpu_linear_backward(b->g, p[MP_W], dout, s->dg, g[MP_W], g[MP_B], rows,
			    ff, d);
	hpu_gelu_backward(b->h, s->dg, s->dg, (size_t)rows * ff);
	hpu_linear_backward(b->ln2, p[FC_W], s->dg, s->da, g[FC_W], g[FC_B],
			    rows, d, ff);
	hpu_layernorm_backward(b->x1, p[LN2_G], b->mean2, b->rstd2, s->da, s->dx1,
			       g[LN2_G], g[LN2_B], rows, d);
	add_to(s->dx1, dout, (size_t)rows * d);
	/* attention: din = dx1 + ln1'(qkv'(attn'(proj'(dx1)))) */
	hpu_linear_backward(b->ao, p[PROJ_W], s->dx1, s->da, g[PROJ_W], g[PROJ_B],
			    rows, d, d);
	hpu_attention_backward(b->qkv, b->att, s->da, s->dqkv, batch, k->t,
			       k->heads, d / k->heads);
	hpu_linear_backward(b->ln1, p[QKV_W], s->dqkv, s->da, g[QKV_W], g[QKV_B],
			    rows, d, 3 * d);
	hpu_layernorm_backward(in, p[LN1_G], b->mean1, b->rstd1, s->da, din,
			       g[LN1_G], g[LN1_B], rows, d);
	add_to(din, s->dx1, (size_t)rows * d);
	return 0;
}

static const hpu_layer_ops block_ops = {block_forward, block_backward};

/* ---- head: logits[T, V] = ln_f(x) W^T + b ---- */

static int head_reserve(head *h, int batch)
{
	if (batch <= h->cap)
		return 0;
	size_t rows = (size_t)batch * h->m->k.t;
	float *mem = realloc(h->mem, rows * ((size_t)h->m->k.d + 2) * sizeof(float));
	if (!mem)
		return -1;
	h->mem = mem;
	h->a = carve(&mem, rows * h->m->k.d);
	h->mean = carve(&mem, rows);
	h->rstd = carve(&mem, rows);
	h->cap = batch;
	return 0;
}

static void head_compute(head *h, const float **p, const float *x, float *out,
			 int batch)
{
	const dims *k = &h->m->k;
	const int rows = batch * k->t;
	hpu_layernorm_forward(x, p[LNF_G], p[LNF_B], h->a, h->mean, h->rstd, rows,
			      k->d, LN_EPS);
	hpu_linear_forward(h->a, p[HEAD_W], p[HEAD_B], out, rows, k->d, k->vocab);
}

static int head_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	head *h = hpu_layer_user(l);
	const float *p[HEAD_NPARAM];
	params_of(l, &h->s, h->m->rank, p);
	if (head_reserve(h, batch) < 0)
		return hpu_layer_error(l, "out of memory");
	head_compute(h, p, in, out, batch);
	return 0;
}

static int head_backward(hpu_layer *l, const float *in, const float *out,
			 const float *dout, float *din, int batch)
{
	(void)out;
	head *h = hpu_layer_user(l);
	lm *m = h->m;
	const int rows = batch * m->k.t, d = m->k.d;
	if (reserve_scratch(m, batch) < 0)
		return hpu_layer_error(l, "out of memory");
	float *g[HEAD_NPARAM];
	grads_of(l, HEAD_NPARAM, g);
	hpu_linear_backward(h->a, hpu_param(l, HEAD_W), dout, m->sc.da, g[HEAD_W],
			    g[HEAD_B], rows, d, m->k.vocab);
	hpu_layernorm_backward(in, hpu_param(l, LNF_G), h->mean, h->rstd, m->sc.da,
			       din, g[LNF_G], g[LNF_B], rows, d);
	return 0;
}

static const hpu_layer_ops head_ops = {head_forward, head_backward};

/* ---- loss and metric: cross-entropy over every position ---- */

static float xent(void *user, const float *out, const int32_t *labels,
		  float *dout, int batch)
{
	const lm *m = user;
	return hpu_softmax_xent(out, labels, dout, batch * m->k.t, m->k.vocab);
}

/* The sum over the batch of each window's mean loss (nats per char). */
static double val_loss(void *user, const float *out, const int32_t *labels,
		       int batch)
{
	lm *m = user;
	m->evaluated = 1;
	float l = hpu_softmax_xent(out, labels, NULL, batch * m->k.t, m->k.vocab);
	return (double)l * batch;
}

/* ---- generation, from rank 0's parameter snapshots ---- */

/* logits[T, V] of one window x[T] (ids as floats), through the layers'
 * own math on the snapshots; ping-pongs between a and b [T, D]. */
static int lm_logits(lm *m, const float *x, float *a, float *b, float *logits)
{
	const float *p[BLOCK_NPARAM];
	for (int i = 0; i < m->emb.s.n; i++)
		p[i] = m->emb.s.p[i];
	if (embed_reserve(&m->emb, 1) < 0 || embed_compute(&m->emb, p, x, a, 1) < 0)
		return -1;
	for (int n = 0; n < m->nblocks; n++) {
		block *blk = &m->blk[n];
		for (int i = 0; i < BLOCK_NPARAM; i++)
			p[i] = blk->s.p[i];
		if (block_reserve(blk, 1) < 0)
			return -1;
		block_compute(blk, p, a, b, 1);
		float *t = a;
		a = b, b = t;
	}
	for (int i = 0; i < HEAD_NPARAM; i++)
		p[i] = m->hd.s.p[i];
	if (head_reserve(&m->hd, 1) < 0)
		return -1;
	head_compute(&m->hd, p, a, logits, 1);
	return 0;
}

/* A uniform double in [0, 1), splitmix64. */
static double uniform(unsigned long long *state)
{
	unsigned long long z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* The next id from logits[V]: arg-max at temperature 0, else a draw. */
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

static void generate(lm *m)
{
	const int t = m->k.t, d = m->k.d, v = m->k.vocab;
	size_t plen = strlen(m->prompt), len = 0, cap = plen + (size_t)m->gen;
	uint8_t *ids = malloc(cap + 1);
	float *x = calloc((size_t)t, sizeof *x);
	float *a = malloc((size_t)t * d * sizeof *a), *b = malloc((size_t)t * d * sizeof *b);
	float *logits = malloc((size_t)t * v * sizeof *logits);
	char *text = malloc(cap + 1);
	unsigned long long rng = m->gen_seed;
	if (!ids || !x || !a || !b || !logits || !text)
		goto out;
	for (size_t i = 0; i < plen; i++) /* bytes outside the vocabulary: skipped */
		if (m->id_of[(uint8_t)m->prompt[i]] >= 0)
			ids[len++] = (uint8_t)m->id_of[(uint8_t)m->prompt[i]];
	if (len == 0)
		ids[len++] = 0;
	size_t start_len = len;
	for (long g = 0; g < m->gen; g++) {
		/* the last (up to) T ids; positions after them do not matter
		 * to the causal model */
		size_t n = len < (size_t)t ? len : (size_t)t;
		for (int i = 0; i < t; i++)
			x[i] = (size_t)i < n ? (float)ids[len - n + i] : 0.0f;
		if (lm_logits(m, x, a, b, logits) < 0)
			goto out;
		ids[len++] = (uint8_t)pick(logits + (n - 1) * v, v, m->temperature, &rng);
	}
	for (size_t i = 0; i < len; i++)
		text[i] = (char)m->chars[ids[i]];
	text[len] = 0;
	printf("sample (%ld characters after the prompt \"%.*s\", temperature %g):\n%s\n",
	       m->gen, (int)start_len, text, m->temperature, text);
out:
	free(ids), free(x), free(a), free(b), free(logits), free(text);
}

/* ---- the corpus ---- */

static int regular_file(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* Reads every regular file of dir, in name order, into m->text (bytes);
 * returns the number of files, or -1 with err set. */
static int read_corpus(lm *m, const char *dir, char *err, size_t errlen)
{
	struct dirent **names;
	int n = scandir(dir, &names, regular_file, alphasort), files = 0;
	if (n < 0) {
		snprintf(err, errlen, "cannot list %s", dir);
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
		FILE *f = NULL;
		/* links repeat another file (GPL -> GPL-3): skipped */
		if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (f = fopen(path, "rb"))) {
			uint8_t *t = realloc(m->text, m->ntext + (size_t)st.st_size);
			if (t) {
				m->text = t;
				m->ntext += fread(m->text + m->ntext, 1, (size_t)st.st_size, f);
				files++;
			}
			fclose(f);
		}
		free(names[i]);
	}
	free(names);
	if (files == 0 || m->ntext == 0) {
		snprintf(err, errlen, "no text in %s", dir);
		return -1;
	}
	return files;
}

/* Maps the bytes to ids 0..V-1 in byte order, in place. */
static void make_vocab(lm *m)
{
	int seen[256] = {0};
	for (size_t i = 0; i < m->ntext; i++)
		seen[m->text[i]] = 1;
	m->vocab = 0;
	for (int c = 0; c < 256; c++) {
		m->id_of[c] = (int16_t)(seen[c] ? m->vocab : -1);
		if (seen[c])
			m->chars[m->vocab++] = (uint8_t)c;
	}
	for (size_t i = 0; i < m->ntext; i++)
		m->text[i] = (uint8_t)m->id_of[m->text[i]];
}

/* Cross-entropy of the validation text under the training text's
 * character frequencies (add-one smoothed), in nats: the unigram baseline. */
static double unigram_nats(const lm *m)
{
	double count[256] = {0}, h = 0;
	for (size_t i = 0; i < m->train.n; i++)
		count[m->train.ids[i]] += 1;
	for (size_t i = 0; i < m->val.n; i++)
		h -= log((count[m->val.ids[i]] + 1) / (double)(m->train.n + m->vocab));
	return h / (double)m->val.n;
}

/* ---- the model ---- */

static void teardown(void *user)
{
	lm *m = user;
	if (!m)
		return;
	if (m->rank == 0 && m->evaluated && m->gen > 0)
		generate(m);
	snap_free(&m->emb.s);
	free(m->emb.ids);
	for (int i = 0; i < m->nblocks; i++) {
		snap_free(&m->blk[i].s);
		free(m->blk[i].mem);
	}
	snap_free(&m->hd.s);
	free(m->hd.mem);
	free(m->sc.mem);
	free(m->text);
	free(m);
}

typedef struct args {
	const char *dir;
	double t, d, heads, layers, gen, temp, seed;
	int ckpt;
} args;

static int parse_args(hpu_builder *b, int argc, char **argv, args *a, lm *m)
{
	static const struct {
		const char *name;
		size_t off;
		double lo, hi;
	} nums[] = {
		{"--ctx", offsetof(args, t), 1, 4096},
		{"--dim", offsetof(args, d), 1, 8192},
		{"--heads", offsetof(args, heads), 1, 256},
		{"--layers", offsetof(args, layers), 0, MAX_BLOCKS},
		{"--gen", offsetof(args, gen), 0, 1e6},
		{"--temperature", offsetof(args, temp), 0, 100},
		{"--gen-seed", offsetof(args, seed), 0, 1e15},
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
		} else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) {
			m->prompt = argv[++i];
		} else if (!strcmp(argv[i], "--checkpoint")) {
			a->ckpt = 1;
		} else {
			return hpu_error(b, "unknown model argument %s (model arguments: --data DIR, --ctx T, --dim D, --heads H, --layers N, --checkpoint, --gen N, --temperature X, --prompt TEXT, --gen-seed N)",
					 argv[i]);
		}
	}
	if ((long)a->d % (long)a->heads)
		return hpu_error(b, "--dim %g is not a multiple of --heads %g", a->d, a->heads);
	return 0;
}

static int declare_layers(hpu_builder *b, lm *m, int ckpt)
{
	const dims *k = &m->k;
	const int64_t t = k->t, d = k->d, v = k->vocab, ff = k->ff;
	size_t seq = (size_t)t * d;
	hpu_layer *l = hpu_layer_add(b, "embed", (size_t)t, seq, &embed_ops, &m->emb);
	m->emb.m = m;
	if (!l || param(l, &m->emb.s, "wte", v, d, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
	    param(l, &m->emb.s, "wpe", t, d, HPU_INIT_FAN_IN_UNIFORM) < 0)
		return -1;
	for (int n = 0; n < m->nblocks; n++) {
		block *blk = &m->blk[n];
		snap *s = &blk->s;
		blk->m = m;
		snprintf(m->names[n], sizeof m->names[n], "block%d", n);
		if (!(l = hpu_layer_add(b, m->names[n], seq, seq, &block_ops, blk)))
			return -1;
		hpu_layer_checkpoint(l, ckpt);
		/* weights as torch.nn.Linear; biases 0; norms 1 and 0 */
		if (param(l, s, "ln1.weight", d, 0, HPU_INIT_ONES) < 0 ||
		    param(l, s, "ln1.bias", d, 0, HPU_INIT_ZEROS) < 0 ||
		    param(l, s, "attn.qkv.weight", 3 * d, d, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
		    param(l, s, "attn.qkv.bias", 3 * d, 0, HPU_INIT_ZEROS) < 0 ||
		    param(l, s, "attn.proj.weight", d, d, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
		    param(l, s, "attn.proj.bias", d, 0, HPU_INIT_ZEROS) < 0 ||
		    param(l, s, "ln2.weight", d, 0, HPU_INIT_ONES) < 0 ||
		    param(l, s, "ln2.bias", d, 0, HPU_INIT_ZEROS) < 0 ||
		    param(l, s, "mlp.fc.weight", ff, d, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
		    param(l, s, "mlp.fc.bias", ff, 0, HPU_INIT_ZEROS) < 0 ||
		    param(l, s, "mlp.proj.weight", d, ff, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
		    param(l, s, "mlp.proj.bias", d, 0, HPU_INIT_ZEROS) < 0)
			return -1;
	}
	l = hpu_layer_add(b, "head", seq, (size_t)t * v, &head_ops, &m->hd);
	m->hd.m = m;
	if (!l || param(l, &m->hd.s, "ln_f.weight", d, 0, HPU_INIT_ONES) < 0 ||
	    param(l, &m->hd.s, "ln_f.bias", d, 0, HPU_INIT_ZEROS) < 0 ||
	    param(l, &m->hd.s, "head.weight", v, d, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
	    param(l, &m->hd.s, "head.bias", v, 0, HPU_INIT_ZEROS) < 0)
		return -1;
	return 0;
}

/* Train: every window of the first 90% (stride 1); validation: the
 * non-overlapping windows of the rest. */
static int split_corpus(hpu_builder *b, lm *m)
{
	size_t nval = m->ntext / 10, ntrain = m->ntext - nval, t = (size_t)m->k.t;
	m->train = (split){m->text, ntrain, 1, m->k.t};
	m->val = (split){m->text + ntrain, nval, t, m->k.t};
	if (ntrain <= t || nval <= t)
		return hpu_error(b, "the corpus (%zu bytes) is too small for --ctx %zu",
				 m->ntext, t);
	hpu_dataset train = {ntrain - t, t, t, fetch, &m->train};
	hpu_dataset val = {(nval - 1) / t, t, t, fetch, &m->val};
	hpu_loss loss = {.loss = xent, .metric = val_loss, .metric_name = "val_loss",
			 .user = m};
	if (hpu_dataset_set(b, HPU_SPLIT_TRAIN, &train) < 0 ||
	    hpu_dataset_set(b, HPU_SPLIT_TEST, &val) < 0 || hpu_loss_set(b, &loss) < 0)
		return -1;
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	lm *m = calloc(1, sizeof *m);
	if (!m)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, m);
	m->prompt = "The ";
	args a = {DEFAULT_DATA, 64, 128, 4, 2, 300, 0.8, 1, 0};
	if (parse_args(b, argc, argv, &a, m) < 0)
		return -1;
	m->rank = hpu_rank(b);
	m->nblocks = (int)a.layers;
	m->gen = (long)a.gen;
	m->temperature = a.temp;
	m->gen_seed = (unsigned long)a.seed;
	char err[4200];
	int files = read_corpus(m, a.dir, err, sizeof err);
	if (files < 0)
		return hpu_error(b, "%s", err);
	make_vocab(m);
	m->k = (dims){(int)a.t, (int)a.d, (int)a.heads, m->vocab, 4 * (int)a.d};
	if (split_corpus(b, m) < 0 || declare_layers(b, m, a.ckpt) < 0)
		return -1;
	if (m->rank == 0) {
		double u = unigram_nats(m);
		printf("tiny_lm: %zu bytes from %d files in %s, vocabulary %d; train %zu, "
		       "validation %zu characters; T %d, D %d, %d heads, %d blocks; "
		       "unigram baseline %.4f nats (%.3f bits) per character\n",
		       m->ntext, files, a.dir, m->vocab, m->train.n, m->val.n, m->k.t,
		       m->k.d, m->k.heads, m->nblocks, u, u / log(2.0));
	}
	return 0;
}

HPU_MODEL(.name = "tiny_lm", .setup = setup, .teardown = teardown);
