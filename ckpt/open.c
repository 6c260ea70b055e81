/* open: opening a checkpoint: whose its files are, the manifest read,
 * checked (manifest_fields.c, manifest_tensors.c) and its own digest
 * compared; closing it. */
#include "ckpt/ckpt_impl.h"
#include "common/hex.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options/config.h" /* the options' kinds and limits */

/* ---- whose files, and the manifest's own digest ---- */

/* "0", "0 or 1001", "0, 1001 or 1002" */
static void uid_list(const hpu_ckpt_owners *who, char *buf, size_t n)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < who->n && at < n; i++)
		at += (size_t)snprintf(buf + at, n - at, "%s%u",
				       !i ? "" : i + 1 == who->n ? " or " : ", ",
				       (unsigned)who->uid[i]);
}

int hpu__ckpt_check_owner(const char *path, const struct stat *st, const hpu_ckpt_owners *who,
			  char *err, size_t errlen)
{
	if (!who || who->n <= 0)
		return 0;
	for (int i = 0; i < who->n; i++)
		if (st->st_uid == who->uid[i])
			return 0;
	char list[HPU_CKPT_MAX_OWNERS * 12];
	uid_list(who, list, sizeof list);
	return say(err, errlen,
		   "%s is owned by uid %u, not by uid %s: refusing it (another user's file in a "
		   "checkpoint directory others may write? give the checkpoint root the sticky bit, "
		   "chmod +t)",
		   path, (unsigned)st->st_uid, list);
}

/* Why path could not be opened as a checkpoint's file: a symbolic link
 * (O_NOFOLLOW's ELOOP) said as one, else why. */
