// diffsim's native timing runner: times x86-64 basic blocks with the TSC.
//
// Python (diffsim/measure/harness.py) decides what to measure and turns ticks into
// cycles; this program only lays code out and times it, because timing must not pass
// through an interpreter. It is a small server: one request per stdin line, one answer
// per stdout line, and every request runs in a forked child, so that a block that
// faults, corrupts memory or hangs takes down only that child.
//
// Request:  <hex> <a> <b> <rounds> <max_pages> <repeat>
// Answer:   ok <pages> <quantum> <rounds> then rounds TSC durations of each snippet in
//           turn (chain_a, chain_b, then each canary's a and b: alu, load, store, then
//           block_a, block_b); quantum is the TSC's step. Or:
//           err <reason> <detail...>
//
// The child lays out ten snippets in executable memory: the block unrolled a and b
// times, a 1-cycle-per-instruction `add %rbx,%rax` chain (the clock calibration: the
// TSC is not the core clock) and three canaries bound by the ALUs, the load pipes and
// the store pipes (one of them slows down when another thread shares the core and
// that unit), each unrolled two ways so that the fixed timing overhead cancels in the
// difference. Every round times each snippet once after an untimed warm run, in
// interleaved order, so the core clock each sees is the same. Between its two TSC reads
// a snippet runs `repeat` times, each time behind a fence and from fresh registers:
// separate runs, as in BHive, summed so that a coarse TSC still resolves them.
//
// Usage: runner [--cpu N]   (pins itself and its children to core N)

#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

// BHive's choice: every general-purpose register but rsp points here, and every
// scratch page is filled with this value, so pointer chasing stays in mapped memory.
#define INIT_VALUE 0x2324000ULL
#define PAGE 4096UL
#define MAX_BLOCK 65536
// Calibration and canary unroll counts (instructions / iterations in each layout).
#define CHAIN_A 1000
#define CHAIN_B 500
#define CANARY_A 200
#define CANARY_B 100
#define CHAIN_REPEAT 6
#define CANARY_REPEAT 10
#define MAX_ROUNDS 1024
#define STACK_SIZE (1UL << 20)
// Fixed addresses for the code (after its control page) and the block's stack. With
// addresses chosen by the kernel, each runner process (each run) lays the code out
// elsewhere, and blocks whose speed depends on how the CPU's predictors hash
// instruction addresses (loads past stores, mostly) changed speed from run to run.
#define CODE_BASE 0x500000000000ULL
#define STACK_BASE 0x510000000000ULL
#define TIMEOUT_S 10

enum { SN_CHAIN_A, SN_CHAIN_B, SN_ALU_A, SN_ALU_B, SN_LOAD_A, SN_LOAD_B, SN_STORE_A, SN_STORE_B,
       SN_BLOCK_A, SN_BLOCK_B, N_SNIPPETS };

// What a child hands back through memory shared with the server.
struct result {
  int status;  // 0 = ok, 1 = rejected (reason/detail set)
  int pages, quantum, rounds;
  uint64_t times[N_SNIPPETS][MAX_ROUNDS];  // TSC ticks of each snippet in each round
  char reason[64];
  char detail[192];
};

// Written by the generated code: the TSC at start and end, the caller's rsp.
struct control {
  uint64_t t0, t1, saved_rsp, repeat;
};

static struct result *g_result;
static struct control *g_ctl;
static uint8_t *g_code;
static size_t g_code_size;
// Where the block's copies start in each of its two layouts, to name a faulting offset.
static uint8_t *g_block_code[2];
static size_t g_block_len, g_block_n[2];
static int g_pages, g_max_pages;
static uint64_t g_stack_lo, g_stack_hi;

