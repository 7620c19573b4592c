/*
 * stunnerd._fastpath: the established-channel relay of a TURN-UDP listener, in C.
 *
 * One `FastRelay` per event loop owns an epoll set holding the listener sockets and the relay
 * sockets of their allocations. The event loop watches the epoll descriptor; when it is ready,
 * `poll()` drains every ready socket with recvmmsg. A ChannelData frame from a client whose
 * (listener, client address, channel) has a route is sent to its peer through the allocation's
 * relay socket; a datagram from a peer whose (relay socket, peer address) has a route goes back
 * to the client as ChannelData, batched with sendmmsg per listener socket. Neither creates a
 * Python object. Everything else is returned to Python as (fd, bytes, address) for the engine.
 *
 * The tables are fed from the engine's channel-route effects (routes added and removed, relay
 * sockets closed); counters are kept per slot (a listener's or a cluster's traffic) and handed
 * to Python by `take_counters()`, which zeroes them.
 *
 * A listener socket may be given a STUN size limit: then what the engine would drop unread is
 * dropped here, before any Python object exists (counted in `stats()["dropped"]`): a datagram
 * that is neither ChannelData (first byte 0x40-0x7F) nor a STUN message with a valid header
 * (two zero bits, the magic cookie, a length matching the datagram and a multiple of 4, at most
 * the limit), and anything truncated: a listener may also be given a datagram limit, and then
 * only that much is read of a datagram (a longer one comes back with MSG_TRUNC), so a 60 KB
 * datagram costs the copy of a few KB. This keeps what a flood of junk costs close to the cost
 * of receiving it (see `python -m bench hostile`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "binding.h"

#define BATCH 64
#define BUF_BYTES 65536
#define MAX_EVENTS 256
#define DRAIN_ROUNDS 8 /* recvmmsg calls per ready socket per poll, for fairness */
#define POLL_PASSES 4  /* epoll_waits per poll while each fills MAX_EVENTS */

enum { KIND_NONE = 0, KIND_LISTENER = 1, KIND_RELAY = 2 };
enum { RX_PKTS = 0, RX_BYTES = 1, TX_PKTS = 2, TX_BYTES = 3 };

typedef struct {
    int32_t fd;
    uint16_t channel;
    uint16_t family;
    uint16_t port; /* network order */
    uint16_t pad;
    uint8_t addr[16];
} Key;

typedef struct {
    Key key;
    int state; /* 0 empty, 1 used, 2 deleted */
    int out_fd;
    struct sockaddr_storage dest;
    socklen_t dest_len;
    uint16_t channel;
    int slot; /* cluster counters */
} Entry;

typedef struct {
    Entry *entries;
    size_t cap, used, deleted;
} Table;

typedef struct {
    uint8_t kind;
    int slot; /* listener counters: rx on a listener, tx to clients for a relay */
    uint32_t max_stun; /* listener: STUN messages larger than this are dropped; 0: no filter */
    uint32_t max_datagram; /* listener: read at most this much, drop longer; 0: BUF_BYTES */
    int binding;           /* listener: plain Binding requests are answered here */
    uint8_t *software;     /* ... with this SOFTWARE (software_len bytes, none when 0) */
    size_t software_len;
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
    uint64_t relayed, missed, dropped, answered;
} FastRelay;

/* ------------------------------------------------------------------ keys and tables */

static int key_from_sockaddr(Key *k, int fd, uint16_t channel, const struct sockaddr *sa) {
    memset(k, 0, sizeof(*k));
    k->fd = fd;
    k->channel = channel;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        k->family = AF_INET;
        k->port = in->sin_port;
        memcpy(k->addr, &in->sin_addr, 4);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        k->family = AF_INET6;
        k->port = in6->sin6_port;
        memcpy(k->addr, &in6->sin6_addr, 16);
        return 0;
    }
    return -1;
}

_Static_assert(sizeof(Key) <= 32, "a key hashes as four 64-bit words");

/* Four multiply-xor rounds over the key's words and a final avalanche (the low bits pick the
 * slot): a few instructions per lookup, where a byte-at-a-time hash cost ~150. */
static uint64_t key_hash(const Key *k) {
    uint64_t w[4] = {0, 0, 0, 0};
    memcpy(w, k, sizeof(*k));
    uint64_t h = (w[0] ^ 0x9E3779B97F4A7C15ULL) * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ w[1] ^ (h >> 29)) * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ w[2] ^ (h >> 29)) * 0xC2B2AE3D27D4EB4FULL;
    h = (h ^ w[3] ^ (h >> 29)) * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 32;
    h *= 0xFF51AFD7ED558CCDULL;
    return h ^ (h >> 29);
}

