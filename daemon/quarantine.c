/* quarantine: job_uids kept out of the pool while processes run under
 * them (quarantine.h). */
#include "daemon/quarantine.h"

#include <stdio.h>
#include <sys/types.h>

#include "agent/uidproc.h"

int hpud__quarantine_has(const hpud_quarantine *q, unsigned uid)
{
	for (int i = 0; i < q->n; i++)
		if (q->uid[i] == uid)
			return 1;
	return 0;
}

/* Keeps uid out of the pool, under which n processes still run (the
 * first of them in pids, at most 8), says so and why (`whose`), and
 * ends them (SIGKILL); hpud__quarantine_check takes it back once none is
 * left. */
static void quarantine(hpud_quarantine *q, unsigned uid, int n, const pid_t *pids,
		       const char *whose)
{
	char list[100] = "";
	size_t len = 0;
	for (int i = 0; i < n && i < 8 && len < sizeof list; i++)
		len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? " " : "",
					(int)pids[i]);
	if (!hpud__quarantine_has(q, uid) && q->n < HPUD_MAX_QUARANTINE)
		q->uid[q->n++] = uid;
	q->log(HPUD_LOG_WARN, "uid %u of job_uids is kept out of the pool: %d process%s still run%s under it (pid%s %s%s), %s; ending them",
	       uid, n, n == 1 ? "" : "es", n == 1 ? "s" : "", n == 1 ? "" : "s", list,
	       n > 8 ? " ..." : "", whose);
	hpu__uid_kill(uid);
}

int hpud__quarantine_if_used(hpud_quarantine *q, unsigned uid, const char *whose)
{
	pid_t pids[8];
	int n = hpu__uid_procs(uid, pids, 8);
	if (n > 0)
		quarantine(q, uid, n, pids, whose);
	return n;
}

void hpud__quarantine_check(hpud_quarantine *q)
{
	for (int i = 0; i < q->n;) {
		unsigned uid = q->uid[i];
		if (hpu__uid_procs(uid, NULL, 0) == 0) {
			q->log(HPUD_LOG_INFO, "uid %u of job_uids is back in the pool: no process runs under it any more",
			       uid);
			q->uid[i] = q->uid[--q->n];
			continue;
		}
		hpu__uid_kill(uid);
		i++;
	}
}
