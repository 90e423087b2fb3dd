// Fused CPU kernels for TSSA (ToST Alg. 1 and Alg. 2), forward and backward, float32 and float64.
//
// Why: the PyTorch formulation (chunk.py) makes about nine passes over the (B, H, N, P) tensor forward
// (w^2, three token reductions of it, two scalings of the output) and more backward, so at N = 16k it is
// bound by memory traffic. Here each pass reads w (and, backward, the output's gradient) once:
//   non-causal forward: (1) per-feature sums of w^2 over tokens; (2) per token, s over features, Pi =
//     softmax over heads, and the Pi-weighted sums of w^2 and of Pi; (3) out = -w Pi g.
//   causal forward: the same three passes as prefix sums: each scans chunks of tokens in parallel from the
//     exclusive carry computed from the previous pass's chunk totals.
//   backward: four passes each (see the two backward sections).
// Tasks are (batch, chunk of tokens); inside a chunk tokens go in blocks of kBlock. Token sums run in the
// input precision within a block, then in double, so an N = 64k prefix sum is as accurate as a float64
// scan. The Python side (chunk.py) does the O(HP) and O(HN) steps between passes.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <vector>

using at::Tensor;

namespace {

// Tokens are processed in blocks of kBlock (all heads of a block stay in L2 between the steps that
// revisit them); token sums run in the input precision within a block, then in double.
constexpr int64_t kBlock = 64;

int64_t chunk_size(int64_t batch, int64_t n) {
  // a task is (b, chunk of tokens): enough chunks for every thread several times over, each long enough
  // to amortise its carry; a multiple of kBlock
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t want = std::max<int64_t>(1, 4 * threads / std::max<int64_t>(1, batch));
  const int64_t c = std::clamp<int64_t>((n + want - 1) / want, 256, 2048);
  return (c + kBlock - 1) / kBlock * kBlock;
}

// A (B, H, N, P) tensor with unit stride over P and any strides over B, H, N (the layers hand over the
// "b n (h p) -> b h n p" view of their projection, which must not be copied first).
template <typename T>
struct Rows {
  T* data;
  int64_t H, sb, sh, sn;
  Rows(const Tensor& t)
      : data(static_cast<T*>(t.data_ptr())), H(t.size(1)), sb(t.stride(0)), sh(t.stride(1)), sn(t.stride(2)) {}
  T* operator()(int64_t b, int64_t h, int64_t n) const { return data + b * sb + h * sh + n * sn; }
  // f(h, n) for every head and token n0 <= n < n1, in memory order: each head's run of tokens in turn for
  // a (B, H, N, P) layout, each token's heads in turn for a (B, N, H, P) view. Either order visits every
  // head's tokens in increasing n, which the causal scans need.
  template <typename F>
  void visit(int64_t n0, int64_t n1, F&& f) const {
    if (sh > sn) {
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = n0; n < n1; ++n) f(h, n);
    } else {
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t h = 0; h < H; ++h) f(h, n);
    }
  }
  // the same with every head's tokens in decreasing n (the backward's suffix sums)
  template <typename F>
  void visit_reversed(int64_t n0, int64_t n1, F&& f) const {
    if (sh > sn) {
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = n1 - 1; n >= n0; --n) f(h, n);
    } else {
      for (int64_t n = n1 - 1; n >= n0; --n)
        for (int64_t h = 0; h < H; ++h) f(h, n);
    }
  }
};

void check_w(const Tensor& w) {
  TORCH_CHECK(w.dim() == 4, "w must be (B, H, N, P), got ", w.sizes());
  TORCH_CHECK(w.device().is_cpu(), "w must be a CPU tensor");
  TORCH_CHECK(w.size(3) == 1 || w.stride(3) == 1, "w must have unit stride over P");
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kDouble, "w must be float32 or float64");
}

void check_small(const Tensor& t, const Tensor& w, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == w.scalar_type(), name,
              " must be a contiguous CPU tensor of w's dtype");
}

// acc[0:P] += x[0:P]^2 * scale
template <typename T>
inline void add_sq(T* __restrict acc, const T* __restrict x, T scale, int64_t P) {
#pragma omp simd
  for (int64_t p = 0; p < P; ++p) acc[p] += scale * x[p] * x[p];
}

template <typename T>
inline void flush(double* __restrict dst, T* __restrict src, int64_t P) {  // dst += src; src = 0
#pragma omp simd
  for (int64_t p = 0; p < P; ++p) {
    dst[p] += static_cast<double>(src[p]);
    src[p] = T(0);
  }
}

// Calls f(std::integral_constant<int64_t, P>) for the common head dims (the compiler then unrolls the
// per-row loops), f(std::integral_constant<int64_t, 0>) for any other P.
template <typename F>
void with_head_dim(int64_t P, F&& f) {
  switch (P) {
    case 16: f(std::integral_constant<int64_t, 16>{}); break;
    case 32: f(std::integral_constant<int64_t, 32>{}); break;
    case 48: f(std::integral_constant<int64_t, 48>{}); break;
    case 64: f(std::integral_constant<int64_t, 64>{}); break;
    case 96: f(std::integral_constant<int64_t, 96>{}); break;
    case 128: f(std::integral_constant<int64_t, 128>{}); break;
    default: f(std::integral_constant<int64_t, 0>{});
  }
}

// Each kernel takes the head dim as a template constant KP (0: the runtime P_), redeclared inside the
// parallel regions so that the compiler sees a constant there too.
#define HEAD_DIM const int64_t P = KP ? KP : P_

// sum_p x[p]^2 r[p]: one token's squared features x weighted per feature by r
template <typename T>
inline T weighted_sq_sum(const T* __restrict x, const T* __restrict r, int64_t P) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t p = 0; p < P; ++p) acc += x[p] * x[p] * r[p];
  return acc;
}

// softmax over heads, in place, of a[h * stride] for h < H (a holds s * temp on entry); in T (float32 for
// float32 input) like the PyTorch path
template <typename T>
inline void softmax_heads(T* a, int64_t H, int64_t stride) {
  T mx = a[0];
  for (int64_t h = 1; h < H; ++h) mx = std::max(mx, a[h * stride]);
  T z = 0;
  for (int64_t h = 0; h < H; ++h) {
    a[h * stride] = std::exp(a[h * stride] - mx);
    z += a[h * stride];
  }
  const T inv = T(1) / z;
  for (int64_t h = 0; h < H; ++h) a[h * stride] *= inv;
}

// out[b, i] = sum over chunks k of part[b, k, i] (width entries per chunk), rounded to T
template <typename T>
void sum_chunks(const double* part, int64_t B, int64_t nc, int64_t width, T* out) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < width; ++i) {
      double s = 0;
      for (int64_t k = 0; k < nc; ++k) s += part[(b * nc + k) * width + i];
      out[b * width + i] = static_cast<T>(s);
    }
}