// Vector registers start as the float pair (1.0f, 1.0f): normal as float and as double
// (0.0078125), so neither denormals nor NaNs slow the first iterations down.
static uint64_t g_vec_init[8] __attribute__((aligned(64))) = {
    0x3f8000003f800000ULL, 0x3f8000003f800000ULL, 0x3f8000003f800000ULL,
    0x3f8000003f800000ULL, 0x3f8000003f800000ULL, 0x3f8000003f800000ULL,
    0x3f8000003f800000ULL, 0x3f8000003f800000ULL};
// All floating-point exceptions masked; flush-to-zero and denormals-are-zero, so a
// block that shrinks values never hits microcode assists.
static uint32_t g_mxcsr = 0x9fc0;

// run_code(code, vec_init, mxcsr*, kind): sets x87, MXCSR, vector and mask state, calls
// the generated snippet, then restores what the C ABI expects (MXCSR, DF, upper
// vector halves). kind: 0 SSE (xmm0-15), 1 AVX (ymm0-15), 2 AVX-512 (zmm0-31, k1-k7).
void run_code(void *code, const void *vec, const uint32_t *mxcsr, int kind);
__asm__(
    ".text\n"
    ".globl run_code\n"
    ".type run_code,@function\n"
    "run_code:\n"
    "  push %rbx\n push %rbp\n push %r12\n push %r13\n push %r14\n push %r15\n"
    "  sub $24, %rsp\n"
    "  stmxcsr 8(%rsp)\n"
    "  fninit\n"
    "  ldmxcsr (%rdx)\n"
    "  cmp $2, %ecx\n je 3f\n"
    "  cmp $1, %ecx\n je 2f\n"
    "  movdqa (%rsi), %xmm0\n movdqa (%rsi), %xmm1\n movdqa (%rsi), %xmm2\n"
    "  movdqa (%rsi), %xmm3\n movdqa (%rsi), %xmm4\n movdqa (%rsi), %xmm5\n"
    "  movdqa (%rsi), %xmm6\n movdqa (%rsi), %xmm7\n movdqa (%rsi), %xmm8\n"
    "  movdqa (%rsi), %xmm9\n movdqa (%rsi), %xmm10\n movdqa (%rsi), %xmm11\n"
    "  movdqa (%rsi), %xmm12\n movdqa (%rsi), %xmm13\n movdqa (%rsi), %xmm14\n"
    "  movdqa (%rsi), %xmm15\n"
    "  jmp 9f\n"
    "2:\n"
    "  vmovdqa (%rsi), %ymm0\n vmovdqa (%rsi), %ymm1\n vmovdqa (%rsi), %ymm2\n"
    "  vmovdqa (%rsi), %ymm3\n vmovdqa (%rsi), %ymm4\n vmovdqa (%rsi), %ymm5\n"
    "  vmovdqa (%rsi), %ymm6\n vmovdqa (%rsi), %ymm7\n vmovdqa (%rsi), %ymm8\n"
    "  vmovdqa (%rsi), %ymm9\n vmovdqa (%rsi), %ymm10\n vmovdqa (%rsi), %ymm11\n"
    "  vmovdqa (%rsi), %ymm12\n vmovdqa (%rsi), %ymm13\n vmovdqa (%rsi), %ymm14\n"
    "  vmovdqa (%rsi), %ymm15\n"
    "  jmp 9f\n"
    "3:\n"
    "  vmovdqa64 (%rsi), %zmm0\n vmovdqa64 (%rsi), %zmm1\n vmovdqa64 (%rsi), %zmm2\n"
    "  vmovdqa64 (%rsi), %zmm3\n vmovdqa64 (%rsi), %zmm4\n vmovdqa64 (%rsi), %zmm5\n"
    "  vmovdqa64 (%rsi), %zmm6\n vmovdqa64 (%rsi), %zmm7\n vmovdqa64 (%rsi), %zmm8\n"
    "  vmovdqa64 (%rsi), %zmm9\n vmovdqa64 (%rsi), %zmm10\n vmovdqa64 (%rsi), %zmm11\n"
    "  vmovdqa64 (%rsi), %zmm12\n vmovdqa64 (%rsi), %zmm13\n vmovdqa64 (%rsi), %zmm14\n"
    "  vmovdqa64 (%rsi), %zmm15\n vmovdqa64 (%rsi), %zmm16\n vmovdqa64 (%rsi), %zmm17\n"
    "  vmovdqa64 (%rsi), %zmm18\n vmovdqa64 (%rsi), %zmm19\n vmovdqa64 (%rsi), %zmm20\n"
    "  vmovdqa64 (%rsi), %zmm21\n vmovdqa64 (%rsi), %zmm22\n vmovdqa64 (%rsi), %zmm23\n"
    "  vmovdqa64 (%rsi), %zmm24\n vmovdqa64 (%rsi), %zmm25\n vmovdqa64 (%rsi), %zmm26\n"
    "  vmovdqa64 (%rsi), %zmm27\n vmovdqa64 (%rsi), %zmm28\n vmovdqa64 (%rsi), %zmm29\n"
    "  vmovdqa64 (%rsi), %zmm30\n vmovdqa64 (%rsi), %zmm31\n"
    "  kxnorw %k1, %k1, %k1\n kxnorw %k2, %k2, %k2\n kxnorw %k3, %k3, %k3\n"
    "  kxnorw %k4, %k4, %k4\n kxnorw %k5, %k5, %k5\n kxnorw %k6, %k6, %k6\n"
    "  kxnorw %k7, %k7, %k7\n"
    "9:\n"
    "  cld\n"
    "  call *%rdi\n"
    "  cld\n"
    "  vzeroupper\n"
    "  fninit\n"
    "  ldmxcsr 8(%rsp)\n"
    "  add $24, %rsp\n"
    "  pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbp\n pop %rbx\n"
    "  ret\n"
    ".size run_code, .-run_code\n");

