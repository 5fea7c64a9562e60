/* Socket helpers: listen on a chosen or free port, connect with retries until a deadline,
 * and blocking transfers that give up at a deadline. */
#include "comm/comm_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void cm_net_tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
}

void cm_net_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0) return;
    fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

static int ms_left(double deadline)
{
    double left = deadline - cm_now();
    if (left <= 0) return 0;
    if (left > 1000.0) return 1000000;
    return (int)(left * 1000.0) + 1;
}

static ct_status resolve(const char *host, int port, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (passive) hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, res);
    if (rc != 0)
        return ct_error(CT_EIO, "comm: cannot resolve host '%s': %s", host ? host : "*",
                        gai_strerror(rc));
    return CT_OK;
}

ct_status cm_net_listen(const char *host, int port, int *fd_out, int *bound_port)
{
    struct addrinfo *res;
    CT_TRY(resolve(host, port, 1, &res));
    int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return ct_error(CT_EIO, "comm: socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        freeaddrinfo(res);
        close(fd);
        return ct_error(CT_EIO, "comm: cannot listen on %s:%d: %s", host ? host : "*", port,
                        strerror(e));
    }
    freeaddrinfo(res);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *bound_port = ntohs(sa.sin_port);
    *fd_out = fd;
    return CT_OK;
}

ct_status cm_net_connect(const char *host, int port, double deadline, int *fd_out)
{
    struct addrinfo *res;
    CT_TRY(resolve(host, port, 0, &res));
    int last = 0;
    double backoff = 0.002;
    for (;;) {
        int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            break;
        }
        cm_net_nonblock(fd, 1);
        int rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int pr = poll(&p, 1, ms_left(deadline));
            int err = 0;
            socklen_t el = sizeof err;
            if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
                rc = 0;
            else
                errno = pr == 0 ? ETIMEDOUT : (err ? err : ECONNREFUSED);
        }
        if (rc == 0) {
            cm_net_nonblock(fd, 0);
            cm_net_tune(fd);
            freeaddrinfo(res);
            *fd_out = fd;
            return CT_OK;
        }
        last = errno;
        close(fd);
        if (cm_now() + backoff >= deadline) break;
        struct timespec ts = {0, (long)(backoff * 1e9)};
        nanosleep(&ts, NULL);
        if (backoff < 0.05) backoff *= 2;
    }
    freeaddrinfo(res);
    return ct_error(CT_ETIMEDOUT, "comm: cannot connect to %s:%d before the deadline: %s", host,
                    port, strerror(last));
}

ct_status cm_net_accept(int lfd, double deadline, int *fd_out)
{
    for (;;) {
        struct pollfd p = {lfd, POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0)
            return ct_error(CT_ETIMEDOUT, "comm: no connection arrived before the deadline");
        int pr = poll(&p, 1, ms);
        if (pr < 0 && errno != EINTR) return ct_error(CT_EIO, "comm: poll: %s", strerror(errno));
        if (pr <= 0) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            return ct_error(CT_EIO, "comm: accept: %s", strerror(errno));
        }
        cm_net_tune(fd);
        *fd_out = fd;
        return CT_OK;
    }
}

ct_status cm_net_send_all(int fd, const void *buf, size_t n, double deadline)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return ct_error(CT_EPEER, "comm: send: %s", strerror(errno));
        struct pollfd pf = {fd, POLLOUT, 0};
        int ms = ms_left(deadline);
        if (ms == 0) return ct_error(CT_ETIMEDOUT, "comm: send did not finish before the deadline");
        poll(&pf, 1, ms);
    }
    return CT_OK;
}

ct_status cm_net_recv_all(int fd, void *buf, size_t n, double deadline)
{
    char *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) return ct_error(CT_EPEER, "comm: connection closed by the other side");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return ct_error(CT_EPEER, "comm: recv: %s", strerror(errno));
        struct pollfd pf = {fd, POLLIN, 0};
        int ms = ms_left(deadline);
        if (ms == 0)
            return ct_error(CT_ETIMEDOUT, "comm: receive did not finish before the deadline");
        poll(&pf, 1, ms);
    }
    return CT_OK;
}

ct_status cm_net_local_ip(int fd, char *buf, size_t cap)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) != 0 || sa.sin_family != AF_INET)
        return ct_error(CT_EIO, "comm: getsockname: %s", strerror(errno));
    if (!inet_ntop(AF_INET, &sa.sin_addr, buf, (socklen_t)cap))
        return ct_error(CT_EIO, "comm: inet_ntop: %s", strerror(errno));
    return CT_OK;
}

ct_status cm_net_peer_ip(int fd, char *buf, size_t cap)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) != 0 || sa.sin_family != AF_INET)
        return ct_error(CT_EIO, "comm: getpeername: %s", strerror(errno));
    if (!inet_ntop(AF_INET, &sa.sin_addr, buf, (socklen_t)cap))
        return ct_error(CT_EIO, "comm: inet_ntop: %s", strerror(errno));
    return CT_OK;
}
