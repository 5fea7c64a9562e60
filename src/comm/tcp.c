/* The tcp backend's table: rendezvous and links in transport.c, the collectives and p2p
 * batches in algo.c. */
#include "comm/comm_internal.h"

static ct_status tcp_init(ct_comm *c, int rank, int size, double deadline,
                          const cm_mpi_from *from)
{
    (void)from; /* a split's ranks meet under its own store prefix */
    if (size < 1 || size > CM_MAX_RANKS || rank < 0 || rank >= size)
        return ct_error(CT_EINVAL, "ct_comm_init: rank %d / size %d: need 0 <= rank < size <= %d",
                        rank, size, CM_MAX_RANKS);
    return cm_tcp_setup(c, deadline);
}

const cm_backend_ops cm_tcp_backend = {
    .id = CT_COMM_TCP,
    .name = "tcp",
    .needs_store = true,
    .can_shrink = true,
    .init = tcp_init,
    .run = cm_tcp_run,
    .run_p2p = cm_tcp_run_p2p,
    .wake = cm_tcp_wake_self,
    .teardown = cm_tcp_teardown,
    .peer_progress = cm_tcp_peer_progress,
};
