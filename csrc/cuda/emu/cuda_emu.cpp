/* cuda_emu.cpp: the CUDA emulator's scheduler and runtime (see cuda_emu.h).
 *
 * A launch takes a process-wide lock and runs the grid's blocks one after
 * another on the calling OS thread. For a block, each CUDA thread is a fiber
 * (a coroutine with its own stack, from a pool); the scheduler works in
 * rounds: every runnable fiber runs once, in the chosen order, until it
 * arrives at a barrier or returns, and then hands over to the next one
 * directly (the last returns to the scheduler). Arriving at a barrier that
 * is then complete makes its fibers runnable for the next round. A round
 * after which nothing is runnable and some fiber is still waiting is a
 * deadlock: the launch fails with a description instead of hanging.
 *
 * A warp operation is a barrier of the lanes in its mask that also moves
 * one 8-byte value per lane: each lane leaves its value and the lane it
 * reads from, and the lane that completes the group hands every lane its
 * result before any of them runs again.
 *
 * The context switch is a few lines of x86-64 assembly (callee-saved
 * registers, MXCSR and the x87 control word, stack pointer); elsewhere, or
 * with -DPQEMU_UCONTEXT, it is ucontext's swapcontext.
 */
#include "cuda_emu.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)   /* make cuda-emu-asan */
#include <pthread.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define PQEMU_ASAN 1
#endif

#if !defined(__x86_64__) || defined(PQEMU_UCONTEXT)
#define PQEMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

extern "C" {
#include "pyllm_cuda_emu.h"
}

struct CUstream_st {
    cudaError_t pending;   /* a launch failure the next synchronization reports */
    bool capturing;        /* between cudaStreamBeginCapture and cudaStreamEndCapture */
    cudaError_t capture_error;                  /* what invalidated the capture, if anything */
    std::vector<std::function<void()>> recorded;   /* the launches captured */
};

struct CUgraph_st {
    std::vector<std::function<void()>> launches;
};

struct CUgraphExec_st {
    std::vector<std::function<void()>> launches;
};

struct CUevent_st {
    std::chrono::steady_clock::time_point at;
    bool recorded;
};

namespace pqemu {

thread_regs regs;

namespace {

constexpr size_t STACK_BYTES = 64 << 10;   /* per CUDA thread; kernels use a few hundred bytes */
constexpr size_t GUARD_BYTES = 4 << 10;    /* below each stack: an overflow faults at once */
constexpr unsigned MAX_BLOCK_THREADS = 1024;
constexpr size_t MAX_DYNAMIC_SHARED = 48 << 10;   /* without cudaFuncSetAttribute, as on the GPU */
constexpr size_t TOTAL_MEMORY = (size_t)8 << 30;

/* ---- context switch ---- */

#ifndef PQEMU_USE_UCONTEXT
/* pqemu_switch(&save, to): saves this context's stack pointer in *save and resumes the
 * context whose stack pointer is `to` (one pushed by pqemu_switch, or a fresh frame
 * made by fresh_context) */
extern "C" void pqemu_switch(void **save, void *to);
extern "C" void pqemu_fiber_start(void);
asm(R"(
    .text
    .p2align 4
    .type pqemu_switch, @function
pqemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movl (%rsp), %eax
    movzwl 4(%rsp), %ecx
    movq %rsi, %rsp
    cmpl (%rsp), %eax       /* loading the control words stalls the pipeline: only when they differ */
    je 1f
    ldmxcsr (%rsp)
1:  cmpw 4(%rsp), %cx
    je 2f
    fldcw 4(%rsp)
2:  addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pqemu_switch, .-pqemu_switch

    .p2align 4
    .type pqemu_fiber_start, @function
pqemu_fiber_start:
    movq %r12, %rdi
    andq $-16, %rsp
    callq *%r13
    ud2
    .size pqemu_fiber_start, .-pqemu_fiber_start
)");

struct context {
    void *sp = nullptr;
};

inline void switch_context(context &from, context &to) { pqemu_switch(&from.sp, to.sp); }

/* a frame that pqemu_switch resumes into pqemu_fiber_start, which calls entry(arg) */
void fresh_context(context &c, char *stack_top, void (*entry)(void *), void *arg) {
    uint64_t *sp = reinterpret_cast<uint64_t *>((uintptr_t)stack_top & ~(uintptr_t)15);
    *--sp = 0;                                       /* padding: the start runs on 16-aligned rsp */
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)&pqemu_fiber_start; /* ret */
    *--sp = 0;                                       /* rbp: ends backtraces */
    *--sp = 0;                                       /* rbx */
    *--sp = (uint64_t)(uintptr_t)arg;                /* r12 */
    *--sp = (uint64_t)(uintptr_t)entry;              /* r13 */
    *--sp = 0;                                       /* r14 */
    *--sp = 0;                                       /* r15 */
    uint32_t mxcsr;
    uint16_t fcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fcw));
    *--sp = (uint64_t)mxcsr | ((uint64_t)fcw << 32); /* this thread's float modes */
    c.sp = sp;
}
#else
struct context {
    ucontext_t uc;
};

