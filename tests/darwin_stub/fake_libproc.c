/*
 * fake_libproc.c: libproc, sysctl and getsid for test_darwin.c on Linux,
 * serving a scripted process table (see fake_libproc.h) with the return and
 * errno conventions of xnu: proc_pidinfo answers 0 with errno on failure,
 * finds a zombie with PROC_PIDTBSDINFO only when arg is non-zero, and denies
 * with EPERM; sysctl(KERN_PROC_PID) answers with length 0 for no such pid.
 *
 * getsid is defined here too so that sessions come from the script (and, as
 * xnu's, fails with ESRCH for a zombie): the linker prefers this definition
 * to the C library's.
 */
#define _DEFAULT_SOURCE

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <libproc.h>
#include <sys/proc.h>
#include <sys/sysctl.h>

#include "fake_libproc.h"

#define NO_TTY 0

static const struct fake_proc main_table[] = {
    /* pid  how               ppid pgid sid  uid  status  xstatus comm / name */
    {501, FAKE_OK,           420, 501, 420, 501, SSLEEP, 0, "Google Chrome H",
     "Google Chrome Helper (Renderer)", 0x10000003, 1700000100, 250000,
     16384 * 1000, 24000000ull * 5 + 24 * 7, 24 * 3, 17},
    {730, FAKE_OK,           420, 730, 420, 501, SZOMB, 1792, "sh", "", NO_TTY,
     1700000200, 500000, 0, 0, 0, 0},
    {0, FAKE_BSD_DENIED,     0, 0, 0, 0, SRUN, 0, "kernel_task", "", NO_TTY,
     1699990000, 0, 0, 0, 0, 0},
    {2001, FAKE_OK,          300, 300, 300, 501, SIDL, 0, "python3.12", "", NO_TTY,
     1700000300, 999999, 4096, 0, 0, 1},
    {412, FAKE_VANISH,       1, 412, 412, 501, SSLEEP, 0, "gone", "", NO_TTY,
     1700000000, 0, 0, 0, 0, 0},
    {1, FAKE_BSD_DENIED,     0, 1, 1, 0, SSLEEP, 0, "launchd", "", NO_TTY,
     1699990000, 1, 0, 0, 0, 0},
    {300, FAKE_OK,           1, 300, 300, 501, SRUN, 0, "python3.12", "python3.12", NO_TTY,
     1700000050, 0, 0, 24000000ull * 1000000 + 48, 24000000ull * 86400, 4},
    {88, FAKE_TASK_DENIED,   1, 88, 88, 88, SSLEEP, 0, "WindowServer", "WindowServer",
     NO_TTY, 1699990100, 42, 1 << 30, 1, 1, 12},
    {615, FAKE_DIES,         501, 501, 420, 501, SRUN, 9, "Renderer", "Renderer (dying)",
     0x10000003, 1700000400, 7, 8192, 24, 24, 3},
    {42, FAKE_OK,            420, 42, 420, 501, SSTOP, 0, "vim", "", 0x10000002,
     1700000010, 10, 4096 * 3, 24000000, 0, 1},
    {731, FAKE_BSD_DENIED,   1, 731, 731, 0, SZOMB, 139, "crashy daemon)", "", NO_TTY,
     1700000500, 0, 0, 0, 0, 0},
    {950, FAKE_ALL_DENIED,   1, 950, 950, 0, SSLEEP, 0, "sandboxed", "", NO_TTY,
     1700000600, 0, 4096, 24, 24, 2},
    {77, FAKE_ALL_DENIED,    1, 77, 77, 0, SRUN, 0, "hidden", "", NO_TTY,
     1699990200, 0, 4096, 24, 24, 2},
    {4000, FAKE_VANISH,      1, 4000, 4000, 501, SRUN, 0, "last", "", NO_TTY,
     1700000700, 0, 0, 0, 0, 1},
};

static const struct fake_proc short_table[] = {
    {5, FAKE_OK, 1, 5, 5, 501, SRUN, 0, "ok", "", NO_TTY, 1700000000, 0,
     4096 * 2, 1500000000ull, 2000, 2},
    {7, FAKE_SHORT, 1, 7, 7, 501, SRUN, 0, "short", "", NO_TTY, 1700000000, 0,
     0, 0, 0, 1},
};

static struct fake_proc big_table[FAKE_BIG_COUNT];
static char big_names[FAKE_BIG_COUNT][16];

