/*
 * Stand-in for macOS <sys/sysctl.h>: sysctl(), sysctlbyname(), the KERN_PROC
 * names, and struct kinfo_proc reduced to the members pt_darwin.c reads
 * (Apple's names and types, not Apple's layout). glibc has no <sys/sysctl.h>.
 */
#ifndef _SYS_SYSCTL_H_
#define _SYS_SYSCTL_H_

#include <stddef.h>
#include <sys/proc.h>
#include <sys/types.h>

#define CTL_KERN        1
#define KERN_PROC       14
#define KERN_PROC_PID   1

struct _ucred {
    int32_t cr_ref;
    uid_t cr_uid;               /* effective user id */
};

struct kinfo_proc {
    struct extern_proc kp_proc;
    struct eproc {
        struct _ucred e_ucred;  /* current credentials */
        pid_t e_ppid;
        pid_t e_pgid;
        dev_t e_tdev;           /* controlling tty dev, NODEV if none */
    } kp_eproc;
};

int sysctl(int *name, unsigned int namelen, void *oldp, size_t *oldlenp,
           void *newp, size_t newlen);
int sysctlbyname(const char *name, void *oldp, size_t *oldlenp,
                 void *newp, size_t newlen);

#endif /* _SYS_SYSCTL_H_ */
