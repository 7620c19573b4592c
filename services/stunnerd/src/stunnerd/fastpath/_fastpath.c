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
 * dropped here, before any Python object exists (counted in `stats()["dropped"]`, and per
 * listener, those over the size limit and those truncated, in `take_drops(fd)`, beside the
 * challenges not sent, challenge.h): a datagram
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
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay.h"

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
    forget_answers(&self->fds[fd]); /* a new socket under a reused number */
    self->fds[fd].kind = (uint8_t)kind;
    self->fds[fd].slot = slot;
    self->fds[fd].max_stun = kind == KIND_LISTENER ? (uint32_t)max_stun : 0;
    self->fds[fd].max_datagram = kind == KIND_LISTENER ? (uint32_t)max_datagram : 0;
    self->fds[fd].oversized = self->fds[fd].truncated = 0;
    Py_RETURN_NONE;
}

static PyObject *FastRelay_take_drops(FastRelay *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    if (fd < 0 || (size_t)fd >= self->nfds)
        return Py_BuildValue("(KKK)", 0ULL, 0ULL, 0ULL);
    FdInfo *info = &self->fds[fd];
    PyObject *out = Py_BuildValue("(KKK)", (unsigned long long)info->oversized,
                                  (unsigned long long)info->truncated,
                                  (unsigned long long)info->suppressed);
    info->oversized = info->truncated = info->suppressed = 0;
    return out;
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

static FdInfo *listener_info(FastRelay *self, int fd) {
    if (fd < 0 || (size_t)fd >= self->nfds || self->fds[fd].kind != KIND_LISTENER) {
        PyErr_SetString(PyExc_ValueError, "not a watched listener");
        return NULL;
    }
    return &self->fds[fd];
}

static PyObject *FastRelay_answer_challenges(FastRelay *self, PyObject *args) {
    int fd;
    const char *t;
    Py_ssize_t n;
    double valid_s;
    if (!PyArg_ParseTuple(args, "iy#d", &fd, &t, &n, &valid_s))
        return NULL;
    FdInfo *info = listener_info(self, fd);
    if (info == NULL)
        return NULL;
    if (n > 0 && !challenge_template_ok((const uint8_t *)t, (size_t)n)) {
        PyErr_SetString(PyExc_ValueError, "not a 401 template to an Allocate with FINGERPRINT");
        return NULL;
    }
    forget_challenge(info);
    if (n > 0 && valid_s > 0) {
        info->challenge = PyMem_Malloc((size_t)n);
        if (info->challenge == NULL)
            return PyErr_NoMemory();
        memcpy(info->challenge, t, (size_t)n);
        info->challenge_len = (size_t)n;
        info->challenge_until = monotonic_s() + valid_s;
    }
    Py_RETURN_NONE;
}

static PyObject *FastRelay_challenge_budget(FastRelay *self, PyObject *args) {
    int fd;
    double rate, burst;
    Py_ssize_t sources;
    if (!PyArg_ParseTuple(args, "iddn", &fd, &rate, &burst, &sources))
        return NULL;
    FdInfo *info = listener_info(self, fd);
    if (info == NULL)
        return NULL;
    forget_budget(info);
    if (rate <= 0)
        Py_RETURN_NONE;
    size_t slots = 64;
    while (slots < (size_t)(sources > 0 ? sources : 1) && slots < ((size_t)1 << 24))
        slots *= 2;
    Budget *b = PyMem_Calloc(1, sizeof(Budget));
    BudgetSlot *table = b != NULL ? PyMem_Calloc(slots, sizeof(BudgetSlot)) : NULL;
    if (table == NULL) {
        PyMem_Free(b);
        return PyErr_NoMemory();
    }
    b->rate = rate;
    b->burst = burst < 1 ? 1 : burst;
    b->mask = slots - 1;
    b->slots = table;
    if (getrandom(&b->seed, sizeof(b->seed), 0) != (ssize_t)sizeof(b->seed))
        b->seed = (uint64_t)(uintptr_t)table ^ (uint64_t)(monotonic_s() * 1e9);
    info->budget = b;
    Py_RETURN_NONE;
}

static PyObject *FastRelay_challenge_allow(FastRelay *self, PyObject *args) {
    int fd;
    PyObject *host;
    if (!PyArg_ParseTuple(args, "iU", &fd, &host))
        return NULL;
    FdInfo *info = listener_info(self, fd);
    if (info == NULL)
        return NULL;
    if (info->budget == NULL)
        Py_RETURN_TRUE;
    struct sockaddr_storage from;
    socklen_t len;
    uint8_t key[17];
    if (parse_addr(host, 0, &from, &len) < 0)
        return NULL;
    budget_key(key, &from);
    return PyBool_FromLong(budget_allow(info->budget, key, monotonic_s()));
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
        forget_answers(&self->fds[fd]);
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
    return Py_BuildValue("{sKsKsKsKsKsnsn}", "relayed", (unsigned long long)self->relayed,
                         "missed", (unsigned long long)self->missed, "dropped",
                         (unsigned long long)self->dropped, "answered",
                         (unsigned long long)self->answered, "challenged",
                         (unsigned long long)self->challenged, "client_routes",
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
        forget_answers(&self->fds[fd]);
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
    {"answer_challenges", (PyCFunction)FastRelay_answer_challenges, METH_VARARGS,
     "answer_challenges(listener_fd, template, valid_s): answer an Allocate without "
     "MESSAGE-INTEGRITY on this listener here for valid_s seconds with the engine's 401, "
     "`template` with its transaction id zeroed (b'': the engine answers every one)."},
    {"challenge_budget", (PyCFunction)FastRelay_challenge_budget, METH_VARARGS,
     "challenge_budget(listener_fd, rate_per_s, burst, sources): challenges per source IP, a "
     "token bucket each in a table of about `sources` (rate 0: no limit)."},
    {"challenge_allow", (PyCFunction)FastRelay_challenge_allow, METH_VARARGS,
     "challenge_allow(listener_fd, host): spend one challenge of host's bucket; False when it "
     "is empty (a challenge the engine sends)."},
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
    {"take_drops", (PyCFunction)FastRelay_take_drops, METH_VARARGS,
     "take_drops(listener_fd): (over the STUN size limit, over the datagram limit, challenges "
     "over the source's budget) datagrams "
     "dropped on it since the last call."},
    {"stats", (PyCFunction)FastRelay_stats, METH_NOARGS,
     "Relayed, missed (given to Python) and dropped datagrams, Binding requests answered, "
     "challenges answered, and the route counts."},
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
