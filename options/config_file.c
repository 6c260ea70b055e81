/* config_file: the DeepSpeed-style JSON config file (see config.h,
 * hpu__opts_load_file; the keys are listed in README.md).
 *
 * This file reads and parses the file and reports its errors; the keys
 * are config_keys.c's and config_keys_train.c's, their checks
 * config_walk.c's (config_internal.h says how the calls run).
 *
 * Each section is a table of keys; a key either sets one option of the
 * option table in config.c (checked against that option's kind and range,
 * through config_internal.h) or has a function of its own. Every key of a
 * section is checked first (unknown, repeated, not for this optimizer or
 * scheduler type), then the keys are applied in the order of their table,
 * not of the file: so "hputrain.strategy" (applied last) overrides
 * "zero_optimization.stage", and "scheduler.params.warmup_max_lr"
 * overrides "optimizer.params.lr". A value is checked even when a flag
 * overrides it.
 */
#include "options/config.h"
#include "options/config_internal.h"
#include "common/fileio.h"

#include <cJSON.h>
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads the whole config file (NUL-terminated) into *buf. */
static int read_file(const char *path, char **buf, size_t *len, char *err,
		     size_t errlen)
{
	const char *why = hpu__read_file(path, buf, len);
	if (why) {
		snprintf(err, errlen, "cannot read config file %s: %s", path, why);
		return -1;
	}
	return 0;
}

/* One walk over the file outside its strings: the first comma that only
 * white space parts from a '}' or ']' (JSON allows none, and cJSON says
 * where it gave up, which may be the file's end): its offset, or len
 * where there is none; and the innermost container open at buf[at]: '{',
 * '[', or 0 where none is (past the root value's end, or before it). */
struct json_scan {
	size_t comma;
	char open;
};

static struct json_scan scan_json(const char *buf, size_t len, size_t at)
{
	struct json_scan r = {.comma = len};
	char stack[64];
	int depth = 0, in_str = 0, open_set = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i >= at && !open_set) { /* an escape's skip may step over at */
			r.open = depth > 0 ? depth <= (int)sizeof stack ? stack[depth - 1] : '{' : 0;
			open_set = 1;
		}
		if (i == len)
			break;
		char ch = buf[i];
		if (in_str) {
			if (ch == '\\')
				i++;
			else if (ch == '"')
				in_str = 0;
		} else if (ch == '"') {
			in_str = 1;
		} else if (ch == '{' || ch == '[') {
			if (depth < (int)sizeof stack)
				stack[depth] = ch;
			depth++;
		} else if ((ch == '}' || ch == ']') && depth > 0) {
			depth--;
		} else if (ch == ',' && r.comma == len) {
			size_t j = i + 1 + strspn(buf + i + 1, " \t\n\r");
			if (j < len && (buf[j] == '}' || buf[j] == ']'))
				r.comma = i;
		}
	}
	return r;
}

