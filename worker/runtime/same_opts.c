/* same_opts: see same_opts.h. */
#include "worker/runtime/same_opts.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/hex.h"
#include "common/num.h"
#include "worker/hpu/model.h"
#include "worker/runtime/loader.h"

enum {
	TEXT_MAX = 4096, /* the shared text (about 2 KB) fits with room */
	DIGEST = 32,     /* SHA-256 */
	SHOWN = 4,       /* groups of ranks named; more are counted */
	RANKS_SHOWN = 8, /* ranks named per group */
};

/* What is compared: its name in messages, the line's end naming what
 * must be the same, and how a name is shown ("--" for an option). */
typedef struct subject {
	const char *what, *lead, *hint, *prefix;
} subject;

static int coll_error(const subject *sj, hpucoll_comm *comm, int rc, char *err, size_t errlen)
{
	return hpu__say(err, errlen, "comparing the ranks' %s failed: %s", sj->what,
			hpucoll_comm_why(comm, rc));
}

/* Appends to err at *at; keeps err terminated when it is full. */
static void put(char *err, size_t errlen, size_t *at, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void put(char *err, size_t errlen, size_t *at, const char *fmt, ...)
{
	if (*at >= errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(err + *at, errlen - *at, fmt, ap);
	va_end(ap);
	if (n > 0)
		*at = *at + (size_t)n < errlen ? *at + (size_t)n : errlen;
}

/* "rank 1 differs" or "ranks 2, 3 differ" for the ranks whose digest is
 * that of rank r (from r on), at most RANKS_SHOWN of them named. */
static void group_ranks(const unsigned char *dig, int world, int r, char *err, size_t errlen,
			size_t *at)
{
	int n = 0;
	for (int k = r; k < world; k++)
		n += !memcmp(dig + (size_t)k * DIGEST, dig + (size_t)r * DIGEST, DIGEST);
	put(err, errlen, at, "%s ", n > 1 ? "ranks" : "rank");
	for (int k = r, shown = 0; k < world && shown < RANKS_SHOWN; k++)
		if (!memcmp(dig + (size_t)k * DIGEST, dig + (size_t)r * DIGEST, DIGEST))
			put(err, errlen, at, "%s%d", shown++ ? ", " : "", k);
	if (n > RANKS_SHOWN)
		put(err, errlen, at, " and %d more", n - RANKS_SHOWN);
	put(err, errlen, at, " %s from rank 0 in ", n > 1 ? "differ" : "differs");
}

/* err: every group of ranks (equal digests) that differs from rank 0,
 * with the options and values. */
static void describe(const subject *sj, const unsigned char *dig, const char *texts, int world,
		     char *err, size_t errlen)
{
	size_t at = 0;
	int groups = 0, more = 0;
	char diff[1024];
	put(err, errlen, &at, "%s", sj->lead);
	for (int r = 1; r < world; r++) {
		const unsigned char *d = dig + (size_t)r * DIGEST;
		int first = !memcmp(d, dig, DIGEST) ? 0 : 1; /* differs from rank 0 */
		for (int k = 1; k < r && first; k++)
			first = memcmp(dig + (size_t)k * DIGEST, d, DIGEST) != 0;
		if (!first)
			continue;
		if (groups == SHOWN) {
			more++;
			continue;
		}
		hpu__lines_diff(texts + (size_t)r * TEXT_MAX, texts, sj->prefix, diff, sizeof diff);
		if (groups++)
			put(err, errlen, &at, "; ");
		group_ranks(dig, world, r, err, errlen, &at);
		put(err, errlen, &at, "%s", diff);
	}
	if (more)
		put(err, errlen, &at, "; and %d more group%s of ranks", more, hpu__plural(more));
	put(err, errlen, &at, " (%s)", sj->hint);
}

/* Compares `mine` (len bytes of "name=value" lines, in a TEXT_MAX
 * buffer) with every other rank's: hpu__same_opts_check's steps. */
static int same_text(const subject *sj, hpucoll_comm *comm, char *mine, int len, char *err,
		     size_t errlen)
{
	int world = hpucoll_comm_size(comm), rc = -1, c;
	char *texts = NULL;
	unsigned char md[EVP_MAX_MD_SIZE], *dig = malloc((size_t)world * DIGEST);
	unsigned int mdlen = 0;
	if (!dig) {
		hpu__say(err, errlen, "out of memory");
		goto out;
	}
	if (len < 0 || EVP_Digest(mine, (size_t)len, md, &mdlen, EVP_sha256(), NULL) != 1 ||
	    mdlen != DIGEST) {
		hpu__say(err, errlen, "cannot make the digest of the %s", sj->what);
		goto out;
	}
	if ((c = hpucoll_all_gather(comm, md, dig, DIGEST, HPUCOLL_U8))) {
		coll_error(sj, comm, c, err, errlen);
		goto out;
	}
	int same = 1;
	for (int r = 1; r < world && same; r++)
		same = !memcmp(dig + (size_t)r * DIGEST, dig, DIGEST);
	if (same) {
		rc = 0;
		goto out;
	}
	/* every rank saw the same digests: every rank comes here */
	if (!(texts = malloc((size_t)world * TEXT_MAX))) {
		hpu__say(err, errlen, "the ranks' %s differ (out of memory naming them)", sj->what);
		goto out;
	}
	if ((c = hpucoll_all_gather(comm, mine, texts, TEXT_MAX, HPUCOLL_U8))) {
		coll_error(sj, comm, c, err, errlen);
		goto out;
	}
	/* a peer's text ends in its buffer and prints as one line a name */
	for (size_t k = 0; k < (size_t)world * TEXT_MAX; k++)
		if (k % TEXT_MAX == TEXT_MAX - 1)
			texts[k] = 0;
		else if (texts[k] && ((unsigned char)texts[k] < 0x20 || texts[k] == 0x7f) &&
			 texts[k] != '\n')
			texts[k] = '?';
	describe(sj, dig, texts, world, err, errlen);
out:
	free(dig);
	free(texts);
	return rc;
}

int hpu__same_opts_check(hpucoll_comm *comm, const hpu_train_opts *o, char *err,
			 size_t errlen)
{
	static const subject sj = {"training options", "the ranks' training options differ: ",
				   "every node must run the same model with the same training options and "
				   "--config values; a model's declared defaults set some of them",
				   "--"};
	char *mine = calloc(1, TEXT_MAX);
	if (!mine)
		return hpu__say(err, errlen, "out of memory");
	int rc = same_text(&sj, comm, mine, hpu__opts_shared_text(o, mine, TEXT_MAX), err, errlen);
	free(mine);
	return rc;
}

/* ---- the model and its data ---- */

static const char *const split_name[2] = {"training", "test"};

/* A digest of a few of split's samples (the first, the middle, the last),
 * as 16 hex digits; "unreadable" where a fetch fails. */
static void rows_digest(const hpu_dataset *d, char *out, size_t len)
{
	size_t bytes = 0, at[HPU_MAX_IO];
	for (int f = 0; f < d->nfields; f++) {
		at[f] = bytes;
		bytes += hpu__field_numel(&d->fields[f]) * 4; /* f32 or i32 */
	}
	unsigned char *buf = malloc(bytes ? bytes : 1), md[EVP_MAX_MD_SIZE];
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned int mdlen = 0;
	int ok = buf && ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
	size_t rows[3] = {0, d->size / 2, d->size - 1};
	for (int r = 0; ok && r < 3; r++) {
		void *out[HPU_MAX_IO];
		for (int f = 0; f < d->nfields; f++)
			out[f] = buf + at[f];
		ok = d->fetch(d->user, rows[r], out) == 0 && EVP_DigestUpdate(ctx, buf, bytes) == 1;
	}
	ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen >= 8;
	if (ok && len > 16)
		hpu__hex(out, md, 8);
	else
		snprintf(out, len, "unreadable");
	EVP_MD_CTX_free(ctx);
	free(buf);
}

static char train_digest[24];

const char *hpu__same_train_digest(void)
{
	return train_digest;
}

/* "name=value" lines of what every rank must have alike: the model's
 * parameters (count, floats, a digest of names and shapes), each split's
 * samples, fields and a few samples' bytes. */
static int model_text(const hpu_builder *b, char *t, size_t len)
{
	size_t at = 0;
	char shapes[64], e[40];
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
	for (int i = 0; ok && i < b->nparams; i++) {
		const hpu_param_info *p = &b->params[i];
		ok = EVP_DigestUpdate(ctx, p->name, strlen(p->name) + 1) == 1 &&
		     EVP_DigestUpdate(ctx, p->shape, sizeof p->shape[0] * (size_t)p->ndim) == 1;
	}
	ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen >= 4;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return -1;
	hpu__hex(shapes, md, 4);
	put(t, len, &at, "parameters=%d, %zu floats\nparameter names and shapes=%s\n", b->nparams, b->psi,
	    shapes);
	for (int s = 0; s < 2; s++) {
		const hpu_dataset *d = &b->data[s];
		if (!b->has_data[s])
			continue;
		put(t, len, &at, "%s split=%zu samples\n%s fields=", split_name[s], d->size, split_name[s]);
		for (int f = 0; f < d->nfields; f++) {
			put(t, len, &at, "%s%s %s [", f ? "; " : "", d->fields[f].name,
			    d->fields[f].dtype == HPU_I32 ? "i32" : "f32");
			for (int k = 0; k < d->fields[f].ndim; k++)
				put(t, len, &at, "%s%lld", k ? ", " : "", (long long)d->fields[f].shape[k]);
			put(t, len, &at, "]");
		}
		rows_digest(d, e, sizeof e);
		if (s == HPU_SPLIT_TRAIN)
			snprintf(train_digest, sizeof train_digest, "%.16s",
				 strcmp(e, "unreadable") ? e : "");
		put(t, len, &at, "\n%s samples' bytes=%s\n", split_name[s], e);
	}
	return at < len - 1 ? (int)at : -1;
}

int hpu__same_model_check(hpucoll_comm *comm, const hpu_builder *b, char *err, size_t errlen)
{
	static const subject sj = {"models or data", "the ranks' models or data differ: ",
				   "every node must load the same model with the same arguments and the "
				   "same data files",
				   ""};
	char *mine = calloc(1, TEXT_MAX);
	if (!mine)
		return hpu__say(err, errlen, "out of memory");
	int rc = same_text(&sj, comm, mine, model_text(b, mine, TEXT_MAX), err, errlen);
	free(mine);
	return rc;
}
