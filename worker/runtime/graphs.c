/* graphs: --graphs; see graphs.h. */
#include "worker/runtime/graphs.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/log.h"
#include "worker/device/device.h"
#include "worker/ops/autocast.h"

/* Recordings kept at once, training steps' and evaluation batches'
 * together: a run's training steps have one shape (the sampler drops an
 * epoch's last partial batch), its evaluations two (full batches and a
 * last partial one; one with --pad-last-batch) per split evaluated.
 * Past them, a new shape runs eagerly. */
#define GRAPHS_MAX 8

/* The graph_replay range's "nodes" (the recording's calls by name): at
 * most this many bytes, each name cut to NAME_MAX_ARGS. */
#define NODE_ARGS 2048
#define NAME_MAX_ARGS 96

typedef struct entry {
	int *n;                 /* [accum] the micro-batches' sizes, or [1] an
				 * evaluation batch's: the key, with eval */
	int eval;               /* 1: an evaluation batch (forward only) */
	hpu__dev_graph *graph;  /* the recording; NULL: none (yet, or refused) */
	hpu__strat_snap *snap;  /* what its replays restore */
	int refused;            /* 1: this shape runs eagerly */
	size_t nodes;
	char node_args[NODE_ARGS]; /* hpu__graphs_node_args */
	hpu__ac_calls calls;    /* the op calls its host code counted: each
				 * launch counts them (autocast.h) */
	/* A recording is made twice: at its first step (or evaluation), then
	 * at the next, and kept only where both made the same kernel calls
	 * with the same values (hpu__dev_graph_same_calls): a value its host
	 * code computes each step would be replayed as recorded. */
	int confirmed;          /* 1: recorded twice, the same: replayed */
	hpu__dev_calls *check;  /* while recorded again: the first's calls */
	long rec_step;          /* the step of the (last) recording */
	/* an evaluation batch's: recorded twice, the same, within the
	 * evaluation after step ok_step (within; replayed in it), before
	 * recordings after two steps agree (confirmed) */
	int within;
	long ok_step;
	/* a training step's recording at one micro-step: where its copies
	 * of the batch's fields read now (NULL: the input buffers), and the
	 * fields copied into the input buffers instead (no copy of theirs
	 * could be pointed elsewhere) */
	const void *src[HPU_MAX_IO];
	int copied[HPU_MAX_IO];
} entry;

struct hpu__graphs {
	int warmup, accum, micro, fields, rank, verbose;
	size_t field_bytes[HPU_MAX_IO];
	hpu_batch *in;      /* the input buffers, per micro-step (accum of them) */
	uint32_t **idx;
	const hpu_batch **pend; /* this step's micro-batches, as the loader has them */
	const hpu_batch **inputs; /* &in[k] each: what a step's micro-steps read */
	int filled;         /* 1: what this step reads is in place (its fields in
			     * the input buffers, or its replay's copies pointed
			     * at the loader's buffer) */
	long bound;         /* replays that read the loader's buffer, nothing copied */
	int bind_said;      /* a device's refusal to point a copy elsewhere, said */
	int *key;           /* this step's sizes */
	entry e[GRAPHS_MAX];
	int ne;
	entry *cur;         /* this step's, where recorded or replayed */
	long ev_step;       /* the step an evaluation batch comes after */
	hpu__ac_calls at_begin; /* the op calls counted when recording began */
	int off;            /* the device records nothing: all eager */
	int fail_begin;     /* HPU_GRAPHS_FAIL_BEGIN names this rank */
	char begin_err[512]; /* why the recording did not begin */
	int full_said;
	long seen, replayed, eager;
	long dropped; /* of replayed: steps launched from a recording whose check
		       * then refused it (it is not kept) */
	/* evaluation: each batch size's sightings (warm-up per shape), the
	 * batches replayed and run eagerly */
	struct {
		int n;
		long seen;
	} ev_seen[GRAPHS_MAX];
	int nev_seen;
	long ev_replayed, ev_eager;
};

