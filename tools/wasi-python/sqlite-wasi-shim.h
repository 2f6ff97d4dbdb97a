/*
 * Forced include (-include) for compiling SQLite's amalgamation for
 * wasm32-wasi with wasi-libc.
 *
 * SQLite's unix VFS names POSIX calls and constants that WASI does not have:
 * advisory locks (F_*LK), file ownership and permission changes, and the
 * effective uid. With SQLITE_DEFAULT_UNIX_VFS="unix-none" none of them is
 * used for locking; the rest only needs to compile and answer "done", because
 * a WASI process has no users and its files no owners.
 */
#ifndef TRIAD_SQLITE_WASI_SHIM_H
#define TRIAD_SQLITE_WASI_SHIM_H

#include <sys/types.h>
#include <fcntl.h>

#ifndef F_RDLCK
#define F_RDLCK 0
#endif
#ifndef F_WRLCK
#define F_WRLCK 1
#endif
#ifndef F_UNLCK
#define F_UNLCK 2
#endif
#ifndef F_GETLK
#define F_GETLK 5
#endif
#ifndef F_SETLK
#define F_SETLK 6
#endif
#ifndef F_SETLKW
#define F_SETLKW 7
#endif

static inline int triad_wasi_fchmod(int fd, mode_t mode) {
	(void)fd;
	(void)mode;
	return 0;
}
static inline int triad_wasi_fchown(int fd, uid_t uid, gid_t gid) {
	(void)fd;
	(void)uid;
	(void)gid;
	return 0;
}
static inline uid_t triad_wasi_geteuid(void) { return 0; }

#define fchmod triad_wasi_fchmod
#define fchown triad_wasi_fchown
#define geteuid triad_wasi_geteuid

#endif
