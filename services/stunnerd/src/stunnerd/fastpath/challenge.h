/*
 * The first answer of every TURN allocation, for `_fastpath.c`: a client's first Allocate
 * carries no credentials, and the engine answers it with a 401 that holds the listener's REALM
 * and a fresh NONCE (RFC 8489 §9.2.4, RFC 8656 §7.2), without reading its attributes. Here an
 * Allocate request without MESSAGE-INTEGRITY in its place (last, or before FINGERPRINT, as
 * `stunnerd.turn.precheck.integrity_offset` looks for it) gets that 401 from a template the
 * engine encoded (its own bytes, the transaction id zeroed): the request's transaction id goes
 * in, and FINGERPRINT is computed again. The template holds a nonce the engine issued; it is
 * used for a few seconds at most (`until`), then the engine answers again until it is renewed.
 *
 * Challenges are budgeted per source IP, a token bucket each (`stunnerd.turn.guard
 * .ChallengeBudget`'s rate and burst), in a table of fixed size indexed by a keyed hash: a source
 * whose slot another took starts with a full bucket, as one evicted from the engine's LRU table
 * does. The engine spends from the same buckets for the challenges it still sends (a 438, a
 * request of another method) through `challenge_allow`, so a source has one budget.
 */
#ifndef STUNNERD_FASTPATH_CHALLENGE_H
#define STUNNERD_FASTPATH_CHALLENGE_H

#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "binding.h"

#define ALLOCATE_REQUEST 0x0003
#define ALLOCATE_ERROR 0x0113
#define CHALLENGE_MAX 1024 /* a template longer than this is refused */

typedef struct {
    uint8_t key[17]; /* address length (4 or 16), then the address */
    uint8_t used;
    double tokens, at;
} BudgetSlot;

typedef struct {
    double rate, burst;
    size_t mask;
    uint64_t seed;
    BudgetSlot *slots;
} Budget;

static inline double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The budget key of a source address (an IPv4-mapped IPv6 one stays IPv6, as its text does in
 * the engine's table); 0 for another family. */
static int budget_key(uint8_t key[17], const struct sockaddr_storage *from) {
    memset(key, 0, 17);
    if (from->ss_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)from)->sin_addr, 4);
        return 1;
    }
    if (from->ss_family == AF_INET6) {
        key[0] = 16;
        memcpy(key + 1, &((const struct sockaddr_in6 *)from)->sin6_addr, 16);
        return 1;
    }
    return 0;
}

static inline size_t budget_index(const Budget *b, const uint8_t key[17]) {
    uint64_t h = 0xcbf29ce484222325ULL ^ b->seed; /* FNV-1a, keyed */
    for (int i = 0; i < 17; i++)
        h = (h ^ key[i]) * 0x100000001b3ULL;
    h ^= h >> 29;
    return (size_t)h & b->mask;
}

/* Spend one challenge of `key`'s bucket at `now`; 0 when it is empty. No budget: always 1. */
static int budget_allow(Budget *b, const uint8_t key[17], double now) {
    if (b == NULL)
        return 1;
    BudgetSlot *s = &b->slots[budget_index(b, key)];
    double tokens;
    if (!s->used || memcmp(s->key, key, 17) != 0) {
        memcpy(s->key, key, 17);
        s->used = 1;
        tokens = b->burst;
    } else {
        tokens = s->tokens + (now - s->at) * b->rate;
        if (tokens > b->burst)
            tokens = b->burst;
    }
    int allowed = tokens >= 1.0;
    s->tokens = allowed ? tokens - 1.0 : tokens;
    s->at = now;
    return allowed;
}

/* An Allocate request with a valid header (as `engine_reads` checks it) and no
 * MESSAGE-INTEGRITY where one may be: the engine challenges it without reading further. */
static int unsigned_allocate(const uint8_t *d, size_t size) {
    if (!stun_message_of(d, size, ALLOCATE_REQUEST))
        return 0;
    size_t end = size;
    if (end >= STUN_HEADER + 32 && be16(d + end - 8) == 0x8028 && be16(d + end - 6) == 4)
        end -= 8;
    return !(end >= STUN_HEADER + 24 && be16(d + end - 24) == 0x0008 &&
             be16(d + end - 22) == 20);
}

/* Whether `t` is a template this file can fill: a 401-class error answer to an Allocate, its
 * transaction id zeroed, ending with FINGERPRINT. */
static int challenge_template_ok(const uint8_t *t, size_t n) {
    static const uint8_t zero[12];
    return n >= STUN_HEADER + 8 && n <= CHALLENGE_MAX && be16(t) == ALLOCATE_ERROR &&
           (size_t)be16(t + 2) + STUN_HEADER == n && memcmp(t + 8, zero, 12) == 0 &&
           be16(t + n - 8) == 0x8028 && be16(t + n - 6) == 4;
}

/* The challenge to request `req` from the template, written to `out`; its length. */
static size_t challenge_answer(uint8_t *out, const uint8_t *req, const uint8_t *t, size_t n) {
    memcpy(out, t, n);
    memcpy(out + 8, req + 8, 12);
    put32(out + n - 4, crc32_of(out, n - 8) ^ FINGERPRINT_XOR);
    return n;
}

#endif
