/* Every collective, dtype and reduction against a serial reference, with odd sizes (0, 1,
 * primes, not divisible by the world size) on both the one-round and the ring algorithms,
 * in 2, 3 and 4 processes started by `ctorch launch` (and once with TCP instead of shared
 * memory). Floating results must be bitwise the same on every rank and every run. */
#include "test_util.h"
#include "../comm/comm_checks.h"

static int worker(void)
{
    ct_comm_options o = ct_comm_options_default();
    o.small_bytes = 16u << 10; /* so the larger sizes run the rings */
    ct_status st = ct_comm_init_env(&o, &g_c);
    if (st) {
        fprintf(stderr, "init: %s\n", ct_last_error());
        return 1;
    }
    g_rank = ct_comm_rank(g_c);
    g_size = ct_comm_size(g_c);
    double t0 = ct_now();
    test_reductions();
    test_movement();
    test_determinism();
    test_p2p_and_split();
    ct_comm_free(g_c);
    printf("rank %d of %d: %d checks, %d failed, %.2f s\n", g_rank, g_size, t_checks, t_failures,
           ct_now() - t0);
    return t_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--worker")) return worker();
    static const char *np2[] = {"--nproc", "2", "--max-time", "120", NULL};
    static const char *np3[] = {"--nproc", "3", "--max-time", "120", NULL};
    static const char *np4[] = {"--nproc", "4", "--max-time", "120", NULL};
    static const char *no_shm[] = {"CT_COMM_SHM=0", NULL};
    CHECK(ct_run_launch(np2, "ops", NULL, NULL, 0) == 0);
    CHECK(ct_run_launch(np3, "ops", NULL, NULL, 0) == 0);
    CHECK(ct_run_launch(np4, "ops", NULL, NULL, 0) == 0);
    CHECK(ct_run_launch(np3, "ops", no_shm, NULL, 0) == 0);
    return t_report("test_comm_ops");
}
