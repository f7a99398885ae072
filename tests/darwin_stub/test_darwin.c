/*
 * test_darwin.c: csrc/pt_darwin.c and csrc/pt_portable.c against
 * fake_libproc.c, on Linux.
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
    int64_t rss_bytes, vms_bytes;   /* divided by the page size at check time */
    int64_t uid, exit_code;
    int32_t flags;
    char state;
    const char *comm;
};

#define UID PT_F_HAVE_UID
#define SID PT_F_HAVE_SID
/* A live process whose task info answered. */
#define LIVE (PT_F_HAVE_UID | PT_F_HAVE_SID | PT_F_HAVE_CPU | PT_F_HAVE_MEM)
/* A zombie: no task (counters, memory unknown), no session (getsid fails). */
#define ZOMBIE (PT_F_HAVE_UID | PT_F_HAVE_EXIT)

/* FAKE_TABLE_MAIN as the reader must give it: sorted, without pid 0 (skipped),
 * pids 412 and 4000 (vanished between the listing and the first read), 77 and
 * 950 (every source denied: they go to info->denied). Unknown fields are 0
 * with their flag clear. */
static const struct want main_rows[] = {
    /* launchd: PROC_PIDTBSDINFO denied, from sysctl; tty NODEV; task denied:
     * counters and memory unknown, the session known */
    {1, 0, 1, 1, 0, 1699990000000001, 0, 0, 0, 0, 0, 0, 0, UID | SID, 'S', "launchd"},
    /* stopped; no pbi_name, so pbi_comm; 24e6 ticks at 24 MHz = 1 s */
    {42, 420, 42, 420, 0x10000002, 1700000010000010, 1000000, 0, 1, 4096 * 3, 4096 * 12,
     501, 0, LIVE, 'T', "vim"},
    /* task info denied: counters and memory unknown */
    {88, 1, 88, 88, 0, 1699990100000042, 0, 0, 0, 0, 0, 88, 0, UID | SID, 'S',
     "WindowServer"},
    /* 24e6 * 1e6 + 48 ticks: 1e12 + 2 us, where ticks * 1e6 overflows 64 bits;
     * a known rss of 0 keeps its flag */
    {300, 1, 300, 300, 0, 1700000050000000, 1000000000002, 86400000000, 4, 0, 0, 501, 0,
     LIVE, 'R', "python3.12"},
    /* 31-byte name with spaces and parentheses, preferred to the 15-byte comm */
    {501, 420, 501, 420, 0x10000003, 1700000100250000, 5000007, 3, 17, 16384 * 1000,
     16384 * 4000, 501, 0, LIVE, 'S', "Google Chrome Helper (Renderer)"},
    /* running at the first read, task gone at the second, a zombie at the third;
     * num_threads 1 (a whole-process zombie) with PT_F_HAVE_CPU clear */
    {615, 501, 501, 0, 0x10000003, 1700000400000007, 0, 0, 1, 0, 0, 501, 9, ZOMBIE, 'Z',
     "Renderer (dying)"},
    /* zombie of exit(7): found only with arg 1; no session, no task */
    {730, 420, 730, 0, 0, 1700000200500000, 0, 0, 1, 0, 0, 501, 1792, ZOMBIE, 'Z', "sh"},
    /* another user's zombie (SIGSEGV + core), from sysctl */
    {731, 1, 731, 0, 0, 1700000500000000, 0, 0, 1, 0, 0, 0, 139, ZOMBIE, 'Z',
     "crashy daemon)"},
    /* SIDL, being forked */
    {2001, 300, 300, 300, 0, 1700000300999999, 0, 0, 1, 4096, 4096 * 4, 501, 0, LIVE, 'D',
     "python3.12"},
};
#define MAIN_ROWS (sizeof(main_rows) / sizeof(main_rows[0]))
/* Positive pids FAKE_TABLE_MAIN lists: the room ENOSPC asks for. */
#define MAIN_LISTED 13

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
    CHECK_PID(r->vms == w->vms_bytes / page, pid);
    CHECK_PID(r->uid == w->uid, pid);
    CHECK_PID(r->exit_code == w->exit_code, pid);
    CHECK_PID(r->flags == w->flags, pid);
    CHECK_PID(r->state == w->state, pid);
    CHECK_PID(r->comm_len == len, pid);
    CHECK_PID(memcmp(r->comm, w->comm, len) == 0, pid);
}

