// The device work the program queues, as the hooks of shim/hooks_submit.cpp see it: the
// process's SubmissionWatch (allocator/submission_watch.h) and the lookups' part in it.
#pragma once

namespace cudalloc {
class SubmissionWatch;
}

namespace cudalloc::shim {

// The process's watch: every hook of a call that queues device work notes into it.
SubmissionWatch& submissions();

// Our hook for a driver export that queues work, or `real` itself when it is none of those.
void* substitute_submission(void* real);
// True for a hook of hooks_submit.cpp (a driver whose lookups go through dlsym answers with
// them already).
bool is_submission_hook(const void* fn);
// True for the export names hooks_submit.cpp wraps.
bool is_submission_hook_name(const char* symbol);
// True for a driver entry point name that queues device work (launches, copies, sets, memory
// operations, graph launches): the rule the wrapped names were chosen by. Such a name resolved
// to something other than a hook makes the watch blind (interpose.cpp).
bool is_submission_name(const char* symbol);

}  // namespace cudalloc::shim
