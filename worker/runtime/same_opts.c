/* same_opts: see same_opts.h. */
#include "worker/runtime/same_opts.h"

#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/num.h"

enum {
	TEXT_MAX = 4096, /* the shared text (about 2 KB) fits with room */
	DIGEST = 32,     /* SHA-256 */
	SHOWN = 4,       /* groups of ranks named; more are counted */
	RANKS_SHOWN = 8, /* ranks named per group */
};

static int coll_error(hpucoll_comm *comm, int rc, char *err, size_t errlen)
{
	return hpu__say(err, errlen, "comparing the ranks' training options failed: %s",
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
static void describe(const unsigned char *dig, const char *texts, int world, char *err,
		     size_t errlen)
{
	size_t at = 0;
	int groups = 0, more = 0;
	char diff[1024];
	put(err, errlen, &at, "the ranks' training options differ: ");
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
		hpu__opts_shared_diff(texts + (size_t)r * TEXT_MAX, texts, diff, sizeof diff);
		if (groups++)
			put(err, errlen, &at, "; ");
		group_ranks(dig, world, r, err, errlen, &at);
		put(err, errlen, &at, "%s", diff);
	}
	if (more)
		put(err, errlen, &at, "; and %d more group%s of ranks", more, hpu__plural(more));
	put(err, errlen, &at, " (every node must run with the same training options and --config values)");
}

int hpu__same_opts_check(hpucoll_comm *comm, const hpu_train_opts *o, char *err,
			 size_t errlen)
{
	int world = hpucoll_comm_size(comm), rc = -1, c;
	char *mine = calloc(1, TEXT_MAX), *texts = NULL;
	unsigned char md[EVP_MAX_MD_SIZE], *dig = malloc((size_t)world * DIGEST);
	unsigned int mdlen = 0;
	if (!mine || !dig) {
		hpu__say(err, errlen, "out of memory");
		goto out;
	}
	int len = hpu__opts_shared_text(o, mine, TEXT_MAX);
	if (len < 0 || EVP_Digest(mine, (size_t)len, md, &mdlen, EVP_sha256(), NULL) != 1 ||
	    mdlen != DIGEST) {
		hpu__say(err, errlen, "cannot make the digest of the training options");
		goto out;
	}
	if ((c = hpucoll_all_gather(comm, md, dig, DIGEST, HPUCOLL_U8))) {
		coll_error(comm, c, err, errlen);
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
		hpu__say(err, errlen, "the ranks' training options differ (out of memory naming them)");
		goto out;
	}
	if ((c = hpucoll_all_gather(comm, mine, texts, TEXT_MAX, HPUCOLL_U8))) {
		coll_error(comm, c, err, errlen);
		goto out;
	}
	/* a peer's text ends in its buffer and prints as one line a name */
	for (size_t k = 0; k < (size_t)world * TEXT_MAX; k++)
		if (k % TEXT_MAX == TEXT_MAX - 1)
			texts[k] = 0;
		else if (texts[k] && ((unsigned char)texts[k] < 0x20 || texts[k] == 0x7f) &&
			 texts[k] != '\n')
			texts[k] = '?';
	describe(dig, texts, world, err, errlen);
out:
	free(mine);
	free(dig);
	free(texts);
	return rc;
}
