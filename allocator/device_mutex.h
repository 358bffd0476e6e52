// The device allocator's lock. Its holders run the locked ladder for a few hundred
// nanoseconds, so a thread that finds it taken spins a little before it sleeps (glibc's adaptive
// mutex) rather than paying a futex sleep and wake-up each time: with many threads taking the
// locked path at once (core_pairs cudaFree_16MiB) that beats std::mutex, and costs one thread
// nothing. Contended, the locked path is still a convoy.
#pragma once

#include <pthread.h>

namespace cudalloc {

class DeviceMutex {
 public:
  DeviceMutex() {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    // glibc: spin (with back-off) up to a bound before sleeping in the kernel.
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&m_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~DeviceMutex() { pthread_mutex_destroy(&m_); }
  DeviceMutex(const DeviceMutex&) = delete;
  DeviceMutex& operator=(const DeviceMutex&) = delete;

  void lock() noexcept { pthread_mutex_lock(&m_); }
  bool try_lock() noexcept { return pthread_mutex_trylock(&m_) == 0; }
  void unlock() noexcept { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_;
};

}  // namespace cudalloc