int hpu__graphs_new(hpu__graphs **out, int warmup, int accum, int micro, int fields,
		    const size_t *field_bytes, int rank, int verbose, char *err, size_t errlen)
{
	*out = NULL;
	if (accum < 1 || fields > HPU_MAX_IO) { /* the options refuse these */
		snprintf(err, errlen, "--graphs: %d micro-steps per step of %d fields", accum,
			 fields);
		return -1;
	}
	hpu__graphs *g = calloc(1, sizeof *g);
	if (!g)
		goto oom;
	*g = (hpu__graphs){.warmup = warmup, .accum = accum, .micro = micro, .fields = fields,
			   .rank = rank, .verbose = verbose};
	*out = g;
	if (!(g->key = calloc((size_t)accum, sizeof *g->key)) ||
	    !(g->in = calloc((size_t)accum, sizeof *g->in)) ||
	    !(g->idx = calloc((size_t)accum, sizeof *g->idx)) ||
	    !(g->pend = calloc((size_t)accum, sizeof *g->pend)) ||
	    !(g->inputs = calloc((size_t)accum, sizeof *g->inputs)))
		goto oom;
	for (int k = 0; k < accum; k++)
		g->inputs[k] = &g->in[k];
	memcpy(g->field_bytes, field_bytes, (size_t)fields * sizeof *field_bytes);
	long fr;
	g->fail_begin = hpu__env_long(HPU_ENV_HPU_GRAPHS_FAIL_BEGIN, 0, INT_MAX, &fr) > 0 &&
			fr == rank;
	for (int k = 0; k < accum; k++) {
		for (int f = 0; f < fields; f++)
			if (!(g->in[k].data[f] = hpu__dev_hbuf_alloc(
				      HPU_MEM_OTHER, (size_t)micro * field_bytes[f],
				      "--graphs' input buffers")))
				goto oom;
		/* pinned too: a recorded step's dropout copies the rows'
		 * indices to the device (worker/ops/dropkeys.h) */
		if (!(g->idx[k] = hpu__dev_hbuf_alloc(HPU_MEM_OTHER,
						      (size_t)micro * sizeof *g->idx[k],
						      "--graphs' input buffers")))
			goto oom;
		g->in[k].idx = g->idx[k];
	}
	return 0;
oom:
	snprintf(err, errlen, "--graphs: out of memory for the recording's input buffers (%d x %d samples)",
		 accum, micro);
	if (!*out)
		free(g);
	hpu__graphs_free(out);
	return -1;
}

void hpu__graphs_free(hpu__graphs **pg)
{
	hpu__graphs *g = *pg;
	if (!g)
		return;
	for (int i = 0; i < g->ne; i++) {
		hpu__dev_calls_free(&g->e[i].check);
		hpu__dev_graph_free(&g->e[i].graph);
		hpu__strat_snap_free(&g->e[i].snap);
		free(g->e[i].n);
	}
	for (int k = 0; k < g->accum && g->in && g->idx; k++) {
		for (int f = 0; f < g->fields; f++)
			hpu__dev_hbuf_free(g->in[k].data[f]);
		hpu__dev_hbuf_free(g->idx[k]);
	}
	free(g->key);
	free(g->in);
	free(g->idx);
	free(g->pend);
	free(g->inputs);
	free(g);
	*pg = NULL;
}

/* Field f of bt into micro-step k's input buffer (its in[k].n rows). */
static void copy_field(hpu__graphs *g, int k, int f, const hpu_batch *bt)
{
	memcpy(g->in[k].data[f], bt->data[f], (size_t)g->in[k].n * g->field_bytes[f]);
}

