/* Where a call's time goes, per thread (builds with EM_PHASE_TIMES=1 only, read by
 * scripts/cpu_phase_times.py): each thread's entry into the call, then per phase the
 * moment its own tasks ran out and the moment the phase's last task was done. A late
 * worker, a phase's slowest task and the phases' own read rates are told apart — what an
 * A/B of whole calls can't say. Then two sums over the thread's quantised blocked tasks
 * (em_qtasks.h): the ns converting their rows to bf16, and the ns in their tiles (and
 * epilogues) — which of the two holds the blocked path. Without the macro every hook is
 * empty (the default).
 *
 * NOTE: one call at a time (the pool's call_lock) is what makes the globals safe.
 */
#ifndef EM_PTIMES_H
#define EM_PTIMES_H

#ifndef EM_PHASE_TIMES
#define EM_PHASE_TIMES 0
#endif
#define EM_PT_MARKS 9 /* entry; phase 0, 1, 2: own tasks done, phase done; conversion, tiles ns */
#define EM_PT_SPANS 7 /* the first of the two sums */
#define EM_PT_MAX 128 /* threads recorded */

#if EM_PHASE_TIMES
static long em_pt_t0;
static atomic_int em_pt_next;
static int em_pt_threads;
static long em_pt[EM_PT_MAX][EM_PT_MARKS]; /* ns since the call started; the two sums */
static __thread long em_pt_sum[2];           /* this thread's conversion, tiles ns in this call */

static inline void em_pt_mark(int me, int k) {
    if (me < EM_PT_MAX) em_pt[me][k] = em_now_ns() - em_pt_t0;
}
static inline void em_pt_sums(int me) {
    if (me < EM_PT_MAX) em_pt[me][EM_PT_SPANS] = em_pt_sum[0], em_pt[me][EM_PT_SPANS + 1] = em_pt_sum[1];
}
#define EM_PT_CALL_START() (em_pt_t0 = em_now_ns(), atomic_store(&em_pt_next, 0))
#define EM_PT_ENTER(me) \
    int me = atomic_fetch_add(&em_pt_next, 1); \
    em_pt_sum[0] = em_pt_sum[1] = 0; \
    em_pt_mark(me, 0)
#define EM_PT_MARK(me, k) em_pt_mark(me, k)
#define EM_PT_SUMS(me) em_pt_sums(me)
#define EM_PT_NOW() em_now_ns()
#define EM_PT_ADD(k, ns) (em_pt_sum[k] += (ns))
#define EM_PT_CALL_END() (em_pt_threads = atomic_load(&em_pt_next))

/* Copies the last call's marks, [threads][EM_PT_MARKS] ns, for up to `max_threads`
 * threads in the order they entered; returns how many entered. */
int em_phase_times(long *out, int max_threads) {
    int n = em_pt_threads < EM_PT_MAX ? em_pt_threads : EM_PT_MAX;
    for (int t = 0; t < n && t < max_threads; t++)
        for (int k = 0; k < EM_PT_MARKS; k++) out[t * EM_PT_MARKS + k] = em_pt[t][k];
    return em_pt_threads;
}
#else
#define EM_PT_CALL_START() ((void)0)
#define EM_PT_ENTER(me) ((void)0)
#define EM_PT_MARK(me, k) ((void)0)
#define EM_PT_SUMS(me) ((void)0)
#define EM_PT_NOW() 0L
#define EM_PT_ADD(k, ns) ((void)(ns))
#define EM_PT_CALL_END() ((void)0)
#endif

#endif
