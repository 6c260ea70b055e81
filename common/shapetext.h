/* shapetext: a tensor's shape as text, for messages. */
#ifndef HPU_COMMON_SHAPETEXT_H
#define HPU_COMMON_SHAPETEXT_H

#include <stddef.h>
#include <stdint.h>

/* "[1024, 784]" ("[]" for no dimension) in buf, cut to its n bytes
 * (terminated where n > 0). Returns buf. */
const char *hpu__shape_text(char *buf, size_t n, int ndim, const int64_t *shape);

#endif
