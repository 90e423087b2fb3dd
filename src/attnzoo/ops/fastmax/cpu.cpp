// Fused CPU kernel for the unmasked Fastmax forward with p = 1 (FAST eqs 5-12 / 26-29), float32 and float64.
//
// Why: the PyTorch path makes about ten passes over (B, H, N, D) tensors for this case: the value checks of q,
// k, v, two layer norms (each read and written), the moment sums, the product with the queries, the
// denominator and the division, each allocating a fresh output. Here a task is one (batch, head) and reads q,
// k, v once and writes the output once:
//   keys:    per block of kBlock tokens, standardise k (eqs 5-6) into a buffer with a trailing 1, copy v
//            with a trailing 1, and add the block's kb^T vb to M = sum_n [k_hat_n, 1] [v_n, 1]^T, which holds
//            K^T V, sum_n k_hat_n (last column), sum_n v_n (last row) and N (corner): eqs 28-29's moments.
//   queries: per block, standardise and scale q into a buffer with a trailing 1; then [num | G] = qb M and
//            out = num / G (eqs 11-12).
// The value checks ride along: per task, max |x| of q, k and v and a flag for NaN/Inf, so the caller raises
// the same errors (non-finite input, overflow bounds) as before without another pass over the inputs.
// Both products are register-blocked (kRows x kLanes accumulators): the only flops of the op.
// Padded batches and packed rows (fastmax_p1_segments, forward and backward): with per-token sequence ids (B, N) (-1 at
// padding), each sequence of a row gets its own M, summed over its real keys only, and each query reads its own
// sequence's M; a block is cut into runs of one id (contiguous: the ids never decrease over real tokens), so
// there is no padding to a common length and no copy; padding outputs zero.
// The backward (fastmax_p1_backward) is FAST §2.5's in moment form fused with the standardisations' backward,
// over the same runs.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

using at::Tensor;

