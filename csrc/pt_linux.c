/*
 * pt_linux.c: the Linux reader.
 *
 * One /proc directory fd per scan; getdents64 into a stack buffer; for each
 * pid one openat(procfd, "<pid>/stat"), one read, one fstat of that same fd
 * (for the uid), one close. No path walk from "/", no allocation per process.
 *
 * Large tables are read by a few threads at once (pt_scan): the pids are
 * listed first, into the caller's row buffer, then threads take chunks of that
 * list through an atomic cursor and fill the rows in place. A scanner
 * (pt_scanner_*) keeps the stat fds open between refreshes and re-reads them
 * with pread, which skips the path walk, the open and the close.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "proctable.h"

/* A stat line is at most ~1.2 KiB (64-byte comm, 52 fields of up to 20 digits). */
#define STAT_BUF 2048
#define DENTS_BUF (64 * 1024)

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* Write "<pid>/<leaf>" into out (at least 32 bytes). Returns its length. */
static size_t
pid_path(char *out, long pid, const char *leaf)
{
    char digits[24];
    size_t n = 0, len = 0;

    do {
        digits[n++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (n > 0)
        out[len++] = digits[--n];
    out[len++] = '/';
    while (*leaf)
        out[len++] = *leaf++;
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
        pid_path(out + 6, pid, leaf);
    } else {
        pid_path(out, pid, leaf);
    }
}

/* Parse a d_name of digits only into a pid; 0 when it is not a pid dir. */
static long
name_to_pid(const char *name)
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

/* For a zombie whose field 52 reads 0: is that a real "exit 0", or does the
 * kernel hide it from us? Field 52 is gated by ptrace_may_access(READ_FSCREDS),
 * the same check that guards readlink of /proc/<pid>/cwd: EACCES means hidden.
 * A zombie has no fs, so a permitted readlink fails with ENOENT; a vanished
 * process gives ENOENT too, so statfd is re-read to tell the two apart.
 * Returns 0 (visible), 1 (masked), or -1 with errno ESRCH (process gone). */
static int
exit_masked(int dirfd, long pid, int statfd)
{
    char path[40], dummy[8], line[STAT_BUF];

    proc_path(path, dirfd, pid, "cwd");
    if (readlinkat(dirfd, path, dummy, sizeof(dummy)) >= 0)
        return 0;
    if (errno == EACCES || errno == EPERM)
        return 1;
    if (pread(statfd, line, sizeof(line), 0) < 0) {
        errno = ESRCH;
        return -1;
    }
    return 0;
}

/* The effective uid from /proc/<pid>/status. Used for zombies only: /proc
 * shows a process without an mm (a zombie) as owned by root, which would
 * report a wrong uid. Returns 0, or -1 with errno. */
static int
status_euid(int dirfd, long pid, int64_t *uid)
{
    char path[40], buf[STAT_BUF];
    ssize_t n;
    int fd;

    proc_path(path, dirfd, pid, "status");
    fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        errno = ESRCH;
        return -1;
    }
    buf[n] = '\0';
    /* "Uid:\t<real>\t<effective>\t<saved>\t<fs>" */
    char *line = strstr(buf, "\nUid:");
    if (line == NULL) {
        errno = EBADMSG;
        return -1;
    }
    char *p = line + 5, *end;
    strtoul(p, &end, 10);                   /* real */
    if (end == p) {
        errno = EBADMSG;
        return -1;
    }
    p = end;
    unsigned long euid = strtoul(p, &end, 10);
    if (end == p) {
        errno = EBADMSG;
        return -1;
    }
    *uid = (int64_t)euid;
    return 0;
}

/* Open "<pid>/stat" relative to dirfd (AT_FDCWD: under /proc). Returns the
 * fd, or -1 with errno (ESRCH when there is no such process). */
static int
open_stat(int dirfd, long pid)
{
    char path[40];
    int fd;

    proc_path(path, dirfd, pid, "stat");
    fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0 && errno == ENOENT)
        errno = ESRCH;
    return fd;
}

/* Read the stat line of pid from its open stat fd (from offset 0 when kept
 * open: pread) and fill *out. The caller keeps fd. Returns 0, or -1 with
 * errno (ESRCH when the process is gone, or fd names an earlier process of
 * a reused pid). */