// The units of work of the passes over w: by default (b, chunk of L tokens), all of row b's statistics in slot b;
// for padded batches and packed rows (chunk.py's varlen_tasks) a table of (b, n0, n1, slot, pos0) rows: runs of
// real tokens of one sequence (at most L long), whose statistics go to the sequence's slot. Padding is in no task:
// the kernels never read it, and per-token outputs there stay zero. A slot's tasks are consecutive in the table.
struct Tasks {
  struct Task {
    int64_t b, c0, c1, slot, pos0;  // pos0: position of token c0 within its sequence
  };
  const int64_t* tab = nullptr;
  int64_t count = 0, nc = 1, L = 1, B = 0, N = 0, nslots = 0;
  Tasks(int64_t B_, int64_t N_, const std::optional<Tensor>& table, int64_t ns) : B(B_), N(N_) {
    if (table) {
      TORCH_CHECK(table->scalar_type() == at::kLong && table->dim() == 2 && table->size(1) == 5 &&
                      table->is_contiguous() && table->device().is_cpu(),
                  "tasks must be a contiguous CPU int64 tensor (T, 5)");
      tab = table->data_ptr<int64_t>();
      count = table->size(0);
      nslots = ns;
      for (int64_t t = 0; t < count; ++t) L = std::max(L, tab[5 * t + 2] - tab[5 * t + 1]);  // longest task
    } else {
      L = chunk_size(B, N);
      nc = (N + L - 1) / L;
      count = B * nc;
      nslots = B;
    }
  }
  Task operator[](int64_t t) const {
    if (tab) return {tab[5 * t], tab[5 * t + 1], tab[5 * t + 2], tab[5 * t + 3], tab[5 * t + 4]};
    const int64_t b = t / nc, c0 = (t % nc) * L;
    return {b, c0, std::min(N, c0 + L), b, c0};
  }
  // out[slot, i] = the sum of part[task, i] over the slot's tasks, in double, rounded to T
  template <typename T>
  void reduce(const double* part, int64_t width, T* out) const {
    if (!tab) return sum_chunks(part, nslots, nc, width, out);
    std::vector<double> acc(nslots * width, 0.0);
    for (int64_t t = 0; t < count; ++t)
      for (int64_t i = 0; i < width; ++i) acc[tab[5 * t + 3] * width + i] += part[t * width + i];
    for (int64_t i = 0; i < nslots * width; ++i) out[i] = static_cast<T>(acc[i]);
  }
  // per-token outputs: zeros where no task writes (padding)
  Tensor per_token(at::IntArrayRef sizes, const at::TensorOptions& o) const {
    return tab ? zero_gaps(at::empty(sizes, o)) : at::empty(sizes, o);
  }
  Tensor like(const Tensor& w) const { return tab ? zero_gaps(at::empty_like(w)) : at::empty_like(w); }
  // t (B, H, N, ...) with the tokens no task covers set to 0: only the padding is written here (a packed row has
  // none), the kernels write the rest; zero-filling the whole output first was a full extra pass
  Tensor zero_gaps(Tensor t) const {
    int64_t b = 0, end = 0;
    auto gap = [&](int64_t row, int64_t s, int64_t e) {
      if (e > s) t.select(0, row).narrow(1, s, e - s).zero_();
    };
    for (int64_t k = 0; k < count; ++k) {  // the table is in (b, c0) order
      const int64_t tb = tab[5 * k], c0 = tab[5 * k + 1], c1 = tab[5 * k + 2];
      for (; b < tb; ++b, end = 0) gap(b, end, N);
      gap(b, end, c0);
      end = c1;
    }
    for (; b < B; ++b, end = 0) gap(b, end, N);
    return t;
  }
};

// f(b, slot, h, n) for every head h and token n of every task, the tasks in parallel and each task's tokens in
// w's memory order (Rows::visit): the loop of the kernels that work token by token
template <typename T, typename F>
void for_each_token(const Rows<const T>& w, const Tasks& tasks, F&& f) {
  at::parallel_for(0, tasks.count, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      w.visit(tk.c0, tk.c1, [&](int64_t h, int64_t n) { f(tk.b, tk.slot, h, n); });
    }
  });
}

// part[task, h, :] = sum of d[b, h, n] w[b, h, n, :]^2 over the task's tokens n;
// d == nullptr means d = 1
template <typename T, int64_t KP>
void chunk_sumsq(const Rows<const T>& w, const T* d, double* part, const Tasks& tasks, int64_t N, int64_t P_) {
  const int64_t H = w.H;
  at::parallel_for(0, tasks.count, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<T> run(H * P);
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1;
      double* dst = part + task * H * P;
      for (int64_t n0 = c0; n0 < c1; n0 += kBlock) {
        w.visit(n0, std::min(c1, n0 + kBlock), [&](int64_t h, int64_t n) {
          add_sq(&run[h * P], w(b, h, n), d ? d[(b * H + h) * N + n] : T(1), P);
        });
        flush(dst, run.data(), H * P);
      }
    }
  });
}

// The second half of a block of tokens n0 <= n < n1 of batch b in the forward passes that find Pi: a[h * kBlock
// + n - n0] holds s * temp and becomes Pi (softmax over heads, also written to pi (B, H, N)); Pi is added to
// den[h] and Pi w^2 to num[h, :] (the block's sums run in T in `run`, then go to double).
template <typename T, int64_t KP>
inline void block_memberships(const Rows<const T>& w, int64_t b, int64_t n0, int64_t n1, int64_t N, int64_t P_,
                              T* a, T* pi, T* run, double* num, double* den) {
  HEAD_DIM;
  const int64_t H = w.H;
  for (int64_t n = n0; n < n1; ++n) {
    softmax_heads(&a[n - n0], H, kBlock);
    for (int64_t h = 0; h < H; ++h) {
      const T q = a[h * kBlock + (n - n0)];
      pi[(b * H + h) * N + n] = q;
      den[h] += static_cast<double>(q);
    }
  }
  w.visit(n0, n1, [&](int64_t h, int64_t n) { add_sq(&run[h * P], w(b, h, n), a[h * kBlock + (n - n0)], P); });
  flush(num, run, H * P);
}

// ---------------------------------------------------------------------------------------------------
// non-causal (Alg. 1)
// ---------------------------------------------------------------------------------------------------

// Pass 1: c[b, h, p] = sum_n w[b, h, n, p]^2 (and, weighted, the backward's d_r = sum_n d_s w^2).
template <typename T, int64_t KP>
void colsum_sq_kernel(const Rows<const T>& w, const T* d, T* c, const Tasks& tasks, int64_t N, int64_t P_) {
  HEAD_DIM;
  const int64_t HP = w.H * P;
  std::vector<double> part(tasks.count * HP, 0.0);
  chunk_sumsq<T, KP>(w, d, part.data(), tasks, N, P);
  tasks.reduce(part.data(), HP, c);
}

