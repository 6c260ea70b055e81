/* save_resume_base: what saving and resuming share -- every rank's
 * outcome of a phase agreed on, a record for the metrics file, the line
 * about a stale partial checkpoint removed. Calls no other file of the
 * folder (save_resume_impl.h). */
#include "worker/runtime/save_resume_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "proto/status.h"

#define say hpu__say

/* Shares every rank's rec; returns how many failed and, in err, the first
 * failure as "rank R: ...". all[world] is the caller's (or NULL). */
int hpu__checkpoint_agree(hpucoll_comm *comm, const rec *mine, rec *all, char *err,
			  size_t errlen)
{
	int world = hpucoll_comm_size(comm), failed = 0, first = -1;
	rec *v = all ? all : calloc((size_t)world, sizeof *v);
	if (!v)
		return say(err, errlen, "out of memory"), world;
	int rc = hpucoll_all_gather(comm, mine, v, sizeof *mine, HPUCOLL_U8);
	if (rc) {
		say(err, errlen, "checkpoint all-gather failed: %s", hpucoll_comm_why(comm, rc));
		failed = world;
	} else {
		for (int r = world - 1; r >= 0; r--)
			if (!v[r].ok) {
				v[r].msg[sizeof v[r].msg - 1] = '\0';
				say(err, errlen, "rank %d: %s", r, v[r].msg);
				failed++;
				first = r; /* the lowest, whose message err keeps */
			}
	}
	/* this rank fails because another did (rank 0 could not write
	 * `latest`): the agent is told, to name that rank in its summary,
	 * not whichever exited first */
	if (first >= 0 && mine->ok)
		hpu__status_blame(first, HPU_BLAME_FAILED);
	if (!all)
		free(v);
	return failed;
}

/* Writes record j (freed) to the metrics file (rank 0's; NULL: none),
 * flushed; -1 with a sentence naming the file when it cannot. */
int hpu__checkpoint_metrics_put(FILE *metrics, const char *path, cJSON *j, char *err,
				size_t errlen)
{
	char *s = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!metrics) {
		free(s);
		return 0;
	}
	if (!s)
		return say(err, errlen, "out of memory writing the metrics file %s", path);
	int bad = hpu__append_line(metrics, s) < 0, e = errno;
	free(s);
	if (bad)
		return say(err, errlen, "cannot write the metrics file %s: %s", path, strerror(e));
	return 0;
}

void hpu__checkpoint_said_removed(const char *path, void *arg)
{
	(void)arg;
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	if (base[0] != '.') /* latest.tmp.PID */
		printf("checkpoint: removed %s (the temporary file of a 'latest' whose writing "
		       "was interrupted)\n",
		       path);
	else
		printf("checkpoint: removed the stale partial checkpoint %s (left by an "
		       "interrupted save or removal)\n",
		       path);
}
