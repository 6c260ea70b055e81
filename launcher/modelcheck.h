/* modelcheck: hpulaunch looks at the model file before it starts any
 * worker: a 64-bit ELF shared library of this machine that defines the
 * model's entry symbol (hpu_model_entry, <hpu/hpu.h>), and the numbers
 * among the training defaults it declares. A light read of the ELF
 * headers, the dynamic symbol table and the entry's bytes; nothing is
 * loaded. */
#ifndef HPU_LAUNCHER_MODELCHECK_H
#define HPU_LAUNCHER_MODELCHECK_H

#include <stddef.h>

#include <hpu/hpu.h>

/* Returns 0, or -1 with a sentence in err naming path and what is
 * wrong (no ELF file, not a shared library, another machine's, no entry
 * symbol, cut short). */
int hpu__model_check(const char *path, char *err, size_t errlen);

/* The numeric fields of the model's HPU_MODEL(.defaults = {...}) (epochs,
 * batch_size, lr, weight_decay, warmup_steps, min_lr) into *d, its
 * pointers (optimizer, scheduler, precision) left NULL: those are
 * relocated when the model is loaded, the numbers are the entry symbol's
 * bytes in the file, read where its section header places them; the
 * symbol's size must hold .defaults, as hpu-worker checks. Returns 1, 0
 * when the model declares none (*d zero: an ABI 2 model, or one built
 * before .defaults), -1 with a phrase in why when the file cannot tell
 * (no model, the entry outside the file's bytes). */
int hpu__model_declared(const char *path, hpu_train_defaults *d, char *why, size_t whylen);

#endif