// sum_n d[b, h, n] w[b, h, n, p]^2 -> (B, H, P) (or (slots, H, P) with a task table); d: (B, H, N) or None (d = 1)
Tensor tssa_colsum_sq(const Tensor& w, const std::optional<Tensor>& d, const std::optional<Tensor>& table,
                      int64_t nslots) {
  check_w(w);
  if (d) {
    check_small(*d, w, "d");
    TORCH_CHECK(d->numel() == w.size(0) * w.size(1) * w.size(2), "d must be (B, H, N)");
  }
  const Tasks tasks(w.size(0), w.size(2), table, nslots);
  Tensor c = at::empty({tasks.nslots, w.size(1), w.size(3)}, w.options());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_colsum_sq", [&] {
    with_head_dim(w.size(3), [&](auto kp) {
      colsum_sq_kernel<scalar_t, decltype(kp)::value>(Rows<const scalar_t>(w), d ? d->data_ptr<scalar_t>() : nullptr,
                                                      c.data_ptr<scalar_t>(), tasks, w.size(2), w.size(3));
    });
  });
  return c;
}

// Pass 2: s[b,h,n] = sum_p w^2 r; pi = softmax_h(s temp); num[b,h,p] = sum_n pi w^2; den[b,h] = sum_n pi.
template <typename T, int64_t KP>
void stats_kernel(const Rows<const T>& w, const T* r, const T* temp, T* s, T* pi, T* num, T* den,
                  const Tasks& tasks, int64_t N, int64_t P_) {
  HEAD_DIM;
  const int64_t H = w.H, HP = H * P;
  std::vector<double> pnum(tasks.count * HP, 0.0), pden(tasks.count * H, 0.0);
  at::parallel_for(0, tasks.count, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<T> run(HP), a(H * kBlock);  // a[h * kBlock + i]: s * temp, then pi, of token n0 + i
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1, slot = tk.slot;
      double* dnum = pnum.data() + task * HP;
      double* dden = pden.data() + task * H;
      for (int64_t n0 = c0; n0 < c1; n0 += kBlock) {
        const int64_t n1 = std::min(c1, n0 + kBlock);
        w.visit(n0, n1, [&](int64_t h, int64_t n) {
          const T acc = weighted_sq_sum(w(b, h, n), r + (slot * H + h) * P, P);
          s[(b * H + h) * N + n] = acc;
          a[h * kBlock + (n - n0)] = acc * temp[h];
        });
        block_memberships<T, KP>(w, b, n0, n1, N, P, a.data(), pi, run.data(), dnum, dden);
      }
    }
  });
  tasks.reduce(pden.data(), H, den);
  tasks.reduce(pnum.data(), HP, num);
}

std::vector<Tensor> tssa_token_stats(const Tensor& w, const Tensor& r, const Tensor& temp,
                                     const std::optional<Tensor>& table, int64_t nslots) {
  check_w(w);
  const int64_t B = w.size(0), H = w.size(1), N = w.size(2), P = w.size(3);
  const Tasks tasks(B, N, table, nslots);
  const int64_t S = tasks.nslots;
  check_small(r, w, "r");
  check_small(temp, w, "temp");
  TORCH_CHECK(r.numel() == S * H * P && temp.numel() == H, "r must be (B, H, P) (slots for a table) and temp (H,)");
  Tensor s = tasks.per_token({B, H, N}, w.options()), pi = tasks.per_token({B, H, N}, w.options());
  Tensor num = at::empty({S, H, P}, w.options()), den = at::empty({S, H}, w.options());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_token_stats", [&] {
    with_head_dim(P, [&](auto kp) {
      stats_kernel<scalar_t, decltype(kp)::value>(
          Rows<const scalar_t>(w), r.data_ptr<scalar_t>(), temp.data_ptr<scalar_t>(), s.data_ptr<scalar_t>(),
          pi.data_ptr<scalar_t>(), num.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), tasks, N, P);
    });
  });
  return {s, pi, num, den};
}

// Pass 3: out[b,h,n,p] = -w * pi[b,h,n] * g[b,h,p].
template <typename T, int64_t KP>
void scale_kernel(const Rows<const T>& w, const T* pi, const T* g, const Rows<T>& out, const Tasks& tasks,
                  int64_t N, int64_t P_) {
  const int64_t H = w.H;
  for_each_token(w, tasks, [&](int64_t b, int64_t slot, int64_t h, int64_t n) {
    HEAD_DIM;
    const T q = -pi[(b * H + h) * N + n];
    const T* __restrict gg = g + (slot * H + h) * P;
    const T* __restrict x = w(b, h, n);
    T* __restrict o = out(b, h, n);
#pragma omp simd
    for (int64_t p = 0; p < P; ++p) o[p] = x[p] * q * gg[p];
  });
}

Tensor tssa_scale(const Tensor& w, const Tensor& pi, const Tensor& g, const std::optional<Tensor>& table,
                  int64_t nslots) {
  check_w(w);
  check_small(pi, w, "pi");
  check_small(g, w, "g");
  const Tasks tasks(w.size(0), w.size(2), table, nslots);
  TORCH_CHECK(pi.numel() == w.size(0) * w.size(1) * w.size(2) && g.numel() == tasks.nslots * w.size(1) * w.size(3),
              "pi must be (B, H, N) and g (B, H, P) (slots for a table)");
  Tensor out = tasks.like(w);  // w's strides where w is dense, so the layers' view needs no copy back
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_scale", [&] {
    with_head_dim(w.size(3), [&](auto kp) {
      scale_kernel<scalar_t, decltype(kp)::value>(Rows<const scalar_t>(w), pi.data_ptr<scalar_t>(),
                                                  g.data_ptr<scalar_t>(), Rows<scalar_t>(out), tasks, w.size(2),
                                                  w.size(3));
    });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// non-causal backward (the derivation is in chunk.py's _TSSANonCausal.backward; four passes over w)
// ---------------------------------------------------------------------------------------------------

// e[b,h,n] = -sum_p G w g[b,h,p];  U[b,h,p] = sum_n pi[b,h,n] G w   (G: the output's gradient)
template <typename T, int64_t KP>
void bwd_gw_kernel(const Rows<const T>& w, const Rows<const T>& G, const T* pi, const T* g, T* e, T* U,
                   const Tasks& tasks, int64_t N, int64_t P_) {
  HEAD_DIM;
  const int64_t H = w.H, HP = H * P;
  std::vector<double> part(tasks.count * HP, 0.0);
  at::parallel_for(0, tasks.count, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<T> run(HP);
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1, slot = tk.slot;
      for (int64_t n0 = c0; n0 < c1; n0 += kBlock) {
        w.visit(n0, std::min(c1, n0 + kBlock), [&](int64_t h, int64_t n) {
          const int64_t i = (b * H + h) * N + n;
          const T* __restrict x = w(b, h, n);
          const T* __restrict gr = G(b, h, n);
          const T* __restrict gg = g + (slot * H + h) * P;
          T* __restrict acc = &run[h * P];
          const T q = pi[i];
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t p = 0; p < P; ++p) {
            const T gx = gr[p] * x[p];
            dot += gx * gg[p];
            acc[p] += q * gx;
          }
          e[i] = -dot;
        });
        flush(part.data() + task * HP, run.data(), HP);
      }
    }
  });
  tasks.reduce(part.data(), HP, U);
}

