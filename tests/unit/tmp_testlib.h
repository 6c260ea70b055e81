/* tmp_testlib: a scratch directory for a unit test program
 * (test_data, test_fileio), /tmp/PROGRAM.XXXXXX, made before its tests
 * and removed after them. */
#ifndef HPU_TMP_TESTLIB_H
#define HPU_TMP_TESTLIB_H

/* The directory's name, once tmp_setup has made it. */
extern char tmp_dir[64];

/* tmp_dir/name, in one of four rotating static buffers (so up to four
 * can be used in one call). */
const char *tmp_at(const char *name);

/* cmocka group setup and teardown: make /tmp/PROGRAM.XXXXXX (PROGRAM
 * the running program's name) into tmp_dir; remove it with all it holds. */
int tmp_setup(void **state);
int tmp_teardown(void **state);

#endif