// ---------------------------------------------------------------------------------
// Code generation: a snippet is prologue, body repeated n times, epilogue.

static uint8_t *emit(uint8_t *p, const void *bytes, size_t n) {
  memcpy(p, bytes, n);
  return p + n;
}

static uint8_t *emit_imm64(uint8_t *p, const uint8_t *op, size_t n, uint64_t imm) {
  p = emit(p, op, n);
  memcpy(p, &imm, 8);
  return p + 8;
}

static const uint8_t LFENCE[] = {0x0f, 0xae, 0xe8};
static const uint8_t RDTSC[] = {0x0f, 0x31};
static const uint8_t RDTSCP[] = {0x0f, 0x01, 0xf9};
static const uint8_t SHL_RDX_32_OR_RAX_RDX[] = {0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0};
static const uint8_t MOVABS_STORE_RAX[] = {0x48, 0xa3};  // mov %rax, moffs64
static const uint8_t MOVABS_LOAD_RAX[] = {0x48, 0xa1};   // mov moffs64, %rax

// Prologue: saves rsp, reads the TSC (lfence on both sides, so nothing before or after
// overlaps the read), then starts the repeat loop with every register reset.
static uint8_t *emit_prologue(uint8_t *p, uint8_t **loop_top) {
  static const uint8_t mov_rsp_rax[] = {0x48, 0x89, 0xe0};
  p = emit(p, mov_rsp_rax, sizeof mov_rsp_rax);
  p = emit_imm64(p, MOVABS_STORE_RAX, 2, (uint64_t)&g_ctl->saved_rsp);
  p = emit(p, LFENCE, 3);
  p = emit(p, RDTSC, 2);
  p = emit(p, LFENCE, 3);
  p = emit(p, SHL_RDX_32_OR_RAX_RDX, sizeof SHL_RDX_32_OR_RAX_RDX);
  p = emit_imm64(p, MOVABS_STORE_RAX, 2, (uint64_t)&g_ctl->t0);
  // Each repetition starts from the same registers after a fence, so repeating the
  // unrolled code k times is k separate runs of it (BHive's semantics), timed together
  // because one run of a fast block lasts only a few steps of a coarse TSC.
  *loop_top = p;
  // mov $imm64, %reg for all 16 registers; rsp gets the middle of the block's stack.
  for (int r = 0; r < 16; r++) {
    uint8_t op[2] = {(uint8_t)(0x48 | (r >> 3)), (uint8_t)(0xb8 + (r & 7))};
    uint64_t v = r == 4 ? (g_stack_lo + g_stack_hi) / 2 : INIT_VALUE;
    p = emit_imm64(p, op, 2, v);
  }
  // Fixed flags: `test` on a register that holds INIT_VALUE (ZF=0, CF=0, SF=0).
  static const uint8_t test_rax[] = {0x48, 0x85, 0xc0};
  p = emit(p, test_rax, sizeof test_rax);
  // Without this fence the repetitions would overlap in the out-of-order window, each
  // starting from fresh registers, and a short block would look faster than it is.
  return emit(p, LFENCE, 3);
}

