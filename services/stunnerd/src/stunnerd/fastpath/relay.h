/*
 * The relay itself, for `_fastpath.c`: the `FastRelay` object's state, its counters and send
 * batch, and the hot path (drain a ready listener or relay socket with recvmmsg, relay what a
 * route covers, answer plain Binding requests and the first Allocate of each allocation, hand
 * the rest to Python).
 */
#ifndef STUNNERD_FASTPATH_RELAY_H
#define STUNNERD_FASTPATH_RELAY_H

#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "binding.h"
#include "challenge.h"
#include "routes.h"


#define BATCH 64
#define BUF_BYTES 65536
#define MAX_EVENTS 256
#define DRAIN_ROUNDS 8 /* recvmmsg calls per ready socket per poll, for fairness */
#define POLL_PASSES 4  /* epoll_waits per poll while each fills MAX_EVENTS */

enum { KIND_NONE = 0, KIND_LISTENER = 1, KIND_RELAY = 2 };
enum { RX_PKTS = 0, RX_BYTES = 1, TX_PKTS = 2, TX_BYTES = 3 };

typedef struct {
    uint8_t kind;
    int slot; /* listener counters: rx on a listener, tx to clients for a relay */
    uint32_t max_stun; /* listener: STUN messages larger than this are dropped; 0: no filter */
    uint32_t max_datagram; /* listener: read at most this much, drop longer; 0: BUF_BYTES */
    int binding;           /* listener: plain Binding requests are answered here */
    uint8_t *software;     /* ... with this SOFTWARE (software_len bytes, none when 0) */
    size_t software_len;
    uint8_t *challenge;     /* listener: the 401 to an Allocate without credentials (challenge.h) */
    size_t challenge_len;
    double challenge_until; /* ... until then (CLOCK_MONOTONIC); the engine answers after it */
    Budget *budget;         /* listener: challenges per source IP; NULL: no limit */
    uint64_t suppressed; /* listener: challenges not sent, the source over budget, ditto below */
    uint64_t oversized; /* listener: dropped over max_stun, since the last take_drops */
    uint64_t truncated; /* listener: dropped over max_datagram, since the last take_drops */
} FdInfo;

typedef struct {
    PyObject_HEAD
    int epfd;
    Table clients; /* (listener fd, client, channel) -> relay fd, peer */
    Table peers;   /* (relay fd, peer) -> listener fd, client, channel */
    FdInfo *fds;
    size_t nfds;
    uint64_t (*counters)[4];
    size_t ncounters;
    /* receive side */
    struct mmsghdr rx[BATCH];
    struct iovec rx_iov[BATCH];
    struct sockaddr_storage rx_addr[BATCH];
    uint8_t *rx_buf;
    size_t rx_read_bytes; /* the iov_len every slot is armed with */
    int rx_used;          /* slots the last recvmmsg wrote to */
    /* peer -> client sends, batched per listener fd */
    struct mmsghdr tx[BATCH];
    struct iovec tx_iov[BATCH];
    struct sockaddr_storage tx_addr[BATCH];
    uint8_t *tx_buf;
    int tx_count;
    int tx_fd;
    uint64_t relayed, missed, dropped, answered, challenged;
} FastRelay;


/* ------------------------------------------------------------------ helpers */

static int parse_addr(PyObject *host, int port, struct sockaddr_storage *ss, socklen_t *len) {
    const char *text = PyUnicode_AsUTF8(host);
    if (text == NULL)
        return -1;
    memset(ss, 0, sizeof(*ss));
    if (port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "port out of range");
        return -1;
    }
    int family = strchr(text, ':') != NULL ? AF_INET6 : AF_INET;
    void *addr;
    if (family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        in6->sin6_port = htons((uint16_t)port);
        addr = &in6->sin6_addr;
        *len = sizeof(*in6);
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_port = htons((uint16_t)port);
        addr = &in->sin_addr;
        *len = sizeof(*in);
    }
    ss->ss_family = (sa_family_t)family;
    if (inet_pton(family, text, addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IP address: %s", text);
        return -1;
    }
    return 0;
}

