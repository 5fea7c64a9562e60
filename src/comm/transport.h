/* The transfer engine of the tcp backend: a set of send / receive requests to peers,
 * progressed together (shared-memory slots or TCP streams) until all are done, the
 * deadline passes, the communicator is aborted or a peer they depend on is gone. */
#ifndef CT_COMM_TRANSPORT_H
#define CT_COMM_TRANSPORT_H

#include "comm/comm_internal.h"

typedef struct cm_req {
    int send; /* 1 send, 0 receive */
    int peer;
    int complete;
    uint64_t tag;
    size_t len, done;
    const uint8_t *sbuf;
    uint8_t *rbuf;
    const uint8_t *local; /* receive-and-reduce: rbuf = local op incoming (NULL: copy) */
    ct_dtype dt;
    ct_reduce_op op;
    size_t esize;
    const size_t *avail; /* send: bytes of sbuf ready so far (NULL: all) */
    uint8_t hdr[16];     /* TCP frame header */
    size_t hdone;
    size_t staged; /* TCP receive-and-reduce: bytes waiting in the link's stage */
    int user;      /* p2p: index of the work */
} cm_req;

typedef struct cm_eng {
    ct_comm *c;
    ct_work *w;   /* the collective, or NULL for a p2p batch */
    uint64_t seq; /* collective sequence number (0: p2p) */
    double deadline;
    cm_req *r;
    int n, cap;
    /* p2p hooks */
    void (*on_done)(struct cm_eng *e, cm_req *q);
    int (*absorb)(struct cm_eng *e);
    double (*next_deadline)(struct cm_eng *e);
    void *ud;
    /* failure */
    ct_status st;
    char msg[CM_MSG];
    int missing[CM_MAX_RANKS > 64 ? 64 : CM_MAX_RANKS];
    int nmissing;
} cm_eng;

#define CM_TAG_P2P (1ull << 63)

/* Add requests (the array must have room: e->cap). Zero-length requests are complete. */
cm_req *cm_eng_send(cm_eng *e, int peer, const void *buf, size_t len);
cm_req *cm_eng_recv(cm_eng *e, int peer, void *buf, size_t len);
cm_req *cm_eng_recv_reduce(cm_eng *e, int peer, void *buf, const void *local, size_t len,
                           ct_dtype dt, ct_reduce_op op);
/* Progress the requests until all are complete (CT_OK) or a failure (its status; message,
 * missing ranks in e). Clears the requests on success. */
ct_status cm_eng_run(cm_eng *e);

#endif