std::vector<Tensor> tssa_bwd_gw(const Tensor& w, const Tensor& G, const Tensor& pi, const Tensor& g,
                                const std::optional<Tensor>& table, int64_t nslots) {
  check_w(w);
  check_w(G);
  TORCH_CHECK(G.sizes() == w.sizes() && G.scalar_type() == w.scalar_type(), "G must match w");
  check_small(pi, w, "pi");
  check_small(g, w, "g");
  const int64_t B = w.size(0), H = w.size(1), N = w.size(2), P = w.size(3);
  const Tasks tasks(B, N, table, nslots);
  TORCH_CHECK(pi.numel() == B * H * N && g.numel() == tasks.nslots * H * P,
              "pi must be (B, H, N) and g (B, H, P) (slots for a table)");
  Tensor e = tasks.per_token({B, H, N}, w.options()), U = at::empty({tasks.nslots, H, P}, w.options());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_bwd_gw", [&] {
    with_head_dim(P, [&](auto kp) {
      bwd_gw_kernel<scalar_t, decltype(kp)::value>(Rows<const scalar_t>(w), Rows<const scalar_t>(G),
                                                   pi.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(),
                                                   e.data_ptr<scalar_t>(), U.data_ptr<scalar_t>(), tasks, N, P);
    });
  });
  return {e, U};
}

// out[b,h,n] = sum_p w[b,h,n,p]^2 v[b,h,p]
template <typename T, int64_t KP>
void rowdot_sq_kernel(const Rows<const T>& w, const T* v, T* out, const Tasks& tasks, int64_t N, int64_t P_) {
  const int64_t H = w.H;
  for_each_token(w, tasks, [&](int64_t b, int64_t slot, int64_t h, int64_t n) {
    HEAD_DIM;
    out[(b * H + h) * N + n] = weighted_sq_sum(w(b, h, n), v + (slot * H + h) * P, P);
  });
}

Tensor tssa_rowdot_sq(const Tensor& w, const Tensor& v, const std::optional<Tensor>& table, int64_t nslots) {
  check_w(w);
  check_small(v, w, "v");
  const Tasks tasks(w.size(0), w.size(2), table, nslots);
  TORCH_CHECK(v.numel() == tasks.nslots * w.size(1) * w.size(3), "v must be (B, H, P) (slots for a table)");
  Tensor out = tasks.per_token({w.size(0), w.size(1), w.size(2)}, w.options());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_rowdot_sq", [&] {
    with_head_dim(w.size(3), [&](auto kp) {
      rowdot_sq_kernel<scalar_t, decltype(kp)::value>(Rows<const scalar_t>(w), v.data_ptr<scalar_t>(),
                                                      out.data_ptr<scalar_t>(), tasks, w.size(2), w.size(3));
    });
  });
  return out;
}

// dw = w (a[n] bb[p] + c[n] d[p] + e[p]) - G f[n] h[p]   ((B, H, N) / (B, H, P) coefficients)
template <typename T, int64_t KP>
void bwd_dw_kernel(const Rows<const T>& w, const Rows<const T>& G, const T* a, const T* bb, const T* c, const T* d,
                   const T* e, const T* f, const T* hh, const Rows<T>& dw, const Tasks& tasks, int64_t N, int64_t P_) {
  const int64_t H = w.H;
  for_each_token(w, tasks, [&](int64_t b, int64_t slot, int64_t h, int64_t n) {
    HEAD_DIM;
    const int64_t i = (b * H + h) * N + n, j = (slot * H + h) * P;
    const T an = a[i], cn = c[i], fn = f[i];
    const T* __restrict x = w(b, h, n);
    const T* __restrict gr = G(b, h, n);
    T* __restrict o = dw(b, h, n);
#pragma omp simd
    for (int64_t p = 0; p < P; ++p)
      o[p] = x[p] * (an * bb[j + p] + cn * d[j + p] + e[j + p]) - gr[p] * fn * hh[j + p];
  });
}

Tensor tssa_bwd_dw(const Tensor& w, const Tensor& G, const Tensor& a, const Tensor& bb, const Tensor& c,
                   const Tensor& d, const Tensor& e, const Tensor& f, const Tensor& h, const std::optional<Tensor>& table,
                   int64_t nslots) {
  check_w(w);
  check_w(G);
  TORCH_CHECK(G.sizes() == w.sizes() && G.scalar_type() == w.scalar_type(), "G must match w");
  const int64_t B = w.size(0), H = w.size(1), N = w.size(2), P = w.size(3);
  const Tasks tasks(B, N, table, nslots);
  for (const Tensor* t : {&a, &c, &f}) {
    check_small(*t, w, "a per-token coefficient");
    TORCH_CHECK(t->numel() == B * H * N, "per-token coefficients must be (B, H, N)");
  }
  for (const Tensor* t : {&bb, &d, &e, &h}) {
    check_small(*t, w, "a per-feature coefficient");
    TORCH_CHECK(t->numel() == tasks.nslots * H * P, "per-feature coefficients must be (B, H, P) (slots for a table)");
  }
  Tensor dw = tasks.like(w);
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_bwd_dw", [&] {
    with_head_dim(P, [&](auto kp) {
      bwd_dw_kernel<scalar_t, decltype(kp)::value>(
          Rows<const scalar_t>(w), Rows<const scalar_t>(G), a.data_ptr<scalar_t>(), bb.data_ptr<scalar_t>(),
          c.data_ptr<scalar_t>(), d.data_ptr<scalar_t>(), e.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(),
          h.data_ptr<scalar_t>(), Rows<scalar_t>(dw), tasks, N, P);
    });
  });
  return dw;
}

// ---------------------------------------------------------------------------------------------------
// causal (Alg. 2 / eq. 28)
// ---------------------------------------------------------------------------------------------------

