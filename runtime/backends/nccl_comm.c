/*
 * nccl_comm.c - see nccl_comm.h. NCCL is reached through dlopen/dlsym; its types come from
 * the toolkit's nccl.h (CUDA builds only).
 */
#include "nccl_comm.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h" /* the CUDA runtime headers, warnings of the toolkit's own muted */

/* nccl.h (types only: no symbol is linked) trips the same warnings as the toolkit headers */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* ---- the loaded library ---- */

typedef struct nccl_fns {
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                               cudaStream_t);
    const char *(*error_string)(ncclResult_t);
    /* [pd] point-to-point (optional: NULL when the library lacks them) */
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} nccl_fns;

static nccl_fns g_nccl;
static bool g_loaded;
static char g_load_error[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
    /* NVLS off before NCCL reads its environment (nccl_comm.h) */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(g_load_error, sizeof g_load_error, "cannot load libnccl.so.2 (%s)", dlerror());
        return;
    }
#define SYM(field, name)                                                                    \
    do {                                                                                    \
        *(void **)&g_nccl.field = dlsym(h, name);                                           \
        if (g_nccl.field == NULL) {                                                         \
            snprintf(g_load_error, sizeof g_load_error, "libnccl.so.2 has no %s", name);    \
            return;                                                                         \
        }                                                                                   \
    } while (0)
    SYM(get_version, "ncclGetVersion");
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(comm_init_rank, "ncclCommInitRank");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(all_reduce, "ncclAllReduce");
    SYM(all_gather, "ncclAllGather");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    /* [pd] send / recv (NCCL >= 2.7): KV transfer between a prefill and a decode engine */
    *(void **)&g_nccl.send = dlsym(h, "ncclSend");
    *(void **)&g_nccl.recv = dlsym(h, "ncclRecv");
    *(void **)&g_nccl.group_start = dlsym(h, "ncclGroupStart");
    *(void **)&g_nccl.group_end = dlsym(h, "ncclGroupEnd");
    g_loaded = true;
}

static ms_status need_nccl(ms_error *err) {
    pthread_once(&g_once, load_once);
    if (!g_loaded)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "tensor parallel needs NCCL: %s", g_load_error);
    return MS_OK;
}

#define NCCL_TRY(err, what, call)                                                           \
    do {                                                                                    \
        ncclResult_t r_ = (call);                                                           \
        if (r_ != ncclSuccess)                                                              \
            return MS_FAIL((err), MS_ERR_CUDA, "nccl: %s: %s", (what),                      \
                           g_nccl.error_string(r_));                                        \
    } while (0)

#define CUDA_TRY(err, what, call)                                                           \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess)                                                              \
            return MS_FAIL((err), MS_ERR_CUDA, "nccl: %s: %s", (what),                      \
                           cudaGetErrorString(e_));                                         \
    } while (0)

bool ms_nccl_available(int *version) {
    if (need_nccl(NULL) != MS_OK)
        return false;
    int v = 0;
    if (g_nccl.get_version(&v) != ncclSuccess)
        return false;
    if (version != NULL)
        *version = v;
    return true;
}

ms_status ms_nccl_unique_id(ms_nccl_id *out, ms_error *err) {
    MS_TRY(need_nccl(err));
    ncclUniqueId id;
    NCCL_TRY(err, "ncclGetUniqueId", g_nccl.get_unique_id(&id));
    _Static_assert(sizeof id == sizeof out->bytes, "ncclUniqueId is 128 bytes");
    memcpy(out->bytes, &id, sizeof id);
    return MS_OK;
}

/* ---- communicators ---- */

struct ms_nccl_comm {
    ncclComm_t comm;
    int device;
    int32_t rank, world;
    cudaStream_t stream;
    void *d_send, *d_recv; /* staging of the host all_gather: [max], [world * max] */
    size_t max_bytes;
};

