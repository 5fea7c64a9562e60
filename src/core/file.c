/* Files ctorch reads (src/core/internal.h): the one way every reader opens a path. A path is
 * opened O_RDONLY | O_NONBLOCK | O_CLOEXEC, so a FIFO cannot block the open; fstat must say
 * it is a regular file (a FIFO, a device such as /dev/zero, a socket or a folder is refused
 * with a message naming the input and the rule); O_NONBLOCK is then cleared and the file's
 * own size bounds what is read, below a limit fitting what the file is. Side files copied
 * from a model directory must resolve inside it, and keep their permission bits on the copy.
 * (Compiled-mod cache entries, src/jit/compile.c, are opened relative to the cache directory
 * with stricter checks of their own: O_NOFOLLOW, O_NONBLOCK, regular, owner and mode, size.) */
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a plain file";
}

/* "16 MiB" for whole MiB, else the bytes. */
static void fmt_limit(size_t max, char *buf, size_t n)
{
    if (max >= ((size_t)1 << 20) && max % ((size_t)1 << 20) == 0)
        snprintf(buf, n, "%zu MiB", max >> 20);
    else
        snprintf(buf, n, "%zu bytes", max);
}

/* The checks after an open: regular, within max; O_NONBLOCK cleared. Closes fd on failure. */
static ct_status check_opened(int fd, const char *path, const char *what, size_t max,
                              size_t *size)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ct_error(CT_EIO, "cannot stat %s '%s': %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ct_error(CT_EINVAL,
                        "%s '%s' is not a regular file (%s): ctorch reads only regular files",
                        what, path, kind_of(st.st_mode));
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)max) {
        char lim[64];
        fmt_limit(max, lim, sizeof lim);
        close(fd);
        return ct_error(CT_EFORMAT, "%s '%s' is %lld bytes, more than the %s allowed for it",
                        what, path, (long long)st.st_size, lim);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return ct_error(CT_EIO, "cannot set up reading %s '%s': %s", what, path, strerror(e));
    }
    *size = (size_t)st.st_size;
    return CT_OK;
}

ct_status ct_file_open_regular(const char *path, const char *what, size_t max, int *fd,
                               size_t *size)
{
    *fd = -1;
    *size = 0;
    if (!path) return ct_error(CT_EINVAL, "%s: the path must not be NULL", what);
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) return ct_error(CT_EIO, "cannot open %s '%s': %s", what, path, strerror(errno));
    CT_TRY(check_opened(f, path, what, max, size));
    *fd = f;
    return CT_OK;
}

ct_status ct_file_read_fd(int fd, const char *path, const char *what, size_t size, char **buf)
{
    *buf = NULL;
    size_t cap;
    if (!ct_add_size(size, 1, &cap))
        return ct_error(CT_EOVERFLOW, "%s '%s': %zu bytes overflow", what, path, size);
    CT_TRY(ct_alloc((void **)buf, cap));
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, *buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            ct_free(*buf);
            *buf = NULL;
            return ct_error(CT_EIO, "reading %s '%s': %s", what, path,
                            r < 0 ? strerror(e) : "the file shrank while it was read");
        }
        got += (size_t)r;
    }
    (*buf)[size] = '\0';
    return CT_OK;
}

ct_status ct_file_read_all(const char *path, const char *what, size_t max, char **buf,
                           size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd;
    size_t size;
    CT_TRY(ct_file_open_regular(path, what, max, &fd, &size));
    ct_status s = ct_file_read_fd(fd, path, what, size, buf);
    close(fd);
    if (s == CT_OK) *len = size;
    return s;
}

/* ---- side files copied out of a model directory ------------------------------------------ */

/* Whether real (a resolved path) lies inside the resolved directory dir, or, for a directory
 * of the Hugging Face hub cache (".../snapshots/<revision>"), in that repository's "blobs"
 * folder, where the cache keeps the files its snapshots link to. */
static bool inside(const char *dir, const char *real)
{
    size_t dl = strlen(dir);
    if (dl == 1 && dir[0] == '/') return real[0] == '/';
    if (!strncmp(real, dir, dl) && real[dl] == '/') return true;
    const char *rev = strrchr(dir, '/');
    if (!rev || rev == dir) return false;
    size_t sl = (size_t)(rev - dir); /* dir[0..sl) ends with "/snapshots" */
    if (sl < 10 || strncmp(dir + sl - 10, "/snapshots", 10)) return false;
    size_t rl = sl - 10; /* the repository folder */
    return !strncmp(real, dir, rl) && !strncmp(real + rl, "/blobs/", 7) &&
           !strchr(real + rl + 7, '/');
}