static PyObject *addr_tuple(const struct sockaddr_storage *ss) {
    char text[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
        return Py_BuildValue("(si)", text, (int)ntohs(in->sin_port));
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
        return Py_BuildValue("(siII)", text, (int)ntohs(in6->sin6_port),
                             (unsigned)ntohl(in6->sin6_flowinfo), (unsigned)in6->sin6_scope_id);
    }
    Py_RETURN_NONE;
}

static int ensure_fd(FastRelay *self, int fd) {
    if ((size_t)fd < self->nfds)
        return 0;
    size_t n = self->nfds ? self->nfds : 64;
    while (n <= (size_t)fd)
        n *= 2;
    FdInfo *fresh = PyMem_Realloc(self->fds, n * sizeof(FdInfo));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(fresh + self->nfds, 0, (n - self->nfds) * sizeof(FdInfo));
    self->fds = fresh;
    self->nfds = n;
    return 0;
}

static int ensure_slot(FastRelay *self, int slot) {
    if (slot < 0 || (size_t)slot < self->ncounters)
        return 0;
    size_t n = self->ncounters ? self->ncounters : 16;
    while (n <= (size_t)slot)
        n *= 2;
    uint64_t(*fresh)[4] = PyMem_Realloc(self->counters, n * sizeof(*fresh));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(fresh + self->ncounters, 0, (n - self->ncounters) * sizeof(*fresh));
    self->counters = fresh;
    self->ncounters = n;
    return 0;
}

static inline void count(FastRelay *self, int slot, int dir, size_t bytes) {
    if (slot >= 0 && (size_t)slot < self->ncounters) {
        self->counters[slot][dir] += 1;
        self->counters[slot][dir + 1] += bytes;
    }
}

static void flush_tx(FastRelay *self) {
    int sent = 0;
    while (sent < self->tx_count) {
        int n = sendmmsg(self->tx_fd, self->tx + sent, (unsigned)(self->tx_count - sent), 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            /* A full buffer or a vanished client: UDP may drop; skip the datagram at fault. */
            sent++;
            continue;
        }
        sent += n;
    }
    self->tx_count = 0;
}

/* The next slot of the sendmmsg batch to `out_fd`, the batch sent first when it is full or
 * for another socket. */
static inline int tx_slot(FastRelay *self, int out_fd) {
    if (self->tx_count > 0 && (self->tx_fd != out_fd || self->tx_count == BATCH))
        flush_tx(self);
    self->tx_fd = out_fd;
    return self->tx_count++;
}

static void forget_binding(FdInfo *info) {
    PyMem_Free(info->software);
    info->software = NULL;
    info->software_len = 0;
    info->binding = 0;
}

static void forget_challenge(FdInfo *info) {
    PyMem_Free(info->challenge);
    info->challenge = NULL;
    info->challenge_len = 0;
    info->challenge_until = 0;
}

static void forget_budget(FdInfo *info) {
    if (info->budget != NULL)
        PyMem_Free(info->budget->slots);
    PyMem_Free(info->budget);
    info->budget = NULL;
}

/* Everything a listener answers here, for a socket no longer watched (or a new one under its
 * number). */
static void forget_answers(FdInfo *info) {
    forget_binding(info);
    forget_challenge(info);
    forget_budget(info);
    info->suppressed = 0;
}

static int miss(PyObject *out, int fd, const uint8_t *data, size_t len,
                const struct sockaddr_storage *from) {
    PyObject *addr = addr_tuple(from);
    if (addr == NULL)
        return -1;
    PyObject *item = Py_BuildValue("(iy#N)", fd, (const char *)data, (Py_ssize_t)len, addr);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(out, item);
    Py_DECREF(item);
    return rc;
}

/* ------------------------------------------------------------------ the hot path */

/* One recvmmsg of up to BATCH datagrams, each read into at most `read_bytes`. The kernel
 * rewrites only the address lengths of the datagrams it returned: only those are re-armed
 * (all of them when the read size changes), not BATCH slots per call. */