// Epilogue: closes the repeat loop (a counter in memory: the block owns every
// register), reads the TSC again and returns on the caller's stack.
static uint8_t *emit_epilogue(uint8_t *p, uint8_t *loop_top) {
  int32_t rel = (int32_t)((int64_t)(uint64_t)&g_ctl->repeat - (int64_t)(uint64_t)(p + 7));
  static const uint8_t decq_rip[] = {0x48, 0xff, 0x0d};  // decq rel32(%rip)
  p = emit(p, decq_rip, 3);
  memcpy(p, &rel, 4);
  p += 4;
  static const uint8_t jnz[] = {0x0f, 0x85};
  p = emit(p, jnz, 2);
  rel = (int32_t)(loop_top - (p + 4));
  memcpy(p, &rel, 4);
  p += 4;
  static const uint8_t tail[] = {0x48, 0x89, 0xc4, 0xc3};  // mov %rax,%rsp; ret
  p = emit(p, RDTSCP, 3);
  p = emit(p, LFENCE, 3);
  p = emit(p, SHL_RDX_32_OR_RAX_RDX, sizeof SHL_RDX_32_OR_RAX_RDX);
  p = emit_imm64(p, MOVABS_STORE_RAX, 2, (uint64_t)&g_ctl->t1);
  p = emit_imm64(p, MOVABS_LOAD_RAX, 2, (uint64_t)&g_ctl->saved_rsp);
  return emit(p, tail, sizeof tail);
}

#define PROLOGUE_MAX 256
#define EPILOGUE_MAX 64

static size_t snippet_size(size_t body_len, size_t n) {
  size_t s = PROLOGUE_MAX + body_len * n + EPILOGUE_MAX;
  return (s + PAGE - 1) & ~(PAGE - 1);
}

// Lays out body x n at p; returns the start of the body copies through *body_start.
static void emit_snippet(uint8_t *p, const uint8_t *body, size_t len, size_t n,
                         uint8_t **body_start) {
  uint8_t *loop_top;
  p = emit_prologue(p, &loop_top);
  if (body_start) *body_start = p;
  for (size_t i = 0; i < n; i++) p = emit(p, body, len);
  emit_epilogue(p, loop_top);
}

// ---------------------------------------------------------------------------------
// Faults. A page fault on an unmapped, canonical, non-null address maps a fresh
// private page there (never one shared physical page: that aliases different virtual
// pages and makes stores and loads falsely dependent) and restarts the instruction.
// Anything else ends the child with a reason.

static void reject(const char *reason, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void reject(const char *reason, const char *fmt, ...) {
  g_result->status = 1;
  snprintf(g_result->reason, sizeof g_result->reason, "%s", reason);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_result->detail, sizeof g_result->detail, fmt, ap);
  va_end(ap);
  _exit(3);
}

