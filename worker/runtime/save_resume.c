#include "worker/runtime/save_resume.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fileio.h"
#include "worker/ops/fp8.h"
#include "common/num.h"

#define say hpu__say

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- every rank's outcome, shared ---- */

/* One rank's outcome of a phase, all-gathered as bytes. */
typedef struct rec {
	char ok;
	char sha256[65];
	char foreign; /* failed on a file of another uid */
	char pad;
	double bytes, secs;
	char msg[424];
} rec;

/* Shares every rank's rec; returns how many failed and, in err, the first
 * failure as "rank R: ...". all[world] is the caller's (or NULL). */
static int agree(hpucoll_comm *comm, const rec *mine, rec *all, char *err, size_t errlen)
{
	int world = hpucoll_comm_size(comm), failed = 0;
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
			}
	}
	if (!all)
		free(v);
	return failed;
}

/* ---- saving ---- */

static int mkdir_p(const char *path, char *err, size_t errlen)
{
	char at[600];
	if (hpu__make_dirs(path, at, sizeof at) < 0)
		return say(err, errlen, "cannot make directory %s: %s", at, strerror(errno));
	return 0;
}

static cJSON *seed_json(uint64_t seed)
{
	char buf[32];
	snprintf(buf, sizeof buf, "%llu", (unsigned long long)seed);
	return cJSON_CreateString(buf);
}

static cJSON *sched_json(const hpu_sched *s)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "type", hpu__sched_name(s->kind));
	cJSON_AddNumberToObject(j, "lr", s->lr);
	cJSON_AddNumberToObject(j, "warmup_min_lr", s->warmup_min_lr);
	cJSON_AddNumberToObject(j, "warmup_steps", (double)s->warmup_steps);
	cJSON_AddStringToObject(j, "warmup_type", s->warmup_type == HPU_WARMUP_LINEAR ? "linear" : "log");
	cJSON_AddNumberToObject(j, "total_steps", (double)s->total_steps);
	cJSON_AddNumberToObject(j, "step_size", (double)s->step_size);
	cJSON_AddNumberToObject(j, "gamma", s->gamma);
	cJSON_AddNumberToObject(j, "min_lr", s->min_lr);
	return j;
}

static cJSON *floats_json(const float *v, int n)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
	return a;
}

/* fp8 training's per-call-site scales and amax histories (every rank
 * holds the same after the step's amax reduction). */
static cJSON *fp8_json(const hpu_train_opts *o)
{
	const hpu_fp8_recipe *r = hpu__fp8_recipe();
	cJSON *j = cJSON_CreateObject(), *sites = cJSON_CreateArray();
	cJSON_AddNumberToObject(j, "amax_history_len", r->history);
	cJSON_AddNumberToObject(j, "margin", o->fp8_margin);
	for (int i = 0; i < hpu__fp8_count(); i++) {
		hpu_fp8_saved sv;
		if (hpu__fp8_saved_get(i, &sv) < 0)
			continue;
		cJSON *s = cJSON_CreateObject();
		cJSON_AddStringToObject(s, "name", sv.name);
		cJSON_AddNumberToObject(s, "layer", sv.layer);
		cJSON_AddNumberToObject(s, "op", sv.op);
		cJSON_AddNumberToObject(s, "k", sv.k);
		cJSON_AddItemToObject(s, "scale", floats_json(sv.scale, 3));
		cJSON_AddNumberToObject(s, "filled", sv.nhist);
		cJSON_AddNumberToObject(s, "pos", sv.pos);
		cJSON_AddItemToObject(s, "amax_history", floats_json(sv.hist, 3 * r->history));
		cJSON_AddItemToArray(sites, s);
	}
	cJSON_AddItemToObject(j, "sites", sites);
	return j;
}

static cJSON *params_json(const hpu_builder *b)
{
	cJSON *arr = cJSON_CreateArray();
	uint64_t at = 0;
	for (int i = 0; i < b->nparams; i++) {
		const hpu_param_info *p = &b->params[i];
		cJSON *j = cJSON_CreateObject(), *shape = cJSON_CreateArray();
		cJSON_AddStringToObject(j, "name", p->name);
		for (int d = 0; d < p->ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
		cJSON_AddItemToObject(j, "shape", shape);
		cJSON_AddStringToObject(j, "dtype", "F32");
		cJSON_AddNumberToObject(j, "offset", (double)at);
		cJSON_AddNumberToObject(j, "numel", (double)p->numel);
		cJSON_AddItemToArray(arr, j);
		at += p->numel;
	}
	return arr;
}

static const char *sync_name(hpu_buffer_sync sync)
{
	return sync == HPU_BUFFER_MEAN ? "mean" : sync == HPU_BUFFER_LOCAL ? "local" : "broadcast";
}

/* The manifest's "buffers": file bf holding every buffer, unpadded, in
 * declaration order. NULL when out of memory. */
static cJSON *buffers_json(const hpu_builder *b, const hpu_ckpt_file *bf)
{
	hpu_ckpt_buffer *v = calloc((size_t)b->nbuffers, sizeof *v);
	if (!v)
		return NULL;
	uint64_t at = 0;
	for (int i = 0; i < b->nbuffers; i++) {
		const hpu_buffer_info *bi = &b->buffers[i];
		snprintf(v[i].name, sizeof v[i].name, "%s", bi->name);
		v[i].ndim = bi->ndim;
		memcpy(v[i].shape, bi->shape, (size_t)bi->ndim * sizeof *bi->shape);
		v[i].offset = at;
		v[i].numel = bi->numel;
		snprintf(v[i].sync, sizeof v[i].sync, "%s", sync_name(bi->sync));
		at += bi->numel;
	}
	cJSON *j = hpu__ckpt_buffers_json(bf, v, b->nbuffers);
	free(v);
	return j;
}

/* Rank 0: every buffer's floats (rank 0's, whatever their sync), unpadded,
 * in declaration order, to dir/buffers.bin; bf gets its name, size and
 * digest. */
static int write_buffers(const hpu_builder *b, hpu_strat *st, const char *dir,
			 hpu_ckpt_file *bf, char *err, size_t errlen)
{
	const float *B = hpu__strat_buffers(st);
	char path[1200 + sizeof bf->name + 2]; /* dir is at most 1200 bytes */
	hpu_ckpt_writer w;
	snprintf(bf->name, sizeof bf->name, "%s", HPU_CKPT_BUFFERS);
	snprintf(path, sizeof path, "%s/%s", dir, bf->name);
	if (hpu__ckpt_writer_open(&w, path, err, errlen) < 0)
		return -1;
	for (int i = 0; i < b->nbuffers; i++)
		if (hpu__ckpt_writer_put(&w, B + b->buffers[i].offset, b->buffers[i].numel * 4, err,
					 errlen) < 0) {
			hpu__ckpt_writer_abort(&w);
			return -1;
		}
	bf->bytes = w.bytes;
	if (hpu__ckpt_writer_commit(&w, bf->sha256, err, errlen) < 0) {
		hpu__ckpt_writer_abort(&w);
		return -1;
	}
	return 0;
}

/* The last validation's figures, when there was one. */
static cJSON *validation_json(const hpu_builder *b, const hpu_run_pos *pos)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddNumberToObject(j, "step", (double)pos->vstep);
	cJSON_AddNumberToObject(j, "val_loss", pos->vloss);
	for (int k = 0; k < b->nmetrics; k++) {
		char key[96];
		snprintf(key, sizeof key, "val_%s", b->metrics[k].name);
		cJSON_AddNumberToObject(j, key, pos->vmetric[k]);
	}
	return j;
}

