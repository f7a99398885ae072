/*
 * pt_linux.c: the Linux reader.
 *
 * One /proc directory fd per scan; getdents64 into a stack buffer; then for
 * each pid, in this order:
 *
 *   openat(procfd, "<pid>/stat")        binds the fd to that process
 *   openat(procfd, "<pid>/statm")       with PT_WANT_MEM: the exact rss and vms
 *   fstatat(procfd, "<pid>")            the owner of the directory: the real
 *                                       effective uid, also for a non-dumpable
 *                                       process or a zombie (task_dump_owner())
 *   read(stat), read(statm), close, close
 *
 * The stat read comes last on purpose: it fails with ESRCH once the process
 * the fd was opened for is gone, so a successful read proves that every path
 * looked up before it (statm, the directory) named that same process, even if
 * the pid is reused a moment later. Short of fds (no fd for statm beside stat),
 * read_tight holds one file at a time and proves the same with two stat reads. A zombie's ptrace check (readlink of cwd)
 * comes after the read, so the stat fd is read once more to prove the same.
 *
 * The stat line's own rss (field 24) is the kernel's per-CPU estimate; statm
 * sums it exactly, as ps, top and psutil show it, so rss comes from statm.
 *
 * Large tables are read by a few threads at once (pt_scan): the pids are
 * listed first, into the caller's row buffer, then threads take chunks of that
 * list through an atomic cursor and fill the rows in place. A scanner
 * (pt_scanner_*) keeps each process's stat and statm fds and an O_PATH fd of
 * its directory open between refreshes: an fstat of the directory fd (its
 * owner now) and a pread of each file, no path walk, no open, no close.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "proctable.h"
#include "pt_internal.h"

/* A stat line is at most ~1.2 KiB (64-byte comm, 52 fields of up to 20 digits). */
#define STAT_BUF 2048
/* statm: seven numbers of up to 20 digits. */
#define STATM_BUF 192
#define DENTS_BUF (64 * 1024)

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The files of one process a read uses; -1 for none. */
struct pfds {
    int stat;
    int statm;
    int dir;          /* O_PATH fd of /proc/<pid> (scanner only) */
};

#define PFDS_NONE {-1, -1, -1}

