#include "agent/agent.h"
#include "common/fileio.h"
#include "common/log.h"
#include "agent/output.h"
#include "common/shmname.h"
#include "common/num.h"
#include "agent/uidproc.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <limits.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define LINE_MAX_BYTES 65536

/* After the last worker exits, its pipes get DRAIN_S to close (a helper
 * that outlives it may still be writing); then they are closed, and what
 * the workers left behind gets SIGTERM, SIGKILL LEFTOVER_GRACE_S later,
 * looked for every SWEEP_S, given up on GIVE_UP_S after the SIGKILL. */
#define DRAIN_S 1.0
#define LEFTOVER_GRACE_S 2.0
#define SWEEP_S 0.05
#define GIVE_UP_S 5.0

extern char **environ;

/* Distinct pids, for the log. */
typedef struct pidset {
	pid_t *v;
	int n, cap;
} pidset;

/* One of a worker's output streams. */
typedef struct stream {
	ev_io io;
	int fd;
	int out_fd;  /* where prefixed lines go: 1 or 2 */
	char buf[LINE_MAX_BYTES];
	size_t len;
	struct worker *w;
} stream;

/* A worker's status pipe: records, one a line (hpu__status_parse). */
typedef struct status_pipe {
	ev_io io;
	int fd;
	char buf[512];
	size_t len;
	int skipping;            /* inside an over-long line: drop to its end */
	struct worker *w;
} status_pipe;

typedef struct worker {
	hpu_agent *a;
	int local, rank;
	pid_t pid;
	int reaped;
	ev_child child;
	stream out, err;
	status_pipe st;
	int hello;               /* it said "H1": it speaks the protocol */
	hpu_status_rec last;    /* the latest record ... */
	ev_tstamp last_at;       /* ... and when it came (0: none yet) */
	int culprit;             /* its blame line (hpu__status_blame): -1 none */
	hpu_blame culprit_how;
	int log_fd;
	char log_path[1024];     /* log_fd's (--log-dir) */
	char prefix[32];
	size_t prefix_len;
} worker;

struct hpu_agent {
	struct ev_loop *loop;
	hpu_agent_cfg cfg;
	worker *w;
	int live;     /* not yet reaped */
	int open;     /* output streams not yet at EOF */
	int started;  /* hpu__agent_start ran */
	int stopping;
	int impatient; /* stopped with no grace: SIGKILL what is left at once */
	int idle_sent;
	int held;     /* the workers' output is not read (hpu__agent_hold_output) */
	long status_bad;  /* malformed status lines */
	ev_timer kill_timer;
	/* What the workers left behind (see hpu_agent.h): */
	int draining;     /* every worker is reaped; their pipes may still be open */
	int ending;       /* ending the processes they left */
	int swept;        /* done with that */
	ev_tstamp kill_at, give_up_at;
	ev_timer drain_timer, sweep_timer;
	pidset ended;     /* the processes signalled (distinct), for the log: */
	pidset unsure;    /* ... and those that may be an earlier job's */
	struct hpu_agent *next; /* every agent of this process */
};

/* Every agent of this process: a process left behind becomes a child of
 * this process, whichever agent's job it came from. */
static hpu_agent *agents;

/* Agents that ended while others were under way, since the last one that
 * ended alone and left nothing: a process of theirs that replaced its
 * environment may have outlived them, and cannot be told from one of a
 * later job's. */
static int unsure_strays;

hpu_agent *hpu__agent_new(struct ev_loop *loop, const hpu_agent_cfg *cfg)
{
	hpu_agent *a = calloc(1, sizeof *a);
	if (!a)
		return NULL;
	a->loop = loop;
	a->cfg = *cfg;
	if (a->cfg.world <= 0) {
		a->cfg.rank_base = cfg->node_rank * cfg->devices;
		a->cfg.world = cfg->nodes * cfg->devices;
	}
	a->w = calloc((size_t)cfg->devices, sizeof *a->w);
	if (!a->w) {
		free(a);
		return NULL;
	}
	a->next = agents;
	agents = a;
	return a;
}

int hpu__agent_rank(const hpu_agent *a, int local)
{
	return a->cfg.rank_base + local;
}

int hpu__agent_live(const hpu_agent *a)
{
	return a->live;
}

