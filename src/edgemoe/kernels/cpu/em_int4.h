/* INT4 expert weights (edgemoe/quant/int4.py, Int4Group): two nibbles per byte along K
 * (byte j of a row: q[2j] low, q[2j+1] high; a row is ceil(K/2) bytes), and per row and
 * group of `grp` k an fp16 scale and a uint8 zero point: W[r,k] = (q - zero) * scale.
 *
 * GEMV (few tokens): the nibbles are unpacked in registers, every weight becomes the
 * reference's value exactly — (q - zero) is exact in fp32, times the scale rounded once —
 * and the fp32 FMAs follow. A byte's two nibbles are an even and an odd k, so the
 * activations use the bf16 path's split layout (per 2·VW values, the even ones then the
 * odd ones) and no shuffle reorders the weights:
 * - AVX-512: 16 bytes widen to 16 dwords; vpermps with a dword's low 4 bits indexes a
 *   16-entry table T[i] = (i - zero) * scale (the group's 16 possible weights, built once
 *   a group), the dword shifted right by 4 indexes it for the odd k.
 * - AVX2 (vpermps has 8 entries): the nibbles convert to fp32 and one FMA applies
 *   scale and zero, q·s − z·s: both products are exact in fp32 (4 and 8 bits times
 *   fp16's 11), so the FMA's one rounding is the reference's.
 * - portable C: the reference's expression.
 * GEMM (many tokens, AVX-512 / AMX): rows dequantise to bf16 with the group's scale folded
 * in (the table's fp32 weights rounded to bf16 once a group), as fp8 rows do (em_quant.h).
 *
 * MXFP4 (edgemoe/quant/mxfp4.py: gpt-oss's layout) is the same nibbles with a 16-entry
 * table that is the E2M1 values times the group's 2^(e-127) (e an E8M0 byte a group of
 * 32): exact products, as the reference's ldexp. AVX2 reads E2M1 magnitudes from an
 * 8-entry vpermps table with the sign bit moved in; the GEMM path's bf16 rows are the
 * table's values (E2M1 times a power of two: exact in bf16 unless past its range).
 *
 * NOTE: grp is a multiple of 32 (em_experts checks): a group starts at a whole step and
 * at an even k (whole bytes), and a group's table serves whole steps. Included by
 * em_quant.h after its ISA section.
 */
#ifndef EM_INT4_H
#define EM_INT4_H

/* fp16 bits → fp32, exact (scales: once per group and row). */
static inline float em_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u, u;
    if (e == 0) { /* zero or subnormal: m · 2^-24, exact in fp32 */
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    u = e == 31 ? sign | 0x7F800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Four rows of an int4 matrix: data, fp16 scales and zero points, each from the row's start;
 * mxfp4 (mx): data and E8M0 exponents (e). */
typedef struct {
    const uint8_t *w[4];
    const uint16_t *s[4];
    const uint8_t *z[4];
    const uint8_t *e[4];
    int mx;
} em_i4rows;

/* E2M1 code → value (bit 3: the sign; code 8 is -0, as the reference's table). */
static const float em_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E8M0 byte → 2^(e - 127) in fp32, exact (0: the subnormal 2^-127; 255, NaN in E8M0: inf). */
static inline float em_e8m0(uint8_t e) {
    uint32_t u = e ? (uint32_t)e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(EM_ISA_AVX512) || defined(EM_ISA_AMX)
#define EM_I4STEP 32 /* k per step: 16 bytes */

/* 16 bytes of row w holding k .. k+31, widened; `whole` (a constant at each use): all 16
 * in the row, else masked past the row's ceil(K/2) bytes. */
static inline __attribute__((always_inline)) __m512i em_i4_load(const uint8_t *w, int k, int K, const int whole) {
    if (whole) return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + (unsigned)k / 2)));
    unsigned nb = (unsigned)(K - k + 1) / 2;
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << nb) - 1u), w + (unsigned)k / 2));
}

/* The group's 16 possible weights: T[i] = (i - zero) * scale, as the reference rounds them
 * (the fp16 scale converted exactly by the hardware, in every lane). */