/* --early-stop's rule and count (a best of NAN prints as null). */
static cJSON *early_json(const hpu_train_opts *o, const hpu_run_pos *pos)
{
	hpu_early_stop e;
	char why[256];
	if (hpu__early_stop_parse(o->early_stop, &e, why, sizeof why) < 0)
		return NULL; /* hpu__opts_resolve checked it */
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "metric", e.metric);
	cJSON_AddStringToObject(j, "mode", e.max ? "max" : "min");
	cJSON_AddNumberToObject(j, "best", pos->es_best);
	cJSON_AddNumberToObject(j, "best_step", (double)pos->es_best_step);
	cJSON_AddNumberToObject(j, "wait", (double)pos->es_wait);
	return j;
}

/* Rank 0: the manifest of the shards every rank wrote (all[world]) and of
 * the buffers file (bf, when the model has buffers). */
static cJSON *manifest(hpucoll_comm *comm, const hpu_train_opts *o, const hpu_builder *b,
		       hpu_strat *st, const hpu_run_pos *pos, const rec *all,
		       const hpu_ckpt_file *bf, char *err, size_t errlen)
{
	int world = hpucoll_comm_size(comm);
	hpu_strat_state ss;
	hpu__strat_get_state(st, &ss);
	const char *names[3];
	int ns = hpu__strat_ckpt_sections(st, names);
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "format", HPU_CKPT_FORMAT);
	cJSON_AddNumberToObject(m, "version", HPU_CKPT_VERSION);
	const char *slash = strrchr(b->path, '/');
	cJSON_AddStringToObject(m, "model", slash ? slash + 1 : b->path);
	cJSON_AddNumberToObject(m, "world_size", world);
	cJSON_AddStringToObject(m, "strategy", hpu__strategy_name(o->strategy));
	cJSON_AddStringToObject(m, "precision", hpu__precision_name(o->precision));
	cJSON_AddStringToObject(m, "optimizer", hpu__optim_name(o->optimizer));
	cJSON_AddItemToObject(m, "placement", hpu__strat_plan_json(st));
	cJSON_AddNumberToObject(m, "step", (double)pos->step);
	cJSON_AddNumberToObject(m, "epoch", pos->epoch);
	cJSON_AddNumberToObject(m, "batch_in_epoch", (double)pos->batch);
	cJSON_AddNumberToObject(m, "global_batch", o->batch_size);
	cJSON *rng = cJSON_CreateObject();
	cJSON_AddItemToObject(rng, "seed", seed_json(pos->seed));
	cJSON_AddStringToObject(rng, "sampler",
				"permutation of epoch e from (seed, e); no other random state");
	cJSON_AddItemToObject(m, "rng", rng);
	cJSON_AddItemToObject(m, "scheduler", sched_json(&pos->sched));
	cJSON_AddNumberToObject(m, "optimizer_steps", (double)ss.opt_steps);
	cJSON *ls = cJSON_CreateObject();
	cJSON_AddNumberToObject(ls, "scale", ss.loss_scale);
	cJSON_AddNumberToObject(ls, "hysteresis_left", ss.hysteresis_left);
	cJSON_AddNumberToObject(ls, "steps", (double)ss.scaler_steps);
	cJSON_AddNumberToObject(ls, "last_overflow", (double)ss.last_overflow);
	cJSON_AddNumberToObject(ls, "skipped", (double)ss.skipped);
	cJSON_AddItemToObject(m, "loss_scaler", ls);
	if (o->precision == HPU_PREC_FP8)
		cJSON_AddItemToObject(m, "fp8", fp8_json(o));
	if (pos->vstep > 0)
		cJSON_AddItemToObject(m, "validation", validation_json(b, pos));
	cJSON *es = o->early_stop[0] ? early_json(o, pos) : NULL;
	if (es)
		cJSON_AddItemToObject(m, "early_stop", es);
	cJSON_AddNumberToObject(m, "numel", (double)b->psi);
	cJSON_AddItemToObject(m, "parameters", params_json(b));
	cJSON *secs = cJSON_CreateArray();
	for (int k = 0; k < ns; k++)
		cJSON_AddItemToArray(secs, cJSON_CreateString(names[k]));
	cJSON_AddItemToObject(m, "sections", secs);
	cJSON *files = cJSON_CreateArray();
	cJSON_AddItemToObject(m, "files", files);
	for (int r = 0; r < world; r++) {
		hpu_ckpt_file f = {.bytes = (uint64_t)all[r].bytes};
		hpu__ckpt_shard_name(r, world, f.name, sizeof f.name);
		memcpy(f.sha256, all[r].sha256, sizeof f.sha256);
		if (hpu__strat_ckpt_segments(st, r, &f.seg, &f.nseg) < 0) {
			say(err, errlen, "out of memory");
			cJSON_Delete(m);
			return NULL;
		}
		cJSON_AddItemToArray(files, hpu__ckpt_file_json(&f));
		free(f.seg);
	}
	if (b->nbuffers) { /* no key without buffers: as before buffers existed */
		cJSON *bj = buffers_json(b, bf);
		if (!bj) {
			say(err, errlen, "out of memory");
			cJSON_Delete(m);
			return NULL;
		}
		cJSON_AddItemToObject(m, "buffers", bj);
	}
	return m;
}

