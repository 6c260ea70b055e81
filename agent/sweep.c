/* Finding and ending what a job's workers left behind (agent.h): which
 * processes are a's (its uid, its job's environment, children of ours),
 * one sweep of /proc signalling them, and the log's account of them.
 * Calls no other file of the agent but uidproc.c (agent/agent_impl.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/num.h"
#include "agent/uidproc.h"
#include "agent/agent_impl.h"

/* Agents that ended while others were under way, since the last one that
 * ended alone and left nothing: a process of theirs that replaced its
 * environment may have outlived them, and cannot be told from one of a
 * later job's. */
static int unsure_strays;

/* ---- what the workers leave behind ----
 *
 * This process is a child subreaper (hpu__agent_start), so a process that a
 * worker started and that outlives it, in the worker's process group or
 * not (setsid), becomes our child rather than init's. Once every worker is
 * reaped, the children of ours that are not workers are what the job left
 * behind: they are ended and reaped before the agent goes idle. */

/* Whether pid is a worker of any agent of this process, not yet reaped. */
static int is_live_worker(pid_t pid)
{
	for (const hpu_agent *b = hpu__agents; b; b = b->next)
		for (int i = 0; i < b->cfg.devices; i++)
			if (b->w[i].pid == pid && !b->w[i].reaped)
				return 1;
	return 0;
}

/* Whether a is the only agent of this process with a job under way. */
static int alone(const hpu_agent *a)
{
	for (const hpu_agent *b = hpu__agents; b; b = b->next)
		if (b != a && b->started && !b->idle_sent)
			return 0;
	return 1;
}

/* Whether the environment pid started with holds both needles (entries
 * "NAME=VALUE"). A job's processes carry its HPU_JOB_ID and this attempt's
 * HPU_JOB_TOKEN, unless they replaced their environment. Workers of another
 * user (set_user) are read as that user: hpud need not be able to read
 * every process's memory (CAP_SYS_PTRACE) to read theirs. */
static int env_has(const hpu_agent *a, pid_t pid, const char *n1, const char *n2)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	int uid = -1, gid = -1;
	if (a->cfg.set_user) {
		gid = setfsgid((gid_t)a->cfg.gid);
		uid = setfsuid((uid_t)a->cfg.uid);
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (a->cfg.set_user) {
		setfsuid((uid_t)uid);
		setfsgid((gid_t)gid);
	}
	if (fd < 0)
		return 0;
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap + 1);
	ssize_t k;
	while (buf && len < cap && ((k = read(fd, buf + len, cap - len)) > 0 ||
				    (k < 0 && errno == EINTR)))
		len += k > 0 ? (size_t)k : 0;
	close(fd);
	int found = 0;
	if (buf)
		buf[len] = 0; /* the last entry ends here at the latest */
	for (size_t i = 0; buf && i < len; i += strlen(buf + i) + 1) {
		found |= !strcmp(buf + i, n1);
		found |= !strcmp(buf + i, n2) << 1;
	}
	free(buf);
	return found == 3;
}

/* Whether a's workers run under a uid of their own (hpud's job_uids). */
static int own_uid(const hpu_agent *a)
{
	return a->cfg.set_user && a->cfg.job_uid_first && a->cfg.uid &&
	       a->cfg.uid >= a->cfg.job_uid_first && a->cfg.uid <= a->cfg.job_uid_last;
}

/* What a process is to a's hpu__agent_sweep (leftover_of). */
enum { NOT_ITS, ITS, MAYBE_ITS };

/* Whether pid (parent ppid, state from /proc/PID/stat) is a's to end: not
 * a worker; with a uid of its own, any process under that uid, and none
 * under another uid of the range; else a child of ours whose environment
 * names a's job and attempt, or, with no other job under way in this
 * process, any child: MAYBE_ITS when an earlier job may have left it
 * (unsure_strays). */
static int leftover_of(const hpu_agent *a, pid_t pid, pid_t ppid, char state)
{
	if (is_live_worker(pid))
		return NOT_ITS;
	hpu_procinfo pi;
	if (own_uid(a) && hpu__proc_info(pid, &pi) == 0) {
		if (hpu__proc_has_uid(&pi, a->cfg.uid))
			return ITS;
		if (hpu__proc_uid_in(&pi, a->cfg.job_uid_first, a->cfg.job_uid_last))
			return NOT_ITS; /* another job's */
	}
	if (ppid != getpid())
		return NOT_ITS;
	int lone = alone(a);
	if (state == 'Z' || state == 'X') /* its environment is gone */
		return lone ? ITS : NOT_ITS; /* reaped here, else by the loop */
	char id[600], tok[300];
	snprintf(id, sizeof id, "%s=%s", hpu__env_name(HPU_ENV_HPU_JOB_ID), a->cfg.job_id);
	snprintf(tok, sizeof tok, "%s=%s", hpu__env_name(HPU_ENV_HPU_JOB_TOKEN), a->cfg.token);
	if (env_has(a, pid, id, tok))
		return ITS;
	return !lone ? NOT_ITS : unsure_strays ? MAYBE_ITS : ITS;
}

