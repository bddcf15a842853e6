/*
 * cuda_ops.c - loading kernel instances and launching them (cuda_ops.h).
 *
 * Constraints: the driver library is never linked; cubins are loaded with cudaLibraryLoadData and
 * kernels launched with cudaLaunchKernel(ExC) on the cudaKernel_t handle, so binaries start without
 * a GPU. On sm_90 launches may allow programmatic dependent launch (ms_cuda_pdl). Launchers
 * validate on the host what the templates assume (16-byte alignment of vectorized rows, head
 * counts, split buffers): a device kernel cannot report a bad argument.
 */
#include "cuda_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc_cache.h"

/* ---- modules ---- */

ms_status ms_cuda_device_arch(int device, int *arch, int *n_sms, ms_error *err) {
    int major = 0, minor = 0, sms = 0;
    MS_CUDA_TRY(err, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MS_CUDA_TRY(err, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    MS_CUDA_TRY(err, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    *arch = major * 10 + minor;
    if (n_sms != NULL)
        *n_sms = sms;
    return MS_OK;
}

static ms_status module_load(ms_cuda_module *m, const ms_cubin *cb, ms_error *err) {
    MS_CUDA_TRY(err, cudaLibraryLoadData(&m->lib, cb->data, NULL, NULL, 0, NULL, NULL, 0));
    for (int i = 0; i < MS_KERNEL_MAX_ENTRIES; i++) {
        const char *name = ms_kernel_op_entry(m->spec.op, i);
        if (name == NULL)
            break;
        MS_CUDA_TRY(err, cudaLibraryGetKernel(&m->fn[i], m->lib, name));
    }
    if (m->spec.op == MS_KERNEL_OP_ATTN_DECODE) {
        int n = 0;
        MS_CUDA_TRY(err, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                             &n, (const void *)m->fn[0], MS_ATTN_DECODE_THREADS, 0));
        m->blocks_per_sm = n;
    }
    return MS_OK;
}

ms_status ms_cuda_module_init(ms_cuda_module **out, const ms_kernel_spec *spec, int arch,
                              const char *cache_dir, ms_error *err) {
    *out = NULL;
    ms_cuda_module *m = ms_calloc(1, sizeof *m);
    if (m == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "kernel module: out of memory");
    m->spec = *spec;
    m->arch = arch;
    char uri[MS_KERNEL_URI_MAX];
    char *src = NULL;
    ms_cubin cb = {0};
    ms_status st = ms_kernel_spec_uri(spec, 0, uri, sizeof uri, err);
    if (st == MS_OK)
        st = ms_kernel_spec_uri(spec, arch, m->uri, sizeof m->uri, err);
    if (st == MS_OK)
        st = ms_kernel_spec_instance_source(spec, &src, err);
    if (st == MS_OK)
        st = ms_nvrtc_compile(uri, src, arch, cache_dir, &cb, err);
    if (st == MS_OK) {
        m->from_cache = cb.from_cache;
        st = module_load(m, &cb, err);
        if (st != MS_OK)
            ms_error_prefix(err, "loading %s: ", m->uri);
    }
    ms_nvrtc_cubin_free(&cb);
    ms_free(src);
    if (st != MS_OK) {
        ms_cuda_module_free(m);
        return st;
    }
    *out = m;
    return MS_OK;
}

void ms_cuda_module_free(ms_cuda_module *m) {
    if (m == NULL)
        return;
    if (m->lib != NULL)
        (void)cudaLibraryUnload(m->lib);
    ms_free(m);
}

/* ---- launch helpers ---- */

static ms_status want_op(const ms_cuda_module *m, ms_kernel_op op, ms_error *err) {
    if (m == NULL || m->spec.op != op || m->fn[0] == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "launch %s: module is %s", ms_kernel_op_name(op),
                       m != NULL ? m->uri : "NULL");
    return MS_OK;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Elements of the module's dtype in 16 bytes. */
static int vec_elems(ms_kernel_dtype dt) { return dt == MS_KERNEL_DTYPE_F32 ? 4 : 8; }

/* Programmatic dependent launch for which kernels (read once per process from MS_CUDA_PDL):
 * 0 none ("0"), 1 the decode attention and the 16-bit GEMVs (the default), 2 every kernel
 * ("all"), 3 the decode attention only ("attn"). */
static int pdl_mode(void) {
    static int cached = -1; /* -1: not read yet */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("MS_CUDA_PDL");
        v = e == NULL || e[0] == '\0'   ? 1
            : strcmp(e, "0") == 0    ? 0
            : strcmp(e, "all") == 0  ? 2
            : strcmp(e, "attn") == 0 ? 3
                                     : 1;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

bool ms_cuda_pdl(const ms_cuda_module *m, int entry) {
    if (m == NULL || m->arch < 90)
        return false;
    const int mode = pdl_mode();
    return mode == 2 || (mode != 0 && m->spec.op == MS_KERNEL_OP_ATTN_DECODE) ||
           (mode == 1 && m->spec.op == MS_KERNEL_OP_MISC &&
            (entry == MS_CUDA_MISC_GEMV || entry == MS_CUDA_MISC_GEMV_NORM));
}

ms_status ms_cuda_launch_entry(const ms_cuda_module *m, int entry, unsigned gx, unsigned gy, unsigned gz,
                               unsigned threads, void *params, cudaStream_t stream, ms_error *err) {
    if (gx == 0 || gy == 0 || gz == 0)
        return MS_OK; /* nothing to do */
    void *args[] = {params};
    if (!ms_cuda_pdl(m, entry)) {
        dim3 grid = {gx, gy, gz}, block = {threads, 1, 1};
        MS_CUDA_TRY(err, cudaLaunchKernel((const void *)m->fn[entry], grid, block, args, 0, stream));
        return MS_OK;
    }
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = (dim3){gx, gy, gz};
    cfg.blockDim = (dim3){threads, 1, 1};
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    MS_CUDA_TRY(err, cudaLaunchKernelExC(&cfg, (const void *)m->fn[entry], args));
    return MS_OK;
}

static ms_status launch(const ms_cuda_module *m, int entry, unsigned gx, unsigned gy, unsigned gz,
                        unsigned threads, void *params, cudaStream_t stream, ms_error *err) {
    return ms_cuda_launch_entry(m, entry, gx, gy, gz, threads, params, stream, err);
}

/* ---- attention ---- */

static ms_status check_attn(const ms_cuda_module *m, const ms_attn_kernel_params *p, ms_error *err) {
    const ms_kernel_spec *s = &m->spec;
    if (p->batch < 0 || p->batch > 65535)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: batch %d outside [0, 65535]", m->uri, p->batch);
    if (p->n_kv_heads < 1 || p->n_kv_heads > 65535 || p->n_q_heads != p->n_kv_heads * s->group)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: %d query heads over %d KV heads does not match group %d", m->uri,
                       p->n_q_heads, p->n_kv_heads, s->group);
    if (p->q_stride < p->n_q_heads * s->head_dim || p->o_stride < p->n_q_heads * s->head_dim)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: q/o row stride %d/%d below %d heads x %d",
                       m->uri, p->q_stride, p->o_stride, p->n_q_heads, s->head_dim);
    if (!aligned16(p->kv) || !aligned16(p->q) || !aligned16(p->o) ||
        p->q_stride % vec_elems(s->act_dtype) != 0 || p->o_stride % vec_elems(s->act_dtype) != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: q, o and the page arena must be 16-byte aligned, with strides in "
                       "16-byte units",
                       m->uri);
    if (s->windowed && p->window < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: windowed kernel with window %d", m->uri,
                       p->window);
    if (p->qo_indptr == NULL || p->kv_indptr == NULL || p->kv_indices == NULL ||
        p->kv_last_page_len == NULL || p->kv_start == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: missing paged index arrays", m->uri);
    return MS_OK;
}

ms_status ms_cuda_attn_decode_launch(const ms_cuda_module *m, const ms_attn_kernel_params *p,
                                     cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_ATTN_DECODE, err));
    MS_TRY(check_attn(m, p, err));
    if (p->n_splits < 1 || p->n_splits > MS_ATTN_DECODE_MAX_SPLITS || p->pages_per_split < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d splits of %d pages", m->uri, p->n_splits,
                       p->pages_per_split);
    if (p->n_splits > 1 &&
        (p->part_o == NULL || p->part_lse == NULL || p->split_counter == NULL ||
         !aligned16(p->part_o)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: %d splits without 16-byte aligned partial buffers or split counters",
                       m->uri, p->n_splits);
    ms_attn_kernel_params copy = *p;
    return launch(m, 0, (unsigned)p->n_splits, (unsigned)p->n_kv_heads, (unsigned)p->batch,
                  MS_ATTN_DECODE_THREADS, &copy, stream, err);
}

ms_status ms_cuda_attn_prefill_launch(const ms_cuda_module *m, const ms_attn_kernel_params *p,
                                      int n_tiles, cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_ATTN_PREFILL, err));
    MS_TRY(check_attn(m, p, err));
    if (n_tiles < 0 || (n_tiles > 0 && (p->tile_req == NULL || p->tile_idx == NULL)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d tiles without tile lists", m->uri, n_tiles);
    ms_attn_kernel_params copy = *p;
    return launch(m, 0, (unsigned)n_tiles, (unsigned)p->n_kv_heads, 1, MS_ATTN_PREFILL_THREADS,
                  &copy, stream, err);
}

/* ---- the rest ---- */

ms_status ms_cuda_rope_kv_launch(const ms_cuda_module *m, const ms_rope_kv_params *p,
                                 cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_ROPE_KV, err));
    const int hd = m->spec.head_dim;
    if (p->n_tokens < 0 || p->n_kv_heads < 0 || p->n_q_heads < 0 ||
        (p->kv != NULL && (p->n_kv_heads < 1 || p->token_to_page == NULL || p->token_to_slot == NULL)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d tokens, %d q heads, %d kv heads", m->uri,
                       p->n_tokens, p->n_q_heads, p->n_kv_heads);
    if (p->q_stride < p->n_q_heads * hd || p->k_stride < p->n_kv_heads * hd ||
        (p->kv != NULL && p->v_stride < p->n_kv_heads * hd))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: q/k/v row strides %d/%d/%d too small", m->uri,
                       p->q_stride, p->k_stride, p->v_stride);
    if (p->rotary_dim < 0 || p->rotary_dim > hd || p->rotary_dim % 2 != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: rotary_dim %d (even, <= %d)", m->uri,
                       p->rotary_dim, hd);
    if (m->spec.rope != MS_KERNEL_ROPE_NONE && p->inv_freq == NULL && !(p->theta > 0.f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: rope theta %g", m->uri, (double)p->theta);
    if (m->spec.rope_scaling == MS_KERNEL_ROPE_SCALING_LLAMA3 && p->inv_freq == NULL &&
        !(p->factor > 0.f && p->high_freq_factor > p->low_freq_factor &&
          p->low_freq_factor > 0.f && p->original_max_pos > 0.f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: llama3 scaling needs factor > 0 and high_freq_factor > "
                       "low_freq_factor > 0 (got %g, %g, %g)",
                       m->uri, (double)p->factor, (double)p->low_freq_factor,
                       (double)p->high_freq_factor);
    if (m->spec.mrope) {
        if (p->pos == NULL || p->n_sections < 1 || p->n_sections > MS_ROPE_KV_MAX_SECTIONS ||
            p->pos_stride < p->n_tokens)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: M-RoPE needs positions and 1..%d sections with a stream stride "
                           ">= %d tokens (got %d sections, stride %d)",
                           m->uri, MS_ROPE_KV_MAX_SECTIONS, p->n_tokens, p->n_sections,
                           p->pos_stride);
        int sum = 0;
        for (int i = 0; i < p->n_sections; i++) {
            if (p->sections[i] < 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: M-RoPE section %d is negative",
                               m->uri, i);
            sum += p->sections[i];
        }
        const int rot = p->rotary_dim > 0 ? p->rotary_dim : hd;
        if (sum != rot / 2)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: M-RoPE sections sum to %d pairs, rotary_dim %d has %d", m->uri, sum,
                           rot, rot / 2);
    }
    /* CTAs per token: enough for one pair slot (or v element) per thread, at most 64 */
    const long long slots = (long long)(p->n_q_heads + p->n_kv_heads) * (hd / 2);
    const long long vals = (long long)p->n_kv_heads * hd;
    long long chunks = ((slots > vals ? slots : vals) + MS_ROPE_KV_THREADS - 1) / MS_ROPE_KV_THREADS;
    chunks = chunks < 1 ? 1 : chunks > 64 ? 64 : chunks;
    ms_rope_kv_params copy = *p;
    return launch(m, 0, (unsigned)p->n_tokens, (unsigned)chunks, 1, MS_ROPE_KV_THREADS, &copy,
                  stream, err);
}

/* The rmsnorm instance's rules for every entry (0: out in the activation type, 1 / 2: bf16 / f16). */
static ms_status rmsnorm_entry_launch(const ms_cuda_module *m, int entry, const ms_rmsnorm_params *p,
                                      cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_RMSNORM, err));
    const int v = vec_elems(m->spec.act_dtype);
    if (p->n_rows < 0 || p->dim < v || p->dim % v != 0 || p->x_stride % v != 0 ||
        p->out_stride % v != 0 || p->x_stride < p->dim || p->out_stride < p->dim)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: dim %d and strides %d/%d must be multiples of %d elements", m->uri,
                       p->dim, p->x_stride, p->out_stride, v);
    if (!aligned16(p->x) || !aligned16(p->out) || !aligned16(p->weight) ||
        (m->spec.add_residual && !aligned16(p->residual)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: rows must be 16-byte aligned", m->uri);
    ms_rmsnorm_params copy = *p;
    return launch(m, entry, (unsigned)p->n_rows, 1, 1, MS_RMSNORM_THREADS, &copy, stream, err);
}

ms_status ms_cuda_rmsnorm_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                 cudaStream_t stream, ms_error *err) {
    return rmsnorm_entry_launch(m, 0, p, stream, err);
}