/* Rows past what the reader may write keep this byte pattern. */
static int
untouched(const void *buf, size_t from, size_t to, size_t size)
{
    const unsigned char *p = (const unsigned char *)buf + from * size;

    for (size_t i = 0; i < (to - from) * size; i++)
        if (p[i] != 0xA5)
            return 0;
    return 1;
}

/* A scaninfo over denied[0..cap), its out fields set to junk the read must
 * overwrite. */
static pt_scaninfo
info_over(pt_denied *denied, size_t cap)
{
    pt_scaninfo info;

    memset(&info, 0x5A, sizeof(info));
    info.denied = denied;
    info.denied_cap = cap;
    return info;
}

static void
check_main_rows(const pt_proc *rows, long n)
{
    CHECK(n == (long)MAIN_ROWS);
    if (n != (long)MAIN_ROWS)
        return;
    for (size_t i = 0; i < MAIN_ROWS; i++)
        check_row(&rows[i], &main_rows[i]);
    for (size_t i = 1; i < MAIN_ROWS; i++)
        CHECK(rows[i - 1].pid < rows[i].pid);
}

/* info after a full read of FAKE_TABLE_MAIN with room for every denied pid. */
static void
check_main_info(const pt_scaninfo *info, const pt_denied *denied)
{
    CHECK(info->ndenied == 2);
    CHECK(info->needed == 0);
    CHECK(info->bad_pid == 0);
    CHECK(info->threads == 1);
    /* in pid order although listed 950 first; the owner is hidden too */
    CHECK(denied[0].pid == 77 && denied[0].uid == -1);
    CHECK(denied[1].pid == 950 && denied[1].uid == -1);
}

static void
test_main_snapshot(void)
{
    pt_proc rows[32];
    pt_denied denied[8];
    pt_scaninfo info;
    long n;

    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    memset(denied, 0xA5, sizeof(denied));
    info = info_over(denied, 8);
    n = pt_snapshot(rows, 32, PT_WANT_MEM, &info);
    check_main_rows(rows, n);
    /* rows[MAIN_ROWS] held the read of 4000, which vanished: scratch within
     * cap, as the contract allows; nothing past it is written. */
    CHECK(untouched(rows, MAIN_ROWS + 1, 32, sizeof(pt_proc)));
    check_main_info(&info, denied);
    CHECK(untouched(denied, 2, 8, sizeof(pt_denied)));

    /* Without PT_WANT_MEM: the task info carries memory anyway, flagged. */
    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    info = info_over(denied, 8);
    check_main_rows(rows, pt_snapshot(rows, 32, 0, &info));

    /* Room for one denied pid: the first stored, both counted. */
    fake_use(FAKE_TABLE_MAIN);
    memset(denied, 0xA5, sizeof(denied));
    info = info_over(denied, 1);
    check_main_rows(rows, pt_snapshot(rows, 32, PT_WANT_MEM, &info));
    CHECK(info.ndenied == 2);
    CHECK(denied[0].pid == 77 && denied[0].uid == -1);
    CHECK(untouched(denied, 1, 8, sizeof(pt_denied)));

    /* No denied array at all: still counted, never written. */
    fake_use(FAKE_TABLE_MAIN);
    info = info_over(NULL, 0);
    check_main_rows(rows, pt_snapshot(rows, 32, PT_WANT_MEM, &info));
    CHECK(info.ndenied == 2);
}

