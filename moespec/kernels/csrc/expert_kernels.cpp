// Native expert kernels of moespec: the per-slot and the deduplicating expert operation of one MoE layer,
// fp32 or bf16 weights, AVX2 + FMA, OpenMP threads sharing the rows of every weight matrix. With bf16 weights
// and bf16 x on a CPU with AVX512-BF16 (detected at run time), both phases multiply on the dot path (vdpbf16ps):
// 256-bit tiles for groups of a few tokens, where the weights' stream sets the time, and 512-bit wide tiles from
// kWideMinTokens tokens, where the multiply-adds would; where the CPU also has AMX, from kAmxMinTokens tokens on the
// tile registers (amx_tiles.h), which stay near the weights' stream to 16 tokens and more.
// The physics, the shape legend and the Python entry point are in moespec/kernels/__init__.py; this file is loaded
// through ctypes (plain C ABI, no torch headers), so it builds in seconds with g++ alone.
//
// One "group" = one expert applied to a list of (token, router weight) entries:
//   slot mode  : one group per slot (t, j), in token-major order  -> an expert is streamed once per slot;
//   dedup mode : one group per distinct expert, ascending id       -> an expert is streamed once per pass.
// Per group, phase 1 streams the gate and up rows (length d) once, applying each row chunk to every entry's
// token with the accumulators in registers, then the activation; phase 2 streams the down rows (length f)
// once and adds weight * (down h + bias) into each entry's output row. Both phases are cut into row tasks
// that the threads take in turn (see run). The same code runs both modes, so neither is handicapped: they
// differ only in how the slots are grouped.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"
#include "expert_tiles.h"
#include "simd_common.h"