size_t
pt_pid_path(char *out, long pid, const char *leaf)
{
    char digits[24];
    size_t n = 0, len = 0;

    do {
        digits[n++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (n > 0)
        out[len++] = digits[--n];
    if (leaf != NULL) {
        out[len++] = '/';
        while (*leaf)
            out[len++] = *leaf++;
    }
    out[len] = '\0';
    return len;
}

/* "<pid>/<leaf>" relative to dirfd, or "/proc/<pid>/<leaf>" for AT_FDCWD,
 * into out (at least 40 bytes). */
static void
proc_path(char *out, int dirfd, long pid, const char *leaf)
{
    if (dirfd == AT_FDCWD) {
        memcpy(out, "/proc/", 6);
        pt_pid_path(out + 6, pid, leaf);
    } else {
        pt_pid_path(out, pid, leaf);
    }
}

int
pt_proc_hidepid(char *opt, size_t optlen, long *gid)
{
    char *line = NULL, *p, *q, *sep, *opts;
    size_t cap = 0;
    int hidden = 0;
    FILE *f = fopen("/proc/self/mountinfo", "re");

    *gid = -1;
    if (optlen > 0)
        opt[0] = '\0';
    if (f == NULL)
        return 0;
    while (getline(&line, &cap, f) > 0) {
        /* id parent maj:min root MOUNTPOINT opts [optional...] - fstype source SUPEROPTS */
        p = line;
        for (int field = 0; field < 4 && p != NULL; field++) {
            p = strchr(p, ' ');
            if (p != NULL)
                p++;
        }
        if (p == NULL || strncmp(p, "/proc ", 6) != 0)
            continue;
        sep = strstr(p, " - ");
        if (sep == NULL || strncmp(sep + 3, "proc ", 5) != 0)
            continue;
        opts = strchr(sep + 8, ' ');            /* after the source */
        if (opts == NULL)
            continue;
        /* A later mount on /proc covers the earlier ones: start over. */
        hidden = 0;
        *gid = -1;
        if (optlen > 0)
            opt[0] = '\0';
        for (p = opts + 1; *p && *p != '\n'; p = q + (*q == ',')) {
            size_t len;
            q = p + strcspn(p, ",\n");
            len = (size_t)(q - p);
            if (len > 8 && strncmp(p, "hidepid=", 8) == 0 &&
                !(len == 9 && p[8] == '0') && !(len == 11 && strncmp(p + 8, "off", 3) == 0)) {
                hidden = 1;
                if (optlen > 0)
                    snprintf(opt, optlen, "%.*s", (int)len, p);
            } else if (len > 4 && strncmp(p, "gid=", 4) == 0) {
                *gid = strtol(p + 4, NULL, 10);
            }
        }
    }
    free(line);
    fclose(f);
    return hidden;
}

long
pt_name_to_pid(const char *name)
{
    long v = 0;

    if (*name == '\0')
        return 0;
    for (; *name; name++) {
        if (*name < '0' || *name > '9' || v > (INT32_MAX / 10))
            return 0;
        v = v * 10 + (*name - '0');
    }
    return v > INT32_MAX ? 0 : v;
}

static int
is_denial(int err)
{
    return err == EACCES || err == EPERM;
}

static void
close_files(struct pfds *f)
{
    if (f->stat >= 0)
        close(f->stat);
    if (f->statm >= 0)
        close(f->statm);
    if (f->dir >= 0)
        close(f->dir);
    f->stat = f->statm = f->dir = -1;
}

/* Open the files of pid relative to dirfd (AT_FDCWD: under /proc), stat
 * first, and look up its owner (keepdir: through an O_PATH fd of the
 * directory, kept in f->dir; else by path). Every lookup happens before the
 * stat line is read (see the top of this file). Returns 0, or -1 with errno:
 * ESRCH (no such process), EACCES (this caller may not read it; *uid still
 * holds its owner where that is visible, else -1), or another errno of open
 * (EMFILE...). Nothing stays open on failure. */
static int
open_files(int dirfd, long pid, int want, int keepdir, struct pfds *f, int64_t *uid)
{
    char path[40];
    struct stat st;
    int err;

    *uid = -1;
    f->stat = f->statm = f->dir = -1;
    proc_path(path, dirfd, pid, "stat");
    f->stat = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (f->stat < 0) {
        err = errno;
        if (err == ENOENT)
            err = ESRCH;
        if (is_denial(err)) {
            /* hidepid=1 hides what is inside, not the directory's owner. */
            proc_path(path, dirfd, pid, NULL);
            if (fstatat(dirfd, path, &st, 0) == 0)
                *uid = (int64_t)st.st_uid;
            err = EACCES;
        }
        errno = err;
        return -1;
    }
    if (want & PT_WANT_MEM) {
        proc_path(path, dirfd, pid, "statm");
        f->statm = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (f->statm < 0 && !is_denial(errno)) {
            err = errno == ENOENT ? ESRCH : errno;
            goto error;
        }
        /* Denied statm alone (an LSM): memory unknown, the row still stands. */
    }
    proc_path(path, dirfd, pid, NULL);
    if (keepdir) {
        f->dir = openat(dirfd, path, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (f->dir < 0) {
            err = errno == ENOENT ? ESRCH : errno;
            goto error;
        }
        if (fstat(f->dir, &st) == 0)
            *uid = (int64_t)st.st_uid;
    } else if (fstatat(dirfd, path, &st, 0) == 0) {
        *uid = (int64_t)st.st_uid;
    } else if (errno == ENOENT) {
        err = ESRCH;
        goto error;
    }
    return 0;

error:
    close_files(f);
    errno = err;
    return -1;
}

/* Read fd from offset 0 into buf (pread when from_start, else read), retrying
 * EINTR. Returns the bytes read (> 0), or -1 with errno (ESRCH for an empty
 * read or ENOENT: the process is gone). */
static ssize_t
read_file(int fd, char *buf, size_t size, int from_start)
{
    ssize_t n;

    do {
        n = from_start ? pread(fd, buf, size, 0) : read(fd, buf, size);
    } while (n < 0 && errno == EINTR);
    if (n == 0 || (n < 0 && errno == ENOENT)) {
        errno = ESRCH;
        return -1;
    }
    return n;
}

/* For a zombie whose field 52 reads 0: is that a real "exit 0", or does the
 * kernel hide it from us? Field 52 is gated by ptrace_may_access(READ_FSCREDS),
 * the same check that guards readlink of /proc/<pid>/cwd: EACCES means hidden.
 * A zombie has no fs, so a permitted readlink fails with ENOENT. The readlink
 * goes through the kept directory fd where there is one (it cannot name
 * another process), else by path, after which the stat fd is read again: if
 * it still reads, the path named our zombie. Returns 0 (visible), 1 (masked),
 * or -1 with errno ESRCH (process gone). */
static int
exit_masked(int dirfd, long pid, const struct pfds *f)
{
    char path[40], dummy[8], line[STAT_BUF];
    int masked = 0;

    if (f->dir >= 0) {
        if (readlinkat(f->dir, "cwd", dummy, sizeof(dummy)) < 0 && is_denial(errno))
            masked = 1;
    } else {
        proc_path(path, dirfd, pid, "cwd");
        if (readlinkat(dirfd, path, dummy, sizeof(dummy)) < 0 && is_denial(errno))
            masked = 1;
    }
    if (read_file(f->stat, line, sizeof(line), 1) < 0) {
        errno = ESRCH;
        return -1;
    }
    return masked;
}

/* Read and parse the files of pid (open in *f) into *out. kept: the fds were
 * read before (pread from 0, and the owner is looked up again through f->dir
 * first); else uid is the owner open_files() saw (-1: unknown). Returns 0, or
 * -1 with errno (ESRCH when the process is gone, or the fds name an earlier
 * process of a reused pid; EBADMSG when its line does not parse). */
static int
fill_row(int dirfd, long pid, const struct pfds *f, int kept, int64_t uid, pt_proc *out)
{
    char line[STAT_BUF], mline[STATM_BUF];
    struct stat st;
    ssize_t n;
    int rc, attempt;

    if (kept && f->dir >= 0)
        uid = fstat(f->dir, &st) == 0 ? (int64_t)st.st_uid : -1;
    for (attempt = 0;; attempt++) {
        n = read_file(f->stat, line, sizeof(line), kept || attempt);
        if (n < 0)
            return -1;
        rc = pt_parse_stat(line, (size_t)n, out);
        if (rc == PT_OK && out->pid == pid)
            break;
        if (rc != PT_OK && out->state == 'X') {
            /* A task being released prints pgrp and session as -1 (state X,
             * EXIT_DEAD): it is gone, not a malformed line. */
            errno = ESRCH;
            return -1;
        }
        if (attempt == 1) {
            errno = EBADMSG;
            return -1;
        }
        /* Read once more: a process caught mid-exit reads as gone or parses
         * now; a line that fails twice is reported. */
    }
    if (uid >= 0) {
        out->uid = uid;
        out->flags |= PT_F_HAVE_UID;
    }
    if (f->statm >= 0) {
        n = read_file(f->statm, mline, sizeof(mline), kept);
        if (n < 0) {
            if (errno == ESRCH)
                return -1;
            /* Denied on read (an LSM): memory unknown. */
        } else if (pt_parse_statm(mline, (size_t)n, out) != PT_OK) {
            errno = EBADMSG;
            return -1;
        }
    }
    if (out->state == 'Z' && out->exit_code == 0 && (out->flags & PT_F_HAVE_EXIT)) {
        rc = exit_masked(dirfd, pid, f);
        if (rc < 0)
            return -1;
        if (rc == 1)
            out->flags |= PT_F_EXIT_MASKED;
    }
    return 0;
}

/* Does a process (a thread-group leader) hold pid now, whatever /proc shows
 * this caller? pidfd_open() asks no permission and refuses a free pid (ESRCH)
 * and a thread id that leads no group (EINVAL). Where it is missing or fails
 * otherwise (EMFILE, a seccomp filter): the Tgid line of /proc/<pid>/status,
 * and where that is hidden too (hidepid=2), kill(pid, 0) (EPERM: another
 * user's), which also succeeds for a thread id. Returns 2 (a process, as
 * pidfd_open or the Tgid line says), 1 (something holds the pid, as kill()
 * says: maybe only a thread) or 0 (nothing does); never fails. */
static int
pid_is_process(long pid)
{
    char path[40], buf[512], *p;
    ssize_t n;
    int fd;

#ifdef SYS_pidfd_open
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd >= 0) {
        close(fd);
        return 2;
    }
    if (errno == ESRCH || errno == EINVAL)
        return 0;
#endif
    proc_path(path, AT_FDCWD, pid, "status");
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        n = read_file(fd, buf, sizeof(buf) - 1, 0);
        close(fd);
        if (n > 0) {
            buf[n] = '\0';
            p = strstr(buf, "\nTgid:");
            if (p != NULL)
                return strtol(p + 6, NULL, 10) == pid ? 2 : 0;
        }
    }
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* A read that the kernel's own races may have spoiled for a process that
 * lives on: while a non-leader thread execs (de_thread, as Go's syscall.Exec
 * does), the leader's pid reads for a moment as gone (ESRCH), as a task
 * being released (state X), or as a thread (field 38 = -1). */
static int
read_suspect(int rc, int err, const pt_proc *row)
{
    if (rc != 0)
        return err == ESRCH;
    return row->state == 'X' || (row->flags & PT_F_THREAD) != 0;
}

/* Settling a suspect read (settle): the first SETTLE_READS reads follow each
 * other at once, which is enough on an idle host. The kernel's window (de_thread
 * releasing the old leader) lasts as long as the exec'ing thread is kept off a
 * CPU, which on a loaded host is milliseconds: measured here with two CPU
 * burners, 1 table in about 90,000 missed such a process after three reads.
 * So while a process is known to hold the pid (pidfd_open, or the Tgid line)
 * and its stat reads as gone (ESRCH, or state X), the reader then naps, from
 * SETTLE_NAP_US doubling to SETTLE_NAP_MAX_US, and reads again, for at most
 * SETTLE_WAIT_US of naps in all. Only a pid that a process holds and that
 * reads as gone all that time pays the whole wait (none is known outside that
 * window: a task in state X is released next, and then frees the pid). */
#define SETTLE_READS 3
#define SETTLE_NAP_US 50
#define SETTLE_NAP_MAX_US 5000
#define SETTLE_WAIT_US 200000

/* The nap before read number attempt + 1 of a pid being settled, in µs (0:
 * none), or -1 when the naps so far already add up to SETTLE_WAIT_US. */
static long
settle_nap(int attempt)
{
    long nap = SETTLE_NAP_US, total = 0;

    if (attempt + 1 < SETTLE_READS)
        return 0;
    for (int i = SETTLE_READS - 1; i < attempt; i++) {
        total += nap;
        nap = nap * 2 > SETTLE_NAP_MAX_US ? SETTLE_NAP_MAX_US : nap * 2;
    }
    return total >= SETTLE_WAIT_US ? -1 : nap;
}

/* After a suspect read (read_suspect) of pid, the attempt-th (from 0): 1 when
 * it is worth reading once more (a process holds the pid: at once for the
 * first SETTLE_READS reads, then, for a read as gone, after a nap while
 * pidfd_open or the Tgid line says so, see settle_nap), else 0 with *rc and
 * errno set to the answer to give: ESRCH, or for a row that is there (a
 * process showing field 38 = -1 every time) *rc 0 and the flag cleared. */
static int
settle(long pid, int attempt, int *rc, pt_proc *row)
{
    int process = pid_is_process(pid);

    if (process && attempt + 1 < SETTLE_READS)
        return 1;
    if (process == 2 && (*rc != 0 || row->state == 'X')) {
        /* Reads as gone, not as a thread: that answer comes from the
         * preemptible end of the window; a leader shows field 38 = -1 only
         * under tasklist_lock, with interrupts off. */
        long nap = settle_nap(attempt);

        if (nap > 0) {
            struct timespec ts = {0, nap * 1000L};
            nanosleep(&ts, NULL);
            return 1;
        }
    }
    if (process && *rc == 0 && row->state != 'X') {
        row->flags &= ~PT_F_THREAD;
        return 0;
    }
    *rc = -1;
    errno = ESRCH;
    return 0;
}

static int read_once(int dirfd, long pid, int want, pt_proc *out, int64_t *denied_uid);

/* Out of fds: EMFILE (this process's RLIMIT_NOFILE) or ENFILE (the system's). */
static int
fds_short(int err)
{
    return err == EMFILE || err == ENFILE;
}

/* read_once with one file open at a time, for when there is no fd for statm
 * beside the stat fd: the row without memory, then statm alone, then the row
 * again. statm was opened between two reads of the same (pid, start time), so
 * it was that process's; if the two rows differ (the pid was reused), memory
 * is left unknown. Returns as read_once. */
static int
read_tight(int dirfd, long pid, int want, pt_proc *out, int64_t *denied_uid)
{
    char path[40], mline[STATM_BUF];
    pt_proc first, mem;
    ssize_t n = -1;
    int fd, have_mem = 0;

    if (read_once(dirfd, pid, want & ~PT_WANT_MEM, &first, denied_uid) != 0)
        return -1;
    proc_path(path, dirfd, pid, "statm");
    fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        n = read_file(fd, mline, sizeof(mline), 0);
        close(fd);
    }
    memset(&mem, 0, sizeof(mem));
    if (n > 0)  /* gone or denied: the second read below tells which */
        have_mem = pt_parse_statm(mline, (size_t)n, &mem) == PT_OK;
    if (read_once(dirfd, pid, want & ~PT_WANT_MEM, out, denied_uid) != 0)
        return -1;
    if (have_mem && out->start_time == first.start_time) {
        out->vms = mem.vms;
        out->rss = mem.rss;
        out->flags |= PT_F_HAVE_MEM;
    }
    return 0;
}

/* Read one process relative to dirfd (AT_FDCWD for absolute paths), its files
 * opened and closed here (one at a time when fds run short: read_tight).
 * Returns 0, or -1 with errno (ESRCH: gone; EACCES: denied, with *denied_uid
 * its owner or -1; EMFILE/ENFILE: not even one fd free). */
static int
read_once(int dirfd, long pid, int want, pt_proc *out, int64_t *denied_uid)
{
    struct pfds f = PFDS_NONE;
    int64_t uid;
    int rc, saved;

    if (open_files(dirfd, pid, want, 0, &f, &uid) != 0) {
        if (fds_short(errno) && (want & PT_WANT_MEM))
            return read_tight(dirfd, pid, want, out, denied_uid);
        *denied_uid = uid;
        return -1;
    }
    rc = fill_row(dirfd, pid, &f, 0, uid, out);
    saved = errno;
    close_files(&f);
    errno = saved;
    return rc;
}

/* read_once until its answer is not suspect (read_suspect), at most
 * SETTLE_READS times: a row, or -1 with errno as read_once (a thread id that
 * leads no group, a process that is gone or that shows as a task being
 * released: ESRCH). */
static int
read_one(int dirfd, long pid, int want, pt_proc *out, int64_t *denied_uid)
{
    int rc;

    for (int attempt = 0;; attempt++) {
        rc = read_once(dirfd, pid, want, out, denied_uid);
        if (!read_suspect(rc, errno, out) || !settle(pid, attempt, &rc, out))
            return rc;
    }
}

int
pt_read(int pid, int want, pt_proc *out)
{
    int64_t uid;

    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    if (read_one(AT_FDCWD, pid, want, out, &uid) != 0) {
        char path[40];
        struct stat st;

        if (errno != ESRCH)
            return -1;
        /* Gone, or hidden (hidepid=2: no /proc/<pid> at all for us, while a
         * dying task still has its directory) with a process holding it. */
        proc_path(path, AT_FDCWD, pid, NULL);
        errno = stat(path, &st) != 0 && errno == ENOENT && pid_is_process(pid) ? EACCES : ESRCH;
        return -1;
    }
    if (out->flags & PT_F_THREAD) {
        /* /proc/<tid>/stat exists for every thread, listed or not: a thread id
         * that is not a thread-group leader names no process. */
        errno = ESRCH;
        return -1;
    }
    return 0;
}

/* Does the stat line buf[0..n) say a zombie whose field 52 (exit_code) reads
 * 0, the one row fill_row() makes the ptrace check for? No other parsing: the
 * state after the last ')' and the 50th token after it. */
static int
zombie_status_zero(const char *buf, size_t n)
{
    const char *p = memrchr(buf, ')', n), *end = buf + n;
    int field = 3;

    if (p == NULL || p + 2 >= end || p[2] != 'Z')
        return 0;
    for (p += 2; p < end && field < 52; p++)
        if (*p == ' ')
            field++;
    return field == 52 && p < end && *p == '0' && (p + 1 == end || p[1] == ' ' || p[1] == '\n');
}

/* The reads of fill_row on open files, no parsing: the floor's unit of work
 * (kept: pread, after an fstat of the kept directory fd). A zombie whose
 * status reads 0 also costs the ptrace check and the stat re-read the reader
 * makes for it (and only such a zombie, as fill_row). Returns the bytes
 * read, or -1 with errno. */
static long
floor_reads(int dirfd, long pid, const struct pfds *f, int kept)
{
    char line[STAT_BUF], mline[STATM_BUF];
    struct stat st;
    ssize_t n, m = 0;

    if (kept && f->dir >= 0)
        (void)fstat(f->dir, &st);
    n = read_file(f->stat, line, sizeof(line), kept);
    if (n < 0)
        return -1;
    if (f->statm >= 0)
        m = read_file(f->statm, mline, sizeof(mline), kept);
    if (zombie_status_zero(line, (size_t)n))
        (void)exit_masked(dirfd, pid, f);
    return (long)(n + (m > 0 ? m : 0));
}

/* The system calls of read_one, no parsing. Returns the bytes read, or -1
 * with errno. */
static long
floor_one(int dirfd, long pid, int want)
{
    struct pfds f = PFDS_NONE;
    int64_t uid;
    long n;
    int saved;

    if (open_files(dirfd, pid, want, 0, &f, &uid) != 0) {
        n = -1;
    } else {
        n = floor_reads(dirfd, pid, &f, 0);
        saved = errno;
        close_files(&f);
        errno = saved;
    }
    if (n < 0 && errno == ESRCH) {
        /* The reader's check before it believes "gone" (read_one, settle). */
        saved = errno;
        (void)pid_is_process(pid);
        errno = saved;
    }
    return n;
}

long
pt_floor_read(int pid, int want)
{
    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    return floor_one(AT_FDCWD, pid, want);
}

static int
cmp_pid(const void *a, const void *b)
{
    int64_t x = ((const pt_proc *)a)->pid, y = ((const pt_proc *)b)->pid;
    return (x > y) - (x < y);
}

/* List every pid of /proc (procfd at offset 0) into rows[0..cap).pid, in
 * getdents64 order (ascending on every kernel seen; sorted here if not).
 * Returns the number of pids listed, which may exceed cap (only the first
 * cap are stored), or -1 with errno. */
static long
list_pids(int procfd, pt_proc *rows, size_t cap)
{
    char dents[DENTS_BUF];
    size_t count = 0;
    int sorted = 1;
    long nread;

    for (;;) {
        nread = syscall(SYS_getdents64, procfd, dents, sizeof(dents));
        if (nread < 0)
            return -1;
        if (nread == 0)
            break;
        for (long off = 0; off < nread;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            long pid = pt_name_to_pid(d->d_name);
            off += d->d_reclen;
            if (pid <= 0)
                continue;
            if (count < cap) {
                rows[count].pid = pid;
                if (count > 0 && rows[count - 1].pid > pid)
                    sorted = 0;
            }
            count++;
        }
    }
    if (!sorted && count <= cap)
        qsort(rows, count, sizeof(*rows), cmp_pid);
    return (long)count;
}

/* CPUs this thread may run on (at least 1). */
static int
usable_cpus(void)
{
    cpu_set_t set;
    long n;

    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        n = CPU_COUNT(&set);
    } else {
        n = sysconf(_SC_NPROCESSORS_ONLN);
    }
    return n < 1 ? 1 : (int)n;
}