static int open_failed(const char *what, const char *path, const char *why, char *err,
		       size_t errlen)
{
	struct stat st;
	if (errno == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
		return say(err, errlen,
			   "%s%s is a symbolic link (not followed: a checkpoint's files are regular "
			   "files)",
			   what, path);
	return say(err, errlen, "%s%s: %s", what, path, why);
}

/* A checkpoint's file opened for reading: a regular file, not through a
 * symbolic link, of a trusted owner (a FIFO or a device is refused
 * unopened for reading, so nothing waits). Its descriptor, its status in
 * *st; -1 with a sentence ("checkpoint shard PATH: ..."). */
int hpu__ckpt_open_data(hpu_ckpt *c, const char *what, const char *path, struct stat *st, char *err,
			size_t errlen)
{
	const char *why = NULL;
	int fd = hpu__open_input_fd(path, O_NOFOLLOW, st, &why);
	if (fd < 0)
		return open_failed(what, path, why, err, errlen);
	if (hpu__ckpt_check_owner(path, st, &c->owners, err, errlen) < 0) {
		c->foreign = 1;
		close(fd);
		return -1;
	}
	return fd;
}

/* The checkpoint's directory: of a trusted owner, and so is a symbolic
 * link that leads to it (lstat first). A directory that is not there is
 * left to the manifest's reading to say. */
static int check_dir(hpu_ckpt *c, char *err, size_t errlen)
{
	struct stat st;
	if (c->owners.n <= 0 || lstat(c->dir, &st) < 0)
		return 0;
	if (S_ISLNK(st.st_mode) &&
	    (hpu__ckpt_check_owner(c->dir, &st, &c->owners, err, errlen) < 0 || stat(c->dir, &st) < 0))
		return c->foreign = 1, -1;
	if (hpu__ckpt_check_owner(c->dir, &st, &c->owners, err, errlen) < 0)
		return c->foreign = 1, -1;
	return 0;
}

int hpu__ckpt_check_latest(const char *root, const hpu_ckpt_owners *who, char *err,
			   size_t errlen)
{
	char path[4200];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", root, HPU_CKPT_LATEST);
	if (!who || who->n <= 0 || lstat(path, &st) < 0)
		return 0;
	if (S_ISLNK(st.st_mode))
		return say(err, errlen,
			   "%s is a symbolic link (not followed: `latest` is a regular file): "
			   "refusing it",
			   path);
	if (!S_ISREG(st.st_mode))
		return say(err, errlen, "%s is not a regular file: refusing it", path);
	return hpu__ckpt_check_owner(path, &st, who, err, errlen);
}

/* Sorts the keys of every object under o (in place), keeping the order
 * of repeated keys: the canonical form the digest is over. -1 when out
 * of memory. */
static int canon(cJSON *o)
{
	if (!cJSON_IsObject(o) && !cJSON_IsArray(o))
		return 0;
	int n = cJSON_GetArraySize(o), i = 0;
	if (n == 0)
		return 0;
	cJSON **v = malloc((size_t)n * sizeof *v), *x;
	if (!v)
		return -1;
	for (x = o->child; x; x = x->next)
		v[i++] = x;
	for (i = 0; i < n; i++)
		if (canon(v[i]) < 0) {
			free(v);
			return -1;
		}
	if (cJSON_IsObject(o)) {
		/* equal keys keep their order: a merge by key, stable */
		for (i = 1; i < n; i++) {
			cJSON *k = v[i];
			int j = i;
			while (j > 0 && strcmp(v[j - 1]->string, k->string) > 0) {
				v[j] = v[j - 1];
				j--;
			}
			v[j] = k;
		}
		for (i = 0; i < n; i++)
			cJSON_DetachItemViaPointer(o, v[i]);
		for (i = 0; i < n; i++)
			cJSON_AddItemToArray(o, v[i]);
	}
	free(v);
	return 0;
}

int hpu__ckpt_manifest_digest(const cJSON *m, char *hex)
{
	cJSON *d = cJSON_Duplicate(m, 1);
	if (!d)
		return -1;
	cJSON_DeleteItemFromObjectCaseSensitive(d, HPU_CKPT_DIGEST);
	char *text = canon(d) < 0 ? NULL : cJSON_PrintUnformatted(d);
	cJSON_Delete(d);
	if (!text)
		return -1;
	unsigned char md[32];
	unsigned int ml = 0;
	int rc = EVP_Digest(text, strlen(text), md, &ml, EVP_sha256(), NULL) == 1 ? 0 : -1;
	free(text);
	if (rc == 0)
		hpu__hex(hex, md, sizeof md);
	return rc;
}

char *hpu__ckpt_manifest_text(cJSON *m)
{
	char hex[65];
	if (hpu__ckpt_manifest_digest(m, hex) < 0)
		return NULL;
	cJSON *s = cJSON_CreateString(hex);
	if (!s)
		return NULL;
	if (cJSON_GetObjectItemCaseSensitive(m, HPU_CKPT_DIGEST))
		cJSON_ReplaceItemInObjectCaseSensitive(m, HPU_CKPT_DIGEST, s);
	else
		cJSON_AddItemToObject(m, HPU_CKPT_DIGEST, s);
	return cJSON_Print(m);
}

/* The manifest's digest against its content: an edit since it was
 * written is an error; none at all (a manifest from before) is noted. */
static int check_sealed(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, HPU_CKPT_DIGEST);
	char hex[65];
	if (!j) {
		c->unsealed = 1;
		return 0;
	}
	if (!cJSON_IsString(j) || strlen(j->valuestring) != 64)
		return say(err, errlen, "%s: %s is not a SHA-256 (64 hex digits)", mpath,
			   HPU_CKPT_DIGEST);
	if (hpu__ckpt_manifest_digest(c->m, hex) < 0)
		return say(err, errlen, "out of memory");
	if (strcmp(hex, j->valuestring) != 0)
		return say(err, errlen,
			   "%s was altered after it was written: its content's SHA-256 is %s, its "
			   "%s says %s",
			   mpath, hex, HPU_CKPT_DIGEST, j->valuestring);
	return 0;
}

void hpu__ckpt_unsealed_note(const hpu_ckpt *c, char *buf, size_t n)
{
	snprintf(buf, n,
		 "%s/%s has no %s (written before hputrain sealed its manifests?): an edit of it "
		 "cannot be detected",
		 c->dir, HPU_CKPT_MANIFEST, HPU_CKPT_DIGEST);
}

/* The manifest's text, read from a regular file of a trusted owner. */
static int read_manifest(hpu_ckpt *c, const char *mpath, char **text, size_t *len, char *err,
			 size_t errlen)
{
	struct stat st;
	int fd = hpu__ckpt_open_data(c, "cannot read the checkpoint manifest ", mpath, &st, err, errlen);
	if (fd < 0)
		return -1;
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return say(err, errlen, "out of memory");
	}
	const char *why = hpu__read_stream(f, 1, text, len);
	fclose(f);
	if (why)
		return say(err, errlen, "cannot read the checkpoint manifest %s: %s", mpath, why);
	return 0;
}

int hpu__ckpt_open(hpu_ckpt *c, const char *dir, char *err, size_t errlen)
{
	return hpu__ckpt_open_owned(c, dir, NULL, err, errlen);
}