namespace {

using namespace moespec_simd;   // bf16, to_f32, to_bf16, load8, hsum, cpu_has_dot
using namespace moespec_tiles;  // the register tiles (expert_tiles.h) and their sizes
using namespace moespec_amx;    // the AMX tiles (amx_tiles.h)


// Rows per work chunk (a multiple of kTileRows).
constexpr int kRowChunk = 8;
// One-token groups read their rows one after the other with no software prefetch, or in the 4-row tiles that
// larger groups use (which load each input once per 4 rows), by the CPU's prefetcher: simd_common.h,
// one_token_tiles.
// Software prefetch distance of the 4-row tiles, in bytes of weights ahead of the tile being read (whole
// tiles). A gate or up row is one 4 KiB page and a down row half of one, so the hardware prefetcher,
// which stops at page ends, retrains on every row; the prefetch keeps this many bytes in flight per core
// instead, one request per cache line consumed, into L2 (_MM_HINT_T1; into L1, _MM_HINT_T0 evicts the
// rows being read: -30%). 16 KiB measured 1-4% faster than 32 KiB, 64 KiB 3-5% slower.
constexpr int64_t kPrefetchBytes = 16 << 10;
// Row tasks start on multiples of this many rows: whole row chunks, and whole 16-element blocks of the
// activation h, which each phase-1 task packs for its own rows.
constexpr int kSplitAlign = 16;
// Columns per block: the fp32 inputs of all of a group's tokens over one column block fit in 16 KiB, half
// of L1, beside the rows of the tile being applied to them (a one-token group takes a whole 4096-wide row).
constexpr int64_t kColBlockBytes = 16 << 10;
// Groups of at most this many tokens prefetch their 4-row tiles. Up to ~6 tokens a core's tiles (~30
// GMAC/s) consume weights faster than its share of DRAM bandwidth delivers them, so the loads must be in
// flight early; beyond, the pass is compute-bound, the hardware prefetcher keeps up, and the prefetch
// instructions would only take issue slots from the FMAs (~30% measured on L2-resident rows).
constexpr int64_t kPrefetchMaxTokens = 6;
// Groups of at least this many tokens take the wide tiles on the dot path (expert_tiles.h), compute-bound from
// ~8 tokens.
constexpr int64_t kWideMinTokens = 4;
// Groups of at least this many tokens take the AMX tiles where the CPU has them (amx_tiles.h), which stay near the
// weights' stream where the wide tiles are bound by their multiply-adds from ~8 tokens (cold OLMoE experts on a 2-core
// Xeon, a pass of 16 experts: 7.8-8.0 ms at 4-8 tokens, 8.3 at 16 and 10.1 at 32, against 11.7, 20.7 and 45.9 on the
// wide tiles at 8, 16 and 32 and 7.1-7.4 for one token); at 4 and 6 tokens the two are level.
constexpr int64_t kAmxMinTokens = 6;
// Columns per block of the wide tiles: the bf16 inputs of all of a group's tokens over one block fit in 24 KiB
// of L1 beside the tile's rows, so the token blocks after the first read the rows from L1.
constexpr int64_t kWideColBlockBytes = 24 << 10;
// Groups of at most this many tokens prefetch the wide tiles' rows: up to there the wide tiles consume weights
// about as fast as DRAM delivers them.
constexpr int64_t kWidePrefetchMaxTokens = 16;
// Padding of the packed input rows: strides that are multiples of 4 KiB would put the same column of every
// token in the same L1 set.
constexpr int64_t kPadFloats = 16;
// Weights per row task (~1 MiB, 4 tasks per OLMoE gate, up or down matrix): small enough that both threads
// share every matrix evenly and a descheduled thread holds back little, large enough that the per-task
// start costs little: each task begins a new sequential stream, which the hardware prefetcher must pick
// up cold. Measured against 0.5 MiB: +2-6% at ~60 GB/s, neutral at ~35 GB/s; 0.25 MiB: -7-13%.
constexpr int64_t kTaskBytes = 1 << 20;
// Groups a thread may run ahead of the slowest (ring slots of the activation h).
constexpr int64_t kLookahead = 4;
// Busy-wait rounds before a waiting thread starts yielding its core.
constexpr int kSpinsBeforeYield = 1 << 12;




// e^x for fp32 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative
// error below 2e-7), 2^n built in the exponent field. Inputs are clamped to the normal fp32 range.
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 in two parts, exact product
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

enum Act { kSilu = 0, kGptOss = 1 };

struct ActParams {
    int kind;
    float alpha;  // gpt-oss: sigmoid slope
    float limit;  // gpt-oss: clamp
};

// h = silu(g) * u, or gpt-oss: g' = min(g, limit), u' = clamp(u, -limit, limit), h = (u' + 1) g' sigmoid(alpha g').
inline __m256 act8(__m256 g, __m256 u, const ActParams& a) {
    const __m256 one = _mm256_set1_ps(1.0f);
    if (a.kind == kSilu) {
        __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
    }
    const __m256 lim = _mm256_set1_ps(a.limit);
    g = _mm256_min_ps(g, lim);
    u = _mm256_max_ps(_mm256_min_ps(u, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
    __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-a.alpha), g))));
    return _mm256_mul_ps(_mm256_add_ps(u, one), _mm256_mul_ps(g, sig));
}

inline float act1(float g, float u, const ActParams& a) {
    if (a.kind == kSilu) return g / (1.0f + std::exp(-g)) * u;
    g = std::min(g, a.limit);
    u = std::max(std::min(u, a.limit), -a.limit);
    return (u + 1.0f) * (g / (1.0f + std::exp(-a.alpha * g)));
}


// Where a tile's prefetch points: the rows `ahead` rows past row r of a task's stream, rows [lo, hi) of w and then,
// when `next` is not null, the same rows of the matrix `next` (same K) that the caller reads right after; null
// unless all `rows` of them lie in it.
template <class W>
struct Ahead {
    const W* w;
    const W* next;
    int64_t K, lo, hi, ahead;
    const W* operator()(int64_t r, int64_t rows) const {
        const int64_t q = r + ahead;
        if (q + rows <= hi) return w + q * K;
        if (next && q >= hi && q + rows <= 2 * hi - lo) return next + (q - hi + lo) * K;
        return nullptr;
    }
};