inline void switch_context(context &from, context &to) { swapcontext(&from.uc, &to.uc); }

/* makecontext passes only ints: the entry and its argument travel as 32-bit halves */
void ucontext_start(unsigned e_hi, unsigned e_lo, unsigned a_hi, unsigned a_lo) {
    auto entry = reinterpret_cast<void (*)(void *)>((uintptr_t)e_hi << 32 | e_lo);
    entry(reinterpret_cast<void *>((uintptr_t)a_hi << 32 | a_lo));
}

void fresh_context(context &c, char *stack_top, void (*entry)(void *), void *arg) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack_top - STACK_BYTES;
    c.uc.uc_stack.ss_size = STACK_BYTES;
    c.uc.uc_link = nullptr;
    const uint64_t e = (uintptr_t)entry, a = (uintptr_t)arg;
    makecontext(&c.uc, reinterpret_cast<void (*)()>(ucontext_start), 4, (unsigned)(e >> 32), (unsigned)e,
                (unsigned)(a >> 32), (unsigned)a);
}
#endif

/* ---- fibers and blocks ---- */

enum state : uint8_t { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_OP, EXITED };

struct fiber {
    context ctx;
    char *stack_top = nullptr;
    int tid = 0;
    uint3 idx{};
    state st = RUNNABLE;
    /* the barrier it waits at */
    const char *op = nullptr, *file = nullptr;
    int line = 0;
    unsigned mask = 0;
    uint64_t give = 0, got = 0;   /* a warp operation's value out, and the one it reads */
    int src = 0;                  /* the lane it reads */
};

struct warp {
    unsigned lanes;     /* lanes that exist (the last warp of a block can be partial) */
    unsigned exited;
    unsigned waiting;   /* lanes waiting at a warp operation */
};

struct block_state {
    int n = 0;                 /* threads */
    int exited = 0, at_barrier = 0;
    const char *bar_file = nullptr;
    int bar_line = 0;
    std::vector<warp> warps;
    std::vector<uint64_t> ready, next;   /* bitmaps: runnable this round, released for the next */
    bool failed = false;
};

std::vector<fiber> fibers;   /* the pool: fibers[i] is thread i of the running block */
context scheduler;
fiber *current = nullptr;
block_state blk;
void (*body_fn)(void *);
void *body_arg;
std::vector<unsigned char> dyn_shared;
std::string fail_message;    /* why the running launch failed */

struct order_state {
    int order = -1;   /* PYLLM_CUDA_EMU_ORDER_*; -1: not yet read from the environment */
    uint64_t seed = 0;
} order;

struct stats_state {
    uint64_t launches = 0, blocks = 0, resumes = 0;
} stats;

std::mutex launch_lock;
CUstream_st default_stream{cudaSuccess, false, cudaSuccess, {}};
std::vector<int> run_list;   /* a round's fibers, in order */
size_t run_pos;              /* the one running */

