/* The header is C: built as C99 in both forms. Not preloaded (argv[1] "absent"), the dynamic
 * wrappers say NOT_LOADED; preloaded, the library answers with its own version. */
#define CUDALLOC_DYNAMIC
#include <cudalloc/cudalloc.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  int absent = argc > 1 && strcmp(argv[1], "absent") == 0;
  int64_t v = -1;
  int status = cudalloc_stat(CUDALLOC_CURRENT_DEVICE, "num_ooms", &v);
  printf("api version %d, stat status %d (%s), value %lld\n", cudalloc_api_version(), status,
         cudalloc_status_string(status), (long long)v);
  if (absent) return status == CUDALLOC_ERROR_NOT_LOADED && v == -1 && cudalloc_api_version() == 0 ? 0 : 1;
  /* No CUDA call made: the figures are the library's own zeros, not an error. */
  return status == CUDALLOC_OK && v == 0 && cudalloc_api_version() == CUDALLOC_API_VERSION ? 0 : 1;
}
