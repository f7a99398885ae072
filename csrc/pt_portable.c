/*
 * pt_portable.c: the parallel scan and scanner entry points of proctable.h
 * for platforms whose reader has no fd cache and no threaded pass (macOS).
 * Built only where csrc/pt_linux.c is not; it calls the reader's own
 * pt_snapshot(), pt_read() and pt_floor_scan(), so a reader needs nothing more.
 *
 * A scanner here keeps no fds: each refresh is a pt_snapshot(), each floor
 * pass a pt_floor_scan(), and the slot arrays stay empty.
 */
#include <errno.h>
#include <string.h>

#include "proctable.h"

long
pt_floor_read(int pid, int want)
{
    pt_proc row;

    /* No lighter read than the reader's own here. */
    return pt_read(pid, want, &row) == 0 ? (long)sizeof(row) : -1;
}

int
pt_scan_threads(size_t npids, int nthreads)
{
    (void)npids;
    (void)nthreads;
    return 1;
}

long
pt_scan(pt_proc *rows, size_t cap, int want, int nthreads, pt_scaninfo *info)
{
    (void)nthreads;     /* one pass: the reader sets info->threads to 1 */
    if (want & PT_WANT_BPF) {
        errno = ENOTSUP;    /* no BPF reader here */
        return -1;
    }
    return pt_snapshot(rows, cap, want, info);
}

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
    sc->hidepid = 0;            /* no /proc here */
    return 0;
}

int
pt_scanner_resize(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap)
{
    if (cap < sc->nslots) {     /* never here (no slots are kept); the contract */
        errno = ENOSPC;
        return -1;
    }
    sc->slots = slots;
    sc->spare = spare;
    sc->cap = cap;
    return 0;
}

long
pt_scanner_refresh(pt_scanner *sc, pt_proc *rows, size_t cap, int nthreads, pt_scaninfo *info)
{
    (void)nthreads;
    if (sc->want & PT_WANT_BPF) {
        errno = ENOTSUP;
        return -1;
    }
    return pt_snapshot(rows, cap, sc->want, info);
}

long
pt_scanner_floor(pt_scanner *sc, pt_proc *rows, size_t cap, int nthreads, pt_scaninfo *info)
{
    return pt_floor_scan(rows, cap, sc->want, nthreads, info);
}

long
pt_scanner_close(pt_scanner *sc)
{
    sc->nslots = 0;
    sc->open_fds = 0;
    return 0;
}

/* No BPF reader on this platform: the table always comes from the reader's own pass. */
int
pt_reader(char *why, size_t len)
{
    if (why != NULL && len > 0) {
        const char *msg = "BPF is a Linux reader";
        size_t n = strlen(msg);
        if (n >= len)
            n = len - 1;
        memcpy(why, msg, n);
        why[n] = '\0';
    }
    return PT_READER_PROC;
}

int
pt_bpf_pretend(int what)
{
    (void)what;
    return 0;
}
