/* What a first touch of memory costs on this machine, against a later one: the probe behind
 * docs/performance.md section 24. It maps 128 MiB (MAP_POPULATE, as ferryd's pools), then times
 * passes over it from user space (memset) and from the kernel (write() into a pipe, which copies
 * from the buffer, as a tcp send does). On bare metal every pass runs at memory speed; on some VMs
 * the first pass from each side is many times slower.
 *
 *   cc -O2 -o /tmp/first-touch scripts/first-touch.c && /tmp/first-touch
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { mib = 1 << 20 };
static const size_t bytes = (size_t)128 * mib;
static char scratch[mib];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double user_pass(char* b) {
  const double t = now();
  memset(b, 1, bytes);
  return (double)bytes / (now() - t) / 1e9;
}

static double kernel_pass(char* b, const int p[2]) {
  const double t = now();
  for (size_t o = 0; o < bytes; o += mib) {
    if (write(p[1], b + o, mib) != mib) return -1;
    for (size_t got = 0; got < mib;) {
      const ssize_t r = read(p[0], scratch, mib);
      if (r <= 0) return -1;
      got += (size_t)r;
    }
  }
  return (double)bytes / (now() - t) / 1e9;
}

int main(void) {
  int p[2];
  if (pipe(p) != 0 || fcntl(p[1], F_SETPIPE_SZ, mib) < 0) return perror("pipe"), 1;
  char* b = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (b == MAP_FAILED) return perror("mmap"), 1;
  const double u1 = user_pass(b), u2 = user_pass(b);
  const double k1 = kernel_pass(b, p), k2 = kernel_pass(b, p);
  printf("user   (memset):       first %.2f GB/s, then %.2f GB/s\n", u1, u2);
  printf("kernel (pipe write):   first %.2f GB/s, then %.2f GB/s\n", k1, k2);
  return 0;
}
