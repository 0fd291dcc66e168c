#include "simt_runtime.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define WM_SIMT_ASAN 1
#endif

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "ptx_model.h"

namespace wm::simt {
namespace {

constexpr size_t kStackBytes = 256 << 10;  // a wgmma model call needs ~20 KiB

// threads that meet at an instruction: a warp, a warpgroup or the CTA
struct Group {
  int size = 0;
  int arrived = 0;
  uint64_t gen = 0;          // completed meetings
  const char* what = "";     // the instruction of the meeting in progress
  std::string name;          // "warp 3", for messages
};

struct Copy {
  uint32_t dst = 0;
  const uint8_t* src = nullptr;
  bool valid = false;
};

// A fiber's saved context. On x86-64 a switch saves the callee-saved
// registers on the fiber's stack and swaps stack pointers (no system call;
// ucontext's swapcontext changes the signal mask on every switch and was
// most of the emulator's time); elsewhere ucontext.
#if defined(__x86_64__)
extern "C" void wm_simt_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl wm_simt_switch
.type wm_simt_switch,@function
wm_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size wm_simt_switch, .-wm_simt_switch
)");
struct Context {
  void* sp = nullptr;
};
void switch_context(Context* save, Context* load) { wm_simt_switch(&save->sp, load->sp); }
// a fresh context that enters entry() on the stack [base, base + bytes) as if called
void make_context(Context* c, char* base, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(base + bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                                // entry's return address: it never returns
  *--sp = reinterpret_cast<void*>(entry);         // where wm_simt_switch's ret goes
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12-r15
  c->sp = sp;
}
#else
struct Context {
  ucontext_t uc{};
};
void switch_context(Context* save, Context* load) { swapcontext(&save->uc, &load->uc); }
void make_context(Context* c, char* base, size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = base;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // kStackBytes, from the stack pool
  uint3 tid{};
  int linear = 0;  // x fastest
  bool done = false;
  Group* waiting = nullptr;  // the meeting it waits in, if any
  uint64_t wait_gen = 0;
  std::vector<uint32_t> unfenced;            // chunks its copies landed in since its last fence.proxy.async
  bool wgmma_fenced = false;                 // a wgmma.fence since its last wgmma.wait_group
  std::vector<Copy> open_copies;             // cp.async since the last commit
  std::deque<std::vector<Copy>> copy_groups;  // committed, not landed, oldest first
};

// per-lane inputs and outputs of the warp-wide instructions
struct WarpSlots {
  uint32_t addr[32];
  uint32_t a[32][4], b0[32], b1[32];
  float c[32][4];
  unsigned mask[32];
  int lane_mask[32];
  float value[32];
  uint32_t out_r[32][4];
  float out_c[32][4];
  float out_value[32];
};

struct WgmmaOp {
  int n_cols = 0;
  uint64_t desc = 0;
  bool trans_b = false;
  bool accumulate = true;
  bool a_smem = false;  // A from shared memory (a_desc), not from registers (a)
  uint64_t a_desc = 0;
  float* d[128] = {};
  const uint32_t* a[128] = {};
};

struct Warpgroup {
  int n_cols[128];
  uint64_t desc[128];
  bool trans_b[128];
  bool accumulate[128];
  bool a_smem[128];
  uint64_t a_desc[128];
  float* d[128];
  const uint32_t* a[128];
  int regs[128];  // setmaxnreg's value per thread
  std::vector<WgmmaOp> uncommitted;
  std::deque<std::vector<WgmmaOp>> committed;  // oldest first
};

// a tensor map as tensor_map_encode_tiled stores it in the 128 opaque bytes
struct TensorMap {
  static constexpr uint64_t kMagic = 0x3130504d414d5457ull;  // "WTMAMP01"
  uint64_t magic = 0;
  const uint8_t* base = nullptr;
  uint32_t rank = 0, elem_bytes = 0, swizzle_bytes = 0;  // swizzle 0: none, else 32, 64 or 128
  uint64_t dims[5] = {}, strides[5] = {};  // strides in bytes, strides[0] = elem_bytes
  uint16_t box[5] = {};
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "the emulator's encoding fits the opaque bytes");

struct TmaCopy {
  uint32_t dst = 0, bytes = 0;
  TensorMap map;
  int32_t coords[5] = {};
};

struct MBarrier {
  int count = 0;      // arrivals per phase
  int pending = 0;    // arrivals this phase still waits for
  int64_t tx = 0;     // bytes announced by expect_tx and not yet landed
  uint64_t phase = 0;  // completed phases
  int init_thread = -1;
  uint64_t init_sync = 0;     // the CTA's __syncthreads count at init
  Group done;                 // gen: completed phases, for the threads that wait
  std::vector<TmaCopy> copies;  // issued this phase, not landed
};

struct Cta {
  LaunchConfig cfg;
  uint3 block{};
  std::vector<uint8_t> smem;      // shared addresses [0, smem_base + dynamic_smem)
  std::vector<uint16_t> pending;  // cp.async in flight per 16-byte chunk of shared memory
  std::vector<uint8_t> written;   // per 16-byte chunk: a copy has landed in it since the CTA started
  std::vector<int32_t> generic_writer;  // per chunk: the thread whose copy landed there, until it fences (-1)
  std::vector<Fiber>* fibers = nullptr;
  std::vector<Group> warps, warpgroups;
  Group cta;
  std::array<Group, 16> named;  // bar.sync / bar.arrive 1..15 (0 is __syncthreads)
  std::map<uint32_t, MBarrier> mbarriers;  // by shared address
  std::vector<WarpSlots> warp_slots;
  std::vector<Warpgroup> wg;
  std::string error;
};

Cta* g_cta = nullptr;
Fiber* g_cur = nullptr;
Context g_scheduler;
const std::function<void()>* g_body = nullptr;
std::vector<std::pair<const uint8_t*, size_t>> g_globals;

int linear_tid() { return g_cur->linear; }
int lane() { return linear_tid() & 31; }
int warp() { return linear_tid() >> 5; }

std::string where() {
  std::ostringstream s;
  s << "block (" << g_cta->block.x << ", " << g_cta->block.y << ") thread " << linear_tid() << ": ";
  return s.str();
}

// AddressSanitizer (a build with -fsanitize=address checks every kernel's
// global memory accesses) must be told whenever the stack changes
#if WM_SIMT_ASAN
const void* g_scheduler_stack = nullptr;
size_t g_scheduler_stack_bytes = 0;
#endif

// scheduler -> fiber f
void enter_fiber(Fiber* f) {
#if WM_SIMT_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->stack, kStackBytes);
#endif
  switch_context(&g_scheduler, &f->ctx);
#if WM_SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// the running fiber -> scheduler; a finished fiber never comes back
void yield_to_scheduler() {
#if WM_SIMT_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(g_cur->done ? nullptr : &fake, g_scheduler_stack, g_scheduler_stack_bytes);
#endif
  switch_context(&g_cur->ctx, &g_scheduler);
#if WM_SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, &g_scheduler_stack, &g_scheduler_stack_bytes);
#endif
}

// fiber stacks, kept across launches (allocating and faulting in 256 KiB per
// thread per launch cost more than the kernels)
char* fiber_stack(size_t index) {
  static std::vector<std::unique_ptr<char[]>>* pool = new std::vector<std::unique_ptr<char[]>>();
  while (pool->size() <= index) pool->emplace_back(new char[kStackBytes]);
  return (*pool)[index].get();
}

// waits until all of g's threads arrive at `what`; the last one to arrive
// runs on_complete before anyone goes on
template <class F>
void meet(Group& g, const char* what, F&& on_complete) {
  if (g.arrived == 0) {
    g.what = what;
  } else if (std::strcmp(g.what, what) != 0) {
    fail(g.name + ": threads at different instructions (" + g.what + " and " + what + ")");
  }
  if (++g.arrived == g.size) {
    on_complete();
    g.arrived = 0;
    ++g.gen;
    return;
  }
  g_cur->waiting = &g;
  g_cur->wait_gen = g.gen;
  yield_to_scheduler();
  g_cur->waiting = nullptr;
}

void meet(Group& g, const char* what) {
  meet(g, what, [] {});
}

size_t smem_end() { return g_cta->smem.size(); }

void check_not_barrier(uint32_t addr, uint32_t bytes, const char* what);  // with the mbarriers below

void check_shared(uint32_t addr, uint32_t bytes, const char* what) {
  const uint32_t base = g_cta->cfg.smem_base;
  if (addr < base || addr + bytes > smem_end()) {
    std::ostringstream s;
    s << what << " at shared address " << addr << " (+" << bytes << ") is outside the dynamic shared memory ["
      << base << ", " << smem_end() << ")";
    fail(where() + s.str());
  }
}

// a read of shared memory: inside the launch's, and no copy still in flight to it
void check_read(uint32_t addr, uint32_t bytes, const char* what) {
  check_shared(addr, bytes, what);
  for (uint32_t c = addr / 16; c <= (addr + bytes - 1) / 16; ++c)
    if (g_cta->pending[c] != 0) {
      std::ostringstream s;
      s << what << " reads shared address " << addr << " while a cp.async or tensor copy to it has not landed (no "
        << "wait or no barrier between the copy and the read)";
      fail(where() + s.str());
    }
  for (uint32_t c = addr / 16; c <= (addr + bytes - 1) / 16; ++c)
    if (g_cta->written[c] == 0) {
      std::ostringstream s;
      s << what << " reads shared address " << addr << ", which nothing has written yet (a copy not issued, "
        << "or issued by a thread that has not reached it: a missing barrier)";
      fail(where() + s.str());
    }
}

void land(const Copy& c) {
  uint8_t* dst = g_cta->smem.data() + c.dst;
  if (c.valid) {
    std::memcpy(dst, c.src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
  --g_cta->pending[c.dst / 16];
  g_cta->written[c.dst / 16] = 1;
  g_cta->generic_writer[c.dst / 16] = linear_tid();
  g_cur->unfenced.push_back(c.dst / 16);
}

// a warpgroup is four warps from a multiple of 4: a CTA may end in a partial
// one (a producer warp), whose threads must not execute warpgroup instructions
Warpgroup& my_warpgroup(const char* what) {
  const auto w = static_cast<size_t>(linear_tid() / 128);
  if (w >= g_cta->wg.size()) fail(where() + what + " needs a whole warpgroup of 128 threads");
  return g_cta->wg[w];
}

void run_wgmma(const WgmmaOp& op) {
  const uint8_t* smem = g_cta->smem.data();
  // an operand's (k, n) (A: (k, m), K-major) in shared memory, read as wgmma reads it
  auto operand = [&](uint64_t desc, bool mn_major, const char* what) {
    return [&, desc, mn_major, what](int k, int n) {
      const uint32_t addr = ptx_model::wgmma_b_address(desc, mn_major, k, n);
      check_read(addr, 2, what);
      // wgmma reads through the async proxy: what cp.async wrote (the generic
      // proxy) is visible to it only after the writer's fence.proxy.async
      if (const int32_t w = g_cta->generic_writer[addr / 16]; w >= 0)
        fail(where() + "wgmma reads shared address " + std::to_string(addr) + ", written by thread " +
             std::to_string(w) + "'s cp.async, which has not executed fence.proxy.async since");
      return addr;
    };
  };
  const auto b = operand(op.desc, op.trans_b, "wgmma B operand");
  if (op.a_smem) {
    ptx_model::wgmma_m64nNk16_ss(op.n_cols, op.accumulate, op.d, smem, operand(op.a_desc, false, "wgmma A operand"), b);
  } else {
    ptx_model::wgmma_m64nNk16(op.n_cols, op.accumulate, op.d, op.a, smem, b);
  }
}

[[noreturn]] void fiber_entry() {
#if WM_SIMT_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_stack, &g_scheduler_stack_bytes);
#endif
  (*g_body)();
  if (!g_cur->open_copies.empty()) fail(where() + "cp.async copies never committed");
  for (const auto& group : g_cur->copy_groups)
    if (!group.empty()) fail(where() + "exits with cp.async copies that no wait covered");
  g_cur->done = true;
  yield_to_scheduler();
  std::abort();  // a finished fiber is never resumed
}

bool runnable(const Fiber& f) { return !f.done && (f.waiting == nullptr || f.waiting->gen != f.wait_gen); }

Fiber* pick(std::vector<Fiber>& fibers, Schedule schedule, size_t* cursor) {
  const size_t n = fibers.size();
  if (schedule == Schedule::kRoundRobin) {
    for (size_t i = 1; i <= n; ++i) {
      const size_t at = (*cursor + i) % n;
      if (runnable(fibers[at])) {
        *cursor = at;
        return &fibers[at];
      }
    }
    return nullptr;
  }
  const size_t warps = (n + 31) / 32;
  for (size_t w = 0; w < warps; ++w) {
    const size_t warp_index = schedule == Schedule::kWarpsInOrder ? w : warps - 1 - w;
    for (size_t l = 0; l < 32 && warp_index * 32 + l < n; ++l)
      if (runnable(fibers[warp_index * 32 + l])) return &fibers[warp_index * 32 + l];
  }
  return nullptr;
}

std::string describe_deadlock(const std::vector<Fiber>& fibers) {
  std::ostringstream s;
  s << "block (" << g_cta->block.x << ", " << g_cta->block.y << "): deadlock:";
  int shown = 0;
  for (const Fiber& f : fibers) {
    if (f.done || shown >= 4) continue;
    s << " thread " << f.linear << " waits in " << (f.waiting ? f.waiting->name : "?") << " at "
      << (f.waiting ? f.waiting->what : "?") << " (" << (f.waiting ? f.waiting->arrived : 0) << " of "
      << (f.waiting ? f.waiting->size : 0) << " arrived);";
    ++shown;
  }
  size_t done = 0;
  for (const Fiber& f : fibers) done += f.done ? 1 : 0;
  s << " " << done << " threads have exited";
  return s.str();
}

std::string run_cta(Cta& cta, std::vector<Fiber>& fibers) {
  g_cta = &cta;
  const unsigned n = cta.cfg.block.x * cta.cfg.block.y * cta.cfg.block.z;
  cta.warps.assign((n + 31) / 32, Group{});
  for (size_t w = 0; w < cta.warps.size(); ++w) {
    cta.warps[w].size = static_cast<int>(std::min<unsigned>(32, n - 32 * static_cast<unsigned>(w)));
    cta.warps[w].name = "warp " + std::to_string(w);
  }
  cta.warpgroups.assign(n / 128, Group{});
  for (size_t w = 0; w < cta.warpgroups.size(); ++w) {
    cta.warpgroups[w].size = 128;
    cta.warpgroups[w].name = "warpgroup " + std::to_string(w);
  }
  cta.cta = Group{};
  cta.cta.size = static_cast<int>(n);
  cta.cta.name = "the CTA";
  for (size_t b = 0; b < cta.named.size(); ++b) {
    cta.named[b] = Group{};
    cta.named[b].name = "named barrier " + std::to_string(b);
  }
  cta.mbarriers.clear();
  cta.warp_slots.assign(cta.warps.size(), WarpSlots{});
  cta.wg.assign(cta.warpgroups.size(), Warpgroup{});
  std::fill(cta.smem.begin(), cta.smem.end(), 0xff);
  std::fill(cta.pending.begin(), cta.pending.end(), 0);
  std::fill(cta.written.begin(), cta.written.end(), 0);
  std::fill(cta.generic_writer.begin(), cta.generic_writer.end(), -1);
  cta.error.clear();
  cta.fibers = &fibers;

  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = fibers[t];
    const unsigned bx = cta.cfg.block.x, by = cta.cfg.block.y;
    f.tid = uint3{t % bx, (t / bx) % by, t / (bx * by)};
    f.linear = static_cast<int>(t);
    f.done = false;
    f.waiting = nullptr;
    f.open_copies.clear();
    f.copy_groups.clear();
    f.unfenced.clear();
    f.wgmma_fenced = false;
#if WM_SIMT_ASAN
    // the last fiber on this stack never returned: its frames' red zones are still marked
    __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
    make_context(&f.ctx, f.stack, kStackBytes, fiber_entry);
  }
  size_t cursor = n - 1;
  for (;;) {
    Fiber* next = pick(fibers, cta.cfg.schedule, &cursor);
    if (next == nullptr) {
      bool all_done = true;
      for (const Fiber& f : fibers)
        if (!f.done) all_done = false;
      if (!all_done) return describe_deadlock(fibers);
      break;
    }
    g_cur = next;
    enter_fiber(next);
    g_cur = nullptr;
    if (!cta.error.empty()) return cta.error;
  }
  for (size_t w = 0; w < cta.wg.size(); ++w)
    if (!cta.wg[w].uncommitted.empty() || !cta.wg[w].committed.empty())
      return "warpgroup " + std::to_string(w) + " exits with a wgmma in flight";
  for (const auto& [addr, b] : cta.mbarriers) {
    if (!b.copies.empty())
      return "mbarrier at " + std::to_string(addr) + ": the CTA exits with " + std::to_string(b.copies.size()) +
             " tensor copies in flight";
    if (b.pending != b.count || b.tx != 0)
      return "mbarrier at " + std::to_string(addr) + ": the CTA exits in an unfinished phase (" +
             std::to_string(b.count - b.pending) + " of " + std::to_string(b.count) + " arrivals, " +
             std::to_string(b.tx) + " bytes announced and not landed)";
  }
  for (const Group& g : cta.named)
    if (g.arrived != 0)
      return g.name + ": " + std::to_string(g.arrived) + " of " + std::to_string(g.size) +
             " threads arrived when the CTA exited";
  return "";
}

}  // namespace

std::string launch(const LaunchConfig& config, const std::function<void()>& thread_body) {
  const unsigned threads = config.block.x * config.block.y * config.block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock) return "threads per CTA: 1 to 1024";
  if (config.smem_base % 16 != 0) return "smem_base must be 16-byte aligned";
  Cta cta;
  cta.cfg = config;
  const size_t smem_bytes = (config.smem_base + config.dynamic_smem + 15) / 16 * 16;
  cta.smem.assign(smem_bytes, 0xff);
  cta.pending.assign(smem_bytes / 16 + 1, 0);
  cta.written.assign(smem_bytes / 16 + 1, 0);
  cta.generic_writer.assign(smem_bytes / 16 + 1, -1);
  std::vector<Fiber> fibers(threads);
  for (size_t i = 0; i < fibers.size(); ++i) fibers[i].stack = fiber_stack(i);
  g_body = &thread_body;
  std::string error;
  // the reversed schedule also runs the CTAs last to first: a CTA that
  // writes another's outputs is then overwritten in one order or the other
  const bool reverse = config.schedule == Schedule::kWarpsReversed;
  const auto at = [reverse](unsigned i, unsigned n) { return reverse ? n - 1 - i : i; };
  for (unsigned z = 0; z < config.grid.z && error.empty(); ++z)
    for (unsigned y = 0; y < config.grid.y && error.empty(); ++y)
      for (unsigned x = 0; x < config.grid.x && error.empty(); ++x) {
        cta.block = uint3{at(x, config.grid.x), at(y, config.grid.y), at(z, config.grid.z)};
        error = run_cta(cta, fibers);
      }
  g_body = nullptr;
  g_cta = nullptr;
  return error;
}

void register_global(const void* data, size_t bytes) {
  g_globals.emplace_back(static_cast<const uint8_t*>(data), bytes);
}
void unregister_global(const void* data) {
  for (auto it = g_globals.begin(); it != g_globals.end(); ++it)
    if (it->first == data) {
      g_globals.erase(it);
      return;
    }
}
void clear_globals() { g_globals.clear(); }

uint3 thread_idx() { return g_cur->tid; }
uint3 block_idx() { return g_cta->block; }
uint3 block_dim() { return uint3{g_cta->cfg.block.x, g_cta->cfg.block.y, g_cta->cfg.block.z}; }
uint3 grid_dim() { return uint3{g_cta->cfg.grid.x, g_cta->cfg.grid.y, g_cta->cfg.grid.z}; }

void sync_threads() { meet(g_cta->cta, "__syncthreads"); }

// bar.sync (wait) / bar.arrive id, count: the barrier completes when count
// threads have reached it, whichever of the two instructions they executed;
// only bar.sync waits for that
void named_barrier(int id, int count, bool wait) {
  const int n = static_cast<int>(g_cta->cta.size);
  if (id < 1 || id > 15) fail("bar: barrier " + std::to_string(id) + " (1..15; 0 is __syncthreads)");
  if (count <= 0 || count % 32 != 0 || count > n)
    fail("bar: " + std::to_string(count) + " threads (a multiple of 32, at most the CTA's)");
  Group& g = g_cta->named[static_cast<size_t>(id)];
  if (g.arrived == 0) {
    g.size = count;
    g.what = "bar.sync/bar.arrive";
  } else if (g.size != count) {
    fail(g.name + ": threads name different counts (" + std::to_string(g.size) + " and " + std::to_string(count) +
         ")");
  }
  if (++g.arrived == g.size) {
    g.arrived = 0;
    ++g.gen;
    return;
  }
  if (!wait) return;
  g_cur->waiting = &g;
  g_cur->wait_gen = g.gen;
  yield_to_scheduler();
  g_cur->waiting = nullptr;
}

// the running thread's warp, for a warp-wide instruction: a CTA may end in a
// partial warp (its threads run plain code), whose lanes past the CTA do
// not exist, so such an instruction there is an error
static Group& whole_warp(const char* what) {
  Group& w = g_cta->warps[static_cast<size_t>(warp())];
  if (w.size != 32) fail(where() + what + " in a partial warp of " + std::to_string(w.size) + " threads");
  return w;
}

float shfl_xor(unsigned mask, float value, int lane_mask) {
  WarpSlots& s = g_cta->warp_slots[static_cast<size_t>(warp())];
  const int l = lane();
  s.mask[l] = mask;
  s.value[l] = value;
  s.lane_mask[l] = lane_mask;
  meet(whole_warp("shfl.sync.bfly"), "shfl.sync.bfly", [&] {
    for (int i = 0; i < 32; ++i) {
      if (s.mask[i] != 0xffffffffu || s.lane_mask[i] != s.lane_mask[0] || s.lane_mask[i] < 0 || s.lane_mask[i] > 31)
        fail(where() + "shfl.sync.bfly: only full-warp shuffles with one lane mask are modelled");
      s.out_value[i] = s.value[i ^ s.lane_mask[i]];
    }
  });
  return s.out_value[l];
}

float shfl_idx(unsigned mask, float value, int src_lane) {
  WarpSlots& s = g_cta->warp_slots[static_cast<size_t>(warp())];
  const int l = lane();
  s.mask[l] = mask;
  s.value[l] = value;
  s.lane_mask[l] = src_lane;
  meet(whole_warp("shfl.sync.idx"), "shfl.sync.idx", [&] {
    for (int i = 0; i < 32; ++i) {
      if (s.mask[i] != 0xffffffffu || s.lane_mask[i] < 0 || s.lane_mask[i] > 31)
        fail(where() + "shfl.sync.idx: only full-warp shuffles from a lane 0..31 are modelled");
      s.out_value[i] = s.value[s.lane_mask[i]];
    }
  });
  return s.out_value[l];
}

uint32_t shared_address(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  const uint8_t* lo = g_cta->smem.data();
  if (b < lo || b >= lo + g_cta->smem.size()) fail(where() + "a generic pointer that is not shared memory");
  return static_cast<uint32_t>(b - lo);
}

uint32_t dynamic_smem_base() { return g_cta->cfg.smem_base; }

void cp_async_16(uint32_t dst, const void* src, bool valid) {
  if (dst % 16 != 0) fail(where() + "cp.async destination not 16-byte aligned");
  check_shared(dst, 16, "cp.async");
  const auto* s = static_cast<const uint8_t*>(src);
  if (valid) {
    if (reinterpret_cast<uintptr_t>(s) % 16 != 0) fail(where() + "cp.async source not 16-byte aligned");
    bool inside = false;
    for (const auto& [base, bytes] : g_globals)
      if (s >= base && s + 16 <= base + bytes) inside = true;
    if (!inside) fail(where() + "cp.async reads global memory outside every buffer");
  }
  check_not_barrier(dst, 16, "cp.async");
  if (g_cta->pending[dst / 16] != 0) {
    fail(where() + "cp.async to shared address " + std::to_string(dst) + " while another copy to it is in flight");
  }
  ++g_cta->pending[dst / 16];
  g_cur->open_copies.push_back(Copy{dst, s, valid});
}

void st_shared_16(uint32_t dst, const void* src) {
  if (dst % 16 != 0) fail(where() + "st.shared.v4 destination not 16-byte aligned");
  check_shared(dst, 16, "st.shared");
  check_not_barrier(dst, 16, "st.shared");
  if (g_cta->pending[dst / 16] != 0)
    fail(where() + "st.shared to shared address " + std::to_string(dst) + " while a cp.async to it is in flight");
  std::memcpy(g_cta->smem.data() + dst, src, 16);
  g_cta->written[dst / 16] = 1;
  g_cta->generic_writer[dst / 16] = linear_tid();
  g_cur->unfenced.push_back(dst / 16);
}

void ld_shared_16(uint32_t src, void* dst) {
  if (src % 16 != 0) fail(where() + "ld.shared.v4 source not 16-byte aligned");
  check_read(src, 16, "ld.shared");
  std::memcpy(dst, g_cta->smem.data() + src, 16);
}

void cp_async_commit() {
  g_cur->copy_groups.push_back(std::move(g_cur->open_copies));
  g_cur->open_copies.clear();
}

void cp_async_wait(int newest_left) {
  while (g_cur->copy_groups.size() > static_cast<size_t>(newest_left)) {
    for (const Copy& c : g_cur->copy_groups.front()) land(c);
    g_cur->copy_groups.pop_front();
  }
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  WarpSlots& s = g_cta->warp_slots[static_cast<size_t>(warp())];
  const int l = lane();
  s.addr[l] = addr;
  meet(whole_warp(trans ? "ldmatrix.x4.trans" : "ldmatrix.x4"), trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", [&] {
    std::array<uint32_t, 32> rows{};
    for (int i = 0; i < 32; ++i) {
      if (s.addr[i] % 16 != 0) fail(where() + "ldmatrix row address not 16-byte aligned");
      check_read(s.addr[i], 16, "ldmatrix");
      rows[static_cast<size_t>(i)] = s.addr[i];
    }
    const ptx_model::Lanes4 got = ptx_model::ldmatrix_x4(g_cta->smem.data(), rows, trans);
    for (int i = 0; i < 32; ++i)
      for (int k = 0; k < 4; ++k) s.out_r[i][k] = got[static_cast<size_t>(i)][static_cast<size_t>(k)];
  });
  for (int k = 0; k < 4; ++k) r[k] = s.out_r[l][k];
}

void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  WarpSlots& s = g_cta->warp_slots[static_cast<size_t>(warp())];
  const int l = lane();
  for (int k = 0; k < 4; ++k) {
    s.a[l][k] = a[k];
    s.c[l][k] = c[k];
  }
  s.b0[l] = b0;
  s.b1[l] = b1;
  meet(whole_warp("mma.m16n8k16"), "mma.m16n8k16", [&] {
    ptx_model::Lanes4 la{};
    ptx_model::Lanes2 lb{};
    ptx_model::Acc acc{};
    for (size_t i = 0; i < 32; ++i) {
      for (size_t k = 0; k < 4; ++k) {
        la[i][k] = s.a[i][k];
        acc[i][k] = s.c[i][k];
      }
      lb[i] = {s.b0[i], s.b1[i]};
    }
    ptx_model::mma_16816(acc, la, lb);
    for (size_t i = 0; i < 32; ++i)
      for (size_t k = 0; k < 4; ++k) s.out_c[i][k] = acc[i][k];
  });
  for (int k = 0; k < 4; ++k) c[k] = s.out_c[l][k];
}