/* The parent, process group and state of pid from /proc/PID/stat;
 * 0, or -1 when it is gone. */
static int proc_stat(pid_t pid, pid_t *ppid, pid_t *pgid, char *state)
{
	char buf[1024];
	if (hpu__proc_read(pid, "stat", buf, sizeof buf) != 0)
		return -1;
	const char *p = strrchr(buf, ')'); /* the command may hold anything */
	int pp, pg;
	if (!p || sscanf(p + 1, " %c %d %d", state, &pp, &pg) != 3)
		return -1;
	*ppid = pp;
	*pgid = pg;
	return 0;
}

/* Notes that pid was signalled; returns whether it was before. */
static int note_ended(pidset *set, pid_t pid)
{
	for (int i = 0; i < set->n; i++)
		if (set->v[i] == pid)
			return 1;
	if (set->n == set->cap) {
		int cap = set->cap ? 2 * set->cap : 8;
		pid_t *g = realloc(set->v, (size_t)cap * sizeof *g);
		if (!g)
			return 0;
		set->v = g;
		set->cap = cap;
	}
	set->v[set->n++] = pid;
	return 0;
}

/* Sends sig to every process a's workers left behind (SIGTERM only once
 * to each), and to its process group where it leads one; reaps those
 * that are already dead. With a uid of its own, SIGKILL goes to all
 * under that uid at once too (hpu__uid_kill). Returns how many there
 * were, dead children included (a zombie that is not ours is its
 * parent's to reap): 0 when none is left. */
int hpu__agent_sweep(hpu_agent *a, int sig)
{
	pid_t self = getpid(), group = getpgrp();
	int n = 0;
	DIR *dir = opendir("/proc");
	struct dirent *e;
	while (dir && (e = readdir(dir)) != NULL) {
		pid_t pid, ppid, pgid; /* an int */
		char state;
		int whose;
		if (hpu__parse_int(e->d_name, 1, INT_MAX, &pid) || pid == self ||
		    proc_stat(pid, &ppid, &pgid, &state) < 0 ||
		    (ppid != self && (!own_uid(a) || state == 'Z' || state == 'X')) ||
		    (whose = leftover_of(a, pid, ppid, state)) == NOT_ITS)
			continue;
		n++;
		if (state == 'Z' || state == 'X') {
			waitpid(pid, NULL, WNOHANG); /* ours: no watcher wants it */
			continue;
		}
		if (note_ended(whose == ITS ? &a->ended : &a->unsure, pid) && sig == SIGTERM)
			continue;
		kill(pid, sig);
		if (pgid == pid && pgid != group)
			kill(-pgid, sig);
	}
	if (dir)
		closedir(dir);
	if (n && sig == SIGKILL && own_uid(a))
		hpu__uid_kill(a->cfg.uid);
	return n;
}

/* "12 34 56" for the log. */
static const char *pid_list(const pidset *set, char *buf, size_t len)
{
	size_t k = 0;
	buf[0] = 0;
	for (int i = 0; i < set->n && k + 16 < len; i++)
		k += (size_t)snprintf(buf + k, len - k, "%s%d", i ? " " : "", (int)set->v[i]);
	return buf;
}

/* Says what was ended (and what would not end: `left`); a process that
 * an earlier job may have left is not put down to this one. Counts, in
 * unsure_strays, whether processes of this job's may have been left to
 * later ones. */
void hpu__agent_report_leftovers(const hpu_agent *a, int left)
{
	char pids[200];
	const pidset *e = &a->ended, *u = &a->unsure;
	if (e->n > 0)
		hpu__log(HPU_LOG_NOTICE, "ended %d process%s left behind by the job's workers (job %s, node %d; pid%s %s)",
			 e->n, e->n == 1 ? "" : "es", a->cfg.job_id,
			 a->cfg.node_rank, e->n == 1 ? "" : "s", pid_list(e, pids, sizeof pids));
	if (u->n > 0)
		hpu__log(HPU_LOG_NOTICE, "ended %d process%s left behind by this job or an earlier one (the environment names no job; found as job %s ended, node %d; pid%s %s)",
			 u->n, u->n == 1 ? "" : "es", a->cfg.job_id,
			 a->cfg.node_rank, u->n == 1 ? "" : "s", pid_list(u, pids, sizeof pids));
	if (!alone(a))
		unsure_strays++;
	else if (left == 0)
		unsure_strays = 0; /* none of ours is left: nobody's either */
	if (left > 0)
		hpu__log(HPU_LOG_WARNING, "warning: %d process%s left behind by the job's workers would not end (job %s, node %d)",
			 left, left == 1 ? "" : "es", a->cfg.job_id,
			 a->cfg.node_rank);
}
