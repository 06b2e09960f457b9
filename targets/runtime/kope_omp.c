/* The five LLVM OpenMP entry points that MLIR's OpenMP lowering calls, implemented on top of
 * GNU libgomp: the runtime PyTorch's CPU wheel already runs its own threads on. Parallel
 * kernels then share PyTorch's thread pool instead of starting a second one that fights it
 * for the cores (two spinning runtimes on the same cores serialise each other).
 *
 * Built at first use by kope.targets.openmp and linked against the libgomp of the torch
 * that is loaded, so that both use the same library instance.
 */
#include <stdarg.h>
#include <stdint.h>

extern void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
extern void GOMP_barrier(void);
extern int omp_get_thread_num(void);
extern int omp_get_num_threads(void);

#define KOPE_MAX_ARGS 32

typedef void (*kmpc_micro)();

struct fork {
    kmpc_micro fn;
    int32_t argc;
    void *argv[KOPE_MAX_ARGS];
};

static void run_microtask(void *p) {
    struct fork *f = (struct fork *)p;
    int32_t gtid = omp_get_thread_num(), btid = gtid;
    void **a = f->argv;
    switch (f->argc) {
#define CALL(...) f->fn(&gtid, &btid, ##__VA_ARGS__); break;
    case 0: CALL()
    case 1: CALL(a[0])
    case 2: CALL(a[0], a[1])
    case 3: CALL(a[0], a[1], a[2])
    case 4: CALL(a[0], a[1], a[2], a[3])
    case 5: CALL(a[0], a[1], a[2], a[3], a[4])
    case 6: CALL(a[0], a[1], a[2], a[3], a[4], a[5])
    case 7: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6])
    case 8: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])
    case 9: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8])
    case 10: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9])
    case 11: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10])
    case 12: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11])
    case 13: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12])
    case 14: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13])
    case 15: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14])
    case 16: CALL(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15])
    default: {
        /* More shared values than this file spells out: run the region on one thread, which
         * is correct (OpenMP allows a team of one) if not parallel. */
        if (omp_get_thread_num() == 0) {
            f->fn(&gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],
                  a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21],
                  a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31]);
        }
    }
#undef CALL
    }
}

int32_t __kmpc_global_thread_num(void *loc) {
    (void)loc;
    return omp_get_thread_num();
}

void __kmpc_fork_call(void *loc, int32_t argc, kmpc_micro fn, ...) {
    (void)loc;
    struct fork f;
    f.fn = fn;
    f.argc = argc;
    va_list ap;
    va_start(ap, fn);
    for (int32_t i = 0; i < argc && i < KOPE_MAX_ARGS; i++)
        f.argv[i] = va_arg(ap, void *);
    va_end(ap);
    GOMP_parallel(run_microtask, &f, argc > 16 ? 1 : 0, 0);
}

/* Static schedule, no chunk: thread t of n gets one contiguous block of the iterations
 * [*lower, *upper] (inclusive); a thread with none gets lower = upper + 1. */
void __kmpc_for_static_init_8u(void *loc, int32_t gtid, int32_t schedule, int32_t *last,
                               uint64_t *lower, uint64_t *upper, int64_t *stride, int64_t incr,
                               int64_t chunk) {
    (void)loc; (void)gtid; (void)schedule; (void)chunk;
    uint64_t step = incr > 0 ? (uint64_t)incr : 1;
    uint64_t trip = (*upper - *lower) / step + 1;
    uint64_t n = (uint64_t)omp_get_num_threads(), t = (uint64_t)omp_get_thread_num();
    uint64_t base = trip / n, extra = trip % n;
    uint64_t first = t * base + (t < extra ? t : extra);
    uint64_t count = base + (t < extra ? 1 : 0);
    *stride = (int64_t)(trip * step);
    if (count == 0) {
        *last = 0;
        *lower = *upper + step;
        return;
    }
    uint64_t begin = *lower + first * step;
    *upper = begin + (count - 1) * step;
    *lower = begin;
    *last = (first + count == trip);
}

void __kmpc_for_static_fini(void *loc, int32_t gtid) {
    (void)loc; (void)gtid;
}

void __kmpc_barrier(void *loc, int32_t gtid) {
    (void)loc; (void)gtid;
    GOMP_barrier();
}