uint64_t splitmix(uint64_t &s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void read_order_env() {
    order.order = PYLLM_CUDA_EMU_ORDER_FORWARD;
    const char *env = getenv("PYLLM_CUDA_EMU_ORDER");
    if (!env || !*env) return;
    if (!strcmp(env, "reverse")) {
        order.order = PYLLM_CUDA_EMU_ORDER_REVERSE;
    } else if (!strncmp(env, "shuffle", 7)) {
        order.order = PYLLM_CUDA_EMU_ORDER_SHUFFLE;
        if (env[7] == ':') order.seed = strtoull(env + 8, nullptr, 0);
    } else if (strcmp(env, "forward") != 0) {
        fprintf(stderr, "pyllm CUDA emulator: PYLLM_CUDA_EMU_ORDER=%s is not forward, reverse or "
                        "shuffle[:seed]; running forward\n", env);
    }
}

#ifdef PQEMU_ASAN
const void *sched_stack;   /* the OS thread's stack, where the scheduler runs */
size_t sched_stack_size;
#endif

/* switches from one context to a fiber's (or to the scheduler's, dest == nullptr), telling
 * AddressSanitizer (in its build) which stack comes next */
inline void go(context &from, context &to, const fiber *dest) {
#ifdef PQEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, dest ? dest->stack_top - STACK_BYTES : sched_stack,
                                   dest ? STACK_BYTES : sched_stack_size);
    switch_context(from, to);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    (void)dest;
    switch_context(from, to);
#endif
}

/* ---- describing threads, for errors ---- */

std::string where(const fiber &f) {
    char b[128];
    snprintf(b, sizeof b, "thread (%u,%u,%u)", f.idx.x, f.idx.y, f.idx.z);
    return b;
}

std::string site(const char *op, const char *file, int line) {
    const char *base = file ? strrchr(file, '/') : nullptr;
    char b[256];
    snprintf(b, sizeof b, "%s (%s:%d)", op, base ? base + 1 : file ? file : "?", line);
    return b;
}

std::string fiber_site(const fiber &f) {
    if (&f == current && blk.failed) return "failed here";
    switch (f.st) {
    case EXITED: return "exited";
    case RUNNABLE: return "runnable";
    case AT_BLOCK_BARRIER: return site("__syncthreads", f.file, f.line);
    default: {
        char m[64];
        snprintf(m, sizeof m, " mask 0x%08x", f.mask);
        return site(f.op, f.file, f.line) + m;
    }
    }
}

/* every thread's state, runs of consecutive threads in the same state merged */
std::string describe_block() {
    std::string s;
    int i = 0;
    while (i < blk.n) {
        const std::string what = fiber_site(fibers[i]);
        int j = i + 1;
        while (j < blk.n && fiber_site(fibers[j]) == what) j++;
        char b[64];
        if (j - i == 1) snprintf(b, sizeof b, "\n  thread %d: ", i);
        else snprintf(b, sizeof b, "\n  threads %d-%d: ", i, j - 1);
        s += b + what;
        i = j;
    }
    return s;
}

/* ends the block: records why and returns to the scheduler, never to the caller */
[[noreturn]] void fail_block(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    blk.failed = true;
    fail_message = msg;
    fail_message += "; the block's threads:" + describe_block();
    go(current->ctx, scheduler, nullptr);
    abort();   /* a failed block is never resumed */
}

inline void enter(fiber &f) {
    current = &f;
    regs.thread_idx = f.idx;
    regs.lane = f.tid & 31;
    stats.resumes++;
}

/* the running fiber stops (at a barrier, or for good): the round's next fiber runs */
inline void yield(fiber &f) {
    if (++run_pos < run_list.size()) {
        fiber &next = fibers[run_list[run_pos]];
        enter(next);
        go(f.ctx, next.ctx, &next);
    } else {
        go(f.ctx, scheduler, nullptr);
    }
}

inline void release(int tid) {
    fibers[tid].st = RUNNABLE;
    blk.next[tid >> 6] |= 1ull << (tid & 63);
}

inline bool same_site(const char *f1, int l1, const char *f2, int l2) {
    return l1 == l2 && (f1 == f2 || !strcmp(f1, f2));
}

