/* resume_find: hpu__checkpoint_find -- the checkpoint --resume asks for
 * (or an elastic restart), found, checked against the model and verified,
 * every rank its share of the files. Calls save_resume_base.c
 * (save_resume_impl.h). */
#include "worker/runtime/save_resume_impl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fileio.h"
#include "common/num.h"
#include "common/shapetext.h"

#define say hpu__say

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
		if (!same) {
			char was[160], now[160];
			return say(err, errlen,
				   "checkpoint %s: parameter %d is %s %s there, %s %s in %s (other "
				   "model arguments, or another model?)",
				   c->dir, i, q->name, hpu__shape_text(was, sizeof was, q->ndim, q->shape),
				   p->name, hpu__shape_text(now, sizeof now, p->ndim, p->shape), b->path);
		}
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
 * first failure in err, *foreign set when a rank found a file of
 * another uid and *mismatch when the checkpoint is of another model (or
 * other model arguments): not damage, which an older one would mend. */
static hpu_ckpt *try_one(hpucoll_comm *comm, const hpu_builder *b, const char *dir,
			 const hpu_ckpt_owners *who, int *foreign, int *mismatch, char *err,
			 size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	rec mine = {.ok = 1};
	rec *all = calloc((size_t)world, sizeof *all);
	hpu_ckpt *c = calloc(1, sizeof *c);
	*foreign = *mismatch = 0;
	if (!c || !all) {
		mine.ok = 0;
		snprintf(mine.msg, sizeof mine.msg, "out of memory");
	} else if (hpu__ckpt_open_owned(c, dir, who, mine.msg, sizeof mine.msg) < 0) {
		mine.ok = 0;
	} else if (same_model(c, b, mine.msg, sizeof mine.msg) < 0) {
		mine.ok = 0;
		mine.mismatch = 1;
	} else if (hpu__ckpt_check_named_step(c, dir, mine.msg, sizeof mine.msg) < 0) {
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
	int failed = all ? hpu__checkpoint_agree(comm, &mine, all, err, errlen)
			 : hpu__checkpoint_agree(comm, &mine, NULL, err, errlen);
	for (int r = 0; failed && all && r < world; r++) {
		*foreign |= all[r].foreign;
		*mismatch |= all[r].mismatch;
	}
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
	return hpu__checkpoint_agree(comm, &mine, NULL, err, errlen) ? -1 : 0;
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
	/* one job saves in a root at a time (two overwrote and pruned each
	 * other's checkpoints, said as saved, or one died when both saved a
	 * step at once): rank 0 holds its lock for the run */
	static int root_lock = -1;
	if (rank == 0 && o->checkpoint_dir[0] && root_lock < 0) {
		if (hpu__make_dirs_said("checkpoint", o->checkpoint_dir, err, errlen) < 0 ||
		    (root_lock = hpu__ckpt_root_lock(o->checkpoint_dir, err, errlen)) < 0)
			return -1;
	}
	/* what an interrupted save of this checkpoint root left (rank 0 alone
	 * writes there until the first save) */
	if (rank == 0 && o->checkpoint_dir[0])
		hpu__ckpt_clean_partials(o->checkpoint_dir, hpu__checkpoint_said_removed, NULL);
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
	int autom = strcmp(want, "auto") == 0, foreign = 0, mismatch = 0;
	const char *root = autom ? o->checkpoint_dir : want;
	hpu_ckpt_owners who;
	if (job_owners(comm, &who, err, errlen) < 0)
		return -1;
	if (!autom && exists(want, HPU_CKPT_MANIFEST)) {
		*out = try_one(comm, b, want, &who, &foreign, &mismatch, why, sizeof why);
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
	/* a `latest` that names no checkpoint there (removed, or damaged):
	 * the newest by step stands for the root, and rank 0 says so */
	char raw[256];
	hpu__ckpt_latest(root, raw, sizeof raw);
	if (raw[0] && strcmp(raw, names[0]) != 0 && rank == 0)
		printf("warning: resume: %s/%s names \"%.100s\", which is not a checkpoint there; "
		       "taking the newest by step, %s/%s\n",
		       root, HPU_CKPT_LATEST, raw, root, names[0]);
	/* steps past the one `latest` names come last (an abandoned run's):
	 * rank 0 says that they are passed over */
	long head = -1, past = -1, st;
	int pi = -1;
	if (raw[0] && strcmp(raw, names[0]) == 0 && sscanf(names[0], "step-%ld", &head) == 1)
		for (int i = 1; i < n; i++)
			if (sscanf(names[i], "step-%ld", &st) == 1 && st > head && st > past) {
				past = st;
				pi = i;
			}
	if (pi >= 0 && autom && rank == 0)
		printf("resume: %s/%s is past the checkpoint %s/%s names, and is passed over: a "
		       "run that resumed from an earlier one left it, or its save was stopped "
		       "before it updated %s (--resume %s/%s takes it)\n",
		       root, names[pi], root, HPU_CKPT_LATEST, HPU_CKPT_LATEST, root, names[pi]);
	/* auto passes damaged checkpoints by, never another uid's files,
	 * nor one of another model (or model arguments): that is the run's
	 * mistake, which an older checkpoint of the root shares or, where it
	 * does not, would be taken in silence */
	for (int i = 0; i < (autom ? n : 1) && !*out && !foreign && !mismatch; i++) {
		snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
		*out = try_one(comm, b, dir, &who, &foreign, &mismatch, why, sizeof why);
		if (!*out && rank == 0 && autom && i + 1 < n && !foreign && !mismatch)
			printf("warning: resume: checkpoint %s is unusable: %s; falling back to %s/%s\n",
			       dir, why, root, names[i + 1]);
	}
	hpu__ckpt_free_names(names);
	if (!*out && (foreign || mismatch))
		return say(err, errlen, "--resume %s: %s", want, why);
	if (!*out && !autom) /* only the newest is tried: the root may hold others */
		return say(err, errlen,
			   "--resume %s: its newest checkpoint, %s, is not usable: %s (--resume "
			   "auto with --checkpoint-dir %s falls back to an older intact one)",
			   want, dir, why, want);
	if (!*out)
		return say(err, errlen, "--resume %s: no intact checkpoint in %s: %s", want, root, why);
	return 0;
}
