/*
 * Stand-in for macOS <sys/proc_info.h>, for building csrc/pt_darwin.c on Linux.
 *
 * Only what pt_darwin.c uses. struct proc_bsdinfo and struct proc_taskinfo
 * carry Apple's member names, types and order (xnu bsd/sys/proc_info.h), so
 * code that compiles here compiles against the SDK too.
 */
#ifndef _SYS_PROC_INFO_H
#define _SYS_PROC_INFO_H

#include <stdint.h>
#include <sys/param.h>
#include <sys/types.h>

#ifndef MAXCOMLEN
#define MAXCOMLEN 16            /* macOS <sys/param.h> */
#endif

#define PROC_ALL_PIDS           1

struct proc_bsdinfo {
    uint32_t pbi_flags;
    uint32_t pbi_status;        /* p_stat: SIDL, SRUN, SSLEEP, SSTOP, SZOMB */
    uint32_t pbi_xstatus;       /* wait status of a zombie */
    uint32_t pbi_pid;
    uint32_t pbi_ppid;
    uid_t pbi_uid;
    gid_t pbi_gid;
    uid_t pbi_ruid;
    gid_t pbi_rgid;
    uid_t pbi_svuid;
    gid_t pbi_svgid;
    uint32_t rfu_1;
    char pbi_comm[MAXCOMLEN];
    char pbi_name[2 * MAXCOMLEN];   /* empty if no name is registered */
    uint32_t pbi_nfiles;
    uint32_t pbi_pgid;
    uint32_t pbi_pjobc;
    uint32_t e_tdev;            /* controlling tty dev */
    uint32_t e_tpgid;
    int32_t pbi_nice;
    uint64_t pbi_start_tvsec;
    uint64_t pbi_start_tvusec;
};

struct proc_taskinfo {
    uint64_t pti_virtual_size;
    uint64_t pti_resident_size;     /* bytes */
    uint64_t pti_total_user;        /* Mach absolute time units */
    uint64_t pti_total_system;
    uint64_t pti_threads_user;
    uint64_t pti_threads_system;
    int32_t pti_policy;
    int32_t pti_faults;
    int32_t pti_pageins;
    int32_t pti_cow_faults;
    int32_t pti_messages_sent;
    int32_t pti_messages_received;
    int32_t pti_syscalls_mach;
    int32_t pti_syscalls_unix;
    int32_t pti_csw;
    int32_t pti_threadnum;
    int32_t pti_numrunning;
    int32_t pti_priority;
};

#define PROC_PIDTBSDINFO        3
#define PROC_PIDTBSDINFO_SIZE   (sizeof(struct proc_bsdinfo))
#define PROC_PIDTASKINFO        4
#define PROC_PIDTASKINFO_SIZE   (sizeof(struct proc_taskinfo))

#endif /* _SYS_PROC_INFO_H */
