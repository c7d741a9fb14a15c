// A CPU stand-in for libcuda.so, for tests only: device pointers are host
// addresses, every call but an asynchronous host copy completes before it
// returns (those wait for the stream's next operation: see below), and
// cuLaunchKernel runs the kernel's own C++
// (kernels/*.cu built against runtime.h) block by block, each block's
// threads as fibers (first to last and last to first in alternation).
// Strictness where it is cheap: every allocation ends at
// a guard page and starts filled with 0xff bytes (NaN for floats), copies
// must stay inside one allocation, a module only gives the kernels its
// image names, and a launch fails on a deadlock or an incomplete warp.
//
// Memory pools: by default the device says it has them (attribute 115 is
// 1, as on an H200), so cudarc allocates with cuMemAllocAsync and frees
// with cuMemFreeAsync. FG_EMU_POOLS, read at the first allocation or
// attribute query, changes that:
//   FG_EMU_POOLS=0     attribute 115 is 0: cudarc uses cuMemAlloc/cuMemFree;
//   FG_EMU_POOLS=fail  attribute 115 is 1, but cuMemAllocAsync returns
//                      CUDA_ERROR_NOT_SUPPORTED (801), as a driver whose
//                      pools are turned off does.
// Either free function frees a pointer from either allocation function.
// fg_emu_stats(&async_allocs, &sync_allocs) reports how many allocations
// each function has made so far (successful ones only), so a test can
// tell which path ran.
#include "runtime.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
enum : int {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    INVALID_IMAGE = 200,
    NO_BINARY_FOR_GPU = 209,
    NOT_FOUND = 500,
    LAUNCH_FAILED = 719,
    NOT_SUPPORTED = 801,
};