/* --keep-last and --keep-best: what survives this save. */
typedef struct keeping {
	hpu_keep_best kb; /* kb.k 0: no --keep-best */
	hpu_ckpt_keep k;
	char **best, **last;
} keeping;

/* The checkpoint's own value of the --keep-best metric: its step's
 * validation, else NAN (it is kept only as one of the newest). */
static double keep_value(const keeping *K, const hpu_builder *b, const hpu_run_pos *pos)
{
	if (!K->kb.k || pos->vstep != pos->step)
		return NAN;
	if (!strcmp(K->kb.metric, "val_loss"))
		return pos->vloss;
	for (int i = 0; i < b->nmetrics; i++)
		if (!strcmp(K->kb.metric + 4, b->metrics[i].name))
			return pos->vmetric[i];
	return NAN;
}

/* Rank 0: which checkpoints survive the save of `name`. */
static int keep_plan(keeping *K, const hpu_train_opts *o, const hpu_builder *b,
		     const hpu_run_pos *pos, const char *name, char *msg, size_t msglen)
{
	if (o->keep_best[0] && hpu__keep_best_parse(o->keep_best, &K->kb, msg, msglen) < 0)
		return -1;
	K->k = (hpu_ckpt_keep){.last = o->keep_last ? o->keep_last : o->keep ? o->keep : 1,
			       .best = K->kb.k, .max = K->kb.max, .metric = K->kb.metric};
	return hpu__ckpt_keep_plan(o->checkpoint_dir, &K->k, name, keep_value(K, b, pos), &K->best,
				   &K->last, msg, msglen);
}

static cJSON *names_json(char **names)
{
	cJSON *a = cJSON_CreateArray();
	for (char **p = names; p && *p; p++)
		cJSON_AddItemToArray(a, cJSON_CreateString(*p));
	return a;
}

/* The manifest's "keep": the rule and what it kept at this save. */
static cJSON *keep_json(const keeping *K)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddNumberToObject(j, "last_k", K->k.last);
	cJSON_AddItemToObject(j, "last", names_json(K->last));
	if (K->k.best) {
		cJSON_AddStringToObject(j, "metric", K->kb.metric);
		cJSON_AddStringToObject(j, "mode", K->kb.max ? "max" : "min");
		cJSON_AddNumberToObject(j, "best_k", K->k.best);
		cJSON_AddItemToObject(j, "best", names_json(K->best));
	}
	return j;
}

/* Rank 0, after every shard is in place: the manifest, then publishing
 * and pruning (--keep, or --keep-last and --keep-best). */
static int finish(hpucoll_comm *comm, const hpu_train_opts *o, const hpu_builder *b,
		  hpu_strat *st, const hpu_run_pos *pos, const rec *all, const hpu_ckpt_file *bf,
		  const char *partial, const char *name, char *msg, size_t msglen)
{
	keeping K = {0};
	int keeps = o->keep_best[0] || o->keep_last, rc = -1;
	char *text = NULL, path[1200];
	cJSON *m;
	if (keeps && keep_plan(&K, o, b, pos, name, msg, msglen) < 0)
		goto out;
	if (!(m = manifest(comm, o, b, st, pos, all, bf, msg, msglen)))
		goto out;
	if (keeps)
		cJSON_AddItemToObject(m, "keep", keep_json(&K));
	text = hpu__ckpt_manifest_text(m); /* with its own digest */
	cJSON_Delete(m);
	if (!text) {
		say(msg, msglen, "out of memory");
		goto out;
	}
	snprintf(path, sizeof path, "%s/%s/%s", o->checkpoint_dir, partial, HPU_CKPT_MANIFEST);
	rc = hpu__write_atomic(path, text, strlen(text), msg, msglen);
	if (rc == 0)
		rc = hpu__ckpt_publish(o->checkpoint_dir, partial, name, keeps ? 0 : o->keep, msg,
				       msglen);
	if (rc == 0 && keeps)
		rc = hpu__ckpt_prune(o->checkpoint_dir, K.best, K.last, msg, msglen);
out:
	free(text);
	hpu__ckpt_free_names(K.best);
	hpu__ckpt_free_names(K.last);
	return rc;
}

/* Writes record j (freed) to the metrics file (rank 0's; NULL: none),
 * flushed; -1 with a sentence naming the file when it cannot. */
static int metrics_put(FILE *metrics, const char *path, cJSON *j, char *err, size_t errlen)
{
	char *s = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!metrics) {
		free(s);
		return 0;
	}
	if (!s)
		return say(err, errlen, "out of memory writing the metrics file %s", path);
	int bad = fprintf(metrics, "%s\n", s) < 0 || fflush(metrics) != 0, e = errno;
	free(s);
	if (bad)
		return say(err, errlen, "cannot write the metrics file %s: %s", path, strerror(e));
	return 0;
}

/* bbytes: the buffers file's size (0: none), written by rank 0 besides
 * its shard. */
