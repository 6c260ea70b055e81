/* hpulaunch: starts a job's workers on this node and supervises them;
 * on node 0 it also runs the job's coordinator. See --help. */
#include <errno.h>
#include <ev.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher/args.h"
#include "launcher/modelcheck.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/num.h"
#include "common/log.h"
#include "agent/nodejob.h"
#include "agent/output.h"
#include "agent/progress.h"
#include "agent/restart.h"
#include "launcher/submit.h"

/* The job on this node (torchrun style). */
typedef struct launch {
	struct ev_loop *loop;
	hpu_launch_args args;
	hpu_nodejob *job;
	ev_signal sigint, sigterm, sighup;
	int ended, failed;
	int apart;      /* the nodes are set up otherwise: no restart */
	int unsaid;     /* the attempt's failure cause is not printed yet */
	int signo;      /* interrupted by this signal */
	int intr_elsewhere; /* the job ended at another node's interrupt */
	char cause[700]; /* why the attempt failed */
	hpu_restarts restarts;
	hpu_progress bar; /* rank 0's progress bar (--progress) */
	ev_timer bar_tick;
} launch;

static launch L;

static void on_end(hpu_nodejob *j, int failed, const char *cause, void *arg)
{
	(void)j;
	(void)arg;
	L.ended = 1;
	L.failed = failed;
	snprintf(L.cause, sizeof L.cause, "%s", cause ? cause : "");
	ev_break(L.loop, EVBREAK_ALL);
}

/* With the bar on, the workers' lines come here: the bar is cleared,
 * the line printed, the bar drawn again. */
static void on_line(hpu_nodejob *j, int rank, int is_err, const char *line, size_t len,
		    void *arg)
{
	(void)j;
	(void)arg;
	FILE *f = is_err ? stderr : stdout;
	if (!hpu__output_std_ok(is_err ? 2 : 1))
		return; /* said once: the rest is lost */
	hpu__progress_hide(&L.bar);
	fprintf(f, "[rank %d] %.*s\n", rank, (int)len, line);
	hpu__output_stream(f);
	hpu__progress_show(&L.bar);
}

static void on_status(hpu_nodejob *j, int rank, const hpu_status_rec *st, void *arg)
{
	(void)j;
	(void)arg;
	if (rank == 0)
		hpu__progress_update(&L.bar, st);
}

/* A worker ended: what is said about it next must not land on the bar. */
static void on_exit_worker(hpu_nodejob *j, int rank, int pid, int status, void *arg)
{
	(void)j;
	(void)rank;
	(void)pid;
	(void)arg;
	if (status != 0)
		hpu__progress_hide(&L.bar);
}

static void on_bar_tick(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)t;
	(void)revents;
	hpu__progress_tick(&L.bar);
}

/* The signals' own handler, over libev's: it also marks the interrupt,
 * so that a write to stdout or stderr that waits (a pipe nobody reads, a
 * pager scrolled back) gives up and the loop gets to the signal
 * (hpu__write_all; Ctrl-C and SIGTERM did nothing while output waited). */
static void on_raw_signal(int sig)
{
	hpu__write_interrupted = 1;
	ev_feed_signal(sig);
}

static void take_signals(void)
{
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_raw_signal;
	sigfillset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
		sigaction(sigs[i], &sa, NULL);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	hpu__progress_hide(&L.bar);
	if (L.signo) { /* a second Ctrl-C: no more grace */
		hpu__nodejob_cancel(L.job, "interrupted again", 0);
		return;
	}
	char reason[160];
	snprintf(reason, sizeof reason, "interrupted by %s on node %d",
		 w->signum == SIGINT ? "SIGINT" : w->signum == SIGHUP ? "SIGHUP" : "SIGTERM",
		 L.args.node_rank);
	int live = hpu__nodejob_live(L.job);
	hpu__log(HPU_LOG_NOTICE, "%s: stopping %d worker%s", reason, live, hpu__plural(live));
	L.signo = w->signum;
	hpu__nodejob_cancel(L.job, reason, L.args.grace_s);
}