const hpu_batch *hpu__graphs_input(hpu__graphs *g, int k, const hpu_batch *bt)
{
	hpu_batch *in = &g->in[k];
	int n = bt->n > g->micro ? g->micro : bt->n;
	memcpy(g->idx[k], bt->idx, (size_t)n * sizeof *g->idx[k]);
	in->n = n;
	g->key[k] = n;
	g->pend[k] = bt;
	g->filled = 0;
	if (g->accum > 1) { /* the loader writes its buffer again two micro-steps on */
		for (int f = 0; f < g->fields; f++)
			copy_field(g, k, f, bt);
		g->filled = k + 1 == g->accum;
	}
	return in;
}

const hpu_batch *const *hpu__graphs_inputs(const hpu__graphs *g)
{
	return g->inputs;
}

void hpu__graphs_input_fill(hpu__graphs *g)
{
	if (g->filled || !g->pend[0])
		return;
	for (int f = 0; f < g->fields; f++)
		copy_field(g, 0, f, g->pend[0]);
	g->filled = 1;
}

/* Field f of e's replays copied into the input buffers from now on (no
 * copy of its could be pointed at the loader's buffer): where its copies
 * read a loader's buffer, pointed back at the input buffer first; 0, or
 * -1 with a sentence in err where that failed too. */
static int copy_from_now(hpu__graphs *g, entry *e, int f, const char *why, char *err,
			 size_t errlen)
{
	size_t n = (size_t)g->in[0].n;
	if (e->src[f]) {
		char back[512] = "";
		if (hpu__dev_graph_rebind(e->graph, e->src[f], g->in[0].data[f],
					  n * g->field_bytes[f], back, sizeof back) <= 0) {
			snprintf(err, errlen,
				 "--graphs: the recorded step's copy of the batch's field %d reads the "
				 "loader's buffer %p and could not be pointed at another: %s%s%s",
				 f, e->src[f], why[0] ? why : "", why[0] ? "; back: " : "",
				 back[0] ? back : "nothing changed");
			return -1;
		}
		e->src[f] = NULL;
	}
	if (why[0] && !g->bind_said) {
		hpu__log(HPU_LOG_WARNING, "%s; the batch is copied into the recording's input "
					  "buffers instead",
			 why);
		g->bind_said = 1;
	}
	e->copied[f] = 1;
	copy_field(g, 0, f, g->pend[0]);
	return 0;
}

int hpu__graphs_bind(hpu__graphs *g, char *err, size_t errlen)
{
	entry *e = g->cur;
	if (g->filled || !e || !e->graph)
		return 0; /* the input buffers hold the batch: e was recorded now */
	if (e->eval || !g->pend[0]) {
		hpu__graphs_input_fill(g);
		return 0;
	}
	const hpu_batch *bt = g->pend[0];
	size_t n = (size_t)g->in[0].n;
	int copied = 0;
	for (int f = 0; f < g->fields; f++) {
		const void *at = e->src[f] ? e->src[f] : g->in[0].data[f];
		if (e->copied[f]) {
			copy_field(g, 0, f, bt);
			copied = 1;
			continue;
		}
		if (at == bt->data[f])
			continue;
		char why[512] = "";
		int r = hpu__dev_graph_rebind(e->graph, at, bt->data[f], n * g->field_bytes[f], why,
					      sizeof why);
		if (r < 0) {
			snprintf(err, errlen, "%s", why);
			return -1;
		}
		if (r > 0) {
			e->src[f] = bt->data[f];
			continue;
		}
		if (copy_from_now(g, e, f, why, err, errlen) < 0)
			return -1;
		copied = 1;
	}
	g->filled = 1; /* what the replay reads is in place: bound once a step */
	g->bound += !copied;
	return 0;
}

/* "64", "64 x 2 micro-steps" or "64, 64, 17": the shape, for messages. */
static void shape(const hpu__graphs *g, const int *n, char *out, size_t len)
{
	int same = 1;
	for (int k = 1; k < g->accum; k++)
		same &= n[k] == n[0];
	size_t at = 0;
	if (same) {
		snprintf(out, len, g->accum > 1 ? "%d sample%s x %d micro-steps" : "%d sample%s", n[0],
			 n[0] == 1 ? "" : "s",
			 g->accum);
		return;
	}
	for (int k = 0; k < g->accum && at < len; k++)
		at += (size_t)snprintf(out + at, len - at, "%s%d", k ? ", " : "", n[k]);
	if (at < len)
		snprintf(out + at, len - at, " samples");
}