namespace {

// wgmma.mma_async, A from registers (a) or from shared memory (a_smem: a_desc)
void issue_wgmma(int n_cols, float* d, const uint32_t* a, bool a_smem, uint64_t a_desc, uint64_t desc, bool trans_b,
                 bool accumulate) {
  Warpgroup& wg = my_warpgroup("wgmma");
  const int t = linear_tid() % 128;
  wg.n_cols[t] = n_cols;
  wg.desc[t] = desc;
  wg.trans_b[t] = trans_b;
  wg.accumulate[t] = accumulate;
  wg.a_smem[t] = a_smem;
  wg.a_desc[t] = a_desc;
  wg.d[t] = d;
  wg.a[t] = a;
  meet(g_cta->warpgroups[static_cast<size_t>(linear_tid() / 128)], "wgmma.mma_async", [&] {
    WgmmaOp op;
    op.n_cols = wg.n_cols[0];
    op.desc = wg.desc[0];
    op.trans_b = wg.trans_b[0];
    op.accumulate = wg.accumulate[0];
    op.a_smem = wg.a_smem[0];
    op.a_desc = wg.a_desc[0];
    const size_t first = static_cast<size_t>(linear_tid() / 128 * 128);
    for (int i = 0; i < 128; ++i) {
      if (wg.n_cols[i] != op.n_cols || wg.desc[i] != op.desc || wg.trans_b[i] != op.trans_b ||
          wg.accumulate[i] != op.accumulate || wg.a_smem[i] != op.a_smem || wg.a_desc[i] != op.a_desc)
        fail(where() + "wgmma: the threads of a warpgroup pass different shapes, descriptors or scale-d");
      if (!(*g_cta->fibers)[first + static_cast<size_t>(i)].wgmma_fenced)
        fail(where() + "wgmma.mma_async without a wgmma.fence since the warpgroup's last wgmma.wait_group "
                       "(or before its first MMA): its registers may have been touched");
      op.d[i] = wg.d[i];
      op.a[i] = wg.a[i];
    }
    for (const uint64_t dsc : {op.desc, op.a_smem ? op.a_desc : op.desc}) {
      const ptx_model::Descriptor fields(dsc);
      if (fields.swizzle != 1 || fields.base_offset != 0)
        fail(where() + "wgmma: only the 128-byte swizzle with base offset 0 is modelled");
    }
    wg.uncommitted.push_back(op);
  });
}

}  // namespace