ms_status ms_cuda_rmsnorm_to_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                    ms_kernel_dtype out_dtype, cudaStream_t stream,
                                    ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_RMSNORM, err));
    if (out_dtype != MS_KERNEL_DTYPE_BF16 && out_dtype != MS_KERNEL_DTYPE_F16)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: output type must be bf16 or f16", m->uri);
    return rmsnorm_entry_launch(m, out_dtype == MS_KERNEL_DTYPE_BF16 ? 1 : 2, p, stream, err);
}

bool ms_cuda_q8x_fits(const void *q, int64_t q_stride, const float *d, int64_t d_stride, int64_t n) {
    return q != NULL && d != NULL && aligned16(q) && ((uintptr_t)d & 3u) == 0 && q_stride % 16 == 0 &&
           q_stride >= n && d_stride >= n / 32 && n % 32 == 0;
}

ms_status ms_cuda_rmsnorm_q8_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                    cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_RMSNORM, err));
    const int v = vec_elems(m->spec.act_dtype);
    if (p->n_rows < 0 || p->dim < 32 || p->dim % 32 != 0 || p->x_stride % v != 0 || p->x_stride < p->dim ||
        !ms_cuda_q8x_fits(p->out, p->out_stride, p->out_scale, p->scale_stride, p->dim))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: quantized norm of dim %d (a multiple of 32), x stride %d (a multiple of %d), "
                       "int8 rows of %d bytes (16-byte aligned), %d scales a row",
                       m->uri, p->dim, p->x_stride, v, p->out_stride, p->scale_stride);
    if (!aligned16(p->x) || !aligned16(p->weight) || (m->spec.add_residual && !aligned16(p->residual)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: rows must be 16-byte aligned", m->uri);
    ms_rmsnorm_params copy = *p;
    return launch(m, 3, (unsigned)p->n_rows, 1, 1, MS_RMSNORM_THREADS, &copy, stream, err);
}

ms_status ms_cuda_rmsnorm_heads_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                       cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_RMSNORM_HEADS, err));
    const int hd = m->spec.head_dim;
    if (p->n_rows < 0 || p->n_heads < 1 || p->dim != hd ||
        (int64_t)p->x_stride < (int64_t)p->n_heads * hd ||
        (int64_t)p->out_stride < (int64_t)p->n_heads * hd)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: %d tokens x %d heads of %d (head_dim %d) with token strides %d/%d",
                       m->uri, p->n_rows, p->n_heads, p->dim, hd, p->x_stride, p->out_stride);
    if (p->x == NULL || p->out == NULL || p->weight == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: x, weight and out are required", m->uri);
    const int64_t rows_per_cta = MS_RMSNORM_THREADS / 32;
    int64_t blocks = MS_CEIL_DIV((int64_t)p->n_rows * p->n_heads, rows_per_cta);
    if (blocks > 0x7fffffff)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d x %d rows exceed one grid", m->uri,
                       p->n_rows, p->n_heads);
    ms_rmsnorm_params copy = *p;
    return launch(m, 0, (unsigned)blocks, 1, 1, MS_RMSNORM_THREADS, &copy, stream, err);
}