/* Threads runnable on the whole host now, this one included (the 4th field of
 * /proc/loadavg, "running/total"); 1 when it cannot be read. */
static int
runnable_now(void)
{
    char buf[128], *p;
    ssize_t n;
    long v;
    int fd;

    fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = '\0';
    /* "0.50 0.40 0.30 2/345 1234" */
    p = buf;
    for (int field = 0; field < 3 && p != NULL; field++) {
        p = strchr(p, ' ');
        if (p != NULL)
            p++;
    }
    if (p == NULL)
        return 1;
    v = strtol(p, NULL, 10);
    return v < 1 ? 1 : (v > 4096 ? 4096 : (int)v);
}

int
pt_scan_threads(size_t npids, int nthreads)
{
    size_t most;
    int cpus, free_cpus, n;

    if (nthreads == 1 || npids < 2)
        return 1;
    if (nthreads <= 0) {
        if (npids < PT_PARALLEL_MIN)
            return 1;
        cpus = usable_cpus();
        /* A second thread pays only on a CPU nobody else wants now: on a
         * busy host it waits for its turn and the scan takes longer. */
        free_cpus = cpus - (runnable_now() - 1);
        if (free_cpus < 1)
            free_cpus = 1;
        most = npids / (PT_PARALLEL_MIN / 2);   /* each thread gets enough to pay */
        n = free_cpus < (int)most || most > PT_THREADS_MAX ? free_cpus : (int)most;
    } else {
        n = nthreads;
    }
    if (n > PT_THREADS_MAX)
        n = PT_THREADS_MAX;
    if ((size_t)n > npids)
        n = (int)npids;
    return n < 1 ? 1 : n;
}

