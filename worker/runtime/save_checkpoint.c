/* save_checkpoint: hpu__checkpoint_save -- every rank its shard in the
 * partial directory, rank 0 the buffers file, the manifest
 * (save_manifest.c), the report; a signal during the save removes what
 * it made. Calls save_manifest.c and save_resume_base.c
 * (save_resume_impl.h). */
#include "worker/runtime/save_resume_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/num.h"
#include "common/fileio.h"
#include "common/thread.h"

#define say hpu__say

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int mkdir_p(const char *path, char *err, size_t errlen)
{
	char at[600];
	if (hpu__make_dirs(path, at, sizeof at) < 0)
		return say(err, errlen, "cannot make directory %s: %s", at, strerror(errno));
	return 0;
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
	printf("checkpoint: step %ld saved to %s/%s: %d shard%s%s, %.1f MB, %.3f s "
	       "(slowest rank wrote %.1f MB/s)\n",
	       step, o->checkpoint_dir, name, world, hpu__plural(world),
	       bbytes > 0 ? " and the buffers" : "",
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
	return hpu__checkpoint_metrics_put(metrics, o->metrics, j, err, errlen);
}

/* ---- a save interrupted ---- */

/* What SIGTERM, SIGINT or SIGHUP during a save removes before the process
 * dies of it as it would have (the handler uses only system calls that
 * are async-signal-safe): on rank 0, the partial directory whole; on the
 * other ranks, their files until their shard is committed (then it is
 * rank 0's), and the directory where it is left empty once rank 0 is
 * gone. Once rank 0 has renamed the partial into place, the save is
 * finished instead: `latest` made to name it (hpu__ckpt_publish_finish).
 * What a SIGKILL leaves, the next save or start-up removes
 * (hpu__ckpt_clean_partials). */
static struct {
	char files[6][1300];
	int nfiles;
	char dir[1200];
	volatile sig_atomic_t made; /* rank 0 made dir: it removes it */
	volatile sig_atomic_t other; /* a rank but 0: rank 0 made dir */
	volatile int lock; /* rank 0's lock on the partial directory, or -1 */
	hpu_stop_handlers saved;
} G = {.lock = -1};

/* dir removed where it is empty once rank 0 no longer holds its lock,
 * waiting up to 0.2 s for rank 0 to die of the same signal: a rank
 * signalled alone, rank 0 alive, removed rank 0's directory under its
 * save, whose error then blamed the directory (rank 0 removes it as
 * the save fails); flock is a system call, safe here */
static void rmdir_unheld(const char *dir)
{
	struct timespec ts = {0, 20 * 1000 * 1000};
	for (int k = 0; k < 10; k++) {
		int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return; /* gone: rank 0 removed it */
		int free = flock(fd, LOCK_EX | LOCK_NB) == 0;
		if (free)
			rmdir(dir);
		close(fd);
		if (free)
			return;
		nanosleep(&ts, NULL);
	}
}

static void on_stop(int sig)
{
	int e = errno;
	struct timespec ts = {0, 20 * 1000 * 1000};
	/* rank 0 past the rename of its publish: `latest` finished, the
	 * partial's name (nothing, or the checkpoint of this step it
	 * replaced) left for the next start */
	int published = G.made && hpu__ckpt_publish_finish();
	/* rank 0 owns the partial, locked: it removes it whole, again until
	 * it is gone, up to 1.8 s (nearly the launcher's 2 s of grace before
	 * SIGKILL): a rank still writing, or another thread of this process,
	 * may make a file in it meanwhile. Not locked yet, it is empty (or
	 * another uid's that the mkdir found): an rmdir */
	for (int k = 0; k < 90 && G.made && !published && G.lock >= 0; k++) {
		struct stat st;
		hpu__ckpt_remove_sigsafe(G.dir);
		if (lstat(G.dir, &st) != 0 && errno == ENOENT)
			break;
		nanosleep(&ts, NULL);
	}
	if (G.made && !published && G.lock < 0)
		rmdir(G.dir);
	/* a rank but 0 whose shard is not committed yet: its files, and the
	 * directory where that leaves it empty and rank 0 is gone */
	if (!G.made && G.other) {
		for (int i = 0; i < G.nfiles; i++)
			unlink(G.files[i]);
		rmdir_unheld(G.dir);
	}
	/* rank 0 past the publish, pruning an old checkpoint (--keep): its
	 * rest goes too (it was left as a .step-M.partial of some shards) */
	hpu__ckpt_discard_finish();
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
	G.other = rank != 0;
	snprintf(G.dir, sizeof G.dir, "%s", dir);
	guard_file(dir, shard);
	if (rank == 0) {
		guard_file(dir, HPU_CKPT_MANIFEST);
		if (buffers)
			guard_file(dir, HPU_CKPT_BUFFERS);
	}
	hpu__stop_signals_take(&G.saved, on_stop);
}

/* A rank but 0 has committed its shard: from here a signal leaves it to
 * rank 0, which removes the partial whole or publishes it (its handler
 * removing the shard left a checkpoint without it that rank 0, not yet
 * signalled on another node, could still publish). */
static void guard_committed(void)
{
	G.nfiles = 0;
	atomic_signal_fence(memory_order_seq_cst);
	G.other = 0;
}

/* The signals' actions as they were; rank 0's lock released. */
static void guard_end(void)
{
	hpu__stop_signals_restore(&G.saved);
	G.made = 0; /* first: the handler then leaves the partial alone */
	G.other = 0;
	atomic_signal_fence(memory_order_seq_cst);
	if (G.lock >= 0)
		close(G.lock);
	G.lock = -1;
}

/* Whether root/name was published from root/partial: the partial is gone
 * and name holds its manifest. */
static int published_now(const char *root, const char *partial, const char *name)
{
	char path[4200];
	struct stat sb;
	snprintf(path, sizeof path, "%s/%s", root, partial);
	if (lstat(path, &sb) == 0 || errno != ENOENT)
		return 0;
	snprintf(path, sizeof path, "%s/%s/%s", root, name, HPU_CKPT_MANIFEST);
	return stat(path, &sb) == 0;
}

/* Rank 0: the partial directory made (a stale one of this uid removed
 * first) and locked for the save. */
static int make_partial(const char *root, const char *path, char *msg, size_t msglen)
{
	hpu__ckpt_clean_partials(root, hpu__checkpoint_said_removed, NULL);
	if (mkdir_p(root, msg, msglen) < 0)
		return -1;
	/* ours before the mkdir: a signal that comes as it returns (before
	 * the next statement) removes it too. Only this job saves in root
	 * (rank 0 holds its lock) and this uid's stale partials are gone, so
	 * a directory of this name the handler finds is this one, or none
	 * (or another uid's that fails the mkdir: until the lock is taken
	 * the handler only tries an rmdir, which removes it only if empty). */
	G.made = 1;
	atomic_signal_fence(memory_order_seq_cst);
	if (mkdir(path, 0755) < 0) {
		G.made = 0;
		return say(msg, msglen,
			   errno == EEXIST ? "cannot make directory %s: it exists, held by a save "
					     "that still runs or owned by another user"
					   : "cannot make directory %s: %s",
			   path, strerror(errno));
	}
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
	int published = 0; /* rank 0's finish failed after publishing it */
	/* the shards' records (save_report reads them), then the finish's */
	rec *all = calloc(2 * (size_t)world, sizeof *all);
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
	if (hpu__checkpoint_agree(comm, &mine, all, why, sizeof why))
		goto failed;
	if (rank != 0)
		guard_begin(rank, path, shard, b->nbuffers > 0);
	/* every rank its shard, at once */
	snprintf(path, sizeof path, "%s/%s/%s", root, partial, shard);
	double tw = now_s();
	hpu_ckpt_writer w;
	if (hpu__ckpt_writer_open(&w, path, mine.msg, sizeof mine.msg) < 0) {
		mine.ok = 0;
		/* rank 0 made the partial, and this rank does not see it: another
		 * directory than rank 0's (each node's own disk at that path) */
		char here[1200];
		struct stat pst;
		hpu__dir_part(path, here, sizeof here); /* the shard's: the partial */
		if (rank != 0 && stat(here, &pst) < 0 && errno == ENOENT) {
			size_t at = strlen(mine.msg);
			snprintf(mine.msg + at, sizeof mine.msg - at,
				 " (rank 0 makes the partial directory; it is not there on this "
				 "node: --checkpoint-dir must be one directory every node shares)");
		}
	} else if (hpu__strat_ckpt_write(st, &w) < 0) {
		mine.ok = 0;
		hpu__ckpt_writer_abort(&w);
	} else {
		mine.bytes = (double)w.bytes;
		if (hpu__ckpt_writer_commit(&w, mine.sha256, mine.msg, sizeof mine.msg) < 0) {
			mine.ok = 0;
			hpu__ckpt_writer_abort(&w);
		} else if (rank != 0) {
			guard_committed();
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
	if (hpu__checkpoint_agree(comm, &mine, all, why, sizeof why))
		goto failed;
	/* rank 0: manifest, rename, latest, pruning */
	rec done = {.ok = 1};
	if (rank == 0 && hpu__checkpoint_finish(comm, o, b, st, pos, all, &bf, partial, name,
						done.msg, sizeof done.msg) < 0) {
		done.ok = 0;
		done.published = published_now(root, partial, name); /* `latest` or pruning failed */
	}
	int dfailed = hpu__checkpoint_agree(comm, &done, all + world, why, sizeof why);
	published = dfailed && all[world].published; /* rank 0's */
	if (dfailed)
		goto failed;
	/* its record in the metrics: every rank fails when rank 0 cannot */
	rec rep = {.ok = 1};
	if (rank == 0 && save_report(o, name, pos->step, all, world, (double)bf.bytes, now_s() - t0,
				     metrics, rep.msg, sizeof rep.msg) < 0)
		rep.ok = 0;
	free(all);
	guard_end();
	if (hpu__checkpoint_agree(comm, &rep, NULL, why, sizeof why))
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
	if (published)
		return say(err, errlen, "checkpoint of step %ld saved to %s/%s, but %s", pos->step,
			   root, name, why);
	return say(err, errlen, "checkpoint of step %ld not saved (the previous checkpoints are "
				"untouched): %s",
		   pos->step, why);
}