ms_status ms_cuda_attn_dense_launch(const ms_cuda_module *m, const ms_attn_dense_params *p,
                                    cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_ATTN_DENSE, err));
    const int hd = m->spec.head_dim;
    if (p->n_seqs < 1 || p->n_tokens < 1 || p->n_kv_heads < 1 ||
        p->n_q_heads % p->n_kv_heads != 0 || p->n_q_heads > 65535)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: %d segments, %d rows, %d query heads over %d KV heads", m->uri,
                       p->n_seqs, p->n_tokens, p->n_q_heads, p->n_kv_heads);
    if ((int64_t)p->q_stride < (int64_t)p->n_q_heads * hd ||
        (int64_t)p->o_stride < (int64_t)p->n_q_heads * hd ||
        (int64_t)p->k_stride < (int64_t)p->n_kv_heads * hd ||
        (int64_t)p->v_stride < (int64_t)p->n_kv_heads * hd)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: row strides q %d, k %d, v %d, o %d are shorter than the heads", m->uri,
                       p->q_stride, p->k_stride, p->v_stride, p->o_stride);
    if (p->q == NULL || p->k == NULL || p->v == NULL || p->o == NULL || p->indptr == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: q, k, v, o and indptr are required", m->uri);
    const int64_t rows_per_cta = MS_ATTN_DENSE_THREADS / 32;
    ms_attn_dense_params copy = *p;
    return launch(m, 0, (unsigned)MS_CEIL_DIV((int64_t)p->n_tokens, rows_per_cta),
                  (unsigned)p->n_q_heads, 1, MS_ATTN_DENSE_THREADS, &copy, stream, err);
}

