/* hpu-ckpt's arguments: each command's options parsed by its table
 * (hpu_ckpt_impl.h). Calls nothing of the other hpu_ckpt_*.c. */
#include <assert.h>
#include <stdio.h>

#include "common/opt.h"
#include "common/optdoc.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

/* Splits argv[1..] (argv[0] the command) into options, whose values go to
 * vals[id - OPT_VAL], and at most maxpos positional arguments. Returns -1
 * when parsed, OK after printing help, or USAGE after saying what is
 * wrong. */
int hpu__ckt_parse_args(const char *cmd, const char *help, int argc, char **argv,
			const hpu_optspec *specs, const char **vals, const char **pos, int maxpos,
			int *npos)
{
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	*npos = 0;
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		if (r == OPT_HELP) {
			fputs(help, stdout);
			fputs("\noptions:\n", stdout);
			hpu__optdoc(stdout, specs, HPU_DOC_HELP, 21);
			return OK;
		} else if (r == OPT_LOG_LEVEL) {
			if (hpu__tool_log_level(p.val))
				return USAGE;
		} else if (r == HPU_OPT_POSITIONAL) {
			if (*npos == maxpos)
				return usage_error(cmd, "unexpected argument '%s'", p.val);
			pos[(*npos)++] = p.val;
		} else if (r == HPU_OPT_MISSING) {
			return usage_error(cmd, "--%s needs a value", p.spec->name);
		} else if (r == HPU_OPT_UNWANTED && p.spec->id != OPT_HELP) {
			return usage_error(cmd, "--%s takes no value", p.spec->name);
		} else if (r < 0) {
			return usage_error(cmd, "unknown option '%s'", p.arg);
		} else {
			assert(r - OPT_VAL < MAX_OPTS);
			vals[r - OPT_VAL] = p.spec->value == HPU_OPT_FLAG ? "1" : p.val;
		}
	}
	return -1;
}
