/* hpu-ckpt: finding the checkpoint a DIR stands for (a checkpoint or a
 * root), opening it for the user it trusts, verifying its files and
 * copying its floats; what every command stands on. Calls nothing of the
 * other hpu_ckpt_*.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "common/num.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

/* ---- finding the checkpoint ---- */

int hpu__ckt_has_manifest(const char *dir)
{
	char p[4200];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, HPU_CKPT_MANIFEST);
	return stat(p, &st) == 0;
}

/* Reads root `path`; BAD (said) when it is neither a checkpoint root nor
 * has any checkpoint. */
int hpu__ckt_root_open(root *r, const char *path)
{
	char err[512];
	struct stat st;
	memset(r, 0, sizeof *r);
	if (stat(path, &st) < 0)
		return fail("%s: %s", path, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return fail("%s is not a directory (a checkpoint is one)", path);
	if ((r->n = hpu__ckpt_candidates(path, &r->names, err, sizeof err)) < 0)
		return fail("%s", err);
	if (r->n == 0) {
		hpu__ckpt_free_names(r->names);
		r->names = NULL;
		return fail("%s is neither a checkpoint (no %s) nor a checkpoint root (no step-* "
			    "directories)",
			    path, HPU_CKPT_MANIFEST);
	}
	hpu__ckpt_latest(path, r->latest, sizeof r->latest);
	r->latest_ok = r->latest[0] && !strcmp(r->latest, r->names[0]);
	/* there but blank: said as empty, not as missing */
	char lp[4200], buf[64];
	snprintf(lp, sizeof lp, "%s/%s", path, HPU_CKPT_LATEST);
	int fd = r->latest[0] ? -1 : open(lp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (off_t)sizeof buf) {
		ssize_t n = read(fd, buf, sizeof buf);
		r->latest_empty = n >= 0;
		for (ssize_t i = 0; i < n; i++)
			r->latest_empty &= buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' ||
					   buf[i] == '\r';
	}
	if (fd >= 0)
		close(fd);
	return OK;
}

void hpu__ckt_root_close(root *r)
{
	hpu__ckpt_free_names(r->names);
	r->names = NULL;
}

/* Says (on stderr) which checkpoint of a root stands for it, when `latest`
 * does not name it; BAD when `latest` names one that is not there. */
int hpu__ckt_root_pick(const root *r, const char *path)
{
	if (r->latest_ok)
		return OK;
	if (r->latest[0])
		return fail("%s/%s names \"%s\", which is not a checkpoint there (newest present: "
			    "%s); name the checkpoint directory itself",
			    path, HPU_CKPT_LATEST, r->latest, r->names[0]);
	hpu__tool_note(r->latest_empty ? "%s: `%s` is empty; using the newest, %s"
				       : "%s has no `%s` file; using the newest, %s",
		       path, HPU_CKPT_LATEST, r->names[0]);
	return OK;
}

/* The checkpoint directory `arg` stands for, into dir[n]: arg itself, or
 * the latest checkpoint of the root arg. */
static int resolve(const char *arg, char *dir, size_t n)
{
	if (hpu__ckt_has_manifest(arg)) {
		snprintf(dir, n, "%s", arg);
		return OK;
	}
	root r;
	int rc = hpu__ckt_root_open(&r, arg);
	if (rc == OK && (rc = hpu__ckt_root_pick(&r, arg)) == OK)
		snprintf(dir, n, "%s/%s", arg, r.names[0]);
	hpu__ckt_root_close(&r);
	return rc;
}

/* Whose files verify, export and reshard trust (info: anyone's): the
 * user's who runs hpu-ckpt, as a job trusts its own uid's; run as root,
 * the owner of the DIR named (an administrator's look at a user's
 * checkpoints). n 0 until hpu__ckt_trust_for(). */
hpu_ckpt_owners hpu__ckt_trust;

void hpu__ckt_trust_for(const char *arg)
{
	struct stat st;
	hpu__ckt_trust.n = 1;
	hpu__ckt_trust.uid[0] = geteuid();
	if (hpu__ckt_trust.uid[0] == 0 && stat(arg, &st) == 0)
		hpu__ckt_trust.uid[0] = st.st_uid;
}

/* The warning for a manifest without its digest, on stderr. */
static void note_unsealed(const hpu_ckpt *c)
{
	char note[4400];
	if (!c->unsealed)
		return;
	hpu__ckpt_unsealed_note(c, note, sizeof note);
	hpu__tool_warn("%s", note);
}

/* Opens the checkpoint at dir; BAD (said) if its manifest is unusable. */
int hpu__ckt_open(hpu_ckpt *c, const char *dir)
{
	char err[1024];
	if (hpu__ckpt_open_owned(c, dir, &hpu__ckt_trust, err, sizeof err) < 0) {
		hpu__ckpt_close(c);
		return fail("%s", err);
	}
	return OK;
}

/* The shards and the buffers file. */
uint64_t hpu__ckt_total_bytes(const hpu_ckpt *c)
{
	uint64_t b = c->nbuffers ? c->buffer_file.bytes : 0;
	for (int i = 0; i < c->nfiles; i++)
		b += c->files[i].bytes;
	return b;
}

int hpu__ckt_total_files(const hpu_ckpt *c)
{
	return c->nfiles + (c->nbuffers > 0);
}

/* Every file checked; with `print`, one line each and a total. Returns
 * how many are bad; the first failure's sentence in first[]. */
int hpu__ckt_verify_files(hpu_ckpt *c, int print, char *first, size_t firstlen)
{
	int bad = 0, n = hpu__ckt_total_files(c);
	uint64_t ok_bytes = 0;
	char err[1024];
	if (print)
		printf("%s: %d file%s, %llu bytes\n", c->dir, n, hpu__plural(n),
		       (unsigned long long)hpu__ckt_total_bytes(c));
	/* i == nfiles: the buffers file */
	for (int i = 0; i < n; i++) {
		const hpu_ckpt_file *f = i < c->nfiles ? &c->files[i] : &c->buffer_file;
		if ((i < c->nfiles ? hpu__ckpt_verify(c, i, err, sizeof err)
				   : hpu__ckpt_verify_buffers(c, err, sizeof err)) < 0) {
			if (!bad++ && first)
				snprintf(first, firstlen, "%s", err);
			if (print)
				printf("  BAD  %s\n", err);
		} else {
			ok_bytes += f->bytes;
			if (print)
				printf("  ok   %s (%llu bytes, sha256 %.16s...)\n", f->name,
				       (unsigned long long)f->bytes, f->sha256);
		}
	}
	if (print) {
		if (bad)
			printf("%s: DAMAGED: %d of %d file%s bad\n", c->dir, bad, n, hpu__plural(n));
		else
			printf("%s: ok: %d file%s, %llu bytes verified\n", c->dir, n, hpu__plural(n),
			       (unsigned long long)ok_bytes);
	}
	return bad;
}

const char *hpu__ckt_str(const cJSON *o, const char *key, const char *dflt)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(j) ? j->valuestring : dflt;
}