ms_status ms_cuda_silu_mul_launch(const ms_cuda_module *m, const ms_silu_mul_params *p,
                                  cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_SILU_MUL, err));
    const int v = vec_elems(m->spec.dtype);
    if (p->n_rows < 0 || p->inter < v || p->inter % v != 0 || p->gate_stride % v != 0 ||
        p->up_stride % v != 0 || p->out_stride % v != 0 || p->gate_stride < p->inter ||
        p->up_stride < p->inter || p->out_stride < p->inter || !aligned16(p->gate) ||
        !aligned16(p->up) || !aligned16(p->out))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: inter %d and strides %d/%d/%d must be multiples of %d, rows 16-byte "
                       "aligned",
                       m->uri, p->inter, p->gate_stride, p->up_stride, p->out_stride, v);
    int64_t vecs = (int64_t)p->n_rows * (p->inter / v);
    int64_t blocks = MS_CEIL_DIV(vecs, MS_SILU_MUL_THREADS);
    if (blocks > 65536)
        blocks = 65536; /* grid-stride loop covers the rest */
    ms_silu_mul_params copy = *p;
    return launch(m, 0, (unsigned)blocks, 1, 1, MS_SILU_MUL_THREADS, &copy, stream, err);
}

ms_status ms_cuda_silu_mul_q8_launch(const ms_cuda_module *m, const ms_silu_mul_params *p,
                                     cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_SILU_MUL, err));
    const int v = vec_elems(m->spec.dtype);
    if (p->n_rows < 0 || p->inter < 32 || p->inter % 32 != 0 || p->gate_stride % v != 0 ||
        p->up_stride % v != 0 || p->gate_stride < p->inter || p->up_stride < p->inter || !aligned16(p->gate) ||
        !aligned16(p->up) || !ms_cuda_q8x_fits(p->out, p->out_stride, p->out_scale, p->scale_stride, p->inter))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: quantized product of inter %d (a multiple of 32), strides %d/%d (multiples of %d, "
                       "rows 16-byte aligned), int8 rows of %d bytes (16-byte aligned), %d scales a row",
                       m->uri, p->inter, p->gate_stride, p->up_stride, v, p->out_stride, p->scale_stride);
    int64_t blocks = MS_CEIL_DIV((int64_t)p->n_rows * (p->inter / 8), MS_SILU_MUL_THREADS);
    if (blocks > 65536)
        blocks = 65536; /* grid-stride loop covers the rest */
    if (blocks < 1)
        blocks = 1;
    ms_silu_mul_params copy = *p;
    return launch(m, 1, (unsigned)blocks, 1, 1, MS_SILU_MUL_THREADS, &copy, stream, err);
}