static void
test_main_enospc(void)
{
    pt_proc rows[32];
    pt_denied denied[8];
    pt_scaninfo info;
    size_t needed;
    long n;

    /* Three rows fit, nine exist: ENOSPC with room enough for one retry. */
    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    info = info_over(denied, 8);
    errno = 0;
    n = pt_snapshot(rows, 3, PT_WANT_MEM, &info);
    CHECK(n == -1);
    CHECK(errno == ENOSPC);
    CHECK(info.needed == MAIN_LISTED);
    CHECK(info.bad_pid == 0);
    CHECK(untouched(rows, 3, 32, sizeof(pt_proc)));
    /* 77, a denied pid, between 42 and 88 took no row */
    CHECK(rows[0].pid == 1 && rows[1].pid == 42 && rows[2].pid == 88);

    needed = info.needed;
    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    info = info_over(denied, 8);
    n = pt_snapshot(rows, needed, PT_WANT_MEM, &info);
    check_main_rows(rows, n);
    check_main_info(&info, denied);

    /* Room for the rows but not for every pid listed (4000, the last, is
     * gone by its read): no ENOSPC. */
    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    info = info_over(denied, 8);
    n = pt_snapshot(rows, MAIN_ROWS, PT_WANT_MEM, &info);
    check_main_rows(rows, n);
    CHECK(untouched(rows, MAIN_ROWS, 32, sizeof(pt_proc)));

    /* No room at all, and no buffer. */
    fake_use(FAKE_TABLE_MAIN);
    info = info_over(denied, 8);
    errno = 0;
    n = pt_snapshot(NULL, 0, PT_WANT_MEM, &info);
    CHECK(n == -1);
    CHECK(errno == ENOSPC);
    CHECK(info.needed == MAIN_LISTED);
}

static void
test_main_read(void)
{
    pt_proc row;

    for (size_t i = 0; i < MAIN_ROWS; i++) {
        fake_use(FAKE_TABLE_MAIN);      /* pid 615 dies anew each time */
        memset(&row, 0xA5, sizeof(row));
        CHECK_PID(pt_read((int)main_rows[i].pid, PT_WANT_MEM, &row) == 0,
                  (long)main_rows[i].pid);
        check_row(&row, &main_rows[i]);
    }

    fake_use(FAKE_TABLE_MAIN);
    memset(&row, 0xA5, sizeof(row));
    CHECK(pt_read(501, 0, &row) == 0);
    check_row(&row, &main_rows[4]);

    fake_use(FAKE_TABLE_MAIN);
    errno = 0;
    CHECK(pt_read(412, PT_WANT_MEM, &row) == -1 && errno == ESRCH);   /* listed, then gone */
    errno = 0;
    CHECK(pt_read(99999, PT_WANT_MEM, &row) == -1 && errno == ESRCH); /* never there */
    errno = 0;
    CHECK(pt_read(950, PT_WANT_MEM, &row) == -1 && errno == EACCES);  /* every source denied */
    errno = 0;
    CHECK(pt_read(77, 0, &row) == -1 && errno == EACCES);
    errno = 0;
    CHECK(pt_read(0, PT_WANT_MEM, &row) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(pt_read(-3, PT_WANT_MEM, &row) == -1 && errno == EINVAL);
}

static void
test_main_floor(void)
{
    pt_proc scratch[32];
    pt_scaninfo info;

    /* Full PROC_PIDTBSDINFO replies: not 0 (skipped), 1, 731, 77 and 950
     * (denied), 412 and 4000 (gone). One call per positive pid, nothing written. */
    fake_use(FAKE_TABLE_MAIN);
    memset(scratch, 0xA5, sizeof(scratch));
    info = info_over(NULL, 0);
    CHECK(pt_floor_scan(scratch, 32, PT_WANT_MEM, 4, &info) == 7);
    CHECK(fake_pidinfo_calls == MAIN_LISTED);
    CHECK(info.threads == 1 && info.needed == 0 && info.ndenied == 0);
    CHECK(untouched(scratch, 0, 32, sizeof(pt_proc)));

    /* Room bounds it as it bounds pt_snapshot. */
    fake_use(FAKE_TABLE_MAIN);
    info = info_over(NULL, 0);
    errno = 0;
    CHECK(pt_floor_scan(scratch, 3, PT_WANT_MEM, 1, &info) == -1);
    CHECK(errno == ENOSPC);
    CHECK(info.needed == MAIN_LISTED);
    fake_use(FAKE_TABLE_MAIN);
    info = info_over(NULL, 0);
    CHECK(pt_floor_scan(scratch, 7, PT_WANT_MEM, 1, &info) == 7);
}

static void
test_big(void)
{
    pt_proc rows[FAKE_BIG_COUNT + 4];
    pt_scaninfo info;
    int64_t page = getpagesize();
    long n;

    /* The first count says 10, so the first listing fills its buffer. */
    fake_use(FAKE_TABLE_BIG);
    info = info_over(NULL, 0);
    errno = 0;
    n = pt_snapshot(rows, 8, PT_WANT_MEM, &info);
    CHECK(n == -1);
    CHECK(errno == ENOSPC);
    CHECK(info.needed == FAKE_BIG_COUNT);

    fake_use(FAKE_TABLE_BIG);
    memset(rows, 0xA5, sizeof(rows));
    info = info_over(NULL, 0);
    n = pt_snapshot(rows, FAKE_BIG_COUNT + 4, PT_WANT_MEM, &info);
    CHECK(n == FAKE_BIG_COUNT);
    CHECK(info.needed == 0 && info.ndenied == 0);
    CHECK(untouched(rows, FAKE_BIG_COUNT, FAKE_BIG_COUNT + 4, sizeof(pt_proc)));
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
        CHECK_PID(r->vms == 4 * 4096 * pid / page, (long)pid);
        CHECK_PID(r->state == 'S' && r->uid == 501 && r->flags == LIVE, (long)pid);
        CHECK_PID(r->comm_len == strlen(name) &&
                  memcmp(r->comm, name, r->comm_len) == 0, (long)pid);
    }

    fake_use(FAKE_TABLE_BIG);
    info = info_over(NULL, 0);
    CHECK(pt_floor_scan(rows, FAKE_BIG_COUNT + 4, PT_WANT_MEM, 0, &info) == FAKE_BIG_COUNT);
}