static int save_report(const hpu_train_opts *o, const char *name, long step, const rec *all,
		       int world, double bbytes, double secs, FILE *metrics, char *err,
		       size_t errlen)
{
	double bytes = bbytes, slowest = 0;
	for (int r = 0; r < world; r++) {
		bytes += all[r].bytes;
		slowest = all[r].secs > slowest ? all[r].secs : slowest;
	}
	printf("checkpoint: step %ld saved to %s/%s: %d shards%s, %.1f MB, %.3f s "
	       "(slowest rank wrote %.1f MB/s)\n",
	       step, o->checkpoint_dir, name, world, bbytes > 0 ? " and the buffers" : "",
	       bytes / 1e6, secs, slowest > 0 ? all[0].bytes / 1e6 / slowest : 0);
	if (!metrics)
		return 0;
	cJSON *j = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
	cJSON_AddStringToObject(j, "checkpoint", "saved");
	cJSON_AddNumberToObject(j, "step", (double)step);
	cJSON_AddStringToObject(j, "name", name);
	cJSON_AddNumberToObject(j, "bytes", bytes);
	if (bbytes > 0)
		cJSON_AddNumberToObject(j, "buffer_bytes", bbytes);
	cJSON_AddNumberToObject(j, "seconds", secs);
	for (int r = 0; r < world; r++) {
		cJSON *x = cJSON_CreateObject();
		cJSON_AddNumberToObject(x, "rank", r);
		cJSON_AddNumberToObject(x, "bytes", all[r].bytes);
		cJSON_AddNumberToObject(x, "seconds", all[r].secs);
		cJSON_AddItemToArray(ranks, x);
	}
	cJSON_AddItemToObject(j, "ranks", ranks);
	return metrics_put(metrics, o->metrics, j, err, errlen);
}

/* ---- a save interrupted ---- */

/* What SIGTERM, SIGINT or SIGHUP during a save removes before the process
 * dies of it as it would have (the handler uses only unlink, rmdir and
 * nanosleep, which are async-signal-safe): this rank's files in the
 * partial directory, and on rank 0 the directory once the other ranks
 * have removed theirs (waiting up to 1.8 s). What a SIGKILL leaves, the next
 * save or start-up removes (hpu__ckpt_clean_partials). */
static struct {
	char files[6][1300];
	int nfiles;
	char dir[1200];
	volatile sig_atomic_t made; /* rank 0 made dir: it removes it */
	int lock; /* rank 0's lock on the partial directory, or -1 */
	int installed[3];
	struct sigaction old[3];
} G = {.lock = -1};

static const int guarded[3] = {SIGTERM, SIGINT, SIGHUP};

static void on_stop(int sig)
{
	int e = errno;
	struct timespec ts = {0, 20 * 1000 * 1000};
	/* again each time: another thread of this process may still be
	 * writing (the signal may have come to any thread) */
	/* rank 0 waits for the other ranks' files up to 1.8 s: nearly the
	 * launcher's 2 s of grace before SIGKILL (a rank descheduled on a
	 * loaded node may take over a second to run its handler) */
	for (int k = 0; k < 90; k++) {
		for (int i = 0; i < G.nfiles; i++)
			unlink(G.files[i]);
		if (!G.made || rmdir(G.dir) == 0 || errno != ENOTEMPTY)
			break;
		nanosleep(&ts, NULL);
	}
	errno = e;
	signal(sig, SIG_DFL);
	raise(sig);
}

/* file and the temporary name hpu_outfile writes it under */
static void guard_file(const char *dir, const char *name)
{
	int pid = (int)getpid();
	snprintf(G.files[G.nfiles++], sizeof G.files[0], "%s/%s", dir, name);
	snprintf(G.files[G.nfiles++], sizeof G.files[0], "%s/%s.tmp.%d", dir, name, pid);
}

/* Names this rank's files in dir (the partial) and takes the signals
 * whose action is the default one: rank 0 before it makes dir (the
 * handler removes dir once G.made says it did), the others once they
 * know it is made. */
