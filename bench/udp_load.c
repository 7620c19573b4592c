/*
 * The load of `python -m bench offload`: a paced UDP generator and an echo peer, in C, so that
 * their own CPU stays small next to the relay's on a small machine (the bench subtracts it).
 *
 *   udp_load peer IP PORT MAX_SECONDS
 *       Echo every datagram to its sender (recvmmsg/sendmmsg, batches of 64) until SIGTERM or
 *       MAX_SECONDS. Prints "ready" once bound.
 *   udp_load gen DST_IP DST_PORT CHANNEL PAYLOAD PPS MESSAGES STRAGGLERS_MS FD...
 *       On each inherited UDP socket FD, send MESSAGES datagrams of PAYLOAD bytes to DST, PPS
 *       per second per socket (0: no pacing, a flood), each behind a ChannelData header for
 *       CHANNEL (0: none, plain UDP), and read what comes back for the round-trip time carried
 *       in it. Prints "start" as the first datagram leaves, then one JSON line: sent, received,
 *       send errors, RTT p50/p99 (ms), and for the window from "start" to the end of the
 *       stragglers' wait, its own CPU (getrusage) and the machine's busy and softirq seconds
 *       from /proc/stat.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define MAX_DATAGRAM 2048
#define HEADER_BYTES 4
#define STAMP_BYTES 16 /* sequence number (8), send time in ns (8) */

static volatile sig_atomic_t stopping;

static void on_term(int sig)
{
	(void)sig;
	stopping = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double own_cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* The machine's busy and softirq seconds: user nice system irq softirq steal, not idle or
 * iowait. Steal counts as busy because a process's own CPU time (getrusage, /proc/PID/stat)
 * includes what the hypervisor took while it was running. */
static void machine_s(double *busy, double *softirq)
{
	unsigned long long v[8] = {0};
	FILE *f = fopen("/proc/stat", "r");
	double tick = (double)sysconf(_SC_CLK_TCK);

	if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
			 &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) {
		fprintf(stderr, "cannot read /proc/stat\n");
		exit(2);
	}
	fclose(f);
	*busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
	*softirq = (v[5] + v[6]) / tick;
}

static int udp_socket(const char *ip, int port, struct sockaddr_in *addr)
{
	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, ip, &addr->sin_addr) != 1) {
		fprintf(stderr, "not an IPv4 address: %s\n", ip);
		exit(2);
	}
	return socket(AF_INET, SOCK_DGRAM, 0);
}

static int peer(int argc, char **argv)
{
	struct sockaddr_in addr, names[BATCH];
	struct mmsghdr msgs[BATCH];
	struct iovec iovs[BATCH];
	static char bufs[BATCH][MAX_DATAGRAM];
	struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
	int size = 8 << 20, fd;
	uint64_t end;

	if (argc != 5) {
		fprintf(stderr, "usage: udp_load peer IP PORT MAX_SECONDS\n");
		return 2;
	}
	fd = udp_socket(argv[2], atoi(argv[3]), &addr);
	end = now_ns() + (uint64_t)atoi(argv[4]) * 1000000000ull;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)); /* to see SIGTERM and the end */
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		perror("bind");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	while (!stopping && now_ns() < end) {
		int got;

		for (int i = 0; i < BATCH; i++) {
			iovs[i] = (struct iovec){.iov_base = bufs[i], .iov_len = MAX_DATAGRAM};
			msgs[i].msg_hdr = (struct msghdr){.msg_name = &names[i],
							  .msg_namelen = sizeof(names[i]),
							  .msg_iov = &iovs[i],
							  .msg_iovlen = 1};
		}
		got = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
		if (got <= 0)
			continue;
		for (int i = 0; i < got; i++)
			iovs[i].iov_len = msgs[i].msg_len;
		sendmmsg(fd, msgs, (unsigned)got, 0);
	}
	return 0;
}

struct gen {
	int ep;
	uint32_t *rtt_us;
	uint64_t received, rtt_count, rtt_cap;
	unsigned header;
};

static void take(struct gen *g, int fd)
{
	char buf[MAX_DATAGRAM];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		uint64_t sent_at;

		if (n < 0)
			return;
		g->received++;
		if ((size_t)n < g->header + STAMP_BYTES)
			continue;
		memcpy(&sent_at, buf + g->header + 8, 8);
		if (g->rtt_count < g->rtt_cap)
			g->rtt_us[g->rtt_count++] = (uint32_t)((now_ns() - sent_at) / 1000);
	}
}

