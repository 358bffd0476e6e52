// Streams that a library creates for its own use and orders with its caller's stream.
//
// cuDNN creates 16 non-blocking streams in cudnnCreate and more at its first convolution;
// cuBLASLt creates a blocking one at its first matmul heuristic (both as shipped with PyTorch
// 2.11). They run parts of one library call in parallel: the library forks onto them
// from the stream its handle was given (an event there, waited for on the helper) and joins
// back before the call returns, as their stream semantics require (all work of a call on the
// handle's stream). Work on such a stream is therefore ordered with the caller's stream, and
// single_stream can stay on when one is created. A stream made from anywhere else, or a helper
// stream met later in a memory call, ends the mode as before.
#pragma once

namespace cudalloc::shim {

// The file name of the library whose code made the call that returns to `return_address`, when
// that library is one of those known to fork and join its own streams; else nullptr.
const char* helper_stream_library(const void* return_address);

}  // namespace cudalloc::shim
