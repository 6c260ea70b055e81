/* Writes fuzz_decode's seed corpus into DIR: for every kind of Envelope a
 * packed body ("body-<kind>") and the same body signed with the fuzz key
 * at the fuzz clock ("frame-<kind>"), which verifies inside the target.
 * Run at build time, so the seeds follow hpu.proto.
 *
 *     gen_corpus DIR */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto/auth.h"
#include "proto/codec.h"
#include "tests/fuzz/fuzz_decode.h"

static const char *dir;
static hpu_auth *auth;

static void write_file(const char *prefix, const char *name, const void *p,
		       size_t n)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s-%s", dir, prefix, name);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
		fprintf(stderr, "gen_corpus: %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

/* Writes env as body-NAME and frame-NAME. */
static void seed(const char *name, const Hpu__Envelope *env)
{
	uint8_t *body = NULL, *frame = NULL;
	size_t n = hpu__codec_pack(env, &body);
	if (!body) {
		fprintf(stderr, "gen_corpus: out of memory\n");
		exit(1);
	}
	write_file("body", name, body, n);
	size_t len = hpu__auth_sign(auth, body, n, FUZZ_NOW_MS, &frame);
	if (!len) {
		fprintf(stderr, "gen_corpus: cannot sign %s\n", name);
		exit(1);
	}
	write_file("frame", name, frame, len);
	free(frame);
	free(body);
}

static void job_messages(void)
{
	Hpu__RankInfo r0 = HPU__RANK_INFO__INIT, r1 = HPU__RANK_INFO__INIT;
	r0.rank = 0;
	r0.pid = 4242;
	r0.endpoint = "tcp://10.0.0.1:40001";
	r0.host = "node0";
	r1.rank = 1;
	r1.node_rank = 1;
	r1.pid = 4343;
	r1.endpoint = "tcp://10.0.0.2:40001";
	r1.host = "node1";
	Hpu__RankInfo *ranks[] = {&r0, &r1};

	Hpu__Envelope e = HPU__ENVELOPE__INIT;
	Hpu__Join join = HPU__JOIN__INIT;
	join.job_id = "job-1";
	join.token = "0123456789abcdef";
	join.self = &r1;
	join.world_size = 2;
	e.msg_case = HPU__ENVELOPE__MSG_JOIN;
	e.join = &join;
	seed("join", &e);

	Hpu__JoinReply jr = HPU__JOIN_REPLY__INIT;
	jr.ok = 1;
	jr.n_ranks = 2;
	jr.ranks = ranks;
	e.msg_case = HPU__ENVELOPE__MSG_JOIN_REPLY;
	e.join_reply = &jr;
	seed("join_reply", &e);

	Hpu__AgentHello ah = HPU__AGENT_HELLO__INIT;
	ah.job_id = "job-1";
	ah.token = "0123456789abcdef";
	ah.node_rank = 1;
	ah.nodes = 2;
	ah.devices = 8;
	e.msg_case = HPU__ENVELOPE__MSG_AGENT_HELLO;
	e.agent_hello = &ah;
	seed("agent_hello", &e);

	Hpu__WorkerExit we = HPU__WORKER_EXIT__INIT;
	we.rank = 3;
	we.pid = 99;
	we.exit_code = -1;
	we.signal = 9;
	e.msg_case = HPU__ENVELOPE__MSG_WORKER_EXIT;
	e.worker_exit = &we;
	seed("worker_exit", &e);

	Hpu__AgentDone ad = HPU__AGENT_DONE__INIT;
	ad.node_rank = 1;
	e.msg_case = HPU__ENVELOPE__MSG_AGENT_DONE;
	e.agent_done = &ad;
	seed("agent_done", &e);

	Hpu__Abort ab = HPU__ABORT__INIT;
	ab.reason = "rank 1 (node 0, pid 4242) was killed by signal 9";
	e.msg_case = HPU__ENVELOPE__MSG_ABORT;
	e.abort = &ab;
	seed("abort", &e);

	Hpu__JobDone jd = HPU__JOB_DONE__INIT;
	e.msg_case = HPU__ENVELOPE__MSG_JOB_DONE;
	e.job_done = &jd;
	seed("job_done", &e);

	Hpu__Heartbeat hb = HPU__HEARTBEAT__INIT;
	hb.node_rank = 1;
	e.msg_case = HPU__ENVELOPE__MSG_HEARTBEAT;
	e.heartbeat = &hb;
	seed("heartbeat", &e);
}

static void daemon_messages(void)
{
	static char *argv[] = {"--epochs", "1", "/srv/models/mlp.so", "--",
			       "--hidden", "512"};
	uint32_t ids[] = {0, 1, 2, 3};
	Hpu__Envelope e = HPU__ENVELOPE__INIT;

	Hpu__LaunchRequest lr = HPU__LAUNCH_REQUEST__INIT;
	lr.job_id = "job-1";
	lr.job_token = "0123456789abcdef";
	lr.node_rank = 1;
	lr.nodes = 2;
	lr.devices = 4;
	lr.master_addr = "10.0.0.1";
	lr.master_port = 29500;
	lr.n_argv = sizeof argv / sizeof argv[0];
	lr.argv = argv;
	lr.transport = "auto";
	e.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REQUEST;
	e.launch_request = &lr;
	seed("launch_request", &e);

	Hpu__LaunchReply lp = HPU__LAUNCH_REPLY__INIT;
	lp.job_id = "job-1";
	lp.ok = 1;
	lp.n_device_ids = 4;
	lp.device_ids = ids;
	e.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REPLY;
	e.launch_reply = &lp;
	seed("launch_reply", &e);

	Hpu__StatusRequest sq = HPU__STATUS_REQUEST__INIT;
	e.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	e.status_request = &sq;
	seed("status_request", &e);

	Hpu__JobStatus js = HPU__JOB_STATUS__INIT;
	js.job_id = "job-1";
	js.node_rank = 1;
	js.n_device_ids = 4;
	js.device_ids = ids;
	js.live_workers = 4;
	js.seconds = 12.5;
	js.submitter = "10.0.0.9";
	Hpu__JobStatus *jobs[] = {&js};
	Hpu__StatusReply sr = HPU__STATUS_REPLY__INIT;
	sr.n_jobs = 1;
	sr.jobs = jobs;
	sr.devices_total = 8;
	sr.devices_free = 4;
	e.msg_case = HPU__ENVELOPE__MSG_STATUS_REPLY;
	e.status_reply = &sr;
	seed("status_reply", &e);

	Hpu__LogLine ll = HPU__LOG_LINE__INIT;
	ll.job_id = "job-1";
	ll.rank = 2;
	ll.text = "[rank 2] step 50 loss 0.4321";
	e.msg_case = HPU__ENVELOPE__MSG_LOG_LINE;
	e.log_line = &ll;
	seed("log_line", &e);

	Hpu__JobEnd je = HPU__JOB_END__INIT;
	je.job_id = "job-1";
	je.node_rank = 1;
	je.reason = "rank 5 exited with code 1";
	e.msg_case = HPU__ENVELOPE__MSG_JOB_END;
	e.job_end = &je;
	seed("job_end", &e);

	Hpu__Cancel ca = HPU__CANCEL__INIT;
	ca.job_id = "job-1";
	e.msg_case = HPU__ENVELOPE__MSG_CANCEL;
	e.cancel = &ca;
	seed("cancel", &e);

	Hpu__Ping pi = HPU__PING__INIT;
	pi.job_id = "job-1";
	e.msg_case = HPU__ENVELOPE__MSG_PING;
	e.ping = &pi;
	e.instance = "0123456789abcdef0123456789abcdef";
	e.session = "fedcba9876543210fedcba9876543210";
	e.seq = 12345;
	seed("ping_bound", &e);

	Hpu__Hello he = HPU__HELLO__INIT;
	e.msg_case = HPU__ENVELOPE__MSG_HELLO;
	e.hello = &he;
	e.instance = "";
	seed("hello", &e);

	Hpu__HelloReply hr = HPU__HELLO_REPLY__INIT;
	hr.instance = "0123456789abcdef0123456789abcdef";
	e.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	e.hello_reply = &hr;
	e.instance = hr.instance;
	e.seq = 1;
	seed("hello_reply", &e);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_corpus DIR\n");
		return 2;
	}
	dir = argv[1];
	if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "gen_corpus: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	uint8_t key[HPU_AUTH_KEY_BYTES];
	fuzz_key(key);
	auth = hpu__auth_new(key, FUZZ_WINDOW_MS, FUZZ_MAX_NONCES);
	if (!auth) {
		fprintf(stderr, "gen_corpus: out of memory\n");
		return 1;
	}
	job_messages();
	daemon_messages();
	Hpu__Envelope empty = HPU__ENVELOPE__INIT;
	seed("empty", &empty);
	hpu__auth_destroy(&auth);
	return 0;
}
