/*
 * statx() that works under older gVisor, preloaded into every dynamically linked program of
 * the sandbox image (/etc/ld.so.preload).
 *
 * coreutils' ls and stat call statx with AT_NO_AUTOMOUNT; gVisor releases of 2022 (Debian
 * bookworm's runsc, 20221219) reject that flag with EINVAL, so `ls /` and `stat FILE` fail
 * there. gVisor has no automount points, so the flag changes nothing in it: on that EINVAL the
 * call is made again without the flag. Linux, and a gVisor that takes the flag, answer the first
 * call, so they see exactly glibc's statx (taken with RTLD_NEXT, keeping its own fallbacks).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/stat.h>

typedef int (*statx_function)(int, const char *, int, unsigned int, struct statx *);

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    static statx_function next_statx;
    statx_function next = __atomic_load_n(&next_statx, __ATOMIC_ACQUIRE);
    if (next == NULL) {
        next = (statx_function)dlsym(RTLD_NEXT, "statx");
        if (next == NULL) {
            errno = ENOSYS;
            return -1;
        }
        __atomic_store_n(&next_statx, next, __ATOMIC_RELEASE);
    }
    int saved_errno = errno;
    int result = next(dirfd, path, flags, mask, buf);
    if (result != 0 && errno == EINVAL && (flags & AT_NO_AUTOMOUNT) != 0) {
        errno = saved_errno;
        result = next(dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
    }
    return result;
}
