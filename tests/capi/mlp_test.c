/* The C API, used from C: collectives with exactly known results, error
 * reporting without aborting, activation checkpointing that leaves gradients
 * bitwise unchanged, and a 2-layer MLP trained with ZeRO under every stage
 * (0-3) that must end with bitwise identical weights on every rank.
 *
 * Run under mpirun with any world size (tests/capi/run_capi_test.sh uses 2).
 * Every rank runs every check (so all ranks call the same collectives) and
 * exits non-zero if any failed. Prints "capi digest stage S: HEX" per stage.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fd.h"

enum { kIn = 8, kHidden = 16, kClasses = 4, kBatch = 32, kSteps = 40 };

static int g_failures = 0;
static int g_rank = 0;

#define EXPECT(cond, ...)                                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      ++g_failures;                                                    \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s: ", g_rank, __FILE__, \
              __LINE__, #cond);                                        \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, "\n");                                           \
    }                                                                  \
  } while (0)

/* Deterministic values in [-1, 1): a hash of (seed, index). */
static float det_uniform(uint32_t seed, uint32_t i) {
  uint32_t h = seed * 0x9E3779B1u ^ (i + 0x7F4A7C15u) * 0x85EBCA77u;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  h *= 0x297A2D39u;
  h ^= h >> 15;
  return (float)(h >> 8) / 8388608.0f - 1.0f;
}

static tm_tensor* make2(int64_t rows, int64_t cols, tm_dtype dtype, int grad) {
  int64_t dims[2] = {rows, cols};
  return tm_create(dims, 2, dtype, grad);
}

static tm_tensor* make1(int64_t n, tm_dtype dtype, int grad) {
  return tm_create(&n, 1, dtype, grad);
}

static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* ---- Collectives ---- */

static void test_collectives(int world) {
  float v[5];
  tm_tensor* t = make1(5, TM_F32, 0);
  for (int i = 0; i < 5; ++i) v[i] = (float)g_rank;
  EXPECT(tm_write_f32(t, v, 5) == TM_OK, "%s", fd_last_error());
  EXPECT(fd_all_reduce(t) == TM_OK, "%s", fd_last_error());
  tm_read_f32(t, v, 5);
  for (int i = 0; i < 5; ++i)
    EXPECT(v[i] == (float)(world * (world - 1) / 2), "all_reduce[%d] = %g", i, v[i]);
  tm_free(t);

  int32_t iv[3] = {g_rank + 1, 2 * g_rank, -g_rank};
  tm_tensor* ti = make1(3, TM_I32, 0);
  tm_write_i32(ti, iv, 3);
  EXPECT(fd_all_reduce(ti) == TM_OK, "%s", fd_last_error());
  tm_read_i32(ti, iv, 3);
  EXPECT(iv[0] == world * (world + 1) / 2 && iv[1] == world * (world - 1) &&
             iv[2] == -world * (world - 1) / 2,
         "i32 all_reduce = %d %d %d", iv[0], iv[1], iv[2]);
  tm_free(ti);

  const int root = world > 1 ? 1 : 0;
  float b[7];
  tm_tensor* tb = make1(7, TM_F32, 0);
  for (int i = 0; i < 7; ++i) b[i] = det_uniform((uint32_t)g_rank + 100u, (uint32_t)i);
  tm_write_f32(tb, b, 7);
  EXPECT(fd_broadcast(tb, root) == TM_OK, "%s", fd_last_error());
  tm_read_f32(tb, b, 7);
  for (int i = 0; i < 7; ++i)
    EXPECT(b[i] == det_uniform((uint32_t)root + 100u, (uint32_t)i), "broadcast[%d] = %g", i,
           b[i]);
  tm_free(tb);

  float s[2] = {(float)g_rank, (float)(10 * g_rank)};
  float g[64];
  tm_tensor* send = make1(2, TM_F32, 0);
  tm_tensor* recv = make1(2 * world, TM_F32, 0);
  tm_write_f32(send, s, 2);
  EXPECT(fd_all_gather(send, recv) == TM_OK, "%s", fd_last_error());
  tm_read_f32(recv, g, (size_t)(2 * world));
  for (int r = 0; r < world; ++r)
    EXPECT(g[2 * r] == (float)r && g[2 * r + 1] == (float)(10 * r), "all_gather rank %d", r);

  /* reduce_scatter: rank q sends element j = q + j; rank r receives the sum
   * over q of (q + r*2 + k) for k in {0, 1}. */
  tm_tensor* rs_send = make1(2 * world, TM_F32, 0);
  for (int j = 0; j < 2 * world; ++j) g[j] = (float)(g_rank + j);
  tm_write_f32(rs_send, g, (size_t)(2 * world));
  EXPECT(fd_reduce_scatter(rs_send, send) == TM_OK, "%s", fd_last_error());
  tm_read_f32(send, s, 2);
  for (int k = 0; k < 2; ++k) {
    const float want = (float)(world * (world - 1) / 2 + world * (2 * g_rank + k));
    EXPECT(s[k] == want, "reduce_scatter[%d] = %g, want %g", k, s[k], want);
  }
  /* Shape contract violations fail before communicating. */
  EXPECT(fd_all_gather(rs_send, recv) == (world == 1 ? TM_OK : TM_ERR_ARG),
         "all_gather with a wrong count: %s", fd_last_error());
  EXPECT(fd_reduce_scatter(send, send) == (world == 1 ? TM_OK : TM_ERR_ARG),
         "reduce_scatter with a wrong count: %s", fd_last_error());
  EXPECT(fd_broadcast(send, world) == TM_ERR_ARG, "broadcast from root = world");
  tm_free(rs_send);
  tm_free(send);
  tm_free(recv);
}

