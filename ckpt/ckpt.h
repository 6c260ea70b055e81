/* ckpt: the checkpoint format on disk, shared by hpu-worker (saving,
 * resuming) and hpu-ckpt (info, verify, export, reshard).
 *
 * A checkpoint root (--checkpoint-dir) holds checkpoints, one directory
 * each, named step-NNNNNNNN, and a file `latest` naming the newest one.
 * A checkpoint directory holds
 *   manifest.json             what the run was and where every float is
 *   rank-RRRRR-of-WWWWW.bin   one shard per rank of the saving run
 *   buffers.bin               the model's buffers, when it has any
 *
 * The canonical space: every parameter's floats, unpadded, in declaration
 * order (what --save-params writes); parameter i is the range
 * [offset, offset + numel). A checkpoint stores sections over that space:
 * "params" (the fp32 master weights) and the optimizer's state
 * ("momentum_buffer" for SGD with momentum; "exp_avg", "exp_avg_sq" for
 * Adam and AdamW). Each shard holds segments, ranges of the canonical
 * space, listed in the manifest in increasing order; its bytes are, for
 * each section in the manifest's order, the segments' floats one after
 * another (little-endian fp32). The files' segments cover the canonical
 * space exactly once, so a reader of any layout finds each float in one
 * place and reads only the byte ranges it needs.
 *
 * Buffers (non-trainable state such as batch norm's running statistics)
 * are the same on every rank (or kept as rank 0's), so they are not
 * sharded: rank 0 writes them to one file, every buffer's floats unpadded
 * in declaration order (little-endian fp32), which the manifest's
 * "buffers" object describes: {"file", "bytes", "sha256", "numel",
 * "tensors": [{"name", "shape", "dtype", "offset", "numel", "sync"}]},
 * offsets in floats into that file. A model without buffers writes
 * neither the file nor the key, as before buffers existed.
 *
 * Every file's SHA-256 is in the manifest, and the manifest's own:
 * "manifest_sha256" is the SHA-256 of its canonical content (every other
 * field, keys sorted, printed compactly), so that an edit of any field
 * is found. A plain digest stops accidents, not a forger, who can compute
 * it too: a reader also refuses files owned by another uid than those it
 * trusts (hpu_ckpt_owners). Files are written atomically (a temporary
 * name, fsync, rename) inside `.step-N.partial/`, which the saver holds
 * locked (flock) while it writes; a checkpoint's directory is renamed
 * into place only once complete, and only then is `latest` replaced. */
#ifndef HPU_CKPT_H
#define HPU_CKPT_H

#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/fileio.h"

#define HPU_CKPT_FORMAT "hputrain-checkpoint"
#define HPU_CKPT_VERSION 1
#define HPU_CKPT_MANIFEST "manifest.json"
#define HPU_CKPT_LATEST "latest"
#define HPU_CKPT_ROOT_LOCK ".lock" /* hpu__ckpt_root_lock's file in a root */
#define HPU_CKPT_BUFFERS "buffers.bin" /* the name the worker writes */
#define HPU_CKPT_MAX_SECTIONS 3
#define HPU_CKPT_MAX_DIMS 8
#define HPU_CKPT_DIGEST "manifest_sha256" /* the manifest's own digest */
#define HPU_CKPT_MAX_OWNERS 64

/* The uids whose files a reader trusts: a checkpoint's directory, its
 * manifest, shards and buffers file, and the root's `latest` must belong
 * to one of them (lstat: a symbolic link is not followed). n 0: anyone's
 * (no check). */
typedef struct hpu_ckpt_owners {
	int n;
	uid_t uid[HPU_CKPT_MAX_OWNERS];
} hpu_ckpt_owners;

typedef struct hpu_ckpt_seg {
	uint64_t start, count; /* in floats of the canonical space */
} hpu_ckpt_seg;

typedef struct hpu_ckpt_file {
	char name[96];
	uint64_t bytes;        /* the file's size */
	uint64_t elems;        /* floats per section: the segments' counts */
	char sha256[65];       /* lower-case hex */
	hpu_ckpt_seg *seg;
	size_t nseg;
} hpu_ckpt_file;

typedef struct hpu_ckpt_param {
	char name[160];
	int ndim;
	int64_t shape[HPU_CKPT_MAX_DIMS];
	uint64_t offset, numel;
} hpu_ckpt_param;