static entry *find(hpu__graphs *g, int eval, const int *key)
{
	size_t len = eval ? 1 : (size_t)g->accum;
	for (int i = 0; i < g->ne; i++)
		if (g->e[i].eval == eval && !memcmp(g->e[i].n, key, len * sizeof *key))
			return &g->e[i];
	return NULL;
}

/* A new entry for key (len sizes), made this step's; NULL when the
 * cache is full or out of memory. */
static entry *add(hpu__graphs *g, int eval, const int *key, size_t len)
{
	if (g->ne == GRAPHS_MAX)
		return NULL;
	entry *e = &g->e[g->ne];
	if (!(e->n = malloc(len * sizeof *e->n)))
		return NULL;
	memcpy(e->n, key, len * sizeof *e->n);
	e->eval = eval;
	g->ne++;
	g->cur = e;
	return e;
}

/* e's recording dropped to be made again (its calls kept in e->check):
 * its second recording, at another step than its first. */
static hpu__graph_mode again(hpu__graphs *g, entry *e)
{
	e->check = hpu__dev_graph_take_calls(e->graph);
	hpu__dev_graph_free(&e->graph);
	hpu__strat_snap_free(&e->snap);
	g->cur = e;
	return HPU__GRAPH_RECORD;
}

hpu__graph_mode hpu__graphs_mode(hpu__graphs *g, long step, int eager_only)
{
	g->cur = NULL;
	if (g->off || eager_only || g->seen++ < g->warmup)
		goto eager;
	entry *e = find(g, 0, g->key);
	if (e && e->graph && !e->confirmed)
		return again(g, e);
	if (e && e->graph) {
		g->cur = e;
		g->replayed++;
		return HPU__GRAPH_REPLAY;
	}
	if (e) /* refused */
		goto eager;
	if (g->ne == GRAPHS_MAX) {
		if (!g->full_said && g->verbose && g->rank == 0) {
			char sh[128];
			shape(g, g->key, sh, sizeof sh);
			printf("graphs: step %ld: %d recordings kept already: the step of %s runs "
			       "eagerly, as every new shape from now on\n",
			       step + 1, GRAPHS_MAX, sh);
		}
		g->full_said = 1;
		goto eager;
	}
	if (!add(g, 0, g->key, (size_t)g->accum))
		goto eager; /* out of memory: eager, as refused */
	g->cur->rec_step = step;
	return HPU__GRAPH_RECORD;
eager:
	g->eager++;
	return HPU__GRAPH_EAGER;
}

void hpu__graphs_mismatch(hpu__graphs *g, long step)
{
	entry *e = g->cur;
	g->cur = NULL;
	if (e && e->graph) /* was to replay */
		g->replayed--;
	else if (!e) /* was eager: counted already */
		return;
	g->eager++;
	if (e->graph)
		return;
	e->refused = 1; /* was to record */
	hpu__dev_calls_free(&e->check);
	if (g->verbose && g->rank == 0) {
		char sh[128];
		shape(g, e->n, sh, sizeof sh);
		printf("graphs: step %ld: the step of %s is not recorded: the ranks' micro-batches "
		       "differ in size at this step; it runs eagerly\n",
		       step + 1, sh);
	}
}

/* The recording of g->cur begun; -1 where the device records nothing
 * (everything eager from now on: no recording is begun again; *eager
 * counts this one), the reason in g->begin_err, said at once where
 * `say` (else by hpu__graphs_unbegun). */
