/* libFuzzer target over hpud's decoding of a control frame: the signature
 * check (proto/auth.c), the protobuf-c unpack (proto/codec.c) and reading
 * every field of the Envelope as hpud does. Each input is used twice:
 *
 *   (a) as a whole frame: hpu__auth_verify must refuse it (or, for the
 *       signed seeds of gen_corpus.c, accept it) without reading outside
 *       it; a verified body is decoded;
 *   (b) as a body: signed with hpu__auth_sign, so that the decoder behind
 *       the signature gets fuzzed too. The signed frame must verify once,
 *       give back the same bytes, and be refused when replayed, truncated
 *       or changed in any one bit.
 *
 * A broken contract calls abort() (a crash for libFuzzer); memory errors,
 * undefined behaviour and leaks are found by the sanitizers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/auth.h"
#include "proto/codec.h"
#include "tests/fuzz/fuzz_decode.h"

static uint8_t key[HPU_AUTH_KEY_BYTES];

/* Folds every byte read into this, so that no read is optimized away. */
static volatile size_t sink;

static void check_failed(const char *what, int line)
{
	fprintf(stderr, "fuzz_decode: line %d: check failed: %s\n", line, what);
	abort();
}

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond))                                                   \
			check_failed(#cond, __LINE__);                         \
	} while (0)

/* ---- reading an Envelope as hpud does ---- */

/* A string field: never NULL after an unpack, and no longer than the
 * bytes it was decoded from. Reads every byte. */
static void str(const char *s, size_t msglen)
{
	CHECK(s != NULL);
	size_t n = strlen(s);
	CHECK(n <= msglen);
	size_t h = n;
	for (size_t i = 0; i < n; i++)
		h = h * 31 + (unsigned char)s[i];
	sink += h;
}

/* A repeated field: each element costs at least one byte on the wire. */
static void count(size_t n, const void *elems, size_t msglen)
{
	CHECK(n <= msglen);
	CHECK(n == 0 || elems != NULL);
	sink += n;
}

static void rank_info(const Hpu__RankInfo *r, size_t msglen)
{
	if (!r)
		return;
	sink += r->rank + r->node_rank + r->local_rank + r->pid;
	str(r->endpoint, msglen);
	str(r->host, msglen);
}

static void u32s(size_t n, const uint32_t *v, size_t msglen)
{
	count(n, v, msglen);
	for (size_t i = 0; i < n; i++)
		sink += v[i];
}

static void job_status(const Hpu__JobStatus *j, size_t msglen)
{
	CHECK(j != NULL);
	str(j->job_id, msglen);
	sink += j->node_rank + j->live_workers + (size_t)(j->seconds > 0);
	u32s(j->n_device_ids, j->device_ids, msglen);
	str(j->submitter, msglen);
}

/* The agent/coordinator messages. */
static void walk_job(const Hpu__Envelope *e, size_t len)
{
	switch (e->msg_case) {
	case HPU__ENVELOPE__MSG_JOIN:
		CHECK(e->join != NULL);
		str(e->join->job_id, len);
		str(e->join->token, len);
		rank_info(e->join->self, len);
		sink += e->join->world_size;
		break;
	case HPU__ENVELOPE__MSG_JOIN_REPLY:
		CHECK(e->join_reply != NULL);
		sink += (size_t)e->join_reply->ok;
		str(e->join_reply->error, len);
		count(e->join_reply->n_ranks, e->join_reply->ranks, len);
		for (size_t i = 0; i < e->join_reply->n_ranks; i++) {
			CHECK(e->join_reply->ranks[i] != NULL);
			rank_info(e->join_reply->ranks[i], len);
		}
		break;
	case HPU__ENVELOPE__MSG_AGENT_HELLO:
		CHECK(e->agent_hello != NULL);
		str(e->agent_hello->job_id, len);
		str(e->agent_hello->token, len);
		sink += e->agent_hello->node_rank + e->agent_hello->nodes +
			e->agent_hello->devices;
		break;
	case HPU__ENVELOPE__MSG_WORKER_EXIT:
		CHECK(e->worker_exit != NULL);
		sink += e->worker_exit->rank + e->worker_exit->node_rank +
			e->worker_exit->pid +
			(uint32_t)e->worker_exit->exit_code +
			(uint32_t)e->worker_exit->signal;
		break;
	case HPU__ENVELOPE__MSG_AGENT_DONE:
		CHECK(e->agent_done != NULL);
		sink += e->agent_done->node_rank;
		break;
	case HPU__ENVELOPE__MSG_ABORT:
		CHECK(e->abort != NULL);
		str(e->abort->reason, len);
		break;
	case HPU__ENVELOPE__MSG_HEARTBEAT:
		CHECK(e->heartbeat != NULL);
		sink += e->heartbeat->node_rank;
		break;
	default:
		break;
	}
}