/* Read what arrives until `deadline` (ns); once, without waiting, if it has passed. */
static void drain_until(struct gen *g, uint64_t deadline)
{
	struct epoll_event evs[256];

	for (;;) {
		uint64_t now = now_ns();
		int wait_ms = now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
		int n = epoll_wait(g->ep, evs, 256, wait_ms);

		for (int i = 0; i < n; i++)
			take(g, evs[i].data.fd);
		if (now_ns() >= deadline && n < 256)
			return;
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

static int gen(int argc, char **argv)
{
	struct sockaddr_in dst;
	struct gen g = {0};
	char frame[MAX_DATAGRAM];
	unsigned channel, payload;
	long pps, messages, stragglers_ms;
	int nfds = argc - 9, *fds, probe;
	uint64_t sent = 0, errors = 0, t0, interval;
	double cpu0, busy0, soft0, cpu1, busy1, soft1;

	if (nfds < 1) {
		fprintf(stderr, "usage: udp_load gen DST_IP DST_PORT CHANNEL PAYLOAD PPS MESSAGES "
				"STRAGGLERS_MS FD...\n");
		return 2;
	}
	probe = udp_socket(argv[2], atoi(argv[3]), &dst);
	close(probe);
	channel = (unsigned)strtoul(argv[4], NULL, 0);
	payload = (unsigned)atoi(argv[5]);
	pps = atol(argv[6]);
	messages = atol(argv[7]);
	stragglers_ms = atol(argv[8]);
	g.header = channel ? HEADER_BYTES : 0;
	if (payload < STAMP_BYTES || payload + g.header > sizeof(frame)) {
		fprintf(stderr, "PAYLOAD must be %d..%zu bytes\n", STAMP_BYTES,
			sizeof(frame) - g.header);
		return 2;
	}
	fds = calloc((size_t)nfds, sizeof(int));
	g.rtt_cap = (uint64_t)nfds * (uint64_t)messages;
	g.rtt_us = calloc(g.rtt_cap ? g.rtt_cap : 1, sizeof(uint32_t));
	g.ep = epoll_create1(0);
	if (!fds || !g.rtt_us || g.ep < 0) {
		perror("setup");
		return 1;
	}
	for (int i = 0; i < nfds; i++) {
		struct epoll_event ev = {.events = EPOLLIN};

		fds[i] = atoi(argv[9 + i]);
		fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
		ev.data.fd = fds[i];
		if (epoll_ctl(g.ep, EPOLL_CTL_ADD, fds[i], &ev)) {
			perror("epoll_ctl");
			return 1;
		}
	}
	memset(frame, 'm', sizeof(frame));
	if (channel) {
		uint16_t hdr[2] = {htons((uint16_t)channel), htons((uint16_t)payload)};

		memcpy(frame, hdr, sizeof(hdr));
	}
	interval = pps > 0 ? 1000000000ull / (uint64_t)pps : 0;
	printf("start\n");
	fflush(stdout);
	cpu0 = own_cpu_s();
	machine_s(&busy0, &soft0);
	t0 = now_ns();
	for (long m = 0; m < messages && !stopping; m++) {
		for (int i = 0; i < nfds; i++) {
			uint64_t seq = sent, at = now_ns();

			memcpy(frame + g.header, &seq, 8);
			memcpy(frame + g.header + 8, &at, 8);
			if (sendto(fds[i], frame, g.header + payload, 0, (struct sockaddr *)&dst,
				   sizeof(dst)) < 0)
				errors++;
			else
				sent++;
		}
		drain_until(&g, interval ? t0 + (uint64_t)(m + 1) * interval : 0);
	}
	drain_until(&g, now_ns() + (uint64_t)stragglers_ms * 1000000ull);
	cpu1 = own_cpu_s();
	machine_s(&busy1, &soft1);
	qsort(g.rtt_us, g.rtt_count, sizeof(uint32_t), cmp_u32);
	printf("{\"sent\": %llu, \"received\": %llu, \"send_errors\": %llu, "
	       "\"rtt_p50_ms\": %.3f, \"rtt_p99_ms\": %.3f, \"wall_s\": %.3f, \"gen_cpu_s\": %.3f, "
	       "\"busy_s\": %.3f, \"softirq_s\": %.3f}\n",
	       (unsigned long long)sent, (unsigned long long)g.received,
	       (unsigned long long)errors,
	       g.rtt_count ? g.rtt_us[g.rtt_count / 2] / 1e3 : -1.0,
	       g.rtt_count ? g.rtt_us[g.rtt_count * 99 / 100] / 1e3 : -1.0,
	       (now_ns() - t0) / 1e9, cpu1 - cpu0, busy1 - busy0, soft1 - soft0);
	return 0;
}

int main(int argc, char **argv)
{
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	if (argc > 1 && !strcmp(argv[1], "peer"))
		return peer(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "gen"))
		return gen(argc, argv);
	fprintf(stderr, "usage: udp_load peer|gen ...\n");
	return 2;
}
