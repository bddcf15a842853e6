/*
 * kernel.c - kernel specs, URIs, instance sources and attention planning (kernel.h).
 *
 * Constraints: output is deterministic (no pointers, times or locale in sources or URIs); the
 * emitted source never pastes a kernel body, only the config preamble and wrappers
 * (CONVENTIONS.md item 11).
 */
#include "kernel.h"

#include "../../templates/quant/qparams.h"

#include <stdio.h>
#include <string.h>

/* ---- tables ---- */

typedef struct kernel_op_info {
    const char *name;     /* URI prefix */
    const char *header;   /* template included by the instance */
    const char *entry[MS_KERNEL_MAX_ENTRIES]; /* extern "C" kernels of the module */
} kernel_op_info;

/* ORDER MS_KERNEL_OP */
static const kernel_op_info op_info[MS_KERNEL_OP_COUNT] = {
    {"attn_decode", "attn/decode.cuh", {"ms_attn_decode", NULL}},
    {"attn_prefill", "attn/prefill.cuh", {"ms_attn_prefill", NULL}},
    {"rope_kv", "rope/rope_kv.cuh", {"ms_rope_kv", NULL}},
    {"rmsnorm", "norm/rmsnorm.cuh", {"ms_rmsnorm", "ms_rmsnorm_bf16", "ms_rmsnorm_f16", "ms_rmsnorm_q8", NULL}},
    {"silu_mul", "act/silu_mul.cuh", {"ms_silu_mul", "ms_silu_mul_q8", NULL}},
    {"embed", "embed/embed.cuh", {"ms_embed", NULL}},
    {"argmax", "sample/sample.cuh", {"ms_argmax", NULL}},
    {"sample", "sample/sample.cuh", {"ms_sample", NULL}},
    {"misc", "misc/elementwise.cuh",
     {"ms_convert", "ms_add", "ms_gather_rows", "ms_layer_norm", "ms_layer_norm_f32", "ms_gelu",
      "ms_im2col", "ms_im2col_f32", "ms_bias_add", "ms_bias_add_f32", "ms_select_rows", "ms_gemv",
      "ms_silu_mul_to", "ms_gemv_norm"}},
    {"rmsnorm_heads", "norm/rmsnorm.cuh", {"ms_rmsnorm_heads", NULL}},
    {"attn_dense", "attn/dense.cuh", {"ms_attn_dense", NULL}},
    {"qmatmul", "quant/qmatmul.cuh",
     {"ms_qgemv_1", "ms_qgemv_2", "ms_qgemv_3", "ms_qgemv_4", "ms_qgemv_5", "ms_qgemv_6",
      "ms_qgemv_7", "ms_qgemv_8", "ms_qdequant_bf16", "ms_qembed", "ms_qgemv_acc_1",
      "ms_qgemv_acc_2", "ms_qquant_x", "ms_qgemv_q_1", "ms_qgemv_q_2", "ms_qgemv_qacc_1",
      "ms_qgemv_qacc_2"}},
};

_Static_assert(MS_QGEMV_ACC_COLS == 2, "op_info lists ms_qgemv_acc_1 and ms_qgemv_acc_2");
_Static_assert(MS_QGEMV_I8_MAX_COLS == 2, "op_info lists ms_qgemv_q_1, _q_2, _qacc_1 and _qacc_2");

/* The ggml types qmatmul instantiates: ggml type number, URI word, device block struct
 * (templates/quant/qmatmul.cuh), whether its GEMV has the integer (dp4a) entries (the struct's
 * kI8: the instance static_asserts that the two agree). */
static const struct {
    int type;
    const char *name, *block;
    bool i8;
} qtypes[] = {
    {2, "q4_0", "ms::q4_0", true},   {3, "q4_1", "ms::q4_1", false},  {6, "q5_0", "ms::q5_0", false},
    {8, "q8_0", "ms::q8_0", true},   {12, "q4_k", "ms::q4_k", true},  {13, "q5_k", "ms::q5_k", false},
    {14, "q6_k", "ms::q6_k", false},
};

static int qtype_index(int qtype) {
    for (int i = 0; i < (int)MS_ARRAY_LEN(qtypes); i++)
        if (qtypes[i].type == qtype)
            return i;
    return -1;
}

bool ms_kernel_qmatmul_supported(int qtype) {
    return qtype_index(qtype) >= 0;
}

/* ORDER MS_KERNEL_DTYPE */
static const char *const dtype_names[MS_KERNEL_DTYPE_COUNT] = {"bf16", "f16", "f32"};
static const char *const dtype_types[MS_KERNEL_DTYPE_COUNT] = {"ms::bf16", "ms::f16", "float"};
static const char *const rope_names[MS_KERNEL_ROPE_COUNT] = {"none", "neox", "interleaved"};

const char *ms_kernel_op_name(ms_kernel_op op) {
    return (unsigned)op < MS_KERNEL_OP_COUNT ? op_info[op].name : "?";
}

const char *ms_kernel_dtype_name(ms_kernel_dtype dt) {
    return (unsigned)dt < MS_KERNEL_DTYPE_COUNT ? dtype_names[dt] : "?";
}

const char *ms_kernel_op_entry(ms_kernel_op op, int i) {
    if ((unsigned)op >= MS_KERNEL_OP_COUNT || i < 0 || i >= MS_KERNEL_MAX_ENTRIES)
        return NULL;
    return op_info[op].entry[i];
}

/* ---- constructors ---- */

ms_kernel_spec ms_kernel_spec_attn_decode(ms_kernel_dtype dt, int head_dim, int page_size,
                                          int group, bool windowed) {
    ms_kernel_spec s = {0};
    s.op = MS_KERNEL_OP_ATTN_DECODE;
    s.dtype = dt;
    s.act_dtype = dt;
    s.head_dim = head_dim;
    s.page_size = page_size;
    s.group = group;
    s.windowed = windowed;
    return s;
}

ms_kernel_spec ms_kernel_spec_attn_prefill(ms_kernel_dtype dt, int head_dim, int page_size,
                                           int group, bool causal, bool windowed) {
    ms_kernel_spec s = ms_kernel_spec_attn_decode(dt, head_dim, page_size, group, windowed);
    s.op = MS_KERNEL_OP_ATTN_PREFILL;
    s.causal = causal;
    return s;
}

