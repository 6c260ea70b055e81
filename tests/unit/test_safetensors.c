/* Unit tests for ckpt/safetensors.c:
 * - a header written for two tensors parses back to the same names,
 *   shapes, F32 and back-to-back offsets, padded to 8 bytes;
 * - duplicate and reserved names are refused naming them;
 * - a header from elsewhere (metadata, F16, its own order) parses; a bad
 *   length, non-JSON, an unknown dtype, offsets that disagree with the
 *   shape, overlap or run past the end are each refused with a sentence;
 * - a short read asks for the bytes it needs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"

static void test_roundtrip(void **state)
{
	(void)state;
	const char *names[] = {"fc1.weight", "fc1.bias"};
	int ndims[] = {2, 1};
	int64_t s0[] = {3, 2}, s1[] = {3};
	const int64_t *shapes[] = {s0, s1};
	const char *meta[] = {"format", "pt", NULL};
	char err[256];
	size_t len;
	char *h = hpu__st_header(2, names, ndims, shapes, NULL, meta, &len, err, sizeof err);
	assert_non_null(h);
	assert_int_equal(len % 8, 0);
	assert_true(hpu__st_sniff((unsigned char *)h, len + 36));
	hpu_st_tensor *t;
	uint64_t at;
	size_t need;
	assert_int_equal(hpu__st_parse(h, len, len + 36, &t, &at, &need, err, sizeof err), 2);
	assert_int_equal(at, len);
	assert_string_equal(t[0].name, "fc1.weight");
	assert_string_equal(t[0].dtype, "F32");
	assert_int_equal(t[0].ndim, 2);
	assert_int_equal(t[0].shape[1], 2);
	assert_int_equal(t[0].begin, 0);
	assert_int_equal(t[0].end, 24);
	assert_string_equal(t[1].name, "fc1.bias");
	assert_int_equal(t[1].begin, 24);
	assert_int_equal(t[1].end, 36);
	free(t);
	/* short: asks for the whole header */
	assert_int_equal(hpu__st_parse(h, 8, len + 36, &t, &at, &need, err, sizeof err), -2);
	assert_int_equal(need, len);
	free(h);
	/* explicit places: a gap of 16 bytes before the second */
	uint64_t begins[] = {0, 40};
	h = hpu__st_header(2, names, ndims, shapes, begins, NULL, &len, err, sizeof err);
	assert_non_null(h);
	char *json = strndup(h + 8, len - 8); /* the header has no NUL */
	assert_null(strstr(json, "__metadata__"));
	free(json);
	assert_int_equal(hpu__st_parse(h, len, len + 52, &t, &at, &need, err, sizeof err), 2);
	assert_int_equal(t[1].begin, 40);
	assert_int_equal(t[1].end, 52);
	free(t);
	free(h);
}

static void test_header_refuses(void **state)
{
	(void)state;
	const char *dup[] = {"a", "a"}, *res[] = {"__metadata__"};
	int ndims[] = {1, 1};
	int64_t s[] = {1};
	const int64_t *shapes[] = {s, s};
	char err[256];
	size_t len;
	assert_null(hpu__st_header(2, dup, ndims, shapes, NULL, NULL, &len, err, sizeof err));
	assert_non_null(strstr(err, "\"a\" appears twice"));
	assert_null(hpu__st_header(1, res, ndims, shapes, NULL, NULL, &len, err, sizeof err));
	assert_non_null(strstr(err, "__metadata__"));
}

/* Parses JSON j as the header of a file with `data` data bytes; returns
 * the count or -1, err filled. */
static int parse_json(const char *j, uint64_t data, char *err, size_t errlen)
{
	size_t n = strlen(j);
	unsigned char *b = malloc(8 + n);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)n >> (8 * i));
	memcpy(b + 8, j, n);
	hpu_st_tensor *t = NULL;
	uint64_t at;
	size_t need;
	int rc = hpu__st_parse(b, 8 + n, 8 + n + data, &t, &at, &need, err, errlen);
	free(t);
	free(b);
	return rc;
}

static void test_parse_refuses(void **state)
{
	(void)state;
	char err[256];
	assert_int_equal(parse_json("{\"__metadata__\":{\"x\":\"y\"},\"b\":{\"dtype\":\"F16\",\"shape\":[2],"
				    "\"data_offsets\":[8,12]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
				    "\"data_offsets\":[0,8]}}",
				    12, err, sizeof err),
			 2);
	assert_int_equal(parse_json("not json", 0, err, sizeof err), -1);
	assert_non_null(strstr(err, "not a JSON object"));
	assert_int_equal(parse_json("{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
				    err, sizeof err),
			 -1);
	assert_non_null(strstr(err, "tensor \"w\": unknown dtype \"Q7\""));
	assert_int_equal(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
				    err, sizeof err),
			 -1);
	assert_non_null(strstr(err, "tensor \"w\": data_offsets hold 4 bytes, but F32 of that shape needs 8"));
	assert_int_equal(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
				    err, sizeof err),
			 -1);
	assert_non_null(strstr(err, "tensor \"w\": data_offsets outside the file's 4 data bytes"));
	assert_int_equal(parse_json("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
				    "\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
				    8, err, sizeof err),
			 -1);
	assert_non_null(strstr(err, "overlap"));
	unsigned char bad[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{'};
	hpu_st_tensor *t;
	uint64_t at;
	size_t need;
	assert_false(hpu__st_sniff(bad, 16));
	assert_int_equal(hpu__st_parse(bad, 16, 16, &t, &at, &need, err, sizeof err), -1);
	assert_non_null(strstr(err, "header length 200 does not fit the file's 16 bytes"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_roundtrip),
	    cmocka_unit_test(test_header_refuses),
	    cmocka_unit_test(test_parse_refuses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