ms_status ms_nccl_comm_init(int device, int32_t rank, int32_t world, const ms_nccl_id *id,
                            size_t max_gather_bytes, ms_nccl_comm **out, ms_error *err) {
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || id == NULL || max_gather_bytes == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "nccl: rank %d of %d (gather %zu bytes)", rank,
                       world, max_gather_bytes);
    MS_TRY(need_nccl(err));
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(device));
    ms_nccl_comm *c = ms_calloc(1, sizeof *c);
    if (c == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "nccl: out of memory");
    c->device = device;
    c->rank = rank;
    c->world = world;
    c->max_bytes = max_gather_bytes;
    ms_status st = MS_OK;
    cudaError_t ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaMalloc(&c->d_send, max_gather_bytes);
    if (ce == cudaSuccess)
        ce = cudaMalloc(&c->d_recv, max_gather_bytes * (size_t)world);
    if (ce != cudaSuccess) {
        st = MS_FAIL(err, MS_ERR_CUDA, "nccl: rank %d: %s", rank, cudaGetErrorString(ce));
    } else {
        ncclUniqueId uid;
        memcpy(&uid, id->bytes, sizeof uid);
        ncclResult_t r = g_nccl.comm_init_rank(&c->comm, world, uid, rank);
        if (r != ncclSuccess)
            st = MS_FAIL(err, MS_ERR_CUDA, "nccl: ncclCommInitRank (rank %d of %d, device %d): %s",
                         rank, world, device, g_nccl.error_string(r));
    }
    if (st != MS_OK) {
        c->comm = NULL;
        ms_nccl_comm_free(c);
        return st;
    }
    *out = c;
    return MS_OK;
}

void ms_nccl_comm_free(ms_nccl_comm *c) {
    if (c == NULL)
        return;
    if (c->comm != NULL)
        (void)g_nccl.comm_destroy(c->comm);
    cudaFree(c->d_send);
    cudaFree(c->d_recv);
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    ms_free(c);
}

ms_status ms_nccl_all_reduce_sum(ms_nccl_comm *c, void *buf, size_t count, ms_dtype dtype,
                                 void *stream, ms_error *err) {
    ncclDataType_t t;
    switch (dtype) {
    case MS_DTYPE_F32: t = ncclFloat32; break;
    case MS_DTYPE_BF16: t = ncclBfloat16; break;
    case MS_DTYPE_F16: t = ncclFloat16; break;
    default:
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "nccl: all-reduce of %s is not supported",
                       ms_dtype_str(dtype));
    }
    cudaStream_t s = stream != NULL ? (cudaStream_t)stream : c->stream;
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(c->device));
    NCCL_TRY(err, "ncclAllReduce", g_nccl.all_reduce(buf, buf, count, t, ncclSum, c->comm, s));
    if (stream == NULL)
        CUDA_TRY(err, "all-reduce", cudaStreamSynchronize(s));
    return MS_OK;
}

static ms_status nccl_all_gather_host(void *ctx, int32_t rank, const void *send, size_t bytes,
                                      void *recv, ms_error *err) {
    ms_nccl_comm *c = ctx;
    if (rank != c->rank)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "nccl: all_gather as rank %d on rank %d's "
                       "communicator", rank, c->rank);
    if (bytes > c->max_bytes)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "nccl: all_gather of %zu bytes per rank, the communicator holds %zu",
                       bytes, c->max_bytes);
    if (bytes == 0)
        return MS_OK;
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(c->device));
    CUDA_TRY(err, "all_gather upload",
             cudaMemcpyAsync(c->d_send, send, bytes, cudaMemcpyHostToDevice, c->stream));
    NCCL_TRY(err, "ncclAllGather",
             g_nccl.all_gather(c->d_send, c->d_recv, bytes, ncclUint8, c->comm, c->stream));
    CUDA_TRY(err, "all_gather download",
             cudaMemcpyAsync(recv, c->d_recv, bytes * (size_t)c->world, cudaMemcpyDeviceToHost,
                             c->stream));
    CUDA_TRY(err, "all_gather", cudaStreamSynchronize(c->stream));
    return MS_OK;
}

