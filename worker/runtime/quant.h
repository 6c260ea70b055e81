/* quant: fp8 inference's two runs, driven by the JSON file that the
 * QUANT_CONFIG environment variable names (the Habana Quantization
 * Toolkit's convention):
 *
 *   {"mode": "MEASURE", "observer": "maxabs",
 *    "dump_stats_path": "./hqt_output/measure"}
 *   {"mode": "QUANTIZE", "scale_method": "maxabs_hw",
 *    "dump_stats_path": "./hqt_output/measure",
 *    "blocklist": {"names": ["fc3/linear#0"], "types": []}}
 *
 * MEASURE runs --calibration-batches forward passes over training data
 * recording each op's max |x| (fp8.h), reduces them over the ranks with
 * MAX, and rank 0 writes <dump_stats_path>_hooks_maxabs.json. QUANTIZE
 * loads that file and runs linear, conv2d, matmul and bmm with E4M3
 * inputs. Keys: mode (MEASURE | QUANTIZE | NONE), observer (maxabs),
 * dump_stats_path, scale_method (maxabs_hw: power-of-two scales from the
 * max-abs figures; unit_scale: scale 1), fp8_config (E4M3), allowlist and
 * blocklist ({"names": [...], "types": [...]}; whitelist and blacklist are
 * their older names), measure_exclude (NONE | OUTPUT: MEASURE leaves the
 * outputs' figures out), method (accepted), dump_stats_xlsx_path
 * (accepted with a warning: no spreadsheet is written). MEASURE makes
 * dump_stats_path's directory.
 */
#ifndef HPU_QUANT_H
#define HPU_QUANT_H

#include <hpu/coll.h>
#include <stddef.h>

#include "options/config.h"

typedef struct hpu_quant {
	int mode;            /* HPU_FP8_OFF (no QUANT_CONFIG), _MEASURE, _QUANTIZE */
	char config[512];    /* the QUANT_CONFIG file */
	char stats[600];     /* the measurement file */
	int exclude_outputs; /* measure_exclude OUTPUT */
	char warning[1300];  /* for rank 0 to print, or "" */
} hpu_quant;

/* Reads QUANT_CONFIG (unset or empty: nothing to do) and sets fp8.c's
 * mode; QUANTIZE loads the measurement file. Returns 0, or -1 with a
 * sentence naming the file and key in err. */
int hpu__quant_init(hpu_quant *q, const hpu_train_opts *o, char *err, size_t errlen);

/* MEASURE, after the calibration batches: the figures reduced over the
 * ranks; rank 0 writes the measurement file (atomically). `samples`: the
 * calibration samples of all ranks. Returns 0, or -1 with err. */
int hpu__quant_save(const hpu_quant *q, hpucoll_comm *comm, const char *model,
		    double samples, char *err, size_t errlen);

#endif