static int exit_status(void)
{
	if (L.signo)
		return 128 + L.signo;
	return L.failed ? 1 : 0;
}

/* Runs one attempt of the node's job to its end. Returns 0 when it ran
 * (L.failed, L.cause and L.signo say how it went), -1 when it could not
 * start (the reason in err). */
static int run_attempt(char *err, size_t errlen)
{
	hpu_nodejob_cfg jc = {
		.node_rank = L.args.node_rank,
		.nodes = L.args.nodes,
		.devices = L.args.devices,
		.master_addr = L.args.master_addr,
		.master_port = L.args.master_port,
		.job_id = L.args.job_id,
		.token = L.args.token,
		.restart_count = L.restarts.attempt,
		.max_restarts = L.args.max_restarts,
		.argv = L.args.worker_argv,
		.search_path = L.args.exec_mode,
		.hpu_workers = !L.args.exec_mode,
		.log_dir = L.args.log_dir,
		.transport = L.args.transport,
		.join_timeout_s = L.args.join_timeout_s,
		.agent_timeout_s = L.args.agent_timeout_s,
		.grace_s = L.args.grace_s,
		.on_end = on_end,
	};
	if (L.bar.on) {
		jc.on_line = on_line;
		jc.on_status = on_status;
		jc.on_exit = on_exit_worker;
	}
	L.ended = L.failed = L.apart = L.unsaid = 0;
	L.cause[0] = 0;
	if (!(L.job = hpu__nodejob_start(L.loop, &jc, err, errlen)))
		return -1;
	if (!L.args.quiet) {
		char ranks[64]; /* "rank 0", "ranks 0-1" (it said "ranks 0-0") */
		int r0 = hpu__nodejob_rank(L.job, 0), r1 = hpu__nodejob_rank(L.job, L.args.devices - 1);
		if (r0 == r1)
			snprintf(ranks, sizeof ranks, "rank %d", r0);
		else
			snprintf(ranks, sizeof ranks, "ranks %d-%d", r0, r1);
		hpu__log(HPU_LOG_INFO, "job %s: node %d of %d, %s of %d, coordinator %s:%d",
			 L.args.job_id, L.args.node_rank, L.args.nodes, ranks, L.args.world,
			 L.args.master_addr, hpu__nodejob_master_port(L.job));
	}
	ev_run(L.loop, 0);
	hpu__progress_reset(&L.bar);
	long bad = hpu__nodejob_status_bad(L.job);
	if (bad)
		hpu__log(HPU_LOG_WARNING, "warning: %ld malformed status lines from the workers were ignored (HPU_STATUS_FD)",
			 bad);
	L.apart = hpu__nodejob_set_up_apart(L.job);
	L.intr_elsewhere = hpu__nodejob_interrupted_elsewhere(L.job);
	L.unsaid = hpu__nodejob_cause_unsaid(L.job);
	hpu__nodejob_destroy(&L.job); /* every worker is reaped by now */
	return 0;
}

/* The node's job, attempt after attempt while it fails and restarts
 * remain (--max-restarts); a user's interrupt ends it at once. */
