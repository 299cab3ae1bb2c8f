// LD_PRELOAD shim for scripts/scale-agents.sh: reports MORE_CPUS (default 16)
// processors to the process, so gRPC sizes its thread pools as on a larger
// machine (an agent runs 14 threads on 2 cores, 33 on 16). With it, the
// 1,000-agent abort of issue 27 (kernel.pid_max 32,768 run out on a 16-core
// machine) reproduces on 2 cores:
//   cc -shared -fPIC -O2 -o /tmp/more_cpus.so scripts/lib/more_cpus.c -ldl
//   scripts/scale-agents.sh --agents 1000 --agent-env LD_PRELOAD=/tmp/more_cpus.so
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static long Cpus(void) {
  const char* text = getenv("MORE_CPUS");
  long n = text ? strtol(text, NULL, 10) : 16;
  return n > 0 ? n : 16;
}

long sysconf(int name) {
  static long (*real)(int);
  if (!real) real = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
  if (name == _SC_NPROCESSORS_CONF || name == _SC_NPROCESSORS_ONLN) return Cpus();
  return real(name);
}

int get_nprocs(void) { return (int)Cpus(); }
int get_nprocs_conf(void) { return (int)Cpus(); }