int hpu__ckpt_open_owned(hpu_ckpt *c, const char *dir, const hpu_ckpt_owners *who, char *err,
			 size_t errlen)
{
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "%s", dir);
	if (who)
		c->owners = *who;
	char mpath[4200], *text = NULL;
	size_t len;
	snprintf(mpath, sizeof mpath, "%s/%s", dir, HPU_CKPT_MANIFEST);
	if (check_dir(c, err, errlen) < 0 || read_manifest(c, mpath, &text, &len, err, errlen) < 0)
		return -1;
	c->m = cJSON_ParseWithLength(text, len);
	free(text);
	if (!cJSON_IsObject(c->m))
		return say(err, errlen, "%s is not a JSON object (damaged?)", mpath);
	char fmt[64] = "";
	double ver = 0, world = 0, step = 0;
	if (hpu__ckpt_get_str(c->m, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, HPU_CKPT_FORMAT) != 0)
		return say(err, errlen, "%s: not a hputrain checkpoint manifest (\"format\")", mpath);
	if (hpu__ckpt_get_num(c->m, "version", &ver) < 0 || ver != HPU_CKPT_VERSION)
		return say(err, errlen, "%s: format version %g; this build reads version %d", mpath,
			   ver, HPU_CKPT_VERSION);
	if (hpu__ckpt_check_num(c->m, mpath, "world_size", REQUIRED, WHOLE, 1, MAX_WORLD, &world,
				err, errlen) < 0 ||
	    hpu__ckpt_check_num(c->m, mpath, "step", REQUIRED, WHOLE, 0, MAX_STEPS, &step, err,
				errlen) < 0 ||
	    hpu__ckpt_check_name(c->m, mpath, "strategy", REQUIRED, hpu__ckpt_strategy_at,
				 HPU_STRATEGY_ZERO3 + 1, c->strategy, sizeof c->strategy, err,
				 errlen) < 0 ||
	    hpu__ckpt_check_name(c->m, mpath, "precision", REQUIRED, hpu__ckpt_precision_at,
				 HPU_PREC_FP8 + 1, c->precision, sizeof c->precision, err,
				 errlen) < 0 ||
	    hpu__ckpt_check_name(c->m, mpath, "optimizer", REQUIRED, hpu__ckpt_optimizer_at,
				 HPU_OPTIM_ADAM + 1, c->optimizer, sizeof c->optimizer, err,
				 errlen) < 0 ||
	    hpu__ckpt_check_run(c->m, mpath, err, errlen) < 0)
		return -1;
	c->world = (int)world;
	c->step = (long)step;
	if (hpu__ckpt_parse_params(c, mpath, err, errlen) < 0 ||
	    hpu__ckpt_parse_sections(c, mpath, err, errlen) < 0)
		return -1;
	const cJSON *files = cJSON_GetObjectItemCaseSensitive(c->m, "files"), *f;
	int n = cJSON_IsArray(files) ? cJSON_GetArraySize(files) : 0;
	if (n < 1)
		return say(err, errlen, "%s: no \"files\"", mpath);
	if (n != c->world)
		return say(err, errlen, "%s: world_size %d, but %d files listed (one per rank)", mpath,
			   c->world, n);
	if (!(c->files = calloc((size_t)n, sizeof *c->files)) ||
	    !(c->fds = malloc((size_t)(n + 1) * sizeof *c->fds)))
		return say(err, errlen, "out of memory");
	for (int i = 0; i <= n; i++)
		c->fds[i] = -1;
	c->nfiles = n;
	int i = 0;
	cJSON_ArrayForEach(f, files) {
		if (hpu__ckpt_parse_file(&c->files[i++], f, c->nsections, mpath, err, errlen) < 0)
			return -1;
	}
	if (hpu__ckpt_build_index(c, mpath, err, errlen) < 0 ||
	    hpu__ckpt_parse_buffers(c, mpath, err, errlen) < 0)
		return -1;
	return check_sealed(c, mpath, err, errlen);
}

void hpu__ckpt_close(hpu_ckpt *c)
{
	for (int i = 0; i < c->nfiles; i++) {
		free(c->files[i].seg);
		if (c->fds && c->fds[i] >= 0)
			close(c->fds[i]);
	}
	if (c->fds && c->fds[c->nfiles] >= 0)
		close(c->fds[c->nfiles]);
	free(c->files);
	free(c->fds);
	free(c->params);
	free(c->buffers);
	free(c->index);
	cJSON_Delete(c->m);
	memset(c, 0, sizeof *c);
}