static enum fake_table current = FAKE_TABLE_MAIN;
static int big_underreport;         /* the next count query of BIG says 10 */
static unsigned dies_bsd_reads;     /* PROC_PIDTBSDINFO reads of the FAKE_DIES pid */
unsigned long fake_pidinfo_calls;

void
fake_use(enum fake_table table)
{
    current = table;
    big_underreport = 1;
    dies_bsd_reads = 0;
    fake_pidinfo_calls = 0;
    for (int i = 0; i < FAKE_BIG_COUNT; i++) {
        struct fake_proc *p = &big_table[i];
        int pid = 1000 + ((i * 17) % FAKE_BIG_COUNT) * 3;   /* a permutation */

        snprintf(big_names[i], sizeof(big_names[i]), "worker %d", pid);
        memset(p, 0, sizeof(*p));
        p->pid = pid;
        p->how = FAKE_OK;
        p->ppid = 1;
        p->pgid = p->sid = pid;
        p->uid = 501;
        p->status = SSLEEP;
        p->comm = big_names[i];
        p->name = "";
        p->start_sec = 1700000000 + (uint64_t)pid;
        p->rss_bytes = 4096 * (uint64_t)pid;
        p->user_ticks = (uint64_t)24000000 * (uint64_t)pid;
        p->threads = 2;
    }
}

const struct fake_proc *
fake_procs(size_t *count)
{
    switch (current) {
    case FAKE_TABLE_MAIN:
        *count = sizeof(main_table) / sizeof(main_table[0]);
        return main_table;
    case FAKE_TABLE_BIG:
        *count = FAKE_BIG_COUNT;
        return big_table;
    case FAKE_TABLE_SHORT:
        *count = sizeof(short_table) / sizeof(short_table[0]);
        return short_table;
    default:
        *count = 0;
        return NULL;
    }
}

static const struct fake_proc *
find(int pid)
{
    size_t n;
    const struct fake_proc *t = fake_procs(&n);

    for (size_t i = 0; i < n; i++)
        if (t[i].pid == pid)
            return &t[i];
    return NULL;
}

/* A FAKE_DIES process is a zombie once its BSD info has been read once. */
static uint32_t
status_now(const struct fake_proc *p)
{
    return p->how == FAKE_DIES && dies_bsd_reads > 1 ? SZOMB : p->status;
}

static void
copy_name(char *dst, size_t cap, const char *src)
{
    memset(dst, 0, cap);
    strncpy(dst, src, cap - 1);
}

int
proc_listallpids(void *buffer, int buffersize)
{
    size_t n;
    const struct fake_proc *t = fake_procs(&n);
    int *out = buffer;
    int room;

    if (current == FAKE_TABLE_NOLIST) {
        errno = EPERM;
        return 0;
    }
    if (buffer == NULL) {
        if (current == FAKE_TABLE_BIG && big_underreport) {
            big_underreport = 0;
            return 10;      /* the table grows between the two calls */
        }
        return (int)n;
    }
    room = buffersize / (int)sizeof(int);
    for (int i = 0; i < (int)n && i < room; i++)
        out[i] = t[i].pid;
    return (int)n < room ? (int)n : room;
}

