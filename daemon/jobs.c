/* hpud's job table and devices: finding a job, retiring and releasing
 * one (its workers' remains, its devices, its uid: job_uids). Calls no
 * other file of hpud but logging.c (daemon/hpud.h). */
#include <stdlib.h>
#include <string.h>

#include "daemon/hpud.h"

/* ---- devices and the job table ---- */

int hpud__free_devices(void)
{
	int n = 0;
	for (int i = 0; i < hpud__D.conf.devices; i++)
		n += !hpud__D.busy[i];
	return n;
}

job *hpud__find_job(const char *id)
{
	for (int i = 0; i < MAX_JOBS; i++)
		if (hpud__D.jobs[i].used && strcmp(hpud__D.jobs[i].id, id) == 0)
			return &hpud__D.jobs[i];
	return NULL;
}

void hpud__free_argv(char **argv)
{
	for (int i = 0; argv && argv[i]; i++)
		free(argv[i]);
	free(argv);
}

/* ---- job_uids: no uid is given out while a process runs under it ---- */

/* Whether jobs run as uids of their own (job_uids). */
int hpud__own_uids(void)
{
	return hpud__D.set_user && hpud__D.conf.job_uid_first;
}

/* After j's workers and what they left were ended (hpu__nodejob_destroy):
 * a process that still runs under its uid keeps the uid out of the
 * pool. */
static void check_job_uid(const job *j)
{
	if (hpud__own_uids()) {
		char whose[128];
		snprintf(whose, sizeof whose, "left by job %s, which has ended", j->id);
		hpud__quarantine_if_used(&hpud__D.quarantine, j->uid, whose);
	}
}

/* Ends what j holds of the node: its workers' remains and its devices.
 * Its messages may still wait for the submitter (retired: ended, no nj). */
void hpud__retire_job(job *j)
{
	ev_timer_stop(hpud__D.loop, &j->progress_timer);
	if (j->nj) {
		hpu__nodejob_destroy(&j->nj);
		check_job_uid(j);
	}
	for (int i = 0; i < j->devices; i++)
		if (j->dev[i] >= 0 && j->dev[i] < MAX_DEVICES)
			hpud__D.busy[j->dev[i]] = 0;
	j->devices = 0;
}

void hpud__release_job(job *j)
{
	hpud__retire_job(j);
	hpud__outq_free(&j->out);
	hpud__free_argv(j->argv);
	hpud__free_argv(j->env);
	free(j->node_devices);
	memset(j, 0, sizeof *j);
}
