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
 * since the epoch; utime and stime in microseconds; rss in pages of
 * getpagesize() bytes; tty_nr the raw dev_t of the controlling tty, 0 for none.
 * pid 0 (kernel_task, its own parent) is left out, as Linux has no pid 0 row.
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
 * is denied. Returns 0, or -1 with errno ESRCH (gone), EBADMSG (short reply)
 * or an errno of sysctl. */
static int
read_kinfo(int pid, pt_proc *out)
{
    int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PID, pid};
    struct kinfo_proc kp;
    size_t len = sizeof(kp);

    if (sysctl(mib, 4, &kp, &len, NULL, 0) != 0)
        return -1;
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
 * Returns 0, or -1 with errno ESRCH (gone), EBADMSG (short reply), or another
 * errno of proc_pidinfo/sysctl. */
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

/* Read one process into *out (fully overwritten); *hz is the tick rate, read
 * on first need when 0. Counters: a zombie has no task, so utime/stime/rss are
 * 0 and num_threads 1; where the task info is denied (another user's process)
 * they are 0 and num_threads 0, which no live process has: "counters unknown".
 * Returns 0, or -1 with errno ESRCH (no such process), EBADMSG, or another
 * errno of proc_pidinfo/sysctl. No allocation. */
static int
read_one(int pid, uint64_t *hz, int64_t page, pt_proc *out)
{
    struct proc_taskinfo ti;
    pid_t sid;
    int n, tries;

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
        errno = 0;
        n = proc_pidinfo(pid, PROC_PIDTASKINFO, 0, &ti, (int)sizeof(ti));
        if (n == (int)sizeof(ti)) {
            if (*hz == 0)
                *hz = tick_rate();
            out->utime = ticks_to_us(ti.pti_total_user, *hz);
            out->stime = ticks_to_us(ti.pti_total_system, *hz);
            out->rss = (int64_t)(ti.pti_resident_size / (uint64_t)page);
            out->num_threads = ti.pti_threadnum;
            break;
        }
        if (n > 0) {
            errno = EBADMSG;
            return -1;
        }
        if (errno != ESRCH)
            break;      /* denied: counters unknown, num_threads 0 */
        /* ESRCH: it exited after the BSD read; read again to see the zombie. */
    }
    sid = getsid(pid);      /* fails for a zombie: sid 0 */
    out->sid = sid < 0 ? 0 : sid;
    return 0;
}

/* One process into the caller's *out. Returns 0, or -1 with errno EINVAL
 * (pid <= 0), ESRCH (no such process), EBADMSG, or an errno of libproc. */
int
pt_read(int pid, pt_proc *out)
{
    uint64_t hz = 0;

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

/* The whole table, sorted by pid, into the caller's rows[0..cap). Returns the
 * row count, or -1 with errno ENOSPC (*needed: rows to make room for), EBADMSG
 * (*needed: the pid), or an errno of libproc/malloc. The pid list is malloc'd
 * and freed here; nothing is left for the caller to free. */
long
pt_snapshot(pt_proc *rows, size_t cap, size_t *needed)
{
    int *pids;
    long npids, i;
    size_t count = 0;
    uint64_t hz = 0;
    int64_t page = getpagesize();
    int saved;

    *needed = 0;
    npids = list_pids(&pids);
    if (npids < 0)
        return -1;
    for (i = 0; i < npids; i++) {
        if (pids[i] <= 0 || (i > 0 && pids[i] == pids[i - 1]))
            continue;
        if (count == cap) {
            /* Out of room: count the rest unread, an upper bound (some may
             * be gone), so that one retry with that much room suffices. */
            for (; i < npids; i++)
                count += pids[i] > 0 && (i == 0 || pids[i] != pids[i - 1]);
            saved = ENOSPC;
            goto error;
        }
        if (read_one(pids[i], &hz, page, &rows[count]) != 0) {
            if (errno == ESRCH)
                continue;       /* exited during the scan */
            saved = errno;
            if (saved == EBADMSG)
                count = (size_t)pids[i];
            goto error;
        }
        count++;
    }
    free(pids);
    *needed = count;
    return (long)count;

error:
    free(pids);
    *needed = count;
    errno = saved;
    return -1;
}

/* The benchmark floor: the pid list and one PROC_PIDTBSDINFO per pid, no rows.
 * Returns the number of full replies, or -1 with errno of proc_listallpids or
 * ENOMEM. Allocates and frees the pid list itself. */
long
pt_floor_scan(void)
{
    struct proc_bsdinfo bi;
    int *pids;
    long npids, i, count = 0;

    npids = list_pids(&pids);
    if (npids < 0)
        return -1;
    for (i = 0; i < npids; i++) {
        if (pids[i] > 0 &&
            proc_pidinfo(pids[i], PROC_PIDTBSDINFO, 1, &bi, (int)sizeof(bi)) == (int)sizeof(bi))
            count++;
    }
    free(pids);
    return count;
}