static inline __attribute__((always_inline)) __m512 em_i4_table(const em_i4rows *m, int r, int g) {
    if (m->mx) return _mm512_mul_ps(_mm512_loadu_ps(em_e2m1), _mm512_set1_ps(em_e8m0(m->e[r][g])));
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 q = _mm512_sub_ps(iota, _mm512_set1_ps((float)m->z[r][g]));
    return _mm512_mul_ps(q, _mm512_cvtph_ps(_mm256_set1_epi16((short)m->s[r][g])));
}

#define EM_I4ROW512(r, whole)                                                   \
    {                                                                           \
        if ((k & 127) == 0) EM_PREFETCH(m->w[r] + (unsigned)k / 2, pf);         \
        __m512i d = em_i4_load(m->w[r], k, K, whole);                           \
        __m512 we = _mm512_permutexvar_ps(d, t##r);                             \
        __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), t##r);       \
        EM_FMA2(a##r##0, xe0, xo0);                                             \
        if (nt > 1) EM_FMA2(a##r##1, xe1, xo1);                                 \
        if (nt > 2) EM_FMA2(a##r##2, xe2, xo2);                                 \
        if (nt > 3) EM_FMA2(a##r##3, xe3, xo3);                                 \
    }

/* The step's activations: even k, then odd k, of each token (NOTE: xs is zero-padded
 * past K to a multiple of 32: whole loads stay in bounds). */
#define EM_I4X512                                                                                             \
    __m512 xe0 = _mm512_loadu_ps(xs + k), xo0 = _mm512_loadu_ps(xs + k + 16);                                 \
    __m512 xe1 = z, xo1 = z, xe2 = z, xo2 = z, xe3 = z, xo3 = z;                                              \
    if (nt > 1) xe1 = _mm512_loadu_ps(xs + xss + k), xo1 = _mm512_loadu_ps(xs + xss + k + 16);                \
    if (nt > 2) xe2 = _mm512_loadu_ps(xs + 2 * xss + k), xo2 = _mm512_loadu_ps(xs + 2 * xss + k + 16);        \
    if (nt > 3) xe3 = _mm512_loadu_ps(xs + 3 * xss + k), xo3 = _mm512_loadu_ps(xs + 3 * xss + k + 16);

/* dots[r*nt + t] = sum_k W[r][k] * x_t[k]; xs in split layout, zero-padded to 32. */
static inline __attribute__((always_inline)) void em_gemv4_i4_impl(const em_i4rows *m, int grp, const float *xs,
                                                                    int64_t xss, const int nt, int K, int64_t pf,
                                                                    float *dots) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512 a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    for (int k0 = 0, g = 0; k0 < K; k0 += grp, g++) {
        const __m512 t0 = em_i4_table(m, 0, g), t1 = em_i4_table(m, 1, g);
        const __m512 t2 = em_i4_table(m, 2, g), t3 = em_i4_table(m, 3, g);
        const int k1 = K - k0 < grp ? K : k0 + grp;
        int k = k0;
        for (; k + EM_I4STEP <= k1; k += EM_I4STEP) {
            EM_I4X512 EM_I4ROW512(0, 1) EM_I4ROW512(1, 1) EM_I4ROW512(2, 1) EM_I4ROW512(3, 1)
        }
        if (k < k1) { /* the row's last step, partial (the last group only) */
            EM_I4X512 EM_I4ROW512(0, 0) EM_I4ROW512(1, 0) EM_I4ROW512(2, 0) EM_I4ROW512(3, 0)
        }
    }
    const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = _mm512_reduce_add_ps(acc[r][t]);
}

/* v rounded to bf16 (nearest even), as fp32: its low half zero. */
static inline __m512 em_round_bf16_ps(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

/* n values of m's row 0 → bf16 with the group's scale folded in (GEMM path): each group's
 * table (em_i4_table: the reference's fp32 weights) rounded to bf16 once, then each
 * value's top half. */
static inline void em_i4_to_bf16(const em_i4rows *m, int grp, int n, uint16_t *out) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 t = _mm512_setzero_ps();
    for (int k = 0; k < n; k += EM_I4STEP) {
        if (k % grp == 0) t = em_round_bf16_ps(em_i4_table(m, 0, k / grp));
        __m512i d = n - k >= EM_I4STEP ? em_i4_load(m->w[0], k, n, 1) : em_i4_load(m->w[0], k, n, 0);
        __m512i e = _mm512_castps_si512(_mm512_permutexvar_ps(d, t));
        __m512i o = _mm512_castps_si512(_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), t));
        __m512i pair = _mm512_or_si512(_mm512_and_si512(o, hi), _mm512_srli_epi32(e, 16)); /* (odd, even) */
        __mmask32 mk = n - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (n - k)) - 1u);
        _mm512_mask_storeu_epi16(out + k, mk, pair); /* NOTE: never past n: the next row follows */
    }
}

