/* corpus: a directory of text files as one sequence of character ids,
 * for the character-level language model. */
#ifndef EXAMPLES_CORPUS_H
#define EXAMPLES_CORPUS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ex_corpus {
	uint8_t *ids;       /* the text, each byte replaced by its id */
	size_t n;           /* its length */
	int files;          /* files read */
	int vocab;          /* distinct bytes: ids are 0 .. vocab-1 */
	uint8_t chars[256]; /* id -> byte */
	int16_t id_of[256]; /* byte -> id, or -1 for a byte not in the text */
} ex_corpus;

/* Reads every regular file of dir (symbolic links, which repeat a file,
 * are skipped; so are names starting with '.'), in name order,
 * concatenated; the vocabulary is the bytes that occur, ids in byte order.
 * Returns 0, or -1 with a sentence in err. */
int ex_corpus_read(ex_corpus *c, const char *dir, char *err, size_t errlen);

void ex_corpus_free(ex_corpus *c);

/* The cross-entropy of val[nval] under the character frequencies of
 * train[ntrain] (add-one smoothed over `vocab` ids), in nats per
 * character: the unigram baseline a language model must beat. */
double ex_unigram_nats(const uint8_t *train, size_t ntrain, const uint8_t *val, size_t nval,
		       int vocab);

#endif