ms_status ms_cuda_embed_launch(const ms_cuda_module *m, const ms_embed_params *p,
                               cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_EMBED, err));
    if (p->n_tokens < 0 || p->vocab < 1 || p->dim < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: dim %d, vocab %d", m->uri, p->dim, p->vocab);
    ms_embed_params copy = *p;
    return launch(m, 0, (unsigned)p->n_tokens, 1, 1, MS_EMBED_THREADS, &copy, stream, err);
}

ms_status ms_cuda_argmax_launch(const ms_cuda_module *m, const ms_argmax_params *p,
                                cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_ARGMAX, err));
    if (p->n_rows < 0 || p->vocab < 1 || p->stride < p->vocab)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: vocab %d, stride %d", m->uri, p->vocab,
                       p->stride);
    ms_argmax_params copy = *p;
    return launch(m, 0, (unsigned)p->n_rows, 1, 1, MS_ARGMAX_THREADS, &copy, stream, err);
}

ms_status ms_cuda_sample_launch(const ms_cuda_module *m, const ms_sample_params *p,
                                cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_SAMPLE, err));
    if (p->n_rows < 0 || p->vocab < 1 || p->stride < p->vocab)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: vocab %d, stride %d", m->uri, p->vocab,
                       p->stride);
    ms_sample_params copy = *p;
    return launch(m, 0, (unsigned)p->n_rows, 1, 1, MS_SAMPLE_THREADS, &copy, stream, err);
}

