// Helper process for the IPC test: opens a CUipcMemHandle exported by another process
// through the fake driver, checks the bytes, overwrites them, closes the handle.
// usage: fake_ipc_child <handle hex (128 chars)> <size> <expected byte> <new byte>
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 5 || strlen(argv[1]) != 2 * CU_IPC_HANDLE_SIZE) return 10;
    CUipcMemHandle h;
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) {
        unsigned v;
        if (sscanf(argv[1] + 2 * i, "%2x", &v) != 1) return 11;
        h.reserved[i] = char(v);
    }
    size_t size = strtoull(argv[2], nullptr, 10);
    int expected = atoi(argv[3]), fresh = atoi(argv[4]);
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return 12;
#define SYM(T, n) auto n = reinterpret_cast<T>(dlsym(lib, #n)); if (!n) return 13
    SYM(CUresult (*)(unsigned), cuInit);
    SYM(CUresult (*)(CUcontext*, CUdevice), cuDevicePrimaryCtxRetain);
    SYM(CUresult (*)(CUcontext), cuCtxSetCurrent);
    SYM(CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned), cuIpcOpenMemHandle_v2);
    SYM(CUresult (*)(CUdeviceptr), cuIpcCloseMemHandle);
    SYM(CUresult (*)(void*, CUdeviceptr, size_t), cuMemcpyDtoH_v2);
    SYM(CUresult (*)(CUdeviceptr, unsigned char, size_t), cuMemsetD8_v2);
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) return 14;
    CUdeviceptr p = 0;
    if (cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS || !p) return 15;
    std::vector<unsigned char> buf(size);
    if (cuMemcpyDtoH_v2(buf.data(), p, size)) return 16;
    for (unsigned char c : buf)
        if (c != expected) return 17;
    if (cuMemsetD8_v2(p, (unsigned char)fresh, size)) return 18;
    if (cuIpcCloseMemHandle(p)) return 19;
    return 0;
}