void wgmma(int n_cols, float* d, const uint32_t (&a)[4], uint64_t desc, bool trans_b, bool accumulate) {
  issue_wgmma(n_cols, d, a, false, 0, desc, trans_b, accumulate);
}

void wgmma_ss(int n_cols, float* d, uint64_t desc_a, uint64_t desc_b, bool trans_b, bool accumulate) {
  issue_wgmma(n_cols, d, nullptr, true, desc_a, desc_b, trans_b, accumulate);
}

void wgmma_commit() {
  Warpgroup& wg = my_warpgroup("wgmma.commit_group");
  meet(g_cta->warpgroups[static_cast<size_t>(linear_tid() / 128)], "wgmma.commit_group", [&] {
    wg.committed.push_back(std::move(wg.uncommitted));
    wg.uncommitted.clear();
  });
}

void wgmma_fence() {
  my_warpgroup("wgmma.fence");
  g_cur->wgmma_fenced = true;
}

void setmaxnreg(int regs, bool inc) {
  Warpgroup& wg = my_warpgroup("setmaxnreg");
  wg.regs[linear_tid() % 128] = regs;
  meet(g_cta->warpgroups[static_cast<size_t>(linear_tid() / 128)], inc ? "setmaxnreg.inc" : "setmaxnreg.dec", [&] {
    for (int i = 0; i < 128; ++i)
      if (wg.regs[i] != wg.regs[0]) fail(where() + "setmaxnreg: the threads of a warpgroup pass different counts");
  });
}