static void
test_short_reply(void)
{
    pt_proc rows[4], row;
    pt_scaninfo info;

    fake_use(FAKE_TABLE_SHORT);
    info = info_over(NULL, 0);
    errno = 0;
    CHECK(pt_snapshot(rows, 4, PT_WANT_MEM, &info) == -1);
    CHECK(errno == EBADMSG);
    CHECK(info.bad_pid == 7);       /* the pid whose reply was short */
    CHECK(info.needed == 0 && info.ndenied == 0);

    fake_use(FAKE_TABLE_SHORT);
    errno = 0;
    CHECK(pt_read(7, PT_WANT_MEM, &row) == -1 && errno == EBADMSG);

    /* hw.tbfrequency answered in 4 bytes, 1e9 (Intel: ticks are nanoseconds). */
    fake_use(FAKE_TABLE_SHORT);
    CHECK(pt_read(5, PT_WANT_MEM, &row) == 0);
    CHECK(row.utime == 1500000 && row.stime == 2);
    CHECK(row.num_threads == 2 && row.rss == 8192 / getpagesize());
    CHECK(row.vms == 4 * 8192 / getpagesize());
    CHECK(row.flags == LIVE);
    CHECK(row.state == 'R' && row.comm_len == 2 && memcmp(row.comm, "ok", 2) == 0);
}

static void
test_no_list(void)
{
    pt_proc rows[4];
    pt_scaninfo info;

    fake_use(FAKE_TABLE_NOLIST);
    info = info_over(NULL, 0);
    errno = 0;
    CHECK(pt_snapshot(rows, 4, PT_WANT_MEM, &info) == -1);
    CHECK(errno == EPERM);
    CHECK(info.needed == 0 && info.ndenied == 0 && info.bad_pid == 0);
    info = info_over(NULL, 0);
    errno = 0;
    CHECK(pt_floor_scan(rows, 4, PT_WANT_MEM, 1, &info) == -1);
    CHECK(errno == EPERM);
    CHECK(info.needed == 0);
}