/* ---- Errors ---- */

static void test_errors(void) {
  tm_tensor* a = make2(3, 4, TM_F32, 0);
  tm_tensor* b = make2(5, 2, TM_F32, 0);
  EXPECT(tm_matmul(NULL, b, NULL) == NULL, "matmul of NULL");
  EXPECT(strstr(fd_last_error(), "NULL") != NULL, "message: %s", fd_last_error());
  EXPECT(tm_matmul(a, b, NULL) == NULL, "matmul (3,4) @ (5,2)");
  EXPECT(strstr(fd_last_error(), "(3, 4)") != NULL, "message: %s", fd_last_error());
  EXPECT(tm_add(a, b) == NULL, "add of different shapes");
  float v[3] = {0};
  EXPECT(tm_write_f32(a, v, 3) == TM_ERR_ARG, "write of 3 values into 12");
  EXPECT(tm_backward(a) == TM_ERR_ARG, "backward from a tensor without grad");
  int64_t bad = -2;
  EXPECT(tm_create(&bad, 1, TM_F32, 0) == NULL, "negative dim");
  int64_t two = 2;
  EXPECT(tm_create(&two, 1, TM_I32, 1) == NULL, "i32 with grad");
  tm_tensor* logits = make2(2, 3, TM_F32, 1);
  tm_tensor* tg = make1(2, TM_I32, 0);
  int32_t targets[2] = {0, 3};
  tm_write_i32(tg, targets, 2);
  EXPECT(tm_cross_entropy(logits, tg) == NULL, "target 3 of 3 classes");
  EXPECT(tm_cross_entropy(logits, a) == NULL, "f32 targets");
  EXPECT(fd_zero_wrap(NULL, 2) == NULL, "wrap NULL");
  tm_tensor* p = make1(4, TM_F32, 1);
  tm_adamw* opt = tm_adamw_create(&p, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f);
  EXPECT(opt != NULL, "%s", fd_last_error());
  EXPECT(fd_zero_wrap(opt, 7) == NULL, "stage 7");
  EXPECT(strstr(fd_last_error(), "stage") != NULL, "message: %s", fd_last_error());
  tm_tensor* twice[2] = {p, p};
  EXPECT(tm_adamw_create(twice, 2, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f) == NULL, "same param twice");
  tm_adamw_free(opt);
  tm_free(p);
  tm_free(tg);
  tm_free(logits);
  tm_free(a);
  tm_free(b);
}

/* ---- Gradients handed on ---- */

/* c = a + b hands c's gradient to a and b as one tensor (no copy); clearing a's must not
 * clear b's, and a later backward adds into each on its own. */
static void test_shared_gradients(void) {
  tm_tensor* a = make1(3, TM_F32, 1);
  tm_tensor* b = make1(3, TM_F32, 1);
  const float va[3] = {1, 2, 3}, vb[3] = {4, 5, 6};
  tm_write_f32(a, va, 3);
  tm_write_f32(b, vb, 3);
  tm_tensor* c = tm_add(a, b);
  EXPECT(c != NULL && tm_backward(c) == TM_OK, "%s", fd_last_error());
  EXPECT(tm_zero_grad(a) == TM_OK, "%s", fd_last_error());
  float ga[3] = {9, 9, 9}, gb[3] = {0, 0, 0};
  tm_read_grad_f32(a, ga, 3);
  tm_read_grad_f32(b, gb, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT(ga[i] == 0.0f, "a's gradient [%d] after tm_zero_grad: %g", i, ga[i]);
    EXPECT(gb[i] == 1.0f, "b's gradient [%d] after a's was cleared: %g", i, gb[i]);
  }
  tm_tensor* d = tm_add(a, b);
  EXPECT(d != NULL && tm_backward(d) == TM_OK, "%s", fd_last_error());
  tm_read_grad_f32(a, ga, 3);
  tm_read_grad_f32(b, gb, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT(ga[i] == 1.0f && gb[i] == 2.0f, "after a second backward [%d]: a %g, b %g", i, ga[i],
           gb[i]);
  }
  tm_free(d);
  tm_free(c);
  tm_free(b);
  tm_free(a);
}

