/* The plain C API of libmodel, a shared library that uses locus internally (built with
   -fvisibility=hidden -fvisibility-inlines-hidden): no locus type crosses it. Besides
   training, it reports what locus's process-wide state looks like from inside the
   library, so that the program can compare it with its own view. */
#ifndef LOCUS_TEST_MODEL_H
#define LOCUS_TEST_MODEL_H
#include <stddef.h>

#if defined(__GNUC__)
#  define MODEL_API __attribute__((visibility("default")))
#else
#  define MODEL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Trains a small MLP on the cpu for `steps` steps; the last mean squared error, or -1 on
   an error (model_last_error()). */
MODEL_API double model_train(int steps);
/* Allocates a cpu tensor of n floats inside the library and keeps it: 0, or 1 when
   locus threw (out_of_memory: the limit or an injected fault; model_last_error()). */
MODEL_API int model_hold(long n);
/* Frees the held tensor inside the library. */
MODEL_API void model_release(void);
MODEL_API const char* model_last_error(void);

/* locus's state as the library sees it. */
MODEL_API const void* model_cpu_allocator_identity(void); /* the address of its cpu allocator */
MODEL_API size_t model_cpu_allocated_bytes(void);          /* memory_stats<cpu>() */
MODEL_API size_t model_cpu_limit_bytes(void);
MODEL_API int model_fault_fired(void);                     /* locus::fault::fired() */
MODEL_API int model_host_gemm(void);                       /* locus::current_host_gemm() */
MODEL_API int model_matmul_precision_high(void);           /* float32 matmul precision is high */
MODEL_API int model_omp_max_threads(void);

#ifdef __cplusplus
}
#endif
#endif
