/* The MPI backend under mpiexec: `ops` runs every op, dtype and reduction of comm_checks.h;
 * `timeout` has rank 1 arrive late, so rank 0's all_reduce ends TIMED_OUT within its
 * timeout (and MPI still finalises cleanly once rank 1 completes the collective). */
#include "test_util.h"
#include "comm_checks.h"

static int ops(void)
{
    ct_comm_options o = ct_comm_options_default();
    o.backend = CT_COMM_MPI;
    if (ct_comm_init_env(&o, &g_c) != CT_OK) {
        fprintf(stderr, "init: %s\n", ct_last_error());
        return 1;
    }
    g_rank = ct_comm_rank(g_c);
    g_size = ct_comm_size(g_c);
    WCHECK(ct_comm_get_backend(g_c) == CT_COMM_MPI);
    double t0 = ct_now();
    test_reductions();
    test_movement();
    test_p2p_and_split();
    /* shrink is not an MPI feature */
    ct_comm *nc = NULL;
    WCHECK(ct_comm_shrink(g_c, 1, &nc) == CT_EUNSUPPORTED);
    ct_comm_free(g_c);
    printf("mpi rank %d of %d: %d checks, %d failed, %.2f s\n", g_rank, g_size, t_checks,
           t_failures, ct_now() - t0);
    return t_failures ? 1 : 0;
}

static int timeout(void)
{
    ct_comm_options o = ct_comm_options_default();
    o.backend = CT_COMM_MPI;
    if (ct_comm_init_env(&o, &g_c) != CT_OK) {
        fprintf(stderr, "init: %s\n", ct_last_error());
        return 1;
    }
    g_rank = ct_comm_rank(g_c);
    float x[16] = {1}, y[16];
    WCHECK(ct_comm_all_reduce(g_c, x, y, 16, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
    if (g_rank == 1) {
        ct_sleep(1.5);
        WCHECK(ct_comm_all_reduce(g_c, x, y, 16, CT_DTYPE_F32, CT_REDUCE_SUM, 0, NULL) == CT_OK);
    } else {
        double t0 = ct_now();
        ct_status st = ct_comm_all_reduce(g_c, x, y, 16, CT_DTYPE_F32, CT_REDUCE_SUM, 0.5, NULL);
        double dt = ct_now() - t0;
        WCHECK(st == CT_ETIMEDOUT && dt >= 0.49 && dt < 1.2);
        WCHECK(ct_comm_failed(g_c));
        printf("mpi rank 0 timed out after %.2f s: %s\n", dt, ct_last_error());
    }
    ct_comm_free(g_c);
    return t_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "timeout")) return timeout();
    return ops();
}