ms_kernel_spec ms_kernel_spec_rope_kv(ms_kernel_dtype dt, int head_dim, int page_size,
                                      ms_kernel_rope rope, ms_kernel_rope_scaling scaling) {
    ms_kernel_spec s = {0};
    s.op = MS_KERNEL_OP_ROPE_KV;
    s.dtype = dt;
    s.act_dtype = dt;
    s.head_dim = head_dim;
    s.page_size = page_size;
    s.rope = rope;
    s.rope_scaling = rope == MS_KERNEL_ROPE_NONE ? MS_KERNEL_ROPE_SCALING_NONE : scaling;
    return s;
}

ms_kernel_spec ms_kernel_spec_rope_kv_mrope(ms_kernel_dtype dt, int head_dim, int page_size,
                                            ms_kernel_rope rope) {
    ms_kernel_spec s = ms_kernel_spec_rope_kv(dt, head_dim, page_size, rope,
                                              MS_KERNEL_ROPE_SCALING_NONE);
    s.mrope = true;
    return s;
}

ms_kernel_spec ms_kernel_spec_rmsnorm_heads(ms_kernel_dtype dt, int head_dim) {
    ms_kernel_spec s = {0};
    s.op = MS_KERNEL_OP_RMSNORM_HEADS;
    s.dtype = dt;
    s.act_dtype = dt;
    s.head_dim = head_dim;
    return s;
}

ms_kernel_spec ms_kernel_spec_attn_dense(int head_dim) {
    ms_kernel_spec s = {0};
    s.op = MS_KERNEL_OP_ATTN_DENSE;
    s.dtype = MS_KERNEL_DTYPE_F32;
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    s.head_dim = head_dim;
    return s;
}

ms_kernel_spec ms_kernel_spec_rmsnorm(ms_kernel_dtype dt, bool add_residual) {
    ms_kernel_spec s = {0};
    s.op = MS_KERNEL_OP_RMSNORM;
    s.dtype = dt;
    s.act_dtype = dt;
    s.add_residual = add_residual;
    return s;
}

ms_kernel_spec ms_kernel_spec_simple(ms_kernel_op op, ms_kernel_dtype dt) {
    ms_kernel_spec s = {0};
    s.op = op;
    s.dtype = dt;
    s.act_dtype = dt;
    return s;
}

ms_kernel_spec ms_kernel_spec_qmatmul(int qtype) {
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_QMATMUL, MS_KERNEL_DTYPE_BF16);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    s.qtype = qtype;
    return s;
}

ms_status ms_kernel_specs_for_quant(const int *types, int n_types, ms_kernel_spec *out, int cap,
                                    int *n, ms_error *err) {
    *n = 0;
    for (int i = 0; i < n_types; i++) {
        if (!ms_kernel_qmatmul_supported(types[i]))
            continue;
        bool seen = false;
        for (int j = 0; j < *n && !seen; j++)
            seen = out[j].qtype == types[i];
        if (seen)
            continue;
        if (*n == cap)
            return MS_FAIL(err, MS_ERR_CAPACITY, "qmatmul instances: room for %d", cap);
        out[(*n)++] = ms_kernel_spec_qmatmul(types[i]);
    }
    return MS_OK;
}

/* ---- validation ---- */


ms_status ms_kernel_spec_check(const ms_kernel_spec *s, ms_error *err) {
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kernel spec: NULL");
    if ((unsigned)s->op >= MS_KERNEL_OP_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kernel spec: unknown op %d", (int)s->op);
    const char *op = op_info[s->op].name;
    if ((unsigned)s->dtype >= MS_KERNEL_DTYPE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: unknown dtype %d", op, (int)s->dtype);
    if ((unsigned)s->act_dtype >= MS_KERNEL_DTYPE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: unknown activation dtype %d", op,
                       (int)s->act_dtype);
    bool logits_op = s->op == MS_KERNEL_OP_ARGMAX || s->op == MS_KERNEL_OP_SAMPLE;
    if ((logits_op || s->op == MS_KERNEL_OP_SILU_MUL || s->op == MS_KERNEL_OP_ATTN_DENSE) &&
        s->act_dtype != s->dtype)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: has one dtype (act_dtype must equal dtype)", op);
    bool f32_ok = logits_op || s->op == MS_KERNEL_OP_SILU_MUL || s->op == MS_KERNEL_OP_RMSNORM ||
                  s->op == MS_KERNEL_OP_EMBED || s->op == MS_KERNEL_OP_RMSNORM_HEADS;
    if (s->op == MS_KERNEL_OP_ATTN_DENSE && s->dtype != MS_KERNEL_DTYPE_F32)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: dtype %s unsupported (f32 activations only)",
                       op, dtype_names[s->dtype]);
    f32_ok = f32_ok || s->op == MS_KERNEL_OP_ATTN_DENSE;
    if (!f32_ok && s->dtype == MS_KERNEL_DTYPE_F32)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: dtype f32 unsupported (bf16, f16)", op);
    bool paged = s->op == MS_KERNEL_OP_ATTN_DECODE || s->op == MS_KERNEL_OP_ATTN_PREFILL ||
                 s->op == MS_KERNEL_OP_ROPE_KV;
    if (paged && (s->page_size < 1 || s->page_size > MS_KERNEL_MAX_PAGE_SIZE))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: page_size %d unsupported (1 .. %d)", op,
                       s->page_size, MS_KERNEL_MAX_PAGE_SIZE);
    switch (s->op) {
    case MS_KERNEL_OP_ATTN_DECODE:
        /* a key row is read in 16-byte pieces by at most one warp (templates/attn/decode.cuh) */
        if (s->head_dim < 8 || s->head_dim > 256 || s->head_dim % 8 != 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "attn_decode: head_dim %d unsupported (multiples of 8 up to 256)",
                           s->head_dim);
        break;
    case MS_KERNEL_OP_ATTN_PREFILL:
        if (s->head_dim < 16 || s->head_dim > 256 || s->head_dim % 16 != 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "attn_prefill: head_dim %d unsupported (multiples of 16 up to 256)",
                           s->head_dim);
        break;
    case MS_KERNEL_OP_ROPE_KV:
        if (s->head_dim < 8 || s->head_dim > 1024 || s->head_dim % 8 != 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "rope_kv: head_dim %d unsupported (multiples of 8 up to 1024)",
                           s->head_dim);
        if ((unsigned)s->rope >= MS_KERNEL_ROPE_COUNT)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope_kv: unknown rope style %d", (int)s->rope);
        if ((unsigned)s->rope_scaling >= MS_KERNEL_ROPE_SCALING_COUNT)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope_kv: unknown rope scaling %d",
                           (int)s->rope_scaling);
        if (s->mrope && s->rope == MS_KERNEL_ROPE_NONE)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope_kv: M-RoPE without a rotation style");
        break;
    case MS_KERNEL_OP_RMSNORM_HEADS:
        if (s->head_dim < 1 || s->head_dim > 1024)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "rmsnorm_heads: head_dim %d unsupported (1 .. 1024)", s->head_dim);
        break;
    case MS_KERNEL_OP_ATTN_DENSE:
        /* lanes hold ceil(head_dim / 32) elements each in registers (templates/attn/dense.cuh) */
        if (s->head_dim < 1 || s->head_dim > 256)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "attn_dense: head_dim %d unsupported (1 .. 256)", s->head_dim);
        break;
    case MS_KERNEL_OP_QMATMUL:
        if (qtype_index(s->qtype) < 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "qmatmul: ggml type %d unsupported (Q4_0, Q4_1, "
                           "Q5_0, Q8_0, Q4_K, Q5_K, Q6_K)", s->qtype);
        if (s->dtype != MS_KERNEL_DTYPE_BF16 || s->act_dtype != MS_KERNEL_DTYPE_F32)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "qmatmul: dequantizes to bf16 with f32 "
                           "activations only");
        break;
    default:
        break;
    }
    if (s->op != MS_KERNEL_OP_QMATMUL && s->qtype != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: qtype is a qmatmul field", op);
    if (s->mrope && s->op != MS_KERNEL_OP_ROPE_KV)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: M-RoPE is a rope_kv variant", op);
    if ((s->op == MS_KERNEL_OP_ATTN_DECODE || s->op == MS_KERNEL_OP_ATTN_PREFILL) &&
        (s->group < 1 || s->group > 16))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: group %d unsupported (1 .. 16)", op, s->group);
    return MS_OK;
}