/* hpud's own protocol. */
static void walk_daemon(const Hpu__Envelope *e, size_t len)
{
	switch (e->msg_case) {
	case HPU__ENVELOPE__MSG_LAUNCH_REQUEST: {
		const Hpu__LaunchRequest *r = e->launch_request;
		CHECK(r != NULL);
		str(r->job_id, len);
		str(r->job_token, len);
		sink += r->node_rank + r->nodes + r->devices + r->master_port;
		str(r->master_addr, len);
		count(r->n_argv, r->argv, len);
		for (size_t i = 0; i < r->n_argv; i++)
			str(r->argv[i], len);
		str(r->transport, len);
		break;
	}
	case HPU__ENVELOPE__MSG_LAUNCH_REPLY:
		CHECK(e->launch_reply != NULL);
		str(e->launch_reply->job_id, len);
		sink += (size_t)e->launch_reply->ok;
		str(e->launch_reply->error, len);
		u32s(e->launch_reply->n_device_ids,
		     e->launch_reply->device_ids, len);
		break;
	case HPU__ENVELOPE__MSG_STATUS_REPLY:
		CHECK(e->status_reply != NULL);
		count(e->status_reply->n_jobs, e->status_reply->jobs, len);
		for (size_t i = 0; i < e->status_reply->n_jobs; i++)
			job_status(e->status_reply->jobs[i], len);
		sink += e->status_reply->devices_total +
			e->status_reply->devices_free;
		break;
	case HPU__ENVELOPE__MSG_LOG_LINE:
		CHECK(e->log_line != NULL);
		str(e->log_line->job_id, len);
		sink += e->log_line->rank;
		str(e->log_line->text, len);
		break;
	case HPU__ENVELOPE__MSG_JOB_END:
		CHECK(e->job_end != NULL);
		str(e->job_end->job_id, len);
		sink += e->job_end->node_rank + (size_t)e->job_end->ok;
		str(e->job_end->reason, len);
		break;
	case HPU__ENVELOPE__MSG_CANCEL:
		CHECK(e->cancel != NULL);
		str(e->cancel->job_id, len);
		break;
	case HPU__ENVELOPE__MSG_PING:
		CHECK(e->ping != NULL);
		str(e->ping->job_id, len);
		break;
	default:
		break;
	}
}

/* Reads every field of the envelope decoded from `len` bytes; a set case
 * always has its message. A kind added to hpu.proto needs a case here. */
static void walk(const Hpu__Envelope *e, size_t len)
{
	if (e->msg_case == HPU__ENVELOPE__MSG_JOB_DONE)
		CHECK(e->job_done != NULL);
	if (e->msg_case == HPU__ENVELOPE__MSG_STATUS_REQUEST)
		CHECK(e->status_request != NULL);
	if (e->msg_case == HPU__ENVELOPE__MSG_HELLO)
		CHECK(e->hello != NULL);
	if (e->msg_case == HPU__ENVELOPE__MSG_HELLO_REPLY) {
		CHECK(e->hello_reply != NULL);
		str(e->hello_reply->instance, len);
	}
	str(e->instance, len); /* hpud's binding: every envelope has it */
	str(e->session, len);
	sink += (size_t)e->seq;
	walk_job(e, len);
	walk_daemon(e, len);
	sink += (size_t)e->msg_case;
}

