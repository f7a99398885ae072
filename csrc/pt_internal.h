/*
 * pt_internal.h: what the Linux reader (pt_linux.c) and the BPF reader
 * (pt_bpf.c) share. Not part of the C contract (not in the cdef).
 */
#ifndef PT_INTERNAL_H
#define PT_INTERNAL_H

#include <stddef.h>

#include "proctable.h"

/* pt_bpf_scan's answer when the BPF reader does not take this read: the
 * caller reads /proc instead. Never a value of errno-style failure (-1). */
#define PT_BPF_DECLINED (-2L)

/* The whole table through the BPF task iterator, as pt_scan() with the same
 * rows (sorted by pid, info filled the same way, info->reader set), and where
 * extra is not NULL, extra[i] for each rows[i] (see PT_X_BPF_ROW). Returns
 * the row count, -1 with errno (ENOSPC and info->needed as pt_scan; ENOTSUP
 * for PT_WANT_BPF where the BPF reader cannot run), or PT_BPF_DECLINED: read
 * /proc (want has PT_WANT_PROCFS, the BPF reader does not run in this
 * process, or this one read cannot be trusted to match /proc). */
long pt_bpf_scan(pt_proc *rows, size_t cap, int want, pt_scaninfo *info, pt_extra *extra);

/* A reader="auto" table read that pt_bpf_scan declined has ended with n rows
 * (n < 0: it failed, ENOSPC included, and will be retried): the read after
 * the first that got its rows starts the program's load. */
void pt_bpf_auto_read_done(long n);

/* pt_extra.flags of a row pt_bpf_scan made itself (extra != NULL: extra[i]
 * for rows[i]): its uid, gid, cpu and task_flags fields are filled, as
 * status and stat would give them. Internal: pt_scan_extra clears it. */
#define PT_X_BPF_ROW (1 << 21)
/* ...and the task had a memory map then (not a kernel thread, not exited). */
#define PT_X_HAD_MM (1 << 23)

/* Write "<pid>" or "<pid>/<leaf>" (leaf NULL: the pid alone) into out (at least
 * 32 bytes plus the leaf). Returns its length. */
size_t pt_pid_path(char *out, long pid, const char *leaf);

/* A /proc d_name of digits only as a pid (at most INT32_MAX); 0 when it names
 * no pid directory. */
long pt_name_to_pid(const char *name);

/* The proc mount on /proc of this process (the last one mounted there, from
 * /proc/self/mountinfo): 1 where it hides processes (hidepid=1/2/4 or their
 * names), with its hidepid= option in opt[0..optlen) and its gid= (the exempt
 * group) in *gid, -1 none; else 0 (also when mountinfo cannot be read). */
int pt_proc_hidepid(char *opt, size_t optlen, long *gid);

#endif /* PT_INTERNAL_H */