static void guard_begin(int rank, const char *dir, const char *shard, int buffers)
{
	G.nfiles = 0;
	G.made = 0;
	snprintf(G.dir, sizeof G.dir, "%s", dir);
	guard_file(dir, shard);
	if (rank == 0) {
		guard_file(dir, HPU_CKPT_MANIFEST);
		if (buffers)
			guard_file(dir, HPU_CKPT_BUFFERS);
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	for (int i = 0; i < 3; i++) {
		G.installed[i] = sigaction(guarded[i], NULL, &G.old[i]) == 0 &&
				 G.old[i].sa_handler == SIG_DFL &&
				 sigaction(guarded[i], &sa, NULL) == 0;
	}
}

/* The signals' actions as they were; rank 0's lock released. */
static void guard_end(void)
{
	for (int i = 0; i < 3; i++) {
		if (G.installed[i])
			sigaction(guarded[i], &G.old[i], NULL);
		G.installed[i] = 0;
	}
	if (G.lock >= 0)
		close(G.lock);
	G.lock = -1;
	G.made = 0;
}

static void said_removed(const char *path, void *arg)
{
	(void)arg;
	printf("checkpoint: removed the stale partial checkpoint %s (left by an interrupted "
	       "save)\n",
	       path);
}

/* Rank 0: the partial directory made (a stale one of this uid removed
 * first) and locked for the save. */
static int make_partial(const char *root, const char *path, char *msg, size_t msglen)
{
	hpu__ckpt_clean_partials(root, said_removed, NULL);
	if (mkdir_p(root, msg, msglen) < 0)
		return -1;
	if (mkdir(path, 0755) == 0)
		G.made = 1; /* ours: a signal from now on removes it */
	else
		return say(msg, msglen,
			   errno == EEXIST ? "cannot make directory %s: it exists, held by a save "
					     "that still runs or owned by another user"
					   : "cannot make directory %s: %s",
			   path, strerror(errno));
	if ((G.lock = hpu__ckpt_partial_lock(path)) < 0)
		return say(msg, msglen, "cannot lock %s: %s", path, strerror(errno));
	return 0;
}

int hpu__checkpoint_save(hpucoll_comm *comm, const hpu_train_opts *o, hpu_builder *b,
			 hpu_strat *st, const hpu_run_pos *pos, FILE *metrics, char *err,
			 size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	const char *root = o->checkpoint_dir;
	char name[64], partial[80], path[1200], why[600];
	double t0 = now_s();
	hpu__ckpt_step_name(pos->step, name, sizeof name);
	snprintf(partial, sizeof partial, ".%s.partial", name);
	rec mine = {.ok = 1};
	rec *all = calloc((size_t)world, sizeof *all);
	hpu_ckpt_file bf = {0}; /* rank 0's buffers file */
	if (!all)
		return say(err, errlen, "out of memory");
	/* rank 0 makes the partial directory; a crashed save's is dropped */
	char shard[96];
	hpu__ckpt_shard_name(rank, world, shard, sizeof shard);
	snprintf(path, sizeof path, "%s/%s", root, partial);
	/* once the partial is this save's (rank 0 holds it), a signal
	 * removes it: rank 0 at once, the others when they know */
	if (rank == 0)
		guard_begin(rank, path, shard, b->nbuffers > 0);
	if (rank == 0 && make_partial(root, path, mine.msg, sizeof mine.msg) < 0)
		mine.ok = 0;
	if (agree(comm, &mine, all, why, sizeof why))
		goto failed;
	if (rank != 0)
		guard_begin(rank, path, shard, b->nbuffers > 0);
	/* every rank its shard, at once */
	snprintf(path, sizeof path, "%s/%s/%s", root, partial, shard);
	double tw = now_s();
	hpu_ckpt_writer w;
	if (hpu__ckpt_writer_open(&w, path, mine.msg, sizeof mine.msg) < 0) {
		mine.ok = 0;
	} else if (hpu__strat_ckpt_write(st, &w) < 0) {
		mine.ok = 0;
		hpu__ckpt_writer_abort(&w);
	} else {
		mine.bytes = (double)w.bytes;
		if (hpu__ckpt_writer_commit(&w, mine.sha256, mine.msg, sizeof mine.msg) < 0) {
			mine.ok = 0;
			hpu__ckpt_writer_abort(&w);
		}
	}
	if (!mine.ok && !mine.msg[0]) /* the strategy's sentence is in err */
		snprintf(mine.msg, sizeof mine.msg, "%s", err);
	/* the buffers are whole on every rank: rank 0 writes them, once */
	if (mine.ok && rank == 0 && b->nbuffers) {
		snprintf(path, sizeof path, "%s/%s", root, partial);
		if (write_buffers(b, st, path, &bf, mine.msg, sizeof mine.msg) < 0)
			mine.ok = 0;
	}
	mine.secs = now_s() - tw;
	if (agree(comm, &mine, all, why, sizeof why))
		goto failed;
	/* rank 0: manifest, rename, latest, pruning */
	rec done = {.ok = 1};
	if (rank == 0 && finish(comm, o, b, st, pos, all, &bf, partial, name, done.msg,
				sizeof done.msg) < 0)
		done.ok = 0;
	if (agree(comm, &done, NULL, why, sizeof why))
		goto failed;
	/* its record in the metrics: every rank fails when rank 0 cannot */
	rec rep = {.ok = 1};
	if (rank == 0 && save_report(o, name, pos->step, all, world, (double)bf.bytes, now_s() - t0,
				     metrics, rep.msg, sizeof rep.msg) < 0)
		rep.ok = 0;
	free(all);
	guard_end();
	if (agree(comm, &rep, NULL, why, sizeof why))
		return say(err, errlen, "checkpoint of step %ld saved to %s/%s, but %s", pos->step,
			   root, name, why);
	return 0;
failed:
	if (rank == 0 && G.made) { /* only a partial of its own */
		snprintf(path, sizeof path, "%s/%s", root, partial);
		hpu__ckpt_rmtree(path);
	}
	guard_end();
	free(all);
	return say(err, errlen, "checkpoint of step %ld not saved (the previous checkpoints are "
				"untouched): %s",
		   pos->step, why);
}

/* ---- resuming ---- */

/* The checkpoint's parameters must be the model's, name by name; it has
 * buffers exactly when the model has (the strategy matches them one by
 * one when it reads them: hpu__strat_resume_buffers). */
static int same_model(const hpu_ckpt *c, const hpu_builder *b, char *err, size_t errlen)
{
	if (c->nparams != b->nparams)
		return say(err, errlen,
			   "checkpoint %s holds %d parameters, the model %s has %d (another model?)",
			   c->dir, c->nparams, b->path, b->nparams);
	for (int i = 0; i < b->nparams; i++) {
		const hpu_param_info *p = &b->params[i];
		const hpu_ckpt_param *q = &c->params[i];
		int same = strcmp(p->name, q->name) == 0 && p->ndim == q->ndim;
		for (int d = 0; same && d < p->ndim; d++)
			same = p->shape[d] == q->shape[d];
		if (!same)
			return say(err, errlen,
				   "checkpoint %s: parameter %d is %s (%llu floats) there, %s (%zu "
				   "floats) in %s (another model?)",
				   c->dir, i, q->name, (unsigned long long)q->numel, p->name, p->numel,
				   b->path);
	}
	if (c->nbuffers && !b->nbuffers)
		return say(err, errlen,
			   "checkpoint %s holds %d buffers (%s, ...), but the model %s declares "
			   "none (another model?)",
			   c->dir, c->nbuffers, c->buffers[0].name, b->path);
	if (!c->nbuffers && b->nbuffers)
		return say(err, errlen,
			   "checkpoint %s holds no buffers, but the model %s declares %d "
			   "(%s, ...): it was saved by a model without them (another model?)",
			   c->dir, b->path, b->nbuffers, b->buffers[0].name);
	return 0;
}

/* Opens and verifies one checkpoint, every rank checking its share of the
 * files, trusting only the files of *who. Returns it, or NULL with the
 * first failure in err and *foreign set when a rank found a file of
 * another uid. */
static hpu_ckpt *try_one(hpucoll_comm *comm, const hpu_builder *b, const char *dir,
			 const hpu_ckpt_owners *who, int *foreign, char *err, size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	rec mine = {.ok = 1};
	rec *all = calloc((size_t)world, sizeof *all);
	hpu_ckpt *c = calloc(1, sizeof *c);
	*foreign = 0;
	if (!c || !all) {
		mine.ok = 0;
		snprintf(mine.msg, sizeof mine.msg, "out of memory");
	} else if (hpu__ckpt_open_owned(c, dir, who, mine.msg, sizeof mine.msg) < 0 ||
		   same_model(c, b, mine.msg, sizeof mine.msg) < 0) {
		mine.ok = 0;
	} else {
		for (int i = rank; i < c->nfiles && mine.ok; i += world) {
			if (hpu__ckpt_verify(c, i, mine.msg, sizeof mine.msg) < 0)
				mine.ok = 0;
			c->bytes_verified += c->files[i].bytes;
		}
		/* the buffers file: the rank next in turn after the shards */
		if (mine.ok && c->nbuffers && rank == c->nfiles % world) {
			if (hpu__ckpt_verify_buffers(c, mine.msg, sizeof mine.msg) < 0)
				mine.ok = 0;
			c->bytes_verified += c->buffer_file.bytes;
		}
	}
	mine.foreign = c && c->foreign;
	int failed = all ? agree(comm, &mine, all, err, errlen)
			 : agree(comm, &mine, NULL, err, errlen);
	for (int r = 0; failed && all && r < world; r++)
		*foreign |= all[r].foreign;
	free(all);
	if (failed) {
		if (c)
			hpu__ckpt_close(c);
		free(c);
		return NULL;
	}
	if (c->unsealed && rank == 0) {
		char note[4400];
		hpu__ckpt_unsealed_note(c, note, sizeof note);
		printf("warning: resume: %s\n", note);
	}
	return c;
}

/* The uids the job's ranks run as (with hpud's job_uids, one per node's
 * job): the owners whose checkpoint files the job trusts. */
static int job_owners(hpucoll_comm *comm, hpu_ckpt_owners *who, char *err, size_t errlen)
{
	int world = hpucoll_comm_size(comm);
	int32_t me = (int32_t)geteuid(), *all = calloc((size_t)world, sizeof *all);
	if (!all)
		return say(err, errlen, "out of memory");
	int rc = hpucoll_all_gather(comm, &me, all, 1, HPUCOLL_I32);
	if (rc) {
		free(all);
		return say(err, errlen, "checkpoint all-gather failed: %s", hpucoll_comm_why(comm, rc));
	}
	who->n = 0;
	for (int r = 0; r < world; r++) {
		int k = 0;
		while (k < who->n && who->uid[k] != (uid_t)all[r])
			k++;
		if (k < who->n)
			continue;
		if (who->n == HPU_CKPT_MAX_OWNERS) {
			free(all);
			return say(err, errlen,
				   "the ranks run as more than %d uids: which files to trust on "
				   "resume?",
				   HPU_CKPT_MAX_OWNERS);
		}
		who->uid[who->n++] = (uid_t)all[r];
	}
	free(all);
	return 0;
}

/* root/latest, when there is one, of one of *who: every rank's answer
 * shared (they may see the root differently). */
static int latest_trusted(hpucoll_comm *comm, const char *root, const hpu_ckpt_owners *who,
			  char *err, size_t errlen)
{
	rec mine = {.ok = 1};
	if (hpu__ckpt_check_latest(root, who, mine.msg, sizeof mine.msg) < 0)
		mine.ok = 0;
	return agree(comm, &mine, NULL, err, errlen) ? -1 : 0;
}

static int exists(const char *dir, const char *file)
{
	char p[1200];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, file);
	return stat(p, &st) == 0;
}