// 1 / den in double for a prefix sum of Pi (1 where den <= 0): den can be a float32 denormal (Pi ~ 1e-44 at the
// first tokens of a head the softmax all but ignores), whose float reciprocal is inf and would make 0 * inf
template <typename T>
inline double inv_den(T den) {
  return den > T(0) ? 1.0 / static_cast<double>(den) : 1.0;
}

// exclusive scan over chunks, in place: part[row, k, :] becomes the sum of part[row, j, :] over j < k
// (reverse: over j > k, the carry of a suffix sum)
void exclusive_scan(std::vector<double>& part, int64_t rows, int64_t nc, int64_t width, bool reverse = false) {
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<double> run(width);
    for (int64_t row = r0; row < r1; ++row) {
      std::fill(run.begin(), run.end(), 0.0);
      for (int64_t j = 0; j < nc; ++j) {
        const int64_t k = reverse ? nc - 1 - j : j;
        double* v = part.data() + (row * nc + k) * width;
        for (int64_t i = 0; i < width; ++i) {
          const double t = v[i];
          v[i] = run[i];
          run[i] += t;
        }
      }
    }
  });
}

// exclusive_scan over the tasks of each slot (consecutive in the table): the carries restart at each sequence
void exclusive_scan(std::vector<double>& part, const Tasks& tasks, int64_t width, bool reverse = false) {
  if (!tasks.tab) return exclusive_scan(part, tasks.nslots, tasks.nc, width, reverse);
  std::vector<double> run(width, 0.0);
  int64_t prev = -1;
  for (int64_t j = 0; j < tasks.count; ++j) {
    const int64_t t = reverse ? tasks.count - 1 - j : j, slot = tasks.tab[5 * t + 3];
    if (slot != prev) std::fill(run.begin(), run.end(), 0.0);
    prev = slot;
    double* v = part.data() + t * width;
    for (int64_t i = 0; i < width; ++i) {
      const double x = v[i];
      v[i] = run[i];
      run[i] += x;
    }
  }
}

template <typename T, int64_t KP>
void causal_kernel(const Rows<const T>& w, const T* temp, const T* bias, int64_t Nb, const Rows<T>& out, T* s, T* pi,
                   T* den, const Tasks& tasks, int64_t N, int64_t P_) {
  HEAD_DIM;
  const int64_t H = w.H, HP = H * P, ntask = tasks.count;
  // (A) chunk totals of w^2, then the exclusive carry into each chunk; layout (task, h, p)
  std::vector<double> carry_sq(ntask * HP, 0.0);
  chunk_sumsq<T, KP>(w, nullptr, carry_sq.data(), tasks, N, P);
  exclusive_scan(carry_sq, tasks, HP);

  // (B) scan each chunk from its carry: s = sum_p w^2 / cumsum(w^2) + P b, pi = softmax_h(s temp); and the
  //     chunk totals of pi w^2 and of pi, layout (b, chunk, [h, p] then [h])
  const int64_t W = HP + H;
  std::vector<double> carry_pi(ntask * W, 0.0);
  at::parallel_for(0, ntask, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<double> S(HP);
    std::vector<T> a(H * kBlock), run(HP);
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1, shift = tk.pos0 - tk.c0;  // bias at the in-sequence pos
      std::copy_n(carry_sq.data() + task * HP, HP, S.data());
      double* tot = carry_pi.data() + task * W;
      for (int64_t n0 = c0; n0 < c1; n0 += kBlock) {
        const int64_t n1 = std::min(c1, n0 + kBlock);
        w.visit(n0, n1, [&](int64_t h, int64_t n) {
          const T* __restrict x = w(b, h, n);
          double* __restrict Sh = S.data() + h * P;
          T acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t p = 0; p < P; ++p) {
            const T x2 = x[p] * x[p];
            Sh[p] += static_cast<double>(x2);
            const T Sv = static_cast<T>(Sh[p]);
            acc += x2 / (Sv > T(0) ? Sv : T(1));  // 0/0 := 0: x2 == 0 wherever the prefix sum is 0
          }
          const T sv = acc + static_cast<T>(P) * bias[h * Nb + n + shift];
          s[(b * H + h) * N + n] = sv;
          a[h * kBlock + (n - n0)] = sv * temp[h];
        });
        block_memberships<T, KP>(w, b, n0, n1, N, P, a.data(), pi, run.data(), tot, tot + HP);
      }
    }
  });
  exclusive_scan(carry_pi, tasks, W);

  // (C) scan again for num = cumsum(pi w^2), den = cumsum(pi); out = -w pi / (1 + num / den)
  at::parallel_for(0, ntask, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<double> st(W);  // [h, p]: num, then [h]: den
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1;
      std::copy_n(carry_pi.data() + task * W, W, st.data());
      w.visit(c0, c1, [&](int64_t h, int64_t n) {
        const int64_t i = (b * H + h) * N + n;
        const T q = pi[i];
        double& d = st[HP + h];
        d += static_cast<double>(q);
        const T dv = static_cast<T>(d);
        den[i] = dv;
        const double inv = inv_den(dv);
        const T* __restrict x = w(b, h, n);
        T* __restrict o = out(b, h, n);
        double* __restrict nm = st.data() + h * P;
#pragma omp simd
        for (int64_t p = 0; p < P; ++p) {
          nm[p] += static_cast<double>(q * x[p] * x[p]);
          o[p] = -(x[p] * q) / (T(1) + static_cast<T>(nm[p] * inv));
        }
      });
    }
  });
}

// bias: (H, N), or (H, N_max) read at each token's position within its sequence with a task table
std::vector<Tensor> tssa_causal(const Tensor& w, const Tensor& temp, const Tensor& bias,
                                const std::optional<Tensor>& table, int64_t nslots) {
  check_w(w);
  const int64_t B = w.size(0), H = w.size(1), N = w.size(2), P = w.size(3);
  const Tasks tasks(B, N, table, nslots);
  check_small(temp, w, "temp");
  check_small(bias, w, "bias");
  TORCH_CHECK(temp.numel() == H && bias.dim() == 2 && bias.size(0) == H && (table || bias.size(1) == N),
              "temp must be (H,) and bias (H, N) (or (H, N_max) with a table)");
  Tensor out = tasks.like(w);
  Tensor s = tasks.per_token({B, H, N}, w.options()), pi = tasks.per_token({B, H, N}, w.options());
  Tensor den = tasks.per_token({B, H, N}, w.options());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_causal", [&] {
    with_head_dim(P, [&](auto kp) {
      causal_kernel<scalar_t, decltype(kp)::value>(
          Rows<const scalar_t>(w), temp.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(), bias.size(1),
          Rows<scalar_t>(out), s.data_ptr<scalar_t>(), pi.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), tasks, N,
          P);
    });
  });
  return {out, s, pi, den};
}


