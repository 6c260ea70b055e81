/* config_testlib: what the training options' unit tests share (test_config,
 * test_config_file): parsing an argv, loading a JSON text, and expecting
 * either to fail with a message naming given strings. */
#ifndef HPU_CONFIG_TESTLIB_H
#define HPU_CONFIG_TESTLIB_H

#include <stddef.h>

#include "options/config.h"

#define ARGS(...) ((char *[]){"hpu-worker", __VA_ARGS__, NULL})

/* Parses argv (NULL-terminated, argv[0] the program) from index 1 into o;
 * returns hpu__opts_parse's result and leaves the stop index in *stop. */
int parse(hpu_train_opts *o, char **argv, int *stop, char *err, size_t errlen);

/* Asserts that parsing argv fails and that the message contains every
 * string in the NULL-terminated list `needles`. */
void expect_error(char **argv, const char *const *needles);
#define EXPECT_ERROR(argv, ...)                                                \
	expect_error(argv, (const char *const[]){__VA_ARGS__, NULL})

/* Writes text to a new temporary file, with ' standing for " so that the
 * JSON in these tests reads easily; returns its path in path[64]. */
void write_temp(const char *text, char *path);

/* Loads json on top of the defaults into o; asserts it loads. */
void load_ok(const char *json, hpu_train_opts *o);

/* Asserts that json is refused with one line naming every needle, and
 * that the options are left as they were. */
void load_error(const char *json, const char *const *needles);
#define LOAD_ERROR(json, ...)                                                  \
	load_error(json, (const char *const[]){__VA_ARGS__, NULL})

/* hpu__opts_set that fails the test when it fails. */
void set_ok(hpu_train_opts *o, const char *name, const char *v);

#endif