int hpu__checkpoint_find(hpucoll_comm *comm, const hpu_train_opts *o, hpu_builder *b,
			 hpu_ckpt **out, char *err, size_t errlen)
{
	*out = NULL;
	int rank = hpucoll_comm_rank(comm);
	/* what an interrupted save of this checkpoint root left (rank 0 alone
	 * writes there until the first save) */
	if (rank == 0 && o->checkpoint_dir[0])
		hpu__ckpt_clean_partials(o->checkpoint_dir, said_removed, NULL);
	const char *want = o->resume, *rc_env = hpu__env_str(HPU_ENV_HPU_RESTART_COUNT);
	long restarts = 0; /* unset or not a number: none */
	hpu__parse_long(rc_env, LONG_MIN, LONG_MAX, &restarts);
	/* After a restart the newest checkpoint of this job wins over a
	 * --resume DIR given for its first attempt (when there is one). */
	char **names = NULL, dir[1200], why[600] = "";
	int mine = 0;
	if (restarts > 0 && o->checkpoint_dir[0] && strcmp(want, "auto") != 0) {
		mine = hpu__ckpt_candidates(o->checkpoint_dir, &names, err, errlen);
		hpu__ckpt_free_names(names);
		names = NULL;
	}
	if (restarts > 0 && o->checkpoint_dir[0] && (!*want || mine > 0))
		want = "auto";
	if (restarts > 0 && !strcmp(want, "auto") && rank == 0)
		printf("restart %ld (HPU_RESTART_COUNT): resuming from the newest intact "
		       "checkpoint in %s\n",
		       restarts, o->checkpoint_dir);
	if (!*want)
		return 0;
	int autom = strcmp(want, "auto") == 0, foreign = 0;
	const char *root = autom ? o->checkpoint_dir : want;
	hpu_ckpt_owners who;
	if (job_owners(comm, &who, err, errlen) < 0)
		return -1;
	if (!autom && exists(want, HPU_CKPT_MANIFEST)) {
		*out = try_one(comm, b, want, &who, &foreign, why, sizeof why);
		return *out ? 0 : say(err, errlen, "--resume %s: %s", want, why);
	}
	if (latest_trusted(comm, root, &who, why, sizeof why) < 0)
		return say(err, errlen, "--resume %s: %s", want, why);
	int n = hpu__ckpt_candidates(root, &names, err, errlen);
	if (n < 0)
		return -1;
	if (n == 0) {
		hpu__ckpt_free_names(names);
		if (!autom)
			return say(err, errlen,
				   "--resume %s: no checkpoint there (neither %s nor step-* directories)",
				   want, HPU_CKPT_MANIFEST);
		if (rank == 0)
			printf("resume: no checkpoint in %s yet: starting from step 0\n", root);
		return 0;
	}
	/* auto passes damaged checkpoints by, never another uid's files */
	for (int i = 0; i < (autom ? n : 1) && !*out && !foreign; i++) {
		snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
		*out = try_one(comm, b, dir, &who, &foreign, why, sizeof why);
		if (!*out && rank == 0 && autom && i + 1 < n && !foreign)
			printf("warning: resume: checkpoint %s is unusable: %s; falling back to %s/%s\n",
			       dir, why, root, names[i + 1]);
	}
	hpu__ckpt_free_names(names);
	if (!*out && foreign)
		return say(err, errlen, "--resume %s: %s", want, why);
	if (!*out)
		return say(err, errlen, "--resume %s: no intact checkpoint in %s: %s", want, root, why);
	return 0;
}

