/* Test builds only (-DEM_TEST_STALL=1, kernels/cpu_build.py's EDGEMOE_CPU_DEFINES): hold a
 * pool worker at a task until the test releases it, to stand for a worker whose core was
 * taken away mid-call (em_detach.h). `em_test_stall(phase, after)` arms it: the next
 * worker (never the calling thread) to claim a task of `phase` blocks there, before the
 * task runs (after = 0) or after it ran, before it is counted (after = 1);
 * `em_test_release()` lets it go; `em_test_holding()` says whether one is held now.
 * Other builds: EM_STALL_POINT is nothing. Included by expert.c. */
#ifndef EM_STALL_H
#define EM_STALL_H

#ifndef EM_TEST_STALL
#define EM_TEST_STALL 0
#endif
#if EM_TEST_STALL
static atomic_int em_stall_phase = -1, em_stall_after, em_stall_released = 1, em_stall_holding;

void em_test_stall(int phase, int after) {
    atomic_store(&em_stall_released, 0);
    atomic_store(&em_stall_after, after);
    atomic_store(&em_stall_phase, phase);
}
void em_test_release(void) { atomic_store(&em_stall_released, 1); }
int em_test_holding(void) { return atomic_load(&em_stall_holding); }

static void em_stall_point(int ph, int after) {
    int want = ph;
    if (!em_in_worker || atomic_load(&em_stall_after) != after) return;
    if (!atomic_compare_exchange_strong(&em_stall_phase, &want, -1)) return;
    atomic_store(&em_stall_holding, 1);
    while (!atomic_load(&em_stall_released)) {
        struct timespec ts = {0, 50000L};
        nanosleep(&ts, NULL);
    }
    atomic_store(&em_stall_holding, 0);
}
#define EM_STALL_POINT(ph, after) em_stall_point(ph, after)
#else
#define EM_STALL_POINT(ph, after) ((void)0)
#endif

#endif
