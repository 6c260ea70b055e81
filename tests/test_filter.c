/* The test programs' filter: HPU_TEST_FILTER=PATTERN (cmocka's
 * wildcards, e.g. "test_relu*") runs only the tests of each group whose
 * names match, in every program hpu_unit_test makes (tests/CMakeLists.txt
 * links this file into each). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

__attribute__((constructor)) static void hpu_test_filter(void)
{
	const char *f = getenv("HPU_TEST_FILTER");
	if (f && *f)
		cmocka_set_test_filter(f);
}