/* ---- the threaded pass ---------------------------------------------------- */

#define CHUNK 32        /* pids a thread takes from the cursor at a time */

enum job_kind { JOB_SNAPSHOT, JOB_FLOOR, JOB_SCANNER, JOB_SCANNER_FLOOR };

/* Row marks while a pass runs (in pt_proc.pid; compact() removes them). */
#define ROW_DROPPED 0       /* exited during the scan */
#define ROW_DENIED  (-1)    /* this caller may not read it; uid in row->uid */

/* One pass over rows[0..n), shared by its threads. Fields below "shared" are
 * touched through __atomic builtins only. */
struct job {
    enum job_kind kind;
    int procfd;
    int want;
    pt_proc *rows;
    pt_fdslot *slots;       /* scanner jobs: slots[i] is rows[i]'s kept fds */
    size_t n;
    int fds_each;           /* scanner jobs: fds kept per process */
    int hidepid;            /* scanner jobs: re-check access of kept fds (pt_scanner) */
    /* shared */
    size_t cursor;
    long budget;            /* scanner jobs: fds that may still be kept */
    long floor_count;       /* floor jobs: processes read */
    int err;                /* first error other than ESRCH/denial, 0 if none */
    long err_pid;
};

static void
job_fail(struct job *job, int err, long pid)
{
    int none = 0;

    if (__atomic_compare_exchange_n(&job->err, &none, err, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        __atomic_store_n(&job->err_pid, pid, __ATOMIC_SEQ_CST);
}

/* Take n fds of the keep budget; 0 when not that many are left. */
static int
take_budget(struct job *job, long n)
{
    long b = __atomic_load_n(&job->budget, __ATOMIC_RELAXED);

    while (b >= n) {
        if (__atomic_compare_exchange_n(&job->budget, &b, b - n, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

static void
give_budget(struct job *job, long n)
{
    __atomic_add_fetch(&job->budget, n, __ATOMIC_RELAXED);
}

/* After a failed read of row i (errno set): drop it (gone), mark it denied, or
 * fail the pass. */
static void
row_failed(struct job *job, pt_proc *row, long pid, int64_t uid)
{
    int err = errno;

    if (err == EACCES) {
        row->pid = ROW_DENIED;
        row->uid = uid;
        row->exit_code = pid;       /* the pid, kept for compact() */
        return;
    }
    row->pid = ROW_DROPPED;
    if (err != ESRCH)
        job_fail(job, err, pid);
}

/* slot from a struct pfds and back */
static struct pfds
slot_files(const pt_fdslot *slot)
{
    struct pfds f = {slot->stat, slot->statm, slot->dir};
    return f;
}

static void
set_slot(pt_fdslot *slot, const struct pfds *f)
{
    slot->stat = f->stat;
    slot->statm = f->statm;
    slot->dir = f->dir;
}

/* fds a struct pfds holds */
static long
nfiles(const struct pfds *f)
{
    return (f->stat >= 0) + (f->statm >= 0) + (f->dir >= 0);
}

/* Row i of a scanner pass (floor: no parsing, no row). Keeps slots[i] naming
 * fds that are open, or -1. */
static void
scanner_one(struct job *job, size_t i, int floor, long *floor_count)
{
    pt_fdslot *slot = &job->slots[i];
    pt_proc *row = &job->rows[i];
    long pid = slot->pid, held;
    struct pfds f = slot_files(slot);
    int64_t uid = -1;
    int keep, rc;

    if (f.stat >= 0 && job->hidepid && f.dir >= 0 &&
        faccessat(f.dir, "stat", R_OK, AT_EACCESS) != 0 &&
        (is_denial(errno) || errno == ENOENT)) {
        /* hidepid: the process turned unreadable to us since its fds were
         * opened (a non-dumpable one); kept fds skip that check. As a fresh
         * open would: denied (hidepid=1), or not there (hidepid=2). */
        struct stat st;
        int err = errno;

        uid = err != ENOENT && fstat(f.dir, &st) == 0 ? (int64_t)st.st_uid : -1;
        give_budget(job, nfiles(&f));
        close_files(&f);
        set_slot(slot, &f);
        if (floor)
            return;
        if (err == ENOENT) {
            row->pid = ROW_DROPPED;
            return;
        }
        errno = EACCES;
        row_failed(job, row, pid, uid);
        return;
    }
    if (f.stat >= 0) {
        held = nfiles(&f);
        rc = floor ? (floor_reads(job->procfd, pid, &f, 1) < 0 ? -1 : 0)
                   : fill_row(job->procfd, pid, &f, 1, -1, row);
        if (rc == 0 && !floor && read_suspect(rc, 0, row)) {
            rc = -1;        /* read afresh below, and settled there */
            errno = ESRCH;
        }
        if (rc == 0) {
            if (floor)
                (*floor_count)++;
            return;
        }
        if (errno != ESRCH) {
            job_fail(job, errno, pid);
            return;
        }
        /* The kept fds' process is gone; the pid was listed, so it may have
         * been reused: look again below, as for a new pid. */
        close_files(&f);
        set_slot(slot, &f);
        give_budget(job, held);
    }
    for (int attempt = 0;; attempt++) {
        keep = take_budget(job, job->fds_each);
        if (open_files(job->procfd, pid, job->want, keep, &f, &uid) != 0) {
            if (keep)
                give_budget(job, job->fds_each);
            if (!keep && !floor && fds_short(errno)) {
                /* No fd for statm beside stat: one file at a time (a kept
                 * scanner gives its fds back first: the caller degrades it). */
                if (read_one(job->procfd, pid, job->want, row, &uid) != 0)
                    row_failed(job, row, pid, uid);
                return;
            }
            if (floor) {
                if (errno != ESRCH && errno != EACCES)
                    job_fail(job, errno, pid);
                return;
            }
            rc = -1;
            if (read_suspect(rc, errno, row) && settle(pid, attempt, &rc, row))
                continue;
            row_failed(job, row, pid, uid);
            return;
        }
        held = keep ? nfiles(&f) : 0;
        if (keep)
            give_budget(job, job->fds_each - held);     /* statm denied: one fd fewer */
        if (floor) {
            if (floor_reads(job->procfd, pid, &f, 0) >= 0)
                (*floor_count)++;
            rc = 0;
        } else {
            rc = fill_row(job->procfd, pid, &f, 0, uid, row);
        }
        if (!floor && read_suspect(rc, errno, row)) {
            /* As read_one: read again while a process holds the pid; the
             * fds are not kept this time (the next refresh opens afresh). */
            close_files(&f);
            give_budget(job, held);
            if (settle(pid, attempt, &rc, row))
                continue;
            if (rc != 0)
                row_failed(job, row, pid, -1);
            return;
        }
        if (rc != 0) {
            int saved = errno;
            close_files(&f);
            give_budget(job, held);
            errno = saved;
            row_failed(job, row, pid, -1);
            return;
        }
        if (keep)
            set_slot(slot, &f);
        else
            close_files(&f);
        return;
    }
}

static void
job_one(struct job *job, size_t i, long *floor_count)
{
    pt_proc *row = &job->rows[i];
    long pid;
    int64_t uid = -1;

    switch (job->kind) {
    case JOB_SNAPSHOT:
        pid = (long)row->pid;
        if (read_one(job->procfd, pid, job->want, row, &uid) != 0)
            row_failed(job, row, pid, uid);
        break;
    case JOB_FLOOR:
        if (floor_one(job->procfd, (long)row->pid, job->want) >= 0)
            (*floor_count)++;
        break;
    case JOB_SCANNER:
        scanner_one(job, i, 0, floor_count);
        break;
    case JOB_SCANNER_FLOOR:
        scanner_one(job, i, 1, floor_count);
        break;
    }
}

static void *
job_worker(void *arg)
{
    struct job *job = arg;
    long floor_count = 0;

    for (;;) {
        size_t start, end;

        if (__atomic_load_n(&job->err, __ATOMIC_RELAXED) != 0)
            break;
        start = __atomic_fetch_add(&job->cursor, CHUNK, __ATOMIC_RELAXED);
        if (start >= job->n)
            break;
        end = start + CHUNK < job->n ? start + CHUNK : job->n;
        for (size_t i = start; i < end; i++)
            job_one(job, i, &floor_count);
    }
    if (floor_count)
        __atomic_add_fetch(&job->floor_count, floor_count, __ATOMIC_RELAXED);
    return NULL;
}

/* Run job over nthreads threads, this one included. Threads that cannot be
 * started leave their share to the others. Returns the threads that ran. */
static int
job_run(struct job *job, int nthreads)
{
    pthread_t tids[PT_THREADS_MAX];
    sigset_t all, old;
    int started = 0;

    if (nthreads > 1) {
        /* Signals go to the caller's thread, never to a worker. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (int t = 1; t < nthreads && t < PT_THREADS_MAX; t++) {
            if (pthread_create(&tids[started], NULL, job_worker, job) != 0)
                break;
            started++;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    job_worker(job);
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    return started + 1;
}

/* Remove the dropped and denied rows (the denied ones go to info->denied, in
 * pid order) and, for a scanner, move the slots that keep fds into slots_out
 * (which may be job->slots itself). Returns the rows left; *nkept is set to
 * the slots kept. */
static size_t
compact(struct job *job, pt_scaninfo *info, pt_fdslot *slots_out, size_t *nkept)
{
    size_t out = 0, kept = 0;

    for (size_t i = 0; i < job->n; i++) {
        pt_proc *row = &job->rows[i];
        if (job->slots != NULL && job->slots[i].stat >= 0) {
            if (row->pid <= 0) {        /* not expected; never leak them */
                struct pfds f = slot_files(&job->slots[i]);
                close_files(&f);
            } else {
                slots_out[kept++] = job->slots[i];
            }
        }
        if (row->pid == ROW_DENIED) {
            if (info->denied != NULL && info->ndenied < info->denied_cap) {
                info->denied[info->ndenied].pid = row->exit_code;
                info->denied[info->ndenied].uid = row->uid;
            }
            info->ndenied++;
            continue;
        }
        if (row->pid == ROW_DROPPED)
            continue;
        if (out != i)
            job->rows[out] = *row;
        out++;
    }
    if (nkept != NULL)
        *nkept = kept;
    return out;
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

static long
scan(enum job_kind kind, pt_proc *rows, size_t cap, int want, int nthreads,
     pt_scaninfo *info)
{
    struct job job;
    long listed;
    int procfd, saved;

    info_reset(info);
    if (kind == JOB_SNAPSHOT) {
        /* The BPF reader, where it runs (pt_bpf.c): the same rows. */
        long n = pt_bpf_scan(rows, cap, want, info, NULL);
        if (n != PT_BPF_DECLINED)
            return n;
    }
    procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (procfd < 0)
        return -1;
    listed = list_pids(procfd, rows, cap);
    if (listed < 0)
        goto error_errno;
    if ((size_t)listed > cap) {
        info->needed = (size_t)listed;
        saved = ENOSPC;
        goto error;
    }
    memset(&job, 0, sizeof(job));
    job.kind = kind;
    job.procfd = procfd;
    job.want = want;
    job.rows = rows;
    job.n = (size_t)listed;
    info->threads = job_run(&job, pt_scan_threads(job.n, nthreads));
    close(procfd);
    if (fds_short(job.err) && info->threads > 1) {
        /* Each thread holds its own files: one thread needs only one at a
         * time, so a table read works with two fds free. */
        return scan(kind, rows, cap, want, 1, info);
    }
    if (job.err != 0) {
        if (job.err == EBADMSG)
            info->bad_pid = job.err_pid;
        errno = job.err;
        return -1;
    }
    if (kind == JOB_FLOOR)
        return job.floor_count;
    return (long)compact(&job, info, NULL, NULL);

error_errno:
    saved = errno;
error:
    close(procfd);
    errno = saved;
    return -1;
}

/* A table read through scan(): a reader="auto" read that got its rows counts
 * toward the BPF program's load (pt_bpf_auto_read_done). */
static long
table_read(pt_proc *rows, size_t cap, int want, int nthreads, pt_scaninfo *info)
{
    long n = scan(JOB_SNAPSHOT, rows, cap, want, nthreads, info);

    if (!(want & (PT_WANT_PROCFS | PT_WANT_BPF)))
        pt_bpf_auto_read_done(n);
    return n;
}

long
pt_scan(pt_proc *rows, size_t cap, int want, int nthreads, pt_scaninfo *info)
{
    return table_read(rows, cap, want, nthreads, info);
}

long
pt_snapshot(pt_proc *rows, size_t cap, int want, pt_scaninfo *info)
{
    return table_read(rows, cap, want, 1, info);
}

long
pt_floor_scan(pt_proc *scratch, size_t cap, int want, int nthreads, pt_scaninfo *info)
{
    return scan(JOB_FLOOR, scratch, cap, want, nthreads, info);
}

/* ---- scanner -------------------------------------------------------------- */

int
pt_scanner_init(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap,
                size_t max_fds, int want)
{
    memset(sc, 0, sizeof(*sc));
    sc->slots = slots;
    sc->spare = spare;
    sc->cap = cap;
    sc->max_fds = max_fds;
    sc->procfd = -1;
    sc->want = want;
    sc->hidepid = -1;
    return 0;
}

int
pt_scanner_resize(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap)
{
    if (cap < sc->nslots) {
        errno = ENOSPC;
        return -1;
    }
    if (sc->nslots > 0)
        memcpy(slots, sc->slots, sc->nslots * sizeof(*slots));
    sc->slots = slots;
    sc->spare = spare;
    sc->cap = cap;
    return 0;
}

/* fds a slot holds */
static long
slot_fds(const pt_fdslot *slot)
{
    return (slot->stat >= 0) + (slot->statm >= 0) + (slot->dir >= 0);
}

long
pt_scanner_close(pt_scanner *sc)
{
    long closed = 0;

    for (size_t i = 0; i < sc->nslots; i++) {
        struct pfds f = slot_files(&sc->slots[i]);
        closed += slot_fds(&sc->slots[i]);
        close_files(&f);
    }
    sc->nslots = 0;
    if (sc->procfd >= 0) {
        close(sc->procfd);
        sc->procfd = -1;
        closed++;
    }
    sc->open_fds = 0;
    return closed;
}

static long
scanner_pass(pt_scanner *sc, enum job_kind kind, pt_proc *rows, size_t cap, int nthreads,
             pt_scaninfo *info)
{
    struct job job;
    pt_fdslot *old = sc->slots, *next = sc->spare;
    size_t nold = sc->nslots, i, j, kept, room, nrows;
    long listed, budget, held;
    int procfd, saved;

    info_reset(info);
    if (kind == JOB_SCANNER) {
        /* Where the BPF reader runs a refresh is one BPF pass: no fds kept. */
        long n = pt_bpf_scan(rows, cap, sc->want, info, NULL);
        if (n != PT_BPF_DECLINED) {
            if (n >= 0 && (sc->nslots > 0 || sc->procfd >= 0))
                pt_scanner_close(sc);
            return n;
        }
    }
    procfd = sc->procfd;
    if (procfd >= 0) {
        if (lseek(procfd, 0, SEEK_SET) < 0)
            return -1;
    } else {
        procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (procfd < 0)
            return -1;
    }
    room = cap < sc->cap ? cap : sc->cap;
    listed = list_pids(procfd, rows, room);
    if (listed < 0 || (size_t)listed > room) {
        saved = listed < 0 ? errno : ENOSPC;
        if (listed >= 0)
            info->needed = (size_t)listed;
        if (sc->procfd < 0)
            close(procfd);
        errno = saved;
        return -1;
    }

    /* Merge the kept fds (sorted by pid) into the new pid list: a listed pid
     * takes its kept fds; the fds of a pid no longer listed are closed. */
    held = 0;
    for (i = 0, j = 0; j < (size_t)listed; j++) {
        int32_t pid = (int32_t)rows[j].pid;
        while (i < nold && old[i].pid < pid) {
            struct pfds f = slot_files(&old[i++]);
            close_files(&f);
        }
        next[j].pid = pid;
        next[j].stat = next[j].statm = next[j].dir = -1;
        if (i < nold && old[i].pid == pid) {
            next[j] = old[i++];
            held += slot_fds(&next[j]);
        }
    }
    for (; i < nold; i++) {
        struct pfds f = slot_files(&old[i]);
        close_files(&f);
    }
    /* From here on the kept fds live in next[]; old[] is scratch. */
    sc->slots = next;
    sc->spare = old;
    sc->nslots = (size_t)listed;
    sc->procfd = sc->max_fds >= 1 ? procfd : -1;

    budget = (long)sc->max_fds - (sc->procfd >= 0 ? 1 : 0) - held;

    memset(&job, 0, sizeof(job));
    job.kind = kind;
    job.procfd = procfd;
    job.want = sc->want;
    job.rows = rows;
    job.slots = next;
    job.n = (size_t)listed;
    job.fds_each = 2 + ((sc->want & PT_WANT_MEM) != 0);
    if (sc->hidepid < 0) {
        long gid;
        sc->hidepid = pt_proc_hidepid(NULL, 0, &gid);
    }
    job.hidepid = sc->hidepid;
    job.budget = budget > 0 ? budget : 0;
    info->threads = job_run(&job, pt_scan_threads(job.n, nthreads));

    /* Keep only the slots with fds, sorted by pid, in place. */
    nrows = compact(&job, info, next, &kept);
    sc->nslots = kept;
    held = 0;
    for (i = 0; i < kept; i++)
        held += slot_fds(&next[i]);
    sc->open_fds = (size_t)held + (sc->procfd >= 0 ? 1 : 0);
    if (sc->procfd < 0)
        close(procfd);
    if (job.err != 0) {
        info->bad_pid = job.err == EBADMSG ? job.err_pid : 0;
        errno = job.err;
        return -1;
    }
    return kind == JOB_SCANNER_FLOOR ? job.floor_count : (long)nrows;
}

long
pt_scanner_refresh(pt_scanner *sc, pt_proc *rows, size_t cap, int nthreads, pt_scaninfo *info)
{
    long n = scanner_pass(sc, JOB_SCANNER, rows, cap, nthreads, info);

    /* As scan(): threads that ran out of fds between them, one thread may not. */
    if (n < 0 && fds_short(errno) && info->threads > 1)
        n = scanner_pass(sc, JOB_SCANNER, rows, cap, 1, info);
    if (!(sc->want & (PT_WANT_PROCFS | PT_WANT_BPF)))
        pt_bpf_auto_read_done(n);
    return n;
}

long
pt_scanner_floor(pt_scanner *sc, pt_proc *rows, size_t cap, int nthreads, pt_scaninfo *info)
{
    return scanner_pass(sc, JOB_SCANNER_FLOOR, rows, cap, nthreads, info);
}
