/*
 * pt_darwin.c: the macOS reader.
 *
 * One proc_listallpids() per scan (pids sorted up front, so rows come out in
 * pid order), then per pid one proc_pidinfo(PROC_PIDTBSDINFO) for identity and
 * status and one proc_pidinfo(PROC_PIDTASKINFO) for the counters. For a caller
 * that is not root, xnu allows both flavors only on the caller's own processes;
 * where PROC_PIDTBSDINFO is denied, sysctl(KERN_PROC_PID), which has no such
 * check, gives the same BSD fields, so a non-root scan still sees every process.
 *
 * Units on macOS (the Python layer relies on them): start_time in microseconds
 * since the epoch; utime and stime in microseconds; rss and vms in pages of
 * getpagesize() bytes; tty_nr the raw dev_t of the controlling tty, 0 for none.
 * pid 0 (kernel_task, its own parent) is left out, as Linux has no pid 0 row.
 *
 * Unknown is flagged, never zero: PT_F_HAVE_SID only where getsid() answered
 * (it does not see zombies); PT_F_HAVE_CPU and PT_F_HAVE_MEM only where
 * PROC_PIDTASKINFO answered (a zombie has no task; another user's is denied).
 * The task info carries the memory figures anyway, so PT_WANT_MEM costs
 * nothing here and is not needed to get them.
 */
#define _DARWIN_C_SOURCE    /* macOS: keep BSD names visible under -std=c99 */
#define _DEFAULT_SOURCE     /* glibc (stub build): getsid, getpagesize */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/param.h>
#include <sys/proc.h>
#include <sys/sysctl.h>
#include <sys/types.h>
#include <unistd.h>
#include <libproc.h>

#include "proctable.h"

/* Ticks per second of pti_total_user/pti_total_system, which count Mach
 * absolute time: 1e9 on Intel, 24e6 on Apple silicon, also under Rosetta,
 * where mach_timebase_info() wrongly says 1/1. hw.tbfrequency tells the truth.
 * Returns the rate; never fails (falls back to nanoseconds, the Intel unit). */
static uint64_t
tick_rate(void)
{
    uint64_t hz = 0;
    uint32_t hz32;
    size_t len = sizeof(hz);

    if (sysctlbyname("hw.tbfrequency", &hz, &len, NULL, 0) != 0)
        return 1000000000u;
    if (len == sizeof(hz32)) {
        memcpy(&hz32, &hz, sizeof(hz32));
        hz = hz32;
    }
    return hz > 0 ? hz : 1000000000u;
}

/* ticks * 1e6 / hz without the overflow of the product (2^64 us-ticks is only
 * days of CPU at 24 MHz). Returns microseconds. */
static int64_t
ticks_to_us(uint64_t ticks, uint64_t hz)
{
    return (int64_t)((ticks / hz) * 1000000u + (ticks % hz) * 1000000u / hz);
}

/* The one-letter state of p_stat (SIDL, a process still being forked, is 'D'). */
static char
state_letter(uint32_t status)
{
    switch (status) {
    case SIDL: return 'D';
    case SRUN: return 'R';
    case SSLEEP: return 'S';
    case SSTOP: return 'T';
    case SZOMB: return 'Z';
    default: return '?';
    }
}

/* Copy a NUL-padded kernel name of at most cap bytes into out->comm. */
static void
set_comm(pt_proc *out, const char *name, size_t cap)
{
    size_t len = 0;

    while (len < cap && len < PT_COMM_MAX && name[len] != '\0')
        len++;
    memcpy(out->comm, name, len);
    out->comm_len = (unsigned char)len;
}

/* Fill the fields both BSD sources share. The exit status is set only for a
 * zombie: in other states p_xstat is stale or a stop signal. */
static void
set_bsd(pt_proc *out, int64_t ppid, int64_t pgid, int64_t uid, uint32_t status,
        uint32_t xstatus, uint32_t tdev, int64_t start_sec, int64_t start_usec)
{
    out->ppid = ppid;
    out->pgid = pgid;
    out->uid = uid;
    out->flags |= PT_F_HAVE_UID;
    out->state = state_letter(status);
    out->tty_nr = tdev == (uint32_t)NODEV ? 0 : (int64_t)tdev;
    out->start_time = start_sec * 1000000 + start_usec;
    if (status == SZOMB) {
        out->exit_code = xstatus;
        out->flags |= PT_F_HAVE_EXIT;
    }
}

/* BSD fields from sysctl(KERN_PROC_PID), for processes whose PROC_PIDTBSDINFO
 * is denied. Returns 0, or -1 with errno ESRCH (gone), EACCES (denied here
 * too: a sandbox), EBADMSG (short reply) or another errno of sysctl. */