/* A buffer: numel floats from `offset` (in floats) of the buffers file. */
typedef struct hpu_ckpt_buffer {
	char name[160];
	int ndim;
	int64_t shape[HPU_CKPT_MAX_DIMS];
	uint64_t offset, numel;
	char sync[16];         /* "broadcast", "mean", "local"; "" if not said */
} hpu_ckpt_buffer;

typedef struct hpu_ckpt_index hpu_ckpt_index;

/* An opened checkpoint: the manifest parsed and checked. */
typedef struct hpu_ckpt {
	char dir[4096];
	cJSON *m;              /* the whole manifest (other fields) */
	int world;
	long step;
	char strategy[32], precision[32], optimizer[32];
	hpu_ckpt_param *params;
	int nparams;
	uint64_t numel;
	int nsections;
	char sections[HPU_CKPT_MAX_SECTIONS][32];
	hpu_ckpt_file *files;
	int nfiles;
	hpu_ckpt_index *index; /* every segment, by start */
	size_t nindex;
	/* The buffers, laid end to end in buffer_file (no segments); none
	 * (nbuffers 0, buffer_file.name "") when the manifest has no
	 * "buffers". */
	hpu_ckpt_buffer *buffers;
	int nbuffers;
	uint64_t buffer_numel;
	hpu_ckpt_file buffer_file;
	int *fds;              /* files[i]'s, then buffer_file's: opened on
				* first read, or -1 */
	uint64_t bytes_read;   /* by hpu__ckpt_read() so far */
	uint64_t bytes_verified; /* the caller's count of verified bytes */
	hpu_ckpt_owners owners; /* whose files are trusted (n 0: anyone's) */
	int unsealed;          /* the manifest has no manifest_sha256 */
	int foreign;           /* a failure was a file of an untrusted owner */
} hpu_ckpt;

/* Reads and checks dir/manifest.json (a regular file, not a link): the
 * format and version, the parameters laid end to end, the sections, each
 * file's size against its segments, the segments covering the canonical
 * space exactly once, the buffers (when listed) laid end to end in a file
 * of their size, and last its manifest_sha256 against its content ("was
 * altered after it was written"). Trusts anyone's files (see
 * hpu__ckpt_open_owned). Returns 0, or -1 with a sentence naming the file
 * and what is wrong. */
int hpu__ckpt_open(hpu_ckpt *c, const char *dir, char *err, size_t errlen);

/* hpu__ckpt_open, trusting only the files of *who (NULL: anyone's): the
 * directory and the manifest are checked here, the shards and the buffers
 * file when verified or read. An untrusted owner is an error naming the
 * path, its owner and the uids trusted, and sets c->foreign. A manifest
 * without manifest_sha256 (from before it existed) opens with
 * c->unsealed set: say so (hpu__ckpt_unsealed_note). */
int hpu__ckpt_open_owned(hpu_ckpt *c, const char *dir, const hpu_ckpt_owners *who, char *err,
			 size_t errlen);

/* The warning for an unsealed manifest, as one sentence. */
void hpu__ckpt_unsealed_note(const hpu_ckpt *c, char *buf, size_t n);

/* Whether the file of status st at path belongs to one of *who; -1 with
 * a sentence naming the path, its owner and the uids trusted if not. */
int hpu__ckpt_check_owner(const char *path, const struct stat *st, const hpu_ckpt_owners *who,
			  char *err, size_t errlen);

/* root/latest, when there is one, must be a regular file (not a link) of
 * one of *who. Returns 0, or -1 with a sentence naming it. */
int hpu__ckpt_check_latest(const char *root, const hpu_ckpt_owners *who, char *err,
			   size_t errlen);

/* The SHA-256 (hex, 65 bytes) of manifest m's canonical content: m
 * without manifest_sha256, object keys sorted, printed compactly. -1 when
 * out of memory. */
int hpu__ckpt_manifest_digest(const cJSON *m, char *hex);

/* Seals m (sets its manifest_sha256) and prints it; the text is the
 * caller's to free, NULL when out of memory. */
char *hpu__ckpt_manifest_text(cJSON *m);

void hpu__ckpt_close(hpu_ckpt *c);

/* Section index by name, or -1. */
int hpu__ckpt_section(const hpu_ckpt *c, const char *name);

/* Parameter index by name, or -1. */
int hpu__ckpt_param_find(const hpu_ckpt *c, const char *name);

/* Buffer index by name, or -1. */
int hpu__ckpt_buffer_find(const hpu_ckpt *c, const char *name);