// The byte offset inside the block of a faulting instruction, or -1 outside it.
static long block_offset(uint64_t rip) {
  for (int k = 0; k < 2; k++) {
    uint64_t lo = (uint64_t)g_block_code[k], hi = lo + g_block_len * g_block_n[k];
    if (g_block_len && rip >= lo && rip < hi) return (long)((rip - lo) % g_block_len);
  }
  return -1;
}

static void on_fault(int sig, siginfo_t *si, void *uc_void) {
  ucontext_t *uc = uc_void;
  uint64_t rip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
  uint64_t addr = (uint64_t)si->si_addr;
  long off = block_offset(rip);
  if (sig == SIGSEGV && si->si_code == SEGV_MAPERR) {
    uint64_t page = addr & ~(PAGE - 1);
    if (addr < 0x10000) reject("null-page", "access to address 0x%lx at block offset %ld",
                               (unsigned long)addr, off);
    if (addr >= 0x800000000000ULL)
      reject("kernel-address", "access to kernel address 0x%lx at block offset %ld",
             (unsigned long)addr, off);
    if (++g_pages > g_max_pages)
      reject("too-many-pages", "touches more than %d pages (latest 0x%lx, block offset %ld)",
             g_max_pages, (unsigned long)addr, off);
    void *m = mmap((void *)page, PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED || (uint64_t)m != page)
      reject("unmappable", "cannot map a page at 0x%lx (block offset %ld)", (unsigned long)page,
             off);
    uint64_t *w = m;
    for (size_t i = 0; i < PAGE / 8; i++) w[i] = INIT_VALUE;
    return;  // the faulting instruction runs again, now on a private page
  }
  if (sig == SIGSEGV && si->si_code == SEGV_ACCERR)
    reject("protected-page", "writes or executes protected memory at 0x%lx (block offset %ld)",
           (unsigned long)addr, off);
  if (sig == SIGSEGV)  // SI_KERNEL: a general-protection fault
    reject("general-protection",
           "non-canonical address, misaligned SSE access or privileged instruction "
           "(block offset %ld)", off);
  if (sig == SIGFPE) reject("divide-error", "integer divide error (block offset %ld)", off);
  if (sig == SIGILL)
    reject("illegal-instruction", "not supported by this CPU (block offset %ld)", off);
  if (sig == SIGBUS) reject("bus-error", "bus error at 0x%lx (block offset %ld)",
                            (unsigned long)addr, off);
  if (sig == SIGTRAP) reject("trap", "breakpoint or trap (block offset %ld)", off);
  reject("signal", "signal %d (block offset %ld)", sig, off);
}

static void install_handlers(void) {
  static uint8_t altstack[1 << 16];
  stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}

static int vector_kind(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
  return 0;
}

// ---------------------------------------------------------------------------------
// One measurement, in the child.

// The TSC's step: some CPUs (AMD Zen in a VM here) advance it by tens of ticks at a
// time. The most common difference between two reads that differ is the step.
static uint64_t tsc_quantum(void) {
  enum { N = 64 };
  uint64_t hist[N] = {0};
  for (int i = 0; i < 4000; i++) {
    uint64_t t0 = __builtin_ia32_rdtsc(), t1;
    while ((t1 = __builtin_ia32_rdtsc()) == t0) {
    }
    hist[t1 - t0 < N ? t1 - t0 : N - 1]++;
  }
  uint64_t best = 1;
  for (uint64_t d = 1; d < N - 1; d++)
    if (hist[d] > hist[best]) best = d;
  return best;
}

