/* data_csv: hpu_csv_load (include/hpu/data.h): a CSV file with a header
 * line, numeric columns chosen by name. */
#include "worker/hpu/dataio.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define CSV_MAX_COLS 4096

/* The whole file (gzipped or not), NUL-terminated, in *out. */
static int slurp(const hpu__dfile *f, char **out)
{
	if (hpu__data_regular(f))
		return HPU_EINVAL;
	gzFile gz = gzopen(f->path, "rb");
	if (!gz)
		return hpu__data_open_fail(f, errno);
	size_t len = 0, cap = 1 << 16;
	char *buf = malloc(cap);
	int k = 0;
	while (buf && (k = gzread(gz, buf + len, (unsigned)(cap - len - 1))) > 0) {
		len += (size_t)k;
		if (cap - len - 1 == 0) {
			char *grown = realloc(buf, cap * 2);
			if (!grown) {
				free(buf);
				buf = NULL;
			}
			buf = grown;
			cap *= 2;
		}
	}
	gzclose(gz);
	if (!buf)
		return hpu__data_fail(f, "out of memory");
	if (k < 0) {
		free(buf);
		return hpu__data_fail(f, "corrupt gzip data");
	}
	buf[len] = 0;
	*out = buf;
	return HPU_OK;
}

/* Cuts the line at p into fields (in place) and returns their count;
 * *next is the next line. A field is trimmed of spaces and one pair of
 * double quotes. */
static int split_line(char *p, char **fields, int max, char **next)
{
	char *end = p + strcspn(p, "\n");
	*next = *end ? end + 1 : end;
	*end = 0;
	if (end > p && end[-1] == '\r')
		end[-1] = 0;
	int n = 0;
	for (char *s = p;; s++) {
		char *c = s + strcspn(s, ",");
		int last = !*c;
		*c = 0;
		while (*s == ' ' || *s == '\t')
			s++;
		for (char *t = c; t > s && (t[-1] == ' ' || t[-1] == '\t');)
			*--t = 0;
		size_t l = strlen(s);
		if (l >= 2 && s[0] == '"' && s[l - 1] == '"') {
			s[l - 1] = 0;
			s++;
		}
		if (n < max)
			fields[n] = s;
		n++;
		if (last)
			return n;
		s = c;
	}
}

/* The column index of name in the header, or -1. */
static int column(char **hdr, int n, const char *name, size_t len)
{
	for (int i = 0; i < n; i++)
		if (strlen(hdr[i]) == len && !strncmp(hdr[i], name, len))
			return i;
	return -1;
}

/* Resolves the feature columns (a list or every column but the label). */
static int pick(const hpu__dfile *f, char **hdr, int n, const char *list, int label, int *cols,
		int *ncols)
{
	*ncols = 0;
	if (!list) {
		for (int i = 0; i < n; i++)
			if (i != label)
				cols[(*ncols)++] = i;
		return *ncols ? HPU_OK : hpu__data_fail(f, "has no feature column besides the label");
	}
	for (const char *p = list;;) {
		size_t len = strcspn(p, ",");
		int c = column(hdr, n, p, len);
		if (c < 0)
			return hpu__data_fail(f, "has no column '%.*s' (line 1 names its columns)", (int)len, p);
		cols[(*ncols)++] = c;
		if (!p[len])
			return HPU_OK;
		p += len + 1;
	}
}

static int number(const hpu__dfile *f, const char *s, long line, const char *col, double *v)
{
	char *end;
	errno = 0;
	*v = strtod(s, &end);
	if (!*s || *end || errno == ERANGE)
		return hpu__data_fail(f, "line %ld: column '%s' is %s%s%s, not a number", line, col,
				      *s ? "'" : "empty", s, *s ? "'" : "");
	return HPU_OK;
}

/* Counts the data lines (non-empty) after the header. */
static size_t count_rows(const char *p)
{
	size_t n = 0;
	for (; *p; p += strcspn(p, "\n"), p += *p == '\n') {
		size_t l = strcspn(p, "\n");
		n += l > 1 || (l == 1 && *p != '\r');
	}
	return n;
}

typedef struct csv_job {
	const hpu__dfile *f;
	char **hdr;
	int nhdr, *cols, ncols, label;
	hpu_array *x;
	double *y;
} csv_job;