/* Checks file i: present, a regular file (not a link, a FIFO or a
 * device: refused at once, unread), of a trusted owner, its size (before
 * any byte is read), its SHA-256. Returns 0, or -1 with a sentence naming
 * the file ("truncated", "digest mismatch", ...). */
int hpu__ckpt_verify(hpu_ckpt *c, int i, char *err, size_t errlen);

/* The same for the buffers file; 0 when the checkpoint has none. */
int hpu__ckpt_verify_buffers(hpu_ckpt *c, char *err, size_t errlen);

/* Reads canonical floats [start, start + count) of a section into dst,
 * from whichever files hold them (pread of just those bytes; each file
 * opened as hpu__ckpt_verify checks it: regular, not a link, trusted). */
int hpu__ckpt_read(hpu_ckpt *c, int section, uint64_t start, uint64_t count,
		   float *dst, char *err, size_t errlen);

/* Reads floats [start, start + count) of the buffers file into dst (buffer
 * k is [buffers[k].offset, + numel)). */
int hpu__ckpt_read_buffers(hpu_ckpt *c, uint64_t start, uint64_t count, float *dst, char *err,
			   size_t errlen);

/* ---- writing ---- */

/* A file written under a temporary name while its SHA-256 is computed;
 * commit flushes, fsyncs and renames it into place. */
typedef struct hpu_ckpt_writer {
	hpu_outfile out;       /* under its temporary name until commit */
	void *md;              /* EVP_MD_CTX */
	uint64_t bytes;
	unsigned char *buf;
	size_t fill;
} hpu_ckpt_writer;

int hpu__ckpt_writer_open(hpu_ckpt_writer *w, const char *path, char *err,
			  size_t errlen);
int hpu__ckpt_writer_put(hpu_ckpt_writer *w, const void *p, size_t n,
			 char *err, size_t errlen);
/* sha256 gets the hex digest (65 bytes). */
int hpu__ckpt_writer_commit(hpu_ckpt_writer *w, char *sha256, char *err,
			    size_t errlen);
/* Closes and removes the temporary file; safe after commit or a failure. */
void hpu__ckpt_writer_abort(hpu_ckpt_writer *w);

/* Removes a directory and its files (one level, as checkpoints are),
 * its manifest first: a removal cut short leaves no directory that still
 * reads as a checkpoint. */
int hpu__ckpt_rmtree(const char *path);

/* Removes checkpoint directory root/name (step-N): renamed first to the
 * stale partial name `.step-N.partial` (`.step-N.old.partial` where a
 * save of step N works under the first), which the next save or start
 * removes (hpu__ckpt_clean_partials) if this removal is cut short (a
 * signal while pruning); where both renames fail, removed in place. */
int hpu__ckpt_discard(const char *root, const char *name);

/* Locks checkpoint root `root` for this process (flock on root/.lock,
 * which says its pid and host): one job saves there at a time. Returns
 * the descriptor, held open for the run, or -1 with err: "--checkpoint-dir
 * DIR is in use: another running job saves its checkpoints there (its
 * rank 0, pid N on HOST holds DIR/.lock); ..." */
int hpu__ckpt_root_lock(const char *root, char *err, size_t errlen);

/* For a signal handler (async-signal-safe): finishes removing the
 * directory a hpu__ckpt_discard of this process is removing, if any, so
 * that a signal while pruning leaves none of it. */
void hpu__ckpt_discard_finish(void);

/* For a signal handler (async-signal-safe): removes directory dir and the
 * files in it (getdents64, unlinkat, rmdir), not following a link. */
void hpu__ckpt_remove_sigsafe(const char *dir);

/* For a signal handler (async-signal-safe): where a hpu__ckpt_publish of
 * this process has renamed the new checkpoint into place, points
 * `latest` at it and returns 1 (the partial's name is no longer the
 * save's: the caller leaves it, for the next start to remove); else 0. */
int hpu__ckpt_publish_finish(void);

/* Locks partial directory path (flock, exclusive, not waiting) for as
 * long as the returned descriptor is open: a saver holds it while it
 * writes, so that nobody takes its partial for a stale one. -1 with errno
 * set (EWOULDBLOCK: another process holds it). */
int hpu__ckpt_partial_lock(const char *path);

/* Removes the stale partial checkpoints of root: the `.step-N.partial`
 * directories (not links) owned by this process's uid that no live
 * process holds (hpu__ckpt_partial_lock), and the temporary files of a
 * `latest` whose writing was cut short (`latest.tmp.PID`, this uid's,
 * regular, over a minute old: writing one takes milliseconds; PID no
 * live process here). Calls
 * said(path, arg) for each one removed; leaves every other entry alone.
 * Returns how many. */