void fiber_main(void *p) {
    fiber *f = static_cast<fiber *>(p);
#ifdef PQEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);   /* the first arrival on this stack */
#endif
    body_fn(body_arg);
    f->st = EXITED;
    blk.exited++;
    warp &w = blk.warps[f->tid >> 5];
    w.exited |= 1u << (f->tid & 31);
    if (blk.at_barrier)
        fail_block("%s exited while %d other threads wait at %s: every thread of the block must reach it",
                   where(*f).c_str(), blk.at_barrier, site("__syncthreads", blk.bar_file, blk.bar_line).c_str());
    for (unsigned m = w.waiting; m; m &= m - 1) {
        const fiber &o = fibers[(f->tid & ~31) + __builtin_ctz(m)];
        if (o.mask >> (f->tid & 31) & 1)
            fail_block("%s exited while lane %d waits for it at %s", where(*f).c_str(), o.tid & 31,
                       fiber_site(o).c_str());
    }
    yield(*f);
    abort();   /* an exited fiber is never resumed */
}

bool ensure_fibers(int n) {
    while ((int)fibers.size() < n) {
        const size_t bytes = STACK_BYTES + GUARD_BYTES;
        void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, GUARD_BYTES, PROT_NONE);
        fibers.emplace_back();
        fibers.back().stack_top = static_cast<char *>(m) + bytes;
    }
    return true;
}

/* the order this round runs its fibers in */
void round_order(std::vector<int> &out, uint64_t &rng) {
    out.clear();
    const int words = (int)blk.ready.size();
    if (order.order == PYLLM_CUDA_EMU_ORDER_REVERSE) {
        for (int w = words - 1; w >= 0; w--)
            for (uint64_t b = blk.ready[w]; b; b &= ~(1ull << (63 - __builtin_clzll(b))))
                out.push_back(w * 64 + 63 - __builtin_clzll(b));
    } else {
        for (int w = 0; w < words; w++)
            for (uint64_t b = blk.ready[w]; b; b &= b - 1) out.push_back(w * 64 + __builtin_ctzll(b));
        if (order.order == PYLLM_CUDA_EMU_ORDER_SHUFFLE)
            for (size_t i = out.size(); i > 1; i--) std::swap(out[i - 1], out[splitmix(rng) % i]);
    }
}

/* runs one block to the end; false (with fail_message) if it failed */
bool run_block(uint64_t block_seed) {
    const dim3 bd = regs.block_dim;
    const int n = (int)(bd.x * bd.y * bd.z);
    blk.n = n;
    blk.exited = blk.at_barrier = 0;
    blk.failed = false;
    blk.warps.assign((n + 31) / 32, warp{});
    for (int w = 0; w < (int)blk.warps.size(); w++) {
        const int k = std::min(32, n - 32 * w);
        blk.warps[w].lanes = k == 32 ? 0xffffffffu : (1u << k) - 1;
    }
    blk.ready.assign((n + 63) / 64, 0);
    blk.next.assign((n + 63) / 64, 0);
    for (int t = 0; t < n; t++) {
        fiber &f = fibers[t];
        f.tid = t;
        f.idx = uint3{t % bd.x, (t / bd.x) % bd.y, t / (bd.x * bd.y)};
        f.st = RUNNABLE;
#ifdef PQEMU_ASAN
        /* a thread's last frames (fiber_main's, a failed block's) never return: their
         * redzones stay poisoned */
        __asan_unpoison_memory_region(f.stack_top - STACK_BYTES, STACK_BYTES);
#endif
        fresh_context(f.ctx, f.stack_top, fiber_main, &f);
        blk.ready[t >> 6] |= 1ull << (t & 63);
    }
    if (!dyn_shared.empty()) memset(dyn_shared.data(), 0xff, dyn_shared.size());   /* NaN, -1: never zero */

    uint64_t rng = block_seed;
    for (;;) {
        round_order(run_list, rng);
        if (!run_list.empty()) {   /* the fibers hand over to each other; the last comes back */
            run_pos = 0;
            fiber &first = fibers[run_list[0]];
            enter(first);
            go(scheduler, first.ctx, &first);
            if (blk.failed) return false;
        }
        if (blk.exited == n) return true;
        bool any = false;
        for (uint64_t w : blk.next) any |= w != 0;
        if (!any) {
            fail_message = "deadlock: no thread can go on; the block's threads:" + describe_block();
            return false;
        }
        blk.ready.swap(blk.next);
        std::fill(blk.next.begin(), blk.next.end(), 0);
    }
}

std::string dims(const dim3 &d) {
    char b[64];
    snprintf(b, sizeof b, "(%u,%u,%u)", d.x, d.y, d.z);
    return b;
}

