/*
 * The fast path's route tables, for `_fastpath.c`: open addressing over (socket fd, channel,
 * address) keys hashed by 64-bit words; a client's ChannelData (listener fd, client, channel)
 * and a peer's datagram (relay fd, peer) each find their route in one probe sequence.
 */
#ifndef STUNNERD_FASTPATH_ROUTES_H
#define STUNNERD_FASTPATH_ROUTES_H

#include <Python.h>

#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>


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

#endif
