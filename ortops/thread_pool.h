/*
 * thread_pool.h -- oga's own threads for its operators' parallel loops (KernelCall::ParallelFor),
 * used instead of ONNX Runtime's intra-op pool: by default one thread per CPU the process may run on
 * (at most 16), OGA_ORTOPS_THREADS=N for N (0: ONNX Runtime's pool), or OgaOrtOpsSetThreads.
 *
 * A loop's iterations are claimed a few at a time (about 4 claims per thread), from one counter, by
 * whichever threads run: the caller works too, and a worker that is descheduled (a busy thread or
 * process took its core) simply claims nothing, so the loop never waits for a thread that has not
 * started; it waits only for iterations already under way. Idle workers spin briefly for the next loop (a decoder step's
 * operators follow each other within microseconds), then sleep; no barrier at the end of a loop
 * spins on threads that are not there. A loop that finds the pool busy (another session's loop on
 * another thread) runs on its caller alone.
 */
#ifndef OGA_ORTOPS_THREAD_POOL_H_
#define OGA_ORTOPS_THREAD_POOL_H_

#include <cstddef>

namespace ortops {

// The pool in use, or NULL when the operators use ONNX Runtime's (a count of 0).
class ThreadPool;
ThreadPool* SharedThreadPool();

// Sets the number of threads of oga's pool, the caller included (1: every loop on its caller;
// 0: ONNX Runtime's pool). Not while operators run. Returns the number now in use.
int SetThreadPoolThreads(int threads);
int ThreadPoolThreads();

// body(state, i) for every i in [0, count), on the pool's workers and the calling thread; returns
// when all are done. body must not throw.
void RunOnPool(ThreadPool* pool, size_t count, void (*body)(void*, size_t), void* state);

}  // namespace ortops

#endif  // OGA_ORTOPS_THREAD_POOL_H_
