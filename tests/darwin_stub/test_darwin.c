/*
 * test_darwin.c: csrc/pt_darwin.c against fake_libproc.c, on Linux.
 *
 * Every row field is checked against literal values worked out by hand from
 * the script in fake_libproc.c, not recomputed by the formulas under test.
 * Prints "darwin reader: N checks passed" and exits 0, or lists each failed
 * check and exits 1.
 */
#define _DEFAULT_SOURCE

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_libproc.h"
#include "proctable.h"

static unsigned passed, failed;

#define CHECK(cond) check((cond), #cond, __FILE__, __LINE__, 0)
#define CHECK_PID(cond, pid) check((cond), #cond, __FILE__, __LINE__, (pid))

static void
check(int ok, const char *what, const char *file, int line, long pid)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    if (pid)
        fprintf(stderr, "%s:%d: pid %ld: check failed: %s\n", file, line, pid, what);
    else
        fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
}

struct want {
    int64_t pid, ppid, pgid, sid, tty_nr, start_time, utime, stime, num_threads;
    int64_t rss_bytes;      /* divided by the page size at check time */
    int64_t uid, exit_code;
    int32_t flags;
    char state;
    const char *comm;
};

#define UID PT_F_HAVE_UID
#define EXIT (PT_F_HAVE_UID | PT_F_HAVE_EXIT)

/* FAKE_TABLE_MAIN as the reader must give it: sorted, without pid 0 (skipped)
 * and pid 412 (vanished between the listing and the first read). */
static const struct want main_rows[] = {
    /* launchd: PROC_PIDTBSDINFO denied, from sysctl; tty NODEV; counters denied */
    {1, 0, 1, 1, 0, 1699990000000001, 0, 0, 0, 0, 0, 0, UID, 'S', "launchd"},
    /* stopped; no pbi_name, so pbi_comm; 24e6 ticks at 24 MHz = 1 s */
    {42, 420, 42, 420, 0x10000002, 1700000010000010, 1000000, 0, 1, 4096 * 3, 501, 0,
     UID, 'T', "vim"},
    /* task info denied: counters 0, num_threads 0 */
    {88, 1, 88, 88, 0, 1699990100000042, 0, 0, 0, 0, 88, 0, UID, 'S', "WindowServer"},
    /* 24e6 * 1e6 + 48 ticks: 1e12 + 2 us, where ticks * 1e6 overflows 64 bits */
    {300, 1, 300, 300, 0, 1700000050000000, 1000000000002, 86400000000, 4, 0, 501, 0,
     UID, 'R', "python3.12"},
    /* 31-byte name with spaces and parentheses, preferred to the 15-byte comm */
    {501, 420, 501, 420, 0x10000003, 1700000100250000, 5000007, 3, 17, 16384 * 1000, 501,
     0, UID, 'S', "Google Chrome Helper (Renderer)"},
    /* running at the first read, task gone at the second, a zombie at the third */
    {615, 501, 501, 0, 0x10000003, 1700000400000007, 0, 0, 1, 0, 501, 9, EXIT, 'Z',
     "Renderer (dying)"},
    /* zombie of exit(7): found only with arg 1; no session, no task */
    {730, 420, 730, 0, 0, 1700000200500000, 0, 0, 1, 0, 501, 1792, EXIT, 'Z', "sh"},
    /* another user's zombie (SIGSEGV + core), from sysctl */
    {731, 1, 731, 0, 0, 1700000500000000, 0, 0, 1, 0, 0, 139, EXIT, 'Z',
     "crashy daemon)"},
    /* SIDL, being forked */
    {2001, 300, 300, 300, 0, 1700000300999999, 0, 0, 1, 4096, 501, 0, UID, 'D',
     "python3.12"},
};
#define MAIN_ROWS (sizeof(main_rows) / sizeof(main_rows[0]))

