/* Test builds only (-DEM_TEST_STALL=1, kernels/cpu_build.py's EDGEMOE_CPU_DEFINES): hold pool
 * workers at chosen points until the test releases them, to stand for workers whose cores
 * were taken away mid-call (em_detach.h). `em_test_stall(phase, point)` arms a point: the
 * next worker (never the calling thread) to reach it in `phase` blocks there — point 0: a
 * task claimed, before it runs; 1: a task run, before it is counted; 2: a task taken to run
 * again for a late thread (a rescue), before it runs. Each point holds one worker at a time
 * and is armed separately. `em_test_release()` lets every held one go; `em_test_holding()`
 * says how many are held now. `em_test_repack(on)`: in a detached call the caller runs every
 * pack task again after the gate_up phase and before any down task starts (a late pack's
 * stores landing there), deterministically (em_sched.h's em_repack_point).
 * `em_test_caller_rescues(0)`: only workers run late tasks again (so a test can hold a
 * rescuer). Other builds: the points are nothing.
 * Included by the schedule (em_sched.h). */
#ifndef EM_STALL_H
#define EM_STALL_H

#ifndef EM_TEST_STALL
#define EM_TEST_STALL 0
#endif
#if EM_TEST_STALL
static atomic_int em_stall_phase[3] = {-1, -1, -1}, em_stall_released = 1, em_stall_holding, em_repack;
static atomic_int em_caller_rescue = 1;

void em_test_stall(int phase, int point) {
    if (point < 0 || point > 2) return;
    atomic_store(&em_stall_released, 0);
    atomic_store(&em_stall_phase[point], phase);
}
void em_test_release(void) {
    for (int i = 0; i < 3; i++) atomic_store(&em_stall_phase[i], -1);
    atomic_store(&em_stall_released, 1);
}
int em_test_holding(void) { return atomic_load(&em_stall_holding); }
void em_test_repack(int on) { atomic_store(&em_repack, on); }
void em_test_caller_rescues(int on) { atomic_store(&em_caller_rescue, on); }

static void em_stall_point(int ph, int point) {
    int want = ph;
    if (!em_in_worker || !atomic_compare_exchange_strong(&em_stall_phase[point], &want, -1)) return;
    atomic_fetch_add(&em_stall_holding, 1);
    while (!atomic_load(&em_stall_released)) {
        struct timespec ts = {0, 50000L};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_sub(&em_stall_holding, 1);
}

#define EM_STALL_POINT(ph, point) em_stall_point(ph, point)
#define EM_REPACK_ARMED() atomic_load(&em_repack)
#define EM_MAY_RESCUE() (em_in_worker || atomic_load(&em_caller_rescue))
#else
#define EM_STALL_POINT(ph, point) ((void)0)
#define EM_REPACK_ARMED() 0
#define EM_MAY_RESCUE() 1
#endif

#endif