/* ---- errors, as the runtime reports them ---- */

thread_local cudaError_t last_error = cudaSuccess;
std::string error_detail;              /* the last launch failure's description */
cudaError_t error_detail_code = cudaSuccess;

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

/* ---- misuse of barriers: the checks of block_barrier and warp_exchange, spelled out ---- */

[[noreturn, gnu::cold, gnu::noinline]] void barrier_misuse(fiber &f, const char *file, int line) {
    if (blk.exited)
        fail_block("%s reached %s, but %d threads of the block have exited: every thread must reach it",
                   where(f).c_str(), site("__syncthreads", file, line).c_str(), blk.exited);
    fail_block("divergent __syncthreads: %s reached %s while %d threads wait at %s", where(f).c_str(),
               site("__syncthreads", file, line).c_str(), blk.at_barrier,
               site("__syncthreads", blk.bar_file, blk.bar_line).c_str());
}

[[noreturn, gnu::cold, gnu::noinline]] void warp_misuse(fiber &f, const warp &w, unsigned mask, int src_lane,
                                                        const char *op, const char *file, int line) {
    const int lane = f.tid & 31;
    if (!(mask >> lane & 1))
        fail_block("%s called %s with mask 0x%08x, which leaves out its own lane %d", where(f).c_str(),
                   site(op, file, line).c_str(), mask, lane);
    if (mask & ~w.lanes)
        fail_block("%s: mask 0x%08x names lanes the block does not have (a partial warp: 0x%08x)",
                   site(op, file, line).c_str(), mask, w.lanes);
    if (mask & w.exited)
        fail_block("%s reached %s, but lane %d of the mask has exited", where(f).c_str(),
                   site(op, file, line).c_str(), __builtin_ctz(mask & w.exited));
    fail_block("%s: %s reads lane %d, which is not in the mask 0x%08x", where(f).c_str(),
               site(op, file, line).c_str(), src_lane, mask);
}

[[noreturn, gnu::cold, gnu::noinline]] void warp_divergence(fiber &f, const fiber &o) {
    fail_block("divergent warp operations: %s waits at %s, lane %d at %s", where(f).c_str(), fiber_site(f).c_str(),
               o.tid & 31, fiber_site(o).c_str());
}

}  // namespace

/* ---- what kernels call ---- */

void block_barrier(const char *file, int line) {
    fiber &f = *current;
    if (blk.exited || (blk.at_barrier && !same_site(file, line, blk.bar_file, blk.bar_line)))
        barrier_misuse(f, file, line);
    f.st = AT_BLOCK_BARRIER;
    f.file = file;
    f.line = line;
    blk.bar_file = file;
    blk.bar_line = line;
    if (++blk.at_barrier == blk.n) {
        blk.at_barrier = 0;
        for (int t = 0; t < blk.n; t++) release(t);
    }
    yield(f);
}

uint64_t warp_exchange(unsigned mask, uint64_t value, int src_lane, const char *op, const char *file, int line) {
    fiber &f = *current;
    const int lane = f.tid & 31;
    warp &w = blk.warps[f.tid >> 5];
    if (__builtin_expect(!(mask >> lane & 1) || (mask & ~w.lanes) || (mask & w.exited) || src_lane < 0 ||
                         src_lane > 31 || !(mask >> src_lane & 1), 0))
        warp_misuse(f, w, mask, src_lane, op, file, line);
    f.give = value;
    f.src = src_lane;
    f.st = AT_WARP_OP;
    f.op = op;
    f.file = file;
    f.line = line;
    f.mask = mask;
    w.waiting |= 1u << lane;
    if ((w.waiting & mask) == mask) {
        const int base = f.tid & ~31;
        for (unsigned m = mask; m; m &= m - 1) {
            const fiber &o = fibers[base + __builtin_ctz(m)];
            if (o.mask != mask || o.op != op || !same_site(o.file, o.line, file, line)) warp_divergence(f, o);
        }
        w.waiting &= ~mask;
        for (unsigned m = mask; m; m &= m - 1) {
            fiber &o = fibers[base + __builtin_ctz(m)];
            o.got = fibers[base + o.src].give;
            release(o.tid);
        }
    }
    yield(f);
    return f.got;
}