static void
check_row(const pt_proc *r, const struct want *w)
{
    long pid = (long)w->pid;
    int64_t page = getpagesize();
    size_t len = strlen(w->comm);

    CHECK_PID(r->pid == w->pid, pid);
    CHECK_PID(r->ppid == w->ppid, pid);
    CHECK_PID(r->pgid == w->pgid, pid);
    CHECK_PID(r->sid == w->sid, pid);
    CHECK_PID(r->tty_nr == w->tty_nr, pid);
    CHECK_PID(r->start_time == w->start_time, pid);
    CHECK_PID(r->utime == w->utime, pid);
    CHECK_PID(r->stime == w->stime, pid);
    CHECK_PID(r->num_threads == w->num_threads, pid);
    CHECK_PID(r->rss == w->rss_bytes / page, pid);
    CHECK_PID(r->uid == w->uid, pid);
    CHECK_PID(r->exit_code == w->exit_code, pid);
    CHECK_PID(r->flags == w->flags, pid);
    CHECK_PID(r->state == w->state, pid);
    CHECK_PID(r->comm_len == len, pid);
    CHECK_PID(memcmp(r->comm, w->comm, len) == 0, pid);
}

/* Rows past what the reader may write keep this byte pattern. */
static int
untouched(const pt_proc *rows, size_t from, size_t to)
{
    const unsigned char *p = (const unsigned char *)&rows[from];

    for (size_t i = 0; i < (to - from) * sizeof(pt_proc); i++)
        if (p[i] != 0xA5)
            return 0;
    return 1;
}

static void
test_main_snapshot(void)
{
    pt_proc rows[32];
    size_t needed = 12345;
    long n;

    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    n = pt_snapshot(rows, 32, &needed);
    CHECK(n == (long)MAIN_ROWS);
    CHECK(needed == MAIN_ROWS);
    if (n != (long)MAIN_ROWS)
        return;
    for (size_t i = 0; i < MAIN_ROWS; i++)
        check_row(&rows[i], &main_rows[i]);
    for (size_t i = 1; i < MAIN_ROWS; i++)
        CHECK(rows[i - 1].pid < rows[i].pid);
    CHECK(untouched(rows, MAIN_ROWS, 32));
}

static void
test_main_enospc(void)
{
    pt_proc rows[32];
    size_t needed = 0;
    long n;

    /* Three rows fit, nine exist: ENOSPC with room enough for one retry. */
    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    errno = 0;
    n = pt_snapshot(rows, 3, &needed);
    CHECK(n == -1);
    CHECK(errno == ENOSPC);
    CHECK(needed >= MAIN_ROWS && needed <= 32);
    CHECK(untouched(rows, 3, 32));
    CHECK(rows[0].pid == 1 && rows[1].pid == 42 && rows[2].pid == 88);

    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    n = pt_snapshot(rows, needed, &needed);
    CHECK(n == (long)MAIN_ROWS);
    if (n == (long)MAIN_ROWS)
        for (size_t i = 0; i < MAIN_ROWS; i++)
            check_row(&rows[i], &main_rows[i]);

    /* No room at all, and no buffer. */
    fake_use(FAKE_TABLE_MAIN);
    needed = 0;
    errno = 0;
    n = pt_snapshot(NULL, 0, &needed);
    CHECK(n == -1);
    CHECK(errno == ENOSPC);
    CHECK(needed >= MAIN_ROWS);
}