namespace {

// ---- kernels ---------------------------------------------------------------
struct Entry {
    void *fn;
    fg_emu_invoker invoke;
};
std::map<std::string, Entry> &registry() {
    static std::map<std::string, Entry> r;
    return r;
}

// ---- memory ----------------------------------------------------------------
const size_t PAGE = 4096;
struct Region {
    char *map;
    size_t map_len, len;
};
std::mutex mem_mu;
std::map<uintptr_t, Region> regions;  // by start address

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// FG_EMU_POOLS, read once: whether the device reports memory pools, and
// whether cuMemAllocAsync then refuses.
enum class Pools { ON, OFF, FAIL };
Pools pools() {
    static const Pools p = [] {
        const char *v = std::getenv("FG_EMU_POOLS");
        if (!v || !*v || !std::strcmp(v, "1")) return Pools::ON;
        if (!std::strcmp(v, "0")) return Pools::OFF;
        if (!std::strcmp(v, "fail")) return Pools::FAIL;
        std::fprintf(stderr, "cuda-emu: FG_EMU_POOLS=%s is not 0, 1 or fail; using 1\n", v);
        return Pools::ON;
    }();
    return p;
}
std::atomic<unsigned long long> async_allocs{0}, sync_allocs{0};

// Whether [p, p + n) lies inside one allocation.
bool inside(uintptr_t p, size_t n) {
    std::lock_guard<std::mutex> l(mem_mu);
    auto it = regions.upper_bound(p);
    if (it == regions.begin()) return false;
    --it;
    return p + n <= it->first + it->second.len;
}

bool report(const char *what) {
    std::fprintf(stderr, "cuda-emu: %s\n", what);
    return false;
}

// Host memory is any address that is not an allocation of ours.
bool device_range(CUdeviceptr p, size_t n, const char *op) {
    if (n == 0 || inside((uintptr_t)p, n)) return true;
    char m[200];
    std::snprintf(m, sizeof m, "%s: [%#llx, +%zu) is not inside one allocation", op, p, n);
    return report(m);
}

// ---- fibers ------------------------------------------------------------------
const size_t STACK = 256 << 10;
enum State { READY, WAITING, DONE };
struct Fiber {
    ucontext_t ctx;
    char *stack = nullptr;
    State state = DONE;
};
struct Barrier {
    int needed = -1;  // -1: no arrivals yet; 0: all live threads
    std::vector<int> waiters;
};

std::mutex launch_mu;
Fiber fibers[1024];
ucontext_t scheduler;
int cur, nthreads, live;
unsigned launches;  // kernels launched so far
Barrier bars[16];
Barrier warps[32];
const Entry *entry;
void **params;
std::string failure;

void fail(const std::string &m) {
    if (failure.empty()) failure = m;
}

// Leaves the current fiber; with `failure` set it is never resumed.
void park() { swapcontext(&fibers[cur].ctx, &scheduler); }

int warp_lanes(int w) {
    int n = nthreads - w * 32;
    return n < 32 ? n : 32;
}

// Releases `b` when everyone it waits for has arrived.
void try_release(Barrier &b, int needed) {
    if ((int)b.waiters.size() < needed) return;
    for (int t : b.waiters) fibers[t].state = READY;
    b.waiters.clear();
    b.needed = -1;
}

void arrive(Barrier &b, int needed) {
    b.waiters.push_back(cur);
    fibers[cur].state = WAITING;
    try_release(b, needed);
    if (fibers[cur].state == WAITING) park();
}

void fiber_main() {
    entry->invoke(entry->fn, params);
    fibers[cur].state = DONE;
    --live;
    Barrier &w = warps[cur >> 5];
    if (!w.waiters.empty()) fail("a lane returned while its warp waited in a warp operation");
    if (bars[0].needed == 0) try_release(bars[0], live);
    // Returning resumes the scheduler (uc_link).
}

void run_block() {
    live = nthreads;
    for (auto &b : bars) b = Barrier();
    for (auto &w : warps) w = Barrier();
    for (int t = 0; t < nthreads; ++t) {
        Fiber &f = fibers[t];
        if (!f.stack) {
            void *s = mmap(nullptr, STACK, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (s == MAP_FAILED) return fail("cannot map a fiber stack");
            f.stack = (char *)s;
        }
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &scheduler;
        makecontext(&f.ctx, fiber_main, 0);
        f.state = READY;
    }
    while (live > 0 && failure.empty()) {
        bool ran = false;
        for (int i = 0; i < nthreads && failure.empty(); ++i) {
            // Every other block, and block 0 of every other launch, runs its
            // threads last to first: a missing barrier shows from either side.
            int t = (blockIdx.x + launches) % 2 ? nthreads - 1 - i : i;
            if (fibers[t].state != READY) continue;
            cur = t;
            threadIdx.x = (unsigned)t;
            swapcontext(&scheduler, &fibers[t].ctx);
            ran = true;
        }
        if (!ran && failure.empty()) {
            int w = 0;
            for (int t = 0; t < nthreads; ++t) w += fibers[t].state == WAITING;
            fail("deadlock: " + std::to_string(w) + " of " + std::to_string(nthreads) +
                 " threads wait at a barrier nobody completes");
        }
    }
}

}  // namespace

// ---- runtime.h's hooks -----------------------------------------------------------
int fg_emu_register(const char *name, void *fn, fg_emu_invoker invoke) {
    registry()[name] = Entry{fn, invoke};
    return 1;
}

void fg_emu_fail(const char *what) {
    fail(what);
    park();
}

void fg_emu_bar(int id, int count) {
    if (id < 0 || id >= 16) return fg_emu_fail("bar.sync with an id outside 0..15");
    if (count % 32 != 0 || count < 0 || count > nthreads)
        return fg_emu_fail("bar.sync with a thread count that is not a multiple of 32 "
                           "within the block");
    Barrier &b = bars[id];
    if (b.needed >= 0 && b.needed != count)
        return fg_emu_fail("threads meet at one barrier with different counts");
    b.needed = count;
    arrive(b, count == 0 ? live : count);
}

void fg_emu_warp() {
    int w = cur >> 5, lanes = warp_lanes(w);
    for (int l = 0; l < lanes; ++l)
        if (fibers[w * 32 + l].state == DONE)
            return fg_emu_fail("a warp operation after a lane of the warp returned");
    arrive(warps[w], lanes);
}

// ---- asynchronous host copies ----------------------------------------------------
// cuMemcpyHtoDAsync and cuMemcpyDtoHAsync are queued and run at the stream's
// next operation or synchronization, as a GPU may run them after the call
// returns. An upload reads its host buffer then: a buffer changed or freed
// before that fails the call that runs it. A download's host buffer is
// written only when the stream is synchronized (or its next operation
// runs), so a host that reads it before then reads stale bytes.
namespace {
struct Pending {
    bool htod;
    uintptr_t dev;
    void *host;
    size_t n;
    unsigned long long sum;
};
std::mutex queue_mu;
std::vector<Pending> queued;

unsigned long long checksum(const void *p, size_t n) {
    unsigned long long h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

// Runs every queued copy in order; an upload whose buffer changed fails.
// The lock is held until the copies are done: a thread whose flush finds the
// queue empty must not run ahead of copies another thread is still making.
CUresult flush() {
    std::lock_guard<std::mutex> l(queue_mu);
    std::vector<Pending> q;
    q.swap(queued);
    CUresult r = OK;
    for (const Pending &c : q) {
        if (!c.htod) {
            std::memcpy(c.host, (const void *)c.dev, c.n);
        } else if (checksum(c.host, c.n) != c.sum) {
            report("cuMemcpyHtoDAsync: the host buffer changed or was freed before the copy ran");
            r = INVALID_VALUE;
        } else {
            std::memcpy((void *)c.dev, c.host, c.n);
        }
    }
    return r;
}

void enqueue(bool htod, uintptr_t dev, void *host, size_t n) {
    std::lock_guard<std::mutex> l(queue_mu);
    queued.push_back(Pending{htod, dev, host, n, htod ? checksum(host, n) : 0});
}
}  // namespace

// For the emulated cuBLAS: queued copies run before a product reads memory.
extern "C" int fg_emu_flush() { return flush(); }

// ---- the driver API ----------------------------------------------------------------
extern "C" {

static int dummy_handle;
static void *const HANDLE = &dummy_handle;

CUresult cuInit(unsigned) { return OK; }
CUresult cuDriverGetVersion(int *v) { return *v = 13000, OK; }
CUresult cuDeviceGetCount(int *n) { return *n = 1, OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { return ordinal == 0 ? (*d = 0, OK) : INVALID_VALUE; }
CUresult cuDeviceGetName(char *name, int len, CUdevice) {
    std::snprintf(name, (size_t)len, "fusegrad CPU emulation (tests/cuda_emu)");
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice) { return *b = (size_t)16 << 30, OK; }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    *free = *total = (size_t)16 << 30;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice) {
    switch (attr) {
    case 1: *v = 1024; break;   // max threads per block
    case 8: *v = 49152; break;  // shared memory per block
    case 10: *v = 32; break;    // warp size
    case 16: *v = 132; break;   // multiprocessors
    case 41: *v = 1; break;     // unified addressing
    case 75: *v = 9; break;     // compute capability 9.0: NVRTC builds sm_90
    case 76: *v = 0; break;
    case 115: *v = pools() != Pools::OFF; break;  // memory pools (FG_EMU_POOLS)
    default: *v = 0;            // the rest: no
    }
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice) { return *ctx = HANDLE, OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return OK; }
CUresult cuCtxSetCurrent(void *) { return OK; }
CUresult cuCtxGetCurrent(void **ctx) { return *ctx = HANDLE, OK; }
CUresult cuCtxGetDevice(CUdevice *d) { return *d = 0, OK; }
CUresult cuCtxPushCurrent_v2(void *) { return OK; }
CUresult cuCtxPopCurrent_v2(void **ctx) { return *ctx = HANDLE, OK; }
CUresult cuCtxSynchronize() { return flush(); }
CUresult cuStreamCreate(void **s, unsigned) { return *s = HANDLE, OK; }
CUresult cuStreamCreateWithPriority(void **s, unsigned, int) { return *s = HANDLE, OK; }
CUresult cuStreamDestroy_v2(void *) { return OK; }
CUresult cuStreamSynchronize(void *) { return flush(); }
CUresult cuStreamQuery(void *) { return flush(); }
CUresult cuStreamWaitEvent(void *, void *, unsigned) { return flush(); }

// Events hold the time they were recorded at.
CUresult cuEventCreate(void **e, unsigned) { return *e = new double(0), OK; }
CUresult cuEventDestroy_v2(void *e) { return delete (double *)e, OK; }
CUresult cuEventRecord(void *e, void *) {
    if (CUresult r = flush()) return r;
    using namespace std::chrono;
    *(double *)e = duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
    return OK;
}
CUresult cuEventSynchronize(void *) { return flush(); }
CUresult cuEventQuery(void *) { return flush(); }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
    return *ms = (float)(*(double *)b - *(double *)a), OK;
}
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) { return cuEventElapsedTime(ms, a, b); }

// One allocation for either API function; `p` is set only on success.
static CUresult allocate(CUdeviceptr *p, size_t n) {
    size_t len = round_up(n ? n : 1, 16), data = round_up(len, PAGE);
    void *m = mmap(nullptr, data + PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return OUT_OF_MEMORY;
    char *base = (char *)m;
    mprotect(base + data, PAGE, PROT_NONE);
    char *start = base + data - len;  // 16-byte aligned, ends at the guard page
    std::memset(start, 0xff, len);
    std::lock_guard<std::mutex> l(mem_mu);
    regions[(uintptr_t)start] = Region{base, data + PAGE, n};
    *p = (CUdeviceptr)start;
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (CUresult r = flush()) return r;
    std::lock_guard<std::mutex> l(mem_mu);
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end()) return report("cuMemFree of an address never allocated"), INVALID_VALUE;
    munmap(it->second.map, it->second.map_len);
    regions.erase(it);
    return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    CUresult r = allocate(p, n);
    if (r == OK) ++sync_allocs;
    return r;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, void *) {
    if (pools() == Pools::FAIL) return NOT_SUPPORTED;
    CUresult r = allocate(p, n);
    if (r == OK) ++async_allocs;
    return r;
}
// Every call completes at once, so a stream-ordered free frees now.
CUresult cuMemFreeAsync(CUdeviceptr p, void *) { return cuMemFree_v2(p); }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned) {
    *p = std::malloc(n ? n : 1);
    return *p ? OK : OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) { return std::free(p), OK; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    if (CUresult r = flush()) return r;
    if (!device_range(d, n, "cuMemcpyHtoD")) return INVALID_VALUE;
    return std::memcpy((void *)d, h, n), OK;
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    if (CUresult r = flush()) return r;
    if (!device_range(d, n, "cuMemcpyDtoH")) return INVALID_VALUE;
    return std::memcpy(h, (const void *)d, n), OK;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    if (CUresult r = flush()) return r;
    if (!device_range(d, n, "cuMemcpyDtoD") || !device_range(s, n, "cuMemcpyDtoD"))
        return INVALID_VALUE;
    return std::memmove((void *)d, (const void *)s, n), OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *) {
    if (CUresult r = flush()) return r;
    if (!device_range(d, n, "cuMemcpyHtoDAsync")) return INVALID_VALUE;
    enqueue(true, (uintptr_t)d, (void *)h, n);
    return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *) {
    if (CUresult r = flush()) return r;
    if (!device_range(d, n, "cuMemcpyDtoHAsync")) return INVALID_VALUE;
    enqueue(false, (uintptr_t)d, h, n);
    return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *) {
    return cuMemcpyDtoD_v2(d, s, n);
}
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    if (CUresult r = flush()) return r;
    if (!device_range(d, n, "cuMemsetD8")) return INVALID_VALUE;
    return std::memset((void *)d, v, n), OK;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *) {
    return cuMemsetD8_v2(d, v, n);
}

