#include "agent/restart.h"
#include "common/hex.h"
#include "common/log.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hpu__attempt_token(const char *token, int restart, char *out, size_t outlen)
{
	if (restart == 0) {
		snprintf(out, outlen, "%s", token);
		return;
	}
	char msg[32];
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	int len = snprintf(msg, sizeof msg, "hpu-restart-%d", restart);
	if (!HMAC(EVP_sha256(), token, (int)strlen(token), (unsigned char *)msg,
		  (size_t)len, mac, &n))
		abort(); /* only without memory; a wrong token must not result */
	size_t k = outlen ? (outlen - 1) / 2 : 0; /* the bytes that fit */
	if (outlen)
		hpu__hex(out, mac, k < n ? k : n);
}

void hpu__restarts_init(hpu_restarts *r, int max)
{
	memset(r, 0, sizeof *r);
	r->max = max;
}

/* Attempts said in full at each end of the closing line; those between
 * are counted (40 restarts made one line of 4 KB, 1000 of 90 KB). */
#define CAUSES_SHOWN 3

/* "attempt 1: CAUSE; attempt 2: CAUSE" for the failed attempts: the
 * first and the last CAUSES_SHOWN, the others counted between them. */
char *hpu__restarts_causes(const hpu_restarts *r)
{
	size_t len = 64;
	for (int i = 0; i < r->attempt; i++)
		len += strlen(r->causes[i]) + 32;
	char *s = malloc(len);
	if (!s)
		return NULL;
	size_t used = 0;
	for (int i = 0; i < r->attempt; i++) {
		if (i == CAUSES_SHOWN && r->attempt > 2 * CAUSES_SHOWN) {
			int skip = r->attempt - 2 * CAUSES_SHOWN;
			used += (size_t)snprintf(s + used, len - used, "; %d more attempt%s (%d to %d)",
						 skip, skip == 1 ? "" : "s", i + 1, i + skip);
			i += skip - 1;
			continue;
		}
		used += (size_t)snprintf(s + used, len - used, "%sattempt %d: %s",
					 i ? "; " : "", i + 1, r->causes[i]);
	}
	s[used] = 0;
	return s;
}

int hpu__restarts_next(hpu_restarts *r, const char *cause)
{
	char **grown = realloc(r->causes, (size_t)(r->attempt + 1) * sizeof *grown);
	char *copy = strdup(cause && *cause ? cause : "no cause given");
	if (!grown || !copy) {
		free(copy);
		if (grown)
			r->causes = grown;
		hpu__log(HPU_LOG_ERROR, "out of memory: no more restarts");
		return 0;
	}
	r->causes = grown;
	r->causes[r->attempt++] = copy;
	if (r->attempt <= r->max) {
		hpu__log(HPU_LOG_WARNING, "attempt %d of %d failed: %s; restarting (restart %d of %d)",
			 r->attempt, r->max + 1, copy, r->attempt, r->max);
		return 1;
	}
	if (r->max > 0) {
		char *all = hpu__restarts_causes(r);
		hpu__log(HPU_LOG_ERROR, "job failed after %d restart%s: %s", r->max,
			 r->max == 1 ? "" : "s", all ? all : "(out of memory)");
		free(all);
	}
	return 0;
}

void hpu__restarts_free(hpu_restarts *r)
{
	for (int i = 0; r->causes && i < r->attempt; i++)
		free(r->causes[i]);
	free(r->causes);
	r->causes = NULL;
	r->attempt = 0;
}