/* ---- copying floats ---- */

/* Canonical floats [start, start + count) of section s into w, CHUNK at
 * a time through buf. */
int hpu__ckt_copy_range(hpu_ckpt *c, int s, uint64_t start, uint64_t count, float *buf,
			hpu_ckpt_writer *w, char *err, size_t errlen)
{
	while (count) {
		uint64_t n = count < CHUNK ? count : CHUNK;
		if (hpu__ckpt_read(c, s, start, n, buf, err, errlen) < 0 ||
		    hpu__ckpt_writer_put(w, buf, (size_t)n * 4, err, errlen) < 0)
			return -1;
		start += n;
		count -= n;
	}
	return 0;
}

/* Floats [start, start + count) of the buffers file into w, CHUNK at a
 * time through buf. */
int hpu__ckt_copy_buffers(hpu_ckpt *c, uint64_t start, uint64_t count, float *buf,
			  hpu_ckpt_writer *w, char *err, size_t errlen)
{
	while (count) {
		uint64_t n = count < CHUNK ? count : CHUNK;
		if (hpu__ckpt_read_buffers(c, start, n, buf, err, errlen) < 0 ||
		    hpu__ckpt_writer_put(w, buf, (size_t)n * 4, err, errlen) < 0)
			return -1;
		start += n;
		count -= n;
	}
	return 0;
}

/* Opens the checkpoint DIR stands for and checks every file's digest;
 * `what` is said when refusing a damaged one. */
int hpu__ckt_open_verified(hpu_ckpt *c, const char *arg, const char *what)
{
	char dir[4400], first[1024];
	hpu__ckt_trust_for(arg);
	int rc = resolve(arg, dir, sizeof dir);
	if (rc == OK && !hpu__ckt_has_manifest(arg) && hpu__ckpt_check_latest(arg, &hpu__ckt_trust, first, sizeof first) < 0)
		rc = fail("%s (refusing to %s it)", first, what);
	if (rc == OK)
		rc = hpu__ckt_open(c, dir);
	if (rc != OK)
		return rc;
	note_unsealed(c);
	/* a step-N directory holding another step's checkpoint: verify's
	 * DAMAGED, and what resume refuses */
	if (hpu__ckpt_check_named_step(c, dir, first, sizeof first) < 0) {
		rc = fail("%s (refusing to %s it)", first, what);
		hpu__ckpt_close(c);
	} else if (hpu__ckt_verify_files(c, 0, first, sizeof first)) {
		rc = fail("%s (refusing to %s a damaged checkpoint; hpu-ckpt verify %s lists every "
			  "file)",
			  first, what, c->dir);
		hpu__ckpt_close(c);
	}
	return rc;
}