void hpu__describe_status(int status, char *out, size_t outlen)
{
	if (status == HPU_AGENT_LEFT_EARLY)
		snprintf(out, outlen, "exited with code 0 before the job ended");
	else if (WIFEXITED(status))
		snprintf(out, outlen, "exited with code %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(out, outlen, "was killed by signal %d (%s)",
			 WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(out, outlen, "ended with status 0x%x", status);
}

void hpu__describe_blame(int culprit, hpu_blame how, const char *who, const char *where,
			 int reporter, char *out, size_t outlen)
{
	if (how == HPU_BLAME_DIED)
		snprintf(out, outlen, "rank %d%s died%s%s; rank %d found it gone", culprit, who,
			 *where ? " " : "", where, reporter);
	else if (how == HPU_BLAME_FAILED)
		snprintf(out, outlen, "rank %d%s failed first%s%s (its own error says why); rank %d "
				      "stopped because of it",
			 culprit, who, *where ? " " : "", where, reporter);
	else
		snprintf(out, outlen, "rank %d%s stopped answering%s%s; rank %d gave up waiting for it",
			 culprit, who, *where ? " " : "", where, reporter);
}

void hpu__describe_position(long step, long total, int phase, char *out, size_t outlen)
{
	char of[48] = "";
	if (total > 0)
		snprintf(of, sizeof of, " of %ld", total);
	if (phase == HPU_PHASE_SETUP)
		snprintf(out, outlen, "during setup, before step %ld%s", step + 1, of);
	else if (phase == HPU_PHASE_EVAL)
		snprintf(out, outlen, "in evaluation, after step %ld%s", step, of);
	else if (phase == HPU_PHASE_DONE || (total > 0 && step >= total))
		snprintf(out, outlen, "after step %ld%s", step, of);
	else
		snprintf(out, outlen, "in step %ld%s", step + 1, of);
}

static void maybe_idle(hpu_agent *a)
{
	if (a->live || a->open || !a->swept || a->idle_sent)
		return;
	a->idle_sent = 1;
	ev_timer_stop(a->loop, &a->kill_timer);
	if (a->cfg.on_idle)
		a->cfg.on_idle(a, a->cfg.arg);
}

/* The mark at the end of a piece of a line longer than the buffer: the
 * line goes on in the next one (nothing of it is dropped). */
#define CONTINUES " [hpu: line continues]"

/* A worker's line (or, `more`, a piece of an over-long one) to its
 * destination (on_line, else our stdout or stderr) and to its log file. A
 * log file that cannot be written is said once (output.h) and closed. */
static void emit(stream *s, const char *line, size_t n, int more)
{
	worker *w = s->w;
	const hpu_agent_cfg *c = &w->a->cfg;
	char out[LINE_MAX_BYTES + 128];
	size_t len = w->prefix_len;
	memcpy(out, w->prefix, len);
	memcpy(out + len, line, n);
	len += n;
	if (more) {
		memcpy(out + len, CONTINUES, sizeof CONTINUES - 1);
		len += sizeof CONTINUES - 1;
	}
	out[len] = '\n';
	if (c->on_line)
		c->on_line(w->a, w->rank, s->out_fd == 2, out + w->prefix_len,
			   len - w->prefix_len, c->arg);
	else
		hpu__output_std(s->out_fd, out, len + 1);
	if (w->log_fd >= 0 && hpu__output_file(w->log_fd, w->log_path, out, len + 1) < 0) {
		close(w->log_fd);
		w->log_fd = -1;
	}
}

/* Writes out every complete line in the buffer (all of it at EOF); a
 * full buffer without a newline goes out as a piece marked CONTINUES. */
static void flush_lines(stream *s, int eof)
{
	size_t start = 0;
	for (size_t i = 0; i < s->len; i++) {
		if (s->buf[i] == '\n') {
			emit(s, s->buf + start, i - start, 0);
			start = i + 1;
		}
	}
	if (start == 0 && s->len == sizeof s->buf) {
		emit(s, s->buf, s->len, !eof); /* an over-long line: a piece */
		start = s->len;
	} else if (eof && start < s->len) {
		emit(s, s->buf + start, s->len - start, 0);
		start = s->len;
	}
	memmove(s->buf, s->buf + start, s->len - start);
	s->len -= start;
}

static void end_leftovers(hpu_agent *a);

static void close_stream(hpu_agent *a, stream *s)
{
	flush_lines(s, 1);
	ev_io_stop(a->loop, &s->io);
	close(s->fd);
	s->fd = -1;
	a->open--;
	if (a->draining && !a->open)
		end_leftovers(a); /* the workers' pipes are closed: no more to wait for */
}

/* Reads what the stream holds (at most `max` reads; none more once the
 * output is held, but at the end); closes it at EOF or an error. */
static void read_stream(hpu_agent *a, stream *s, long max)
{
	for (long n = 0; s->fd >= 0 && n < max && !(a->held && !a->ending); n++) {
		ssize_t k = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
		if (k > 0) {
			s->len += (size_t)k;
			flush_lines(s, 0);
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		close_stream(a, s); /* EOF or error */
	}
}

static void on_output(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	stream *s = io->data;
	read_stream(s->w->a, s, LONG_MAX);
}

void hpu__agent_hold_output(hpu_agent *a, int hold)
{
	hold = !!hold;
	if (a->held == hold)
		return;
	a->held = hold;
	for (int i = 0; a->started && i < a->cfg.devices; i++) {
		stream *ss[2] = {&a->w[i].out, &a->w[i].err};
		for (int k = 0; k < 2; k++) {
			if (ss[k]->fd < 0)
				continue;
			if (hold)
				ev_io_stop(a->loop, &ss[k]->io);
			else
				ev_io_start(a->loop, &ss[k]->io);
		}
	}
}

static void status_line(status_pipe *sp, const char *line, size_t n)
{
	worker *w = sp->w;
	hpu_agent *a = w->a;
	hpu_status_rec r;
	if (n == 2 && memcmp(line, "H1", 2) == 0) {
		w->hello = 1;
		return;
	}
	int culprit, world = a->cfg.world > 0 ? a->cfg.world : a->cfg.nodes * a->cfg.devices;
	hpu_blame how;
	if (hpu__status_parse_blame(line, n, &culprit, &how) == 0) {
		if (w->culprit < 0 && culprit < world) {
			w->culprit = culprit;
			w->culprit_how = how;
		}
		return;
	}
	if (hpu__status_parse(line, n, &r) < 0) {
		a->status_bad++;
		return;
	}
	w->last = r;
	w->last_at = ev_now(a->loop);
	if (a->cfg.on_status)
		a->cfg.on_status(a, w->rank, &w->last, a->cfg.arg);
}

/* Reads what the pipe holds; closes it at EOF or an error. */
static void status_read(status_pipe *sp)
{
	hpu_agent *a = sp->w->a;
	while (sp->fd >= 0) {
		ssize_t k = read(sp->fd, sp->buf + sp->len, sizeof sp->buf - sp->len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		if (k <= 0) {
			if (sp->len && !sp->skipping)
				a->status_bad++; /* a record cut short */
			ev_io_stop(a->loop, &sp->io);
			close(sp->fd);
			sp->fd = -1;
			return;
		}
		sp->len += (size_t)k;
		size_t start = 0;
		for (size_t i = 0; i < sp->len; i++) {
			if (sp->buf[i] != '\n')
				continue;
			if (!sp->skipping)
				status_line(sp, sp->buf + start, i - start);
			sp->skipping = 0;
			start = i + 1;
		}
		if (start == 0 && sp->len == sizeof sp->buf) {
			if (!sp->skipping)
				a->status_bad++; /* no record is this long */
			sp->skipping = 1;
			start = sp->len;
		}
		memmove(sp->buf, sp->buf + start, sp->len - start);
		sp->len -= start;
	}
}

static void on_status_pipe(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	status_read(io->data);
}

int hpu__agent_status(const hpu_agent *a, int rank, hpu_status_rec *st, double *age_s)
{
	int local = rank - a->cfg.rank_base;
	if (local < 0 || local >= a->cfg.devices || a->w[local].last_at == 0)
		return -1;
	*st = a->w[local].last;
	*age_s = ev_now(a->loop) - a->w[local].last_at;
	if (*age_s < 0)
		*age_s = 0;
	return 0;
}

int hpu__agent_culprit(const hpu_agent *a, int rank, hpu_blame *how)
{
	int local = rank - a->cfg.rank_base;
	if (local < 0 || local >= a->cfg.devices || a->w[local].culprit < 0)
		return -1;
	*how = a->w[local].culprit_how;
	return a->w[local].culprit;
}

long hpu__agent_status_bad(const hpu_agent *a)
{
	return a->status_bad;
}

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
	for (const hpu_agent *b = agents; b; b = b->next)
		for (int i = 0; i < b->cfg.devices; i++)
			if (b->w[i].pid == pid && !b->w[i].reaped)
				return 1;
	return 0;
}

/* Whether a is the only agent of this process with a job under way. */
static int alone(const hpu_agent *a)
{
	for (const hpu_agent *b = agents; b; b = b->next)
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

/* What a process is to a's sweep (leftover_of). */
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
static int sweep(hpu_agent *a, int sig)
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
static void report_leftovers(const hpu_agent *a, int left)
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

static void finish_leftovers(hpu_agent *a, int left)
{
	ev_timer_stop(a->loop, &a->sweep_timer);
	a->ending = 0;
	a->swept = 1;
	report_leftovers(a, left);
	maybe_idle(a);
}

static void sweep_once(hpu_agent *a)
{
	ev_tstamp now = ev_time();
	int left = sweep(a, now >= a->kill_at ? SIGKILL : SIGTERM);
	if (left == 0 || now >= a->give_up_at)
		finish_leftovers(a, left);
}

static void on_sweep_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	sweep_once(t->data);
}

/* Closes the workers' pipes (after reading what they hold) and starts
 * ending what the workers left behind; on_idle comes when that is done. */
static void end_leftovers(hpu_agent *a)
{
	if (a->ending || a->swept)
		return;
	a->ending = 1;
	ev_timer_stop(a->loop, &a->drain_timer);
	for (int i = 0; i < a->cfg.devices; i++) {
		stream *ss[2] = {&a->w[i].out, &a->w[i].err};
		for (int k = 0; k < 2; k++) {
			read_stream(a, ss[k], 64);
			if (ss[k]->fd >= 0)
				close_stream(a, ss[k]);
		}
	}
	a->kill_at = ev_time() + (a->impatient ? 0 : LEFTOVER_GRACE_S);
	a->give_up_at = a->kill_at + GIVE_UP_S;
	ev_timer_init(&a->sweep_timer, on_sweep_timer, SWEEP_S, SWEEP_S);
	a->sweep_timer.data = a;
	ev_timer_start(a->loop, &a->sweep_timer);
	sweep_once(a);
}

static void on_drain_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	end_leftovers(t->data);
}

/* The last worker is reaped: its pipes get DRAIN_S to close unless the job
 * is being stopped; then what the workers left behind is ended. */
static void workers_done(hpu_agent *a)
{
	a->draining = 1;
	if (a->stopping || !a->open) {
		end_leftovers(a);
		return;
	}
	ev_timer_init(&a->drain_timer, on_drain_timer, DRAIN_S, 0);
	a->drain_timer.data = a;
	ev_timer_start(a->loop, &a->drain_timer);
}

/* The same at once, without the loop (hpu__agent_destroy): SIGKILL and reap
 * until nothing is left, for GIVE_UP_S at most. */
static void end_leftovers_now(hpu_agent *a)
{
	int left = 0;
	for (int i = 0; i < (int)(GIVE_UP_S * 100); i++) {
		if ((left = sweep(a, SIGKILL)) == 0)
			break;
		usleep(10000);
	}
	a->swept = 1;
	report_leftovers(a, left);
}

static void on_child(struct ev_loop *loop, ev_child *c, int revents)
{
	(void)revents;
	worker *w = c->data;
	hpu_agent *a = w->a;
	ev_child_stop(loop, c);
	status_read(&w->st); /* its last records before its end */
	w->reaped = 1;
	a->live--;
	int status = c->rstatus;
	/* exit(0) from a worker that never said it was done: it left early
	 * (a model that called exit()), which fails the job like any exit */
	if (status == 0 && w->hello && !(w->last_at > 0 && w->last.phase == HPU_PHASE_DONE))
		status = HPU_AGENT_LEFT_EARLY;
	if (a->cfg.on_exit)
		a->cfg.on_exit(a, w->rank, w->pid, status, a->cfg.arg);
	if (a->live == 0)
		workers_done(a);
}

static int device_of(const hpu_agent *a, const worker *w)
{
	return a->cfg.device_ids ? a->cfg.device_ids[w->local] : w->local;
}

const hpu_env_id hpu__job_env[] = {HPU_ENV_LOWER_LIST, HPU_ENV_FP32_LIST,
				  HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST,
				  HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST, HPU_ENV_QUANT_CONFIG,
				  HPU_ENV_HPUCOLL_SECURITY, HPU_ENV_OMP_NUM_THREADS,
				  HPU_ENV_OPENBLAS_NUM_THREADS, HPU_ENV_HPU_LOG_LEVEL, HPU_ENV_COUNT};

/* What the agent sets for every worker (HPUCOLL_TRANSPORT when it has
 * one): the agent's own values of these are not passed on. */
static const hpu_env_id launch_env[] = {
	HPU_ENV_RANK, HPU_ENV_LOCAL_RANK, HPU_ENV_WORLD_SIZE, HPU_ENV_LOCAL_WORLD_SIZE,
	HPU_ENV_NODE_RANK, HPU_ENV_NNODES, HPU_ENV_MASTER_ADDR, HPU_ENV_MASTER_PORT,
	HPU_ENV_HPU_JOB_ID, HPU_ENV_HPU_JOB_TOKEN, HPU_ENV_HPUCOLL_TRANSPORT,
	HPU_ENV_HPU_DEVICE_ID, HPU_ENV_HPU_RESTART_COUNT, HPU_ENV_HPU_MAX_RESTARTS,
	HPU_ENV_HPU_STATUS_FD, HPU_ENV_GROUP_RANK, HPU_ENV_ROLE_RANK, HPU_ENV_ROLE_WORLD_SIZE,
	HPU_ENV_TORCHELASTIC_RESTART_COUNT, HPU_ENV_TORCHELASTIC_MAX_RESTARTS,
	HPU_ENV_TORCHELASTIC_RUN_ID, HPU_ENV_CROSS_RANK, HPU_ENV_CROSS_SIZE, HPU_ENV_LOCAL_SIZE,
	HPU_ENV_COUNT};

/* What the agent's own service manager told it (hpud under systemd): a
 * worker is neither the service's main process nor writing to the
 * journal (its stderr is our pipe), so these are not passed on. */
static const hpu_env_id service_env[] = {HPU_ENV_NOTIFY_SOCKET, HPU_ENV_JOURNAL_STREAM,
					 HPU_ENV_COUNT};

/* "NAME=VALUE" for variable id, allocated; NULL when out of memory. */
static char *entry_str(hpu_env_id id, const char *value)
{
	char e[600];
	snprintf(e, sizeof e, "%s=%s", hpu__env_name(id), value);
	return strdup(e);
}

static char *entry_int(hpu_env_id id, int value)
{
	char v[16];
	snprintf(v, sizeof v, "%d", value);
	return entry_str(id, v);
}

/* Whether environment entry e ("NAME=..." or "NAME") sets a name that list (of
 * "NAME=VALUE", NULL-terminated) sets too. */
static int set_by(const char *e, char *const *list)
{
	size_t n = strcspn(e, "=");
	for (size_t i = 0; list && list[i]; i++)
		if (!strncmp(list[i], e, n) && list[i][n] == '=')
			return 1;
	return 0;
}

/* Builds the worker's environment: ours, minus what we set, plus the job's.
 * The launch variables come in our names and in torchrun's and DeepSpeed's
 * launchers' (one role, "default": ROLE_RANK is RANK); the thread counts
 * are 1 unless ours or the job's say otherwise. */
static char **make_env(const hpu_agent *a, const worker *w)
{
	size_t n = 0;
	while (environ[n])
		n++;
	size_t extra = 0;
	while (a->cfg.env && a->cfg.env[extra])
		extra++;
	char **env = calloc(n + 40 + extra, sizeof *env);
	if (!env)
		return NULL;
	size_t k = 0;
	int have_blas = set_by(hpu__env_name(HPU_ENV_OPENBLAS_NUM_THREADS), a->cfg.env);
	int have_omp = set_by(hpu__env_name(HPU_ENV_OMP_NUM_THREADS), a->cfg.env);
	for (size_t i = 0; i < n; i++) {
		int id = hpu__env_find(environ[i]);
		if (id == HPU_ENV_OPENBLAS_NUM_THREADS)
			have_blas = 1;
		if (id == HPU_ENV_OMP_NUM_THREADS)
			have_omp = 1;
		if (!(id >= 0 && (hpu__env_in(id, launch_env) || hpu__env_in(id, service_env))) &&
		    !set_by(environ[i], a->cfg.env))
			env[k++] = strdup(environ[i]);
	}
	const hpu_agent_cfg *c = &a->cfg;
	int world = c->world;
	env[k++] = entry_int(HPU_ENV_RANK, w->rank);
	env[k++] = entry_int(HPU_ENV_LOCAL_RANK, w->local);
	env[k++] = entry_int(HPU_ENV_WORLD_SIZE, world);
	env[k++] = entry_int(HPU_ENV_LOCAL_WORLD_SIZE, c->devices);
	env[k++] = entry_int(HPU_ENV_NODE_RANK, c->node_rank);
	env[k++] = entry_int(HPU_ENV_NNODES, c->nodes);
	env[k++] = entry_str(HPU_ENV_MASTER_ADDR, c->master_addr);
	env[k++] = entry_int(HPU_ENV_MASTER_PORT, c->master_port);
	env[k++] = entry_str(HPU_ENV_HPU_JOB_ID, c->job_id);
	env[k++] = entry_str(HPU_ENV_HPU_JOB_TOKEN, c->token);
	env[k++] = entry_int(HPU_ENV_HPU_DEVICE_ID, device_of(a, w));
	env[k++] = entry_int(HPU_ENV_HPU_RESTART_COUNT, c->restart_count);
	env[k++] = entry_int(HPU_ENV_HPU_MAX_RESTARTS, c->max_restarts);
	env[k++] = entry_int(HPU_ENV_HPU_STATUS_FD, HPU_AGENT_STATUS_FD);
	env[k++] = entry_int(HPU_ENV_GROUP_RANK, c->node_rank);
	env[k++] = entry_int(HPU_ENV_ROLE_RANK, w->rank);
	env[k++] = entry_int(HPU_ENV_ROLE_WORLD_SIZE, world);
	env[k++] = entry_int(HPU_ENV_TORCHELASTIC_RESTART_COUNT, c->restart_count);
	env[k++] = entry_int(HPU_ENV_TORCHELASTIC_MAX_RESTARTS, c->max_restarts);
	env[k++] = entry_str(HPU_ENV_TORCHELASTIC_RUN_ID, c->job_id);
	env[k++] = entry_int(HPU_ENV_CROSS_RANK, c->node_rank);
	env[k++] = entry_int(HPU_ENV_CROSS_SIZE, c->nodes);
	env[k++] = entry_int(HPU_ENV_LOCAL_SIZE, c->devices);
	if (!have_blas)
		env[k++] = entry_int(HPU_ENV_OPENBLAS_NUM_THREADS, 1);
	if (!have_omp)
		env[k++] = entry_int(HPU_ENV_OMP_NUM_THREADS, 1);
	if (c->transport)
		env[k++] = entry_str(HPU_ENV_HPUCOLL_TRANSPORT, c->transport);
	for (size_t i = 0; i < extra; i++)
		env[k++] = strdup(c->env[i]);
	for (size_t i = 0; i < k; i++)
		if (!env[i])
			return NULL; /* leaks on OOM at start-up; we exit anyway */
	return env;
}

static void free_env(char **env)
{
	for (size_t i = 0; env && env[i]; i++)
		free(env[i]);
	free(env);
}

/* Closes every descriptor >= from (async-signal-safe). */
static void close_fds_from(int from)
{
	if (syscall(SYS_close_range, (unsigned)from, ~0u, 0u) == 0)
		return;
	long max = sysconf(_SC_OPEN_MAX);
	for (long fd = from; fd < (max > 0 && max < 1 << 20 ? max : 1 << 16); fd++)
		close((int)fd);
}

/* In the child, between fork and exec: only async-signal-safe calls. */
static void child_exec(const hpu_agent *a, const worker *w, int out, int err,
		       int status, char **env, pid_t parent)
{
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGPIPE, SIG_DFL);
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0)
		dup2(devnull, 0);
	dup2(out, 1);
	dup2(err, 2);
	/* The status pipe on its fixed fd, the one fd kept open across exec
	 * besides 0-2 (dup2 clears close-on-exec; on the same fd it stays). */
	if (status == HPU_AGENT_STATUS_FD)
		fcntl(status, F_SETFD, 0);
	else
		dup2(status, HPU_AGENT_STATUS_FD);
	/* Nothing else this process inherited reaches the worker (hpud's
	 * or the submitter's descriptors, without close-on-exec or not). */
	close_fds_from(HPU_AGENT_STATUS_FD + 1);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu > 0 && a->cfg.devices <= ncpu) {
		/* Pin by device where there is a core for each worker. */
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(device_of(a, w) % ncpu, &set);
		sched_setaffinity(0, sizeof set, &set);
	}
	if (a->cfg.set_user) {
		gid_t g = (gid_t)a->cfg.gid;
		if (setgroups(1, &g) != 0 || setgid(g) != 0 || setuid((uid_t)a->cfg.uid) != 0 ||
		    (a->cfg.uid != 0 && setuid(0) == 0)) {
			hpu__log_sigsafe(HPU_LOG_ERROR, "cannot switch the worker to its user");
			_exit(126);
		}
		/* Changing credentials cleared the parent-death signal: set it
		 * again, so that the workers die with hpud even under kill -9. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
	}
	if (a->cfg.search_path)
		execvpe(a->cfg.argv[0], a->cfg.argv, env);
	else
		execve(a->cfg.argv[0], a->cfg.argv, env);
	hpu__log_sigsafe(HPU_LOG_ERROR, "cannot execute the worker program");
	_exit(127);
}

static void start_stream(hpu_agent *a, worker *w, stream *s, int fd, int out_fd)
{
	s->fd = fd;
	s->out_fd = out_fd;
	s->w = w;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	ev_io_init(&s->io, on_output, fd, EV_READ);
	s->io.data = s;
	if (!a->held)
		ev_io_start(a->loop, &s->io);
	a->open++;
}

static int open_log(hpu_agent *a, worker *w, char *err, size_t errlen)
{
	w->log_fd = -1;
	if (!a->cfg.log_dir)
		return 0;
	char *path = w->log_path;
	snprintf(path, sizeof w->log_path, "%s/rank_%d.log", a->cfg.log_dir, w->rank);
	/* A restart adds to the log: the failed attempt's output stays. */
	int keep = a->cfg.restart_count > 0 ? O_APPEND : O_TRUNC;
	w->log_fd = open(path, O_WRONLY | O_CREAT | keep | O_CLOEXEC, 0644);
	if (w->log_fd < 0) {
		snprintf(err, errlen, "cannot write the log file %s: %s", path,
			 strerror(errno));
		return -1;
	}
	return 0;
}

