#include "shim/nvtx_injection.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#define NVTX_NO_IMPL  // the types only: this is the tool side
#include <nvtx3/nvToolsExt.h>

#include "config/config.h"
#include "driver/cuda_api.h"
#include "support/log.h"
#include "trace/trace_writer.h"

extern char** environ;

namespace cudalloc::shim {
namespace {

constexpr const char* kInjectionVar = "NVTX_INJECTION64_PATH";
constexpr std::size_t kMaxText = TraceWriter::kMaxNvtx;
constexpr std::uint32_t kMaxDepth = 64;       // deeper pushes are counted, not stored
constexpr std::uint32_t kChunk = 1024;        // range stacks per table chunk
constexpr std::uint32_t kMaxChunks = 64;      // at most 65536 distinct range stacks
constexpr std::uint32_t kMaxNames = 65536;    // and distinct names
constexpr std::uint32_t kUnknownName = 1;     // "?": no message, or the name table is full

// --- load-time decision
enum State : int { kOff = 0, kArmed = 1, kForeign = 2, kSanitizer = 3 };
std::atomic<int> g_state{kOff};
char g_other[512];  // the injection that was already set (for the log line)

bool same_file(const char* a, const char* b) {
  char ra[PATH_MAX], rb[PATH_MAX];
  if (::realpath(a, ra) == nullptr || ::realpath(b, rb) == nullptr) return std::strcmp(a, b) == 0;
  return std::strcmp(ra, rb) == 0;
}

// Only env reads, dladdr and setenv: no driver, no thread, nothing for an untraced process.
void arm_at_load() {
  if (::secure_getenv("CUDALLOC_TRACE") == nullptr) return;
  const ConfigResult loaded = load_config(process_env());
  // A bad configuration is reported (and exits) at the first CUDA call, not here.
  if (!loaded.config || loaded.config->trace_path.empty() || !loaded.config->trace_nvtx) return;
  // Under compute-sanitizer the injection slot is the sanitizer's (passthrough.cpp decides
  // the cache mode from it): never take it, even where the sanitizer left it empty.
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "NV_SANITIZER_", 13) == 0) {
      g_state.store(kSanitizer);
      return;
    }
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&arm_at_load), &info) == 0 || info.dli_fname == nullptr) {
    return;
  }
  // Absolute: the program may chdir before its first NVTX call, and LD_PRELOAD may be relative.
  char self[PATH_MAX];
  if (::realpath(info.dli_fname, self) == nullptr) {
    std::strncpy(self, info.dli_fname, sizeof self - 1);
    self[sizeof self - 1] = '\0';
  }
  const char* current = ::secure_getenv(kInjectionVar);
  if (current == nullptr) {
    if (::setenv(kInjectionVar, self, 0) == 0) g_state.store(kArmed);
    return;
  }
  if (current[0] != '\0' && same_file(current, self)) {
    g_state.store(kArmed);  // the launcher, or a parent process, already pointed it here
    return;
  }
  std::strncpy(g_other, current, sizeof g_other - 1);
  g_state.store(kForeign);
}

__attribute__((constructor)) void nvtx_load_constructor() { arm_at_load(); }

// --- interned names and range stacks
struct PathNode {
  std::uint32_t parent;
  std::uint32_t name;
  std::uint32_t len;
  char text[kMaxText];
};

struct Tables {
  std::mutex mu;
  std::unordered_map<std::string, std::uint32_t> name_ids;
  std::vector<std::string> names;                       // by id; [0] unused, [1] "?"
  std::unordered_map<std::uint64_t, std::uint32_t> paths;  // (parent << 32 | name) -> id
  std::uint32_t path_count = 1;                         // id 0: no range
  std::unordered_map<std::string, std::uintptr_t> domains;
  bool warned_full = false;
  std::vector<std::uint32_t> phases;  // cudalloc_phase_push's stack, as path ids
};
// The innermost phase's path id (0: none), read by every traced record.
std::atomic<std::uint32_t> g_phase_top{0};
std::atomic<PathNode*> g_chunks[kMaxChunks];

// Never destroyed: threads may push and the writer may resolve during exit.
Tables& tables() {
  static Tables* t = [] {
    auto* t = new Tables;
    t->names = {"", "?"};
    t->name_ids.emplace("?", kUnknownName);
    return t;
  }();
  return *t;
}

void warn_full(Tables& t) {
  if (t.warned_full) return;
  t.warned_full = true;
  log_warn("NVTX: more than %u distinct range names or stacks; further ones are traced as their "
           "enclosing range or '?'", kMaxNames);
}

