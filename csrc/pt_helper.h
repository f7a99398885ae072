/*
 * pt_helper.h: what the two parts of proctable-lineage share (internal to the
 * executable: pt_lineage.c, the per-run helper, pt_session.c, the helper of a
 * durable session, and pt_helper.c, the helpers both use). Not part of the C
 * contract (proctable.h).
 */
#ifndef PT_HELPER_H
#define PT_HELPER_H

#include <sys/types.h>

#define REAPER_LOST 125 /* the mirror's code when the command's status is unknown */
#define MAX_IGNORED 64
#define MAX_GROUPS 256

extern char **environ;

struct opts {
    const char *job;
    pid_t caller;
    int status_fd, exit_fd, control_fd;
    const char *cgroup_parent, *home, *exe;
    int setsid_, terminal;
    int ignored[MAX_IGNORED];
    int n_ignored;
    long uid, gid, umask_;          /* -1: unchanged */
    gid_t groups[MAX_GROUPS];
    int n_groups;                   /* -1: unchanged */
    char **cmd;
    /* The command's stdin, stdout and stderr (dup2'd before anything else in the
     * child), -1: as inherited. */
    int stdio[3];
    /* keep (a durable session): see pt_session.c */
    int dir_fd;                     /* the state directory's sessions folder */
    const char *name;               /* the session's name there (socket, end file) */
    const char *key_hex;            /* the key, hex-encoded, told back in hello */
    long generation;
    long ring;                      /* bytes of output kept */
    long orphan_timeout_ms;         /* -1: none */
    long orphan_grace_ms;
    int pty_rows, pty_cols;         /* 0: no terminal */
    int pipes;                      /* own the command's stdout and stderr */
    int stdin_pipe;                 /* own its stdin (a pipe) */
    const char *session_cgroup;     /* where the session's helpers live, or NULL */
    int own_group;                  /* the command leads a process group of its own */
};

/* pt_helper.c */
void say(int fd, const char *text);
int is_socket(int fd);
void say_with_fd(int sock, const char *text, int fd);
void say_error(int fd, const char *word, int err, const char *what);
void cloexec(int fd);
long parse_long(const char *s, const char *name);
int pidfd_open_(pid_t pid);
long long start_time(pid_t pid);
void forget_environment(void);
int children_of(pid_t pid, pid_t *out, int cap);
int children(pid_t *out, int cap);
int write_file(const char *dir, const char *leaf, const char *value);
int prepare_command(const struct opts *o);
void exec_command(const struct opts *o);
pid_t fork_into(int cgroup_fd);
pid_t spawn_command(const struct opts *o, int cgroup_fd);
pid_t start_command(const struct opts *o, int cgroup_fd, int tell, int *result);
pid_t finish_command(pid_t pid, int result);
void close_all_but(const int *keep, int n);
void shed_pages(void);
void quiet_stdio(void);

/* pt_session.c */
int job_keep(struct opts *o);

#endif
