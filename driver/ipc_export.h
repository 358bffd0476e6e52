// The exporting side of IPC for blocks of expandable segments (ipc_record.h says why and what
// goes on the wire).
//
// export_block registers the block as an export and fills the handle. At the first export a
// process starts its server: a detached thread (named cudalloc-ipc, every signal blocked)
// listening on an abstract Unix socket named after the pid and a random token, both in the
// handle. For each connection it checks that the peer runs as the same user (SO_PEERCRED) and
// knows the token, that the export's block is still the live block it was (same start and
// buffer id), and then sends the chunks' sizes and their POSIX file descriptors, exported from
// the driver for that request and closed once sent. The exporter thus holds no descriptor
// between requests, and a freed block (or a chunk unmapped since) is never handed out.
// Exports of freed blocks are dropped at the next export; a block exported twice keeps its id.
//
// A fork child starts afresh (per_process): it closes the listening socket it inherited and
// answers nothing of the parent's. At exit the socket is shut down and the thread stops
// answering; the thread never keeps the process alive.
#pragma once

#include "allocator/device_allocator.h"
#include "driver/context_state.h"
#include "driver/cuda_api.h"

namespace cudalloc::shim::ipc {

// cuIpcGetMemHandle of the live block `info` of `s`, which lies in mapped chunks of an
// expandable segment (DriverBackend::describe_range). The caller has waited for the block's
// earlier work (settle_reuse). CUDA_ERROR_INVALID_VALUE with a message if the device's chunks
// cannot be exported; CUDA_ERROR_OPERATING_SYSTEM if the server cannot start.
CUresult export_block(ContextState& s, const AllocationInfo& info, CUipcMemHandle* handle);

}  // namespace cudalloc::shim::ipc
