// wake.c: how long a thread blocked in read(2) on a pipe takes to run after
// another thread writes to it, as a function of how long it was blocked (the
// writer spins meanwhile, so only the reader's CPU went idle): the cost of
// waking a sleeping vCPU, which a copy pays at each of its wake-ups
// (docs/performance.md, "Where the misses stand"). Build it here and carry
// the static binary to a host without a compiler:
//
//   gcc -O2 -static -pthread -o gpubin/wake scripts/wake.c
//   gpubin/wake [WRITER_CPU READER_CPU]
//
// It prints, for each idle time, the p50, p90 and minimum of 300 wake-ups.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>

static int p1[2], p2[2];
static int cpuA = -1, cpuB = -1;
static inline int64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (int64_t)t.tv_sec*1000000000LL + t.tv_nsec; }
static void pin(int c) { if (c < 0) return; cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }

static void *reader(void *arg) {
	pin(cpuB);
	int64_t t;
	for (;;) {
		if (read(p1[0], &t, 8) != 8) return NULL;
		int64_t d = now() - t;
		write(p2[1], &d, 8);
	}
}
static int cmp(const void *a, const void *b) { int64_t x=*(int64_t*)a, y=*(int64_t*)b; return x<y?-1:x>y; }
int main(int argc, char **argv) {
	if (argc > 2) { cpuA = atoi(argv[1]); cpuB = atoi(argv[2]); }
	pipe(p1); pipe(p2);
	pthread_t th; pthread_create(&th, NULL, reader, NULL);
	pin(cpuA);
	int delays[] = {0, 10, 25, 50, 100, 150, 200, 250, 300, 400, 600, 1000, 3000};
	enum { N = 300 };
	static int64_t lat[N];
	for (size_t k = 0; k < sizeof delays/sizeof delays[0]; k++) {
		for (int i = 0; i < N; i++) {
			int64_t until = now() + delays[k]*1000LL;
			while (now() < until) ;
			int64_t t = now();
			write(p1[1], &t, 8);
			int64_t d; read(p2[0], &d, 8);
			lat[i] = d;
		}
		qsort(lat, N, sizeof lat[0], cmp);
		printf("idle %5d us: wake p50 %6.1f us  p90 %6.1f us  min %6.1f\n", delays[k], lat[N/2]/1e3, lat[N*9/10]/1e3, lat[0]/1e3);
		fflush(stdout);
	}
	return 0;
}