void fence_proxy_async() {
  for (uint32_t c : g_cur->unfenced)
    if (g_cta->generic_writer[c] == linear_tid()) g_cta->generic_writer[c] = -1;
  g_cur->unfenced.clear();
}

void wgmma_wait(int newest_left) {
  Warpgroup& wg = my_warpgroup("wgmma.wait_group");
  g_cur->wgmma_fenced = false;
  meet(g_cta->warpgroups[static_cast<size_t>(linear_tid() / 128)], "wgmma.wait_group", [&] {
    while (wg.committed.size() > static_cast<size_t>(newest_left)) {
      for (const WgmmaOp& op : wg.committed.front()) run_wgmma(op);
      wg.committed.pop_front();
    }
  });
}

// ---- mbarriers and TMA ----

namespace {

// a write of [addr, addr + bytes) must leave every mbarrier alone
void check_not_barrier(uint32_t addr, uint32_t bytes, const char* what) {
  for (const auto& [at, b] : g_cta->mbarriers)
    if (addr < at + 8 && at < addr + bytes)
      fail(where() + what + " writes shared address " + std::to_string(addr) + " (+" + std::to_string(bytes) +
           "), over the mbarrier at " + std::to_string(at));
}

MBarrier& mbarrier_at(uint32_t bar, const char* what) {
  if (bar % 8 != 0) fail(where() + what + ": mbarrier address " + std::to_string(bar) + " not 8-byte aligned");
  check_shared(bar, 8, what);
  auto it = g_cta->mbarriers.find(bar);
  if (it == g_cta->mbarriers.end())
    fail(where() + what + " on shared address " + std::to_string(bar) + ", where no mbarrier.init has run");
  MBarrier& b = it->second;
  if (b.init_thread != linear_tid() && g_cta->cta.gen <= b.init_sync)
    fail(where() + what + " on the mbarrier at " + std::to_string(bar) + ", which thread " +
         std::to_string(b.init_thread) + " initialised with no __syncthreads since (the init is not visible yet)");
  return b;
}

// f(row, inside, offset) for each row of a copy's box (every dimension but
// the innermost, in order): whether the row lies inside the tensor in those
// dimensions, and its byte offset from the tensor's base at element 0
template <class F>
void for_each_box_row(const TensorMap& m, const int32_t* coords, F&& f) {
  uint64_t n[5] = {1, 1, 1, 1, 1};
  for (uint32_t d = 1; d < m.rank; ++d) n[d] = m.box[d];
  uint64_t row = 0;
  for (uint64_t i4 = 0; i4 < n[4]; ++i4)
    for (uint64_t i3 = 0; i3 < n[3]; ++i3)
      for (uint64_t i2 = 0; i2 < n[2]; ++i2)
        for (uint64_t i1 = 0; i1 < n[1]; ++i1, ++row) {
          const uint64_t at[5] = {0, i1, i2, i3, i4};
          bool inside = true;
          uint64_t offset = 0;
          for (uint32_t d = 1; d < m.rank; ++d) {
            const int64_t g = static_cast<int64_t>(coords[d]) + static_cast<int64_t>(at[d]);
            if (g < 0 || g >= static_cast<int64_t>(m.dims[d])) inside = false;
            offset += static_cast<uint64_t>(g) * m.strides[d];
          }
          f(row, inside, offset);
        }
}

// the bytes of one tensor copy into shared memory, as the swizzle of its map lays them out
void land_tma(const TmaCopy& c) {
  const TensorMap& m = c.map;
  const uint32_t row_bytes = m.box[0] * m.elem_bytes;
  const uint32_t swizzle_bits = m.swizzle_bytes == 128 ? 3 : m.swizzle_bytes == 64 ? 2 : m.swizzle_bytes == 32 ? 1 : 0;
  uint8_t* smem = g_cta->smem.data();
  for_each_box_row(m, c.coords, [&](uint64_t row, bool inside, uint64_t offset) {
    for (uint32_t e = 0; e < m.box[0]; ++e) {
      const int64_t g0 = static_cast<int64_t>(c.coords[0]) + e;
      const bool ok = inside && g0 >= 0 && g0 < static_cast<int64_t>(m.dims[0]);
      uint32_t addr = c.dst + static_cast<uint32_t>(row * row_bytes + e * m.elem_bytes);
      addr ^= ((addr >> 7) & ((1u << swizzle_bits) - 1)) << 4;
      if (ok) {
        std::memcpy(smem + addr, m.base + offset + static_cast<uint64_t>(g0) * m.elem_bytes, m.elem_bytes);
      } else {
        std::memset(smem + addr, 0, m.elem_bytes);
      }
    }
  });
  for (uint32_t k = c.dst / 16; k < (c.dst + c.bytes) / 16; ++k) {
    --g_cta->pending[k];
    g_cta->written[k] = 1;
    g_cta->generic_writer[k] = -1;  // the async proxy wrote it: wgmma sees it with no fence
  }
}

// every arrival of the phase is in: its copies land (the latest they may), and once the bytes announced have
// landed the phase completes
void try_complete(uint32_t at, MBarrier& b) {
  if (b.pending != 0) return;
  for (const TmaCopy& c : b.copies) {
    land_tma(c);
    b.tx -= c.bytes;
  }
  b.copies.clear();
  if (b.tx < 0)
    fail(where() + "mbarrier at " + std::to_string(at) + ": the phase's tensor copies brought " +
         std::to_string(-b.tx) + " bytes more than expect_tx announced");
  if (b.tx > 0) return;  // copies still to come
  ++b.phase;
  b.pending = b.count;
  ++b.done.gen;
}

void arrive(uint32_t bar, uint32_t bytes, const char* what) {
  MBarrier& b = mbarrier_at(bar, what);
  if (b.pending == 0)
    fail(where() + what + " on the mbarrier at " + std::to_string(bar) + ": more than its " +
         std::to_string(b.count) + " arrivals in one phase");
  b.tx += bytes;
  --b.pending;
  try_complete(bar, b);
}

}  // namespace