static int run_local(char *err, size_t errlen)
{
	L.loop = EV_DEFAULT;
	ev_signal_init(&L.sigint, on_signal, SIGINT);
	ev_signal_init(&L.sigterm, on_signal, SIGTERM);
	/* SIGHUP (the terminal or ssh session closed) as SIGTERM: the
	 * workers stopped with their grace, a save cleaned up (its default
	 * action killed hpulaunch alone, and the workers with SIGKILL) */
	ev_signal_init(&L.sighup, on_signal, SIGHUP);
	ev_signal_start(L.loop, &L.sigint);
	ev_signal_start(L.loop, &L.sigterm);
	ev_signal_start(L.loop, &L.sighup);
	take_signals();
	/* Rank 0 runs on node 0: the bar is that node's. */
	hpu__progress_init(&L.bar, L.args.node_rank == 0 ? L.args.progress : HPU_PROGRESS_NEVER,
			   stdout);
	if (L.bar.on) {
		ev_timer_init(&L.bar_tick, on_bar_tick, 0.2, 0.2);
		ev_timer_start(L.loop, &L.bar_tick);
	}
	hpu__restarts_init(&L.restarts, L.args.max_restarts);
	int rc;
	for (;;) {
		if (run_attempt(err, errlen) < 0) {
			if (L.restarts.attempt == 0) {
				rc = 1; /* main says why */
				break;
			}
			hpu__log(HPU_LOG_ERROR, "error: %s", err);
			snprintf(L.cause, sizeof L.cause, "%s", err);
			err[0] = 0;
			L.failed = 1;
		}
		if (!L.failed || L.signo) {
			/* a failure, then Ctrl-C in its workers' grace: no
			 * restart follows to say the failure's cause */
			if (L.unsaid)
				hpu__log(HPU_LOG_ERROR, "error: %s", L.cause);
			rc = exit_status();
			break;
		}
		/* not to be restarted: a node set up otherwise (a restart meets
		 * the same refusal), or a user's interrupt of another node's
		 * hpulaunch (as at its own: it restarted, then waited
		 * --join-timeout for that node) */
		const char *why_not = L.apart ? "a node's hpulaunch is set up otherwise than this one, "
						"which a restart does not change"
				      : L.intr_elsewhere ? "a user interrupted another node's "
							   "hpulaunch, which stops the job"
							 : NULL;
		if (why_not && L.args.max_restarts > L.restarts.attempt) {
			/* the node job left the cause unsaid: a restart remained */
			if (L.unsaid)
				hpu__log(HPU_LOG_ERROR, "error: %s", L.cause);
			hpu__log(HPU_LOG_NOTICE, "not restarted (--max-restarts): %s", why_not);
			rc = exit_status();
			break;
		}
		if (!hpu__restarts_next(&L.restarts, L.cause)) {
			rc = 1;
			break;
		}
	}
	hpu__restarts_free(&L.restarts);
	return rc;
}

/* The config file's notes (options/), as log lines: a warning's at its
 * level, the others as notices. */
static void config_notes(const hpu_train_opts *o)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return;
	hpu__opts_config_notes(o, f, hpu__log_prefix());
	fclose(f);
	for (char *l = buf, *e; l && *l; l = e + 1) {
		e = strchr(l, '\n');
		if (e)
			*e = 0;
		hpu__log_plain(strstr(l, ": warning: ") ? HPU_LOG_WARNING : HPU_LOG_NOTICE, "%s", l);
		if (!e)
			break;
	}
	free(buf);
}