// Cuts at a UTF-8 character boundary.
std::size_t utf8_cut(const char* s, std::size_t len, std::size_t max) {
  if (len <= max) return len;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

// PyTorch's emit_nvtx names carry per-call numbers ("aten::mm, seq = 12, op_id = 40, sizes =
// ..."): without them the op name is one phase, not one name per call.
std::string_view normalize(std::string_view s) {
  static constexpr std::string_view kSuffixes[] = {", seq = ", ", op_id = ", ", sizes = ",
                                                   ", input_op_ids = "};
  std::size_t cut = s.size();
  for (std::string_view suffix : kSuffixes) cut = std::min(cut, s.find(suffix));
  s = s.substr(0, cut);
  return s.substr(0, utf8_cut(s.data(), s.size(), kMaxText));
}

std::uint32_t intern_name_locked(Tables& t, std::string_view raw) {
  const std::string_view name = normalize(raw);
  if (name.empty()) return kUnknownName;
  std::string key(name);
  auto it = t.name_ids.find(key);
  if (it != t.name_ids.end()) return it->second;
  if (t.names.size() >= kMaxNames) {
    warn_full(t);
    return kUnknownName;
  }
  const auto id = static_cast<std::uint32_t>(t.names.size());
  t.names.push_back(key);
  t.name_ids.emplace(std::move(key), id);
  return id;
}

const PathNode* node(std::uint32_t id) noexcept {
  if (id == 0 || id >= kChunk * kMaxChunks) return nullptr;
  PathNode* chunk = g_chunks[id / kChunk].load(std::memory_order_acquire);
  return chunk == nullptr ? nullptr : &chunk[id % kChunk];
}

// The id of `parent`'s stack with `name` pushed on it; `parent` itself when the table is full.
std::uint32_t intern_path_locked(Tables& t, std::uint32_t parent, std::uint32_t name) {
  if (name >= t.names.size()) name = kUnknownName;  // a handle that was never registered
  const std::uint64_t key = (std::uint64_t{parent} << 32) | name;
  auto it = t.paths.find(key);
  if (it != t.paths.end()) return it->second;
  const std::uint32_t id = t.path_count;
  if (id >= kChunk * kMaxChunks) {
    warn_full(t);
    return parent;
  }
  PathNode* chunk = g_chunks[id / kChunk].load(std::memory_order_relaxed);
  if (chunk == nullptr) {
    chunk = new (std::nothrow) PathNode[kChunk];
    if (chunk == nullptr) return parent;
    // Published before any of its ids is handed out (the writer reads it without the lock).
    g_chunks[id / kChunk].store(chunk, std::memory_order_release);
  }
  PathNode& n = chunk[id % kChunk];
  n.parent = parent;
  n.name = name;
  std::string text;
  if (const PathNode* p = node(parent)) {
    text.assign(p->text, p->len);
    text += '/';
  }
  text += t.names[name];
  n.len = static_cast<std::uint32_t>(utf8_cut(text.data(), text.size(), kMaxText));
  std::memcpy(n.text, text.data(), n.len);
  t.paths.emplace(key, id);
  t.path_count = id + 1;
  return id;
}

// --- the calling thread's range stack (plain thread-locals: zero-initialized, no TLS init)
struct Frame {
  const void* domain;  // null: the default domain
  std::uint32_t name;
  std::uint32_t path;
};
struct RangeStack {
  std::uint32_t depth;   // frames stored
  std::uint32_t hidden;  // pushes beyond kMaxDepth, not stored
  Frame frames[kMaxDepth];
};
thread_local RangeStack t_stack;
thread_local std::uint32_t t_top;  // frames[depth - 1].path, what allocations read

int push_name(const void* domain, std::uint32_t name) noexcept {
  RangeStack& s = t_stack;
  const int level = static_cast<int>(s.depth + s.hidden);
  if (s.depth >= kMaxDepth) {
    ++s.hidden;
    return level;
  }
  std::uint32_t path = t_top;
  try {
    Tables& t = tables();
    std::lock_guard lock(t.mu);
    path = intern_path_locked(t, t_top, name);
  } catch (...) {
  }
  s.frames[s.depth++] = Frame{domain, name, path};
  t_top = path;
  return level;
}

int push_text(const void* domain, std::string_view text) noexcept {
  std::uint32_t name = kUnknownName;
  try {
    Tables& t = tables();
    std::lock_guard lock(t.mu);
    name = intern_name_locked(t, text);
  } catch (...) {
  }
  return push_name(domain, name);
}

// Pops the innermost range of `domain`. Ranges of other domains pushed after it stay, their
// stacks re-interned without it (domains pop independently).
int pop(const void* domain) noexcept {
  RangeStack& s = t_stack;
  if (s.hidden > 0) {
    --s.hidden;
    return static_cast<int>(s.depth + s.hidden);
  }
  std::uint32_t i = s.depth;
  while (i > 0 && s.frames[i - 1].domain != domain) --i;
  if (i == 0) return -1;  // nothing of this domain is open here
  --i;
  const int level = static_cast<int>(i);
  if (i + 1 < s.depth) {
    try {
      Tables& t = tables();
      std::lock_guard lock(t.mu);
      std::uint32_t parent = i > 0 ? s.frames[i - 1].path : 0;
      for (std::uint32_t j = i + 1; j < s.depth; ++j) {
        s.frames[j - 1] = s.frames[j];
        s.frames[j - 1].path = parent = intern_path_locked(t, parent, s.frames[j].name);
      }
    } catch (...) {
    }
  }
  --s.depth;
  t_top = s.depth > 0 ? s.frames[s.depth - 1].path : 0;
  return level;
}

std::string utf8_from_wide(const wchar_t* w) {
  std::string out;
  for (; *w != L'\0' && out.size() < kMaxText * 2; ++w) {
    auto c = static_cast<std::uint32_t>(*w);
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = '?';
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

// Registered strings are handed out as their name id.
nvtxStringHandle_t string_handle(std::uint32_t name) {
  return reinterpret_cast<nvtxStringHandle_t>(static_cast<std::uintptr_t>(name));
}

int push_attributes(const void* domain, const nvtxEventAttributes_t* a) noexcept {
  if (a == nullptr) return push_name(domain, kUnknownName);
  switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
      return a->message.ascii != nullptr ? push_text(domain, a->message.ascii)
                                         : push_name(domain, kUnknownName);
    case NVTX_MESSAGE_TYPE_UNICODE:
      if (a->message.unicode == nullptr) return push_name(domain, kUnknownName);
      try {
        return push_text(domain, utf8_from_wide(a->message.unicode));
      } catch (...) {
        return push_name(domain, kUnknownName);
      }
    case NVTX_MESSAGE_TYPE_REGISTERED: {
      const auto id = reinterpret_cast<std::uintptr_t>(a->message.registered);
      return push_name(domain, id > 0 && id < kMaxNames ? static_cast<std::uint32_t>(id)
                                                        : kUnknownName);
    }
    default:
      return push_name(domain, kUnknownName);
  }
}

// --- the callbacks installed into each NVTX instance
int NVTX_API cb_push_a(const char* message) {
  return message != nullptr ? push_text(nullptr, message) : push_name(nullptr, kUnknownName);
}
int NVTX_API cb_push_w(const wchar_t* message) {
  nvtxEventAttributes_t a{};
  a.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  a.message.unicode = message;
  return push_attributes(nullptr, &a);
}
int NVTX_API cb_push_ex(const nvtxEventAttributes_t* a) { return push_attributes(nullptr, a); }
int NVTX_API cb_pop() { return pop(nullptr); }
int NVTX_API cb_domain_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  return push_attributes(d, a);
}
int NVTX_API cb_domain_pop(nvtxDomainHandle_t d) { return pop(d); }

nvtxStringHandle_t register_string(std::string_view s) noexcept {
  try {
    Tables& t = tables();
    std::lock_guard lock(t.mu);
    return string_handle(intern_name_locked(t, s));
  } catch (...) {
    return string_handle(kUnknownName);
  }
}
nvtxStringHandle_t NVTX_API cb_register_string_a(nvtxDomainHandle_t, const char* s) {
  return register_string(s != nullptr ? s : "");
}
nvtxStringHandle_t NVTX_API cb_register_string_w(nvtxDomainHandle_t, const wchar_t* s) {
  try {
    return register_string(s != nullptr ? utf8_from_wide(s) : std::string());
  } catch (...) {
    return string_handle(kUnknownName);
  }
}

// Distinct handles per domain name, so that each domain's pops match its own pushes.
nvtxDomainHandle_t create_domain(std::string_view name) noexcept {
  try {
    Tables& t = tables();
    std::lock_guard lock(t.mu);
    auto [it, added] = t.domains.emplace(std::string(name), t.domains.size() + 1);
    (void)added;
    return reinterpret_cast<nvtxDomainHandle_t>(it->second);
  } catch (...) {
    return nullptr;
  }
}
nvtxDomainHandle_t NVTX_API cb_domain_create_a(const char* name) {
  return create_domain(name != nullptr ? name : "");
}
nvtxDomainHandle_t NVTX_API cb_domain_create_w(const wchar_t* name) {
  try {
    return create_domain(name != nullptr ? utf8_from_wide(name) : std::string());
  } catch (...) {
    return nullptr;
  }
}
void NVTX_API cb_domain_destroy(nvtxDomainHandle_t) {}

template <typename F>
void install(NvtxFunctionTable table, unsigned size, unsigned id, F fn) {
  if (id <= size && table[id] != nullptr) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

// A fork child must not inherit the table lock held by another thread.
void lock_for_fork() { tables().mu.lock(); }
void unlock_after_fork() { tables().mu.unlock(); }

}  // namespace

// A thread's own NVTX ranges say more about its allocation than the program's phase; a thread
// with none (PyTorch's autograd threads, under a phase the main thread opened) takes the phase.
std::uint32_t nvtx_current_range() noexcept {
  const std::uint32_t top = t_top;
  return top != 0 ? top : g_phase_top.load(std::memory_order_relaxed);
}

bool phase_push(std::string_view name) {
  try {
    Tables& t = tables();
    std::lock_guard lock(t.mu);
    const std::uint32_t parent = t.phases.empty() ? 0 : t.phases.back();
    const std::uint32_t path = intern_path_locked(t, parent, intern_name_locked(t, name));
    t.phases.push_back(path);
    g_phase_top.store(path, std::memory_order_relaxed);
    return true;
  } catch (...) {
    return false;
  }
}

bool phase_pop() {
  Tables& t = tables();
  std::lock_guard lock(t.mu);
  if (t.phases.empty()) return false;
  t.phases.pop_back();
  g_phase_top.store(t.phases.empty() ? 0 : t.phases.back(), std::memory_order_relaxed);
  return true;
}

std::size_t nvtx_range_text(std::uint32_t id, const char** text) noexcept {
  const PathNode* n = node(id);
  if (n == nullptr) return 0;
  *text = n->text;
  return n->len;
}

void nvtx_connect_trace() {
  switch (g_state.load()) {
    case kArmed:
      TraceWriter::set_nvtx_id_hooks(&nvtx_current_range, &nvtx_range_text);
      log_info("NVTX phases: this library is the NVTX injection (%s)",
               ::secure_getenv(kInjectionVar) != nullptr ? ::secure_getenv(kInjectionVar) : "");
      break;
    case kForeign:
      log_info("NVTX phases are off: %s already names another NVTX injection (%s)",
               kInjectionVar, g_other);
      break;
    case kSanitizer:
      log_info("NVTX phases are off: compute-sanitizer is present and owns %s", kInjectionVar);
      break;
    default:
      log_info("NVTX phases are off: the library could not register as the NVTX injection");
      break;
  }
}

}  // namespace cudalloc::shim