void mbarrier_init(uint32_t bar, int count) {
  if (bar % 8 != 0) fail(where() + "mbarrier.init: address " + std::to_string(bar) + " not 8-byte aligned");
  check_shared(bar, 8, "mbarrier.init");
  if (count < 1 || count > (1 << 20) - 1) fail(where() + "mbarrier.init: count " + std::to_string(count));
  for (uint32_t k = bar / 16; k <= (bar + 7) / 16; ++k)
    if (g_cta->pending[k] != 0) fail(where() + "mbarrier.init over shared memory a copy is in flight to");
  auto it = g_cta->mbarriers.find(bar);
  if (it != g_cta->mbarriers.end() && !it->second.copies.empty())
    fail(where() + "mbarrier.init on the mbarrier at " + std::to_string(bar) + " while tensor copies wait on it");
  MBarrier& b = g_cta->mbarriers[bar];
  b = MBarrier{};
  b.count = b.pending = count;
  b.init_thread = linear_tid();
  b.init_sync = g_cta->cta.gen;
  b.done.name = "mbarrier at " + std::to_string(bar);
  b.done.what = "mbarrier.try_wait.parity";
}

void mbarrier_arrive(uint32_t bar) { arrive(bar, 0, "mbarrier.arrive"); }

void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  arrive(bar, bytes, "mbarrier.arrive.expect_tx");
}

