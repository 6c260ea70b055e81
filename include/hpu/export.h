/* HPU_API marks the public functions of libhpu and libhpucoll. Both
 * libraries are built with hidden visibility (-fvisibility=hidden), so
 * what carries no HPU_API is internal and not exported (ARCHITECTURE.md). */
#ifndef HPU_EXPORT_H
#define HPU_EXPORT_H

#if defined(__GNUC__)
#define HPU_API __attribute__((visibility("default")))
#else
#define HPU_API
#endif

#endif
