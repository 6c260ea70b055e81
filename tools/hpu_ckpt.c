/* hpu-ckpt: looks at, checks, exports and reshards the checkpoints that
 * hpu-worker writes (the format is ckpt/ckpt.h).
 *
 *   hpu-ckpt info DIR                      what a checkpoint (or a root) holds
 *   hpu-ckpt verify DIR [--all]            sizes and SHA-256 of every file
 *   hpu-ckpt export DIR -o FILE [--format safetensors|raw]
 *   hpu-ckpt reshard SRC DST --world M [--strategy S]
 *
 * DIR is a checkpoint directory (it has manifest.json) or a checkpoint
 * root (--checkpoint-dir: `latest` and step-* directories), which stands
 * for the checkpoint `latest` names. Exit status: 0 done, 1 failed (damage
 * found, or a file could not be read or written), 2 usage. Floats are
 * copied in chunks of CHUNK floats, so memory stays bounded whatever the
 * checkpoint's size.
 *
 * This file is the command line (main, --help, --help-doc); each command
 * is its own hpu_ckpt_CMD.c, standing on hpu_ckpt_open.c and
 * hpu_ckpt_args.c (hpu_ckpt_impl.h says which calls which). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/opt.h"
#include "common/optdoc.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

static const char *const help_main =
	"usage: hpu-ckpt COMMAND [options]\n"
	"\n"
	"Looks at, checks, exports and reshards hpu-worker checkpoints.\n"
	"DIR is a checkpoint directory (with manifest.json) or a checkpoint root\n"
	"(--checkpoint-dir: `latest` and step-* directories), which stands for\n"
	"the checkpoint `latest` names.\n"
	"\n"
	"commands:\n"
	"  info DIR                     the run, the parameters, the files\n"
	"  verify DIR [--all]           every file's size and SHA-256\n"
	"  export DIR -o FILE [--format safetensors|raw]\n"
	"                               the fp32 weights as one file\n"
	"  reshard SRC DST --world M [--strategy S]\n"
	"                               the same checkpoint as M shards\n"
	"\n"
	"hpu-ckpt COMMAND --help says more. Exit status: 0 done, 1 failed\n"
	"(damage found, or a file could not be read or written), 2 usage.\n";

/* What the command printed must have reached standard output (a full
 * disk, say, would leave it short): rc, or BAD after saying so. */
static int stdout_checked(int rc)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return rc;
	fail("cannot write the standard output: %s", strerror(errno));
	return rc == OK ? BAD : rc;
}

static const struct command {
	const char *name;
	int (*fn)(int, char **);
	const hpu_optspec *specs;
	const char *synopsis; /* the heading of its options in the manual */
} cmds[] = {{"info", hpu__ckt_info, hpu__ckt_info_specs, "hpu-ckpt info DIR"},
	    {"verify", hpu__ckt_verify, hpu__ckt_verify_specs, "hpu-ckpt verify DIR [--all]"},
	    {"export", hpu__ckt_export, hpu__ckt_export_specs, "hpu-ckpt export DIR -o FILE [--format safetensors|raw]"},
	    {"reshard", hpu__ckt_reshard, hpu__ckt_reshard_specs, "hpu-ckpt reshard SRC DST --world M [--strategy S]"}};
#define NCMDS (sizeof cmds / sizeof cmds[0])

/* hpu-ckpt --help-doc FORMAT: every command's options, under its
 * synopsis (man/hpu-ckpt.1, docs/reference/hpu-ckpt.md). */
static int help_doc(const char *format)
{
	int how = hpu__optdoc_format(format);
	if (how < 0)
		return usage_error(NULL, "--help-doc takes help, scdoc or markdown, not '%s'",
				   format ? format : "");
	for (size_t i = 0; i < NCMDS; i++) {
		hpu__optdoc_heading(stdout, cmds[i].synopsis, how);
		hpu__optdoc(stdout, cmds[i].specs, how, 21);
	}
	return OK;
}

int main(int argc, char **argv)
{
	if (hpu__tool_start("hpu-ckpt") < 0)
		return HPU_TOOL_USAGE;
	if (argc < 2)
		return usage_error(NULL, "which command? (info, verify, export, reshard)");
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		fputs(help_main, stdout);
		return stdout_checked(OK);
	}
	if (!strcmp(argv[1], "--help-doc"))
		return stdout_checked(help_doc(argc > 2 ? argv[2] : NULL));
	for (size_t i = 0; i < NCMDS; i++)
		if (!strcmp(argv[1], cmds[i].name))
			return stdout_checked(cmds[i].fn(argc - 1, argv + 1));
	return usage_error(NULL, "unknown command '%s' (info, verify, export, reshard)", argv[1]);
}
