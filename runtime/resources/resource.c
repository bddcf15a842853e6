/* resource.c - small helpers of the shared resource vocabulary (resource.h). */
#include "resource.h"

const char *ms_admit_code_str(ms_admit_code code) {
    /* ORDER MS_ADMIT */
    static const char *const names[MS_ADMIT_CODE_COUNT] = {
        "ok", "pending", "pages short", "offloaded", "transfer failed", "invalid", "no memory",
    };
    if ((int)code < 0 || code >= MS_ADMIT_CODE_COUNT)
        return "unknown";
    return names[code];
}

const char *ms_resource_kind_str(ms_resource_kind kind) {
    /* ORDER MS_RESOURCE_KIND */
    static const char *const names[MS_RESOURCE_KIND_COUNT] = {
        "kv_pool", "positions", "attention", "cross", "scratch", "sampler",
    };
    if ((int)kind < 0 || kind >= MS_RESOURCE_KIND_COUNT)
        return "unknown";
    return names[kind];
}

const ms_kv_plan *ms_kv_plan_find(const ms_kv_plan_set *set, ms_label label) {
    if (set == NULL)
        return NULL;
    for (int32_t i = 0; i < set->n_plans; i++)
        if (set->plans[i].plan_label == label)
            return &set->plans[i];
    return NULL;
}