void *dynamic_shared(void) { return dyn_shared.data(); }

void check_aligned(const void *p, int bytes, const char *file, int line) {
    if ((uintptr_t)p % (uintptr_t)bytes)
        fail_block("%s: a %d-byte load at %p, which is not %d-byte aligned (the GPU faults: misaligned address)",
                   site("load", file, line).c_str(), bytes, p, bytes);
}

/* false, with the error set, where CUDA refuses the launch's configuration */
bool config_ok(const launch_config &c) {
    const unsigned long long threads = (unsigned long long)c.block.x * c.block.y * c.block.z;
    const char *bad = nullptr;
    if (!c.grid.x || !c.grid.y || !c.grid.z || !threads) bad = "a dimension is 0";
    else if (threads > MAX_BLOCK_THREADS || c.block.z > 64) bad = "more than 1024 threads per block (or z > 64)";
    else if (c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535) bad = "grid too large";
    else if (c.smem > MAX_DYNAMIC_SHARED) bad = "more than 48 KiB of dynamic shared memory";
    if (!bad) return true;
    char b[512];
    snprintf(b, sizeof b, "%s<<<%s, %s, %zu>>> (%s:%d): %s", c.kernel, dims(c.grid).c_str(),
             dims(c.block).c_str(), c.smem, c.file, c.line, bad);
    error_detail = b;
    error_detail_code = cudaErrorInvalidConfiguration;
    set_error(cudaErrorInvalidConfiguration);
    return false;
}

bool capture_launch(const launch_config &c, std::function<void()> run) {
    if (!c.stream || !c.stream->capturing) return false;
    if (config_ok(c)) c.stream->recorded.push_back(std::move(run));
    else c.stream->capture_error = cudaErrorInvalidConfiguration;
    return true;
}

void run_grid(const launch_config &c, void (*body)(void *), void *arg) {
    std::lock_guard<std::mutex> hold(launch_lock);
    if (order.order < 0) read_order_env();
    stats.launches++;
    const unsigned long long threads = (unsigned long long)c.block.x * c.block.y * c.block.z;
    if (!config_ok(c)) return;
    if (!ensure_fibers((int)threads)) {
        error_detail = "no memory for the threads' stacks";
        error_detail_code = cudaErrorMemoryAllocation;
        set_error(cudaErrorMemoryAllocation);
        return;
    }
    dyn_shared.assign(c.smem, 0);
#ifdef PQEMU_ASAN
    pthread_attr_t attr;
    void *stack_lo = nullptr;
    pthread_getattr_np(pthread_self(), &attr);
    pthread_attr_getstack(&attr, &stack_lo, &sched_stack_size);
    pthread_attr_destroy(&attr);
    sched_stack = stack_lo;
#endif
    body_fn = body;
    body_arg = arg;
    regs.grid_dim = c.grid;
    regs.block_dim = c.block;

    /* blocks in the chosen order too: a kernel whose blocks race on global memory shows it */
    const uint64_t n_blocks = (uint64_t)c.grid.x * c.grid.y * c.grid.z;
    uint64_t rng = order.seed ^ (stats.launches * 0x2545f4914f6cdd1dull);
    std::vector<uint64_t> perm;
    if (order.order == PYLLM_CUDA_EMU_ORDER_SHUFFLE) {
        perm.resize(n_blocks);
        for (uint64_t i = 0; i < n_blocks; i++) perm[i] = i;
        for (uint64_t i = n_blocks; i > 1; i--) std::swap(perm[i - 1], perm[splitmix(rng) % i]);
    }
    for (uint64_t k = 0; k < n_blocks; k++) {
        const uint64_t b = order.order == PYLLM_CUDA_EMU_ORDER_SHUFFLE ? perm[k]
                         : order.order == PYLLM_CUDA_EMU_ORDER_REVERSE ? n_blocks - 1 - k : k;
        regs.block_idx = uint3{(unsigned)(b % c.grid.x), (unsigned)(b / c.grid.x % c.grid.y),
                               (unsigned)(b / ((uint64_t)c.grid.x * c.grid.y))};
        stats.blocks++;
        if (!run_block(splitmix(rng))) {
            char b2[512];
            snprintf(b2, sizeof b2, "%s<<<%s, %s, %zu>>> (%s:%d), block %s: ", c.kernel, dims(c.grid).c_str(),
                     dims(c.block).c_str(), c.smem, c.file, c.line, dims(dim3(regs.block_idx.x, regs.block_idx.y,
                                                                             regs.block_idx.z)).c_str());
            error_detail = b2 + fail_message;
            error_detail_code = cudaErrorLaunchFailure;
            set_error(cudaErrorLaunchFailure);
            (c.stream ? c.stream : &default_stream)->pending = cudaErrorLaunchFailure;
            return;
        }
    }
}

}  // namespace pqemu