// ---------------------------------------------------------------------------------------------------
// causal backward (chunk.py's _TSSACausal.backward, whose formulas these passes follow)
// ---------------------------------------------------------------------------------------------------
// Per token n (head h, feature p): x = w^2, S = cumsum(x), M = cumsum(pi x), D = cumsum(pi) (saved as den),
// dots = M / D, g = 1 / (1 + dots). With G the output's gradient:
//   d_pi_dir = -sum_p G w g,  d_dots = G w pi g^2,  d_M = d_dots / D,  d_D = -sum_p d_dots dots / D,
//   R = suffix-sum(d_M), Q = suffix-sum(d_D),  d_pi = d_pi_dir + sum_p R x + Q,
//   d_a = pi (d_pi - sum_h pi d_pi)  (softmax over heads),  d_s = d_a temp,
//   V = suffix-sum(-x d_s / S^2),  dw = 2 w (R pi + d_s / S + V) - G pi g.
// Passes: (1) chunk totals of x and pi x -> forward carries; (2) forward scan for the chunk totals of d_M
// and d_D -> suffix carries, recording S and M at every block start; (3) blocks in reverse: recompute S, M
// forward inside the block, then the suffix sums backward, writing dw with V summed inside the chunk;
// (4) dw += 2 w V_carry, the part of V from later chunks.
template <typename T, int64_t KP>
void causal_bwd_kernel(const Rows<const T>& w, const Rows<const T>& G, const T* temp, const T* pi, const T* den,
                       T* d_a, const Rows<T>& dw, const Tasks& tasks, int64_t N, int64_t P_) {
  HEAD_DIM;
  const int64_t H = w.H, HP = H * P, ntask = tasks.count, L = tasks.L;
  const int64_t nblk = (L + kBlock - 1) / kBlock;  // blocks per chunk (the last chunk may use fewer)
  auto safe = [](T v) { return v > T(0) ? v : T(1); };

  // (1) forward carries of S and M
  std::vector<double> carry_S(ntask * HP, 0.0), carry_M(ntask * HP, 0.0);
  chunk_sumsq<T, KP>(w, nullptr, carry_S.data(), tasks, N, P);
  chunk_sumsq<T, KP>(w, pi, carry_M.data(), tasks, N, P);
  exclusive_scan(carry_S, tasks, HP);
  exclusive_scan(carry_M, tasks, HP);

  // (2) forward scan: d_pi_dir and d_D per token; chunk totals of d_M (then d_D): layout (b, chunk, W)
  const int64_t W = HP + H;
  std::vector<double> carry_R(ntask * W, 0.0);
  // O(N) scratch from PyTorch's allocator, so that the benchmark's tracked peak memory sees it
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  Tensor blk_St = at::empty({ntask * nblk * HP}, f64), blk_Mt = at::empty({ntask * nblk * HP}, f64);
  const int64_t BHN = tasks.B * w.H * N;
  Tensor scratch = at::empty({2, BHN}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
  double* blk_S = blk_St.data_ptr<double>();
  double* blk_M = blk_Mt.data_ptr<double>();
  T* d_pi_dir = static_cast<T*>(scratch.data_ptr());
  T* d_D = d_pi_dir + BHN;
  at::parallel_for(0, ntask, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<double> S(HP), M(HP);
    std::vector<T> run(HP);
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1;
      std::copy_n(carry_S.data() + task * HP, HP, S.data());
      std::copy_n(carry_M.data() + task * HP, HP, M.data());
      double* tot = carry_R.data() + task * W;
      for (int64_t n0 = c0; n0 < c1; n0 += kBlock) {
        const int64_t blk = task * nblk + (n0 - c0) / kBlock;
        w.visit(n0, std::min(c1, n0 + kBlock), [&](int64_t h, int64_t n) {
          double* __restrict Sh = S.data() + h * P;
          double* __restrict Mh = M.data() + h * P;
          if (n == n0) {
            std::copy_n(Sh, P, blk_S + blk * HP + h * P);
            std::copy_n(Mh, P, blk_M + blk * HP + h * P);
          }
          const int64_t i = (b * H + h) * N + n;
          const T q = pi[i], D = den[i];
          const double inv = inv_den(D);
          const T* __restrict x = w(b, h, n);
          const T* __restrict gr = G(b, h, n);
          T* __restrict acc = &run[h * P];
          T dpd = 0, dd = 0;
#pragma omp simd reduction(+ : dpd, dd)
          for (int64_t p = 0; p < P; ++p) {
            const T x2 = x[p] * x[p];
            Sh[p] += static_cast<double>(x2);
            Mh[p] += static_cast<double>(q * x2);
            const T dots = static_cast<T>(Mh[p] * inv);
            const T gp = T(1) / (T(1) + dots);
            const T gw = gr[p] * x[p];
            dpd += gw * gp;
            const T ddots = gw * q * gp * gp;
            dd += ddots * dots;
            acc[p] += static_cast<T>(static_cast<double>(ddots) * inv);
          }
          d_pi_dir[i] = -dpd;
          const T dD = static_cast<T>(-static_cast<double>(dd) * inv * (D > T(0)));
          d_D[i] = dD;
          tot[HP + h] += static_cast<double>(dD);
        });
        flush(tot, run.data(), HP);
      }
    }
  });
  exclusive_scan(carry_R, tasks, W, /*reverse=*/true);

  // (3) blocks in reverse; V summed within the chunk, its chunk total kept for (4)
  std::vector<double> carry_V(ntask * HP, 0.0);
  at::parallel_for(0, ntask, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    std::vector<double> S(HP), M(HP), R(W), V(HP);
    std::vector<T> inv_S(HP * kBlock), gb(HP * kBlock), Rb(HP * kBlock), dpi(H * kBlock), ds(H * kBlock);
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1;
      std::copy_n(carry_R.data() + task * W, W, R.data());  // [h, p]: R, then [h]: Q
      std::fill(V.begin(), V.end(), 0.0);
      const int64_t last0 = c0 + (c1 - 1 - c0) / kBlock * kBlock;
      for (int64_t n0 = last0; n0 >= c0; n0 -= kBlock) {
        const int64_t n1 = std::min(c1, n0 + kBlock), blk = task * nblk + (n0 - c0) / kBlock;
        std::copy_n(blk_S + blk * HP, HP, S.data());
        std::copy_n(blk_M + blk * HP, HP, M.data());
        // (i) S and M forward through the block: 1/S and g per token
        w.visit(n0, n1, [&](int64_t h, int64_t n) {
          const int64_t i = (b * H + h) * N + n, j = (h * kBlock + (n - n0)) * P;
          const T q = pi[i];
          const double inv = inv_den(den[i]);
          const T* __restrict x = w(b, h, n);
          double* __restrict Sh = S.data() + h * P;
          double* __restrict Mh = M.data() + h * P;
#pragma omp simd
          for (int64_t p = 0; p < P; ++p) {
            const T x2 = x[p] * x[p];
            Sh[p] += static_cast<double>(x2);
            Mh[p] += static_cast<double>(q * x2);
            inv_S[j + p] = T(1) / safe(static_cast<T>(Sh[p]));
            gb[j + p] = T(1) / (T(1) + static_cast<T>(Mh[p] * inv));
          }
        });
        // (ii) suffix sums R, Q backward: d_pi per token
        w.visit_reversed(n0, n1, [&](int64_t h, int64_t n) {
          const int64_t i = (b * H + h) * N + n, j = (h * kBlock + (n - n0)) * P;
          const T q = pi[i];
          const double inv = inv_den(den[i]);
          const T* __restrict x = w(b, h, n);
          const T* __restrict gr = G(b, h, n);
          double* __restrict Rh = R.data() + h * P;
          T acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t p = 0; p < P; ++p) {
            const T gp = gb[j + p];
            Rh[p] += static_cast<double>(gr[p] * x[p] * q * gp * gp) * inv;
            const T r = static_cast<T>(Rh[p]);
            Rb[j + p] = r;
            acc += r * x[p] * x[p];
          }
          R[HP + h] += static_cast<double>(d_D[i]);
          dpi[h * kBlock + (n - n0)] = d_pi_dir[i] + acc + static_cast<T>(R[HP + h]);
        });
        // (iii) softmax over heads, per token
        for (int64_t n = n0; n < n1; ++n) {
          const int64_t t = n - n0;
          T m = 0;
          for (int64_t h = 0; h < H; ++h) m += pi[(b * H + h) * N + n] * dpi[h * kBlock + t];
          for (int64_t h = 0; h < H; ++h) {
            const int64_t i = (b * H + h) * N + n;
            const T da = pi[i] * (dpi[h * kBlock + t] - m);
            d_a[i] = da;
            ds[h * kBlock + t] = da * temp[h];
          }
        }
        // (iv) V backward, and dw
        w.visit_reversed(n0, n1, [&](int64_t h, int64_t n) {
          const int64_t i = (b * H + h) * N + n, j = (h * kBlock + (n - n0)) * P;
          const T q = pi[i], dsn = ds[h * kBlock + (n - n0)];
          const T* __restrict x = w(b, h, n);
          const T* __restrict gr = G(b, h, n);
          T* __restrict o = dw(b, h, n);
          double* __restrict Vh = V.data() + h * P;
#pragma omp simd
          for (int64_t p = 0; p < P; ++p) {
            const T is = inv_S[j + p];
            Vh[p] -= static_cast<double>(x[p] * x[p] * dsn * is * is);
            const T dx = Rb[j + p] * q + dsn * is + static_cast<T>(Vh[p]);
            o[p] = T(2) * x[p] * dx - gr[p] * q * gb[j + p];
          }
        });
      }
      std::copy_n(V.data(), HP, carry_V.data() + task * HP);
    }
  });
  if (!tasks.tab && tasks.nc == 1) return;
  exclusive_scan(carry_V, tasks, HP, /*reverse=*/true);

  // (4) dw += 2 w V_carry (V from later chunks)
  at::parallel_for(0, ntask, 1, [&](int64_t t0, int64_t t1) {
    HEAD_DIM;
    for (int64_t task = t0; task < t1; ++task) {
      const Tasks::Task tk = tasks[task];
      const int64_t b = tk.b, c0 = tk.c0, c1 = tk.c1;
      if (!tasks.tab && task % tasks.nc == tasks.nc - 1) continue;  // nothing after the last chunk
      std::vector<T> vc(HP);
      for (int64_t k = 0; k < HP; ++k) vc[k] = static_cast<T>(2.0 * carry_V[task * HP + k]);
      w.visit(c0, c1, [&](int64_t h, int64_t n) {
        const T* __restrict x = w(b, h, n);
        T* __restrict o = dw(b, h, n);
        const T* __restrict v = vc.data() + h * P;
#pragma omp simd
        for (int64_t p = 0; p < P; ++p) o[p] += x[p] * v[p];
      });
    }
  });
}