static int run(int argc, char **argv)
{
	char err[4096] = ""; /* a config file's errors, one a line */
	char env_err[512] = "";
	signal(SIGPIPE, SIG_IGN);
	/* a bad HPU_LOG_LEVEL is an error only where --log-level does not
	 * set the level instead (the flag wins over the environment) */
	int bad_env_level = hpu__log_init(env_err, sizeof env_err, "hpulaunch") < 0;
	int r = hpu__args_parse(&L.args, argc, argv, err, sizeof err);
	if (bad_env_level && !L.args.log_level && !(r > 0)) {
		hpu__log(HPU_LOG_ERROR, "error: %s", env_err);
		return 2;
	}
	if (r != 0) {
		if (r < 0)
			hpu__log(HPU_LOG_ERROR, "error: %s", err);
		return r < 0 ? 2 : 0;
	}
	/* Its own descriptors: the coordinator's ZeroMQ sockets and three
	 * pipes a worker (measured: 20 did not do for 2 workers, 24 did).
	 * ZeroMQ aborts the process where it finds none left ("Too many open
	 * files (src/epoll.cpp:65)", SIGABRT), so a limit below is said. */
	struct rlimit nf;
	unsigned long long need = 16 + 4ull * (unsigned long long)(L.args.devices > 0 ? L.args.devices : 1);
	if (!L.args.status_host && getrlimit(RLIMIT_NOFILE, &nf) == 0 && nf.rlim_cur != RLIM_INFINITY &&
	    (unsigned long long)nf.rlim_cur < need) {
		hpu__log(HPU_LOG_ERROR, "error: the limit on open files (ulimit -n) is %llu, and hpulaunch "
			 "needs about %llu for %d worker%s on this node (the coordinator's sockets and "
			 "the workers' pipes): raise it (ulimit -n)",
			 (unsigned long long)nf.rlim_cur, need, L.args.devices,
			 hpu__plural(L.args.devices));
		return 1;
	}
	/* The model, before any worker starts (a path that is no model fails
	 * here, not in every rank). */
	if (L.args.model && hpu__model_check(L.args.model, err, sizeof err) < 0) {
		hpu__log(HPU_LOG_ERROR, "error: %s", err);
		return 2;
	}
	/* The workers read it (hpucoll_comm_init_env); hpud gets it with the
	 * request (hpu__job_env). */
	if (L.args.data_plane)
		setenv(hpu__env_name(HPU_ENV_HPUCOLL_SECURITY), L.args.data_plane, 1);
	if (L.args.log_level) {
		hpu_log_level lvl = HPU_LOG_INFO;
		hpu__log_parse_level(L.args.log_level, "--log-level", &lvl, err, sizeof err);
		hpu__log_set_level(lvl);
		setenv(hpu__env_name(HPU_ENV_HPU_LOG_LEVEL), L.args.log_level, 1);
	}
	if (!L.args.exec_mode && !L.args.status_host)
		config_notes(&L.args.train);
	if (L.args.exec_ignored) /* they were dropped without a word */
		hpu__log(HPU_LOG_NOTICE, "note: the training options before --exec (%.*s, ...) have no "
			 "effect: the program gets its own arguments, not hpu-worker's",
			 (int)strcspn(L.args.exec_ignored, "="), L.args.exec_ignored);
	if (L.args.weak_token)
		hpu__log(HPU_LOG_WARNING, "warning: HPU_JOB_TOKEN is not set, so the job token was derived from SLURM_JOB_ID: anyone who knows the job id can join; export HPU_JOB_TOKEN before srun");
	int rc;
	if (L.args.status_host)
		rc = hpu__status_run(&L.args);
	else if (L.args.hostfile)
		rc = L.args.log_dir && hpu__make_dirs_said("log", L.args.log_dir, err, sizeof err) < 0
			     ? 2
			     : hpu__submit_run(&L.args);
	else if (!L.args.exec_mode &&
		 hpu__opts_check_outputs(&L.args.train, L.args.node_rank == 0, err, sizeof err) < 0)
		rc = 2; /* found now, not at the first save after training */
	else if (L.args.log_dir && hpu__make_dirs_said("log", L.args.log_dir, err, sizeof err) < 0)
		rc = 2; /* made where missing, as --checkpoint-dir (each worker's log failed to open) */
	else
		rc = run_local(err, sizeof err);
	if (rc && err[0])
		hpu__log(HPU_LOG_ERROR, "error: %s", err);
	hpu__args_free(&L.args);
	return rc;
}

/* A job that succeeded but whose output (stdout, stderr, --log-dir) could
 * not all be written exits HPU_OUTPUT_EXIT (output.h), after saying so. */
int main(int argc, char **argv)
{
	/* descriptors 0-2 closed (>&-): /dev/null in their place, or the
	 * loop's epoll and eventfd took them and the lines went there */
	/* (stderr: /dev/full, whose writes fail, so that a line lost there
	 * counts at the end; nowhere to say it) */
	static const char *const hold[3] = {"/dev/null", "/dev/null", "/dev/full"};
	int closed[3] = {0, 0, 0};
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
			if (open(hold[fd], fd ? O_WRONLY : O_RDONLY) != fd)
				return 2;
			closed[fd] = 1;
		}
	hpu__write_watch = 1; /* stdout and stderr: not held past a Ctrl-C */
	hpu__output_init();
	if (closed[1])
		hpu__output_std_closed(1);
	int rc = run(argc, argv);
	if (hpu__output_finish() && rc == 0)
		rc = HPU_OUTPUT_EXIT;
	return rc;
}