using namespace pqemu;

/* ---- the runtime API ---- */

namespace {

std::mutex mem_lock;
std::map<uintptr_t, size_t> device_allocs;   /* start -> bytes */
std::map<uintptr_t, size_t> host_allocs;
size_t allocated = 0;

/* is [p, p + n) inside one device allocation? */
bool device_range(const void *p, size_t n) {
    std::lock_guard<std::mutex> hold(mem_lock);
    const uintptr_t a = (uintptr_t)p;
    auto it = device_allocs.upper_bound(a);
    if (it == device_allocs.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && n <= it->second - (a - it->first);
}

}  // namespace

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (device != 0) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "pyllm CUDA emulator");
    p->totalGlobalMem = TOTAL_MEMORY;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 1;   /* one OS thread runs every block */
    p->memoryBusWidth = 256;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (device != 0) return set_error(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrClockRate: *value = 1000000; return cudaSuccess;         /* kHz */
    case cudaDevAttrMemoryClockRate: *value = 1000000; return cudaSuccess;
    default: return set_error(cudaErrorInvalidValue);
    }
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice); }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> hold(mem_lock);
    *free_bytes = TOTAL_MEMORY - allocated;
    *total_bytes = TOTAL_MEMORY;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(cudaError_t e) {
    const char *s;
    switch (e) {
    case cudaSuccess: s = "no error"; break;
    case cudaErrorInvalidValue: s = "invalid argument"; break;
    case cudaErrorMemoryAllocation: s = "out of memory"; break;
    case cudaErrorInvalidConfiguration: s = "invalid configuration argument"; break;
    case cudaErrorInvalidDevice: s = "invalid device ordinal"; break;
    case cudaErrorInvalidResourceHandle: s = "invalid resource handle"; break;
    case cudaErrorNotReady: s = "device not ready"; break;
    case cudaErrorLaunchFailure: s = "unspecified launch failure"; break;
    case cudaErrorStreamCaptureUnsupported: s = "operation not permitted when stream is capturing"; break;
    case cudaErrorStreamCaptureInvalidated: s = "operation failed due to a previous error during capture"; break;
    default: s = "unknown error"; break;
    }
    if (e != error_detail_code || error_detail.empty()) return s;
    /* the emulator knows why a launch failed: say it */
    static thread_local std::string with_detail;
    with_detail = std::string(s) + " (CUDA emulator: " + error_detail + ")";
    return with_detail.c_str();
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    *ptr = nullptr;
    const size_t rounded = (bytes + 255) & ~(size_t)255;   /* what the accounting counts */
#ifdef PQEMU_ASAN
    const size_t held = bytes ? bytes : 1;   /* exact: AddressSanitizer catches a kernel reading past the end */
#else
    const size_t held = rounded ? rounded : 256;
#endif
    {
        std::lock_guard<std::mutex> hold(mem_lock);
        if (rounded > TOTAL_MEMORY - allocated) return set_error(cudaErrorMemoryAllocation);
    }
    void *p = nullptr;
    if (posix_memalign(&p, 256, held) != 0) return set_error(cudaErrorMemoryAllocation);
    memset(p, 0xff, held);   /* device memory starts as garbage: never as convenient zeros */
    std::lock_guard<std::mutex> hold(mem_lock);
    device_allocs[(uintptr_t)p] = bytes;
    allocated += rounded;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    {
        std::lock_guard<std::mutex> hold(mem_lock);
        auto it = device_allocs.find((uintptr_t)ptr);
        if (it == device_allocs.end()) return set_error(cudaErrorInvalidValue);
        allocated -= (it->second + 255) & ~(size_t)255;
        device_allocs.erase(it);
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes) {
    *ptr = aligned_alloc(4096, ((bytes ? bytes : 1) + 4095) & ~(size_t)4095);
    if (!*ptr) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> hold(mem_lock);
    host_allocs[(uintptr_t)*ptr] = bytes;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    {
        std::lock_guard<std::mutex> hold(mem_lock);
        if (!host_allocs.erase((uintptr_t)ptr)) return set_error(cudaErrorInvalidValue);
    }
    free(ptr);
    return cudaSuccess;
}

/* copies happen at once: a launch has finished by the time it returns, so stream order holds */
/* a capturing stream refuses the call, and the capture is invalidated */
cudaError_t refuse_in_capture(cudaStream_t stream) {
    if (!stream || !stream->capturing) return cudaSuccess;
    stream->capture_error = cudaErrorStreamCaptureInvalidated;
    return set_error(cudaErrorStreamCaptureUnsupported);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    if (refuse_in_capture(stream)) return cudaErrorStreamCaptureUnsupported;
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return set_error(cudaErrorInvalidValue);
    if (bytes && ((dst_dev && !device_range(dst, bytes)) || (src_dev && !device_range(src, bytes))))
        return set_error(cudaErrorInvalidValue);   /* outside every allocation: a bug in the caller */
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream) {
    if (refuse_in_capture(stream)) return cudaErrorStreamCaptureUnsupported;
    if (bytes && !device_range(ptr, bytes)) return set_error(cudaErrorInvalidValue);
    if (bytes) memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned) {
    *stream = new CUstream_st{cudaSuccess, false, cudaSuccess, {}};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (refuse_in_capture(stream)) return cudaErrorStreamCaptureUnsupported;
    if (!stream) stream = &default_stream;
    const cudaError_t e = stream->pending;
    stream->pending = cudaSuccess;
    return set_error(e);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
    if (!stream || stream->capturing) return set_error(cudaErrorInvalidValue);   /* not the legacy stream */
    stream->capturing = true;
    stream->capture_error = cudaSuccess;
    stream->recorded.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    if (!stream || !stream->capturing) return set_error(cudaErrorInvalidValue);
    stream->capturing = false;
    *graph = nullptr;
    if (stream->capture_error != cudaSuccess) {
        stream->recorded.clear();
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    *graph = new CUgraph_st{std::move(stream->recorded)};
    stream->recorded.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
    if (!graph) return set_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{graph->launches};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return set_error(cudaErrorInvalidValue);
    if (refuse_in_capture(stream)) return cudaErrorStreamCaptureUnsupported;
    for (auto &launch : exec->launches) launch();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    *event = new CUevent_st{{}, false};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

/* work on a stream is done when it returns, so an event takes the time it is recorded */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
    event->at = std::chrono::steady_clock::now();
    event->recorded = true;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return event->recorded ? cudaSuccess : set_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start->recorded || !end->recorded) return set_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
    return cudaSuccess;
}

/* ---- the emulator's own controls (pyllm_cuda_emu.h) ---- */

extern "C" {

int pyllm_cuda_emu_set_order(int which, uint64_t seed) {
    if (which < PYLLM_CUDA_EMU_ORDER_FORWARD || which > PYLLM_CUDA_EMU_ORDER_SHUFFLE) return -1;
    std::lock_guard<std::mutex> hold(launch_lock);
    order.order = which;
    order.seed = seed;
    return 0;
}

int pyllm_cuda_emu_get_order(uint64_t *seed) {
    std::lock_guard<std::mutex> hold(launch_lock);
    if (order.order < 0) read_order_env();
    if (seed) *seed = order.seed;
    return order.order;
}

void pyllm_cuda_emu_stats(uint64_t *launches, uint64_t *blocks, uint64_t *resumes) {
    std::lock_guard<std::mutex> hold(launch_lock);
    *launches = stats.launches;
    *blocks = stats.blocks;
    *resumes = stats.resumes;
}

void pyllm_cuda_emu_f32_to_f16(const float *x, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = __half_as_ushort(__float2half_rn(x[i]));
}

void pyllm_cuda_emu_f16_to_f32(const uint16_t *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = __half2float(__ushort_as_half(x[i]));
}

}  /* extern "C" */