/* Parses the data lines into j->x (and j->y). */
static int parse_rows(csv_job *j, char *p, char **fields)
{
	float *x = j->x->data;
	size_t row = 0;
	for (long line = 2; *p; line++) {
		char *next;
		if (*p == '\n' || (p[0] == '\r' && p[1] == '\n')) {
			p += strcspn(p, "\n") + 1;
			continue;
		}
		int n = split_line(p, fields, j->nhdr, &next);
		if (n != j->nhdr)
			return hpu__data_fail(j->f, "line %ld has %d fields, the header has %d", line, n, j->nhdr);
		for (int c = 0; c < j->ncols; c++) {
			double v;
			if (number(j->f, fields[j->cols[c]], line, j->hdr[j->cols[c]], &v))
				return HPU_EINVAL;
			x[row * (size_t)j->ncols + (size_t)c] = (float)v;
		}
		if (j->label >= 0 && number(j->f, fields[j->label], line, j->hdr[j->label], &j->y[row]))
			return HPU_EINVAL;
		row++;
		p = next;
	}
	return HPU_OK;
}

/* The label column as I32 when every value is an integer, else F32. */
static int make_label(const hpu__dfile *f, hpu_array *label, const double *y, size_t rows)
{
	int integral = 1;
	for (size_t i = 0; i < rows; i++)
		integral &= y[i] == floor(y[i]) && fabs(y[i]) < 2147483648.0;
	int64_t shape[1] = {(int64_t)rows};
	int rc = hpu__array_alloc(label, f, integral ? HPU_DATA_I32 : HPU_DATA_F32, 1, shape);
	for (size_t i = 0; !rc && i < rows; i++) {
		if (integral)
			((int32_t *)label->data)[i] = (int32_t)y[i];
		else
			((float *)label->data)[i] = (float)y[i];
	}
	return rc;
}

int hpu_csv_load(hpu_array *features, hpu_array *label, const char *path, const char *feature_cols,
		 const char *label_col, char *err, size_t errlen)
{
	hpu__dfile f = {.path = path ? path : "(null)", .err = err, .errlen = errlen};
	memset(features, 0, sizeof *features);
	if (label)
		memset(label, 0, sizeof *label);
	if (!path || (label_col && !label))
		return hpu__data_fail(&f, "hpu_csv_load: no file, or a label column without its array");
	char *text = NULL, *hdr[CSV_MAX_COLS], *fields[CSV_MAX_COLS], *p;
	int cols[CSV_MAX_COLS], ncols = 0, lab = -1;
	double *y = NULL;
	int rc = slurp(&f, &text);
	if (rc)
		return rc;
	int nhdr = split_line(text, hdr, CSV_MAX_COLS, &p);
	if (nhdr > CSV_MAX_COLS || (nhdr == 1 && !hdr[0][0])) {
		rc = hpu__data_fail(&f, nhdr > 1 ? "line 1 has more than %d columns" : "line 1 (the header) is empty",
				    CSV_MAX_COLS);
		goto out;
	}
	if (label_col && (lab = column(hdr, nhdr, label_col, strlen(label_col))) < 0) {
		rc = hpu__data_fail(&f, "has no label column '%s' (line 1 names its columns)", label_col);
		goto out;
	}
	rc = pick(&f, hdr, nhdr, feature_cols, lab, cols, &ncols);
	size_t rows = count_rows(p);
	int64_t shape[2] = {(int64_t)rows, ncols};
	if (!rc && !rows)
		rc = hpu__data_fail(&f, "has a header but no rows");
	if (!rc)
		rc = hpu__array_alloc(features, &f, HPU_DATA_F32, 2, shape);
	if (!rc && lab >= 0 && !(y = malloc(rows * sizeof *y)))
		rc = hpu__data_fail(&f, "out of memory");
	csv_job j = {&f, hdr, nhdr, cols, ncols, lab, features, y};
	if (!rc)
		rc = parse_rows(&j, p, fields);
	if (!rc && lab >= 0)
		rc = make_label(&f, label, y, rows);
out:
	free(y);
	free(text);
	if (rc) {
		hpu_array_free(features);
		hpu_array_free(label);
	}
	return rc;
}
