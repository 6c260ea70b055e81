/* tmp_testlib: see tmp_testlib.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/unit/tmp_testlib.h"

char tmp_dir[64];

const char *tmp_at(const char *name)
{
	static char p[4][128];
	static int k;
	char *s = p[k++ & 3];
	snprintf(s, sizeof p[0], "%s/%s", tmp_dir, name);
	return s;
}

int tmp_setup(void **state)
{
	(void)state;
	snprintf(tmp_dir, sizeof tmp_dir, "/tmp/%s.XXXXXX", program_invocation_short_name);
	return mkdtemp(tmp_dir) ? 0 : -1;
}

int tmp_teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
	return system(cmd);
}
