/*
 * fixture_ref.h - reading the reference outputs of ../shared/fixtures (reference.safetensors):
 * open a fixture's reference file, read one tensor as int32 or float32 into a fresh ms_malloc'd
 * array. A missing file or tensor fails the test naming it. Included by the engine feature tests
 * (CFG, M-RoPE, dense, and their GPU runs).
 */
#ifndef MS_FIXTURE_REF_H
#define MS_FIXTURE_REF_H

#include <stdio.h>

#include "ms_test.h"
#include "safetensors.h"

/* reference.safetensors of fixture `rel` ("hf/llama_cfg"); free with ms_st_file_free. */
static inline ms_st_file *ms_test_ref_open(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", ms_test_fixture(rel));
    ms_st_file *f = NULL;
    ms_error err = {0};
    if (ms_st_file_init(&f, path, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return f;
}

/* Tensor `name` of f converted to int32 (i32) or float32, [*n] elements; free with ms_free. */
static inline void *ms_test_ref_tensor(ms_st_file *f, const char *name, bool i32, size_t *n) {
    ms_error err = {0};
    const ms_st_tensor *t = ms_st_file_find_tensor(f, name);
    if (t == NULL)
        fail_msg("reference tensor %s missing", name);
    void *out = ms_malloc(t->n_elems * 4);
    assert_non_null(out);
    ms_status st = i32 ? ms_st_tensor_to_i32(t, out, t->n_elems, &err)
                       : ms_st_tensor_to_f32(t, out, t->n_elems, &err);
    if (st != MS_OK)
        fail_msg("%s: %s", name, err.msg);
    *n = t->n_elems;
    return out;
}

#endif /* MS_FIXTURE_REF_H */