static int begin(hpu__graphs *g, long *eager, int say)
{
	g->begin_err[0] = '\0';
	if (g->fail_begin)
		snprintf(g->begin_err, sizeof g->begin_err,
			 "the recording could not begin (HPU_GRAPHS_FAIL_BEGIN names rank %d, as "
			 "running out of host memory would)",
			 g->rank);
	else if (hpu__dev_capture_begin(g->begin_err, sizeof g->begin_err) == 0) {
		hpu__ac_calls_get(&g->at_begin);
		return 0;
	}
	g->off = 1;
	if (g->cur && g->cur->check) { /* its second recording: the entry stays, refused */
		g->cur->refused = 1;
		hpu__dev_calls_free(&g->cur->check);
		g->cur = NULL;
	} else if (g->cur) {
		free(g->cur->n);
		g->ne--;
		g->cur = NULL;
	}
	(*eager)++;
	if (say && g->rank == 0)
		hpu__log(HPU_LOG_WARNING,
			 "--graphs: %s; the training steps and evaluation batches run eagerly",
			 g->begin_err);
	return -1;
}

/* One "name":count, the name JSON-safe (quotes, backslashes and control
 * characters as '_') and cut to NAME_MAX_ARGS bytes; 0, or -1 where it
 * does not fit in out[at .. len) with room for one more. */
static int put_count(char *out, size_t *at, size_t len, const char *name, size_t count)
{
	char safe[NAME_MAX_ARGS + 1];
	size_t n = 0;
	for (; name[n] && n < NAME_MAX_ARGS; n++) {
		unsigned char c = (unsigned char)name[n];
		safe[n] = c == '"' || c == '\\' || c < 0x20 ? '_' : (char)c;
	}
	safe[n] = '\0';
	int k = snprintf(out + *at, len - *at, "%s\"%s\":%zu", *at ? "," : "", safe, count);
	if (k < 0 || (size_t)k + 40 >= len - *at) { /* room left for "(others)" */
		out[*at] = '\0';
		return -1;
	}
	*at += (size_t)k;
	return 0;
}

/* The recording's calls by name (hpu__dev_graph_names) into e->node_args:
 * as many names as fit, then "(others)":N for the rest of the calls. */
static void node_args(entry *e)
{
	const hpu__dev_node_count *c;
	size_t n = hpu__dev_graph_names(e->graph, &c), at = 0, i = 0;
	e->node_args[0] = '\0';
	for (; i < n; i++)
		if (put_count(e->node_args, &at, sizeof e->node_args, c[i].name, c[i].count) < 0)
			break;
	size_t rest = 0;
	for (size_t j = i; j < n; j++)
		rest += c[j].count;
	if (i < n)
		snprintf(e->node_args + at, sizeof e->node_args - at, "%s\"(others)\":%zu",
			 at ? "," : "", rest);
}

const char *hpu__graphs_node_args(const hpu__graphs *g)
{
	return g->cur && g->cur->graph ? g->cur->node_args : "";
}

/* 1 when gr is e's second recording and its calls differ from the
 * first's (the reason in why), else 0. */
static int differs(entry *e, const hpu__dev_graph *gr, char *why, size_t len)
{
	return e->check && !hpu__dev_graph_same_calls(e->check, gr, why, len);
}

/* e keeps the recording gr, its calls by name and the strategy's state
 * its replays restore; 0, or -1 with a sentence in err (gr is e's
 * either way: freed with it). A second recording, the same as the
 * first, confirms it: replayed from now on. */
static int keep(entry *e, hpu__dev_graph *gr, hpu_strat *s, char *err, size_t errlen)
{
	e->confirmed = e->check != NULL;
	hpu__dev_calls_free(&e->check);
	e->graph = gr;
	memset(e->src, 0, sizeof e->src); /* it reads the input buffers */
	memset(e->copied, 0, sizeof e->copied);
	e->nodes = hpu__dev_graph_nodes(gr);
	node_args(e);
	if (!(e->snap = hpu__strat_snap_take(s))) {
		snprintf(err, errlen, "--graphs: out of host memory for a recording's state");
		return -1;
	}
	return 0;
}