/* ---- The MLP ---- */

typedef struct {
  tm_tensor* w1; /* (kIn, kHidden) */
  tm_tensor* b1; /* (kHidden) */
  tm_tensor* w2; /* (kHidden, kClasses) */
  tm_tensor* b2; /* (kClasses) */
} Mlp;

static Mlp g_mlp; /* read by hidden(), which fd_checkpoint calls without context */

static void fill(tm_tensor* t, uint32_t seed, float scale) {
  float buf[kIn * kHidden];
  const int64_t n = tm_numel(t);
  for (int64_t i = 0; i < n; ++i) buf[i] = scale * det_uniform(seed, (uint32_t)i);
  tm_write_f32(t, buf, (size_t)n);
}

static Mlp mlp_create(void) {
  Mlp m;
  m.w1 = make2(kIn, kHidden, TM_F32, 1);
  m.b1 = make1(kHidden, TM_F32, 1);
  m.w2 = make2(kHidden, kClasses, TM_F32, 1);
  m.b2 = make1(kClasses, TM_F32, 1);
  fill(m.w1, 1, 0.5f);
  fill(m.b1, 2, 0.1f);
  fill(m.w2, 3, 0.5f);
  fill(m.b2, 4, 0.1f);
  return m;
}

static void mlp_free(Mlp* m) {
  tm_free(m->w1);
  tm_free(m->b1);
  tm_free(m->w2);
  tm_free(m->b2);
}

/* gelu(x @ w1 + b1): recomputed in backward when run through fd_checkpoint. */
static tm_tensor* hidden(tm_tensor* x) {
  tm_tensor* pre = tm_matmul(x, g_mlp.w1, g_mlp.b1);
  if (pre == NULL) return NULL;
  tm_tensor* h = tm_gelu(pre);
  tm_free(pre);
  return h;
}

/* This rank's batch: inputs in [-1, 1) and the class of a fixed linear map. */
static void make_batch(tm_tensor* x, tm_tensor* y) {
  float xs[kBatch * kIn];
  int32_t ys[kBatch];
  for (int r = 0; r < kBatch; ++r) {
    float best = -1e30f;
    for (int i = 0; i < kIn; ++i)
      xs[r * kIn + i] = det_uniform(1000u + (uint32_t)g_rank, (uint32_t)(r * kIn + i));
    for (int c = 0; c < kClasses; ++c) {
      float score = 0.0f;
      for (int i = 0; i < kIn; ++i) score += xs[r * kIn + i] * det_uniform(77u, (uint32_t)(c * kIn + i));
      if (score > best) {
        best = score;
        ys[r] = c;
      }
    }
  }
  tm_write_f32(x, xs, kBatch * kIn);
  tm_write_i32(y, ys, kBatch);
}

static tm_tensor* mlp_loss(tm_tensor* x, tm_tensor* y, int checkpoint) {
  tm_tensor* h = checkpoint ? fd_checkpoint(hidden, x) : hidden(x);
  if (h == NULL) return NULL;
  tm_tensor* logits = tm_matmul(h, g_mlp.w2, g_mlp.b2);
  tm_free(h);
  if (logits == NULL) return NULL;
  tm_tensor* loss = tm_cross_entropy(logits, y);
  tm_free(logits);
  return loss;
}

/* Gradients with fd_checkpoint are bitwise those without. */
static void test_checkpoint_grads(tm_tensor* x, tm_tensor* y) {
  float g1[2][kIn * kHidden], g2[2][kHidden * kClasses];
  g_mlp = mlp_create();
  for (int ck = 0; ck < 2; ++ck) {
    tm_tensor* loss = mlp_loss(x, y, ck);
    EXPECT(loss != NULL, "%s", fd_last_error());
    EXPECT(tm_backward(loss) == TM_OK, "%s", fd_last_error());
    tm_free(loss);
    tm_read_grad_f32(g_mlp.w1, g1[ck], kIn * kHidden);
    tm_read_grad_f32(g_mlp.w2, g2[ck], kHidden * kClasses);
    tm_zero_grad(g_mlp.w1);
    tm_zero_grad(g_mlp.b1);
    tm_zero_grad(g_mlp.w2);
    tm_zero_grad(g_mlp.b2);
  }
  EXPECT(memcmp(g1[0], g1[1], sizeof g1[0]) == 0, "w1 gradient differs with fd_checkpoint");
  EXPECT(memcmp(g2[0], g2[1], sizeof g2[0]) == 0, "w2 gradient differs with fd_checkpoint");
  float nz = 0.0f;
  for (int i = 0; i < kIn * kHidden; ++i) nz += fabsf(g1[1][i]);
  EXPECT(nz > 0.0f, "w1 gradient through fd_checkpoint is zero");
  mlp_free(&g_mlp);
}