static Entry *table_find(Table *t, const Key *k) {
    if (t->cap == 0)
        return NULL;
    size_t mask = t->cap - 1;
    size_t i = (size_t)key_hash(k) & mask;
    for (size_t n = 0; n < t->cap; n++, i = (i + 1) & mask) {
        Entry *e = &t->entries[i];
        if (e->state == 0)
            return NULL;
        if (e->state == 1 && memcmp(&e->key, k, sizeof(*k)) == 0)
            return e;
    }
    return NULL;
}

static int table_grow(Table *t) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    if (t->used * 2 < t->cap)
        cap = t->cap; /* mostly tombstones: rehash at the same size */
    Entry *fresh = PyMem_Calloc(cap, sizeof(Entry));
    if (fresh == NULL)
        return -1;
    size_t mask = cap - 1;
    for (size_t j = 0; j < t->cap; j++) {
        Entry *e = &t->entries[j];
        if (e->state != 1)
            continue;
        size_t i = (size_t)key_hash(&e->key) & mask;
        while (fresh[i].state != 0)
            i = (i + 1) & mask;
        fresh[i] = *e;
    }
    PyMem_Free(t->entries);
    t->entries = fresh;
    t->cap = cap;
    t->deleted = 0;
    return 0;
}

static Entry *table_put(Table *t, const Key *k) {
    Entry *e = table_find(t, k);
    if (e != NULL)
        return e;
    if ((t->used + t->deleted + 1) * 10 > t->cap * 6 && table_grow(t) < 0)
        return NULL;
    size_t mask = t->cap - 1;
    size_t i = (size_t)key_hash(k) & mask;
    while (t->entries[i].state == 1)
        i = (i + 1) & mask;
    e = &t->entries[i];
    if (e->state == 2)
        t->deleted--;
    memset(e, 0, sizeof(*e));
    e->key = *k;
    e->state = 1;
    t->used++;
    return e;
}

static void table_delete(Table *t, Entry *e) {
    e->state = 2;
    t->used--;
    t->deleted++;
}

static void table_forget_fd(Table *t, int fd) {
    for (size_t j = 0; j < t->cap; j++) {
        Entry *e = &t->entries[j];
        if (e->state == 1 && (e->key.fd == fd || e->out_fd == fd))
            table_delete(t, e);
    }
}

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

/* A plain Binding request (see binding.h), answered through the listener's sendmmsg batch. */
static void answer_binding(FastRelay *self, int fd, const uint8_t *req,
                           const struct sockaddr_storage *from) {
    FdInfo *info = &self->fds[fd];
    int j = tx_slot(self, fd);
    size_t n = binding_answer(self->tx_iov[j].iov_base, req, from, info->software,
                              info->software_len);
    self->tx_iov[j].iov_len = n;
    socklen_t len = from->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in);
    memcpy(&self->tx_addr[j], from, len);
    self->tx[j].msg_hdr.msg_namelen = len;
    count(self, info->slot, TX_PKTS, n);
    self->answered++;
}