int hpu__graphs_record_begin(hpu__graphs *g, int agreed)
{
	return begin(g, &g->eager, !agreed);
}

int hpu__graphs_unbegun(hpu__graphs *g, long step, hpu__graphs_agree_fn *agree, void *arg,
			char *err, size_t errlen)
{
	int who = g->rank;
	char why[512];
	snprintf(why, sizeof why, "%s", g->begin_err);
	if (agree(arg, &who, why, sizeof why) < 0) {
		snprintf(err, errlen, "--graphs: the ranks could not agree on step %ld's recording",
			 step + 1);
		return -1;
	}
	/* said once, by the lowest rank whose recording did not begin */
	if (who == g->rank)
		hpu__log(HPU_LOG_WARNING,
			 "--graphs: %s; the training steps and evaluation batches run eagerly%s",
			 g->begin_err, g->rank ? " on this rank, and steps on every rank" : "");
	return 0;
}

/* ", N of them host calls (...)" where the recording holds collectives
 * between workers (the strategy's host nodes), else "". */
static const char *host_calls(const hpu__dev_graph *gr, char *out, size_t len)
{
	size_t n = hpu__dev_graph_host_calls(gr);
	out[0] = '\0';
	if (n)
		snprintf(out, len, ", %zu of them host calls (the collectives between the workers, "
			 "through libhpucoll)", n);
	return out;
}

int hpu__graphs_record_end(hpu__graphs *g, hpu_strat *s, long step,
			   hpu__graphs_agree_fn *agree, void *arg, char *err, size_t errlen)
{
	entry *e = g->cur;
	hpu__dev_graph *gr = NULL;
	char why[512] = "";
	int rc = hpu__dev_capture_end(&gr, why, sizeof why);
	/* a replay counts the calls (its launch), a refused recording's step
	 * when it runs eagerly: the recording's own are taken back */
	hpu__ac_calls_take_since(&g->at_begin, &e->calls);
	if (rc < 0) {
		snprintf(err, errlen, "--graphs: recording step %ld failed: %s", step + 1, why);
		return -1;
	}
	if (rc == 0 && differs(e, gr, why, sizeof why))
		rc = 1;
	int who = rc == 0 ? -1 : g->rank;
	if (agree && agree(arg, &who, why, sizeof why) < 0) {
		hpu__dev_graph_free(&gr);
		snprintf(err, errlen, "--graphs: the ranks could not agree on step %ld's recording",
			 step + 1);
		return -1;
	}
	char sh[128], hc[128];
	shape(g, e->n, sh, sizeof sh);
	if (who < 0) {
		if (keep(e, gr, s, err, errlen) < 0)
			return -1;
		if (g->verbose && g->rank == 0 && !e->confirmed)
			printf("graphs: step %ld: recorded the step of %s: %zu device calls%s, replayed "
			       "from now on once the next step's recording makes the same calls\n",
			       step + 1, sh, e->nodes, host_calls(gr, hc, sizeof hc));
		else if (g->verbose && g->rank == 0)
			printf("graphs: step %ld: recorded the step of %s again: the same kernel calls "
			       "with the same values as step %ld's\n",
			       step + 1, sh, e->rec_step + 1);
		g->replayed++; /* launched now */
		return 1;
	}
	hpu__dev_graph_free(&gr);
	if (e->check) /* the first recording's step was launched */
		g->dropped++;
	hpu__dev_calls_free(&e->check);
	e->refused = 1;
	g->cur = NULL;
	g->eager++;
	if (g->verbose && g->rank == 0) {
		char by[64] = ""; /* another rank's reason, carried over by agree */
		if (who != g->rank)
			snprintf(by, sizeof by, "rank %d's recording was refused: ", who);
		printf("graphs: step %ld: the step of %s is not recorded: %s%s; it runs eagerly\n",
		       step + 1, sh, by, why);
	}
	return 0;
}