void mbarrier_wait(uint32_t bar, uint32_t parity) {
  MBarrier& b = mbarrier_at(bar, "mbarrier.try_wait.parity");
  // the phase of that parity has completed when the current one has the other
  if ((b.phase & 1u) != (parity & 1u)) return;
  g_cur->waiting = &b.done;
  g_cur->wait_gen = b.done.gen;
  yield_to_scheduler();
  g_cur->waiting = nullptr;
}

void tma_load(uint32_t dst, const void* tensor_map, const int32_t* coords, int rank, uint32_t bar) {
  const char* what = "cp.async.bulk.tensor";
  if (reinterpret_cast<uintptr_t>(tensor_map) % 64 != 0) fail(where() + what + ": tensor map not 64-byte aligned");
  TmaCopy c;
  std::memcpy(&c.map, tensor_map, sizeof(TensorMap));
  const TensorMap& m = c.map;
  if (m.magic != TensorMap::kMagic) fail(where() + what + ": not a tensor map cuTensorMapEncodeTiled made");
  if (static_cast<uint32_t>(rank) != m.rank)
    fail(where() + what + ": a " + std::to_string(rank) + "-d copy with a tensor map of rank " +
         std::to_string(m.rank));
  if (dst % 128 != 0) fail(where() + what + ": shared destination " + std::to_string(dst) + " not 128-byte aligned");
  c.dst = dst;
  c.bytes = m.elem_bytes;
  for (uint32_t d = 0; d < m.rank; ++d) {
    c.coords[d] = coords[d];
    c.bytes *= m.box[d];
  }
  check_shared(dst, c.bytes, what);
  check_not_barrier(dst, c.bytes, what);
  for (uint32_t k = dst / 16; k < (dst + c.bytes) / 16; ++k)
    if (g_cta->pending[k] != 0)
      fail(where() + what + " to shared address " + std::to_string(k * 16) + " while another copy to it is in flight");
  // what it reads inside the tensor must be memory the test registered (rows checked whole)
  const int64_t lo0 = std::max<int64_t>(coords[0], 0);
  const int64_t hi0 = std::min<int64_t>(static_cast<int64_t>(coords[0]) + m.box[0], static_cast<int64_t>(m.dims[0]));
  for_each_box_row(m, c.coords, [&](uint64_t, bool inside, uint64_t offset) {
    if (!inside || lo0 >= hi0) return;
    const uint8_t* from = m.base + offset + static_cast<uint64_t>(lo0) * m.elem_bytes;
    const uint64_t bytes = static_cast<uint64_t>(hi0 - lo0) * m.elem_bytes;
    bool registered = false;
    for (const auto& [base, size] : g_globals)
      if (from >= base && from + bytes <= base + size) registered = true;
    if (!registered) fail(where() + what + " reads global memory outside every buffer");
  });
  for (uint32_t k = dst / 16; k < (dst + c.bytes) / 16; ++k) ++g_cta->pending[k];
  MBarrier& b = mbarrier_at(bar, what);
  b.copies.push_back(c);
  try_complete(bar, b);  // its phase may have all its arrivals already
}