static int drain_listener(FastRelay *self, int fd, PyObject *out) {
    int lslot = self->fds[fd].slot;
    uint32_t max_stun = self->fds[fd].max_stun;
    /* a longer datagram is cut there (MSG_TRUNC) and dropped below: no copy past this */
    size_t read_bytes = self->fds[fd].max_datagram ? self->fds[fd].max_datagram : BUF_BYTES;
    for (int round = 0; round < DRAIN_ROUNDS; round++) {
        int got = receive(self, fd, read_bytes);
        if (got <= 0)
            return 0;
        for (int i = 0; i < got; i++) {
            uint8_t *d = self->rx_iov[i].iov_base;
            size_t size = self->rx[i].msg_len;
            count(self, lslot, RX_PKTS, size);
            if (self->rx[i].msg_hdr.msg_flags & MSG_TRUNC ||
                (max_stun > 0 && !engine_reads(d, size, max_stun))) {
                self->dropped++;
                continue;
            }
            if (d[0] == 0x00 && self->fds[fd].binding && plain_binding(d, size)) {
                answer_binding(self, fd, d, &self->rx_addr[i]);
                continue;
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

/* ------------------------------------------------------------------ management */

static PyObject *FastRelay_watch(FastRelay *self, PyObject *args) {
    int fd, kind, slot, max_stun = 0, max_datagram = 0;
    if (!PyArg_ParseTuple(args, "iii|ii", &fd, &kind, &slot, &max_stun, &max_datagram))
        return NULL;
    if (fd < 0 || (kind != KIND_LISTENER && kind != KIND_RELAY) || max_stun < 0 ||
        max_datagram < 0 || max_datagram > BUF_BYTES) {
        PyErr_SetString(PyExc_ValueError, "bad fd, kind or size limit");
        return NULL;
    }
    if (ensure_fd(self, fd) < 0 || ensure_slot(self, slot) < 0)
        return NULL;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 &&
        (errno != EEXIST || epoll_ctl(self->epfd, EPOLL_CTL_MOD, fd, &ev) < 0))
        return PyErr_SetFromErrno(PyExc_OSError);
    forget_binding(&self->fds[fd]); /* a new socket under a reused number */
    self->fds[fd].kind = (uint8_t)kind;
    self->fds[fd].slot = slot;
    self->fds[fd].max_stun = kind == KIND_LISTENER ? (uint32_t)max_stun : 0;
    self->fds[fd].max_datagram = kind == KIND_LISTENER ? (uint32_t)max_datagram : 0;
    Py_RETURN_NONE;
}

static PyObject *FastRelay_answer_binding(FastRelay *self, PyObject *args) {
    int fd;
    const char *software;
    Py_ssize_t software_len;
    if (!PyArg_ParseTuple(args, "iy#", &fd, &software, &software_len))
        return NULL;
    if (fd < 0 || (size_t)fd >= self->nfds || self->fds[fd].kind != KIND_LISTENER ||
        software_len > MAX_SOFTWARE) {
        PyErr_SetString(PyExc_ValueError, "not a watched listener, or SOFTWARE too long");
        return NULL;
    }
    FdInfo *info = &self->fds[fd];
    forget_binding(info);
    if (software_len > 0) {
        info->software = PyMem_Malloc((size_t)software_len);
        if (info->software == NULL)
            return PyErr_NoMemory();
        memcpy(info->software, software, (size_t)software_len);
        info->software_len = (size_t)software_len;
    }
    info->binding = 1;
    Py_RETURN_NONE;
}

static PyObject *FastRelay_forget(FastRelay *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    if (self->tx_count > 0 && self->tx_fd == fd)
        self->tx_count = 0;
    table_forget_fd(&self->clients, fd);
    table_forget_fd(&self->peers, fd);
    Py_RETURN_NONE;
}

static PyObject *FastRelay_unwatch(FastRelay *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    if (fd >= 0 && (size_t)fd < self->nfds && self->fds[fd].kind != KIND_NONE) {
        epoll_ctl(self->epfd, EPOLL_CTL_DEL, fd, NULL); /* fails harmlessly if already closed */
        self->fds[fd].kind = KIND_NONE;
        forget_binding(&self->fds[fd]);
    }
    return FastRelay_forget(self, args);
}

static PyObject *add_route(FastRelay *self, Table *t, PyObject *args) {
    int in_fd, in_port, channel, out_fd, dest_port, slot;
    PyObject *in_host, *dest_host;
    if (!PyArg_ParseTuple(args, "iUiiiUii", &in_fd, &in_host, &in_port, &channel, &out_fd,
                          &dest_host, &dest_port, &slot))
        return NULL;
    struct sockaddr_storage from, dest;
    socklen_t from_len, dest_len;
    if (parse_addr(in_host, in_port, &from, &from_len) < 0 ||
        parse_addr(dest_host, dest_port, &dest, &dest_len) < 0 || ensure_slot(self, slot) < 0)
        return NULL;
    Key k;
    uint16_t key_channel = t == &self->clients ? (uint16_t)channel : 0;
    key_from_sockaddr(&k, in_fd, key_channel, (struct sockaddr *)&from);
    Entry *e = table_put(t, &k);
    if (e == NULL)
        return PyErr_NoMemory();
    e->out_fd = out_fd;
    e->dest = dest;
    e->dest_len = dest_len;
    e->channel = (uint16_t)channel;
    e->slot = slot;
    Py_RETURN_NONE;
}

/* The entry for (fd, host, port, channel) arguments, NULL with *found = 0 when there is none,
 * NULL with *found = -1 on bad arguments. */
static Entry *find_route(FastRelay *self, Table *t, PyObject *args, int *found) {
    int in_fd, in_port, channel;
    PyObject *in_host;
    struct sockaddr_storage from;
    socklen_t from_len;
    *found = -1;
    if (!PyArg_ParseTuple(args, "iUii", &in_fd, &in_host, &in_port, &channel) ||
        parse_addr(in_host, in_port, &from, &from_len) < 0)
        return NULL;
    Key k;
    key_from_sockaddr(&k, in_fd, t == &self->clients ? (uint16_t)channel : 0,
                      (struct sockaddr *)&from);
    Entry *e = table_find(t, &k);
    *found = e != NULL;
    return e;
}

static PyObject *remove_route(FastRelay *self, Table *t, PyObject *args) {
    int found;
    Entry *e = find_route(self, t, args, &found);
    if (found < 0)
        return NULL;
    if (e != NULL)
        table_delete(t, e);
    Py_RETURN_NONE;
}

static PyObject *lookup_route(FastRelay *self, Table *t, PyObject *args) {
    int found;
    Entry *e = find_route(self, t, args, &found);
    if (found < 0)
        return NULL;
    if (e == NULL)
        Py_RETURN_NONE;
    PyObject *dest = addr_tuple(&e->dest);
    if (dest == NULL)
        return NULL;
    return Py_BuildValue("(iNi)", e->out_fd, dest, (int)e->channel);
}

/* FastRelay_<op>_<side>_route: `op`_route on the clients or the peers table. */
#define ROUTE_METHOD(op, side)                                                                 \
    static PyObject *FastRelay_##op##_##side##_route(FastRelay *self, PyObject *args) {        \
        return op##_route(self, &self->side##s, args);                                         \
    }
ROUTE_METHOD(add, client)
ROUTE_METHOD(add, peer)
ROUTE_METHOD(remove, client)
ROUTE_METHOD(remove, peer)
ROUTE_METHOD(lookup, client)
ROUTE_METHOD(lookup, peer)

static PyObject *FastRelay_take_counters(FastRelay *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (size_t s = 0; s < self->ncounters; s++) {
        uint64_t *c = self->counters[s];
        if ((c[0] | c[1] | c[2] | c[3]) == 0)
            continue;
        PyObject *item = Py_BuildValue("(nKKKK)", (Py_ssize_t)s, (unsigned long long)c[0],
                                       (unsigned long long)c[1], (unsigned long long)c[2],
                                       (unsigned long long)c[3]);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
        memset(c, 0, sizeof(self->counters[s]));
    }
    return out;
}

static PyObject *FastRelay_fileno(FastRelay *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLong(self->epfd);
}

static PyObject *FastRelay_stats(FastRelay *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{sKsKsKsKsnsn}", "relayed", (unsigned long long)self->relayed, "missed",
                         (unsigned long long)self->missed, "dropped",
                         (unsigned long long)self->dropped, "answered",
                         (unsigned long long)self->answered, "client_routes",
                         (Py_ssize_t)self->clients.used, "peer_routes",
                         (Py_ssize_t)self->peers.used);
}

static PyObject *FastRelay_close(FastRelay *self, PyObject *Py_UNUSED(ignored)) {
    if (self->epfd >= 0) {
        close(self->epfd);
        self->epfd = -1;
    }
    Py_RETURN_NONE;
}

static int FastRelay_init(FastRelay *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "", kwlist))
        return -1;
    self->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (self->epfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->rx_buf = PyMem_Malloc((size_t)BATCH * BUF_BYTES);
    self->tx_buf = PyMem_Malloc((size_t)BATCH * BUF_BYTES);
    if (self->rx_buf == NULL || self->tx_buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < BATCH; i++) {
        self->rx_iov[i].iov_base = self->rx_buf + (size_t)i * BUF_BYTES;
        self->rx_iov[i].iov_len = BUF_BYTES;
        memset(&self->rx[i], 0, sizeof(self->rx[i]));
        self->rx[i].msg_hdr.msg_iov = &self->rx_iov[i];
        self->rx[i].msg_hdr.msg_iovlen = 1;
        self->rx[i].msg_hdr.msg_name = &self->rx_addr[i];
        self->tx_iov[i].iov_base = self->tx_buf + (size_t)i * BUF_BYTES;
        memset(&self->tx[i], 0, sizeof(self->tx[i]));
        self->tx[i].msg_hdr.msg_iov = &self->tx_iov[i];
        self->tx[i].msg_hdr.msg_iovlen = 1;
        self->tx[i].msg_hdr.msg_name = &self->tx_addr[i];
    }
    return 0;
}