namespace {

constexpr int64_t kBlock = 64;  // tokens per block: the block's buffers (kBlock x ~64 values each) stay in L1/L2
constexpr int kRows = 8;        // rows of the register block

template <typename T>
constexpr int lanes() {
  return 64 / static_cast<int>(sizeof(T));  // one 64-byte vector of T (a cache line)
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// max |x| and NaN/Inf of the values a task read, in vector registers until the end of the task
template <typename T>
struct Seen;

#if defined(__AVX512F__)
constexpr bool kSimd = true;

// The 64-byte vector of T and the handful of operations the kernel needs, for float and double.
template <typename T>
struct Vec;

// float and double differ only in the intrinsics' suffix (ps / pd), the mask type and the lane count.
#define ATTNZOO_VEC512(T, S, MASK, FULL)                                                                              \
  template <>                                                                                                         \
  struct Vec<T> {                                                                                                     \
    using R = decltype(_mm512_setzero_##S());                                                                         \
    using M = MASK;                                                                                                   \
    static M mask(int64_t n) { return n >= lanes<T>() ? M(FULL) : M((1u << n) - 1); }                                 \
    static R zero() { return _mm512_setzero_##S(); }                                                                  \
    static R set1(T a) { return _mm512_set1_##S(a); }                                                                 \
    static R load(const T* p) { return _mm512_loadu_##S(p); }                                                         \
    static R load(const T* p, M m) { return _mm512_maskz_loadu_##S(m, p); }                                           \
    static void store(T* p, R x) { _mm512_storeu_##S(p, x); }                                                         \
    static void store(T* p, R x, M m) { _mm512_mask_storeu_##S(p, m, x); }                                            \
    static R fma(R a, R b, R c) { return _mm512_fmadd_##S(a, b, c); }                                                 \
    static R add(R a, R b) { return _mm512_add_##S(a, b); }                                                           \
    static R sub(R a, R b) { return _mm512_sub_##S(a, b); }                                                           \
    static R mask_sub(R a, M m, R b) { return _mm512_maskz_sub_##S(m, a, b); }                                        \
    static R mul(R a, R b) { return _mm512_mul_##S(a, b); }                                                           \
    static R div(R a, R b) { return _mm512_div_##S(a, b); }                                                           \
    static R max(R a, R b) { return _mm512_max_##S(a, b); }                                                           \
    static R abs(R a) { return _mm512_abs_##S(a); }                                                                   \
    static T sum(R a) { return _mm512_reduce_add_##S(a); }                                                            \
    static T hmax(R a) { return _mm512_reduce_max_##S(a); }                                                           \
  };

ATTNZOO_VEC512(float, ps, __mmask16, 0xFFFF)
ATTNZOO_VEC512(double, pd, __mmask8, 0xFF)
#undef ATTNZOO_VEC512

// C[r][0:W] += sum_{t < K} A[r * ar + t * at] * B[t * bs + 0:W] for r < kRows: the register-blocked inner
// product of both phases (keys: A = kb^T, t runs over tokens; queries: A = qb, t runs over features).
template <typename T>
inline void block_product(const T* A, int64_t ar, int64_t at, const T* B, int64_t bs, int64_t K, T* C, int64_t cs) {
  using V = Vec<T>;
  typename V::R acc[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc[r] = V::load(C + r * cs);
  for (int64_t t = 0; t < K; ++t) {
    const typename V::R b = V::load(B + t * bs);
    const T* a = A + t * at;
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) acc[r] = V::fma(V::set1(a[r * ar]), b, acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) V::store(C + r * cs, acc[r]);
}

template <typename T>
struct Seen {
  using V = Vec<T>;
  typename V::R absmax = V::zero(), poison = V::zero();  // poison: sum of x * 0, NaN once any x is NaN or +-Inf
  inline void add(typename V::R x) {
    absmax = V::max(absmax, V::abs(x));
    poison = V::fma(x, V::zero(), poison);
  }
  // the masked-off lanes load as 0: they change neither value
  inline void row(const T* x, int64_t n) {
    constexpr int W = lanes<T>();
    for (int64_t i = 0; i < n; i += W) add(V::load(x + i, V::mask(n - i)));
  }
  T max_abs() const { return V::hmax(absmax); }
  T nan_if_seen() const { return V::sum(poison); }
};

// dst[0:D] = scale * (x - mean(x)) / sqrt(var(x) + eps) (eqs 5-6), dst[D] = 1; the row's padding stays 0
template <typename T>
inline void standardize_row(const T* x, int64_t D, T scale, T eps, T* dst, Seen<T>& seen, T* moments) {
  using V = Vec<T>;
  constexpr int W = lanes<T>();
  typename V::R s = V::zero();
  for (int64_t i = 0; i < D; i += W) {
    const typename V::R xi = V::load(x + i, V::mask(D - i));
    seen.add(xi);
    s = V::add(s, xi);
  }
  const T mean = V::sum(s) / static_cast<T>(D);
  const typename V::R vm = V::set1(mean);
  typename V::R ss = V::zero();
  for (int64_t i = 0; i < D; i += W) {
    const auto m = V::mask(D - i);
    // masked-off lanes must add 0, not mean^2: subtract the mean only where x was loaded
    const typename V::R c = V::load(x + i, m);
    const typename V::R d = V::mask_sub(c, m, vm);
    ss = V::fma(d, d, ss);
  }
  const T rstd = T(1) / std::sqrt(V::sum(ss) / static_cast<T>(D) + eps);
  moments[0] = mean, moments[1] = rstd;
  const typename V::R r = V::set1(scale * rstd);
  for (int64_t i = 0; i < D; i += W) {
    const auto m = V::mask(D - i);
    V::store(dst + i, V::mul(V::sub(V::load(x + i, m), vm), r), m);
  }
  dst[D] = T(1);
}

// dst[0:n] = x[0:n]
template <typename T>
inline void copy_row(const T* x, int64_t n, T* dst, Seen<T>& seen) {
  using V = Vec<T>;
  constexpr int W = lanes<T>();
  for (int64_t i = 0; i < n; i += W) {
    const auto m = V::mask(n - i);
    const typename V::R xi = V::load(x + i, m);
    seen.add(xi);
    V::store(dst + i, xi, m);
  }
}

// o[0:n] = a[0:n] / g
template <typename T>
inline void divide_row(const T* a, T g, int64_t n, T* o, Seen<T>& seen) {
  using V = Vec<T>;
  constexpr int W = lanes<T>();
  const typename V::R vg = V::set1(g);
  for (int64_t i = 0; i < n; i += W) {
    const auto m = V::mask(n - i);
    const typename V::R oi = V::div(V::load(a + i, m), vg);
    seen.add(oi);
    V::store(o + i, oi, m);
  }
}
#else
constexpr bool kSimd = false;

template <typename T>
inline void block_product(const T* A, int64_t ar, int64_t at, const T* B, int64_t bs, int64_t K, T* C, int64_t cs) {
  constexpr int W = lanes<T>();
  for (int r = 0; r < kRows; ++r)
    for (int64_t t = 0; t < K; ++t) {
      const T a = A[r * ar + t * at];
      for (int j = 0; j < W; ++j) C[r * cs + j] += a * B[t * bs + j];
    }
}

template <typename T>
struct Seen {
  T absmax = 0, poison = 0;  // poison: sum of x * 0, NaN once any x is NaN or +-Inf
  inline void row(const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      absmax = std::max(absmax, std::abs(x[i]));
      poison += x[i] * T(0);
    }
  }
  T max_abs() const { return absmax; }
  T nan_if_seen() const { return poison; }
};

template <typename T>
inline void standardize_row(const T* x, int64_t D, T scale, T eps, T* dst, Seen<T>& seen, T* moments) {
  seen.row(x, D);
  T s = 0;
  for (int64_t i = 0; i < D; ++i) s += x[i];
  const T mean = s / static_cast<T>(D);
  T ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += (x[i] - mean) * (x[i] - mean);
  const T rstd = T(1) / std::sqrt(ss / static_cast<T>(D) + eps);
  moments[0] = mean, moments[1] = rstd;
  const T r = scale * rstd;
  for (int64_t i = 0; i < D; ++i) dst[i] = (x[i] - mean) * r;
  dst[D] = T(1);
}

template <typename T>
inline void copy_row(const T* x, int64_t n, T* dst, Seen<T>& seen) {
  seen.row(x, n);
  std::copy(x, x + n, dst);
}

template <typename T>
inline void divide_row(const T* a, T g, int64_t n, T* o, Seen<T>& seen) {
  for (int64_t i = 0; i < n; ++i) o[i] = a[i] / g;
  seen.row(o, n);
}
#endif

struct Strides {
  int64_t b, h, n;
  explicit Strides(const Tensor& t) : b(t.stride(0)), h(t.stride(1)), n(t.stride(2)) {}
};

// What the training forward keeps for the backward: the standardised inputs, their per-token mean and rstd (the
// layer norm's backward reads them) and the moments M (B, H, D + 1, Dv + 1) = sum_n [k_hat_n, 1] [v_n, 1]^T.
struct Saved {
  Tensor qs, kh, moments, M;
};

// f(r0, r1, seq) for each run of rows [r0, r1) of one real sequence in rows [0, nb) of the block at n0; without
// ids, the whole block is one run of sequence 0
template <typename F>
inline void for_runs(const int64_t* ids, int64_t n0, int64_t nb, F&& f) {
  if (!ids) {
    f(int64_t(0), nb, int64_t(0));
    return;
  }
  for (int64_t r = 0; r < nb;) {
    const int64_t seq = ids[n0 + r];
    int64_t e = r + 1;
    while (e < nb && ids[n0 + e] == seq) ++e;
    if (seq >= 0) f(r, e, seq);
    r = e;
  }
}

// ids: nullptr (unmasked), or (B, N) sequence ids with num sequences per row at most (see the file's head)
template <typename T>
void p1_unmasked(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double eps, Tensor& out,
                 Tensor& den, Tensor& seen, Saved* saved, const int64_t* ids = nullptr, int64_t num = 1) {
  constexpr int W = lanes<T>();
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  const int64_t Dp = round_up(D + 1, kRows);  // [k_hat, 1] padded to whole register blocks of rows
  const int64_t Vp = round_up(Dv + 1, W);     // [v, 1] padded to whole vectors
  const Strides sq(q), sk(k), sv(v);
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* od = out.data_ptr<T>();
  T* gd = den.data_ptr<T>();
  T* sd = seen.data_ptr<T>();
  // moments: (4, B, H, N): mean and rstd of q, then of k
  T* qs_d = saved ? saved->qs.data_ptr<T>() : nullptr;
  T* kh_d = saved ? saved->kh.data_ptr<T>() : nullptr;
  T* mo_d = saved ? saved->moments.data_ptr<T>() : nullptr;
  T* M_d = saved ? saved->M.data_ptr<T>() : nullptr;
  const int64_t BHN = B * H * N;
  const T sc = static_cast<T>(scale), ep = static_cast<T>(eps);
  at::parallel_for(0, B * H, 1, [&](int64_t t0, int64_t t1) {
    // kRows spare rows: a run's register blocks may reach past the block's end
    std::vector<T> xb((kBlock + kRows) * Dp), vb(kBlock * Vp), M(num * Dp * Vp), aug((kBlock + kRows) * Vp);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / H, h = task % H;
      const int64_t* idr = ids ? ids + b * N : nullptr;
      const T* qh = qd + b * sq.b + h * sq.h;
      const T* kh = kd + b * sk.b + h * sk.h;
      const T* vh = vd + b * sv.b + h * sv.h;
      Seen<T> seen_q, seen_k, seen_v, seen_o;
      std::fill(M.begin(), M.end(), T(0));
      std::fill(xb.begin(), xb.end(), T(0));
      std::fill(vb.begin(), vb.end(), T(0));
      // keys: M += [k_hat, 1]^T [v, 1] block by block
      for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
        const int64_t nb = std::min(kBlock, N - n0);
        for (int64_t i = 0; i < nb; ++i) {
          const T* kr = kh + (n0 + i) * sk.n;
          const T* vr = vh + (n0 + i) * sv.n;
          T mo[2];
          T* row = xb.data() + i * Dp;
          standardize_row(kr, D, T(1), ep, row, seen_k, mo);
          if (saved) {
            const int64_t at = task * N + n0 + i;
            std::copy(row, row + D, kh_d + at * D);
            mo_d[2 * BHN + at] = mo[0], mo_d[3 * BHN + at] = mo[1];
          }
          copy_row(vr, Dv, vb.data() + i * Vp, seen_v);
          vb[i * Vp + Dv] = T(1);
        }
        for_runs(idr, n0, nb, [&](int64_t r0, int64_t r1, int64_t seq) {
          T* Ms = M.data() + seq * Dp * Vp;
          for (int64_t d0 = 0; d0 < Dp; d0 += kRows)
            for (int64_t j0 = 0; j0 < Vp; j0 += W)
              block_product(xb.data() + r0 * Dp + d0, 1, Dp, vb.data() + r0 * Vp + j0, Vp, r1 - r0,
                            Ms + d0 * Vp + j0, Vp);
        });
      }
      if (saved)  // (B, H, num, D + 1, Dv + 1): each sequence's moments
        for (int64_t s = 0; s < num; ++s)
          for (int64_t d = 0; d <= D; ++d)
            std::copy(&M[(s * Dp + d) * Vp], &M[(s * Dp + d) * Vp] + Dv + 1,
                      M_d + ((task * num + s) * (D + 1) + d) * (Dv + 1));
      // queries: [num | G] = [qs, 1] M, out = num / G
      T* oh = od + task * N * Dv;
      T* gh = gd + task * N;
      for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
        const int64_t nb = std::min(kBlock, N - n0);
        for (int64_t i = 0; i < nb; ++i) {
          const T* qr = qh + (n0 + i) * sq.n;
          T mo[2];
          T* row = xb.data() + i * Dp;
          standardize_row(qr, D, sc, ep, row, seen_q, mo);
          if (saved) {
            const int64_t at = task * N + n0 + i;
            std::copy(row, row + D, qs_d + at * D);
            mo_d[at] = mo[0], mo_d[BHN + at] = mo[1];
          }
        }
        // rows past a run hold other rows' values: never written out, and zeroed again before their own run
        for_runs(idr, n0, nb, [&](int64_t r0, int64_t r1, int64_t seq) {
          const int64_t rows = round_up(r1 - r0, kRows);
          const T* Ms = M.data() + seq * Dp * Vp;
          std::fill(aug.begin() + r0 * Vp, aug.begin() + (r0 + rows) * Vp, T(0));
          for (int64_t i0 = r0; i0 < r0 + rows; i0 += kRows)
            for (int64_t j0 = 0; j0 < Vp; j0 += W)
              block_product(xb.data() + i0 * Dp, Dp, 1, Ms + j0, Vp, Dp, aug.data() + i0 * Vp + j0, Vp);
        });
        for (int64_t i = 0; i < nb; ++i) {
          if (idr && idr[n0 + i] < 0) {  // padding: zero output, a unit denominator
            std::fill(oh + (n0 + i) * Dv, oh + (n0 + i + 1) * Dv, T(0));
            gh[n0 + i] = T(1);
            continue;
          }
          const T* a = aug.data() + i * Vp;
          divide_row(a, a[Dv], Dv, oh + (n0 + i) * Dv, seen_o);
          gh[n0 + i] = a[Dv];
        }
      }
      T* s = sd + task * 8;
      const Seen<T>* all[4] = {&seen_q, &seen_k, &seen_v, &seen_o};
      for (int i = 0; i < 4; ++i) s[2 * i] = all[i]->max_abs(), s[2 * i + 1] = all[i]->nan_if_seen();
    }
  });
}

// The backward of p1_unmasked (FAST §2.5 in moment form: chunk.unmasked_backward with p = 1) fused with the
// backward of both standardisations, in two passes over each task's tokens:
//   1. ga_i = [g_i, -c_i] (g = dout / G, c_i = g_i . out_i) and, per sequence, Q1 = sum_i [qs_i, 1]^T ga_i
//      (its last row is [sum_i g_i, -sum_i c_i]);
//   2. dqs_i = M1 ga_i (M1: the forward's moments, rows of k_hat), dk_hat_n = Q1 [v_n, 1] and
//      dv_n = [k_hat_n, 1]^T Q1[:, :Dv]; then the layer norms' backward row by row, written into dq, dk.
// With ids, every sum runs over one sequence's real tokens and the padding's gradients are zero: no slices, no
// copies of the batch. The three products are the forward's register-blocked block_product.
template <typename T>
void p1_backward(const Tensor& qs, const Tensor& kh, const Tensor& mo, const Tensor& Msaved, const Tensor& v,
                 const Tensor& out, const Tensor& den, const Tensor& dout, double scale, Tensor& dq, Tensor& dk,
                 Tensor& dv, const int64_t* ids, int64_t num) {
  constexpr int W = lanes<T>();
  const int64_t H = qs.size(1), N = qs.size(2), D = qs.size(3), Dv = v.size(3), BHN = qs.size(0) * H * N;
  const int64_t Dp = round_up(D + 1, kRows);  // [qs, 1] and [k_hat, 1] rows, whole register blocks of rows
  const int64_t Dw = round_up(D, W);          // columns of dqs and dk_hat, whole vectors
  const int64_t Vp = round_up(Dv + 1, W);     // [g, -c] and [v, 1], whole vectors
  const Strides sv(v), sg(dout);
  const T* qsd = qs.data_ptr<T>();
  const T* khd = kh.data_ptr<T>();
  const T* mod = mo.data_ptr<T>();
  const T* Md = Msaved.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  const T* od = out.data_ptr<T>();
  const T* Gd = den.data_ptr<T>();
  const T* gd = dout.data_ptr<T>();
  T* dqd = dq.data_ptr<T>();
  T* dkd = dk.data_ptr<T>();
  T* dvd = dv.data_ptr<T>();
  const T sc = static_cast<T>(scale);
  const T inv_d = T(1) / static_cast<T>(D);
  at::parallel_for(0, qs.size(0) * H, 1, [&](int64_t t0, int64_t t1) {
    const int64_t R = kBlock + kRows;  // kRows spare rows: a run's register blocks may reach past the block's end
    std::vector<T> xb(R * Dp), ab(R * Vp), vb(R * Vp), dqb(R * Dw), dkb(R * Dw), dvb(R * Vp);
    std::vector<T> Q1(num * Dp * Vp), Q1T(num * Vp * Dw), M1T(num * Vp * Dw);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / H, h = task % H;
      const int64_t* idr = ids ? ids + b * N : nullptr;
      const T* vh = vd + b * sv.b + h * sv.h;
      const T* gh = gd + b * sg.b + h * sg.h;
      auto real = [&](int64_t n) { return !idr || idr[n] >= 0; };
      auto fill_ga = [&](int64_t n, T* row) {  // [g_n, -c_n]; the row's padding stays 0
        const T* o = od + (task * N + n) * Dv;
        const T* g = gh + n * sg.n;
        const T G = Gd[task * N + n];
        T c = 0;
        for (int64_t j = 0; j < Dv; ++j) row[j] = g[j] / G, c += row[j] * o[j];
        row[Dv] = -c;
      };
      std::fill(xb.begin(), xb.end(), T(0));
      std::fill(ab.begin(), ab.end(), T(0));
      std::fill(vb.begin(), vb.end(), T(0));
      std::fill(Q1.begin(), Q1.end(), T(0));
      // pass 1: Q1 per sequence
      for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
        const int64_t nb = std::min(kBlock, N - n0);
        for (int64_t i = 0; i < nb; ++i) {
          if (!real(n0 + i)) continue;
          const T* x = qsd + (task * N + n0 + i) * D;
          std::copy(x, x + D, xb.data() + i * Dp);
          xb[i * Dp + D] = T(1);
          fill_ga(n0 + i, ab.data() + i * Vp);
        }
        for_runs(idr, n0, nb, [&](int64_t r0, int64_t r1, int64_t seq) {
          T* Qs = Q1.data() + seq * Dp * Vp;
          for (int64_t d0 = 0; d0 < Dp; d0 += kRows)
            for (int64_t j0 = 0; j0 < Vp; j0 += W)
              block_product(xb.data() + r0 * Dp + d0, 1, Dp, ab.data() + r0 * Vp + j0, Vp, r1 - r0,
                            Qs + d0 * Vp + j0, Vp);
        });
      }
      // the products of pass 2 read Q1 and M1 transposed: (Dv + 1) x D, columns padded to whole vectors
      std::fill(Q1T.begin(), Q1T.end(), T(0));
      std::fill(M1T.begin(), M1T.end(), T(0));
      for (int64_t s = 0; s < num; ++s) {
        const T* Ms = Md + (task * num + s) * (D + 1) * (Dv + 1);
        for (int64_t d = 0; d < D; ++d)
          for (int64_t x = 0; x <= Dv; ++x) {
            Q1T[(s * Vp + x) * Dw + d] = Q1[(s * Dp + d) * Vp + x];
            M1T[(s * Vp + x) * Dw + d] = Ms[d * (Dv + 1) + x];
          }
      }
      // pass 2: the gradients
      for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
        const int64_t nb = std::min(kBlock, N - n0);
        for (int64_t i = 0; i < nb; ++i) {
          const int64_t at = task * N + n0 + i;
          if (!real(n0 + i)) {  // padding: zero gradients
            std::fill(dqd + at * D, dqd + (at + 1) * D, T(0));
            std::fill(dkd + at * D, dkd + (at + 1) * D, T(0));
            std::fill(dvd + at * Dv, dvd + (at + 1) * Dv, T(0));
            continue;
          }
          std::copy(khd + at * D, khd + (at + 1) * D, xb.data() + i * Dp);
          xb[i * Dp + D] = T(1);
          fill_ga(n0 + i, ab.data() + i * Vp);
          const T* vr = vh + (n0 + i) * sv.n;
          std::copy(vr, vr + Dv, vb.data() + i * Vp);
          vb[i * Vp + Dv] = T(1);
        }
        // rows past a run hold other rows' values: never written out
        for_runs(idr, n0, nb, [&](int64_t r0, int64_t r1, int64_t seq) {
          const int64_t rows = round_up(r1 - r0, kRows);
          const T* Qs = Q1.data() + seq * Dp * Vp;
          const T* QT = Q1T.data() + seq * Vp * Dw;
          const T* MT = M1T.data() + seq * Vp * Dw;
          std::fill(dqb.begin() + r0 * Dw, dqb.begin() + (r0 + rows) * Dw, T(0));
          std::fill(dkb.begin() + r0 * Dw, dkb.begin() + (r0 + rows) * Dw, T(0));
          std::fill(dvb.begin() + r0 * Vp, dvb.begin() + (r0 + rows) * Vp, T(0));
          for (int64_t i0 = r0; i0 < r0 + rows; i0 += kRows) {
            for (int64_t j0 = 0; j0 < Dw; j0 += W) {
              block_product(ab.data() + i0 * Vp, Vp, 1, MT + j0, Dw, Dv + 1, dqb.data() + i0 * Dw + j0, Dw);
              block_product(vb.data() + i0 * Vp, Vp, 1, QT + j0, Dw, Dv + 1, dkb.data() + i0 * Dw + j0, Dw);
            }
            for (int64_t j0 = 0; j0 < Vp; j0 += W)
              block_product(xb.data() + i0 * Dp, Dp, 1, Qs + j0, Vp, D + 1, dvb.data() + i0 * Vp + j0, Vp);
          }
          // the layer norms' backward (eqs 5-6): dx = rstd * w * (dy - mean(dy) - y_hat mean(dy y_hat)), with
          // y_hat = qs / scale (w = scale) for q and y_hat = k_hat (w = 1) for k
          for (int64_t i = r0; i < r1; ++i) {
            const int64_t at = task * N + n0 + i;
            const T* y = qsd + at * D;
            const T* gq = dqb.data() + i * Dw;
            T s1 = 0, s2 = 0;
            for (int64_t d = 0; d < D; ++d) s1 += gq[d], s2 += gq[d] * y[d];
            const T aq = mod[BHN + at] * sc, m1 = s1 * inv_d, m2 = sc != T(0) ? s2 * inv_d / (sc * sc) : T(0);
            for (int64_t d = 0; d < D; ++d) dqd[at * D + d] = aq * (gq[d] - m1 - y[d] * m2);
            const T* kr = khd + at * D;
            const T* gk = dkb.data() + i * Dw;
            s1 = 0, s2 = 0;
            for (int64_t d = 0; d < D; ++d) s1 += gk[d], s2 += gk[d] * kr[d];
            const T ak = mod[3 * BHN + at], k1 = s1 * inv_d, k2 = s2 * inv_d;
            for (int64_t d = 0; d < D; ++d) dkd[at * D + d] = ak * (gk[d] - k1 - kr[d] * k2);
            std::copy(dvb.data() + i * Vp, dvb.data() + i * Vp + Dv, dvd + at * Dv);
          }
        });
      }
    }
  });
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
              "q, k must be (B, H, N, D) and v (B, H, N, Dv)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q, k, v must share one dtype");
  for (const Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->size(3) == 1 || t->stride(3) == 1, "q, k, v must have unit stride over their last dim");
  TORCH_CHECK(q.size(2) >= 1 && q.size(3) >= 1 && v.size(3) >= 1, "empty sequence or head dim");
}

void check_ids(const Tensor& ids, const Tensor& q, int64_t num) {
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 2 && ids.size(0) == q.size(0) &&
                  ids.size(1) == q.size(2) && ids.is_contiguous(),
              "ids must be a contiguous (B, N) int64 tensor");
  TORCH_CHECK(num >= 1, "num must be >= 1");
}

// (out (B, H, N, Dv), G (B, H, N), seen (B * H, 8)): per task max |x| and NaN-or-0 of q, k, v and out in turn;
// with save, also qs, k_hat (B, H, N, D), moments (4, B, H, N, 1) and M (B, H, num, D + 1, Dv + 1) (see Saved).
// ids: none (unmasked, num = 1), or (B, N) int64 sequence ids (-1 at padding) of num sequences per row at most:
// padded batches and packed rows, padding outputs zero.
std::vector<Tensor> p1_forward(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& ids,
                               int64_t num, double scale, double eps, bool save) {
  check_inputs(q, k, v);
  if (ids) check_ids(*ids, q, num);
  else TORCH_CHECK(num == 1, "num must be 1 without ids");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  Tensor out = at::empty(v.sizes(), v.options());
  Tensor den = at::empty({B, H, N}, q.options());
  Tensor seen = at::empty({B * H, 8}, q.options());
  Saved saved;
  if (save) {
    saved.qs = at::empty({B, H, N, D}, q.options());
    saved.kh = at::empty({B, H, N, D}, q.options());
    saved.moments = at::empty({4, B, H, N, 1}, q.options());
    saved.M = at::empty({B, H, num, D + 1, v.size(3) + 1}, q.options());
  }
  const int64_t* idp = ids ? ids->data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fastmax_p1_forward", [&] {
    p1_unmasked<scalar_t>(q, k, v, scale, eps, out, den, seen, save ? &saved : nullptr, idp, num);
  });
  if (!save) return {out, den, seen};
  return {out, den, seen, saved.qs, saved.kh, saved.moments, saved.M};
}

std::vector<Tensor> fastmax_p1_unmasked(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double eps,
                                        bool save) {
  return p1_forward(q, k, v, std::nullopt, 1, scale, eps, save);
}

std::vector<Tensor> fastmax_p1_segments(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& ids,
                                        int64_t num, double scale, double eps, bool save) {
  return p1_forward(q, k, v, ids, num, scale, eps, save);
}

// (dq, dk (B, H, N, D), dv (B, H, N, Dv)) from what the training forward saved, the output gradient and the ids
// (or none) of the forward; zero at padding
std::vector<Tensor> fastmax_p1_backward(const Tensor& qs, const Tensor& kh, const Tensor& moments, const Tensor& M,
                                        const Tensor& v, const Tensor& out, const Tensor& den, const Tensor& dout,
                                        const std::optional<Tensor>& ids, int64_t num, double scale) {
  check_inputs(qs, kh, v);
  for (const Tensor* t : {&qs, &kh, &moments, &M, &out, &den})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == qs.scalar_type(), "saved tensors must be the forward's");
  TORCH_CHECK(dout.sizes() == v.sizes() && dout.scalar_type() == v.scalar_type() &&
                  (dout.size(3) == 1 || dout.stride(3) == 1),
              "dout must be like v, with unit stride over its last dim");
  const int64_t B = qs.size(0), H = qs.size(1), N = qs.size(2), D = qs.size(3), Dv = v.size(3);
  TORCH_CHECK(M.numel() == B * H * num * (D + 1) * (Dv + 1) && moments.numel() == 4 * B * H * N,
              "saved moments do not match the inputs");
  if (ids) check_ids(*ids, qs, num);
  else TORCH_CHECK(num == 1, "num must be 1 without ids");
  Tensor dq = at::empty(qs.sizes(), qs.options()), dk = at::empty(qs.sizes(), qs.options());
  Tensor dv = at::empty(v.sizes(), v.options());
  const int64_t* idp = ids ? ids->data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(qs.scalar_type(), "fastmax_p1_backward", [&] {
    p1_backward<scalar_t>(qs, kh, moments, M, v, out, den, dout, scale, dq, dk, dv, idp, num);
  });
  return {dq, dk, dv};
}

// whether this build has the vector kernel (AVX-512); without it the kernel is correct but slower than PyTorch
bool fastmax_p1_simd() { return kSimd; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnzoo_cpu, m) {
  m.def("fastmax_p1_unmasked(Tensor q, Tensor k, Tensor v, float scale, float eps, bool save) -> Tensor[]");
  m.def("fastmax_p1_simd() -> bool", &fastmax_p1_simd);
  m.def(
      "fastmax_p1_segments(Tensor q, Tensor k, Tensor v, Tensor ids, int num, float scale, float eps, bool save) -> "
      "Tensor[]");
  m.def(
      "fastmax_p1_backward(Tensor qs, Tensor kh, Tensor moments, Tensor M, Tensor v, Tensor out, Tensor den, "
      "Tensor dout, Tensor? ids, int num, float scale) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnzoo_cpu, CPU, m) {
  m.impl("fastmax_p1_unmasked", &fastmax_p1_unmasked);
  m.impl("fastmax_p1_segments", &fastmax_p1_segments);
  m.impl("fastmax_p1_backward", &fastmax_p1_backward);
}