// The loop both tile sizes share: rows [lo, hi) in chunks of kRowChunk; within a chunk, the columns in blocks of kb
// and the rows in tiles of kTileRows (the last ones one at a time), each tile applied to the G tokens in `blocks`
// blocks of sizes as even as possible by tile(R, row, block, first token, tokens, k0, k1, sums), R a
// std::integral_constant; then the chunk's sums to y[t * ldy + row - lo] (res: scratch of kRowChunk * G floats).
template <class Tile>
void in_tiles(int64_t K, int64_t lo, int64_t hi, int64_t G, int64_t blocks, int64_t kb, float* y, int64_t ldy,
              float* res, Tile tile) {
    auto each_block = [&](auto R, int64_t row, int64_t k0, int64_t k1, float* sums) __attribute__((always_inline)) {
        for (int64_t i = 0; i < blocks; ++i) {
            const int64_t b = G * i / blocks;
            tile(R, row, i, b, G * (i + 1) / blocks - b, k0, k1, sums + b);
        }
    };
    for (int64_t r0 = lo; r0 < hi; r0 += kRowChunk) {
        const int rows = static_cast<int>(std::min<int64_t>(kRowChunk, hi - r0));
        std::fill(res, res + kRowChunk * G, 0.0f);
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            const int64_t k1 = std::min(K, k0 + kb);
            int r = 0;
            for (; r + kTileRows <= rows; r += kTileRows)
                each_block(std::integral_constant<int, kTileRows>{}, r0 + r, k0, k1, res + r * G);
            for (; r < rows; ++r) each_block(std::integral_constant<int, 1>{}, r0 + r, k0, k1, res + r * G);
        }
        for (int r = 0; r < rows; ++r)
            for (int64_t t = 0; t < G; ++t) y[t * ldy + r0 - lo + r] = res[r * G + t];
    }
}

// y[t * ldy + r - lo] = <row r of w, xs[t]> for rows [lo, hi) with the wide tiles (bf16 weights and inputs, G >=
// kWideMinTokens): as matvec_rows below, in column blocks of kWideColBlockBytes of inputs and token blocks of at
// most kWideTokens; up to kWidePrefetchMaxTokens, each token block of a tile prefetches a tile of its own further
// ahead, so the stream stays in flight while the later blocks read the tile from L1.
void wide_rows(const bf16* w, int64_t K, int64_t lo, int64_t hi, const bf16* const* xs, int64_t G, float* y,
               int64_t ldy, float* res, const bf16* next) {
    const int64_t blocks = (G + kWideTokens - 1) / kWideTokens;
    const int64_t kb = std::max<int64_t>(32, kWideColBlockBytes / (2 * G) / 32 * 32);
    const bool pf = G <= kWidePrefetchMaxTokens;
    const Ahead<bf16> target{w, next, K, lo, hi,
                             std::max<int64_t>(kTileRows, kPrefetchBytes / (K * 2) / kTileRows * kTileRows)};
    in_tiles(K, lo, hi, G, blocks, kb, y, ldy, res, [&](auto R, int64_t r, int64_t i, int64_t b, int64_t g,
                                                        int64_t k0, int64_t k1, float* sums) {
        const bf16* pw = pf && R == kTileRows ? target(r + i * kTileRows, kTileRows) : nullptr;
        wide_tile_tokens<decltype(R)::value>(w + r * K, K, xs + b, static_cast<int>(g), k0, k1, pw, sums, G);
    });
}