/* Trains under ZeRO `stage`; returns a digest of the final weights. */
static uint64_t train(int stage, tm_tensor* x, tm_tensor* y, float* first, float* last) {
  g_mlp = mlp_create();
  tm_tensor* params[4] = {g_mlp.w1, g_mlp.b1, g_mlp.w2, g_mlp.b2};
  tm_adamw* adam = tm_adamw_create(params, 4, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f);
  EXPECT(adam != NULL, "%s", fd_last_error());
  fd_zero_optimizer* zero = fd_zero_wrap(adam, stage);
  EXPECT(zero != NULL, "%s", fd_last_error());
  EXPECT(tm_adamw_step(adam) == TM_ERR_STATE, "tm_adamw_step on a wrapped optimizer");
  for (int step = 0; step < kSteps; ++step) {
    tm_tensor* loss = mlp_loss(x, y, 1);
    EXPECT(loss != NULL, "%s", fd_last_error());
    /* The mean loss over ranks. */
    tm_tensor* mean = make1(1, TM_F32, 0);
    float l = tm_item(loss) / (float)fd_world_size();
    tm_write_f32(mean, &l, 1);
    fd_all_reduce(mean);
    l = tm_item(mean);
    tm_free(mean);
    if (step == 0) *first = l;
    *last = l;
    EXPECT(tm_backward(loss) == TM_OK, "%s", fd_last_error());
    tm_free(loss);
    EXPECT(fd_zero_step(zero) == TM_OK, "%s", fd_last_error());
  }
  /* Digest of the weights; every rank must hold rank 0's weights bitwise. */
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 4; ++i) {
    float w[kIn * kHidden], w0[kIn * kHidden];
    const int64_t n = tm_numel(params[i]);
    EXPECT(tm_read_f32(params[i], w, (size_t)n) == TM_OK, "%s", fd_last_error());
    h = fnv1a(h, w, (size_t)n * sizeof(float));
    tm_tensor* copy = tm_create((int64_t[]){n}, 1, TM_F32, 0);
    tm_write_f32(copy, w, (size_t)n);
    fd_broadcast(copy, 0);
    tm_read_f32(copy, w0, (size_t)n);
    EXPECT(memcmp(w, w0, (size_t)n * sizeof(float)) == 0, "stage %d: param %d differs from rank 0",
           stage, i);
    tm_free(copy);
  }
  fd_zero_free(zero);
  tm_adamw_free(adam);
  mlp_free(&g_mlp);
  return h;
}

int main(int argc, char** argv) {
  EXPECT(fd_rank() == -1, "rank before fd_init");
  tm_tensor* early = make1(2, TM_F32, 0);
  EXPECT(fd_all_reduce(early) == TM_ERR_STATE, "all_reduce before fd_init");
  EXPECT(strstr(fd_last_error(), "fd_init") != NULL, "message: %s", fd_last_error());
  tm_free(early);

  if (fd_init(&argc, &argv) != TM_OK) {
    fprintf(stderr, "fd_init: %s\n", fd_last_error());
    return 1;
  }
  g_rank = fd_rank();
  const int world = fd_world_size();
  EXPECT(fd_init(&argc, &argv) == TM_ERR_STATE, "second fd_init");

  test_collectives(world);
  test_errors();
  test_shared_gradients();

  tm_tensor* x = make2(kBatch, kIn, TM_F32, 0);
  tm_tensor* y = make1(kBatch, TM_I32, 0);
  make_batch(x, y);
  test_checkpoint_grads(x, y);

  const int stages[4] = {2, 0, 1, 3};
  uint64_t digest[4];
  for (int i = 0; i < 4; ++i) {
    float first = 0.0f, last = 0.0f;
    digest[i] = train(stages[i], x, y, &first, &last);
    if (g_rank == 0)
      printf("capi stage %d: loss %.6f -> %.6f  digest %016llx\n", stages[i], first, last,
             (unsigned long long)digest[i]);
    EXPECT(isfinite(last) && last < 0.5f * first, "stage %d: loss %g -> %g did not fall",
           stages[i], first, last);
    EXPECT(digest[i] == digest[0], "stage %d weights differ from stage %d's", stages[i],
           stages[0]);
  }
  tm_free(x);
  tm_free(y);

  EXPECT(fd_finalize() == TM_OK, "%s", fd_last_error());
  if (g_rank == 0) printf("capi world %d: %s\n", world, g_failures == 0 ? "PASS" : "FAIL");
  return g_failures == 0 ? 0 : 1;
}
