/* hpulaunch: starts a job's workers on this node and supervises them;
 * on node 0 it also runs the job's coordinator. See --help. */
#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "agent.h"
#include "args.h"
#include "codec.h"
#include "coord.h"
#include "zwatch.h"

typedef struct launch {
	struct ev_loop *loop;
	hpu_launch_args args;
	hpu_agent *agent;
	hpu_coord *coord;       /* node 0 */
	void *ctx, *dealer;     /* other nodes: link to the coordinator */
	hpu_zwatch zw;
	ev_timer beat;
	char master_ip[64];     /* MASTER_ADDR, resolved */
	ev_tstamp started, coord_seen;
	ev_signal sigint, sigterm;
	int failed;     /* a worker failed or the job was aborted */
	int signo;      /* interrupted by this signal */
	int agent_idle, job_done;
	char root_cause[700];
} launch;

static launch L;

static void finish_if_ready(void)
{
	if (!L.agent_idle)
		return;
	if (L.failed || L.signo || L.job_done)
		ev_break(L.loop, EVBREAK_ALL);
}

/* Stops the local workers; the first cause is the one reported. */
static void fail(const char *cause, int print)
{
	if (!L.failed && !L.signo) {
		snprintf(L.root_cause, sizeof L.root_cause, "%s", cause);
		if (print)
			fprintf(stderr, "hpulaunch: error: %s\n", cause);
	}
	L.failed = 1;
	hpu_agent_stop(L.agent, L.args.grace_s);
	finish_if_ready();
}

static void send_to_coord(Hpu__Envelope *env)
{
	if (L.dealer && hpu_codec_send(L.dealer, NULL, env) != 0)
		fprintf(stderr, "hpulaunch: cannot reach the coordinator: %s\n",
			zmq_strerror(errno));
}

static void report_abort(const char *reason)
{
	if (L.coord) {
		hpu_coord_abort(L.coord, reason);
		return;
	}
	Hpu__Abort ab = HPU__ABORT__INIT;
	ab.reason = (char *)reason;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_ABORT;
	env.abort = &ab;
	send_to_coord(&env);
}

static void on_worker_exit(hpu_agent *a, int rank, pid_t pid, int status, void *arg)
{
	(void)a;
	(void)arg;
	if (status == 0 || L.failed || L.signo)
		return;
	char how[128], cause[400];
	hpu_describe_status(status, how, sizeof how);
	snprintf(cause, sizeof cause, "rank %d (node %d, pid %d) %s", rank,
		 L.args.node_rank, (int)pid, how);
	fail(cause, 1);
	if (L.coord) {
		hpu_coord_abort(L.coord, cause);
		return;
	}
	Hpu__WorkerExit we = HPU__WORKER_EXIT__INIT;
	we.rank = (uint32_t)rank;
	we.node_rank = (uint32_t)L.args.node_rank;
	we.pid = (uint32_t)pid;
	we.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	we.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_WORKER_EXIT;
	env.worker_exit = &we;
	send_to_coord(&env);
}

static void on_agent_idle(hpu_agent *a, void *arg)
{
	(void)a;
	(void)arg;
	L.agent_idle = 1;
	if (!L.failed && !L.signo) {
		if (L.coord) {
			hpu_coord_node_done(L.coord, 0);
		} else {
			Hpu__AgentDone d = HPU__AGENT_DONE__INIT;
			d.node_rank = (uint32_t)L.args.node_rank;
			Hpu__Envelope env = HPU__ENVELOPE__INIT;
			env.msg_case = HPU__ENVELOPE__MSG_AGENT_DONE;
			env.agent_done = &d;
			send_to_coord(&env);
		}
	}
	finish_if_ready();
}

static void on_coord_abort(hpu_coord *c, const char *reason, void *arg)
{
	(void)c;
	(void)arg;
	fail(reason, 1);
}

static void on_coord_done(hpu_coord *c, void *arg)
{
	(void)c;
	(void)arg;
	L.job_done = 1;
	finish_if_ready();
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	if (L.signo) { /* a second Ctrl-C: no more grace */
		hpu_agent_stop(L.agent, 0);
		return;
	}
	char reason[160];
	snprintf(reason, sizeof reason, "interrupted by %s on node %d",
		 w->signum == SIGINT ? "SIGINT" : "SIGTERM", L.args.node_rank);
	fprintf(stderr, "hpulaunch: %s: stopping %d workers\n", reason,
		hpu_agent_live(L.agent));
	report_abort(reason);
	L.signo = w->signum;
	hpu_agent_stop(L.agent, L.args.grace_s);
	finish_if_ready();
}

/* --- other nodes: the link to the coordinator --- */

static void on_coord_msg(hpu_zwatch *w, void *arg)
{
	(void)arg;
	Hpu__Envelope *m = hpu_codec_recv(w->sock, NULL, ZMQ_DONTWAIT);
	if (!m)
		return;
	L.coord_seen = ev_now(L.loop);
	if (m->msg_case == HPU__ENVELOPE__MSG_ABORT) {
		char cause[700];
		snprintf(cause, sizeof cause, "job aborted by the coordinator: %s",
			 m->abort->reason ? m->abort->reason : "");
		fail(cause, 1);
	} else if (m->msg_case == HPU__ENVELOPE__MSG_JOB_DONE) {
		L.job_done = 1;
		finish_if_ready();
	}
	hpu_codec_free(m);
}

