/*
 * The scripted process tables that fake_libproc.c serves, for test_darwin.c.
 * Not part of the macOS stand-in headers: tests only.
 */
#ifndef FAKE_LIBPROC_H
#define FAKE_LIBPROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* How a scripted process answers. */
enum fake_how {
    FAKE_OK,            /* every call answers */
    FAKE_VANISH,        /* listed, then gone: every call says ESRCH */
    FAKE_TASK_DENIED,   /* PROC_PIDTASKINFO fails with EPERM */
    FAKE_BSD_DENIED,    /* PROC_PIDTBSDINFO and PROC_PIDTASKINFO fail with EPERM;
                           sysctl(KERN_PROC_PID) answers */
    FAKE_ALL_DENIED,    /* both proc_pidinfo flavors and sysctl(KERN_PROC_PID)
                           fail with EPERM (a sandboxed reader) */
    FAKE_DIES,          /* first BSD read: running; then a zombie (xstatus 9) */
    FAKE_SHORT          /* PROC_PIDTBSDINFO answers 8 bytes short */
};

struct fake_proc {
    int pid;
    enum fake_how how;
    int ppid, pgid, sid;
    uid_t uid;
    uint32_t status, xstatus;
    const char *comm;           /* pbi_comm / p_comm */
    const char *name;           /* pbi_name ("" when none) */
    uint32_t tdev;              /* bsdinfo e_tdev: 0 for no tty */
    uint64_t start_sec, start_usec;
    uint64_t rss_bytes, user_ticks, system_ticks;   /* pti_virtual_size: 4 x rss */
    int32_t threads;
};

enum fake_table {
    FAKE_TABLE_MAIN,    /* every kind of process, listed out of pid order */
    FAKE_TABLE_BIG,     /* 40 plain processes; the first count is too low */
    FAKE_TABLE_SHORT,   /* a truncated reply; hw.tbfrequency 1e9 in 4 bytes */
    FAKE_TABLE_NOLIST   /* proc_listallpids fails with EPERM */
};

#define FAKE_BIG_COUNT 40

/* Select a table and reset all per-call state. */
void fake_use(enum fake_table table);

/* The selected table's scripted processes (in listing order), and the count. */
const struct fake_proc *fake_procs(size_t *count);

/* Calls made so far to proc_pidinfo, any flavor. */
extern unsigned long fake_pidinfo_calls;

#endif /* FAKE_LIBPROC_H */
