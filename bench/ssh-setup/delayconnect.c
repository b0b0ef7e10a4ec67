// LD_PRELOAD shim: connect() to 127.0.0.1:PORT listed in DELAY_MAP ("port=proxyport,...") goes
// to the proxy port instead, after sleeping DELAY_CONNECT_US (the TCP handshake's round trip).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

// getpeername() on a rerouted socket answers the address the program asked for, so code that
// checks where its sockets went (tern's preconnected streams) sees no difference.
#define MAXFD 65536
static struct sockaddr_in asked[MAXFD];
static char rerouted[MAXFD];

int getpeername(int fd, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = dlsym(RTLD_NEXT, "getpeername");
    if (fd >= 0 && fd < MAXFD && rerouted[fd] && *len >= sizeof(struct sockaddr_in)) {
        int r = real(fd, addr, len);
        if (r == 0) {
            memcpy(addr, &asked[fd], sizeof asked[fd]);
            *len = sizeof asked[fd];
        }
        return r;
    }
    return real(fd, addr, len);
}

int close(int fd) {
    static int (*real)(int);
    if (!real) real = dlsym(RTLD_NEXT, "close");
    if (fd >= 0 && fd < MAXFD) rerouted[fd] = 0;
    return real(fd);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = dlsym(RTLD_NEXT, "connect");
    const char *map = getenv("DELAY_MAP");
    if (map && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        int port = ntohs(a.sin_port);
        const char *p = map;
        while (*p) {
            int from = atoi(p);
            const char *eq = strchr(p, '=');
            if (!eq) break;
            int to = atoi(eq + 1);
            if (from == port) {
                const char *us = getenv("DELAY_CONNECT_US");
                if (us) usleep(atoi(us));
                if (fd >= 0 && fd < MAXFD) {
                    memcpy(&asked[fd], &a, sizeof a);
                    rerouted[fd] = 1;
                }
                a.sin_port = htons(to);
                return real(fd, (struct sockaddr *)&a, sizeof a);
            }
            const char *comma = strchr(eq, ',');
            if (!comma) break;
            p = comma + 1;
        }
    }
    return real(fd, addr, len);
}