// A module keeps the entry points its image names: a CUBIN's symbol
// names, or the `.entry NAME(` lines of a PTX text (NUL-terminated, as the
// driver reads it). A kernel is found only if the image names it.
// FG_EMU_REFUSE_CUBIN=1 makes every CUBIN refused as a driver refuses one
// built for another architecture or by a newer toolkit
// (CUDA_ERROR_NO_BINARY_FOR_GPU), so the PTX fallback runs.
struct Module {
    std::string image;
    bool ptx;
};
static bool refuse_cubin() {
    const char *v = std::getenv("FG_EMU_REFUSE_CUBIN");
    return v && std::strcmp(v, "1") == 0;
}
CUresult cuModuleLoadData(void **m, const void *image) {
    const unsigned char *p = (const unsigned char *)image;
    if (std::memcmp(p, "\x7f" "ELF", 4) == 0) {
        if (p[4] != 2)
            return report("cuModuleLoadData: the image is not a 64-bit ELF (CUBIN)"), INVALID_IMAGE;
        if (refuse_cubin()) return NO_BINARY_FOR_GPU;
        unsigned long long shoff;
        unsigned short shentsize, shnum;
        std::memcpy(&shoff, p + 0x28, 8);
        std::memcpy(&shentsize, p + 0x3a, 2);
        std::memcpy(&shnum, p + 0x3c, 2);
        *m = new Module{std::string((const char *)p, shoff + (size_t)shentsize * shnum), false};
        return OK;
    }
    std::string text((const char *)image);
    if (text.find(".version") == std::string::npos || text.find(".target sm_") == std::string::npos)
        return report("cuModuleLoadData: the image is neither a CUBIN nor PTX text"), INVALID_IMAGE;
    *m = new Module{text, true};
    return OK;
}
CUresult cuModuleUnload(void *m) { return delete (Module *)m, OK; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
    const Module &md = *(Module *)m;
    std::string key = md.ptx ? ".entry " + std::string(name) + "(" : std::string(name) + '\0';
    auto it = registry().find(name);
    if (md.image.find(key) == std::string::npos || it == registry().end()) return NOT_FOUND;
    *f = (void *)&*it;
    return OK;
}
CUresult cuFuncGetAttribute(int *v, int, void *) { return *v = 0, OK; }
CUresult cuFuncSetAttribute(void *, int, int) { return OK; }
CUresult cuFuncSetCacheConfig(void *, int) { return OK; }

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void *, void **args,
                        void **extra) {
    auto *e = (std::pair<const std::string, Entry> *)f;
    const char *bad = nullptr;
    if (gy != 1 || gz != 1 || by != 1 || bz != 1) bad = "a y or z dimension (the kernels use x only)";
    else if (gx < 1 || gx > 0x7fffffffu) bad = "a grid outside 1..2^31-1";
    else if (bx < 1 || bx > 1024) bad = "a block outside 1..1024";
    else if (smem != 0) bad = "dynamic shared memory (no kernel declares any)";
    else if (extra) bad = "the `extra` argument form";
    if (bad) {
        std::fprintf(stderr, "cuda-emu: %s launched with %s\n", e->first.c_str(), bad);
        return INVALID_VALUE;
    }
    if (CUresult r = flush()) return r;
    std::lock_guard<std::mutex> l(launch_mu);
    entry = &e->second;
    params = args;
    failure.clear();
    nthreads = (int)bx;
    blockDim.x = bx;
    gridDim.x = gx;
    for (unsigned b = 0; b < gx && failure.empty(); ++b) {
        blockIdx.x = b;
        run_block();
    }
    ++launches;
    if (!failure.empty()) {
        std::fprintf(stderr, "cuda-emu: %s<<<%u, %u>>> block %u thread %d: %s\n", e->first.c_str(),
                     gx, bx, blockIdx.x, cur, failure.c_str());
        return LAUNCH_FAILED;
    }
    return OK;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
    switch (r) {
    case OK: *s = "no error"; break;
    case INVALID_VALUE: *s = "invalid argument (see cuda-emu's line on stderr)"; break;
    case OUT_OF_MEMORY: *s = "out of memory"; break;
    case INVALID_IMAGE: *s = "device kernel image is invalid"; break;
    case NO_BINARY_FOR_GPU: *s = "no kernel image is available for execution on the device"; break;
    case NOT_FOUND: *s = "named symbol not found"; break;
    case LAUNCH_FAILED: *s = "unspecified launch failure (see cuda-emu's line on stderr)"; break;
    case NOT_SUPPORTED: *s = "operation not supported"; break;
    default: *s = "unknown error";
    }
    return OK;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
    switch (r) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
    case NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
    case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
    case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: *s = "CUDA_ERROR_UNKNOWN";
    }
    return OK;
}

// The emulation's own hook (no CUDA function): allocations made so far
// by cuMemAllocAsync and by cuMemAlloc (see FG_EMU_POOLS above).
void fg_emu_stats(unsigned long long *async_count, unsigned long long *sync_count) {
    if (async_count) *async_count = async_allocs.load();
    if (sync_count) *sync_count = sync_allocs.load();
}

}  // extern "C"
