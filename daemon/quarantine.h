/* quarantine: the job_uids (hpud.conf) that no job holds but processes
 * still run under. Such a uid is given to no job: its processes are
 * ended (SIGKILL), again every second (hpud__quarantine_check), and it
 * goes back to the pool once none is left. Needs root to end them.
 *
 * A zeroed hpud_quarantine with its log set keeps no uid. */
#ifndef HPUD_QUARANTINE_H
#define HPUD_QUARANTINE_H

#include "daemon/conf.h"

#define HPUD_MAX_QUARANTINE 64 /* uids kept out of the pool at once */

typedef struct hpud_quarantine {
	unsigned uid[HPUD_MAX_QUARANTINE];
	int n;
	void (*log)(hpud_log_level lvl, const char *fmt, ...)
		__attribute__((format(printf, 2, 3)));
} hpud_quarantine;

/* Whether uid is kept out of the pool. */
int hpud__quarantine_has(const hpud_quarantine *q, unsigned uid);

/* If processes run under uid: keeps it out of the pool, says so and why
 * (`whose`: "left by job ...") and ends them. Returns how many ran (0:
 * none, uid may be given out). */
int hpud__quarantine_if_used(hpud_quarantine *q, unsigned uid, const char *whose);

/* Every second: a uid under which nothing runs any more goes back to the
 * pool; the others' processes get SIGKILL again. */
void hpud__quarantine_check(hpud_quarantine *q);

#endif
