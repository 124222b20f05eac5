/*
 * relay.c: the relay floor's C relay (bench/floor.go), nginx's structure
 * with nothing around it: one edge-triggered epoll loop that reads the
 * source socket and writes what it read to the destination. It dials both
 * (127.0.0.1:SRC_PORT, 127.0.0.1:DST_PORT), relays until the source closes,
 * and prints its CPU time over the relay as one JSON line.
 *
 *   cc -O2 -o relay relay.c && ./relay SRC_PORT DST_PORT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int dial(const char *addr) {
	char host[64];
	const char *colon = strrchr(addr, ':');
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	if (colon == NULL || colon - addr >= (long)sizeof host) {
		fprintf(stderr, "relay: bad address %s\n", addr);
		exit(2);
	}
	memcpy(host, addr, colon - addr);
	host[colon - addr] = 0;
	a.sin_port = htons(atoi(colon + 1));
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
		fprintf(stderr, "relay: bad address %s\n", addr);
		exit(2);
	}
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("relay: connect");
		exit(1);
	}
	return s;
}

static double usec(struct timeval t) { return t.tv_sec * 1e6 + t.tv_usec; }

static int write_all(int fd, const char *p, ssize_t n) {
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= w;
	}
	return 0;
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: relay SRC_HOST:PORT DST_HOST:PORT\n");
		return 2;
	}
	int src = dial(argv[1]), dst = dial(argv[2]);
	fcntl(src, F_SETFL, O_NONBLOCK);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = src};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, src, &ev) != 0) {
		perror("relay: epoll");
		return 1;
	}
	struct rusage r0, r1;
	struct timespec w0, w1;
	getrusage(RUSAGE_SELF, &r0);
	clock_gettime(CLOCK_MONOTONIC, &w0);
	static char buf[4096];
	struct epoll_event evs[128];
	long reads = 0, bytes = 0;
	int done = 0;
	while (!done) {
		int n = epoll_wait(ep, evs, 128, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("relay: epoll_wait");
			return 1;
		}
		for (int i = 0; i < n && !done; i++) {
			/* Read until a read comes up short (the socket is empty), or
			 * to the end once the peer hung up. */
			int hup = evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
			for (;;) {
				ssize_t m = read(src, buf, sizeof buf);
				if (m < 0 && errno == EINTR)
					continue;
				if (m < 0 && errno == EAGAIN)
					break;
				if (m <= 0) {
					done = 1;
					break;
				}
				reads++;
				bytes += m;
				if (write_all(dst, buf, m) != 0) {
					perror("relay: write");
					return 1;
				}
				if (m < (ssize_t)sizeof buf && !hup)
					break;
			}
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &w1);
	getrusage(RUSAGE_SELF, &r1);
	printf("{\"reads\":%ld,\"bytes\":%ld,\"user_us\":%.0f,\"sys_us\":%.0f,\"wall_us\":%.0f}\n", reads, bytes,
	       usec(r1.ru_utime) - usec(r0.ru_utime), usec(r1.ru_stime) - usec(r0.ru_stime),
	       (w1.tv_sec - w0.tv_sec) * 1e6 + (w1.tv_nsec - w0.tv_nsec) / 1e3);
	return 0;
}