/* ---- URI ---- */

/* URI of `s`; with_shape false leaves out the shape fields (head_dim, page size, group). */
static ms_status spec_name(const ms_kernel_spec *s, int arch, bool with_shape, char *buf,
                           size_t cap, ms_error *err) {
    MS_TRY(ms_kernel_spec_check(s, err));
    const char *op = op_info[s->op].name, *dt = dtype_names[s->dtype];
    char sm[32] = "";
    int k = 0;
    if (s->act_dtype != s->dtype)
        k = snprintf(sm, sizeof sm, "_a%s", dtype_names[s->act_dtype]);
    if (arch > 0)
        snprintf(sm + k, sizeof sm - (size_t)k, "_sm%d", arch);
    int n;
    switch (s->op) {
    case MS_KERNEL_OP_ATTN_DECODE:
    case MS_KERNEL_OP_ATTN_PREFILL:
        if (with_shape)
            n = snprintf(buf, cap, "%s_%s_hd%d_ps%d_g%d%s%s%s", op, dt, s->head_dim, s->page_size,
                         s->group, s->causal ? "_causal" : "", s->windowed ? "_win" : "", sm);
        else
            n = snprintf(buf, cap, "%s_%s%s%s%s", op, dt, s->causal ? "_causal" : "",
                         s->windowed ? "_win" : "", sm);
        break;
    case MS_KERNEL_OP_ROPE_KV:
        if (with_shape)
            n = snprintf(buf, cap, "%s_%s_hd%d_ps%d_%s%s%s%s", op, dt, s->head_dim, s->page_size,
                         rope_names[s->rope],
                         s->rope_scaling == MS_KERNEL_ROPE_SCALING_LLAMA3 ? "_llama3" : "",
                         s->mrope ? "_mrope" : "", sm);
        else
            n = snprintf(buf, cap, "%s_%s_%s%s%s%s", op, dt, rope_names[s->rope],
                         s->rope_scaling == MS_KERNEL_ROPE_SCALING_LLAMA3 ? "_llama3" : "",
                         s->mrope ? "_mrope" : "", sm);
        break;
    case MS_KERNEL_OP_RMSNORM_HEADS:
    case MS_KERNEL_OP_ATTN_DENSE:
        if (with_shape)
            n = snprintf(buf, cap, "%s_%s_hd%d%s", op, dt, s->head_dim, sm);
        else
            n = snprintf(buf, cap, "%s_%s%s", op, dt, sm);
        break;
    case MS_KERNEL_OP_RMSNORM:
        n = snprintf(buf, cap, "%s_%s%s%s", op, dt, s->add_residual ? "_res" : "", sm);
        break;
    case MS_KERNEL_OP_QMATMUL: /* the weight type is the ggml block type; bf16 is implied */
        n = snprintf(buf, cap, "%s_%s%s", op, qtypes[qtype_index(s->qtype)].name, sm);
        break;
    default:
        n = snprintf(buf, cap, "%s_%s%s", op, dt, sm);
        break;
    }
    if (n < 0 || (size_t)n >= cap)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: URI buffer of %zu bytes too small", op, cap);
    return MS_OK;
}

ms_status ms_kernel_spec_uri(const ms_kernel_spec *s, int arch, char *buf, size_t cap,
                             ms_error *err) {
    return spec_name(s, arch, true, buf, cap, err);
}

ms_status ms_kernel_spec_stem(const ms_kernel_spec *s, char *buf, size_t cap, ms_error *err) {
    return spec_name(s, 0, false, buf, cap, err);
}

/* ---- instance source ---- */

/* Append printf output to a growing ms_malloc'd string. */
typedef struct src_buf {
    char *data;
    size_t len, cap;
    bool oom;
} src_buf;

