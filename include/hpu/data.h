/* data.h: ready datasets for models. A file becomes an array in one
 * call, its shape and element type read from the file, and arrays
 * become a dataset split (hpu_dataset_set) in another:
 *
 *   hpu_array_load   IDX (the MNIST family, gzipped or not), NumPy .npy
 *                    and .npz (stored or deflated members), llm.c token
 *                    files (dev/data's .bin: GPT-2's uint16, LLaMA-3's
 *                    uint32 tokens)
 *   hpu_csv_load     a CSV file with a header: feature columns and a
 *                    label column chosen by name
 *   hpu_data_declare the arrays as the fields of a split: row i of each
 *                    array is sample i (or window i of a token array)
 *
 * Every error is a sentence in err naming the file and what is wrong
 * (truncated, a bad magic, an unsupported type, a shape that does not
 * match the data, a CSV line with the wrong number of fields).
 *
 * Ownership: the arrays' data is the caller's after a load (free it with
 * hpu_array_free); a split and the arrays it names must outlive the run
 * (keep them in the model's state and free them at teardown). A dataset
 * is host memory, read by the runtime's loader thread; it is not counted
 * in the device memory (--device-memory). */
#ifndef HPU_DATA_H
#define HPU_DATA_H

#include <hpu/hpu.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HPU_ARRAY_MAX_DIMS 8

/* The element types a file may hold. */
typedef enum hpu_data_type {
	HPU_DATA_U8 = 0,
	HPU_DATA_I8,
	HPU_DATA_U16,
	HPU_DATA_I16,
	HPU_DATA_U32,
	HPU_DATA_I32,
	HPU_DATA_I64,
	HPU_DATA_F32,
	HPU_DATA_F64,
} hpu_data_type;

/* An array read from a file: dense, row-major (C order), in the host's
 * byte order. Row i (shape[1..]) is sample i. */
typedef struct hpu_array {
	hpu_data_type type;
	int ndim;                          /* 0 (one value) .. HPU_ARRAY_MAX_DIMS */
	int64_t shape[HPU_ARRAY_MAX_DIMS];
	size_t count;                      /* shape[0]: rows (1 when ndim is 0) */
	size_t row_numel;                  /* product of shape[1..] (1 for 1-D) */
	void *data;                        /* count * row_numel elements */
} hpu_array;

/* Bytes of one element ("u8" is 1), and its name ("u8", "f32", ...). */
HPU_API size_t hpu_data_type_size(hpu_data_type type);
HPU_API const char *hpu_data_type_name(hpu_data_type type);

/* Reads the array in the file at path; the format comes from its first
 * bytes, not its name: IDX (ubyte, byte, short, int, float, double;
 * big-endian dimensions), .npy (format 1 to 3; '<', '>', '|' and '='
 * byte orders of b1, u1, i1, u2, i2, u4, i4, i8, f4, f8; C order only),
 * .npz (member: the array's name without ".npy"; NULL picks the only
 * one), llm.c tokens (1-D, U16 or U32). IDX, .npy and token files may be
 * gzipped. member must be NULL but for .npz. Returns HPU_OK, or an error
 * code with the sentence in err (a is then empty). */
HPU_API int hpu_array_load(hpu_array *a, const char *path, const char *member, char *err,
			   size_t errlen);

/* Reads a CSV file whose first line names its columns (comma-separated;
 * a name may be double-quoted). features gets the columns named in
 * feature_cols (comma-separated, in that order; NULL: every column but
 * the label, in file order) as F32 [rows, n]; label, when label_col is
 * not NULL, the column label_col as I32 [rows] when every value is an
 * integer, else F32. Every value must be a number. Lines may end in
 * "\r\n"; empty lines are skipped. Returns HPU_OK, or an error code with
 * the sentence in err naming the file and line. */
HPU_API int hpu_csv_load(hpu_array *features, hpu_array *label, const char *path,
			 const char *feature_cols, const char *label_col, char *err,
			 size_t errlen);

/* Frees a's data and empties it; safe twice. */
HPU_API void hpu_array_free(hpu_array *a);

/* One field of a split, read from an array. */
typedef struct hpu_data_field {
	const char *name;       /* the field: a tensor of that name */
	const hpu_array *array; /* where its values come from */
	hpu_dtype dtype;        /* HPU_F32 or HPU_I32: values are converted */
	float scale, shift;     /* HPU_F32: value * scale + shift (both 0:
				 * the value as it is) */
	int reshape;            /* 0: one sample has the array's row shape
				 * (window: [window]); 1: ndim and shape say
				 * it, with as many elements */
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
	int64_t classes;        /* HPU_I32, > 0: a value outside [0, classes)
				 * is refused by hpu_data_declare, naming
				 * the field and row (as is a value that is
				 * not a whole int32 in any HPU_I32 field) */
	size_t window, offset;  /* window > 0: array is read as one sequence
				 * (a token file) and sample i is its
				 * elements [i * window + offset, + window):
				 * offset 0 the inputs, 1 the next-token
				 * targets */
} hpu_data_field;

/* A split: the fields the model fills in, and the size
 * hpu_data_declare sets (the rows the fields share; for windows, the
 * whole windows they all have). */
typedef struct hpu_data_split {
	int nfields;
	hpu_data_field fields[HPU_MAX_IO];
	size_t size;
} hpu_data_split;

/* Declares s as the dataset `split` (hpu_dataset_set). Fields that are
 * not windows must have the same number of rows. s and its arrays are
 * read by every fetch: they must stay as they are until the model is
 * unloaded. Returns HPU_OK, or hpu_error's code naming the field. */
HPU_API int hpu_data_declare(hpu_builder *b, hpu_split split, hpu_data_split *s);

#ifdef __cplusplus
}
#endif
#endif
