#include "runtime_lookup.h"

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

namespace fakecuda {

const Lookup* RuntimeLookup::find(const std::string& name, unsigned flags) const {
    const Lookup* hit = nullptr;
    for (const auto& l : lookups)
        if (l.name == name && l.flags == flags) hit = &l;
    return hit;
}

std::string default_tsv_path() {
    if (const char* e = std::getenv("FAKE_CUDA_LOOKUP_TSV"); e && *e) return e;
#ifdef FAKE_CUDA_DEFAULT_TSV
    return FAKE_CUDA_DEFAULT_TSV;
#else
    return "cudart13-driver-lookups.tsv";
#endif
}

namespace {
std::vector<std::string> split_tabs(const std::string& line) {
    std::vector<std::string> f;
    std::string cur;
    for (char c : line) {
        if (c == '\t') {
            f.push_back(cur);
            cur.clear();
        } else if (c != '\r') {
            cur.push_back(c);
        }
    }
    f.push_back(cur);
    return f;
}

template <class T>
void take(const RuntimeLookup& r, T& field, const char* name, unsigned flags) {
    const Lookup* l = r.find(name, flags);
    field = (l && l->result == 0) ? reinterpret_cast<T>(l->pfn) : nullptr;
}
}  // namespace

bool replay_runtime_lookups(const std::string& tsv_path, RuntimeLookup* out, const char* library) {
    *out = RuntimeLookup{};
    std::ifstream in(tsv_path);
    if (!in) {
        out->error = "cannot open " + tsv_path;
        return false;
    }
    out->handle = dlopen(library, RTLD_NOW | RTLD_GLOBAL);
    if (!out->handle) {
        const char* e = dlerror();
        out->error = std::string("dlopen: ") + (e ? e : "?");
        return false;
    }
    out->dlsym_cuGetProcAddress_v2 = dlsym(out->handle, "cuGetProcAddress_v2");
    if (!out->dlsym_cuGetProcAddress_v2) {
        out->error = "dlsym(cuGetProcAddress_v2) failed";
        return false;
    }
    auto gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(out->dlsym_cuGetProcAddress_v2);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        auto f = split_tabs(line);
        if (f.size() < 5 || f[0] != "gpa") continue;  // header, the dlsym line
        Lookup l;
        l.name = f[1];
        l.version = std::atoi(f[2].c_str());
        l.flags = unsigned(std::strtoul(f[3].c_str(), nullptr, 10));
        l.expected = std::atoi(f[4].c_str());
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        l.result = gpa(l.name.c_str(), &l.pfn, l.version, l.flags, &st);
        l.status = st;
        if (l.pfn) {
            Dl_info info{};
            if (dladdr(l.pfn, &info) && info.dli_sname && info.dli_saddr == l.pfn) l.resolved = info.dli_sname;
        }
        // The runtime switches to the cuGetProcAddress it was handed (like it does).
        if (l.name == "cuGetProcAddress" && l.version == 12000 && l.result == 0 && l.pfn)
            gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(l.pfn);
        out->lookups.push_back(std::move(l));
    }
    if (out->lookups.empty()) {
        out->error = "no gpa lines in " + tsv_path;
        return false;
    }
    DriverApi& a = out->api;
    const RuntimeLookup& r = *out;
    take(r, a.cuInit, "cuInit", 0);
    take(r, a.cuGetProcAddress_v2, "cuGetProcAddress", 0);
    take(r, a.cuDriverGetVersion, "cuDriverGetVersion", 0);
    take(r, a.cuDeviceGet, "cuDeviceGet", 0);
    take(r, a.cuDeviceGetCount, "cuDeviceGetCount", 0);
    take(r, a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0);
    take(r, a.cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 0);
    take(r, a.cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 0);
    take(r, a.cuCtxSetCurrent, "cuCtxSetCurrent", 0);
    take(r, a.cuCtxGetCurrent, "cuCtxGetCurrent", 0);
    // cuCtxSynchronize is looked up at 2000 and 13000 (-> cuCtxSynchronize_v2(ctx)); keep v1.
    for (const auto& l : r.lookups)
        if (l.name == "cuCtxSynchronize" && l.version < 13000 && l.result == 0)
            a.cuCtxSynchronize = reinterpret_cast<PFN_cuCtxSynchronize_v2000>(l.pfn);
    take(r, a.cuMemAlloc_v2, "cuMemAlloc", 0);
    take(r, a.cuMemFree_v2, "cuMemFree", 0);
    take(r, a.cuMemAllocAsync, "cuMemAllocAsync", 0);
    take(r, a.cuMemAllocAsync_ptsz, "cuMemAllocAsync", 2);
    take(r, a.cuMemFreeAsync, "cuMemFreeAsync", 0);
    take(r, a.cuMemFreeAsync_ptsz, "cuMemFreeAsync", 2);
    take(r, a.cuMemGetInfo_v2, "cuMemGetInfo", 0);
    take(r, a.cuMemGetAddressRange_v2, "cuMemGetAddressRange", 0);
    take(r, a.cuPointerGetAttribute, "cuPointerGetAttribute", 0);
    take(r, a.cuStreamCreate, "cuStreamCreate", 0);
    take(r, a.cuStreamDestroy_v2, "cuStreamDestroy", 0);
    take(r, a.cuStreamSynchronize, "cuStreamSynchronize", 0);
    take(r, a.cuStreamSynchronize_ptsz, "cuStreamSynchronize", 2);
    take(r, a.cuEventCreate, "cuEventCreate", 0);
    take(r, a.cuEventRecord, "cuEventRecord", 0);
    take(r, a.cuEventRecord_ptsz, "cuEventRecord", 2);
    take(r, a.cuEventQuery, "cuEventQuery", 0);
    take(r, a.cuEventSynchronize, "cuEventSynchronize", 0);
    take(r, a.cuEventDestroy_v2, "cuEventDestroy", 0);
    take(r, a.cuMemcpyHtoD_v2, "cuMemcpyHtoD", 0);
    take(r, a.cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 2);
    take(r, a.cuMemcpyDtoH_v2, "cuMemcpyDtoH", 0);
    take(r, a.cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 2);
    take(r, a.cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 0);
    take(r, a.cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 2);
    take(r, a.cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 0);
    take(r, a.cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 2);
    take(r, a.cuMemsetD8_v2, "cuMemsetD8", 0);
    take(r, a.cuMemsetD8_v2_ptds, "cuMemsetD8", 2);
    take(r, a.cuStreamBeginCapture_v2, "cuStreamBeginCapture", 0);
    take(r, a.cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 2);
    take(r, a.cuStreamEndCapture, "cuStreamEndCapture", 0);
    take(r, a.cuStreamEndCapture_ptsz, "cuStreamEndCapture", 2);
    take(r, a.cuStreamIsCapturing, "cuStreamIsCapturing", 0);
    take(r, a.cuIpcGetMemHandle, "cuIpcGetMemHandle", 0);
    return true;
}

}  // namespace fakecuda