static int
read_kinfo(int pid, pt_proc *out)
{
    int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PID, pid};
    struct kinfo_proc kp;
    size_t len = sizeof(kp);

    if (sysctl(mib, 4, &kp, &len, NULL, 0) != 0) {
        if (errno == EPERM)
            errno = EACCES;     /* one errno for "may not read it", as on Linux */
        return -1;
    }
    if (len != sizeof(kp)) {
        errno = len == 0 ? ESRCH : EBADMSG;
        return -1;
    }
    set_bsd(out, kp.kp_eproc.e_ppid, kp.kp_eproc.e_pgid, kp.kp_eproc.e_ucred.cr_uid,
            (uint32_t)kp.kp_proc.p_stat, kp.kp_proc.p_xstat, (uint32_t)kp.kp_eproc.e_tdev,
            kp.kp_proc.p_starttime.tv_sec, kp.kp_proc.p_starttime.tv_usec);
    set_comm(out, kp.kp_proc.p_comm, sizeof(kp.kp_proc.p_comm));
    return 0;
}

/* BSD fields of pid into out. arg 1 asks xnu to look among zombies too.
 * Returns 0, or -1 with errno ESRCH (gone), EACCES (both sources denied),
 * EBADMSG (short reply), or another errno of proc_pidinfo/sysctl. */
static int
read_bsd(int pid, pt_proc *out)
{
    struct proc_bsdinfo bi;
    int n;

    errno = 0;
    n = proc_pidinfo(pid, PROC_PIDTBSDINFO, 1, &bi, (int)sizeof(bi));
    if (n <= 0) {
        if (errno == EPERM || errno == EACCES)
            return read_kinfo(pid, out);
        if (errno == 0)
            errno = EIO;
        return -1;
    }
    if (n != (int)sizeof(bi)) {
        errno = EBADMSG;
        return -1;
    }
    set_bsd(out, bi.pbi_ppid, bi.pbi_pgid, bi.pbi_uid, bi.pbi_status, bi.pbi_xstatus,
            bi.e_tdev, (int64_t)bi.pbi_start_tvsec, (int64_t)bi.pbi_start_tvusec);
    if (bi.pbi_name[0] != '\0')
        set_comm(out, bi.pbi_name, sizeof(bi.pbi_name));
    else
        set_comm(out, bi.pbi_comm, sizeof(bi.pbi_comm));
    return 0;
}

/* Counters and memory of a live pid from PROC_PIDTASKINFO into out, with
 * PT_F_HAVE_CPU | PT_F_HAVE_MEM; *hz is the tick rate, read on first need when
 * 0. Returns 1 (read), 0 (denied: another user's task; out untouched), or -1
 * with errno ESRCH (no task: exited since the BSD read) or EBADMSG. */
static int
read_task(int pid, uint64_t *hz, int64_t page, pt_proc *out)
{
    struct proc_taskinfo ti;
    int n;

    errno = 0;
    n = proc_pidinfo(pid, PROC_PIDTASKINFO, 0, &ti, (int)sizeof(ti));
    if (n == (int)sizeof(ti)) {
        if (*hz == 0)
            *hz = tick_rate();
        out->utime = ticks_to_us(ti.pti_total_user, *hz);
        out->stime = ticks_to_us(ti.pti_total_system, *hz);
        out->num_threads = ti.pti_threadnum;
        out->rss = (int64_t)(ti.pti_resident_size / (uint64_t)page);
        out->vms = (int64_t)(ti.pti_virtual_size / (uint64_t)page);
        out->flags |= PT_F_HAVE_CPU | PT_F_HAVE_MEM;
        return 1;
    }
    if (n > 0) {
        errno = EBADMSG;
        return -1;
    }
    return errno == ESRCH ? -1 : 0;
}

/* Read one process into *out (fully overwritten). Unknown fields stay 0 with
 * their flag clear. A zombie has no task: its utime and stime are gone
 * (PT_F_HAVE_CPU clear), but num_threads holds 1, because a macOS zombie is
 * always a whole process (xnu has no zombie leader with live threads) and 1
 * is what marks a whole-process zombie for Proc.exit, as on Linux.
 * Returns 0, or -1 with errno ESRCH (no such process), EACCES (denied),
 * EBADMSG, or another errno of proc_pidinfo/sysctl. No allocation. */
static int
read_one(int pid, uint64_t *hz, int64_t page, pt_proc *out)
{
    pid_t sid;
    int tries;

    for (tries = 0; tries < 2; tries++) {
        memset(out, 0, sizeof(*out));
        out->pid = pid;
        out->uid = -1;
        if (read_bsd(pid, out) != 0)
            return -1;
        if (out->state == 'Z') {
            out->num_threads = 1;
            break;
        }
        if (read_task(pid, hz, page, out) >= 0)
            break;      /* read, or denied: counters unknown */
        if (errno != ESRCH)
            return -1;
        /* ESRCH: it exited after the BSD read; read again to see the zombie. */
    }
    sid = getsid(pid);      /* xnu's getsid does not see zombies */
    if (sid >= 0) {
        out->sid = sid;
        out->flags |= PT_F_HAVE_SID;
    }
    return 0;
}

int
pt_read(int pid, int want, pt_proc *out)
{
    uint64_t hz = 0;

    (void)want;     /* the task info gives the memory figures anyway */
    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    return read_one(pid, &hz, getpagesize(), out);
}