CUresult tensor_map_encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                 const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                 const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
  if (map == nullptr || address == nullptr || rank < 1 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
  TensorMap m;
  m.magic = TensorMap::kMagic;
  m.base = static_cast<const uint8_t*>(address);
  m.rank = rank;
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
      m.elem_bytes = 1;
      break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
      m.elem_bytes = 2;
      break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
      m.elem_bytes = 4;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  switch (swizzle) {
    case CU_TENSOR_MAP_SWIZZLE_NONE:
      m.swizzle_bytes = 0;
      break;
    case CU_TENSOR_MAP_SWIZZLE_32B:
      m.swizzle_bytes = 32;
      break;
    case CU_TENSOR_MAP_SWIZZLE_64B:
      m.swizzle_bytes = 64;
      break;
    case CU_TENSOR_MAP_SWIZZLE_128B:
      m.swizzle_bytes = 128;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE || oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  if (reinterpret_cast<uintptr_t>(address) % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  m.strides[0] = m.elem_bytes;
  for (uint32_t d = 0; d < rank; ++d) {
    if (dims[d] == 0 || dims[d] > (uint64_t{1} << 32)) return CUDA_ERROR_INVALID_VALUE;
    if (box[d] == 0 || box[d] > 256 || element_strides[d] != 1) return CUDA_ERROR_INVALID_VALUE;
    m.dims[d] = dims[d];
    m.box[d] = static_cast<uint16_t>(box[d]);
    if (d > 0) {
      const uint64_t s = strides[d - 1];  // the driver takes rank - 1 strides, of dimensions 1 ..
      if (s % 16 != 0 || s >= (uint64_t{1} << 40)) return CUDA_ERROR_INVALID_VALUE;
      m.strides[d] = s;
    }
  }
  if (rank > 1 && m.strides[1] < dims[0] * m.elem_bytes) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t inner = static_cast<uint64_t>(box[0]) * m.elem_bytes;
  if (inner % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  if (m.swizzle_bytes != 0 && inner > m.swizzle_bytes) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, sizeof(CUtensorMap));
  std::memcpy(map, &m, sizeof(TensorMap));
  return CUDA_SUCCESS;
}

void fail(const std::string& message) {
  if (g_cta != nullptr && g_cta->error.empty()) g_cta->error = message;
  if (g_cur != nullptr) {
    g_cur->done = true;
    yield_to_scheduler();
  }
  std::fprintf(stderr, "simt: %s\n", message.c_str());
  std::abort();
}

}  // namespace wm::simt