std::vector<Tensor> tssa_causal_bwd(const Tensor& w, const Tensor& G, const Tensor& temp, const Tensor& pi,
                                    const Tensor& den, const std::optional<Tensor>& table, int64_t nslots) {
  check_w(w);
  check_w(G);
  TORCH_CHECK(G.sizes() == w.sizes() && G.scalar_type() == w.scalar_type(), "G must match w");
  const int64_t B = w.size(0), H = w.size(1), N = w.size(2), P = w.size(3);
  check_small(temp, w, "temp");
  check_small(pi, w, "pi");
  check_small(den, w, "den");
  TORCH_CHECK(temp.numel() == H && pi.numel() == B * H * N && den.numel() == B * H * N,
              "temp must be (H,), pi and den (B, H, N)");
  const Tasks tasks(B, N, table, nslots);
  Tensor d_a = tasks.per_token({B, H, N}, w.options());
  Tensor dw = tasks.like(w);
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "tssa_causal_bwd", [&] {
    with_head_dim(P, [&](auto kp) {
      causal_bwd_kernel<scalar_t, decltype(kp)::value>(
          Rows<const scalar_t>(w), Rows<const scalar_t>(G), temp.data_ptr<scalar_t>(), pi.data_ptr<scalar_t>(),
          den.data_ptr<scalar_t>(), d_a.data_ptr<scalar_t>(), Rows<scalar_t>(dw), tasks, N, P);
    });
  });
  return {d_a, dw};
}

// The task table of a padded batch straight from its mask (B, N) bool: chunk.py's vectorised varlen_tasks took
// ~15 small aten ops (0.3-0.7 ms, a sixth of a 14k-token forward); this is one scan of B N bytes. A task starts at a
// real token after padding (or at a row's start) and at each real token whose position in the row's sequence is a
// multiple of task_len; slot = row.
Tensor tssa_mask_tasks(const Tensor& mask, int64_t task_len) {
  TORCH_CHECK(mask.dim() == 2 && mask.scalar_type() == at::kBool && mask.device().is_cpu() && mask.is_contiguous(),
              "mask must be a contiguous CPU bool tensor (B, N)");
  TORCH_CHECK(task_len > 0, "task_len must be positive");
  const int64_t B = mask.size(0), N = mask.size(1);
  const bool* m = mask.data_ptr<bool>();
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b) {
    int64_t pos = 0;  // real tokens of row b before n
    for (int64_t n = 0; n < N; ++n) {
      if (!m[b * N + n]) continue;
      const int64_t n0 = n, pos0 = pos;
      do {
        ++n;
        ++pos;
      } while (n < N && m[b * N + n] && pos % task_len != 0);
      rows.insert(rows.end(), {b, n0, n, b, pos0});
      --n;  // the loop's ++n: the token after the task is looked at next
    }
  }
  Tensor table = at::empty({static_cast<int64_t>(rows.size() / 5), 5}, mask.options().dtype(at::kLong));
  std::copy(rows.begin(), rows.end(), table.data_ptr<int64_t>());
  return table;
}