// y[t * ldy + r - lo] = <row r of w, xs[t]> over K columns, for rows [lo, hi) and any number G of packed
// token vectors (res: scratch of kRowChunk * G floats). Rows are streamed once, chunk by chunk. Within a
// chunk the columns go in blocks small enough that the inputs of all G tokens stay in L1 with a tile's
// rows; each tile of kTileRows rows is applied to the tokens in blocks of at most kTileTokens, as even as possible
// (on the fma path as many as the format's Widen::blocks), the blocks after the first reading the tile's weights from
// L1.
// Prefetch (groups of at most kPrefetchMaxTokens tokens): the first token block of each tile requests the
// rows kPrefetchBytes further down this task's stream: rows [lo, hi) of w, then, when `next` is not null,
// rows [lo, hi) of the matrix `next` (same K) that the caller reads right after. Unless `warm` (the first
// rows were requested by the caller's previous matvec_rows), the stream's first kPrefetchBytes are
// requested up front, so a task does not start with a cold, unprefetched distance.
// With `xp` not null (bf16, the G tokens packed by amx_pack), the AMX tiles take the whole 16-row tiles first.
template <class W, class X>
void matvec_rows(const W* w, int64_t K, int64_t lo, int64_t hi, const X* const* xs, int64_t G, float* y,
                 int64_t ldy, float* res, const W* next, bool warm, const bf16* xp = nullptr) {
    if constexpr (std::is_same_v<X, bf16> && std::is_same_v<W, bf16>) {
        if (xp) {
            const int64_t done = amx_rows(w, K, K, lo, hi, xp, G, y, ldy, res);
            y += done - lo;
            lo = done;
            if (lo == hi) return;
        }
        if (G >= kWideMinTokens) return wide_rows(w, K, lo, hi, xs, G, y, ldy, res, next);
    }
    constexpr int64_t kLineCols = 64 / sizeof(W);
    const int64_t blocks = std::is_same_v<X, float> ? Widen<W>::blocks(G) : (G + kTileTokens - 1) / kTileTokens;
    const int64_t kb = std::max(kLineCols, kColBlockBytes / (4 * G) / kLineCols * kLineCols);
    const bool pf = G <= kPrefetchMaxTokens;
    const Ahead<W> target{w, next, K, lo, hi,
                          std::max<int64_t>(kTileRows, kPrefetchBytes / (K * static_cast<int64_t>(sizeof(W))) /
                                                           kTileRows * kTileRows)};  // rows
    if (pf && !warm)
        for (int64_t r = lo; r < std::min(hi, lo + target.ahead); ++r)
            for (int64_t k = 0; k < K; k += kLineCols)
                _mm_prefetch(reinterpret_cast<const char*>(w + r * K + k), _MM_HINT_T1);
    if (G == 1 && !one_token_tiles()) {
        for (int64_t r = lo; r < hi; ++r) {
            std::fill(res, res + G, 0.0f);
            tile_tokens<1>(w + r * K, K, xs, static_cast<int>(G), 0, K, static_cast<const W*>(nullptr), res, 1);
            for (int64_t t = 0; t < G; ++t) y[t * ldy + r - lo] = res[t];
        }
        return;
    }
    in_tiles(K, lo, hi, G, blocks, kb, y, ldy, res, [&](auto R, int64_t r, int64_t i, int64_t b, int64_t g,
                                                        int64_t k0, int64_t k1, float* sums) {
        const W* pw = pf && i == 0 ? target(r, R) : nullptr;
        tile_tokens<decltype(R)::value>(w + r * K, K, xs + b, static_cast<int>(g), k0, k1, pw, sums, G);
    });
}

// Rows per task of a matrix of M rows of K weights: about kTaskBytes of weights, a multiple of kSplitAlign, at most M
// (one task for a smaller matrix). The per-thread scratch of run holds a task's sums for the largest group and is
// zeroed every call; uncapped, a small expert's scratch cost more than its reads (the trained pair's experts: ~82 KB
// a thread per token of the largest group, against 12 KB read).
template <class W>
int64_t task_rows(int64_t M, int64_t K) {
    const int64_t rows = kTaskBytes / std::max<int64_t>(1, K * static_cast<int64_t>(sizeof(W)));
    return std::min(M, std::max<int64_t>(kSplitAlign, rows / kSplitAlign * kSplitAlign));
}