static void emit(src_buf *b, const char *fmt, ...) MS_PRINTF(2, 3);
static void emit(src_buf *b, const char *fmt, ...) {
    if (b->oom)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if (ms_grow((void **)&b->data, &b->cap, b->len + (size_t)n + 1, 1) != MS_OK) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static const char *cbool(bool v) { return v ? "true" : "false"; }

/* The first statements of every wrapper but ms_attn_decode's (whose template reads its index
 * arrays and prefetches K/V between the two), ms_gemv's (misc/gemv.cuh: it prefetches its first
 * weight lines between the two) and ms_qgemv_<N>'s (its template, qmatmul.cuh qgemv, starts with
 * the same two): let the next kernel launch, then wait for the previous one (common/pdl.cuh;
 * no-ops below sm_90 and for grids launched without PDL). */
#define PDL_PROLOGUE "    ms::pdl_launch_dependents();\n    ms::pdl_wait();\n"

/*
 * Everything of an instance source after its banner: the template's #include, the config
 * preamble and the extern "C" wrappers. shape_macros: head_dim, page size and group are written as
 * MS_HEAD_DIM / MS_PAGE_SIZE / MS_GROUP (defined by whoever compiles the source) instead of numbers.
 */
static ms_status spec_body(const ms_kernel_spec *s, bool shape_macros, const char *banner,
                           char **out, ms_error *err) {
    *out = NULL;
    char uri[MS_KERNEL_URI_MAX];
    MS_TRY(ms_kernel_spec_uri(s, 0, uri, sizeof uri, err));
    const kernel_op_info *oi = &op_info[s->op];
    const char *T = dtype_types[s->dtype], *TA = dtype_types[s->act_dtype];
    char hd[16], ps[16], gr[16];
    snprintf(hd, sizeof hd, "%d", s->head_dim);
    snprintf(ps, sizeof ps, "%d", s->page_size);
    snprintf(gr, sizeof gr, "%d", s->group);
    src_buf b = {0};
    if (banner != NULL)
        emit(&b, "%s", banner);
    emit(&b, "#include \"common/pdl.cuh\"\n#include \"%s\"\n\nnamespace cfg {\nusing T = %s;\nusing TA = %s;\n", oi->header, T,
         TA);
    switch (s->op) {
    case MS_KERNEL_OP_ATTN_DECODE:
    case MS_KERNEL_OP_ATTN_PREFILL:
        emit(&b,
             "constexpr int kHeadDim = %s;\nconstexpr int kPageSize = %s;\nconstexpr int kGroup = %s;\n"
             "constexpr bool kCausal = %s;\nconstexpr bool kWindowed = %s;\n",
             shape_macros ? "MS_HEAD_DIM" : hd, shape_macros ? "MS_PAGE_SIZE" : ps,
             shape_macros ? "MS_GROUP" : gr, cbool(s->causal), cbool(s->windowed));
        break;
    case MS_KERNEL_OP_ROPE_KV:
        emit(&b,
             "constexpr int kHeadDim = %s;\nconstexpr int kPageSize = %s;\n"
             "constexpr int kRope = %d; // %s\nconstexpr int kRopeScaling = %d;\n",
             shape_macros ? "MS_HEAD_DIM" : hd, shape_macros ? "MS_PAGE_SIZE" : ps, (int)s->rope,
             rope_names[s->rope], (int)s->rope_scaling);
        if (s->mrope) /* only then: the sources of plain instances stay as they were */
            emit(&b, "constexpr bool kMrope = true;\n");
        break;
    case MS_KERNEL_OP_RMSNORM_HEADS:
    case MS_KERNEL_OP_ATTN_DENSE:
        emit(&b, "constexpr int kHeadDim = %s;\n", shape_macros ? "MS_HEAD_DIM" : hd);
        break;
    case MS_KERNEL_OP_RMSNORM:
        emit(&b, "constexpr bool kAddResidual = %s;\n", cbool(s->add_residual));
        break;
    case MS_KERNEL_OP_QMATMUL:
        emit(&b, "using Q = %s;\n", qtypes[qtype_index(s->qtype)].block);
        break;
    default:
        break;
    }
    emit(&b, "} // namespace cfg\n\n");
    switch (s->op) {
    case MS_KERNEL_OP_ATTN_DECODE:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_ATTN_DECODE_THREADS)\n"
                 "ms_attn_decode(const ms_attn_kernel_params p) {\n"
                 "    ms::attn_decode<cfg::TA, cfg::T, cfg::kHeadDim, cfg::kPageSize, cfg::kGroup, "
                 "cfg::kWindowed>(p);\n}\n");
        break;
    case MS_KERNEL_OP_ATTN_PREFILL:
        /* the CTA bound for head_dim <= 128 only: at 256 it would spill a kilobyte a thread */
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_ATTN_PREFILL_THREADS, "
                 "cfg::kHeadDim <= 128 ? MS_ATTN_PREFILL_MIN_CTAS : 1)\n"
                 "ms_attn_prefill(const ms_attn_kernel_params p) {\n" PDL_PROLOGUE
                 "    ms::attn_prefill<cfg::TA, cfg::T, cfg::kHeadDim, cfg::kPageSize, cfg::kGroup, "
                 "cfg::kCausal, cfg::kWindowed>(p);\n}\n");
        break;
    case MS_KERNEL_OP_ROPE_KV:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_ROPE_KV_THREADS)\n"
                 "ms_rope_kv(const ms_rope_kv_params p) {\n" PDL_PROLOGUE
                 "    ms::rope_kv<cfg::TA, cfg::T, cfg::kHeadDim, cfg::kPageSize, cfg::kRope, "
                 "cfg::kRopeScaling%s>(p);\n}\n",
             s->mrope ? ", cfg::kMrope" : "");
        break;
    case MS_KERNEL_OP_RMSNORM_HEADS:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_RMSNORM_THREADS)\n"
                 "ms_rmsnorm_heads(const ms_rmsnorm_params p) {\n" PDL_PROLOGUE
                 "    ms::rmsnorm_heads<cfg::TA, cfg::T, cfg::kHeadDim>(p);\n}\n");
        break;
    case MS_KERNEL_OP_ATTN_DENSE:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_ATTN_DENSE_THREADS)\n"
                 "ms_attn_dense(const ms_attn_dense_params p) {\n" PDL_PROLOGUE
                 "    ms::attn_dense<cfg::kHeadDim>(p);\n}\n");
        break;
    case MS_KERNEL_OP_RMSNORM:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_RMSNORM_THREADS)\n"
                 "ms_rmsnorm(const ms_rmsnorm_params p) {\n" PDL_PROLOGUE
                 "    ms::rmsnorm<cfg::TA, cfg::T, cfg::kAddResidual>(p);\n}\n\n"
                 /* out in a GEMM's 16-bit input type (cu_rms_norm_linear) */
                 "extern \"C\" __global__ void __launch_bounds__(MS_RMSNORM_THREADS)\n"
                 "ms_rmsnorm_bf16(const ms_rmsnorm_params p) {\n" PDL_PROLOGUE
                 "    ms::rmsnorm<cfg::TA, cfg::T, cfg::kAddResidual, ms::bf16>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_RMSNORM_THREADS)\n"
                 "ms_rmsnorm_f16(const ms_rmsnorm_params p) {\n" PDL_PROLOGUE
                 "    ms::rmsnorm<cfg::TA, cfg::T, cfg::kAddResidual, ms::f16>(p);\n}\n\n"
                 /* out quantized for the integer GEMV of Q4_0 / Q8_0 / Q4_K (common/q8x.cuh) */
                 "extern \"C\" __global__ void __launch_bounds__(MS_RMSNORM_THREADS)\n"
                 "ms_rmsnorm_q8(const ms_rmsnorm_params p) {\n" PDL_PROLOGUE
                 "    ms::rmsnorm<cfg::TA, cfg::T, cfg::kAddResidual, ms::q8x_out>(p);\n}\n");
        break;
    case MS_KERNEL_OP_SILU_MUL:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_SILU_MUL_THREADS)\n"
                 "ms_silu_mul(const ms_silu_mul_params p) {\n" PDL_PROLOGUE
                 "    ms::silu_mul<cfg::T>(p);\n}\n\n"
                 /* out quantized for the integer GEMV of Q4_0 / Q8_0 / Q4_K (common/q8x.cuh) */
                 "extern \"C\" __global__ void __launch_bounds__(MS_SILU_MUL_THREADS)\n"
                 "ms_silu_mul_q8(const ms_silu_mul_params p) {\n" PDL_PROLOGUE
                 "    ms::silu_mul_q8<cfg::T>(p);\n}\n");
        break;
    case MS_KERNEL_OP_EMBED:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_EMBED_THREADS)\n"
                 "ms_embed(const ms_embed_params p) {\n" PDL_PROLOGUE
                 "    ms::embed<cfg::T, cfg::TA>(p);\n}\n");
        break;
    case MS_KERNEL_OP_ARGMAX:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_ARGMAX_THREADS)\n"
                 "ms_argmax(const ms_argmax_params p) {\n" PDL_PROLOGUE
                 "    ms::argmax<cfg::T>(p);\n}\n");
        break;
    case MS_KERNEL_OP_SAMPLE:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_SAMPLE_THREADS)\n"
                 "ms_sample(const ms_sample_params p) {\n" PDL_PROLOGUE
                 "    ms::sample<cfg::T>(p);\n}\n");
        break;
    case MS_KERNEL_OP_MISC:
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_convert(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::convert<cfg::TA, cfg::T>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_add(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::add<cfg::TA>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_gather_rows(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::gather_rows<cfg::TA>(p);\n}\n\n"
                 /* the encoder ops (misc/encoder.cuh): weights / GEMM inputs in T, or float */
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_layer_norm(const ms_layer_norm_params p) {\n" PDL_PROLOGUE
                 "    ms::layer_norm<cfg::TA, cfg::T>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_layer_norm_f32(const ms_layer_norm_params p) {\n" PDL_PROLOGUE
                 "    ms::layer_norm<cfg::TA, float>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_gelu(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::gelu<cfg::TA>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_im2col(const ms_im2col_params p) {\n" PDL_PROLOGUE
                 "    ms::im2col<cfg::TA, cfg::T>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_im2col_f32(const ms_im2col_params p) {\n" PDL_PROLOGUE
                 "    ms::im2col<cfg::TA, float>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_bias_add(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::bias_add<cfg::TA, cfg::T>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_bias_add_f32(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::bias_add<cfg::TA, float>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_MISC_THREADS)\n"
                 "ms_select_rows(const ms_misc_params p) {\n" PDL_PROLOGUE
                 "    ms::select_rows<cfg::TA>(p);\n}\n\n"
                 /* the decode GEMV over T weights (misc/gemv.cuh): 2 CTAs of 8 warps per SM */
                 "extern \"C\" __global__ void __launch_bounds__(MS_GEMV_THREADS, 2)\n"
                 "ms_gemv(const ms_gemv_params p) {\n" /* the PDL calls are the template's */
                 "    ms::gemv<cfg::T>(p);\n}\n\n"
                 /* the same with the RMSNorm folded in (p.norm_w): its own entry, so that
                    ms_gemv's code is the plain one */
                 "extern \"C\" __global__ void __launch_bounds__(MS_GEMV_THREADS, 2)\n"
                 "ms_gemv_norm(const ms_gemv_params p) {\n"
                 "    ms::gemv<cfg::T, true>(p);\n}\n\n"
                 /* SiLU-and-multiply of float gate/up into the GEMM input type (act/silu_mul.cuh) */
                 "extern \"C\" __global__ void __launch_bounds__(MS_SILU_MUL_THREADS)\n"
                 "ms_silu_mul_to(const ms_silu_mul_params p) {\n" PDL_PROLOGUE
                 "    ms::silu_mul_to<cfg::TA, cfg::T>(p);\n}\n");
        break;
    case MS_KERNEL_OP_QMATMUL:
        /* the integer entries (x rows up to MS_QGEMV_I8_MAX_COLS of an i8 type) are compiled for
         * ms::qgemv_min_ctas<Q, NC>::value resident CTAs; the others without a minimum (ptxas
         * gives them more registers with an explicit 1 than with none: 206 against 168 for Q4_0's
         * ms_qgemv_8) */
        for (int c = 1; c <= 8 + MS_QGEMV_ACC_COLS; c++) {
            /* ms_qgemv_1..8, then ms_qgemv_acc_1..MS_QGEMV_ACC_COLS (after dequant and embed in
             * the entry table; the order of definitions does not matter) */
            const bool add = c > 8;
            const int nc = add ? c - 8 : c;
            const bool bounded = qtypes[qtype_index(s->qtype)].i8 && nc <= MS_QGEMV_I8_MAX_COLS;
            if (bounded)
                emit(&b, "static_assert(ms::qgemv_min_ctas<cfg::Q, %d>::value > 1, \"kernel.c qtypes: i8\");\n"
                         "extern \"C\" __global__ void __launch_bounds__(MS_QGEMV_THREADS, "
                         "ms::qgemv_min_ctas<cfg::Q, %d>::value)\n", nc, nc);
            else
                emit(&b, "static_assert(ms::qgemv_min_ctas<cfg::Q, %d>::value == 1, \"kernel.c qtypes: i8\");\n"
                         "extern \"C\" __global__ void __launch_bounds__(MS_QGEMV_THREADS)\n", nc);
            emit(&b, "ms_qgemv_%s%d(const ms_qmatmul_params p) {\n"
                     "    ms::qgemv<cfg::Q, %d, MS_QGEMV_ROWS_OF(%d), %s>(p);\n}\n\n",
                 add ? "acc_" : "", nc, nc, nc,
                 add ? "ms::kQStoreAdd" : nc <= MS_QGEMV_ACC_COLS ? "ms::kQStoreSet" : "ms::kQStoreRuntime");
        }
        emit(&b, "extern \"C\" __global__ void __launch_bounds__(MS_QDEQUANT_THREADS)\n"
                 "ms_qdequant_bf16(const ms_qmatmul_params p) {\n" PDL_PROLOGUE
                 "    ms::qdequant_bf16<cfg::Q>(p);\n}\n\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_QGEMV_THREADS)\n"
                 "ms_qembed(const ms_qmatmul_params p) {\n" PDL_PROLOGUE
                 "    ms::qembed<cfg::Q>(p);\n}\n\n");
        /* x quantized once for the GEMVs above MS_QGEMV_I8_MAX_COLS rows of the types
           MS_QGEMV_PREQ_TYPE names (the host launches it for those only) */
        emit(&b, "static_assert(cfg::Q::kI8 == %s, \"qparams.h MS_QGEMV_PREQ_TYPE\");\n"
                 "extern \"C\" __global__ void __launch_bounds__(MS_QDEQUANT_THREADS)\n"
                 "ms_qquant_x(const ms_qmatmul_params p) {\n" PDL_PROLOGUE
                 "    ms::qquant_x(p);\n}\n",
             MS_QGEMV_PREQ_TYPE(s->qtype) ? "true" : "false");
        /* ms_qgemv_q_1 .. _<MS_QGEMV_I8_MAX_COLS>, then ms_qgemv_qacc_*: the narrow x rows of those
           types on x quantized by the kernel that produced it (backend_cuda_quant.h
           ms_cuda_quant_linear_qx); the other types never launch them (a trap, not a second
           copy of their GEMV to compile) */
        for (int c = 1; c <= 2 * MS_QGEMV_I8_MAX_COLS; c++) {
            const bool add = c > MS_QGEMV_I8_MAX_COLS;
            const int nc = add ? c - MS_QGEMV_I8_MAX_COLS : c;
            if (MS_QGEMV_PREQ_TYPE(s->qtype))
                emit(&b, "\nextern \"C\" __global__ void __launch_bounds__(MS_QGEMV_THREADS, "
                         "ms::qgemv_min_ctas<cfg::Q, %d>::value)\n"
                         "ms_qgemv_%s%d(const ms_qmatmul_params p) {\n"
                         "    ms::qgemv<cfg::Q, %d, MS_QGEMV_ROWS_OF(%d), %s, true>(p);\n}\n",
                     nc, add ? "qacc_" : "q_", nc, nc, nc, add ? "ms::kQStoreAdd" : "ms::kQStoreSet");
            else
                emit(&b, "\nextern \"C\" __global__ void ms_qgemv_%s%d(const ms_qmatmul_params p) {\n"
                         "    (void)p;\n    __trap();\n}\n",
                     add ? "qacc_" : "q_", nc);
        }
        break;
    default:
        break;
    }
    if (b.oom) {
        ms_free(b.data);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory writing the instance source", uri);
    }
    *out = b.data;
    return MS_OK;
}