/* ---- applying the run's state ---- */

static int pick(const char *v, const char *(*name)(int), int n)
{
	for (int i = 0; i < n; i++)
		if (v && strcmp(v, name(i)) == 0)
			return i;
	return -1;
}

static const char *sched_name_i(int i)
{
	return hpu__sched_name((hpu_sched_kind)i);
}

static int sched_from(const cJSON *j, hpu_sched *s)
{
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type"),
		    *wt = cJSON_GetObjectItemCaseSensitive(j, "warmup_type");
	int kind = pick(cJSON_IsString(t) ? t->valuestring : NULL, sched_name_i,
			HPU_SCHED_WARMUP_DECAY + 1);
	if (kind < 0)
		return -1;
	s->kind = (hpu_sched_kind)kind;
	s->lr = hpu__ckpt_num(j, "lr", s->lr);
	s->warmup_min_lr = hpu__ckpt_num(j, "warmup_min_lr", s->warmup_min_lr);
	s->warmup_steps = (long)hpu__ckpt_num(j, "warmup_steps", (double)s->warmup_steps);
	s->warmup_type = cJSON_IsString(wt) && !strcmp(wt->valuestring, "linear") ? HPU_WARMUP_LINEAR
										    : HPU_WARMUP_LOG;
	s->total_steps = (long)hpu__ckpt_num(j, "total_steps", (double)s->total_steps);
	s->step_size = (long)hpu__ckpt_num(j, "step_size", (double)s->step_size);
	s->gamma = hpu__ckpt_num(j, "gamma", s->gamma);
	s->min_lr = hpu__ckpt_num(j, "min_lr", s->min_lr);
	return 0;
}

static int floats_from(const cJSON *a, float *v, int n)
{
	if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
		return -1;
	int i = 0;
	const cJSON *x;
	cJSON_ArrayForEach(x, a) v[i++] = cJSON_IsNumber(x) ? (float)x->valuedouble : 0.0f;
	return 0;
}

/* fp8 training's state, when both runs train in fp8 with the same
 * history length; else the histories start afresh (said). */
static int fp8_from(const hpu_ckpt *c, const hpu_train_opts *o, int rank, char *err,
		    size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, "fp8");
	if (o->precision != HPU_PREC_FP8 || !cJSON_IsObject(j))
		return 0;
	int H = hpu__fp8_recipe()->history;
	if ((int)hpu__ckpt_num(j, "amax_history_len", -1) != H) {
		if (rank == 0)
			printf("resume: the checkpoint's fp8 amax history is %g steps, this run's %d: "
			       "the histories start afresh\n",
			       hpu__ckpt_num(j, "amax_history_len", -1), H);
		return 0;
	}
	float *hist = malloc((size_t)3 * H * sizeof *hist);
	if (!hist)
		return say(err, errlen, "out of memory");
	const cJSON *s;
	cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "sites")) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(s, "name");
		hpu_fp8_saved sv = {.name = cJSON_IsString(nm) ? nm->valuestring : "",
				    .layer = (int)hpu__ckpt_num(s, "layer", -1),
				    .op = (int)hpu__ckpt_num(s, "op", -1),
				    .k = (int)hpu__ckpt_num(s, "k", 0),
				    .hist = hist,
				    .nhist = (int)hpu__ckpt_num(s, "filled", 0),
				    .pos = (int)hpu__ckpt_num(s, "pos", 0)};
		if (floats_from(cJSON_GetObjectItemCaseSensitive(s, "scale"), sv.scale, 3) < 0 ||
		    floats_from(cJSON_GetObjectItemCaseSensitive(s, "amax_history"), hist, 3 * H) < 0 ||
		    sv.pos < 0 || sv.pos >= H) {
			free(hist);
			return say(err, errlen, "checkpoint %s: a damaged fp8 entry (%s)", c->dir,
				   sv.name);
		}
		if (hpu__fp8_saved_put(&sv) < 0) {
			free(hist);
			return say(err, errlen, "out of memory");
		}
	}
	free(hist);
	return 0;
}

/* --early-stop's count goes on when the checkpoint's rule watched the
 * same metric the same way; else it starts afresh (said). */
