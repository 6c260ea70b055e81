/* restart: hpulaunch --max-restarts K, shared by the local mode (main.c)
 * and the hostfile mode (submit.c).
 *
 * When a job's attempt fails (not because the user interrupted it) and
 * restarts remain, the job is stopped everywhere and started again with
 * HPU_RESTART_COUNT one higher in the workers' environment; after K failed
 * restarts the job fails with the root cause of every attempt.
 *
 * Attempts never mix: the workers of attempt n present a job token derived
 * from the job's token and n (hpu__attempt_token), so a coordinator refuses
 * a worker of another attempt, and agents say which attempt they run in
 * AgentHello.restart_count. */
#ifndef HPU_RESTART_H
#define HPU_RESTART_H

#include <stddef.h>

#define HPU_MAX_RESTARTS_LIMIT 1000

/* The token the workers of attempt `restart` present: for restart 0 the
 * job's token itself (so nothing changes without restarts), afterwards the
 * hex HMAC-SHA256 keyed by the token over "hpu-restart-<restart>" (64
 * characters). out must hold at least 129 bytes. */
void hpu__attempt_token(const char *token, int restart, char *out, size_t outlen);

/* The attempts of one job and why each failed. */
typedef struct hpu_restarts {
	int max;       /* K: restarts allowed */
	int attempt;   /* the running attempt: 0 first (HPU_RESTART_COUNT) */
	char **causes; /* the root cause of attempts 0..attempt-1 */
} hpu_restarts;

/* Starts at attempt 0 with `max` restarts allowed. */
void hpu__restarts_init(hpu_restarts *r, int max);

/* The failed attempts' causes as the closing line gives them: "attempt
 * 1: CAUSE; ..."; past 6 attempts the first 3 and the last 3, the others
 * counted ("; 4 more attempts (4 to 7)"). malloc'd; NULL without memory. */
char *hpu__restarts_causes(const hpu_restarts *r);

/* The running attempt failed because of `cause`. If a restart remains,
 * logs "attempt A of N failed: CAUSE; restarting (restart R of K)"
 * (common/log.h: after the program's prefix), moves on to the next
 * attempt and returns 1. Otherwise returns 0; with K > 0 it has then
 * logged "job failed after K restarts: attempt 1: CAUSE; attempt 2: ...". */
int hpu__restarts_next(hpu_restarts *r, const char *cause);

/* Frees the causes; safe twice. */
void hpu__restarts_free(hpu_restarts *r);

#endif
