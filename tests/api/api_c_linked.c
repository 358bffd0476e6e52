/* The header without CUDALLOC_DYNAMIC: the functions linked from libcudalloc.so. */
#include <cudalloc/cudalloc.h>
#include <stdio.h>

int main(void) {
  size_t n = cudalloc_stat_count();
  printf("cudalloc %s, api %d, %zu statistics\n", cudalloc_version(), cudalloc_api_version(), n);
  return cudalloc_api_version() == CUDALLOC_API_VERSION && n > 0 ? 0 : 1;
}
