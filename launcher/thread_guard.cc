// Every thread of the meshrun process starts through pthread_create: the
// agent's, Asio's, gRPC's pools and those of a daemon it hosts. The
// definition here, in the executable, interposes on glibc's for every shared
// library too.
//
// Why: when the machine is out of threads (kernel.pid_max or
// kernel.threads-max reached by all processes together, RLIMIT_NPROC, a
// cgroup's pids.max) or of address space for a stack, pthread_create fails
// with EAGAIN, and nothing above it handles that: std::thread throws, which on
// the agent's threads is std::terminate and SIGABRT, and gRPC 1.51 carries on
// without the thread and later hangs at shutdown waiting for it. 1,000 agents
// on a 16-core machine (33 threads each, gRPC sizing its pools by cores)
// exceed the default pid_max of 32,768 that way. A thread that still cannot
// start after a short retry (another process may end meanwhile) ends the
// process here, with one line naming the limits and kResourceExitCode,
// removing the agent's temporary log root first; the workers die with the
// agent (PR_SET_PDEATHSIG), the next agent removes its empty cgroups, and the
// daemon sees the node leave.

#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "agent/resources.h"

// Under ASan the sanitizer's runtime intercepts pthread_create to register
// each thread's stack; a definition here would bypass it (clang links the
// runtime into the executable, so RTLD_NEXT finds glibc's). No guard there.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MESHRUN_NO_THREAD_GUARD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define MESHRUN_NO_THREAD_GUARD 1
#endif

#ifndef MESHRUN_NO_THREAD_GUARD

namespace {

using CreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);

// How long a thread that cannot start for want of resources is retried.
constexpr std::chrono::milliseconds kRetryFor{1000};

CreateFn RealCreate() {
  static std::atomic<CreateFn> real{nullptr};
  CreateFn create = real.load(std::memory_order_acquire);
  if (create == nullptr) {
    create = reinterpret_cast<CreateFn>(dlsym(RTLD_NEXT, "pthread_create"));
    real.store(create, std::memory_order_release);
  }
  return create;
}

[[noreturn]] void GiveUp(int error) {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true)) {
    const std::string line =
        "meshrun: cannot create a thread: " + std::string(std::strerror(error)) + " (" +
        meshrun::agent::ThreadLimits() + ")\n";
    (void)!write(STDERR_FILENO, line.data(), line.size());
    meshrun::agent::RemoveOnResourceExit();
    _exit(meshrun::agent::kResourceExitCode);
  }
  while (true) pause();  // another thread is saying it and ending the process
}

}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                              void* (*start)(void*), void* arg) noexcept {
  const CreateFn create = RealCreate();
  if (create == nullptr) return ENOSYS;
  int error = create(thread, attr, start, arg);
  if (error != EAGAIN) return error;
  const auto give_up = std::chrono::steady_clock::now() + kRetryFor;
  for (std::chrono::milliseconds delay{1};; delay = std::min(delay * 2, kRetryFor / 8)) {
    const timespec pause{0, static_cast<long>(delay.count()) * 1000000};
    nanosleep(&pause, nullptr);
    error = create(thread, attr, start, arg);
    if (error != EAGAIN) return error;
    if (std::chrono::steady_clock::now() >= give_up) GiveUp(error);
  }
}

#endif  // MESHRUN_NO_THREAD_GUARD