int hpu__ckpt_clean_partials(const char *root, void (*said)(const char *path, void *arg),
			     void *arg);

/* ---- the checkpoint root ---- */

/* "step-00000040" */
void hpu__ckpt_step_name(long step, char *buf, size_t n);

/* The step of a name "step-N" (digits only), or -1. */
long hpu__ckpt_step_of(const char *name);

/* Whether dir's name (trailing slashes aside) says another step than c's
 * manifest ("step-N", N not c's step: renamed, or a link to another
 * step's directory, which would be ordered, resumed and pruned as the
 * step its name says): -1 with one sentence in err, else 0. Resume and
 * hpu-ckpt both refuse such a directory. */
int hpu__ckpt_check_named_step(const hpu_ckpt *c, const char *dir, char *err, size_t n);
/* "rank-00001-of-00004.bin" */
void hpu__ckpt_shard_name(int rank, int world, char *buf, size_t n);

/* What root/latest says, trimmed ("" when there is no such file). */
void hpu__ckpt_latest(const char *root, char *out, size_t n);

/* The checkpoints under root, newest first: the one `latest` names, then
 * every other step-* directory by step, descending, those of a step past
 * latest's last (a resume from an earlier checkpoint into the same root
 * abandoned them: its run's own are newer). *names is a
 * NULL-terminated array the caller frees with hpu__ckpt_free_names().
 * Returns the count (0 when root has none or does not exist), or -1 with
 * a sentence. */
int hpu__ckpt_candidates(const char *root, char ***names, char *err, size_t errlen);
void hpu__ckpt_free_names(char **names);

/* Publishes a complete checkpoint: renames root/partial to root/name,
 * fsyncs root, points `latest` at it (atomically), then removes the
 * step-* directories beyond the first `keep` in hpu__ckpt_candidates'
 * order (the oldest, and first of all those past the new one's step: an
 * abandoned run's; 0: keep all; never the new one; never one another uid
 * owns). Where `latest` cannot be written, root/name is renamed back to
 * root/partial (a resume would pass it over) and -1 returned.
 * Returns 0, or -1 with a sentence. */
int hpu__ckpt_publish(const char *root, const char *partial, const char *name,
		      int keep, char *err, size_t errlen);

/* What survives a save (--keep-last, --keep-best): the newest `last`
 * checkpoints and the `best` ones by a validation metric. */
typedef struct hpu_ckpt_keep {
	int last;           /* the newest kept, the new one among them (1 or more) */
	int best;           /* the best kept (0: none) */
	int max;            /* larger is better */
	const char *metric; /* the manifest's "validation" key ("val_loss") */
} hpu_ckpt_keep;

/* The checkpoints under root that survive publishing `name` (not yet
 * there), whose metric is `value` (NAN: not validated): *best, the best
 * first (at most k->best), and *last, the newest first (at most
 * k->last; those of a step past name's count as the oldest, an abandoned
 * run's, as in hpu__ckpt_candidates), NULL-terminated lists the caller frees with
 * hpu__ckpt_free_names. Another checkpoint's value is its manifest's
 * validation.<metric>; one without is never among the best; equal
 * values keep the older. Returns 0, or -1 with a sentence. */
int hpu__ckpt_keep_plan(const char *root, const hpu_ckpt_keep *k, const char *name,
			double value, char ***best, char ***last, char *err, size_t errlen);

/* Removes every step-* directory under root that neither list names,
 * never the one `latest` names, one another uid owns, nor through a
 * link. Returns 0, or -1 with a sentence. */
int hpu__ckpt_prune(const char *root, char **best, char **last, char *err, size_t errlen);

/* The manifest's JSON for one file. */
cJSON *hpu__ckpt_file_json(const hpu_ckpt_file *f);

/* The manifest's "buffers" object: file f (name, bytes, sha256) holding
 * buffers v[0 .. n), whose offsets must lie end to end. */
cJSON *hpu__ckpt_buffers_json(const hpu_ckpt_file *f, const hpu_ckpt_buffer *v, int n);

/* A number of a JSON object (a manifest's), or dflt when it is not one. */
double hpu__ckpt_num(const cJSON *o, const char *key, double dflt);

/* SHA-256 of a regular file (a FIFO or a device: -1, EINVAL), as hex
 * (65 bytes); -1 with errno set. */
int hpu__ckpt_sha256_file(const char *path, char *hex, uint64_t *bytes);

#endif
