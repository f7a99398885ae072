/*
 * pt_linux.c: the Linux reader.
 *
 * One /proc directory fd per scan; getdents64 into a stack buffer; for each
 * pid one openat(procfd, "<pid>/stat"), one read, one fstat of that same fd
 * (for the uid), one close. No path walk from "/", no allocation per process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
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

    if (dirfd == AT_FDCWD) {
        memcpy(path, "/proc/", 6);
        pid_path(path + 6, pid, "cwd");
    } else {
        pid_path(path, pid, "cwd");
    }
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

    if (dirfd == AT_FDCWD) {
        memcpy(path, "/proc/", 6);
        pid_path(path + 6, pid, "status");
    } else {
        pid_path(path, pid, "status");
    }
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

/* Read and parse one stat file relative to dirfd (AT_FDCWD for absolute).
 * Returns 0, or -1 with errno (ESRCH when the process is gone). */
static int
read_one(int dirfd, long pid, pt_proc *out)
{
    char path[40], line[STAT_BUF];
    struct stat st;
    ssize_t n;
    int fd, rc, saved;

    if (dirfd == AT_FDCWD) {
        memcpy(path, "/proc/", 6);
        pid_path(path + 6, pid, "stat");
    } else {
        pid_path(path, pid, "stat");
    }
    fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT)
            errno = ESRCH;
        return -1;
    }
    do {
        n = read(fd, line, sizeof(line));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        saved = (n == 0 || errno == ENOENT) ? ESRCH : errno;
        goto error;
    }
    rc = pt_parse_stat(line, (size_t)n, out);
    if (rc != PT_OK || out->pid != pid) {
        saved = EBADMSG;
        goto error;
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
        if (rc < 0) {
            saved = errno;
            goto error;
        }
        if (rc == 1)
            out->flags |= PT_F_EXIT_MASKED;
    }
    close(fd);
    return 0;

error:
    close(fd);
    errno = saved;
    return -1;
}

int
pt_read(int pid, pt_proc *out)
{
    if (pid <= 0) {
        errno = EINVAL;
        return -1;
    }
    return read_one(AT_FDCWD, pid, out);
}

static int
cmp_pid(const void *a, const void *b)
{
    int64_t x = ((const pt_proc *)a)->pid, y = ((const pt_proc *)b)->pid;
    return (x > y) - (x < y);
}

long
pt_snapshot(pt_proc *rows, size_t cap, size_t *needed)
{
    char dents[DENTS_BUF];
    size_t count = 0;
    int procfd, sorted = 1, saved;
    long nread;
    pt_proc scratch;

    *needed = 0;
    procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (procfd < 0)
        return -1;

    for (;;) {
        nread = syscall(SYS_getdents64, procfd, dents, sizeof(dents));
        if (nread < 0) {
            saved = errno;
            goto error;
        }
        if (nread == 0)
            break;
        for (long off = 0; off < nread;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(dents + off);
            long pid = name_to_pid(d->d_name);
            off += d->d_reclen;
            if (pid <= 0)
                continue;
            /* Past cap keep counting (into scratch) so Python learns the size. */
            pt_proc *row = count < cap ? &rows[count] : &scratch;
            if (read_one(procfd, pid, row) != 0) {
                if (errno == ESRCH)
                    continue;          /* exited during the scan */
                saved = errno;
                if (saved == EBADMSG)
                    count = (size_t)pid;
                goto error_count;
            }
            if (count > 0 && count < cap && rows[count - 1].pid > row->pid)
                sorted = 0;
            count++;
        }
    }
    close(procfd);
    *needed = count;
    if (count > cap) {
        errno = ENOSPC;
        return -1;
    }
    if (!sorted)
        qsort(rows, count, sizeof(*rows), cmp_pid);
    return (long)count;

error_count:
    *needed = count;
error:
    close(procfd);
    errno = saved;
    return -1;
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