/* qsort order of two ints. Returns <0, 0, >0. */
static int
cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Every pid (zombies included), sorted, into *out, a malloc'd array the caller
 * frees. Returns the count, or -1 with errno of proc_listallpids or ENOMEM;
 * EAGAIN if the table kept outgrowing the buffer. */
static long
list_pids(int **out)
{
    int *buf = NULL, *grown;
    int want, got, attempt, saved;

    for (attempt = 0; attempt < 4; attempt++) {
        errno = 0;
        want = proc_listallpids(NULL, 0);
        if (want <= 0)
            goto error;
        want += want / 8 + 16;      /* room for processes started meanwhile */
        grown = realloc(buf, (size_t)want * sizeof(int));
        if (grown == NULL)
            goto error;
        buf = grown;
        errno = 0;
        got = proc_listallpids(buf, want * (int)sizeof(int));
        if (got <= 0)
            goto error;
        if (got < want) {       /* a full buffer may have been cut short */
            qsort(buf, (size_t)got, sizeof(int), cmp_int);
            *out = buf;
            return got;
        }
    }
    errno = EAGAIN;
error:
    saved = errno != 0 ? errno : EIO;
    free(buf);
    errno = saved;
    return -1;
}

/* pids[i] is a pid to read: positive (pid 0 is kernel_task) and not a repeat
 * of the one before it in the sorted list. */
static int
pid_listed(const int *pids, long i)
{
    return pids[i] > 0 && (i == 0 || pids[i] != pids[i - 1]);
}

/* The pids to read in pids[0..npids): the room a retry after ENOSPC needs. */
static size_t
count_listed(const int *pids, long npids)
{
    size_t n = 0;

    for (long i = 0; i < npids; i++)
        n += (size_t)pid_listed(pids, i);
    return n;
}

static void
info_reset(pt_scaninfo *info)
{
    info->ndenied = 0;
    info->needed = 0;
    info->bad_pid = 0;
    info->threads = 1;
    info->reader = PT_READER_PROC;
}

/* One pass, on this thread: a row per readable pid into rows[0..cap), the
 * denied ones into info->denied. A row that does not fit is still read (into
 * a spare row), so ENOSPC means a process really needs the room, not that a
 * pid was listed. The pid list is malloc'd and freed here. */
long
pt_snapshot(pt_proc *rows, size_t cap, int want, pt_scaninfo *info)
{
    pt_proc spare;
    int *pids;
    long npids, i;
    size_t count = 0;
    uint64_t hz = 0;
    int64_t page = getpagesize();
    int saved;

    (void)want;     /* the task info gives the memory figures anyway */
    info_reset(info);
    npids = list_pids(&pids);
    if (npids < 0)
        return -1;
    for (i = 0; i < npids; i++) {
        pt_proc *row = count < cap ? &rows[count] : &spare;

        if (!pid_listed(pids, i))
            continue;
        if (read_one(pids[i], &hz, page, row) != 0) {
            if (errno == ESRCH)
                continue;       /* exited during the scan */
            if (errno == EACCES) {
                /* Neither source may read it (a sandbox): listed, not readable;
                 * its owner is hidden with the rest. */
                if (info->denied != NULL && info->ndenied < info->denied_cap) {
                    info->denied[info->ndenied].pid = pids[i];
                    info->denied[info->ndenied].uid = -1;
                }
                info->ndenied++;
                continue;
            }
            saved = errno;
            if (saved == EBADMSG)
                info->bad_pid = pids[i];
            goto error;
        }
        if (row == &spare) {
            info->needed = count_listed(pids, npids);
            saved = ENOSPC;
            goto error;
        }
        count++;
    }
    free(pids);
    return (long)count;

error:
    free(pids);
    info->ndenied = 0;
    errno = saved;
    return -1;
}

/* The benchmark floor: the pid list and one PROC_PIDTBSDINFO per pid, no rows
 * (scratch is not written; cap bounds the count as rows bound pt_snapshot's).
 * nthreads is ignored: the reader has one pass. Returns the number of full
 * replies, or -1 with errno ENOSPC (info->needed: pids listed) or an errno of
 * proc_listallpids, or ENOMEM. Allocates and frees the pid list itself. */
long
pt_floor_scan(pt_proc *scratch, size_t cap, int want, int nthreads, pt_scaninfo *info)
{
    struct proc_bsdinfo bi;
    int *pids;
    long npids, i;
    size_t count = 0;

    (void)scratch;
    (void)want;
    (void)nthreads;
    info_reset(info);
    npids = list_pids(&pids);
    if (npids < 0)
        return -1;
    for (i = 0; i < npids; i++) {
        if (!pid_listed(pids, i) ||
            proc_pidinfo(pids[i], PROC_PIDTBSDINFO, 1, &bi, (int)sizeof(bi)) != (int)sizeof(bi))
            continue;
        if (count == cap) {
            info->needed = count_listed(pids, npids);
            free(pids);
            errno = ENOSPC;
            return -1;
        }
        count++;
    }
    free(pids);
    return (long)count;
}