static void FastRelay_dealloc(FastRelay *self) {
    if (self->epfd >= 0)
        close(self->epfd);
    PyMem_Free(self->clients.entries);
    PyMem_Free(self->peers.entries);
    for (size_t fd = 0; fd < self->nfds; fd++)
        PyMem_Free(self->fds[fd].software);
    PyMem_Free(self->fds);
    PyMem_Free(self->counters);
    PyMem_Free(self->rx_buf);
    PyMem_Free(self->tx_buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FastRelay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    FastRelay *self = (FastRelay *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->epfd = -1;
    return (PyObject *)self;
}

static PyMethodDef FastRelay_methods[] = {
    {"fileno", (PyCFunction)FastRelay_fileno, METH_NOARGS, "The epoll descriptor to watch."},
    {"watch", (PyCFunction)FastRelay_watch, METH_VARARGS,
     "watch(fd, kind, slot[, max_stun_bytes[, max_datagram_bytes]]): add a listener (1) or "
     "relay (2) socket; a listener with a STUN size limit has what the engine would not read "
     "dropped in C, and one with a datagram limit reads no more than that of a datagram."},
    {"unwatch", (PyCFunction)FastRelay_unwatch, METH_VARARGS,
     "unwatch(fd): stop watching fd and forget every route through it."},
    {"answer_binding", (PyCFunction)FastRelay_answer_binding, METH_VARARGS,
     "answer_binding(listener_fd, software): answer plain STUN Binding requests on this "
     "listener here, as the engine would (SOFTWARE: bytes, empty for none); the rest still "
     "comes back from poll()."},
    {"forget", (PyCFunction)FastRelay_forget, METH_VARARGS,
     "forget(fd): forget every route through fd, still watching it."},
#define ROUTE_ENTRY(op, side, doc)                                                             \
    {#op "_" #side "_route", (PyCFunction)FastRelay_##op##_##side##_route, METH_VARARGS,         \
     #op "_" #side "_route" doc}
    ROUTE_ENTRY(add, client, "(listener_fd, client_host, client_port, channel, relay_fd, "
                             "peer_host, peer_port, cluster_slot)"),
    ROUTE_ENTRY(add, peer, "(relay_fd, peer_host, peer_port, channel, listener_fd, client_host, "
                           "client_port, cluster_slot)"),
    ROUTE_ENTRY(remove, client, "(listener_fd, client_host, client_port, channel)"),
    ROUTE_ENTRY(remove, peer, "(relay_fd, peer_host, peer_port, 0)"),
    ROUTE_ENTRY(lookup, client, "(listener_fd, client_host, client_port, channel): None, or "
                                "(relay_fd, peer address, channel)"),
    ROUTE_ENTRY(lookup, peer, "(relay_fd, peer_host, peer_port, 0): None, or "
                              "(listener_fd, client address, channel)"),
    {"poll", (PyCFunction)FastRelay_poll, METH_NOARGS,
     "Relay what is routed; return [(fd, data, address)] for everything else."},
    {"take_counters", (PyCFunction)FastRelay_take_counters, METH_NOARGS,
     "[(slot, rx_pkts, rx_bytes, tx_pkts, tx_bytes)] since the last call."},
    {"stats", (PyCFunction)FastRelay_stats, METH_NOARGS,
     "Relayed, missed (given to Python) and dropped datagrams, and the route counts."},
    {"close", (PyCFunction)FastRelay_close, METH_NOARGS, "Close the epoll descriptor."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FastRelayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stunnerd._fastpath.FastRelay",
    .tp_basicsize = sizeof(FastRelay),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Established TURN channels relayed in C (see the module docstring).",
    .tp_new = FastRelay_new,
    .tp_init = (initproc)FastRelay_init,
    .tp_dealloc = (destructor)FastRelay_dealloc,
    .tp_methods = FastRelay_methods,
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "stunnerd._fastpath",
    "The established-channel relay of TURN-UDP listeners, with recvmmsg/sendmmsg.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    crc_init();
    if (PyType_Ready(&FastRelayType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastpath_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FastRelayType);
    if (PyModule_AddObject(m, "FastRelay", (PyObject *)&FastRelayType) < 0) {
        Py_DECREF(&FastRelayType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "LISTENER", KIND_LISTENER);
    PyModule_AddIntConstant(m, "RELAY", KIND_RELAY);
    PyModule_AddIntConstant(m, "BATCH", BATCH);
    return m;
}