static void start_status(hpu_agent *a, worker *w, int fd)
{
	status_pipe *sp = &w->st;
	sp->fd = fd;
	sp->w = w;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	ev_io_init(&sp->io, on_status_pipe, fd, EV_READ);
	sp->io.data = sp;
	ev_io_start(a->loop, &sp->io);
}

static void close_pipes(int (*p)[2], int n)
{
	for (int i = 0; i < n; i++) {
		close(p[i][0]);
		close(p[i][1]);
	}
}

static int spawn(hpu_agent *a, worker *w, char *err, size_t errlen)
{
	int pp[3][2], made = 0;
	int *po = pp[0], *pe = pp[1], *ps = pp[2];
	if (open_log(a, w, err, errlen) < 0)
		return -1;
	for (; made < 3; made++) {
		if ((made < 2 ? pipe(pp[made]) : pipe2(pp[made], O_CLOEXEC)) < 0) {
			snprintf(err, errlen, "pipe: %s", strerror(errno));
			close_pipes(pp, made);
			return -1;
		}
	}
	char **env = make_env(a, w);
	if (!env) {
		snprintf(err, errlen, "out of memory building the environment");
		close_pipes(pp, 3);
		return -1;
	}
	pid_t parent = getpid(), pid = fork();
	if (pid == 0)
		child_exec(a, w, po[1], pe[1], ps[1], env, parent);
	free_env(env);
	close(po[1]);
	close(pe[1]);
	close(ps[1]);
	if (pid < 0) {
		close(po[0]);
		close(pe[0]);
		close(ps[0]);
		snprintf(err, errlen, "fork: %s", strerror(errno));
		return -1;
	}
	setpgid(pid, pid); /* also here, so kill(-pid) works at once */
	w->pid = pid;
	a->live++;
	ev_child_init(&w->child, on_child, pid, 0);
	w->child.data = w;
	ev_child_start(a->loop, &w->child);
	start_stream(a, w, &w->out, po[0], 1);
	start_stream(a, w, &w->err, pe[0], 2);
	start_status(a, w, ps[0]);
	return 0;
}