ms_status ms_kernel_spec_source(const ms_kernel_spec *s, char **out, ms_error *err) {
    *out = NULL;
    char uri[MS_KERNEL_URI_MAX], banner[MS_KERNEL_URI_MAX + 128];
    MS_TRY(ms_kernel_spec_uri(s, 0, uri, sizeof uri, err));
    snprintf(banner, sizeof banner,
             "// Generated by mstar-c for kernel instance %s from template %s. Do not edit.\n", uri,
             op_info[s->op].header);
    return spec_body(s, false, banner, out, err);
}

ms_status ms_kernel_spec_body(const ms_kernel_spec *s, bool shape_macros, char **out,
                              ms_error *err) {
    return spec_body(s, shape_macros, NULL, out, err);
}

ms_kernel_shape ms_kernel_op_shape(ms_kernel_op op) {
    switch (op) {
    case MS_KERNEL_OP_ATTN_DECODE:
    case MS_KERNEL_OP_ATTN_PREFILL:
        return MS_KERNEL_SHAPE_GROUPED;
    case MS_KERNEL_OP_ROPE_KV:
        return MS_KERNEL_SHAPE_PAGED;
    case MS_KERNEL_OP_RMSNORM_HEADS:
    case MS_KERNEL_OP_ATTN_DENSE:
        return MS_KERNEL_SHAPE_HEAD_DIM;
    default:
        return MS_KERNEL_SHAPE_NONE;
    }
}

