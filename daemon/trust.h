/* trust: whether hpud may trust a file it reads or runs (its
 * configuration, the cluster key, the worker program), decided as sshd's
 * StrictModes decides for authorized_keys: the file and every directory
 * above it, up to /, belong to root or to the user hpud runs as, and no
 * one else can write them. A directory others may write is accepted only
 * when root owns it and it has the sticky bit (/tmp): others can then
 * neither rename nor remove what is in it. The path is checked as given
 * and, where it goes through symbolic links, as resolved. */
#ifndef HPUD_TRUST_H
#define HPUD_TRUST_H

#include <stddef.h>

/* Returns 0 if `path` can be trusted, else -1 with one sentence in err
 * naming the file (or the directory above it) and what is wrong, e.g.
 * "the configuration /etc/hpud/hpud.conf is writable by group or others
 * (mode 0666): chmod go-w it". `what` names the file ("the
 * configuration"). */
int hpud__trust_path(const char *path, const char *what, char *err,
		     size_t errlen);

#endif
