/*
 * deny: run a command with some system calls denied, the way container
 * runtimes and sandboxes deny them (a seccomp filter answering an errno), and
 * optionally with the cgroup mount read-only (a private mount namespace, as
 * containers have it). A test tool, compiled by tests/_faults.py.
 *
 *   deny [--errno EPERM|ENOSYS|EACCES|N] [--ro-cgroup] RULE[,RULE...] -- CMD [ARG...]
 *
 * Rules (each names one way a host refuses a kernel feature):
 *   pidfd_open, pidfd_send_signal, clone3, bpf   the whole syscall
 *   waitid_pidfd        waitid(P_PIDFD, ...) only (P_PID and P_ALL still work)
 *   pidfd_get_info      ioctl(PIDFD_GET_INFO) only
 *   netlink_connector   socket(AF_NETLINK, *, NETLINK_CONNECTOR) only
 *   subreaper           prctl(PR_SET_CHILD_SUBREAPER) only
 *   none                nothing (a control run through the same launcher)
 *
 * The filter is installed with no_new_privs, inherited by every child, and
 * cannot be lifted: what runs under it sees the host as that sandbox would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "deny.c knows x86_64 and aarch64"
#endif

#ifndef __NR_pidfd_open
#define __NR_pidfd_open 434
#endif
#ifndef __NR_pidfd_send_signal
#define __NR_pidfd_send_signal 424
#endif
#ifndef __NR_clone3
#define __NR_clone3 435
#endif

#define P_PIDFD_ 3
#define AF_NETLINK_ 16
#define NETLINK_CONNECTOR_ 11
#define PR_SET_CHILD_SUBREAPER_ 36
/* _IOWR(0xFF, 11, struct pidfd_info), 64 bytes */
#define PIDFD_GET_INFO_ 0xC040FF0Bu

#define MAX_INSNS 256
static struct sock_filter prog[MAX_INSNS];
static unsigned short n_insns;

static void
emit(unsigned short code, unsigned char jt, unsigned char jf, unsigned int k)
{
    if (n_insns >= MAX_INSNS) {
        fprintf(stderr, "deny: too many rules\n");
        exit(2);
    }
    prog[n_insns++] = (struct sock_filter)BPF_JUMP(code, k, jt, jf);
}

#define LD_NR() emit(BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, nr))
/* the low 32 bits of an argument (little-endian) */
#define LD_ARG(i) emit(BPF_LD | BPF_W | BPF_ABS, 0, 0, \
                       offsetof(struct seccomp_data, args) + 8 * (i))

static unsigned int ret_errno;

/* nr, then up to two (arg index, value) conditions; all must hold to deny. */
static void
rule(unsigned int nr, int a1, unsigned int v1, int a2, unsigned int v2)
{
    int conds = (a1 >= 0) + (a2 >= 0);
    /* block: LD nr; JEQ nr (else skip the block) [; LD a; JEQ v]...; RET errno */
    unsigned char skip = (unsigned char)(1 + 2 * conds);

    LD_NR();
    emit(BPF_JMP | BPF_JEQ | BPF_K, 0, skip, nr);
    if (a1 >= 0) {
        LD_ARG(a1);
        emit(BPF_JMP | BPF_JEQ | BPF_K, 0, (unsigned char)(1 + 2 * (a2 >= 0)), v1);
    }
    if (a2 >= 0) {
        LD_ARG(a2);
        emit(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, v2);
    }
    emit(BPF_RET | BPF_K, 0, 0, ret_errno);
}