static void on_beat(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)t;
	(void)revents;
	/* Until the coordinator first answers, it may still be starting. */
	int heard = L.coord_seen > L.started;
	double limit = heard ? L.args.agent_timeout_s : L.args.join_timeout_s;
	ev_tstamp since = heard ? L.coord_seen : L.started;
	if (ev_now(loop) - since > limit) {
		char cause[400];
		snprintf(cause, sizeof cause, "lost contact with the coordinator at %s:%d (silent for %g s)",
			 L.args.master_addr, L.args.master_port, limit);
		ev_timer_stop(loop, &L.beat);
		fail(cause, 1);
		return;
	}
	Hpu__Heartbeat hb = HPU__HEARTBEAT__INIT;
	hb.node_rank = (uint32_t)L.args.node_rank;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HEARTBEAT;
	env.heartbeat = &hb;
	send_to_coord(&env);
}

static int resolve(const char *host, char *out, size_t outlen)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, NULL, &hints, &ai) != 0)
		return -1;
	const char *r = inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr,
				  out, (socklen_t)outlen);
	freeaddrinfo(ai);
	return r ? 0 : -1;
}

static int connect_coord(char *err, size_t errlen)
{
	char ep[128];
	snprintf(ep, sizeof ep, "tcp://%s:%d", L.master_ip, L.args.master_port);
	int linger = 2000;
	int64_t maxmsg = HPU_CODEC_MAX_MSG;
	L.ctx = zmq_ctx_new();
	L.dealer = L.ctx ? zmq_socket(L.ctx, ZMQ_DEALER) : NULL;
	if (!L.dealer || zmq_setsockopt(L.dealer, ZMQ_LINGER, &linger, sizeof linger) ||
	    zmq_setsockopt(L.dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
	    zmq_connect(L.dealer, ep) || hpu_zwatch_start(&L.zw, L.loop, L.dealer, on_coord_msg, NULL)) {
		snprintf(err, errlen, "cannot connect to the coordinator at %s: %s", ep,
			 zmq_strerror(errno));
		return -1;
	}
	Hpu__AgentHello h = HPU__AGENT_HELLO__INIT;
	h.job_id = L.args.job_id;
	h.token = L.args.token;
	h.node_rank = (uint32_t)L.args.node_rank;
	h.nodes = (uint32_t)L.args.nodes;
	h.devices = (uint32_t)L.args.devices;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_AGENT_HELLO;
	env.agent_hello = &h;
	send_to_coord(&env);
	L.started = ev_now(L.loop);
	ev_timer_init(&L.beat, on_beat, 1.0, 1.0);
	ev_timer_start(L.loop, &L.beat);
	return 0;
}

static int start_coord(char *err, size_t errlen)
{
	hpu_coord_cfg cc = {
		.bind_addr = L.master_ip,
		.port = L.args.master_port,
		.job_id = L.args.job_id,
		.token = L.args.token,
		.nodes = L.args.nodes,
		.devices = L.args.devices,
		.join_timeout_s = L.args.join_timeout_s,
		.agent_timeout_s = L.args.agent_timeout_s,
		.on_abort = on_coord_abort,
		.on_done = on_coord_done,
	};
	L.coord = hpu_coord_new(L.loop, &cc, err, errlen);
	if (!L.coord)
		return -1;
	L.args.master_port = hpu_coord_port(L.coord);
	return 0;
}

static int exit_status(void)
{
	if (L.signo)
		return 128 + L.signo;
	return L.failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	char err[1024];
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	int r = hpu_args_parse(&L.args, argc, argv, err, sizeof err);
	if (r != 0) {
		if (r < 0)
			fprintf(stderr, "hpulaunch: error: %s\n", err);
		return r < 0 ? 2 : 0;
	}
	L.loop = EV_DEFAULT;
	ev_signal_init(&L.sigint, on_signal, SIGINT);
	ev_signal_init(&L.sigterm, on_signal, SIGTERM);
	ev_signal_start(L.loop, &L.sigint);
	ev_signal_start(L.loop, &L.sigterm);
	int rc = 1;
	if (resolve(L.args.master_addr, L.master_ip, sizeof L.master_ip) < 0) {
		snprintf(err, sizeof err, "cannot resolve the master address %s", L.args.master_addr);
		goto out;
	}
	if (L.args.node_rank == 0 ? start_coord(err, sizeof err) : connect_coord(err, sizeof err))
		goto out;
	hpu_agent_cfg ac = {
		.node_rank = L.args.node_rank,
		.nodes = L.args.nodes,
		.devices = L.args.devices,
		.master_addr = L.args.master_addr,
		.master_port = L.args.master_port,
		.job_id = L.args.job_id,
		.token = L.args.token,
		.argv = L.args.worker_argv,
		.search_path = L.args.exec_mode,
		.log_dir = L.args.log_dir,
		.transport = L.args.transport,
		.on_exit = on_worker_exit,
		.on_idle = on_agent_idle,
	};
	if (!(L.agent = hpu_agent_new(L.loop, &ac))) {
		snprintf(err, sizeof err, "out of memory");
		goto out;
	}
	if (!L.args.quiet)
		fprintf(stderr, "hpulaunch: job %s: node %d of %d, ranks %d-%d of %d, coordinator %s:%d\n",
			L.args.job_id, L.args.node_rank, L.args.nodes,
			hpu_agent_rank(L.agent, 0), hpu_agent_rank(L.agent, L.args.devices - 1),
			L.args.nodes * L.args.devices, L.args.master_addr, L.args.master_port);
	if (hpu_agent_start(L.agent, err, sizeof err) < 0)
		goto out;
	ev_run(L.loop, 0);
	rc = exit_status();
	err[0] = 0;
out:
	if (rc && err[0])
		fprintf(stderr, "hpulaunch: error: %s\n", err);
	hpu_agent_destroy(&L.agent);
	hpu_zwatch_stop(&L.zw);
	hpu_coord_destroy(&L.coord);
	if (L.dealer)
		zmq_close(L.dealer);
	if (L.ctx)
		zmq_ctx_term(L.ctx);
	hpu_args_free(&L.args);
	return rc;
}