// A vector of fp32 or bf16 values (dtype code 0 or 1), read or written as fp32.
struct Vec {
    void* p;
    int dtype;
    float get(int64_t i) const {
        return dtype == 0 ? static_cast<const float*>(p)[i] : to_f32(static_cast<const bf16*>(p)[i]);
    }
    void set(int64_t i, float v) const {
        if (dtype == 0) static_cast<float*>(p)[i] = v;
        else static_cast<bf16*>(p)[i] = to_bf16(v);
    }
};

struct Problem {
    int64_t n, m, N, d, f;
    Vec x;               // [n, d]
    const int64_t* ids;  // [n, m]
    Vec rw;              // [n, m] router weights
    Vec out;             // [n, d], written
    ActParams act;
};

// The expert operation as a dataflow of row tasks. Group g has T1 phase-1 tasks (a share of the gate and
// up rows: dot products, activation, packed into h[g % kLookahead]) and T2 phase-2 tasks (a share of the
// down rows, added into the thread's own output buffer). Threads claim tasks in group order from two
// shared counters: a phase-2 task as soon as all phase-1 tasks of its group are done, else the next
// phase-1 task if its h slot is free (phase 2 of group g - kLookahead done). So the threads split the
// rows of every matrix between them like a row-parallel loop, but with no barrier: a thread that the OS
// deschedules holds up one task, not the pass, while the other one runs ahead by up to kLookahead groups.
template <class W>
int run(const Problem& P, const W* gate_up, const W* down, const W* gu_bias, const W* down_bias, bool dedup,
        int nthreads) {
    using F = Fmt<W>;
    const int64_t n = P.n, m = P.m, N = P.N, d = P.d, f = P.f, slots = n * m;
    for (int64_t s = 0; s < slots; ++s)
        if (P.ids[s] < 0 || P.ids[s] >= N) return 1;

    // Groups as (expert, [begin, end) into the entry list); entries are slot indices s = t * m + j.
    std::vector<int64_t> g_expert, g_begin, entries(slots);
    if (dedup) {  // counting sort by expert id: ascending experts, tokens in order inside each
        std::vector<int64_t> count(N + 1, 0);
        for (int64_t s = 0; s < slots; ++s) ++count[P.ids[s] + 1];
        for (int64_t e = 0; e < N; ++e) count[e + 1] += count[e];
        std::vector<int64_t> pos(count.begin(), count.end() - 1);
        for (int64_t s = 0; s < slots; ++s) entries[pos[P.ids[s]]++] = s;
        for (int64_t e = 0; e < N; ++e)
            if (count[e + 1] > count[e]) {
                g_expert.push_back(e);
                g_begin.push_back(count[e]);
            }
    } else {
        for (int64_t s = 0; s < slots; ++s) {
            entries[s] = s;
            g_expert.push_back(P.ids[s]);
            g_begin.push_back(s);
        }
    }
    const int64_t groups = static_cast<int64_t>(g_expert.size());
    g_begin.push_back(slots);
    int64_t gmax = 0;
    for (int64_t g = 0; g < groups; ++g) gmax = std::max(gmax, g_begin[g + 1] - g_begin[g]);

    const int64_t ldx = d + kPadFloats, ldh = f + kPadFloats;  // packed input and activation row strides
    std::vector<float> xin(n * d), xpk(n * ldx), rw(slots);
    for (int64_t i = 0; i < n * d; ++i) xin[i] = P.x.get(i);
    for (int64_t s = 0; s < slots; ++s) rw[s] = P.rw.get(s);
    for (int64_t t = 0; t < n; ++t) F::pack(xin.data() + t * d, 0, d, d, xpk.data() + t * ldx);
    // bf16 weights and bf16 x: both phases take the dot path on CPUs with AVX512-BF16, phase 1 on x as given,
    // phase 2 on h rounded to bf16, as the model's own bf16 forward rounds it (transformers computes act(g) * u
    // in bf16) and as ggml does (it converts the activations to the weights' dot-product type).
    const bool dot = std::is_same_v<W, bf16> && P.x.dtype == 1 && cpu_has_dot();
    std::vector<bf16> xbf(dot ? n * ldx : 0);
    for (int64_t t = 0; dot && t < n; ++t)
        std::memcpy(xbf.data() + t * ldx, static_cast<const bf16*>(P.x.p) + t * d, d * sizeof(bf16));
    const int64_t rows1 = task_rows<W>(f, 2 * d), rows2 = task_rows<W>(d, f);  // phase 1 reads gate and up rows
    const int64_t T1 = (f + rows1 - 1) / rows1, T2 = (d + rows2 - 1) / rows2;
    std::vector<float> hbuf(dot ? 0 : kLookahead * gmax * ldh);
    std::vector<bf16> hbf(dot ? kLookahead * gmax * ldh : 0);
    std::vector<std::atomic<int64_t>> done1(groups), done2(groups);
    for (int64_t g = 0; g < groups; ++g) {
        done1[g].store(0, std::memory_order_relaxed);
        done2[g].store(0, std::memory_order_relaxed);
    }
    std::atomic<int64_t> next1{0}, next2{0};
    const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nthreads, groups * std::max(T1, T2))));
    std::vector<float> outs(static_cast<size_t>(nt) * n * d, 0.0f);
    // Groups of kAmxMinTokens or more take the AMX tiles for a matrix whose rows are whole column blocks; each thread
    // packs a group's tokens (phase 1) or activations (phase 2) once, for all its tasks of that group and phase.
    const bool amx = dot && amx_ready();
    auto on_amx = [&](int64_t G, int64_t K) { return amx && G >= kAmxMinTokens && K % kAmxCols == 0; };
    const int64_t amx_len = amx ? (gmax + kAmxTokens - 1) / kAmxTokens * kAmxTokens * std::max(d, f) : 0;