static void early_from(const hpu_ckpt *c, const hpu_train_opts *o, hpu_run_pos *pos, int rank)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, "early_stop");
	const cJSON *jm = cJSON_GetObjectItemCaseSensitive(j, "metric"),
		    *jo = cJSON_GetObjectItemCaseSensitive(j, "mode");
	hpu_early_stop e;
	char why[256];
	if (!o->early_stop[0] || !cJSON_IsString(jm) || !cJSON_IsString(jo) ||
	    hpu__early_stop_parse(o->early_stop, &e, why, sizeof why) < 0)
		return;
	if (strcmp(jm->valuestring, e.metric) || strcmp(jo->valuestring, e.max ? "max" : "min")) {
		if (rank == 0)
			printf("resume: the checkpoint's early-stop count watched %s:%s, this run "
			       "%s:%s: it starts afresh\n",
			       jm->valuestring, jo->valuestring, e.metric, e.max ? "max" : "min");
		return;
	}
	pos->es_best = hpu__ckpt_num(j, "best", NAN);
	pos->es_best_step = (long)hpu__ckpt_num(j, "best_step", 0);
	pos->es_wait = (long)hpu__ckpt_num(j, "wait", 0);
	pos->es_restored = 1;
	if (rank == 0 && !isnan(pos->es_best))
		printf("resume: --early-stop goes on from the checkpoint: the best %s, %.4f, at step "
		       "%ld; %ld validation%s since without improvement\n",
		       e.metric, pos->es_best, pos->es_best_step, pos->es_wait,
		       hpu__plural(pos->es_wait));
}

/* Every rank's bytes read and verified and seconds, on rank 0's line and
 * in the metrics. */
static int load_report(hpucoll_comm *comm, const hpu_ckpt *c, double secs, FILE *metrics,
		       const char *mpath, char *err, size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	double mine[3] = {(double)c->bytes_read, (double)c->bytes_verified, secs};
	double *all = calloc((size_t)world * 3, sizeof *all);
	if (!all)
		return say(err, errlen, "out of memory");
	int rc = hpucoll_all_gather(comm, mine, all, 3, HPUCOLL_F64);
	if (rc) {
		free(all);
		return say(err, errlen, "checkpoint statistics all-gather failed: %s",
			   hpucoll_comm_why(comm, rc));
	}
	if (rank == 0) {
		double rd = 0, vf = 0, slow = 0;
		cJSON *j = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
		for (int r = 0; r < world; r++) {
			rd += all[3 * r];
			vf += all[3 * r + 1];
			slow = all[3 * r + 2] > slow ? all[3 * r + 2] : slow;
			cJSON *x = cJSON_CreateObject();
			cJSON_AddNumberToObject(x, "rank", r);
			cJSON_AddNumberToObject(x, "bytes_read", all[3 * r]);
			cJSON_AddNumberToObject(x, "bytes_verified", all[3 * r + 1]);
			cJSON_AddNumberToObject(x, "seconds", all[3 * r + 2]);
			cJSON_AddItemToArray(ranks, x);
		}
		printf("resume: %d rank%s verified %.1f MB and read %.1f MB in %.3f s (slowest rank)\n",
		       world, hpu__plural(world), vf / 1e6, rd / 1e6, slow);
		cJSON_AddStringToObject(j, "checkpoint", "loaded");
		cJSON_AddNumberToObject(j, "step", (double)c->step);
		cJSON_AddNumberToObject(j, "seconds", slow);
		cJSON_AddItemToObject(j, "ranks", ranks);
		if (metrics_put(metrics, mpath, j, err, errlen) < 0) {
			free(all);
			return -1;
		}
	}
	free(all);
	return 0;
}

int hpu__checkpoint_apply(hpucoll_comm *comm, hpu_ckpt *c, const hpu_train_opts *o,
			  hpu_run_pos *pos, double secs, FILE *metrics, char *err, size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	long gb = (long)hpu__ckpt_num(c->m, "global_batch", -1);
	if (gb != o->batch_size)
		return say(err, errlen,
			   "checkpoint %s was saved with a global batch of %ld; resuming needs the "
			   "same (--batch-size %ld), not %d",
			   c->dir, gb, gb, o->batch_size);
	pos->step = c->step;
	pos->epoch = (int)hpu__ckpt_num(c->m, "epoch", 0);
	pos->batch = (long)hpu__ckpt_num(c->m, "batch_in_epoch", 0);
	const cJSON *rng = cJSON_GetObjectItemCaseSensitive(c->m, "rng");
	const cJSON *seed = cJSON_GetObjectItemCaseSensitive(rng, "seed");
	if (cJSON_IsString(seed))
		hpu__parse_u64(seed->valuestring, 0, UINT64_MAX, &pos->seed); /* checked on open */
	hpu_sched mine = pos->sched;
	if (sched_from(cJSON_GetObjectItemCaseSensitive(c->m, "scheduler"), &pos->sched) < 0)
		return say(err, errlen, "checkpoint %s: the scheduler entry is damaged", c->dir);
	early_from(c, o, pos, rank);
	if (fp8_from(c, o, rank, err, errlen) < 0 ||
	    load_report(comm, c, secs, metrics, o->metrics, err, errlen) < 0)
		return -1;
	if (rank != 0)
		return 0;
	int reshard = c->world != world || strcmp(c->strategy, hpu__strategy_name(o->strategy));
	printf("resumed from %s at step %ld (epoch %d, batch %ld): saved by %d worker%s under %s "
	       "(%s)%s%s%s\n",
	       c->dir, c->step, pos->epoch + 1, pos->batch, c->world, hpu__plural(c->world),
	       c->strategy, c->precision,
	       reshard ? ", resharded for " : "", reshard ? hpu__strategy_name(o->strategy) : "",
	       reshard ? " here" : "");
	if (strcmp(c->precision, hpu__precision_name(o->precision)) != 0)
		printf("note: checkpoint %s was saved at --precision %s; this run goes on at "
		       "--precision %s\n", c->dir, c->precision, hpu__precision_name(o->precision));
	if (memcmp(&mine, &pos->sched, sizeof mine) != 0)
		printf("resume: the checkpoint's learning-rate schedule is kept (%s, lr %g, %ld "
		       "total steps); this run's options differ\n",
		       hpu__sched_name(pos->sched.kind), pos->sched.lr, pos->sched.total_steps);
	if (pos->seed != o->seed)
		printf("resume: the checkpoint's seed %llu orders the data, not --seed %llu\n",
		       (unsigned long long)pos->seed, (unsigned long long)o->seed);
	return 0;
}