ms_status ms_kernel_spec_shape_defines(const ms_kernel_spec *s, char *buf, size_t cap,
                                       ms_error *err) {
    MS_TRY(ms_kernel_spec_check(s, err));
    int n = 0;
    switch (ms_kernel_op_shape(s->op)) {
    case MS_KERNEL_SHAPE_NONE:
        n = snprintf(buf, cap, "%s", "");
        break;
    case MS_KERNEL_SHAPE_HEAD_DIM:
        n = snprintf(buf, cap, "#define MS_HEAD_DIM %d\n#line 1\n", s->head_dim);
        break;
    case MS_KERNEL_SHAPE_PAGED:
        n = snprintf(buf, cap, "#define MS_HEAD_DIM %d\n#define MS_PAGE_SIZE %d\n#line 1\n",
                     s->head_dim, s->page_size);
        break;
    case MS_KERNEL_SHAPE_GROUPED:
        n = snprintf(buf, cap,
                     "#define MS_HEAD_DIM %d\n#define MS_PAGE_SIZE %d\n#define MS_GROUP %d\n"
                     "#line 1\n",
                     s->head_dim, s->page_size, s->group);
        break;
    }
    if (n < 0 || (size_t)n >= cap)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: shape defines buffer of %zu bytes too small",
                       op_info[s->op].name, cap);
    return MS_OK;
}