#pragma omp parallel num_threads(nt)
    {
        float* my_out = outs.data() + static_cast<size_t>(omp_get_thread_num()) * n * d;
        std::vector<const float*> ptrs(gmax);
        std::vector<const bf16*> bptrs(gmax);
        std::vector<float> graw(gmax * rows1), uraw(gmax * rows1), yraw(gmax * rows2),
            res(std::max<int64_t>(kRowChunk * gmax, 4 * kAmxRows * kAmxTokens));
        std::vector<bf16> packed(amx_len);
        int64_t packed_for = -1;  // g (phase 1) or groups + g (phase 2) whose inputs `packed` holds
        auto pack_once = [&](int64_t key, int64_t G, int64_t K) -> const bf16* {
            if (packed_for != key) amx_pack(bptrs.data(), G, K, packed.data());
            packed_for = key;
            return packed.data();
        };
        int idle = 0;
        for (;;) {
            int64_t i2 = next2.load(std::memory_order_relaxed);
            if (i2 >= groups * T2) break;
            const int64_t g2 = i2 / T2;
            if (done1[g2].load(std::memory_order_acquire) == T1) {
                if (!next2.compare_exchange_weak(i2, i2 + 1, std::memory_order_relaxed)) continue;
                // Phase 2: down rows [lo, hi) against every entry's h; out[t] += weight * (down h + bias).
                const int64_t e = g_expert[g2], G = g_begin[g2 + 1] - g_begin[g2];
                const int64_t* ent = entries.data() + g_begin[g2];
                const int64_t lo = (i2 % T2) * rows2, hi = std::min(d, lo + rows2);
                const W* none = nullptr;
                if constexpr (std::is_same_v<W, bf16>)
                    if (dot) {
                        const bf16* h = hbf.data() + (g2 % kLookahead) * gmax * ldh;
                        for (int64_t i = 0; i < G; ++i) bptrs[i] = h + i * ldh;
                        const bf16* xp = on_amx(G, f) ? pack_once(groups + g2, G, f) : nullptr;
                        matvec_rows(down + e * d * f, f, lo, hi, bptrs.data(), G, yraw.data(), rows2, res.data(), none, false,
                                    xp);
                    }
                if (!dot) {
                    const float* h = hbuf.data() + (g2 % kLookahead) * gmax * ldh;
                    for (int64_t i = 0; i < G; ++i) ptrs[i] = h + i * ldh;
                    matvec_rows(down + e * d * f, f, lo, hi, ptrs.data(), G, yraw.data(), rows2, res.data(), none, false);
                }
                const W* bd = down_bias ? down_bias + e * d : nullptr;
                for (int64_t i = 0; i < G; ++i) {
                    float* o = my_out + (ent[i] / m) * d;
                    const float* y = yraw.data() + i * rows2;
                    const float wgt = rw[ent[i]];
                    for (int64_t r = lo; r < hi; ++r) o[r] += wgt * (y[r - lo] + (bd ? to_f32(bd[r]) : 0.0f));
                }
                done2[g2].fetch_add(1, std::memory_order_release);
                idle = 0;
                continue;
            }
            int64_t i1 = next1.load(std::memory_order_relaxed);
            const int64_t g1 = i1 / T1;
            if (i1 < groups * T1 && (g1 < kLookahead || done2[g1 - kLookahead].load(std::memory_order_acquire) == T2)) {
                if (!next1.compare_exchange_weak(i1, i1 + 1, std::memory_order_relaxed)) continue;
                // Phase 1: gate and up rows [lo, hi), each streamed once for all G tokens, then h = act(g, u).
                const int64_t e = g_expert[g1], G = g_begin[g1 + 1] - g_begin[g1];
                const int64_t* ent = entries.data() + g_begin[g1];
                const int64_t lo = (i1 % T1) * rows1, hi = std::min(f, lo + rows1);
                const W* gate = gate_up + e * 2 * f * d;
                const W* none = nullptr;
                if constexpr (std::is_same_v<W, bf16>)
                    if (dot) {
                        for (int64_t i = 0; i < G; ++i) bptrs[i] = xbf.data() + (ent[i] / m) * ldx;
                        const bf16* xp = on_amx(G, d) ? pack_once(g1, G, d) : nullptr;
                        matvec_rows(gate, d, lo, hi, bptrs.data(), G, graw.data(), rows1, res.data(), gate + f * d, false, xp);
                        matvec_rows(gate + f * d, d, lo, hi, bptrs.data(), G, uraw.data(), rows1, res.data(), none, true, xp);
                    }
                if (!dot) {
                    for (int64_t i = 0; i < G; ++i) ptrs[i] = xpk.data() + (ent[i] / m) * ldx;
                    matvec_rows(gate, d, lo, hi, ptrs.data(), G, graw.data(), rows1, res.data(), gate + f * d, false);
                    matvec_rows(gate + f * d, d, lo, hi, ptrs.data(), G, uraw.data(), rows1, res.data(), none, true);
                }
                const W* bg = gu_bias ? gu_bias + e * 2 * f : nullptr;
                const W* bu = gu_bias ? bg + f : nullptr;
                const int64_t hslot = (g1 % kLookahead) * gmax * ldh;
                for (int64_t i = 0; i < G; ++i) {
                    float* gr = graw.data() + i * rows1;  // row j at gr[j - lo]; overwritten by h, then packed
                    const float* ur = uraw.data() + i * rows1;
                    int64_t j = lo;
                    for (; j + kLanes <= hi; j += kLanes) {
                        __m256 gv = _mm256_loadu_ps(gr + j - lo), uv = _mm256_loadu_ps(ur + j - lo);
                        if (bg) {
                            gv = _mm256_add_ps(gv, load8(bg + j));
                            uv = _mm256_add_ps(uv, load8(bu + j));
                        }
                        _mm256_storeu_ps(gr + j - lo, act8(gv, uv, P.act));
                    }
                    for (; j < hi; ++j)
                        gr[j - lo] = act1(gr[j - lo] + (bg ? to_f32(bg[j]) : 0.0f),
                                          ur[j - lo] + (bu ? to_f32(bu[j]) : 0.0f), P.act);
                    if (dot) round_bf16(gr, hi - lo, hbf.data() + hslot + i * ldh + lo);
                    else F::pack(gr, 0, hi - lo, hi - lo, hbuf.data() + hslot + i * ldh + lo);
                }
                done1[g1].fetch_add(1, std::memory_order_release);
                idle = 0;
                continue;
            }
            // Nothing claimable: another thread holds the tasks this one waits for.
            if (++idle < kSpinsBeforeYield) _mm_pause();
            else std::this_thread::yield();
        }
    }
    for (int64_t i = 0; i < n * d; ++i) {
        float v = 0.0f;
        for (int t = 0; t < nt; ++t) v += outs[static_cast<size_t>(t) * n * d + i];
        P.out.set(i, v);
    }
    return 0;
}

}  // namespace