static void measure(const uint8_t *block, size_t len, int a, int b, int rounds, int repeat) {
  // The clock: a register-register add chain. Not `add $1,%rax`: some Intel cores fold
  // chains of immediate adds at rename and run them several per cycle (seen: 5x).
  static const uint8_t add_rax_rbx[] = {0x48, 0x01, 0xd8};  // add %rbx,%rax
  // Canaries, each bound by one kind of unit, so a core shared with another thread
  // (SMT) runs one of them measurably slower while the latency chain does not notice:
  // eight independent adds (ALUs), eight independent loads of %rax's address (load
  // pipes), four stores of %rax to %rbx's line (store pipes; they write the value the
  // scratch memory already holds).
  static const uint8_t alu[] = {0x48, 0x83, 0xc0, 0x01, 0x48, 0x83, 0xc3, 0x01,
                                0x48, 0x83, 0xc1, 0x01, 0x48, 0x83, 0xc2, 0x01,
                                0x48, 0x83, 0xc6, 0x01, 0x48, 0x83, 0xc7, 0x01,
                                0x49, 0x83, 0xc0, 0x01, 0x49, 0x83, 0xc1, 0x01};
  static const uint8_t load[] = {0x48, 0x8b, 0x18, 0x48, 0x8b, 0x08, 0x48, 0x8b,
                                 0x10, 0x48, 0x8b, 0x30, 0x48, 0x8b, 0x38, 0x4c,
                                 0x8b, 0x00, 0x4c, 0x8b, 0x08, 0x4c, 0x8b, 0x10};
  static const uint8_t store[] = {0x48, 0x89, 0x03, 0x48, 0x89, 0x43, 0x08, 0x48,
                                  0x89, 0x43, 0x10, 0x48, 0x89, 0x43, 0x18};
  const uint8_t *bodies[N_SNIPPETS] = {add_rax_rbx, add_rax_rbx, alu, alu, load, load,
                                       store, store, block, block};
  size_t lens[N_SNIPPETS] = {sizeof add_rax_rbx, sizeof add_rax_rbx, sizeof alu, sizeof alu,
                             sizeof load, sizeof load, sizeof store, sizeof store, len, len};
  size_t counts[N_SNIPPETS] = {CHAIN_A, CHAIN_B, CANARY_A, CANARY_B, CANARY_A, CANARY_B,
                               CANARY_A, CANARY_B, (size_t)a, (size_t)b};
  uint64_t repeats[N_SNIPPETS] = {CHAIN_REPEAT, CHAIN_REPEAT, CANARY_REPEAT, CANARY_REPEAT,
                                  CANARY_REPEAT, CANARY_REPEAT, CANARY_REPEAT, CANARY_REPEAT,
                                  (uint64_t)repeat, (uint64_t)repeat};
  size_t offsets[N_SNIPPETS], total = 0;
  for (int s = 0; s < N_SNIPPETS; s++) {
    offsets[s] = total;
    total += snippet_size(lens[s], counts[s]);
  }

  // One mapping: the control page, then the code, so the code reaches its loop
  // counter rip-relative.
  uint8_t *mem = mmap((void *)CODE_BASE, PAGE + total, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  uint8_t *stack = mmap((void *)STACK_BASE, STACK_SIZE, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | MAP_FIXED_NOREPLACE, -1, 0);
  if (mem == MAP_FAILED || stack == MAP_FAILED)
    reject("runner", "out of memory (%zu bytes of code)", total);
  g_ctl = (struct control *)mem;
  g_code = mem + PAGE;
  g_code_size = total;
  g_stack_lo = (uint64_t)stack;
  g_stack_hi = g_stack_lo + STACK_SIZE;
  for (size_t i = 0; i < STACK_SIZE / 8; i++) ((uint64_t *)stack)[i] = INIT_VALUE;

  for (int s = 0; s < N_SNIPPETS; s++) {
    uint8_t *start = NULL;
    emit_snippet(g_code + offsets[s], bodies[s], lens[s], counts[s], &start);
    if (s == SN_BLOCK_A || s == SN_BLOCK_B) g_block_code[s - SN_BLOCK_A] = start;
  }
  g_block_len = len;
  g_block_n[0] = (size_t)a;
  g_block_n[1] = (size_t)b;
  // Executable, not writable: a block that writes into its own code is rejected.
  if (mprotect(g_code, total, PROT_READ | PROT_EXEC) != 0)
    reject("runner", "cannot make code executable: %s", strerror(errno));

  int kind = vector_kind();
  uint64_t quantum = tsc_quantum();
  uint64_t (*times)[MAX_ROUNDS] = g_result->times;
  // Warm-up, once without repeats: maps the pages the block touches, fills caches and
  // predictors.
  for (int w = 0; w < 3; w++)
    for (int s = 0; s < N_SNIPPETS; s++) {
      g_ctl->repeat = w == 0 ? 1 : repeats[s];
      run_code(g_code + offsets[s], g_vec_init, &g_mxcsr, kind);
    }
  for (int r = 0; r < rounds; r++) {
    for (int s = 0; s < N_SNIPPETS; s++) {
      // The untimed run brings this snippet back into the instruction caches that the
      // previous snippets evicted; only the second run is timed.
      g_ctl->repeat = 1;
      run_code(g_code + offsets[s], g_vec_init, &g_mxcsr, kind);
      g_ctl->repeat = repeats[s];
      run_code(g_code + offsets[s], g_vec_init, &g_mxcsr, kind);
      times[s][r] = g_ctl->t1 - g_ctl->t0;
    }
  }
  g_result->pages = g_pages;
  g_result->quantum = (int)quantum;
  g_result->rounds = rounds;
  g_result->status = 0;
}

// ---------------------------------------------------------------------------------
// The server loop.

static int parse_hex(const char *hex, uint8_t *out, size_t cap, size_t *len) {
  size_t n = strlen(hex);
  if (n % 2 || n / 2 > cap) return -1;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (uint8_t)v;
  }
  *len = n / 2;
  return 0;
}