static int
add_rule(const char *name)
{
    if (strcmp(name, "pidfd_open") == 0)
        rule(__NR_pidfd_open, -1, 0, -1, 0);
    else if (strcmp(name, "pidfd_send_signal") == 0)
        rule(__NR_pidfd_send_signal, -1, 0, -1, 0);
    else if (strcmp(name, "clone3") == 0)
        rule(__NR_clone3, -1, 0, -1, 0);
    else if (strcmp(name, "bpf") == 0)
        rule(__NR_bpf, -1, 0, -1, 0);
    else if (strcmp(name, "waitid_pidfd") == 0)
        rule(__NR_waitid, 0, P_PIDFD_, -1, 0);
    else if (strcmp(name, "pidfd_get_info") == 0)
        rule(__NR_ioctl, 1, PIDFD_GET_INFO_, -1, 0);
    else if (strcmp(name, "netlink_connector") == 0)
        rule(__NR_socket, 0, AF_NETLINK_, 2, NETLINK_CONNECTOR_);
    else if (strcmp(name, "subreaper") == 0)
        rule(__NR_prctl, 0, PR_SET_CHILD_SUBREAPER_, -1, 0);
    else if (strcmp(name, "none") != 0)
        return -1;
    return 0;
}

static int
parse_errno(const char *s)
{
    if (strcmp(s, "EPERM") == 0)
        return EPERM;
    if (strcmp(s, "ENOSYS") == 0)
        return ENOSYS;
    if (strcmp(s, "EACCES") == 0)
        return EACCES;
    if (strcmp(s, "EINVAL") == 0)
        return EINVAL;
    return atoi(s);
}

/* A mount namespace of our own where the cgroup mounts are read-only. */
static int
ro_cgroup(void)
{
    static const char *const mounts[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup", NULL};

    if (unshare(CLONE_NEWNS) != 0) {
        perror("deny: unshare(CLONE_NEWNS)");
        return -1;
    }
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        perror("deny: mount --make-rprivate /");
        return -1;
    }
    for (int i = 0; mounts[i] != NULL; i++) {
        if (access(mounts[i], F_OK) != 0)
            continue;
        if (mount(mounts[i], mounts[i], NULL, MS_BIND | MS_REC, NULL) != 0
            || mount("none", mounts[i], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) != 0) {
            perror(mounts[i]);
            return -1;
        }
    }
    return 0;
}

int
main(int argc, char **argv)
{
    int err = EPERM, i = 1, want_ro = 0;
    char *rules = NULL;
    struct sock_fprog fprog;

    for (; i < argc; i++) {
        if (strcmp(argv[i], "--errno") == 0 && i + 1 < argc) {
            err = parse_errno(argv[++i]);
        } else if (strcmp(argv[i], "--ro-cgroup") == 0) {
            want_ro = 1;
        } else if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (rules == NULL) {
            rules = argv[i];
        } else {
            fprintf(stderr, "deny: unexpected %s\n", argv[i]);
            return 2;
        }
    }
    if (rules == NULL || i >= argc || err <= 0 || err > 4095) {
        fprintf(stderr, "usage: deny [--errno E] [--ro-cgroup] RULE[,RULE...] -- CMD...\n");
        return 2;
    }
    ret_errno = SECCOMP_RET_ERRNO | ((unsigned int)err & SECCOMP_RET_DATA);
    if (want_ro && ro_cgroup() != 0)
        return 2;

    /* Another architecture's syscall numbers mean other calls: refuse it all. */
    emit(BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, arch));
    emit(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, ARCH);
    emit(BPF_RET | BPF_K, 0, 0, SECCOMP_RET_KILL_PROCESS);
    for (char *tok = strtok(rules, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (add_rule(tok) != 0) {
            fprintf(stderr, "deny: unknown rule %s\n", tok);
            return 2;
        }
    }
    emit(BPF_RET | BPF_K, 0, 0, SECCOMP_RET_ALLOW);

    fprog.len = n_insns;
    fprog.filter = prog;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        perror("deny: PR_SET_NO_NEW_PRIVS");
        return 2;
    }
    if (syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) {
        perror("deny: seccomp");
        return 2;
    }
    execvp(argv[i], &argv[i]);
    fprintf(stderr, "deny: %s: %s\n", argv[i], strerror(errno));
    return 127;
}