int
proc_pidinfo(int pid, int flavor, uint64_t arg, void *buffer, int buffersize)
{
    const struct fake_proc *p = find(pid);
    uint32_t status;

    fake_pidinfo_calls++;
    if (p == NULL || p->how == FAKE_VANISH) {
        errno = ESRCH;
        return 0;
    }
    if (flavor == PROC_PIDTBSDINFO) {
        struct proc_bsdinfo bi;

        if (buffersize < (int)sizeof(bi)) {
            errno = ENOMEM;
            return 0;
        }
        if (p->how == FAKE_BSD_DENIED || p->how == FAKE_ALL_DENIED) {
            errno = EPERM;
            return 0;
        }
        if (p->how == FAKE_DIES)
            dies_bsd_reads++;
        status = status_now(p);
        if (status == SZOMB && arg == 0) {
            errno = ESRCH;  /* xnu looks among zombies only when asked */
            return 0;
        }
        memset(&bi, 0, sizeof(bi));
        bi.pbi_status = status;
        bi.pbi_xstatus = p->xstatus;
        bi.pbi_pid = (uint32_t)p->pid;
        bi.pbi_ppid = (uint32_t)p->ppid;
        bi.pbi_uid = p->uid;
        bi.pbi_ruid = p->uid;
        copy_name(bi.pbi_comm, sizeof(bi.pbi_comm), p->comm);
        copy_name(bi.pbi_name, sizeof(bi.pbi_name), p->name);
        bi.pbi_pgid = (uint32_t)p->pgid;
        bi.e_tdev = p->tdev;
        bi.pbi_start_tvsec = p->start_sec;
        bi.pbi_start_tvusec = p->start_usec;
        memcpy(buffer, &bi, sizeof(bi));
        return p->how == FAKE_SHORT ? (int)sizeof(bi) - 8 : (int)sizeof(bi);
    }
    if (flavor == PROC_PIDTASKINFO) {
        struct proc_taskinfo ti;

        if (buffersize < (int)sizeof(ti)) {
            errno = ENOMEM;
            return 0;
        }
        if (p->how == FAKE_BSD_DENIED || p->how == FAKE_TASK_DENIED ||
            p->how == FAKE_ALL_DENIED) {
            errno = EPERM;
            return 0;
        }
        if (p->how == FAKE_DIES || p->status == SZOMB) {
            errno = ESRCH;  /* a zombie has no task */
            return 0;
        }
        memset(&ti, 0, sizeof(ti));
        ti.pti_virtual_size = p->rss_bytes * 4;
        ti.pti_resident_size = p->rss_bytes;
        ti.pti_total_user = p->user_ticks;
        ti.pti_total_system = p->system_ticks;
        ti.pti_threadnum = p->threads;
        memcpy(buffer, &ti, sizeof(ti));
        return (int)sizeof(ti);
    }
    errno = EINVAL;
    return 0;
}

int
sysctl(int *name, unsigned int namelen, void *oldp, size_t *oldlenp,
       void *newp, size_t newlen)
{
    const struct fake_proc *p;
    struct kinfo_proc kp;

    if (namelen != 4 || name[0] != CTL_KERN || name[1] != KERN_PROC ||
        name[2] != KERN_PROC_PID || newp != NULL || newlen != 0) {
        errno = ENOTSUP;
        return -1;
    }
    p = find(name[3]);
    if (p == NULL || p->how == FAKE_VANISH) {
        *oldlenp = 0;       /* xnu: success, nothing matched */
        return 0;
    }
    if (p->how == FAKE_ALL_DENIED) {
        errno = EPERM;
        return -1;
    }
    if (*oldlenp < sizeof(kp)) {
        errno = ENOMEM;
        return -1;
    }
    memset(&kp, 0, sizeof(kp));
    kp.kp_proc.p_starttime.tv_sec = (time_t)p->start_sec;
    kp.kp_proc.p_starttime.tv_usec = (suseconds_t)p->start_usec;
    kp.kp_proc.p_stat = (char)status_now(p);
    kp.kp_proc.p_pid = p->pid;
    copy_name(kp.kp_proc.p_comm, sizeof(kp.kp_proc.p_comm), p->comm);
    kp.kp_proc.p_xstat = (unsigned short)p->xstatus;
    kp.kp_eproc.e_ucred.cr_uid = p->uid;
    kp.kp_eproc.e_ppid = p->ppid;
    kp.kp_eproc.e_pgid = p->pgid;
    kp.kp_eproc.e_tdev = p->tdev == NO_TTY ? NODEV : (dev_t)p->tdev;
    memcpy(oldp, &kp, sizeof(kp));
    *oldlenp = sizeof(kp);
    return 0;
}

int
sysctlbyname(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen)
{
    if (strcmp(name, "hw.tbfrequency") != 0 || newp != NULL || newlen != 0) {
        errno = ENOENT;
        return -1;
    }
    if (current == FAKE_TABLE_SHORT) {
        uint32_t hz = 1000000000u;      /* Intel, answered in 4 bytes */
        memcpy(oldp, &hz, sizeof(hz));
        *oldlenp = sizeof(hz);
    } else {
        uint64_t hz = 24000000u;        /* Apple silicon */
        memcpy(oldp, &hz, sizeof(hz));
        *oldlenp = sizeof(hz);
    }
    return 0;
}

pid_t
getsid(pid_t pid)
{
    const struct fake_proc *p = find(pid);

    if (p == NULL || p->how == FAKE_VANISH || status_now(p) == SZOMB) {
        errno = ESRCH;      /* xnu's getsid does not see zombies */
        return -1;
    }
    return p->sid;
}