static void serve_one(char *line, struct result *shared) {
  static uint8_t block[MAX_BLOCK];
  static char hex[2 * MAX_BLOCK + 2];
  int a, b, rounds, max_pages, repeat;
  size_t len;
  if (sscanf(line, "%131073s %d %d %d %d %d", hex, &a, &b, &rounds, &max_pages, &repeat) != 6 ||
      a <= b || b < 1 || rounds < 1 || rounds > MAX_ROUNDS || repeat < 1 || parse_hex(hex, block, sizeof block, &len) != 0 || len == 0) {
    printf("err bad-request cannot parse the request\n");
    return;
  }
  memset(shared, 0, sizeof *shared);
  shared->status = -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    printf("err runner fork failed: %s\n", strerror(errno));
    return;
  }
  if (pid == 0) {
    g_result = shared;
    g_max_pages = max_pages;
    alarm(TIMEOUT_S);  // default action ends the child: a hang costs one block only
    install_handlers();
    measure(block, len, a, b, rounds, repeat);
    _exit(0);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && shared->status == 0) {
    printf("ok %d %d %d", shared->pages, shared->quantum, shared->rounds);
    for (int s = 0; s < N_SNIPPETS; s++)
      for (int r = 0; r < shared->rounds; r++) printf(" %lu", (unsigned long)shared->times[s][r]);
    printf("\n");
  } else if (WIFEXITED(st) && shared->status == 1) {
    printf("err %s %s\n", shared->reason, shared->detail);
  } else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
    printf("err timeout still running after %d s\n", TIMEOUT_S);
  } else if (WIFSIGNALED(st)) {
    printf("err crash child killed by signal %d\n", WTERMSIG(st));
  } else {
    printf("err crash child exited with status %d\n", WEXITSTATUS(st));
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--cpu") == 0 && i + 1 < argc) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(atoi(argv[++i]), &set);
      if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "runner: cannot pin to cpu %s: %s\n", argv[i], strerror(errno));
        return 2;
      }
    }
  }
  struct result *shared =
      mmap(NULL, sizeof(struct result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 2;
  static char line[2 * MAX_BLOCK + 256];
  while (fgets(line, sizeof line, stdin)) {
    if (line[0] == '\n') continue;
    serve_one(line, shared);
    fflush(stdout);
  }
  return 0;
}