ms_status ms_kernel_spec_shape_guard(const ms_kernel_spec *s, char *buf, size_t cap,
                                     ms_error *err) {
    char stem[MS_KERNEL_URI_MAX];
    MS_TRY(ms_kernel_spec_stem(s, stem, sizeof stem, err));
    int n = 0;
    switch (ms_kernel_op_shape(s->op)) {
    case MS_KERNEL_SHAPE_NONE:
        n = snprintf(buf, cap, "%s", "");
        break;
    case MS_KERNEL_SHAPE_HEAD_DIM:
        n = snprintf(buf, cap,
                     "#if !defined(MS_HEAD_DIM)\n"
                     "#error \"%s needs MS_HEAD_DIM (defined by the runtime at load)\"\n#endif\n",
                     stem);
        break;
    case MS_KERNEL_SHAPE_PAGED:
        n = snprintf(buf, cap,
                     "#if !defined(MS_HEAD_DIM) || !defined(MS_PAGE_SIZE)\n"
                     "#error \"%s needs MS_HEAD_DIM and MS_PAGE_SIZE (defined by the runtime at "
                     "load)\"\n#endif\n",
                     stem);
        break;
    case MS_KERNEL_SHAPE_GROUPED:
        n = snprintf(buf, cap,
                     "#if !defined(MS_HEAD_DIM) || !defined(MS_PAGE_SIZE) || !defined(MS_GROUP)\n"
                     "#error \"%s needs MS_HEAD_DIM, MS_PAGE_SIZE and MS_GROUP (defined by the "
                     "runtime at load)\"\n#endif\n",
                     stem);
        break;
    }
    if (n < 0 || (size_t)n >= cap)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: shape guard buffer of %zu bytes too small",
                       op_info[s->op].name, cap);
    return MS_OK;
}

ms_status ms_kernel_spec_instance_source(const ms_kernel_spec *s, char **out, ms_error *err) {
    *out = NULL;
    char defines[256], stem[MS_KERNEL_URI_MAX], uri[MS_KERNEL_URI_MAX];
    MS_TRY(ms_kernel_spec_shape_defines(s, defines, sizeof defines, err));
    MS_TRY(ms_kernel_spec_stem(s, stem, sizeof stem, err));
    MS_TRY(ms_kernel_spec_uri(s, 0, uri, sizeof uri, err));
    /* The guard is the one compiler/codegen.c writes into DIR/kernels/<stem>.cu: the two texts
     * must agree outside comments (tests/test_nvrtc.c compares their cache keys). */
    char guard[512];
    MS_TRY(ms_kernel_spec_shape_guard(s, guard, sizeof guard, err));
    char *head = ms_asprintf("%s// Kernel instance %s (structure %s, template %s), generated by "
                             "mstar-c. Do not edit.\n%s",
                             defines, uri, stem, op_info[s->op].header, guard);
    if (head == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory writing the instance source", uri);
    ms_status st = spec_body(s, true, head, out, err);
    ms_free(head);
    return st;
}

ms_status ms_kernel_parse_arch_list(const char *flag, const char *text, int *archs, int cap,
                                    int *n, ms_error *err) {
    *n = 0;
    if (text == NULL || text[0] == '\0')
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: empty architecture list (expected e.g. sm_80,sm_90)", flag);
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: empty item in architecture list '%s' (expected e.g. sm_80,sm_90)",
                           flag, text);
        if (len >= sizeof item)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: architecture '%.*s...' not understood (expected e.g. sm_80, sm_90)",
                           flag, 16, p);
        memcpy(item, p, len);
        item[len] = '\0';
        const char *q = item;
        if (strncmp(q, "sm_", 3) == 0)
            q += 3;
        else if (strncmp(q, "compute_", 8) == 0)
            q += 8;
        else if (strncmp(q, "sm", 2) == 0)
            q += 2;
        long v = 0;
        bool digits = *q != '\0' && strlen(q) <= 3;
        for (const char *c = q; digits && *c != '\0'; c++) {
            if (*c < '0' || *c > '9')
                digits = false;
            else
                v = v * 10 + (*c - '0');
        }
        if (!digits || v < 50 || v > 199)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: architecture '%s' not understood (expected sm_XX with XX from 50, "
                           "e.g. sm_80, sm_90)",
                           flag, item);
        for (int i = 0; i < *n; i++)
            if (archs[i] == (int)v)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "%s: architecture sm_%ld listed twice in '%s'", flag, v, text);
        if (*n == cap)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: more than %d architectures in '%s'",
                           flag, cap, text);
        archs[(*n)++] = (int)v;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return MS_OK;
}

const char *ms_kernel_op_header(ms_kernel_op op) {
    if ((unsigned)op >= MS_KERNEL_OP_COUNT)
        return NULL;
    return op_info[op].header;
}

/* ---- the instances of a decoder ---- */

ms_status ms_kernel_specs_for_decoder(const ms_kernel_model_shape *shape, ms_kernel_spec *out,
                                      int cap, int *n, ms_error *err) {
    return ms_kernel_specs_for_decoder_variant(shape, false, false, out, cap, n, err);
}

ms_status ms_kernel_specs_for_decoder_variant(const ms_kernel_model_shape *shape, bool qk_norm,
                                              bool mrope, ms_kernel_spec *out, int cap, int *n,
                                              ms_error *err) {
    *n = 0;
    if (shape->n_kv_heads < 1 || shape->n_q_heads % shape->n_kv_heads != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "kernel instances: %d query heads are not a multiple of %d KV heads",
                       shape->n_q_heads, shape->n_kv_heads);
    const int g = shape->n_q_heads / shape->n_kv_heads;
    const ms_kernel_dtype kv = shape->kv_dtype, w = shape->weight_dtype;
    ms_kernel_spec s[16];
    int k = 0;
    s[k++] = ms_kernel_spec_attn_decode(kv, shape->head_dim, shape->page_size, g,
                                        shape->windowed);
    s[k++] = ms_kernel_spec_attn_prefill(kv, shape->head_dim, shape->page_size, g, true,
                                         shape->windowed);
    if (mrope)
        s[k++] = ms_kernel_spec_rope_kv_mrope(kv, shape->head_dim, shape->page_size, shape->rope);
    else
        s[k++] = ms_kernel_spec_rope_kv(kv, shape->head_dim, shape->page_size, shape->rope,
                                        MS_KERNEL_ROPE_SCALING_NONE);
    s[k++] = ms_kernel_spec_rmsnorm(w, false); /* residual adds are in the linears (linear_add) */
    if (qk_norm)
        s[k++] = ms_kernel_spec_rmsnorm_heads(w, shape->head_dim);
    s[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, w);
    s[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, w);
    for (int i = 0; i < k; i++)
        s[i].act_dtype = MS_KERNEL_DTYPE_F32;
    s[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32);
    s[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32);
    s[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32);
    if (k > cap)
        return MS_FAIL(err, MS_ERR_CAPACITY, "kernel instances: %d needed, room for %d", k, cap);
    for (int i = 0; i < k; i++) {
        MS_TRY(ms_kernel_spec_check(&s[i], err));
        out[i] = s[i];
    }
    *n = k;
    return MS_OK;
}

