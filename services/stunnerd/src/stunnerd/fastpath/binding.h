/*
 * STUN Binding answered in C (RFC 8489 §6.3.1), for `_fastpath.c`: the one request anyone may
 * make, answered by the engine with XOR-MAPPED-ADDRESS, the listener's SOFTWARE if it has one and
 * FINGERPRINT, never cached, never signed. Here only what the engine would answer with exactly
 * that success is answered: a Binding request whose attributes are well framed, at most
 * BINDING_MAX_ATTRS of them, all comprehension-optional (a comprehension-required one may be
 * unknown, 420, or MESSAGE-INTEGRITY, which the engine treats as it does). Anything else goes to
 * the engine as before. The answer is byte for byte the engine's (`stunner_common.stun.encode`).
 */
#ifndef STUNNERD_FASTPATH_BINDING_H
#define STUNNERD_FASTPATH_BINDING_H

#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define STUN_HEADER 20
#define STUN_COOKIE 0x2112A442U
#define BINDING_MAX_ATTRS 8 /* the engine's max_attributes is at least 8 */
#define MAX_SOFTWARE 763    /* RFC 8489 §14.14 */
#define FINGERPRINT_XOR 0x5354554EU
#define BINDING_ANSWER_MAX (STUN_HEADER + 24 + 4 + MAX_SOFTWARE + 1 + 8)

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFU;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFU;
}

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static inline uint8_t *put16(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
    return p + 2;
}

static inline uint8_t *put32(uint8_t *p, uint32_t v) {
    put16(p, v >> 16);
    return put16(p + 2, v);
}

/* A STUN message of type `type` whose header is valid (the magic cookie, a length matching the
 * datagram and a multiple of 4), as `engine_reads` checks it. */
static int stun_message_of(const uint8_t *d, size_t size, uint16_t type) {
    return size >= STUN_HEADER && be16(d) == type && !(d[3] & 3) && d[4] == 0x21 &&
           d[5] == 0x12 && d[6] == 0xA4 && d[7] == 0x42 &&
           (size_t)be16(d + 2) + STUN_HEADER == size;
}

/* A Binding request (a valid STUN header, as `engine_reads` checks) that the engine would
 * answer with plain success. */
static int plain_binding(const uint8_t *d, size_t size) {
    if (!stun_message_of(d, size, 0x0001))
        return 0;
    size_t pos = STUN_HEADER;
    for (int count = 0; pos + 4 <= size; count++) {
        if (count == BINDING_MAX_ATTRS || be16(d + pos) < 0x8000)
            return 0;
        pos += 4 + (((size_t)be16(d + pos + 2) + 3) & ~(size_t)3);
    }
    return pos == size;
}

/* XOR-MAPPED-ADDRESS of `from` (an IPv4-mapped IPv6 source as the IPv4 address it is). */
static uint8_t *put_xor_mapped(uint8_t *p, const uint8_t *txid, const struct sockaddr_storage *from) {
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    const uint8_t *addr;
    uint16_t port;
    int v6 = 0;
    if (from->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)from;
        addr = in6->sin6_addr.s6_addr;
        port = ntohs(in6->sin6_port);
        if (memcmp(addr, v4mapped, 12) == 0)
            addr += 12;
        else
            v6 = 1;
    } else {
        const struct sockaddr_in *in = (const struct sockaddr_in *)from;
        addr = (const uint8_t *)&in->sin_addr;
        port = ntohs(in->sin_port);
    }
    uint8_t mask[16] = {0x21, 0x12, 0xA4, 0x42};
    memcpy(mask + 4, txid, 12);
    p = put16(p, 0x0020);
    p = put16(p, v6 ? 20 : 8);
    p = put16(p, v6 ? 0x0002 : 0x0001);
    p = put16(p, port ^ 0x2112);
    for (int i = 0; i < (v6 ? 16 : 4); i++)
        *p++ = addr[i] ^ mask[i];
    return p;
}

/* The engine's answer to a plain Binding request from `from`, written to `out`
 * (BINDING_ANSWER_MAX bytes); its length. */
static size_t binding_answer(uint8_t *out, const uint8_t *req, const struct sockaddr_storage *from,
                             const uint8_t *software, size_t software_len) {
    uint8_t *p = out + STUN_HEADER;
    p = put_xor_mapped(p, req + 8, from);
    if (software_len > 0) {
        p = put16(p, 0x8022);
        p = put16(p, (uint32_t)software_len);
        memcpy(p, software, software_len);
        p += software_len;
        while (software_len++ % 4)
            *p++ = 0;
    }
    size_t body = (size_t)(p - out) - STUN_HEADER;
    put16(out, 0x0101);
    put16(out + 2, (uint32_t)(body + 8));
    put32(out + 4, STUN_COOKIE);
    memcpy(out + 8, req + 8, 12);
    p = put16(p, 0x8028);
    p = put16(p, 4);
    p = put32(p, crc32_of(out, STUN_HEADER + body) ^ FINGERPRINT_XOR);
    return (size_t)(p - out);
}

#endif
