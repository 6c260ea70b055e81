/* corpus: see corpus.h. */
#include "examples/common/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int visible(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* Whether a regular file of the directory itself (not a link) is the
 * file st describes. */
static int in_dir(const struct stat *st, const dev_t *dev, const ino_t *ino, int n)
{
	for (int i = 0; i < n; i++)
		if (dev[i] == st->st_dev && ino[i] == st->st_ino)
			return 1;
	return 0;
}

/* Appends the regular file at path to c->ids (raw bytes for now): a
 * symbolic link to one that is not a file of the directory too (a link
 * to one that is would repeat it: Debian's common-licenses GPL ->
 * GPL-3). Returns 1 when it was read, 0 when skipped, -1 (err set) when
 * it cannot be read or memory runs out. */
static int append(ex_corpus *c, const char *path, const dev_t *dev, const ino_t *ino, int nown,
		  char *err, size_t errlen)
{
	struct stat st, lst;
	if (lstat(path, &lst) != 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
		return 0;
	if (S_ISLNK(lst.st_mode) && in_dir(&st, dev, ino, nown))
		return 0;
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "cannot read %s, a file of the corpus: %s", path, strerror(errno));
		return -1;
	}
	uint8_t *grown = realloc(c->ids, c->n + (size_t)st.st_size + 1);
	if (!grown) {
		fclose(f);
		snprintf(err, errlen, "out of memory reading %s", path);
		return -1;
	}
	c->ids = grown;
	c->n += fread(c->ids + c->n, 1, (size_t)st.st_size, f);
	fclose(f);
	return 1;
}

/* Maps the bytes to ids 0 .. vocab-1 in byte order, in place. */
static void make_vocab(ex_corpus *c)
{
	int seen[256] = {0};
	for (size_t i = 0; i < c->n; i++)
		seen[c->ids[i]] = 1;
	c->vocab = 0;
	for (int ch = 0; ch < 256; ch++) {
		c->id_of[ch] = (int16_t)(seen[ch] ? c->vocab : -1);
		if (seen[ch])
			c->chars[c->vocab++] = (uint8_t)ch;
	}
	for (size_t i = 0; i < c->n; i++)
		c->ids[i] = (uint8_t)c->id_of[c->ids[i]];
}

int ex_corpus_read(ex_corpus *c, const char *dir, char *err, size_t errlen)
{
	struct dirent **names;
	memset(c, 0, sizeof *c);
	int n = scandir(dir, &names, visible, alphasort), rc = 0;
	if (n < 0) {
		snprintf(err, errlen, "cannot list the corpus directory %s: %s", dir,
			 strerror(errno));
		return -1;
	}
	/* the directory's own regular files, which links to them repeat */
	dev_t *dev = calloc((size_t)n + 1, sizeof *dev);
	ino_t *ino = calloc((size_t)n + 1, sizeof *ino);
	int nown = 0;
	if (!dev || !ino) {
		snprintf(err, errlen, "out of memory listing %s", dir);
		rc = -1;
	}
	for (int i = 0; rc == 0 && i < n; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
		if (lstat(path, &st) == 0 && S_ISREG(st.st_mode))
			dev[nown] = st.st_dev, ino[nown++] = st.st_ino;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
		int got = rc < 0 ? 0 : append(c, path, dev, ino, nown, err, errlen);
		if (got < 0)
			rc = -1;
		c->files += got > 0;
		free(names[i]);
	}
	free(names);
	free(dev);
	free(ino);
	if (rc == 0 && c->n == 0) {
		snprintf(err, errlen, "no text in %s: it has no regular files (nor links to any "
			 "outside it), or only empty ones", dir);
		rc = -1;
	}
	if (rc < 0) {
		ex_corpus_free(c);
		return -1;
	}
	make_vocab(c);
	return 0;
}

void ex_corpus_free(ex_corpus *c)
{
	free(c->ids);
	c->ids = NULL;
	c->n = 0;
}

double ex_unigram_nats(const uint8_t *train, size_t ntrain, const uint8_t *val, size_t nval,
		       int vocab)
{
	double count[256] = {0}, h = 0;
	for (size_t i = 0; i < ntrain; i++)
		count[train[i]] += 1;
	for (size_t i = 0; i < nval; i++)
		h -= log((count[val[i]] + 1) / (double)(ntrain + (size_t)vocab));
	return nval ? h / (double)nval : NAN;
}
