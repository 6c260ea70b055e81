/* safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}), then the tensors' raw
 * little-endian bytes, offsets counted from the end of the header.
 * F32 only, as hpu's parameters are. */
#ifndef HPU_CKPT_SAFETENSORS_H
#define HPU_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define HPU__ST_MAX_DIMS 8

typedef struct hpu_st_tensor {
	char name[256];
	char dtype[16];
	int ndim;
	int64_t shape[HPU__ST_MAX_DIMS];
	uint64_t begin, end; /* bytes, from the start of the data */
} hpu_st_tensor;

/* The header for F32 tensors names[i] of shape shapes[i][0 .. ndims[i]),
 * tensor i's data from byte begins[i] of the data (begins NULL: back to
 * back in the order given): the 8 length bytes, then the JSON
 * ("__metadata__" first) padded with spaces to a multiple of 8. meta:
 * NULL or pairs of strings ending in NULL. Returns a malloc'd buffer of
 * *len bytes, or NULL with err (duplicate or reserved name, no memory). */
char *hpu__st_header(int n, const char *const *names, const int *ndims,
		     const int64_t *const *shapes, const uint64_t *begins,
		     const char *const *meta, size_t *len, char *err, size_t errlen);

/* Parses the first `have` bytes of a file of `file_size` bytes. Returns
 * the number of tensors (*out malloc'd, the caller frees) and the data's
 * start in *data_at; -1 with err if this is not a well-formed safetensors
 * file (bad length, JSON, dtype/shape/offsets disagreeing, overlapping or
 * past the end); -2 if more bytes are needed (*need says how many). */
int hpu__st_parse(const void *head, size_t have, uint64_t file_size, hpu_st_tensor **out,
		  uint64_t *data_at, size_t *need, char *err, size_t errlen);

/* Whether the first 9 bytes look like safetensors (a length that fits the
 * file and a '{'). */
int hpu__st_sniff(const unsigned char *head9, uint64_t file_size);

/* Bytes per element of a safetensors dtype name, 0 if unknown. */
int hpu__st_dtype_size(const char *dtype);

#endif
