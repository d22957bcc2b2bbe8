/* threadpool.h: persistent workers that run one job at a time, with a barrier */
#ifndef PYLLM_THREADPOOL_H
#define PYLLM_THREADPOOL_H

typedef void (*job_fn)(void *arg, int ith, int nth);
typedef struct threadpool threadpool;

threadpool *threadpool_new(int n_threads);
void threadpool_free(threadpool *tp);
int threadpool_size(const threadpool *tp);

/* Runs fn(arg, ith, nth) on every thread (the caller is thread 0) and
 * returns when all are done. */
void threadpool_run(threadpool *tp, job_fn fn, void *arg);

/* Inside a job: waits until every thread of the pool has reached it. */
void threadpool_barrier(threadpool *tp);

#endif
