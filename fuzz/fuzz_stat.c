/*
 * fuzz_stat.c: libFuzzer harness for pt_parse_stat (csrc/pt_stat.c).
 *
 * Built with -fsanitize=fuzzer,address,undefined (see fuzz/run.sh), so any read
 * outside the input, any overflow the compiler can see and any undefined
 * behaviour stops the run. On top of that, every line the parser accepts must
 * satisfy the contract of proctable.h; every line it refuses must give one of
 * its error codes. Nothing is compared against another parser.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proctable.h"

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond,        \
                    __FILE__, __LINE__);                                    \
            abort();                                                        \
        }                                                                   \
    } while (0)

static int
is_letter(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pt_proc out, again;
    const char *buf;
    const char *open_paren, *last_paren;
    int rc;

    /* An exact-size heap copy: ASan then flags a read one byte past the end
     * (the parser must not need a NUL). */
    buf = malloc(size ? size : 1);
    if (buf == NULL)
        return 0;
    memcpy((char *)buf, data, size);

    rc = pt_parse_stat(buf, size, &out);
    CHECK(rc == PT_OK || rc == PT_ENOPID || rc == PT_ENOCOMM || rc == PT_ESTATE
          || rc == PT_EFIELD || rc == PT_ESHORT);

    /* Pure: the same bytes parse the same way, to the last byte of the row. */
    CHECK(pt_parse_stat(buf, size, &again) == rc);
    CHECK(memcmp(&out, &again, sizeof(out)) == 0);

    /* Whatever happened, the fields a reader never fills stay unknown. */
    CHECK(out.uid == -1);
    CHECK((out.flags & PT_F_HAVE_UID) == 0);
    CHECK(out.comm_len <= PT_COMM_MAX);

    if (rc == PT_OK) {
        CHECK(out.pid > 0 && out.pid <= INT32_MAX);
        CHECK(is_letter(out.state));
        CHECK(out.ppid >= 0 && out.ppid <= INT32_MAX);
        CHECK(out.pgid >= 0 && out.pgid <= INT32_MAX);
        CHECK(out.sid >= 0 && out.sid <= INT32_MAX);
        CHECK(out.tty_nr >= INT32_MIN && out.tty_nr <= INT32_MAX);
        CHECK(out.start_time >= 0);
        CHECK(out.utime >= 0 && out.stime >= 0);
        CHECK(out.num_threads >= 0 && out.num_threads <= INT32_MAX);
        /* rss and vms come from statm, never from the stat line's estimate. */
        CHECK(out.rss == 0 && out.vms == 0 && !(out.flags & PT_F_HAVE_MEM));
        /* The parser sets only what the line says: field 52 seen, field 38 -1,
         * and the session and CPU fields, which every line has. */
        CHECK((out.flags & (PT_F_HAVE_SID | PT_F_HAVE_CPU)) == (PT_F_HAVE_SID | PT_F_HAVE_CPU));
        CHECK((out.flags & ~(PT_F_HAVE_EXIT | PT_F_THREAD | PT_F_HAVE_SID | PT_F_HAVE_CPU
                             | PT_F_KTHREAD)) == 0);
        if (!(out.flags & PT_F_HAVE_EXIT))
            CHECK(out.exit_code == 0);
        else
            CHECK(out.exit_code >= INT32_MIN && out.exit_code <= INT32_MAX);

        /* comm is exactly the bytes between the first "(" and the LAST ")". */
        open_paren = memchr(buf, '(', size);
        last_paren = memrchr(buf, ')', size);
        CHECK(open_paren != NULL && last_paren != NULL && last_paren > open_paren);
        CHECK((size_t)(last_paren - open_paren - 1) == out.comm_len);
        CHECK(memcmp(out.comm, open_paren + 1, out.comm_len) == 0);
        /* ... and the state letter follows it after one space. */
        CHECK(last_paren[1] == ' ' && last_paren[2] == out.state);
    }

    /* The same bytes as a statm line: either both numbers and the flag, or
     * the row left exactly as it was. */
    memcpy(&again, &out, sizeof(out));
    rc = pt_parse_statm(buf, size, &out);
    CHECK(rc == PT_OK || rc == PT_EFIELD || rc == PT_ESHORT);
    if (rc == PT_OK) {
        CHECK(out.rss >= 0 && out.vms >= 0 && (out.flags & PT_F_HAVE_MEM));
    } else {
        CHECK(memcmp(&out, &again, sizeof(out)) == 0);
    }
    free((void *)buf);
    return 0;
}