#elif defined(EM_ISA_AVX2)
#define EM_I4STEP 16 /* k per step: 8 bytes */

/* 8 bytes of row w holding k .. k+15, widened; `whole` (a constant at each use): all 8 in
 * the row, else the row's last bytes (no masked byte loads in AVX2). */
static inline __attribute__((always_inline)) __m256i em_i4_load8(const uint8_t *w, int k, int K, const int whole) {
    if (whole) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + (unsigned)k / 2)));
    uint8_t buf[16] = {0};
    memcpy(buf, w + (unsigned)k / 2, (size_t)(K - k + 1) / 2);
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)buf));
}

#define EM_I4ROW256(r, whole)                                                                \
    {                                                                                        \
        if (whole) EM_PREFETCH(m->w[r] + (unsigned)k / 2, pf);                               \
        __m256i d = em_i4_load8(m->w[r], k, K, whole);                                       \
        __m256 qe = _mm256_cvtepi32_ps(_mm256_and_si256(d, lo4));                            \
        __m256 qo = _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4));                             \
        __m256 we = _mm256_fmadd_ps(qe, s##r, nzs##r), wo = _mm256_fmadd_ps(qo, s##r, nzs##r); \
        EM_FMA2_256(a##r##0, xe0, xo0);                                                      \
        if (nt > 1) EM_FMA2_256(a##r##1, xe1, xo1);                                          \
    }

/* mxfp4: the E2M1 values of 8 codes q (low 4 bits; the rest zero), times the group's
 * power of two: the magnitude from an 8-entry table, the sign bit moved in. */
#define EM_MXW256(q, r)                                                                                \
    _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(                                                 \
                      _mm256_castps_si256(_mm256_permutevar8x32_ps(mag, q)),                          \
                      _mm256_slli_epi32(_mm256_and_si256(q, b8), 28))),                               \
                  s##r)

#define EM_MXROW256(r, whole)                                                                    \
    {                                                                                            \
        if (whole) EM_PREFETCH(m->w[r] + (unsigned)k / 2, pf);                                   \
        __m256i d = em_i4_load8(m->w[r], k, K, whole);                                           \
        __m256i qe = _mm256_and_si256(d, lo4), qo = _mm256_srli_epi32(d, 4);                     \
        __m256 we = EM_MXW256(qe, r), wo = EM_MXW256(qo, r);                                      \
        EM_FMA2_256(a##r##0, xe0, xo0);                                                          \
        if (nt > 1) EM_FMA2_256(a##r##1, xe1, xo1);                                              \
    }

#define EM_MXGROUP256(r) const __m256 s##r = _mm256_set1_ps(em_e8m0(m->e[r][g]));

/* A row's group constants: scale and −zero·scale (exact), broadcast. */
#define EM_I4GROUP256(r)                                                          \
    const float f##r = _cvtsh_ss(m->s[r][g]); /* F16C: exact */                  \
    const __m256 s##r = _mm256_set1_ps(f##r), nzs##r = _mm256_set1_ps(-(float)m->z[r][g] * f##r);

#define EM_I4X256                                                                              \
    __m256 xe0 = _mm256_loadu_ps(xs + k), xo0 = _mm256_loadu_ps(xs + k + 8), xe1 = z, xo1 = z; \
    if (nt > 1) xe1 = _mm256_loadu_ps(xs + xss + k), xo1 = _mm256_loadu_ps(xs + xss + k + 8);

static inline __attribute__((always_inline)) void em_gemv4_i4_impl(const em_i4rows *m, int grp, const float *xs,
                                                                    int64_t xss, const int nt, int K, int64_t pf,
                                                                    float *dots) {
    const __m256 z = _mm256_setzero_ps();
    const __m256i lo4 = _mm256_set1_epi32(15), b8 = _mm256_set1_epi32(8);
    const __m256 mag = _mm256_loadu_ps(em_e2m1);
    __m256 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
    for (int k0 = 0, g = 0; k0 < K; k0 += grp, g++) {
        const int k1 = K - k0 < grp ? K : k0 + grp;
        int k = k0;
        if (m->mx) { /* a group of 32: whole steps but the row's last */
            EM_MXGROUP256(0) EM_MXGROUP256(1) EM_MXGROUP256(2) EM_MXGROUP256(3)
            for (; k + EM_I4STEP <= k1; k += EM_I4STEP) {
                EM_I4X256 EM_MXROW256(0, 1) EM_MXROW256(1, 1) EM_MXROW256(2, 1) EM_MXROW256(3, 1)
            }
            if (k < k1) {
                EM_I4X256 EM_MXROW256(0, 0) EM_MXROW256(1, 0) EM_MXROW256(2, 0) EM_MXROW256(3, 0)
            }
            continue;
        }
        EM_I4GROUP256(0) EM_I4GROUP256(1) EM_I4GROUP256(2) EM_I4GROUP256(3)
        for (; k + EM_I4STEP <= k1; k += EM_I4STEP) {
            EM_I4X256 EM_I4ROW256(0, 1) EM_I4ROW256(1, 1) EM_I4ROW256(2, 1) EM_I4ROW256(3, 1)
        }
        if (k < k1) { /* the row's last step, partial */
            EM_I4X256 EM_I4ROW256(0, 0) EM_I4ROW256(1, 0) EM_I4ROW256(2, 0) EM_I4ROW256(3, 0)
        }
    }
    const __m256 acc[4][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = em_hsum256(acc[r][t]);
}

#else /* portable C: plain layout (split layout with VW = 1) */

static inline __attribute__((always_inline)) void em_gemv4_i4_impl(const em_i4rows *m, int grp, const float *xs,
                                                                    int64_t xss, const int nt, int K, int64_t pf,
                                                                    float *dots) {
    float acc[4][EM_NT] = {{0}};
    (void)pf;
    for (int k0 = 0, g = 0; k0 < K; k0 += grp, g++) {
        const int k1 = K - k0 < grp ? K : k0 + grp;
        for (int r = 0; r < 4; r++) {
            const float s = m->mx ? em_e8m0(m->e[r][g]) : em_f16_to_f32(m->s[r][g]), zr = m->mx ? 0.0f : (float)m->z[r][g];
            for (int k = k0; k < k1; k++) {
                int q = (m->w[r][k / 2] >> (4 * (k & 1))) & 15;
                float wk = m->mx ? em_e2m1[q] * s : ((float)q - zr) * s; /* the reference's rounding */
                for (int t = 0; t < nt; t++) acc[r][t] += wk * xs[t * xss + k];
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = acc[r][t];
}
#endif

/* Constant token counts: the accumulators stay in registers. */
#define EM_GEMV4_I4(name, nt)                                                                                 \
    static void name(const em_i4rows *m, int grp, const float *xs, int64_t s, int K, int64_t pf, float *d) { \
        em_gemv4_i4_impl(m, grp, xs, s, nt, K, pf, d);                                                        \
    }
EM_GEMV4_I4(em_gemv4_i4_1, 1)
EM_GEMV4_I4(em_gemv4_i4_2, 2)
#if EM_NT >= 4
EM_GEMV4_I4(em_gemv4_i4_3, 3)
EM_GEMV4_I4(em_gemv4_i4_4, 4)
#endif

/* dots[r*nt + t] = sum_k W[r][k] * x_t[k] for the 4 rows of m, nt <= EM_NT tokens. */
static void em_gemv4_i4(const em_i4rows *m, int grp, const float *xs, int64_t xss, int nt, int K, int64_t pf,
                        float *dots) {
    switch (nt) {
    case 1: em_gemv4_i4_1(m, grp, xs, xss, K, pf, dots); break;
    case 2: em_gemv4_i4_2(m, grp, xs, xss, K, pf, dots); break;
#if EM_NT >= 4
    case 3: em_gemv4_i4_3(m, grp, xs, xss, K, pf, dots); break;
    default: em_gemv4_i4_4(m, grp, xs, xss, K, pf, dots); break;
#endif
    }
}

#endif
