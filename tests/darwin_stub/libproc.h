/*
 * Stand-in for macOS <libproc.h>: the two calls pt_darwin.c makes, with the
 * SDK's prototypes. Both return 0 (and set errno) on failure.
 */
#ifndef _LIBPROC_H_
#define _LIBPROC_H_

#include <stdint.h>
#include <sys/proc_info.h>

/* Fill buffer with pids; with buffer NULL, the number of pids there are.
 * Returns the number of pids (not bytes). */
int proc_listallpids(void *buffer, int buffersize);

/* Returns the number of bytes written to buffer, or 0 with errno. */
int proc_pidinfo(int pid, int flavor, uint64_t arg, void *buffer, int buffersize);

#endif /* _LIBPROC_H_ */
