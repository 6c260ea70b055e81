/* hpu-ckpt verify: every file's size and SHA-256. */
#include <stdio.h>

#include "ckpt/ckpt.h"
#include "common/opt.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

static const char *const help_verify =
	"usage: hpu-ckpt verify DIR [--all]\n"
	"\n"
	"Checks the manifest against its own digest (manifest_sha256: an edit\n"
	"is found), then every file of the checkpoint (the shards and, when the\n"
	"model has buffers, the buffers file) against it: present, a regular\n"
	"file (a FIFO, a device or a link is refused unread), yours (run as\n"
	"root: DIR's owner's), the size, the SHA-256; a step-N directory whose\n"
	"manifest holds another step is damaged. One line per file, then a\n"
	"total. For a root, checks that `latest` is yours and the checkpoint it\n"
	"names; with --all, every checkpoint under it. Exits 1 if any file (or\n"
	"manifest) is damaged, missing or another user's.\n";

const hpu_optspec hpu__ckt_verify_specs[] = {
	{"all", 0, HPU_OPT_FLAG, OPT_VAL, NULL,
	 .help = "for a checkpoint root, verify every checkpoint under it, not only the one `latest` names"},
	COMMON_OPTS, {0}};

/* Verifies the checkpoint at dir, printing; BAD if anything is wrong. */
static int verify_one(const char *dir)
{
	hpu_ckpt c;
	char err[1024];
	if (hpu__ckpt_open_owned(&c, dir, &hpu__ckt_trust, err, sizeof err) < 0) {
		printf("%s: DAMAGED: %s\n", dir, err);
		hpu__ckpt_close(&c);
		return BAD;
	}
	if (hpu__ckpt_check_named_step(&c, dir, err, sizeof err) < 0) {
		printf("%s: DAMAGED: %s\n", dir, err);
		hpu__ckpt_close(&c);
		return BAD;
	}
	if (c.unsealed) {
		char note[4400];
		hpu__ckpt_unsealed_note(&c, note, sizeof note);
		printf("%s: warning: %s\n", dir, note);
	}
	int bad = hpu__ckt_verify_files(&c, 1, NULL, 0);
	hpu__ckpt_close(&c);
	return bad ? BAD : OK;
}

int hpu__ckt_verify(int argc, char **argv)
{
	const char *pos[1];
	const char *vals[MAX_OPTS] = {0};
	int npos;
	int rc = hpu__ckt_parse_args("verify", help_verify, argc, argv, hpu__ckt_verify_specs, vals, pos, 1, &npos);
	if (rc >= 0)
		return rc;
	int all = vals[0] != NULL;
	if (npos != 1)
		return usage_error("verify", "which checkpoint? (hpu-ckpt verify DIR)");
	hpu__ckt_trust_for(pos[0]);
	if (hpu__ckt_has_manifest(pos[0])) {
		if (all)
			hpu__tool_note("%s is one checkpoint; --all is for a root", pos[0]);
		return verify_one(pos[0]);
	}
	root r;
	char err[1024];
	if ((rc = hpu__ckt_root_open(&r, pos[0])) != OK)
		return rc;
	/* `latest` of another uid: reported, and not followed */
	int bad = hpu__ckpt_check_latest(pos[0], &hpu__ckt_trust, err, sizeof err) < 0;
	if (bad)
		printf("BAD  %s\n", err);
	if (!all) {
		char dir[4400];
		if (bad)
			rc = BAD;
		else if ((rc = hpu__ckt_root_pick(&r, pos[0])) == OK) {
			snprintf(dir, sizeof dir, "%s/%s", pos[0], r.names[0]);
			rc = verify_one(dir);
		}
		hpu__ckt_root_close(&r);
		return rc;
	}
	for (int i = 0; i < r.n; i++) {
		char dir[4400];
		snprintf(dir, sizeof dir, "%s/%s", pos[0], r.names[i]);
		bad += verify_one(dir) != OK;
	}
	if (r.latest[0] && !r.latest_ok) {
		printf("%s/%s names \"%s\", which is not there\n", pos[0], HPU_CKPT_LATEST,
		       r.latest);
		bad++;
	}
	printf("%s: %d checkpoint%s, %s\n", pos[0], r.n, r.n == 1 ? "" : "s",
	       bad ? "DAMAGE FOUND" : "all intact");
	hpu__ckt_root_close(&r);
	return bad ? BAD : OK;
}