static inline int receive(FastRelay *self, int fd, size_t read_bytes) {
    int rearm = self->rx_read_bytes == read_bytes ? self->rx_used : BATCH;
    for (int i = 0; i < rearm; i++) {
        self->rx_iov[i].iov_len = read_bytes;
        self->rx[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
    }
    self->rx_read_bytes = read_bytes;
    int got = recvmmsg(fd, self->rx, BATCH, MSG_DONTWAIT, NULL);
    self->rx_used = got > 0 ? got : 1;
    return got;
}

/* What the engine would read at all: ChannelData, or a STUN header it accepts (RFC 8489 §5). */
static inline int engine_reads(const uint8_t *d, size_t size, uint32_t max_stun) {
    if (size >= 4 && d[0] >= 0x40 && d[0] <= 0x7F)
        return 1;
    if (size < 20 || size > max_stun || (d[0] & 0xC0) || (d[3] & 0x03))
        return 0;
    if (d[4] != 0x21 || d[5] != 0x12 || d[6] != 0xA4 || d[7] != 0x42)
        return 0;
    return ((size_t)d[2] << 8 | d[3]) + 20 == size;
}

/* Slot `j` of the listener's sendmmsg batch, its `n` bytes written, goes back to `from`; it
 * counts as sent on the listener. */
static void send_answer(FastRelay *self, int fd, int j, size_t n,
                        const struct sockaddr_storage *from) {
    self->tx_iov[j].iov_len = n;
    socklen_t len = from->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in);
    memcpy(&self->tx_addr[j], from, len);
    self->tx[j].msg_hdr.msg_namelen = len;
    count(self, self->fds[fd].slot, TX_PKTS, n);
}

/* A plain Binding request (see binding.h), answered through the listener's sendmmsg batch. */
static void answer_binding(FastRelay *self, int fd, const uint8_t *req,
                           const struct sockaddr_storage *from) {
    FdInfo *info = &self->fds[fd];
    int j = tx_slot(self, fd);
    send_answer(self, fd, j,
                binding_answer(self->tx_iov[j].iov_base, req, from, info->software,
                               info->software_len),
                from);
    self->answered++;
}

/* An Allocate without credentials (challenge.h): its 401 through the listener's sendmmsg batch
 * while the source has challenge budget left, else nothing (counted as suppressed). */
static void answer_challenge(FastRelay *self, int fd, const uint8_t *req,
                             const struct sockaddr_storage *from, double now) {
    FdInfo *info = &self->fds[fd];
    uint8_t key[17];
    if (info->budget != NULL && (!budget_key(key, from) || !budget_allow(info->budget, key, now))) {
        info->suppressed++;
        return;
    }
    int j = tx_slot(self, fd);
    send_answer(self, fd, j,
                challenge_answer(self->tx_iov[j].iov_base, req, info->challenge,
                                 info->challenge_len),
                from);
    self->challenged++;
}

static int drain_listener(FastRelay *self, int fd, PyObject *out) {
    int lslot = self->fds[fd].slot;
    uint32_t max_stun = self->fds[fd].max_stun;
    /* a longer datagram is cut there (MSG_TRUNC) and dropped below: no copy past this */
    size_t read_bytes = self->fds[fd].max_datagram ? self->fds[fd].max_datagram : BUF_BYTES;
    double now = 0; /* read once per drain, when a challenge needs it */
    for (int round = 0; round < DRAIN_ROUNDS; round++) {
        int got = receive(self, fd, read_bytes);
        if (got <= 0)
            return 0;
        for (int i = 0; i < got; i++) {
            uint8_t *d = self->rx_iov[i].iov_base;
            size_t size = self->rx[i].msg_len;
            count(self, lslot, RX_PKTS, size);
            if (self->rx[i].msg_hdr.msg_flags & MSG_TRUNC) {
                self->fds[fd].truncated++;
                self->dropped++;
                continue;
            }
            if (max_stun > 0 && !engine_reads(d, size, max_stun)) {
                if (size > max_stun) /* not ChannelData: the engine's message size limit */
                    self->fds[fd].oversized++;
                self->dropped++;
                continue;
            }
            if (d[0] == 0x00 && self->fds[fd].binding && plain_binding(d, size)) {
                answer_binding(self, fd, d, &self->rx_addr[i]);
                continue;
            }
            if (d[0] == 0x00 && self->fds[fd].challenge != NULL && max_stun > 0 &&
                unsigned_allocate(d, size)) {
                if (now == 0)
                    now = monotonic_s();
                if (now < self->fds[fd].challenge_until) {
                    answer_challenge(self, fd, d, &self->rx_addr[i], now);
                    continue;
                }
            }
            if (size >= 4 && d[0] >= 0x40 && d[0] <= 0x7F) {
                Key k;
                uint16_t channel = (uint16_t)((d[0] << 8) | d[1]);
                if (key_from_sockaddr(&k, fd, channel,
                                      (struct sockaddr *)&self->rx_addr[i]) == 0) {
                    Entry *e = table_find(&self->clients, &k);
                    size_t n = ((size_t)d[2] << 8) | d[3];
                    if (e != NULL && n <= size - 4) {
                        count(self, e->slot, TX_PKTS, n);
                        while (sendto(e->out_fd, d + 4, n, 0, (struct sockaddr *)&e->dest,
                                      e->dest_len) < 0 && errno == EINTR) {
                        }
                        self->relayed++;
                        continue;
                    }
                }
            }
            self->missed++;
            if (miss(out, fd, d, size, &self->rx_addr[i]) < 0)
                return -1;
        }
        if (got < BATCH)
            return 0;
    }
    return 0;
}