int hpu__graphs_launch(hpu__graphs *g, hpu_strat *s, double lr, char *err, size_t errlen)
{
	entry *e = g->cur;
	if (!e || !e->graph) {
		snprintf(err, errlen, "--graphs: no recording to launch");
		return -1;
	}
	if (hpu__graphs_bind(g, err, errlen) < 0)
		return -1;
	if (hpu__strat_snap_replay(s, e->snap, lr) < 0)
		return -1;
	char why[512];
	if (hpu__dev_graph_launch(e->graph, why, sizeof why) < 0) {
		snprintf(err, errlen, "--graphs: replaying %s failed: %s",
			 e->eval ? "an evaluation batch's recording" : "the recorded step", why);
		return -1;
	}
	hpu__ac_calls_add(&e->calls);
	return 0;
}

void hpu__graphs_counts(const hpu__graphs *g, long *replayed, long *eager, int *recorded)
{
	*replayed = g->replayed;
	*eager = g->eager;
	int n = 0;
	for (int i = 0; i < g->ne; i++)
		n += g->e[i].graph != NULL && !g->e[i].eval;
	*recorded = n;
}

long hpu__graphs_dropped(const hpu__graphs *g)
{
	return g->dropped;
}

long hpu__graphs_bound(const hpu__graphs *g)
{
	return g->bound;
}

void hpu__graphs_eval_counts(const hpu__graphs *g, long *replayed, long *eager, int *recorded)
{
	*replayed = g->ev_replayed;
	*eager = g->ev_eager;
	int n = 0;
	for (int i = 0; i < g->ne; i++)
		n += g->e[i].graph != NULL && g->e[i].eval;
	*recorded = n;
}

/* ---- evaluation batches ---- */

const hpu_batch *hpu__graphs_eval_input(hpu__graphs *g, const hpu_batch *bt, int pad_to)
{
	const hpu_batch *in = hpu__graphs_input(g, 0, bt);
	hpu__graphs_input_fill(g); /* the padding goes after it */
	int n = in->n, to = pad_to > g->micro ? g->micro : pad_to;
	for (int r = n; n > 0 && r < to; r++) { /* the padding: the first sample again */
		for (int f = 0; f < g->fields; f++)
			memcpy((char *)in->data[f] + (size_t)r * g->field_bytes[f], in->data[f],
			       g->field_bytes[f]);
		g->idx[0][r] = g->idx[0][0];
	}
	if (n > 0 && to > n)
		g->in[0].n = to;
	return in;
}

/* How often an evaluation batch of n samples was seen before (counting
 * this one from now on); -1 where no room is left to count it. */
static long ev_seen(hpu__graphs *g, int n)
{
	for (int i = 0; i < g->nev_seen; i++)
		if (g->ev_seen[i].n == n)
			return g->ev_seen[i].seen++;
	if (g->nev_seen == GRAPHS_MAX)
		return -1;
	g->ev_seen[g->nev_seen].n = n;
	g->ev_seen[g->nev_seen++].seen = 1;
	return 0;
}

hpu__graph_mode hpu__graphs_eval_mode(hpu__graphs *g, int n, long step)
{
	g->cur = NULL;
	g->ev_step = step;
	if (g->off)
		goto eager;
	entry *e = find(g, 1, &n);
	/* made again at the next batch of its size, until two recordings
	 * agree: within this evaluation (the rows' sample indices, and what
	 * host code draws from them, change from batch to batch), then after
	 * another step (ctx->step, the same within one evaluation): replayed
	 * within this evaluation after the first, anywhere after the second */
	if (e && e->graph && !e->confirmed && !(e->within && e->ok_step == step))
		return again(g, e);
	if (e && e->graph) {
		g->cur = e;
		g->ev_replayed++;
		return HPU__GRAPH_REPLAY;
	}
	long seen = e ? -1 : ev_seen(g, n);
	if (e || seen < 0 || seen < g->warmup) /* refused, or warming up */
		goto eager;
	if (g->ne == GRAPHS_MAX) {
		if (!g->full_said && g->verbose && g->rank == 0)
			printf("graphs: evaluation: %d recordings kept already: the batch of %d sample%s "
			       "runs eagerly, as every new shape from now on\n",
			       GRAPHS_MAX, n, n == 1 ? "" : "s");
		g->full_said = 1;
		goto eager;
	}
	if (!add(g, 1, &n, 1))
		goto eager;
	g->cur->rec_step = step;
	return HPU__GRAPH_RECORD;
eager:
	g->ev_eager++;
	return HPU__GRAPH_EAGER;
}