static void syntax_error(const char *path, const char *buf, size_t len,
			 const char *at, char *err, size_t errlen)
{
	size_t pos = at && at >= buf && at <= buf + len ? (size_t)(at - buf) : len;
	struct json_scan scan = scan_json(buf, len, pos);
	size_t comma = scan.comma;
	int trailing = comma < pos; /* pos is at most len */
	if (trailing)
		pos = comma;
	int line = 1;
	size_t col = 1;
	for (size_t i = 0; i < pos; i++, col++)
		if (buf[i] == '\n')
			line++, col = 0;
	if (trailing) {
		snprintf(err, errlen, "%s: line %d, column %zu: JSON syntax error: a comma before "
				      "'%c' (JSON allows no trailing comma)",
			 path, line, col, buf[pos + 1 + strspn(buf + pos + 1, " \t\r\n")]);
		return;
	}
	if (pos >= len) {
		snprintf(err, errlen, "%s: line %d: JSON syntax error: the file ends too early",
			 path, line);
		return;
	}
	/* hjson's (DeepSpeed reads its file with it), not JSON's; cJSON
	 * stops at the comment's second character */
	size_t c = pos > 0 && (buf[pos - 1] == '#' ||
			       (buf[pos - 1] == '/' && (buf[pos] == '/' || buf[pos] == '*')))
			   ? pos - 1
			   : pos;
	if (buf[c] == '#' || (buf[c] == '/' && c + 1 < len && (buf[c + 1] == '/' || buf[c + 1] == '*'))) {
		if (c < pos)
			col--;
		snprintf(err, errlen, "%s: line %d, column %zu: a comment: JSON has none (DeepSpeed "
				      "reads its file with hjson, which takes them; this reader does "
				      "not): remove it",
			 path, line, col);
		return;
	}
	/* a value right after a value: the comma between them is missing
	 * (hjson, DeepSpeed's reader, takes a line break for one: a file
	 * that runs there, as Optimum Habana's llama2 ZeRO-3 config) */
	size_t p = pos;
	int newline = 0;
	while (p > 0 && buf[p - 1] && strchr(" \t\r\n", buf[p - 1]))
		newline |= buf[--p] == '\n';
	char in = p > 0 && p < pos ? scan.open : 0;
	if (p > 0 && p < pos && buf[pos] && !in) { /* the root value ended before */
		snprintf(err, errlen, "%s: line %d, column %zu: JSON syntax error: text after the end "
				      "of the file's object (two objects, or one closed too early?)",
			 path, line, col);
		return;
	}
	if (p > 0 && p < pos && buf[pos] && strchr("\"{[-0123456789tfn", buf[pos]) &&
	    (strchr("\"}]", buf[p - 1]) || isalnum((unsigned char)buf[p - 1]))) {
		/* a string after '{' or ',' was a key: its ':' is missing */
		size_t q = p - 1;
		if (buf[q] == '"')
			while (q > 0 && !(buf[q - 1] == '"' && (q < 2 || buf[q - 2] != '\\')))
				q--;
		while (q > 1 && buf[q - 2] && strchr(" \t\r\n", buf[q - 2]))
			q--;
		int key = in == '{' && buf[p - 1] == '"' && q >= 2 &&
			  (buf[q - 2] == '{' || buf[q - 2] == ',');
		snprintf(err, errlen, "%s: line %d, column %zu: JSON syntax error: a %s is missing "
				      "before this value%s",
			 path, line, col, key ? "':' after the key" : "comma",
			 key ? "" :
			 newline ? " (DeepSpeed reads its file with hjson, which takes the line "
				   "break for one; this reader does not): add it"
				 : "");
		return;
	}
	char near[24];
	size_t n = 0;
	while (n < sizeof near - 1 && pos + n < len && buf[pos + n] != '\n' &&
	       buf[pos + n] != '\r')
		near[n] = buf[pos + n], n++;
	near[n] = 0;
	snprintf(err, errlen, "%s: line %d, column %zu: JSON syntax error near '%s'",
		 path, line, col, near);
}

/* The error is one line whatever the file held. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

/* The file's errors into err: one as it is, several under a line that
 * counts them. */
static void report(const struct fctx *c, char *err, size_t errlen)
{
	if (c->nerr == 1)
		snprintf(err, errlen, "%s", c->msgs);
	else
		snprintf(err, errlen, "%s has %d errors:\n  %s", c->file, c->nerr, c->msgs);
}

/* Turns every \u0000 escape of the JSON text buf into \u0001, of the
 * same length: cJSON would make it a NUL that ends the string there (a
 * path "/tmp/a\u0000b" would name /tmp/a); a control character stays in
 * the string, where has_control finds it and the key is named. An escape
 * is one when an odd number of backslashes leads up to its "u": "\\u0000"
 * is a backslash and "u0000". */
static void mark_nuls(char *buf)
{
	for (char *p = buf; (p = strstr(p, "\\u0000")); p += 6) {
		size_t at = (size_t)(p - buf), slashes = 1;
		while (slashes <= at && buf[at - slashes] == '\\')
			slashes++;
		if (slashes % 2)
			p[5] = '1';
	}
}

int hpu__opts_load_file(hpu_train_opts *o, const char *path, char *err,
			size_t errlen)
{
	char *buf;
	size_t len;
	if (read_file(path, &buf, &len, err, errlen) < 0)
		return -1;
	int rc = -1;
	/* the copy keeps nothing a previous --config noted */
	hpu_train_opts *copy = malloc(sizeof *copy);
	struct fctx *c = calloc(1, sizeof *c);
	cJSON *root = NULL;
	if (!copy || !c) {
		snprintf(err, errlen, "out of memory reading %s", path);
		goto out;
	}
	*copy = *o;
	copy->ncfg_auto = 0;
	copy->cfg_ignored[0] = '\0';
	*c = (struct fctx){.o = copy, .file = path, .adam_w_mode = 1};
	const char *end = NULL;
	/* The position from ParseWithOpts is cJSON_GetErrorPtr()'s, without
	 * the global. */
	mark_nuls(buf);
	root = cJSON_ParseWithOpts(buf, &end, 1);
	if (!root) {
		syntax_error(path, buf, len, end, err, errlen);
		one_line(err);
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		char got[80];
		snprintf(err, errlen, "%s: expected a JSON object at the top, got %s",
			 path, hpu__cfg_describe(root, got, sizeof got));
		one_line(err);
		goto out;
	}
	if (hpu__cfg_walk_top(c, root) < 0 || hpu__cfg_deepspeed_defaults(c) < 0) {
		report(c, err, errlen);
		goto out;
	}
	*o = *copy;
	rc = 0;
out:
	cJSON_Delete(root);
	free(copy);
	free(c);
	free(buf);
	return rc;
}