/* Unpacks and walks; then packs the envelope again (so the packer is
 * fuzzed too) and walks what that unpacks to. The second unpack may fail:
 * protobuf-c 1.4.1 keeps an unknown field numbered 0 when its tag is an
 * overlong varint (82 00 ...), packs it back as 02 ..., and refuses that. */
static void decode(const void *body, size_t len)
{
	Hpu__Envelope *env = hpu__codec_unpack(body, len);
	if (!env)
		return;
	walk(env, len);
	uint8_t *out = NULL;
	size_t n = hpu__codec_pack(env, &out);
	CHECK(out != NULL);
	Hpu__Envelope *again = hpu__codec_unpack(out, n);
	if (again) {
		CHECK(again->msg_case == env->msg_case);
		walk(again, n);
		hpu__codec_free(again);
	}
	free(out);
	hpu__codec_free(env);
}

/* ---- the two paths ---- */

/* (a) The input as a frame off the wire. */
static void as_frame(const uint8_t *data, size_t size)
{
	hpu_auth *a = hpu__auth_new(key, FUZZ_WINDOW_MS, FUZZ_MAX_NONCES);
	CHECK(a != NULL);
	const void *body = NULL;
	size_t bodylen = 0;
	char err[256];
	if (hpu__auth_verify(a, data, size, FUZZ_NOW_MS, &body, &bodylen, err,
			     sizeof err) == 0) {
		const uint8_t *b = body;
		CHECK(b >= data && bodylen <= size &&
		      (size_t)(b - data) <= size - bodylen);
		decode(body, bodylen);
	}
	hpu__auth_destroy(&a);
	CHECK(a == NULL);
}

/* Checks that `frame` (a copy of a good frame, changed) is refused. */
static void refused(hpu_auth *a, const uint8_t *frame, size_t len)
{
	const void *body = NULL;
	size_t bodylen = 0;
	char err[256] = "";
	int rc = hpu__auth_verify(a, frame, len, FUZZ_NOW_MS, &body, &bodylen,
				  err, sizeof err);
	CHECK(rc == -1);
	CHECK(err[0] != 0);
}

/* (b) The input as the body of a frame signed with the right key. */
static void as_body(const uint8_t *data, size_t size)
{
	hpu_auth *a = hpu__auth_new(key, FUZZ_WINDOW_MS, FUZZ_MAX_NONCES);
	CHECK(a != NULL);
	uint8_t *frame = NULL;
	size_t len = hpu__auth_sign(a, data, size, FUZZ_NOW_MS, &frame);
	if (size > HPU_AUTH_MAX_FRAME - HPU_AUTH_HEADER) {
		CHECK(len == 0);
		free(frame);
		hpu__auth_destroy(&a);
		return;
	}
	CHECK(len == HPU_AUTH_HEADER + size && frame != NULL);

	/* One bit changed where the input says, and the frame cut short:
	 * both refused, and (checked below) nothing remembered. */
	uint8_t *bad = malloc(len);
	CHECK(bad != NULL);
	memcpy(bad, frame, len);
	size_t at = size ? ((size_t)data[0] << 8 | data[size - 1]) % len : 0;
	bad[at] ^= (uint8_t)(1u << (size ? data[size / 2] % 8 : 0));
	refused(a, bad, len);
	refused(a, frame, size ? at % len : len - 1);
	free(bad);

	const void *body = NULL;
	size_t bodylen = 0;
	char err[256];
	int rc = hpu__auth_verify(a, frame, len, FUZZ_NOW_MS, &body, &bodylen,
				  err, sizeof err);
	if (rc != 0)
		fprintf(stderr, "fuzz_decode: signed frame refused: %s\n", err);
	CHECK(rc == 0);
	CHECK(bodylen == size && (size == 0 || memcmp(body, data, size) == 0));
	decode(body, bodylen);
	refused(a, frame, len); /* a replay */

	free(frame);
	hpu__auth_destroy(&a);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_key(key);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	as_frame(data, size);
	as_body(data, size);
	return 0;
}