static int drain_relay(FastRelay *self, int fd, PyObject *out) {
    for (int round = 0; round < DRAIN_ROUNDS; round++) {
        int got = receive(self, fd, BUF_BYTES - 4); /* room for the ChannelData header */
        if (got <= 0)
            return 0;
        for (int i = 0; i < got; i++) {
            uint8_t *d = self->rx_iov[i].iov_base;
            size_t size = self->rx[i].msg_len;
            Key k;
            Entry *e = NULL;
            if (size <= 0xFFFF && !(self->rx[i].msg_hdr.msg_flags & MSG_TRUNC) &&
                key_from_sockaddr(&k, fd, 0, (struct sockaddr *)&self->rx_addr[i]) == 0)
                e = table_find(&self->peers, &k);
            if (e == NULL) {
                self->missed++;
                if (miss(out, fd, d, size, &self->rx_addr[i]) < 0)
                    return -1;
                continue;
            }
            count(self, e->slot, RX_PKTS, size);
            count(self, self->fds[fd].slot, TX_PKTS, size + 4);
            int j = tx_slot(self, e->out_fd);
            uint8_t *frame = self->tx_iov[j].iov_base;
            frame[0] = (uint8_t)(e->channel >> 8);
            frame[1] = (uint8_t)(e->channel & 0xFF);
            frame[2] = (uint8_t)(size >> 8);
            frame[3] = (uint8_t)(size & 0xFF);
            memcpy(frame + 4, d, size);
            self->tx_iov[j].iov_len = size + 4;
            memcpy(&self->tx_addr[j], &e->dest, e->dest_len);
            self->tx[j].msg_hdr.msg_namelen = e->dest_len;
            self->relayed++;
        }
        if (got < BATCH)
            return 0;
    }
    return 0;
}

/* Drain every socket one epoll_wait reports ready; how many it reported, or -1 on an error. */
static int drain_ready(FastRelay *self, PyObject *out) {
    struct epoll_event events[MAX_EVENTS];
    int n = epoll_wait(self->epfd, events, MAX_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        int fd = events[i].data.fd;
        if ((size_t)fd >= self->nfds)
            continue;
        int rc = 0;
        if (self->fds[fd].kind == KIND_LISTENER)
            rc = drain_listener(self, fd, out);
        else if (self->fds[fd].kind == KIND_RELAY)
            rc = drain_relay(self, fd, out);
        if (rc < 0)
            return -1;
    }
    return n;
}

/* Up to POLL_PASSES epoll_waits while each reports a full MAX_EVENTS: under load one wake-up of
 * the event loop serves more sockets, and the Python around it runs less often per packet. */
static PyObject *FastRelay_poll(FastRelay *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (int pass = 0; pass < POLL_PASSES; pass++) {
        int n = drain_ready(self, out);
        if (n < 0) {
            flush_tx(self);
            Py_DECREF(out);
            return NULL;
        }
        if (n < MAX_EVENTS)
            break;
    }
    if (self->tx_count > 0)
        flush_tx(self);
    return out;
}

#endif