ms_status ms_cuda_misc_launch(const ms_cuda_module *m, int which, const ms_misc_params *p,
                              cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    const bool sel = which == MS_CUDA_MISC_SELECT_ROWS; /* reads b and rows */
    if ((which < 0 || which > 2) && !sel)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: no helper %d", m->uri, which);
    if (p->n_rows < 0 || p->n_cols < 0 || p->a_stride < p->n_cols || p->out_stride < p->n_cols ||
        ((which == 1 || sel) && p->b_stride < p->n_cols) ||
        ((which == 2 || sel) && p->rows == NULL && p->n_rows > 0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d x %d with strides %d/%d/%d", m->uri,
                       p->n_rows, p->n_cols, p->a_stride, p->b_stride, p->out_stride);
    ms_misc_params copy = *p;
    if (which == 0) {
        /* convert: x over 8-element column blocks, y over rows (elementwise.cuh convert) */
        int64_t gx = MS_CEIL_DIV(MS_CEIL_DIV((int64_t)p->n_cols, 8), MS_MISC_THREADS);
        int64_t gy = p->n_rows < 65535 ? p->n_rows : 65535;
        return launch(m, which, (unsigned)(gx > 0 ? gx : 1), (unsigned)(gy > 0 ? gy : 1), 1,
                      MS_MISC_THREADS, &copy, stream, err);
    }
    int64_t total = (int64_t)p->n_rows * p->n_cols;
    int64_t blocks = MS_CEIL_DIV(total, MS_MISC_THREADS);
    if (blocks > 65536)
        blocks = 65536;
    return launch(m, which, (unsigned)blocks, 1, 1, MS_MISC_THREADS, &copy, stream, err);
}

bool ms_cuda_gemv_fits(const ms_gemv_params *p) {
    return p->n >= 1 && p->n <= MS_GEMV_MAX_COLS && p->rows >= 1 && p->in >= 1 && p->in % 8 == 0 &&
           p->w_stride % 8 == 0 && p->x_stride % 4 == 0 && p->w_stride >= p->in &&
           p->x_stride >= p->in && (p->n == 1 || p->y_stride >= p->rows) && p->w != NULL &&
           p->x != NULL && p->y != NULL && aligned16(p->w) && aligned16(p->x) &&
           (p->norm_w == NULL || aligned16(p->norm_w));
}

ms_status ms_cuda_gemv_launch(const ms_cuda_module *m, const ms_gemv_params *p,
                              cudaStream_t stream, ms_error *err) {
    /* the misc module exists for bf16 and f16 only (ms_kernel_spec_check) */
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    if (!ms_cuda_gemv_fits(p))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: gemv of %d x rows, %d x %d weights, strides w %d / x %d / y %d (w, x, y "
                       "present, w and x 16-byte aligned)",
                       m->uri, p->n, p->rows, p->in, p->w_stride, p->x_stride, p->y_stride);
    ms_gemv_params copy = *p;
    return launch(m, p->norm_w != NULL ? MS_CUDA_MISC_GEMV_NORM : MS_CUDA_MISC_GEMV,
                  (unsigned)MS_CEIL_DIV(p->rows, MS_GEMV_ROWS), 1, 1,
                  MS_GEMV_THREADS, &copy, stream, err);
}

bool ms_cuda_silu_mul_to_fits(const ms_silu_mul_params *p) {
    return p->n_rows >= 0 && p->inter >= 8 && p->inter % 8 == 0 && p->gate_stride % 8 == 0 &&
           p->up_stride % 8 == 0 && p->out_stride % 8 == 0 && p->gate_stride >= p->inter &&
           p->up_stride >= p->inter && p->out_stride >= p->inter && p->gate != NULL &&
           p->up != NULL && p->out != NULL && aligned16(p->gate) && aligned16(p->up) &&
           aligned16(p->out);
}

ms_status ms_cuda_silu_mul_to_launch(const ms_cuda_module *m, const ms_silu_mul_params *p,
                                     cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    if (!ms_cuda_silu_mul_to_fits(p))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: silu_mul_to of %d rows x %d, strides %d/%d/%d (multiples of 8, rows "
                       "16-byte aligned)",
                       m->uri, p->n_rows, p->inter, p->gate_stride, p->up_stride, p->out_stride);
    int64_t blocks = MS_CEIL_DIV((int64_t)p->n_rows * (p->inter / 8), MS_SILU_MUL_THREADS);
    if (blocks > 65536)
        blocks = 65536; /* grid-stride loop covers the rest */
    if (blocks < 1)
        blocks = 1;
    ms_silu_mul_params copy = *p;
    return launch(m, MS_CUDA_MISC_SILU_MUL_TO, (unsigned)blocks, 1, 1, MS_SILU_MUL_THREADS, &copy,
                  stream, err);
}

/* ---- encoder helpers of the misc module ---- */

/* Grid-stride block count for `total` elements (capped like the misc helpers). */
static unsigned misc_blocks(int64_t total) {
    int64_t blocks = MS_CEIL_DIV(total, MS_MISC_THREADS);
    return (unsigned)(blocks > 65536 ? 65536 : blocks);
}

ms_status ms_cuda_layer_norm_launch(const ms_cuda_module *m, bool f32_weights,
                                    const ms_layer_norm_params *p, cudaStream_t stream,
                                    ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    if (p->n_rows < 0 || p->dim < 1 || p->x_stride < p->dim || p->out_stride < p->dim ||
        !(p->eps >= 0.f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: layer_norm of %d rows x %d with strides %d/%d, eps %g",
                       m->uri, p->n_rows, p->dim, p->x_stride, p->out_stride, (double)p->eps);
    if (p->x == NULL || p->weight == NULL || p->out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: layer_norm needs x, weight and out", m->uri);
    ms_layer_norm_params copy = *p;
    return launch(m, f32_weights ? MS_CUDA_MISC_LAYER_NORM_F32 : MS_CUDA_MISC_LAYER_NORM,
                  (unsigned)p->n_rows, 1, 1, MS_MISC_THREADS, &copy, stream, err);
}

ms_status ms_cuda_gelu_launch(const ms_cuda_module *m, const ms_misc_params *p,
                              cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    if (p->n_rows < 0 || p->n_cols < 0 || p->a_stride < p->n_cols || p->out_stride < p->n_cols ||
        p->a == NULL || p->out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: gelu of %d x %d with strides %d/%d", m->uri,
                       p->n_rows, p->n_cols, p->a_stride, p->out_stride);
    ms_misc_params copy = *p;
    return launch(m, MS_CUDA_MISC_GELU, misc_blocks((int64_t)p->n_rows * p->n_cols), 1, 1,
                  MS_MISC_THREADS, &copy, stream, err);
}

ms_status ms_cuda_im2col_launch(const ms_cuda_module *m, bool f32_cols, const ms_im2col_params *p,
                                cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    if (p->t_in < 0 || p->c_in < 1 || p->k < 1 || p->stride < 1 || p->padding < 0 ||
        p->x_stride < p->c_in || (int64_t)p->c_in * p->k > 0x7fffffff ||
        (int64_t)p->t_in + 2 * (int64_t)p->padding < p->k ||
        p->t_out != (p->t_in + 2 * p->padding - p->k) / p->stride + 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: im2col of [%d, %d] (row stride %d), k %d, stride %d, padding %d to %d "
                       "rows",
                       m->uri, p->t_in, p->c_in, p->x_stride, p->k, p->stride, p->padding, p->t_out);
    if (p->x == NULL || p->col == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: im2col needs x and col", m->uri);
    ms_im2col_params copy = *p;
    return launch(m, f32_cols ? MS_CUDA_MISC_IM2COL_F32 : MS_CUDA_MISC_IM2COL,
                  misc_blocks((int64_t)p->t_out * p->c_in * p->k), 1, 1, MS_MISC_THREADS, &copy,
                  stream, err);
}

ms_status ms_cuda_bias_add_launch(const ms_cuda_module *m, bool f32_bias, const ms_misc_params *p,
                                  cudaStream_t stream, ms_error *err) {
    MS_TRY(want_op(m, MS_KERNEL_OP_MISC, err));
    if (p->n_rows < 0 || p->n_cols < 0 || p->a_stride < p->n_cols || p->out_stride < p->n_cols ||
        p->a == NULL || p->b == NULL || p->out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: bias_add of %d x %d with strides %d/%d", m->uri,
                       p->n_rows, p->n_cols, p->a_stride, p->out_stride);
    ms_misc_params copy = *p;
    return launch(m, f32_bias ? MS_CUDA_MISC_BIAS_ADD_F32 : MS_CUDA_MISC_BIAS_ADD,
                  misc_blocks((int64_t)p->n_rows * p->n_cols), 1, 1, MS_MISC_THREADS, &copy,
                  stream, err);
}