static ct_status write_all(int fd, const char *data, size_t len, const char *what,
                           const char *path)
{
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return ct_error(CT_EIO, "writing the copy of %s '%s': %s", what, path,
                            w < 0 ? strerror(errno) : "no progress");
        off += (size_t)w;
    }
    return CT_OK;
}

ct_status ct_file_copy_side(const char *src_dir, const char *name, size_t max,
                            const char *dst_dir, bool *copied)
{
    *copied = false;
    char src[PATH_MAX + 256], rdir[PATH_MAX], rsrc[PATH_MAX];
    if (snprintf(src, sizeof src, "%s/%s", src_dir, name) >= (int)sizeof src)
        return ct_error(CT_EINVAL, "side file '%s' of '%s': the path is too long", name, src_dir);
    struct stat ls;
    if (lstat(src, &ls) != 0) {
        if (errno == ENOENT) return CT_OK; /* not there: nothing to copy */
        return ct_error(CT_EIO, "cannot open side file '%s': %s", src, strerror(errno));
    }
    int fd;
    size_t size;
    CT_TRY(ct_file_open_regular(src, "side file", max, &fd, &size));
    /* The opened file must be the one at a resolved path inside the model directory: a link
     * to a file elsewhere (a private file of whoever runs ctorch) is refused, not copied. */
    struct stat fs, rs;
    if (!realpath(src_dir, rdir) || !realpath(src, rsrc) || stat(rsrc, &rs) != 0 ||
        fstat(fd, &fs) != 0) {
        int e = errno;
        close(fd);
        return ct_error(CT_EIO, "cannot resolve side file '%s': %s", src, strerror(e));
    }
    if (!inside(rdir, rsrc) || fs.st_dev != rs.st_dev || fs.st_ino != rs.st_ino) {
        close(fd);
        return ct_error(CT_EINVAL,
                        "side file '%s' is a link to '%s', outside the model directory '%s': "
                        "side files are copied only from inside it (replace the link with the "
                        "file)",
                        src, rsrc, rdir);
    }
    char *data = NULL;
    ct_status s = ct_file_read_fd(fd, src, "side file", size, &data);
    close(fd);
    if (s) return s;
    /* the copy: a new temp file (never through a link, never an existing one) with the
     * source's permission bits, renamed over the name (rename replaces a link, never follows
     * it) */
    int dfd = open(dst_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        s = ct_error(CT_EIO, "cannot open the output directory '%s': %s", dst_dir,
                     strerror(errno));
        ct_free(data);
        return s;
    }
    char tmp[300];
    snprintf(tmp, sizeof tmp, ".%.200s.ctorch-tmp.%ld", name, (long)getpid());
    mode_t mode = fs.st_mode & 0777;
    int ofd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (ofd < 0) {
        s = ct_error(CT_EIO, "cannot create '%s/%s': %s", dst_dir, tmp, strerror(errno));
    } else {
        s = write_all(ofd, data, size, "side file", src);
        if (s == CT_OK && fchmod(ofd, mode) != 0)
            s = ct_error(CT_EIO, "cannot set the mode of '%s/%s': %s", dst_dir, tmp,
                         strerror(errno));
        if (s == CT_OK && fsync(ofd) != 0)
            s = ct_error(CT_EIO, "fsync of '%s/%s': %s", dst_dir, tmp, strerror(errno));
        if (close(ofd) != 0 && s == CT_OK)
            s = ct_error(CT_EIO, "closing '%s/%s': %s", dst_dir, tmp, strerror(errno));
        if (s == CT_OK && renameat(dfd, tmp, dfd, name) != 0)
            s = ct_error(CT_EIO, "cannot rename '%s/%s' to '%s': %s", dst_dir, tmp, name,
                         strerror(errno));
        if (s) unlinkat(dfd, tmp, 0);
    }
    close(dfd);
    ct_free(data);
    if (s == CT_OK) *copied = true;
    return s;
}