int hpu__agent_start(hpu_agent *a, char *err, size_t errlen)
{
	/* What a worker leaves behind becomes our child, not init's, and can
	 * be found and ended (setsid or not). */
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	a->started = 1;
	for (int i = 0; i < a->cfg.devices; i++) {
		worker *w = &a->w[i];
		w->a = a;
		w->local = i;
		w->rank = hpu__agent_rank(a, i);
		w->out.fd = w->err.fd = w->st.fd = -1;
		w->culprit = -1;
		w->prefix_len = (size_t)snprintf(w->prefix, sizeof w->prefix,
						 "[rank %d] ", w->rank);
		if (spawn(a, w, err, errlen) < 0) {
			hpu__agent_stop(a, 0);
			return -1;
		}
	}
	return 0;
}

static void signal_all(hpu_agent *a, int sig)
{
	for (int i = 0; i < a->cfg.devices; i++)
		if (a->w[i].pid > 0 && !a->w[i].reaped)
			kill(-a->w[i].pid, sig);
}

static void on_kill_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	signal_all(t->data, SIGKILL);
}

void hpu__agent_stop(hpu_agent *a, double grace_s)
{
	if (grace_s <= 0)
		a->impatient = 1;
	if (a->stopping && grace_s <= 0) { /* again, impatient: no more grace */
		signal_all(a, SIGKILL);
		a->kill_at = ev_time();
	} else if (!a->stopping && grace_s <= 0) {
		signal_all(a, SIGKILL);
	} else if (!a->stopping) {
		signal_all(a, SIGTERM);
		ev_timer_init(&a->kill_timer, on_kill_timer, grace_s, 0);
		a->kill_timer.data = a;
		ev_timer_start(a->loop, &a->kill_timer);
	}
	a->stopping = 1;
	/* The workers are gone already, not what they left: end it now. */
	if (a->draining)
		end_leftovers(a);
}