/* pt_portable.c: the scan, floor read and scanner entry points over the reader. */
static void
test_portable(void)
{
    pt_proc rows[32];
    pt_denied denied[8];
    pt_fdslot slots[4], spare[4], slots2[32], spare2[32];
    pt_scanner sc;
    pt_scaninfo info;
    long n;

    CHECK(pt_scan_threads(100000, 0) == 1);
    CHECK(pt_scan_threads(100000, PT_THREADS_MAX) == 1);

    /* pt_scan is the snapshot, whatever the thread count asked. */
    fake_use(FAKE_TABLE_MAIN);
    memset(rows, 0xA5, sizeof(rows));
    memset(denied, 0xA5, sizeof(denied));
    info = info_over(denied, 8);
    n = pt_scan(rows, 32, PT_WANT_MEM, 4, &info);
    check_main_rows(rows, n);
    check_main_info(&info, denied);

    fake_use(FAKE_TABLE_MAIN);
    CHECK(pt_floor_read(501, PT_WANT_MEM) == (long)sizeof(pt_proc));
    errno = 0;
    CHECK(pt_floor_read(412, PT_WANT_MEM) == -1 && errno == ESRCH);
    errno = 0;
    CHECK(pt_floor_read(950, 0) == -1 && errno == EACCES);
    errno = 0;
    CHECK(pt_floor_read(0, 0) == -1 && errno == EINVAL);

    /* A scanner keeps no fds here: every refresh is a snapshot. */
    memset(&sc, 0xA5, sizeof(sc));
    CHECK(pt_scanner_init(&sc, slots, spare, 4, 100, PT_WANT_MEM) == 0);
    CHECK(sc.slots == slots && sc.spare == spare && sc.cap == 4);
    CHECK(sc.max_fds == 100 && sc.want == PT_WANT_MEM);
    CHECK(sc.nslots == 0 && sc.open_fds == 0 && sc.procfd == -1);

    fake_use(FAKE_TABLE_MAIN);
    info = info_over(denied, 8);
    errno = 0;
    CHECK(pt_scanner_refresh(&sc, rows, 4, 0, &info) == -1);
    CHECK(errno == ENOSPC && info.needed == MAIN_LISTED);
    CHECK(pt_scanner_resize(&sc, slots2, spare2, 32) == 0);
    CHECK(sc.slots == slots2 && sc.spare == spare2 && sc.cap == 32);

    for (int pass = 0; pass < 2; pass++) {
        fake_use(FAKE_TABLE_MAIN);
        memset(rows, 0xA5, sizeof(rows));
        memset(denied, 0xA5, sizeof(denied));
        info = info_over(denied, 8);
        n = pt_scanner_refresh(&sc, rows, 32, 2, &info);
        check_main_rows(rows, n);
        check_main_info(&info, denied);
        CHECK(sc.nslots == 0 && sc.open_fds == 0);
    }

    fake_use(FAKE_TABLE_MAIN);
    info = info_over(NULL, 0);
    CHECK(pt_scanner_floor(&sc, rows, 32, 2, &info) == 7);
    CHECK(fake_pidinfo_calls == MAIN_LISTED);
    CHECK(pt_scanner_close(&sc) == 0);
    CHECK(sc.nslots == 0 && sc.open_fds == 0);

    /* Still usable after close. */
    fake_use(FAKE_TABLE_MAIN);
    info = info_over(denied, 8);
    check_main_rows(rows, pt_scanner_refresh(&sc, rows, 32, 0, &info));
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
    test_portable();
    if (failed) {
        fprintf(stderr, "darwin reader: %u of %u checks failed\n", failed, passed + failed);
        return 1;
    }
    printf("darwin reader: %u checks passed\n", passed);
    return 0;
}