static ms_status nccl_all_reduce_host(void *ctx, int32_t rank, float *buf, size_t count,
                                      ms_error *err) {
    ms_nccl_comm *c = ctx;
    size_t bytes = count * sizeof(float);
    if (rank != c->rank || bytes > c->max_bytes)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "nccl: all-reduce of %zu bytes as rank %d on rank %d's communicator "
                       "(holds %zu)", bytes, rank, c->rank, c->max_bytes);
    if (count == 0)
        return MS_OK;
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(c->device));
    CUDA_TRY(err, "all-reduce upload",
             cudaMemcpyAsync(c->d_send, buf, bytes, cudaMemcpyHostToDevice, c->stream));
    NCCL_TRY(err, "ncclAllReduce",
             g_nccl.all_reduce(c->d_send, c->d_send, count, ncclFloat32, ncclSum, c->comm,
                               c->stream));
    CUDA_TRY(err, "all-reduce download",
             cudaMemcpyAsync(buf, c->d_send, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(err, "all-reduce", cudaStreamSynchronize(c->stream));
    return MS_OK;
}

static size_t nccl_max_bytes(void *ctx) { return ((ms_nccl_comm *)ctx)->max_bytes; }

ms_status ms_nccl_all_gather_rows(ms_nccl_comm *c, const float *send, int64_t rows,
                                  int64_t cols, float *out, int64_t out_stride, int64_t out_cols,
                                  void *stream, ms_error *err) {
    if (rows < 0 || cols < 1 || out_cols < 1 || out_stride < out_cols ||
        (int64_t)c->world * cols < out_cols)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "nccl: all-gather of [%lld, %lld] per rank into [%lld, %lld] (stride %lld)",
                       (long long)rows, (long long)cols, (long long)rows, (long long)out_cols,
                       (long long)out_stride);
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    if (bytes > c->max_bytes)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "nccl: all-gather of %zu bytes per rank, the communicator holds %zu",
                       bytes, c->max_bytes);
    if (rows == 0)
        return MS_OK;
    cudaStream_t s = stream != NULL ? (cudaStream_t)stream : c->stream;
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(c->device));
    NCCL_TRY(err, "ncclAllGather",
             g_nccl.all_gather(send, c->d_recv, bytes, ncclUint8, c->comm, s));
    /* d_recv is [world][rows][cols]: rank r's block goes to columns [r * cols, ...) of out */
    for (int32_t r = 0; r < c->world; r++) {
        int64_t c0 = (int64_t)r * cols;
        int64_t n = out_cols - c0 < cols ? out_cols - c0 : cols;
        if (n <= 0)
            break;
        CUDA_TRY(err, "all-gather scatter",
                 cudaMemcpy2DAsync(out + c0, (size_t)out_stride * sizeof(float),
                                   (const char *)c->d_recv + (size_t)r * bytes,
                                   (size_t)cols * sizeof(float), (size_t)n * sizeof(float),
                                   (size_t)rows, cudaMemcpyDeviceToDevice, s));
    }
    if (stream == NULL)
        CUDA_TRY(err, "all-gather", cudaStreamSynchronize(s));
    return MS_OK;
}

static const ms_collective_i nccl_collective_iface = {nccl_all_gather_host, nccl_all_reduce_host,
                                                      nccl_max_bytes};

ms_collective ms_nccl_collective(ms_nccl_comm *c) {
    ms_collective k = {&nccl_collective_iface, c, c->rank, c->world};
    return k;
}

/* ---- [pd] point-to-point ---- */

ms_status ms_nccl_p2p(ms_nccl_comm *c, const ms_nccl_p2p_op *ops, int32_t n, void *stream,
                      ms_error *err) {
    MS_TRY(need_nccl(err));
    if (g_nccl.send == NULL || g_nccl.recv == NULL || g_nccl.group_start == NULL ||
        g_nccl.group_end == NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "nccl: this libnccl.so.2 has no ncclSend / "
                       "ncclRecv (NCCL 2.7 or newer is needed)");
    for (int32_t i = 0; i < n; i++)
        if (ops[i].peer < 0 || ops[i].peer >= c->world || ops[i].peer == c->rank ||
            ops[i].buf == NULL)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "nccl: p2p op %d: peer %d of %d (rank %d)",
                           (int)i, (int)ops[i].peer, (int)c->world, (int)c->rank);
    cudaStream_t s = stream != NULL ? (cudaStream_t)stream : c->stream;
    CUDA_TRY(err, "cudaSetDevice", cudaSetDevice(c->device));
    NCCL_TRY(err, "ncclGroupStart", g_nccl.group_start());
    ncclResult_t r = ncclSuccess;
    for (int32_t i = 0; i < n && r == ncclSuccess; i++)
        r = ops[i].send ? g_nccl.send(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, c->comm, s)
                        : g_nccl.recv(ops[i].buf, ops[i].bytes, ncclUint8, ops[i].peer, c->comm,
                                      s);
    ncclResult_t r2 = g_nccl.group_end();
    if (r != ncclSuccess)
        return MS_FAIL(err, MS_ERR_CUDA, "nccl: %s: %s", "ncclSend/ncclRecv",
                       g_nccl.error_string(r));
    NCCL_TRY(err, "ncclGroupEnd", r2);
    if (stream == NULL)
        CUDA_TRY(err, "p2p", cudaStreamSynchronize(s));
    return MS_OK;
}

int32_t ms_nccl_rank(const ms_nccl_comm *c) { return c->rank; }