static void
test_main_read(void)
{
    pt_proc row;

    for (size_t i = 0; i < MAIN_ROWS; i++) {
        fake_use(FAKE_TABLE_MAIN);      /* pid 615 dies anew each time */
        memset(&row, 0xA5, sizeof(row));
        CHECK_PID(pt_read((int)main_rows[i].pid, &row) == 0, (long)main_rows[i].pid);
        check_row(&row, &main_rows[i]);
    }

    fake_use(FAKE_TABLE_MAIN);
    errno = 0;
    CHECK(pt_read(412, &row) == -1 && errno == ESRCH);     /* listed, then gone */
    errno = 0;
    CHECK(pt_read(99999, &row) == -1 && errno == ESRCH);   /* never there */
    errno = 0;
    CHECK(pt_read(0, &row) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(pt_read(-3, &row) == -1 && errno == EINVAL);
}

static void
test_main_floor(void)
{
    /* Full PROC_PIDTBSDINFO replies: not 0 (skipped), 1 and 731 (denied), 412 (gone). */
    fake_use(FAKE_TABLE_MAIN);
    CHECK(pt_floor_scan() == 7);
    CHECK(fake_pidinfo_calls == 10);
}

static void
test_big(void)
{
    pt_proc rows[FAKE_BIG_COUNT + 4];
    size_t needed = 0;
    int64_t page = getpagesize();
    long n;

    /* The first count says 10, so the first listing fills its buffer. */
    fake_use(FAKE_TABLE_BIG);
    errno = 0;
    n = pt_snapshot(rows, 8, &needed);
    CHECK(n == -1);
    CHECK(errno == ENOSPC);
    CHECK(needed == FAKE_BIG_COUNT);

    fake_use(FAKE_TABLE_BIG);
    memset(rows, 0xA5, sizeof(rows));
    n = pt_snapshot(rows, FAKE_BIG_COUNT + 4, &needed);
    CHECK(n == FAKE_BIG_COUNT);
    CHECK(needed == FAKE_BIG_COUNT);
    CHECK(untouched(rows, FAKE_BIG_COUNT, FAKE_BIG_COUNT + 4));
    if (n != FAKE_BIG_COUNT)
        return;
    for (int i = 0; i < FAKE_BIG_COUNT; i++) {
        const pt_proc *r = &rows[i];
        int64_t pid = 1000 + 3 * i;
        char name[16];

        snprintf(name, sizeof(name), "worker %d", (int)pid);
        CHECK_PID(r->pid == pid, (long)pid);
        CHECK_PID(r->ppid == 1 && r->pgid == pid && r->sid == pid, (long)pid);
        CHECK_PID(r->start_time == (1700000000 + pid) * 1000000, (long)pid);
        CHECK_PID(r->utime == pid * 1000000 && r->stime == 0, (long)pid);
        CHECK_PID(r->rss == 4096 * pid / page && r->num_threads == 2, (long)pid);
        CHECK_PID(r->state == 'S' && r->uid == 501 && r->flags == UID, (long)pid);
        CHECK_PID(r->comm_len == strlen(name) &&
                  memcmp(r->comm, name, r->comm_len) == 0, (long)pid);
    }

    fake_use(FAKE_TABLE_BIG);
    CHECK(pt_floor_scan() == FAKE_BIG_COUNT);
}

static void
test_short_reply(void)
{
    pt_proc rows[4], row;
    size_t needed = 0;

    fake_use(FAKE_TABLE_SHORT);
    errno = 0;
    CHECK(pt_snapshot(rows, 4, &needed) == -1);
    CHECK(errno == EBADMSG);
    CHECK(needed == 7);     /* the pid whose reply was short */

    fake_use(FAKE_TABLE_SHORT);
    errno = 0;
    CHECK(pt_read(7, &row) == -1 && errno == EBADMSG);

    /* hw.tbfrequency answered in 4 bytes, 1e9 (Intel: ticks are nanoseconds). */
    fake_use(FAKE_TABLE_SHORT);
    CHECK(pt_read(5, &row) == 0);
    CHECK(row.utime == 1500000 && row.stime == 2);
    CHECK(row.num_threads == 2 && row.rss == 8192 / getpagesize());
    CHECK(row.state == 'R' && row.comm_len == 2 && memcmp(row.comm, "ok", 2) == 0);
}

static void
test_no_list(void)
{
    pt_proc rows[4];
    size_t needed = 99;

    fake_use(FAKE_TABLE_NOLIST);
    errno = 0;
    CHECK(pt_snapshot(rows, 4, &needed) == -1);
    CHECK(errno == EPERM);
    CHECK(needed == 0);
    errno = 0;
    CHECK(pt_floor_scan() == -1);
    CHECK(errno == EPERM);
}

int
main(void)
{
    test_main_snapshot();
    test_main_enospc();
    test_main_read();
    test_main_floor();
    test_big();
    test_short_reply();
    test_no_list();
    if (failed) {
        fprintf(stderr, "darwin reader: %u of %u checks failed\n", failed, passed + failed);
        return 1;
    }
    printf("darwin reader: %u checks passed\n", passed);
    return 0;
}
