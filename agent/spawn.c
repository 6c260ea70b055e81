/* Starting a worker (agent.h): its environment (ours, minus what the
 * agent sets, plus the job's), the fork and what the child does before
 * exec (process group, descriptors, CPU, user), its pipes and its log
 * file. Calls streams.c and statuspipe.c (agent/agent_impl.h). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "agent/agent_impl.h"
#include "common/fileio.h"

extern char **environ;

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

/* Says that exec of prog failed with errno e (async-signal-safe: no
 * stdio, no strerror). */
static void exec_failed(const char *prog, int e)
{
	static const struct {
		int e;
		const char *text;
	} why[] = {
		{ENOENT, "no such file"}, {EACCES, "permission denied"},
		{ENOEXEC, "not a program this machine runs (exec format error)"},
		{ENOTDIR, "a part of the path is not a directory"}, {ELOOP, "too many symbolic links"},
		{ENAMETOOLONG, "the name is too long"}, {ETXTBSY, "the file is open for writing"},
		{E2BIG, "the arguments and environment are too long"}, {ENOMEM, "out of memory"},
		{EPERM, "not permitted"},
	};
	const char *reason = "exec failed";
	for (size_t i = 0; i < sizeof why / sizeof why[0]; i++)
		if (why[i].e == e)
			reason = why[i].text;
	/* hpu__log_sigsafe takes 512 bytes: a long path keeps its end */
	static const char head[] = "cannot execute the worker program ";
	char text[480];
	size_t n = 0, plen = strlen(prog), room = sizeof text - 1 - (sizeof head - 1) - 2 - strlen(reason);
	const char *p = prog;
	if (plen > room) {
		p = prog + plen - (room - 3);
		plen = room - 3;
	}
	const char *parts[] = {head, plen < strlen(prog) ? "..." : "", p, ": ", reason};
	for (size_t i = 0; i < 5; i++)
		for (const char *c = parts[i]; *c && n < sizeof text - 1; c++)
			text[n++] = *c;
	text[n] = '\0';
	hpu__log_sigsafe(HPU_LOG_ERROR, text);
}

/* In the child, between fork and exec: only async-signal-safe calls. */
static void child_exec(const hpu_agent *a, const worker *w, int out, int err,
		       int status, char **env, pid_t parent)
{
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
	/* the parent's handlers (hpulaunch's, hpud's) are copies here: the
	 * default actions first, then the signals let in, so that a SIGTERM
	 * that came since the fork (held off there) stops this child rather
	 * than a handler that swallows it */
	static const int reset[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD};
	for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++)
		signal(reset[i], SIG_DFL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
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
	exec_failed(a->cfg.argv[0], errno);
	_exit(127);
}

static void start_stream(hpu_agent *a, worker *w, stream *s, int fd, int out_fd)
{
	s->fd = fd;
	s->out_fd = out_fd;
	s->w = w;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	ev_io_init(&s->io, hpu__agent_on_output, fd, EV_READ);
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
	const char *why = NULL;
	w->log_fd = hpu__open_unshared(path, a->cfg.restart_count > 0, 0644, &why);
	if (w->log_fd >= 0 && why) /* a lock that is not a job's, ignored */
		hpu__log(HPU_LOG_WARNING, "warning: %s: %s", path, why);
	if (w->log_fd < 0) {
		snprintf(err, errlen, "cannot write the log file %s: %s%s", path, why,
			 why == hpu__in_use_why ? " --log-dir" : "");
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
	ev_io_init(&sp->io, hpu__agent_on_status_pipe, fd, EV_READ);
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

int hpu__agent_spawn(hpu_agent *a, worker *w, char *err, size_t errlen)
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
	/* every signal held off across the fork: the child takes them once
	 * its actions are the default ones */
	sigset_t all, was;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &was);
	pid_t parent = getpid(), pid = fork();
	if (pid == 0)
		child_exec(a, w, po[1], pe[1], ps[1], env, parent);
	pthread_sigmask(SIG_SETMASK, &was, NULL);
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
	ev_child_init(&w->child, hpu__agent_on_child, pid, 0);
	w->child.data = w;
	ev_child_start(a->loop, &w->child);
	start_stream(a, w, &w->out, po[0], 1);
	start_stream(a, w, &w->err, pe[0], 2);
	start_status(a, w, ps[0]);
	return 0;
}