int hpu__graphs_eval_begin(hpu__graphs *g)
{
	return begin(g, &g->ev_eager, 1);
}

int hpu__graphs_eval_end(hpu__graphs *g, hpu_strat *s, char *err, size_t errlen)
{
	entry *e = g->cur;
	hpu__dev_graph *gr = NULL;
	char why[512] = "";
	int rc = hpu__dev_capture_end(&gr, why, sizeof why);
	/* a replay counts the calls (its launch), a refused recording's step
	 * when it runs eagerly: the recording's own are taken back */
	hpu__ac_calls_take_since(&g->at_begin, &e->calls);
	if (rc < 0) {
		snprintf(err, errlen, "--graphs: recording an evaluation batch failed: %s", why);
		return -1;
	}
	if (rc == 0 && differs(e, gr, why, sizeof why))
		rc = 1;
	if (rc == 0) {
		long prev = e->rec_step;
		e->rec_step = g->ev_step;
		if (keep(e, gr, s, err, errlen) < 0)
			return -1;
		if (e->confirmed && prev == g->ev_step) { /* the same step: within only */
			e->confirmed = 0;
			e->within = 1;
			e->ok_step = g->ev_step;
		}
		if (g->verbose && g->rank == 0 && !e->confirmed && e->within)
			printf("graphs: evaluation: recorded the batch of %d sample%s again: the same "
			       "kernel calls with the same values as the batch before; replayed in "
			       "this evaluation, and from now on once a recording after another "
			       "step makes the same calls\n",
			       e->n[0], e->n[0] == 1 ? "" : "s");
		else if (g->verbose && g->rank == 0 && !e->confirmed)
			printf("graphs: evaluation: recorded the batch of %d sample%s: %zu device calls, "
			       "replayed from now on once the next such batch's recording makes the "
			       "same calls\n",
			       e->n[0], e->n[0] == 1 ? "" : "s", e->nodes);
		else if (g->verbose && g->rank == 0)
			printf("graphs: evaluation: recorded the batch of %d sample%s again after "
			       "step %ld: the same kernel calls with the same values as before\n",
			       e->n[0], e->n[0] == 1 ? "" : "s", g->ev_step);
		g->ev_replayed++; /* launched now */
		return 1;
	}
	hpu__dev_graph_free(&gr);
	hpu__dev_calls_free(&e->check);
	e->refused = 1;
	g->cur = NULL;
	g->ev_eager++;
	/* each rank records its own batches: each says its own refusal */
	if (g->verbose && g->rank == 0)
		printf("graphs: evaluation: the batch of %d sample%s is not recorded: %s; it runs "
		       "eagerly\n",
		       e->n[0], e->n[0] == 1 ? "" : "s", why);
	else if (g->verbose)
		printf("graphs: evaluation: the batch of %d sample%s is not recorded on rank "
		       "%d: %s; it runs eagerly\n",
		       e->n[0], e->n[0] == 1 ? "" : "s", g->rank, why);
	return 0;
}

int hpu__graphs_eval_launch(hpu__graphs *g, hpu_strat *s, char *err, size_t errlen)
{
	return hpu__graphs_launch(g, s, NAN, err, errlen);
}
