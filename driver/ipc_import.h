// The importing side of IPC for blocks of expandable segments (ipc_record.h, ipc_export.h).
//
// cuIpcOpenMemHandle of a cudalloc handle connects to the exporter's socket, receives the
// chunks' file descriptors, imports each (cuMemImportFromShareableHandle), maps them in order
// into a range reserved for the purpose, sets read-write access for the current context's
// device and closes the descriptors and releases the imported handles (the mapping keeps the
// memory). The pointer is the block's start. Opening a handle already open in this process
// returns the same pointer and counts one more reference; cuIpcCloseMemHandle unmaps at the
// last. No call waits longer than the socket's timeouts (ipc_socket.h).
#pragma once

#include "driver/cuda_api.h"

namespace cudalloc::shim::ipc {

// False for a handle that is not cudalloc's (the driver's own), which the caller passes on;
// true otherwise, with the result in *r.
bool open_handle(const CUipcMemHandle& handle, unsigned int flags, CUdeviceptr* out, CUresult* r);
// False for a pointer open_handle did not hand out (or closed already); true otherwise, with
// the result in *r.
bool close_handle(CUdeviceptr ptr, CUresult* r);

}  // namespace cudalloc::shim::ipc