extern "C" {

// Bumped whenever the signature of an exported function changes (the loader checks it).
int moespec_abi_version() { return 2; }

// Dtype codes: 0 fp32, 1 bf16. wdtype: weights and biases; xdtype: x and out; rdtype: router weights.
// mode: 0 per-slot, 1 dedup; act: 0 silu, 1 gpt-oss. All arrays contiguous; ids int64. out [n, d] is
// written. Returns 0, or 1 on an expert id outside [0, N).
int moespec_expert_op(int wdtype, int xdtype, int rdtype, int mode, int act, float alpha, float limit, int64_t n,
                      int64_t m, int64_t N, int64_t d, int64_t f, const void* x, const int64_t* ids, const void* rw,
                      const void* gate_up, const void* down, const void* gate_up_bias, const void* down_bias,
                      void* out, int nthreads) {
    Problem P{n, m, N, d, f, Vec{const_cast<void*>(x), xdtype}, ids, Vec{const_cast<void*>(rw), rdtype},
              Vec{out, xdtype}, ActParams{act, alpha, limit}};
    if (wdtype == 0)
        return run<float>(P, static_cast<const float*>(gate_up), static_cast<const float*>(down),
                          static_cast<const float*>(gate_up_bias), static_cast<const float*>(down_bias),
                          mode == 1, nthreads);
    return run<bf16>(P, static_cast<const bf16*>(gate_up), static_cast<const bf16*>(down),
                     static_cast<const bf16*>(gate_up_bias), static_cast<const bf16*>(down_bias), mode == 1,
                     nthreads);
}

// Streaming read of nbytes (a multiple of 32) split in contiguous parts between threads: the device
// ceiling. Where the kernels prefetch their one-token rows (one_token_tiles: Intel CPUs, whose hardware prefetcher
// serves a plain sequential read below what the kernels' prefetched tiles reach), it requests the lines
// kPrefetchBytes ahead as they do, so the ceiling is what memory delivers to the kernels' read. Returns an xor of
// the data so the loads cannot be optimized away.
uint64_t moespec_stream_read(const void* buf, int64_t nbytes, int nthreads) {
    const int64_t vecs = nbytes / 32;
    const __m256i* p = static_cast<const __m256i*>(buf);
    const int64_t ahead = one_token_tiles() ? kPrefetchBytes / 32 : 0;  // in vectors; 0: no software prefetch
    uint64_t total = 0;
#pragma omp parallel num_threads(nthreads) reduction(^ : total)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t per = (vecs + nt - 1) / nt, lo = std::min(vecs, tid * per), hi = std::min(vecs, lo + per);
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        auto step = [&](int64_t i) __attribute__((always_inline)) {  // two cache lines
            a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(p + i));
            a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(p + i + 1));
            a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(p + i + 2));
            a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(p + i + 3));
        };
        int64_t i = lo;
        for (; ahead && i + ahead + 4 <= hi; i += 4) {  // each line requested `ahead` vectors before it is read
            _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead), _MM_HINT_T1);
            _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead + 2), _MM_HINT_T1);
            step(i);
        }
        for (; i + 4 <= hi; i += 4) step(i);
        for (; i < hi; ++i) a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(p + i));
        __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
        alignas(32) uint64_t lanes[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
        total ^= lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
    }
    return total;
}

}  // extern "C"