// The varlen backward's per-sequence statistics of a (B, H, N) tensor, over the same task table as the
// kernels: chunk.py's sums and reads per slot without a Python loop over sequences or an index_add
// by each token's slot (0.2-0.4 ms at 14k tokens). One pass each over the real tokens; sums in double.
void check_slot_args(const Tensor& x, const Tensor& tasks, int64_t nslots) {
  TORCH_CHECK(x.dim() == 3 && x.device().is_cpu(), "x must be a (B, H, N) CPU tensor");
  TORCH_CHECK(tasks.dim() == 2 && tasks.size(1) == 5 && tasks.scalar_type() == at::kLong && tasks.is_contiguous(),
              "tasks must be a contiguous (T, 5) int64 table");
  TORCH_CHECK(nslots >= 0, "nslots must be non-negative");
}

// (nslots, H): the sum of x over each slot's tokens (padding is in no task, so it is never read)
Tensor tssa_slot_sum(const Tensor& x, const Tensor& tasks, int64_t nslots) {
  check_slot_args(x, tasks, nslots);
  const Tensor xc = x.contiguous();
  const int64_t H = x.size(1), N = x.size(2), T = tasks.size(0);
  const int64_t* tab = tasks.data_ptr<int64_t>();
  std::vector<double> acc(static_cast<size_t>(nslots * H), 0.0);
  Tensor out = at::empty({nslots, H}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "tssa_slot_sum", [&] {
    const scalar_t* xp = xc.data_ptr<scalar_t>();
    for (int64_t i = 0; i < T; ++i) {
      const int64_t* t = tab + 5 * i;
      TORCH_CHECK(t[3] >= 0 && t[3] < nslots, "task slot out of range");
      for (int64_t h = 0; h < H; ++h) {
        const scalar_t* row = xp + (t[0] * H + h) * N;
        double a = 0.0;
        for (int64_t n = t[1]; n < t[2]; ++n) a += static_cast<double>(row[n]);
        acc[t[3] * H + h] += a;
      }
    }
    scalar_t* op = out.data_ptr<scalar_t>();
    for (int64_t j = 0; j < nslots * H; ++j) op[j] = static_cast<scalar_t>(acc[j]);
  });
  return out;
}

// (B, H, N): each token's slot statistic stat (nslots, H); fill at the tokens of no task (padding)
Tensor tssa_slot_read(const Tensor& stat, const Tensor& tasks, int64_t batch, int64_t n_tokens, double fill) {
  TORCH_CHECK(stat.dim() == 2 && stat.device().is_cpu(), "stat must be a (nslots, H) CPU tensor");
  check_slot_args(stat.unsqueeze(0), tasks, stat.size(0));
  const Tensor sc = stat.contiguous();
  const int64_t nslots = stat.size(0), H = stat.size(1), T = tasks.size(0);
  const int64_t* tab = tasks.data_ptr<int64_t>();
  Tensor out = at::full({batch, H, n_tokens}, fill, stat.options());
  AT_DISPATCH_FLOATING_TYPES(stat.scalar_type(), "tssa_slot_read", [&] {
    const scalar_t* sp = sc.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < T; ++i) {
      const int64_t* t = tab + 5 * i;
      TORCH_CHECK(t[3] >= 0 && t[3] < nslots && t[0] >= 0 && t[0] < batch && t[1] >= 0 && t[2] <= n_tokens,
                  "task out of range");
      for (int64_t h = 0; h < H; ++h) {
        scalar_t* row = op + (t[0] * H + h) * n_tokens;
        std::fill(row + t[1], row + t[2], sp[t[3] * H + h]);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(attnzoo_cpu, m) {
  // tasks / nslots: padded batches and packed rows (the Tasks struct); None for the plain (B, chunk) tasks
  m.def("tssa_colsum_sq(Tensor w, Tensor? d, Tensor? tasks=None, int nslots=0) -> Tensor");
  m.def("tssa_token_stats(Tensor w, Tensor r, Tensor temp, Tensor? tasks=None, int nslots=0) -> Tensor[]");
  m.def("tssa_scale(Tensor w, Tensor pi, Tensor g, Tensor? tasks=None, int nslots=0) -> Tensor");
  m.def("tssa_causal(Tensor w, Tensor temp, Tensor bias, Tensor? tasks=None, int nslots=0) -> Tensor[]");
  m.def("tssa_bwd_gw(Tensor w, Tensor G, Tensor pi, Tensor g, Tensor? tasks=None, int nslots=0) -> Tensor[]");
  m.def("tssa_rowdot_sq(Tensor w, Tensor v, Tensor? tasks=None, int nslots=0) -> Tensor");
  m.def(
      "tssa_causal_bwd(Tensor w, Tensor G, Tensor temp, Tensor pi, Tensor den, Tensor? tasks=None, int nslots=0) "
      "-> Tensor[]");
  m.def(
      "tssa_bwd_dw(Tensor w, Tensor G, Tensor a, Tensor b, Tensor c, Tensor d, Tensor e, Tensor f, Tensor h, "
      "Tensor? tasks=None, int nslots=0) -> Tensor");
  m.def("tssa_mask_tasks(Tensor mask, int task_len) -> Tensor");
  m.def("tssa_slot_sum(Tensor x, Tensor tasks, int nslots) -> Tensor");
  m.def("tssa_slot_read(Tensor stat, Tensor tasks, int batch, int n_tokens, float fill) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnzoo_cpu, CPU, m) {
  m.impl("tssa_colsum_sq", &tssa_colsum_sq);
  m.impl("tssa_token_stats", &tssa_token_stats);
  m.impl("tssa_scale", &tssa_scale);
  m.impl("tssa_causal", &tssa_causal);
  m.impl("tssa_bwd_gw", &tssa_bwd_gw);
  m.impl("tssa_rowdot_sq", &tssa_rowdot_sq);
  m.impl("tssa_bwd_dw", &tssa_bwd_dw);
  m.impl("tssa_causal_bwd", &tssa_causal_bwd);
  m.impl("tssa_mask_tasks", &tssa_mask_tasks);
  m.impl("tssa_slot_sum", &tssa_slot_sum);
  m.impl("tssa_slot_read", &tssa_slot_read);
}
