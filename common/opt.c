/* opt: see opt.h. */
#include "common/opt.h"

#include <stddef.h>
#include <string.h>

void hpu__optparse_init(hpu_optparse *p, int argc, char *const *argv, const hpu_optspec *specs)
{
	*p = (hpu_optparse){.argc = argc, .argv = argv, .specs = specs, .ind = 1};
}

static int is_end(const hpu_optspec *s)
{
	return !s->name && !s->short_name;
}

/* The long option of name[0..len), or the short one (len 0), in table t. */
static const hpu_optspec *find_in(const hpu_optspec *t, const char *name, size_t len, char c)
{
	for (; t && !is_end(t); t++)
		if (len ? t->name && strlen(t->name) == len && !memcmp(t->name, name, len)
			: t->short_name && t->short_name == c)
			return t;
	return NULL;
}

static const hpu_optspec *find(const hpu_optparse *p, const char *name, size_t len, char c)
{
	const hpu_optspec *s = find_in(p->specs, name, len, c);
	return s ? s : find_in(p->more, name, len, c);
}

/* argv[at] is an option, "-x" or "--name[=value]": looks it up and takes
 * its value. */
static int option(hpu_optparse *p)
{
	const char *a = p->arg, *eq = NULL;
	if (a[1] == '-') {
		eq = strchr(a + 2, '=');
		size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
		p->spec = len ? find(p, a + 2, len, 0) : NULL;
	} else {
		p->spec = a[2] ? NULL : find(p, NULL, 0, a[1]);
	}
	if (!p->spec)
		return HPU_OPT_UNKNOWN;
	if (eq) {
		p->val = eq + 1;
		return p->spec->value == HPU_OPT_FLAG ? HPU_OPT_UNWANTED : p->spec->id;
	}
	if (p->spec->value != HPU_OPT_VALUE)
		return p->spec->id;
	if (p->ind >= p->argc)
		return HPU_OPT_MISSING;
	p->val = p->argv[p->ind++];
	return p->spec->id;
}

int hpu__optparse_next(hpu_optparse *p)
{
	p->spec = NULL;
	p->val = NULL;
	p->at = p->ind;
	if (p->ind >= p->argc) {
		p->arg = NULL;
		return HPU_OPT_END;
	}
	p->arg = p->argv[p->ind++];
	if (!p->rest && !strcmp(p->arg, "--")) {
		p->rest = 1;
		return hpu__optparse_next(p);
	}
	if (p->rest || p->arg[0] != '-' || !p->arg[1]) {
		p->val = p->arg;
		return HPU_OPT_POSITIONAL;
	}
	return option(p);
}