static int
fill_row(int dirfd, long pid, int fd, int kept, pt_proc *out)
{
    char line[STAT_BUF];
    struct stat st;
    ssize_t n;
    int rc, attempt;

    for (attempt = 0;; attempt++) {
        do {
            /* A re-read must start over at offset 0 as well. */
            n = kept || attempt ? pread(fd, line, sizeof(line), 0)
                                : read(fd, line, sizeof(line));
        } while (n < 0 && errno == EINTR);
        if (n <= 0) {
            if (n == 0 || errno == ENOENT)
                errno = ESRCH;
            return -1;
        }
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
    if (out->state == 'Z') {
        if (status_euid(dirfd, pid, &out->uid) == 0)
            out->flags |= PT_F_HAVE_UID;
        else
            out->uid = -1;
    } else if (fstat(fd, &st) == 0) {
        out->uid = (int64_t)st.st_uid;
        out->flags |= PT_F_HAVE_UID;
    }
    if (out->state == 'Z' && out->exit_code == 0 && (out->flags & PT_F_HAVE_EXIT)) {
        rc = exit_masked(dirfd, pid, fd);
        if (rc < 0)
            return -1;
        if (rc == 1)
            out->flags |= PT_F_EXIT_MASKED;
    }
    return 0;
}

/* Read and parse one stat file relative to dirfd (AT_FDCWD for absolute).
 * Returns 0, or -1 with errno (ESRCH when the process is gone). */
static int
read_one(int dirfd, long pid, pt_proc *out)
{
    int fd, saved;

    fd = open_stat(dirfd, pid);
    if (fd < 0)
        return -1;
    if (fill_row(dirfd, pid, fd, 0, out) != 0) {
        saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    close(fd);
    return 0;
}

int
pt_read(int pid, pt_proc *out)
{
    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    if (read_one(AT_FDCWD, pid, out) != 0)
        return -1;
    if (out->flags & PT_F_THREAD) {
        /* /proc/<tid>/stat exists for every thread, listed or not: a thread id
         * that is not a thread-group leader names no process. */
        errno = ESRCH;
        return -1;
    }
    return 0;
}

long
pt_floor_read(int pid)
{
    char line[STAT_BUF];
    struct stat st;
    ssize_t n;
    int fd, saved;

    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    fd = open_stat(AT_FDCWD, pid);
    if (fd < 0)
        return -1;
    n = read(fd, line, sizeof(line));
    if (n <= 0 || fstat(fd, &st) != 0) {
        saved = n == 0 || errno == ENOENT ? ESRCH : errno;
        close(fd);
        errno = saved;
        return -1;
    }
    close(fd);
    return (long)n;
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
            long pid = name_to_pid(d->d_name);
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

int
pt_scan_threads(size_t npids, int nthreads)
{
    size_t most;
    int cpus, n;

    if (nthreads == 1 || npids < 2)
        return 1;
    if (nthreads <= 0) {
        if (npids < PT_PARALLEL_MIN)
            return 1;
        cpus = usable_cpus();
        most = npids / (PT_PARALLEL_MIN / 2);   /* each thread gets enough to pay */
        n = cpus < (int)most || most > PT_THREADS_MAX ? cpus : (int)most;
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

enum job_kind { JOB_SNAPSHOT, JOB_FLOOR, JOB_SCANNER };

/* One pass over rows[0..n), shared by its threads. Fields below "shared" are
 * touched through __atomic builtins only. */
struct job {
    enum job_kind kind;
    int procfd;
    pt_proc *rows;
    pt_fdslot *slots;       /* JOB_SCANNER: slots[i] is rows[i]'s kept fd */
    size_t n;
    /* shared */
    size_t cursor;
    long budget;            /* JOB_SCANNER: fds that may still be kept */
    long floor_count;       /* JOB_FLOOR: stat files read */
    int err;                /* first error other than ESRCH, 0 if none */
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

/* Take one fd of the keep budget; 0 when none is left. */
static int
take_budget(struct job *job)
{
    long b = __atomic_load_n(&job->budget, __ATOMIC_RELAXED);

    while (b > 0) {
        if (__atomic_compare_exchange_n(&job->budget, &b, b - 1, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

/* Read row i of a scanner pass. Marks the row dropped (pid 0) when the
 * process is gone; keeps slots[i] naming an fd that is open, or -1. */
static void
scanner_one(struct job *job, size_t i)
{
    pt_fdslot *slot = &job->slots[i];
    pt_proc *row = &job->rows[i];
    long pid = slot->pid;
    int fd;

    if (slot->fd >= 0) {
        if (fill_row(job->procfd, pid, slot->fd, 1, row) == 0)
            return;
        if (errno != ESRCH) {
            job_fail(job, errno, pid);
            return;
        }
        /* The kept fd's process is gone; the pid was listed, so it may
         * have been reused: look again below, as for a new pid. */
        close(slot->fd);
        slot->fd = -1;
        __atomic_add_fetch(&job->budget, 1, __ATOMIC_RELAXED);
    }
    fd = open_stat(job->procfd, pid);
    if (fd < 0) {
        if (errno != ESRCH)
            job_fail(job, errno, pid);
        row->pid = 0;
        return;
    }
    if (fill_row(job->procfd, pid, fd, 0, row) != 0) {
        if (errno != ESRCH)
            job_fail(job, errno, pid);
        close(fd);
        row->pid = 0;
        return;
    }
    if (take_budget(job))
        slot->fd = fd;
    else
        close(fd);
}

static void
job_one(struct job *job, size_t i, long *floor_count)
{
    char path[40], line[STAT_BUF];
    struct stat st;
    pt_proc *row = &job->rows[i];
    ssize_t n;
    long pid;
    int fd;

    switch (job->kind) {
    case JOB_SNAPSHOT:
        pid = (long)row->pid;
        if (read_one(job->procfd, pid, row) != 0) {
            if (errno != ESRCH)
                job_fail(job, errno, pid);
            row->pid = 0;           /* exited during the scan: dropped */
        }
        break;
    case JOB_FLOOR:
        /* Exactly the syscalls of read_one: a zombie's row costs the reads
         * of fill_row (status for the uid, cwd for a masked exit) instead of
         * the fstat, so those are made here too. */
        pid = (long)row->pid;
        pid_path(path, pid, "stat");
        fd = openat(job->procfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
            break;
        n = read(fd, line, sizeof(line));
        if (n > 0) {
            const char *paren = memrchr(line, ')', (size_t)n);
            if (paren != NULL && paren + 2 < line + n && paren[2] == 'Z') {
                int64_t uid;
                if (pt_parse_stat(line, (size_t)n, row) == PT_OK) {
                    status_euid(job->procfd, pid, &uid);
                    if (row->exit_code == 0 && (row->flags & PT_F_HAVE_EXIT))
                        exit_masked(job->procfd, pid, fd);
                }
                (*floor_count)++;
            } else if (fstat(fd, &st) == 0) {
                (*floor_count)++;
            }
        }
        close(fd);
        break;
    case JOB_SCANNER:
        scanner_one(job, i);
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
 * started leave their share to the others. Returns when all are joined. */
static void
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
}

/* Remove the dropped rows (pid 0) and, for a scanner, move the fds that are
 * kept into slots_out (which may be job->slots itself). Returns the rows
 * left; *nkept is set to the slots kept. */
static size_t
compact(struct job *job, pt_fdslot *slots_out, size_t *nkept)
{
    size_t out = 0, kept = 0;

    for (size_t i = 0; i < job->n; i++) {
        if (job->slots != NULL && job->slots[i].fd >= 0) {
            if (job->rows[i].pid == 0) {        /* not expected; never leak it */
                close(job->slots[i].fd);
            } else {
                slots_out[kept++] = job->slots[i];
            }
        }
        if (job->rows[i].pid == 0)
            continue;
        if (out != i)
            job->rows[out] = job->rows[i];
        out++;
    }
    if (nkept != NULL)
        *nkept = kept;
    return out;
}

static long
scan(enum job_kind kind, pt_proc *rows, size_t cap, size_t *needed, int nthreads)
{
    struct job job;
    long listed;
    int procfd, saved;

    *needed = 0;
    procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (procfd < 0)
        return -1;
    listed = list_pids(procfd, rows, cap);
    if (listed < 0)
        goto error_errno;
    if ((size_t)listed > cap) {
        *needed = (size_t)listed;
        saved = ENOSPC;
        goto error;
    }
    memset(&job, 0, sizeof(job));
    job.kind = kind;
    job.procfd = procfd;
    job.rows = rows;
    job.n = (size_t)listed;
    job_run(&job, pt_scan_threads(job.n, nthreads));
    close(procfd);
    if (job.err != 0) {
        if (job.err == EBADMSG)
            *needed = (size_t)job.err_pid;
        errno = job.err;
        return -1;
    }
    if (kind == JOB_FLOOR) {
        *needed = job.n;
        return job.floor_count;
    }
    *needed = compact(&job, NULL, NULL);
    return (long)*needed;

error_errno:
    saved = errno;
error:
    close(procfd);
    errno = saved;
    return -1;
}

long
pt_scan(pt_proc *rows, size_t cap, size_t *needed, int nthreads)
{
    return scan(JOB_SNAPSHOT, rows, cap, needed, nthreads);
}

long
pt_snapshot(pt_proc *rows, size_t cap, size_t *needed)
{
    return scan(JOB_SNAPSHOT, rows, cap, needed, 1);
}

long
pt_floor_scan_mt(pt_proc *scratch, size_t cap, size_t *needed, int nthreads)
{
    return scan(JOB_FLOOR, scratch, cap, needed, nthreads);
}

long
pt_floor_scan(void)
{
    char dents[DENTS_BUF], path[40], line[STAT_BUF];
    struct stat st;
    long count = 0, nread;
    int procfd, fd, saved;

    procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (procfd < 0)
        return -1;
    for (;;) {
        nread = syscall(SYS_getdents64, procfd, dents, sizeof(dents));
        if (nread < 0) {
            saved = errno;
            close(procfd);
            errno = saved;
            return -1;
        }
        if (nread == 0)
            break;
        for (long off = 0; off < nread;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            long pid = name_to_pid(d->d_name);
            off += d->d_reclen;
            if (pid <= 0)
                continue;
            pid_path(path, pid, "stat");
            fd = openat(procfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
            if (fd < 0)
                continue;
            if (read(fd, line, sizeof(line)) > 0 && fstat(fd, &st) == 0)
                count++;
            close(fd);
        }
    }
    close(procfd);
    return count;
}

/* ---- scanner -------------------------------------------------------------- */

int
pt_scanner_init(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap,
                size_t max_fds)
{
    memset(sc, 0, sizeof(*sc));
    sc->slots = slots;
    sc->spare = spare;
    sc->cap = cap;
    sc->max_fds = max_fds;
    sc->procfd = -1;
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

long
pt_scanner_close(pt_scanner *sc)
{
    long closed = 0;

    for (size_t i = 0; i < sc->nslots; i++) {
        if (sc->slots[i].fd >= 0) {
            close(sc->slots[i].fd);
            closed++;
        }
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

long
pt_scanner_refresh(pt_scanner *sc, pt_proc *rows, size_t cap, size_t *needed, int nthreads)
{
    struct job job;
    pt_fdslot *old = sc->slots, *next = sc->spare;
    size_t nold = sc->nslots, i, j, kept, room;
    long listed, budget;
    int procfd, saved;

    *needed = 0;
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
            *needed = (size_t)listed;
        if (sc->procfd < 0)
            close(procfd);
        errno = saved;
        return -1;
    }

    /* Merge the kept fds (sorted by pid) into the new pid list: a listed pid
     * takes its kept fd; the fd of a pid no longer listed is closed. */
    for (i = 0, j = 0; j < (size_t)listed; j++) {
        int32_t pid = (int32_t)rows[j].pid;
        while (i < nold && old[i].pid < pid) {
            close(old[i].fd);
            i++;
        }
        next[j].pid = pid;
        next[j].fd = -1;
        if (i < nold && old[i].pid == pid)
            next[j].fd = old[i++].fd;
    }
    for (; i < nold; i++)
        close(old[i].fd);
    /* From here on the kept fds live in next[]; old[] is scratch. */
    sc->slots = next;
    sc->spare = old;
    sc->nslots = (size_t)listed;
    sc->procfd = sc->max_fds >= 1 ? procfd : -1;

    budget = (long)sc->max_fds - (sc->procfd >= 0 ? 1 : 0);
    for (j = 0; j < (size_t)listed; j++)
        budget -= next[j].fd >= 0;

    memset(&job, 0, sizeof(job));
    job.kind = JOB_SCANNER;
    job.procfd = procfd;
    job.rows = rows;
    job.slots = next;
    job.n = (size_t)listed;
    job.budget = budget > 0 ? budget : 0;
    job_run(&job, pt_scan_threads(job.n, nthreads));

    /* Keep only the slots with an fd, sorted by pid, in place. */
    *needed = compact(&job, next, &kept);
    sc->nslots = kept;
    sc->open_fds = kept + (sc->procfd >= 0 ? 1 : 0);
    if (sc->procfd < 0)
        close(procfd);
    if (job.err != 0) {
        *needed = job.err == EBADMSG ? (size_t)job.err_pid : 0;
        errno = job.err;
        return -1;
    }
    return (long)*needed;
}
