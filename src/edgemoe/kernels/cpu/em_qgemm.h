/* The quantised-weight GEMM tasks of expert.c (phase 1 gate_up, phase 2 down, many
 * tokens): the AMX path converting as the tiles go where it takes the job (em_qjit.h),
 * else each task's rows converted to bf16 in a scratch (em_qtasks.h's em_qrow_bf16) and
 * run through the bf16 tiles.
 *
 * NOTE: included by expert.c after em_qtasks.h and em_qjit.h; not standalone.
 */
#ifndef EM_QGEMM_H
#define EM_QGEMM_H

#if EM_HAS_GEMM
/* A task's scratch of n bf16 values, or NULL with the call marked failed (it returns -2). */
static uint16_t *em_task_scratch(const em_call *c, size_t n) {
    uint16_t *rows = em_scratch(n);
    if (!rows) atomic_store(&((em_call *)c)->failed, 1);
    return rows;
}

static void em_gate_up_gemm_q(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t H = c->H, I = c->I;
    int64_t lo = q * EM_P1_GEMM, hi = lo + EM_P1_GEMM < I ? lo + EM_P1_GEMM : I;
#if defined(EM_ISA_AMX)
    if (em_qjit(c, s)) {
        em_qjit_task(c, jb, s, 0, lo, hi);
        return;
    }
#endif
    const int64_t ld = H + EM_QPAD;
    uint16_t *rows = em_task_scratch(c, (size_t)(2 * EM_QHALF * ld)); /* gate rows, then up rows from EM_QHALF */
    if (!rows) return;
    for (int64_t i0 = lo; i0 < hi; i0 += EM_QHALF) {
        int nv = hi - i0 < EM_QHALF ? (int)(hi - i0) : EM_QHALF;
        long t0 = EM_PT_NOW();
        for (int r = 0; r < nv; r++) {
            em_qrow_bf16(c, jb, 0, i0 + r, rows + r * ld);
            em_qrow_bf16(c, jb, 0, I + i0 + r, rows + (EM_QHALF + r) * ld);
        }
        long t1 = EM_PT_NOW();
        em_gate_up_tiles(c, jb, s, rows, rows + EM_QHALF * ld, ld, i0, nv, (int)H);
        EM_PT_ADD(0, t1 - t0);
        EM_PT_ADD(1, EM_PT_NOW() - t1);
    }
}

static void em_down_gemm_q(const em_call *c, const em_job *jb, const em_jobstate *s, int64_t q) {
    const int64_t I = c->I;
    int64_t lo = q * EM_P2_GEMM, hi = lo + EM_P2_GEMM < c->H ? lo + EM_P2_GEMM : c->H;
#if defined(EM_ISA_AMX)
    if (em_qjit(c, s)) {
        em_qjit_task(c, jb, s, 1, lo, hi);
        return;
    }
#endif
    const int group = 2 * EM_QHALF; /* rows per tile: both A tiles (AMX) or one microkernel (AVX-512) */
    const int64_t ld = I + EM_QPAD;
    uint16_t *rows = em_task_scratch(c, (size_t)(group * ld));
    if (!rows) return;
    for (int64_t r0 = lo; r0 < hi; r0 += group) {
        int nr = hi - r0 < group ? (int)(hi - r0) : group;
        long t0 = EM_PT_NOW();
        for (int r = 0; r < nr; r++) em_qrow_bf16(c, jb, 1, r0 + r, rows + r * ld);
        long t1 = EM_PT_NOW();
        em_down_tiles(c, jb, s, rows, ld, r0, nr);
        EM_PT_ADD(0, t1 - t0);
        EM_PT_ADD(1, EM_PT_NOW() - t1);
    }
}
#endif

#endif
