/*
 * pd_http.h - [pd] the decode server's client to its prefill peer (serve --role decode
 * --prefill-url URL; docs/pd.md): one HTTP/1.0 POST over a TCP socket, the reply read to the
 * end. Plain sockets (no TLS): the peers sit on one host or a trusted network.
 *
 * Ownership: *body of a reply is ms_malloc'd (ms_free); the URL is borrowed.
 */
#ifndef MS_PD_HTTP_H
#define MS_PD_HTTP_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A parsed http://HOST:PORT[/] peer address. */
typedef struct ms_pd_peer {
    char host[256];
    char port[8];
} ms_pd_peer;

/* Parse "http://HOST:PORT" (an optional trailing "/"). Errors: MS_ERR_INVALID_ARG naming the
 * URL and what is wrong (scheme, host, port outside 1..65535, a path). */
ms_status ms_pd_peer_parse(const char *url, ms_pd_peer *out, ms_error *err);

/*
 * POST `body` [n bytes] as application/json to http://peer/path and read the reply: its status
 * code, its body (*reply [*n_reply] bytes, ms_malloc'd, NUL-terminated past the end) and its
 * Content-Type (up to 63 bytes into type, "" when none). timeout_s bounds each socket read and
 * write. Errors: MS_ERR_IO (connect, send, receive, a timeout, a reply over max_reply bytes or
 * not HTTP), naming the peer; MS_ERR_OOM.
 */
ms_status ms_pd_http_post(const ms_pd_peer *peer, const char *path, const char *body, size_t n,
                          int timeout_s, size_t max_reply, unsigned *status, uint8_t **reply,
                          size_t *n_reply, char type[64], ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_PD_HTTP_H */