/* Whether name is "hpucoll-<job>-<session>-n<node>" (shmname.h): this
 * node's segment of the job, whatever the coordinator's session was. */
static int is_node_seg(const char *name, const char *job, int node)
{
	int session = 0;
	return hpu__shm_seg_node(name, job, &session) == node && session;
}

/* The uid the workers run as: only their files are ever removed. */
static uid_t workers_uid(const hpu_agent *a)
{
	return a->cfg.set_user ? (uid_t)a->cfg.uid : geteuid();
}

/* Removes path when it is (itself, links not followed) the workers' user's;
 * a file another user made at that name stays. Returns 1 when removed. */
static int unlink_if_workers(const hpu_agent *a, int dirfd, const char *path)
{
	struct stat st;

	if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    st.st_uid != workers_uid(a) || S_ISDIR(st.st_mode))
		return 0;
	return unlinkat(dirfd, path, 0) == 0;
}

int hpu__agent_cleanup(const hpu_agent *a)
{
	char path[512];
	int n = 0;
	DIR *dir = opendir("/dev/shm");
	struct dirent *e;
	while (dir && (e = readdir(dir)) != NULL) {
		/* only the workers' user's: never another user's file at our
		 * name */
		if (is_node_seg(e->d_name, a->cfg.job_id, a->cfg.node_rank))
			n += unlink_if_workers(a, dirfd(dir), e->d_name);
	}
	if (dir)
		closedir(dir);
	for (int i = 0; i < a->cfg.devices; i++) {
		snprintf(path, sizeof path, "/tmp/hpucoll-%s-r%d", a->cfg.job_id,
			 hpu__agent_rank(a, i));
		n += unlink_if_workers(a, AT_FDCWD, path);
	}
	return n;
}