ms_status ms_kernel_specs_for_stems(const ms_kernel_model_shape *shape, const char *const *stems,
                                    int n_stems, ms_kernel_spec *out, int cap, int *n,
                                    ms_error *err) {
    *n = 0;
    if (shape->n_kv_heads < 1 || shape->n_q_heads % shape->n_kv_heads != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "kernel instances: %d query heads are not a multiple of %d KV heads",
                       shape->n_q_heads, shape->n_kv_heads);
    const int g = shape->n_q_heads / shape->n_kv_heads, hd = shape->head_dim;
    const int ps = shape->page_size;
    const ms_kernel_dtype kv = shape->kv_dtype, w = shape->weight_dtype;
    /* every variant the CUDA backend can load for this shape (the order of
       ms_kernel_specs_for_decoder_variant); the stems pick the model's */
    ms_kernel_spec c[32];
    int k = 0;
    c[k++] = ms_kernel_spec_attn_decode(kv, hd, ps, g, shape->windowed);
    c[k++] = ms_kernel_spec_attn_prefill(kv, hd, ps, g, true, shape->windowed);
    c[k++] = ms_kernel_spec_attn_prefill(kv, hd, ps, g, false, shape->windowed);
    c[k++] = ms_kernel_spec_rope_kv(kv, hd, ps, shape->rope, MS_KERNEL_ROPE_SCALING_NONE);
    if (shape->rope != MS_KERNEL_ROPE_NONE)
        c[k++] = ms_kernel_spec_rope_kv_mrope(kv, hd, ps, shape->rope);
    c[k++] = ms_kernel_spec_rmsnorm(w, false);
    c[k++] = ms_kernel_spec_rmsnorm(w, true);
    c[k++] = ms_kernel_spec_rmsnorm_heads(w, hd);
    c[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, w);
    c[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, w);
    for (int i = 0; i < k; i++)
        c[i].act_dtype = MS_KERNEL_DTYPE_F32;
    c[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32);
    c[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32);
    c[k++] = ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32);
    c[k++] = ms_kernel_spec_attn_dense(hd); /* an encoder's dense attention (f32) */
    /* quantized weights (no shape): the CUDA backend compiles the types its GGUF uses at load */
    for (int i = 0; i < (int)MS_ARRAY_LEN(qtypes); i++)
        c[k++] = ms_kernel_spec_qmatmul(qtypes[i].type);
    int m = 0;
    for (int i = 0; i < k; i++) {
        /* the stem has no shape fields: take it at a shape every template supports, so a
           variant the model does not list never fails on this checkpoint's shape */
        ms_kernel_spec t = c[i];
        t.head_dim = t.head_dim != 0 ? 64 : 0;
        t.page_size = t.page_size != 0 ? 16 : 0;
        t.group = t.group != 0 ? 4 : 0;
        char stem[MS_KERNEL_URI_MAX];
        MS_TRY(ms_kernel_spec_stem(&t, stem, sizeof stem, err));
        bool listed = false;
        for (int j = 0; j < n_stems && !listed; j++)
            listed = stems[j] != NULL && strcmp(stems[j], stem) == 0;
        if (!listed)
            continue;
        MS_TRY(ms_kernel_spec_check(&c[i], err));
        if (m == cap)
            return MS_FAIL(err, MS_ERR_CAPACITY, "kernel instances: more than %d needed", cap);
        out[m++] = c[i];
    }
    *n = m;
    return MS_OK;
}

/* ---- attention planning ---- */

ms_status ms_kernel_attn_prefill_tiles(const int32_t *qo_indptr, int batch, int group,
                                     int32_t *tile_req, int32_t *tile_idx, int cap,
                                     int *n_tiles, ms_error *err) {
    *n_tiles = 0;
    if (batch < 0 || group < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "prefill tiles: batch %d, group %d", batch, group);
    int n = 0;
    for (int b = 0; b < batch; b++) {
        int64_t n_q = (int64_t)qo_indptr[b + 1] - qo_indptr[b];
        if (n_q < 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "prefill tiles: qo_indptr decreases at request %d (%d -> %d)", b,
                           qo_indptr[b], qo_indptr[b + 1]);
        int64_t tiles = (n_q * group + MS_ATTN_PREFILL_ROWS - 1) / MS_ATTN_PREFILL_ROWS;
        if (n + tiles > cap)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "prefill tiles: request %d needs tiles beyond the capacity of %d", b,
                           cap);
        for (int64_t t = 0; t < tiles; t++) {
            if (tile_req != NULL)
                tile_req[n] = b;
            if (tile_idx != NULL)
                tile_idx[n] = (int32_t)t;
            n++;
        }
    }
    *n_tiles = n;
    return MS_OK;
}

void ms_kernel_attn_decode_split(int batch, int n_kv_heads, int max_pages, int n_slots,
                               int min_pages, int max_splits, int *n_splits,
                               int *pages_per_split) {
    if (max_pages < 1)
        max_pages = 1;
    if (min_pages < 1)
        min_pages = 1;
    if (max_splits < 1)
        max_splits = 1;
    int64_t ctas = (int64_t)(batch > 0 ? batch : 1) * (n_kv_heads > 0 ? n_kv_heads : 1);
    int64_t want = (int64_t)(n_slots > 0 ? n_slots : 1) / ctas; /* 0: more pairs than slots */
    int64_t by_len = max_pages / min_pages;
    int64_t s = want < by_len ? want : by_len;
    if (s > max_splits)
        s = max_splits;
    if (s < 1)
        s = 1;
    int pps = (int)((max_pages + s - 1) / s);
    /* drop splits that would be empty after rounding pages_per_split up */
    s = (max_pages + pps - 1) / pps;
    *n_splits = (int)s;
    *pages_per_split = pps;
}