using namespace cudalloc::shim;

// Called by each NVTX instance (every library or program built with the nvtx3 headers, and
// libnvToolsExt) at its first NVTX call. Returns 0, which turns that instance's calls into
// no-ops, unless tracing asked for NVTX phases.
CUDALLOC_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  if (g_state.load() != kArmed || get_export_table == nullptr) return 0;
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) return 0;
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers, [] {
    (void)tables();
    pthread_atfork(&lock_for_fork, &unlock_after_fork, &unlock_after_fork);
  });

  NvtxFunctionTable core = nullptr;
  unsigned core_size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &core_size) == 0 ||
      core == nullptr) {
    return 0;
  }
  install(core, core_size, NVTX_CBID_CORE_RangePushEx, &cb_push_ex);
  install(core, core_size, NVTX_CBID_CORE_RangePushA, &cb_push_a);
  install(core, core_size, NVTX_CBID_CORE_RangePushW, &cb_push_w);
  install(core, core_size, NVTX_CBID_CORE_RangePop, &cb_pop);

  NvtxFunctionTable core2 = nullptr;
  unsigned core2_size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &core2_size) != 0 &&
      core2 != nullptr) {
    install(core2, core2_size, NVTX_CBID_CORE2_DomainRangePushEx, &cb_domain_push_ex);
    install(core2, core2_size, NVTX_CBID_CORE2_DomainRangePop, &cb_domain_pop);
    install(core2, core2_size, NVTX_CBID_CORE2_DomainRegisterStringA, &cb_register_string_a);
    install(core2, core2_size, NVTX_CBID_CORE2_DomainRegisterStringW, &cb_register_string_w);
    install(core2, core2_size, NVTX_CBID_CORE2_DomainCreateA, &cb_domain_create_a);
    install(core2, core2_size, NVTX_CBID_CORE2_DomainCreateW, &cb_domain_create_w);
    install(core2, core2_size, NVTX_CBID_CORE2_DomainDestroy, &cb_domain_destroy);
  }
  return 1;
}