void hpu__agent_destroy(hpu_agent **pa)
{
	hpu_agent *a = *pa;
	if (!a)
		return;
	signal_all(a, SIGKILL);
	ev_timer_stop(a->loop, &a->kill_timer);
	for (int i = 0; i < a->cfg.devices; i++) {
		worker *w = &a->w[i];
		if (w->pid > 0 && !w->reaped) {
			ev_child_stop(a->loop, &w->child);
			waitpid(w->pid, NULL, 0);
			w->reaped = 1;
		}
		stream *ss[2] = {&w->out, &w->err};
		for (int k = 0; k < 2; k++)
			if (ss[k]->fd >= 0 && w->pid > 0) {
				ev_io_stop(a->loop, &ss[k]->io);
				close(ss[k]->fd);
			}
		if (w->st.fd >= 0 && w->pid > 0) {
			ev_io_stop(a->loop, &w->st.io);
			close(w->st.fd);
		}
		if (w->log_fd >= 0 && w->pid > 0)
			hpu__output_file_close(w->log_fd, w->log_path);
	}
	ev_timer_stop(a->loop, &a->drain_timer);
	ev_timer_stop(a->loop, &a->sweep_timer);
	if (a->started && !a->swept)
		end_leftovers_now(a);
	if (a->w[0].pid > 0)
		hpu__agent_cleanup(a);
	for (hpu_agent **p = &agents; *p; p = &(*p)->next)
		if (*p == a) {
			*p = a->next;
			break;
		}
	free(a->ended.v);
	free(a->unsure.v);
	free(a->w);
	free(a);
	*pa = NULL;
}
