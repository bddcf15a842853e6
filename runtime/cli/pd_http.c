/*
 * pd_http.c - [pd] HTTP/1.0 POST to the prefill peer (pd_http.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "pd_http.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

ms_status ms_pd_peer_parse(const char *url, ms_pd_peer *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    if (url == NULL || strncmp(url, "http://", 7) != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "--prefill-url '%.200s': expected "
                       "http://HOST:PORT", url != NULL ? url : "");
    const char *h = url + 7, *colon = strrchr(h, ':');
    if (colon == NULL || colon == h || (size_t)(colon - h) >= sizeof out->host)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "--prefill-url '%.200s': expected "
                       "http://HOST:PORT (no host or port)", url);
    char *end = NULL;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || errno != 0 || port < 1 || port > 65535 ||
        (*end != '\0' && strcmp(end, "/") != 0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "--prefill-url '%.200s': the port must be in "
                       "1..65535 and nothing may follow it", url);
    memcpy(out->host, h, (size_t)(colon - h));
    snprintf(out->port, sizeof out->port, "%ld", port);
    return MS_OK;
}

static ms_status send_all(int fd, const char *p, size_t n, const ms_pd_peer *peer,
                          ms_error *err) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return MS_FAIL(err, MS_ERR_IO, "prefill peer %s:%s: send: %s", peer->host,
                           peer->port, k < 0 ? strerror(errno) : "closed");
        p += k;
        n -= (size_t)k;
    }
    return MS_OK;
}

ms_status ms_pd_http_post(const ms_pd_peer *peer, const char *path, const char *body, size_t n,
                          int timeout_s, size_t max_reply, unsigned *status, uint8_t **reply,
                          size_t *n_reply, char type[64], ms_error *err) {
    *status = 0;
    *reply = NULL;
    *n_reply = 0;
    type[0] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(peer->host, peer->port, &hints, &ai);
    if (rc != 0)
        return MS_FAIL(err, MS_ERR_IO, "prefill peer %s:%s: %s", peer->host, peer->port,
                       gai_strerror(rc));
    int fd = -1, last = 0;
    for (struct addrinfo *a = ai; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0)
            continue;
        struct timeval tv = {timeout_s, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            last = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return MS_FAIL(err, MS_ERR_IO, "prefill peer %s:%s: cannot connect: %s", peer->host,
                       peer->port, strerror(last));
    char head[512];
    int hn = snprintf(head, sizeof head, "POST %s HTTP/1.0\r\nHost: %s:%s\r\nContent-Type: "
                      "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      path, peer->host, peer->port, n);
    ms_status st = MS_OK;
    if (hn < 0 || (size_t)hn >= sizeof head)
        st = MS_FAIL(err, MS_ERR_INVALID_ARG, "prefill peer: path too long");
    if (st == MS_OK)
        st = send_all(fd, head, (size_t)hn, peer, err);
    if (st == MS_OK)
        st = send_all(fd, body, n, peer, err);
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    while (st == MS_OK) {
        if (ms_grow((void **)&buf, &cap, len + 65536 + 1, 1) != MS_OK) {
            st = MS_FAIL(err, MS_ERR_OOM, "prefill peer: out of memory for its reply");
            break;
        }
        ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            st = MS_FAIL(err, MS_ERR_IO, "prefill peer %s:%s: receive: %s", peer->host,
                         peer->port, errno == EAGAIN || errno == EWOULDBLOCK ? "timed out"
                                                                             : strerror(errno));
        if (k <= 0)
            break;
        len += (size_t)k;
        if (len > max_reply)
            st = MS_FAIL(err, MS_ERR_IO, "prefill peer %s:%s: reply over %zu bytes", peer->host,
                         peer->port, max_reply);
    }
    close(fd);
    uint8_t *sep = NULL;
    if (st == MS_OK) {
        buf[len] = '\0';
        sep = len >= 4 ? memmem(buf, len, "\r\n\r\n", 4) : NULL;
        unsigned code = 0;
        if (sep == NULL || sscanf((const char *)buf, "HTTP/%*u.%*u %u", &code) != 1)
            st = MS_FAIL(err, MS_ERR_IO, "prefill peer %s:%s: not an HTTP reply", peer->host,
                         peer->port);
        *status = code;
    }
    if (st != MS_OK) {
        ms_free(buf);
        return st;
    }
    for (char *line = strstr((char *)buf, "\r\n"); line != NULL && (uint8_t *)line < sep;
         line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, "Content-Type:", 13) == 0) {
            const char *v = line + 15;
            while (*v == ' ')
                v++;
            size_t k = strcspn(v, "\r");
            snprintf(type, 64, "%.*s", (int)MS_MIN(k, (size_t)63), v);
        }
    }
    size_t off = (size_t)(sep + 4 - buf);
    memmove(buf, buf + off, len - off + 1);
    *reply = buf;
    *n_reply = len - off;
    return MS_OK;
}
