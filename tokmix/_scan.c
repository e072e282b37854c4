/* The first pass of benchmark decontamination in one compiled loop (tokmix.ngrams.run_candidates): a group of
 * texts encoded to UTF-8 and joined as tokmix.ngrams._concatenated joins them, split into the words of
 * run_candidates' letter mask, each word's lowercased first 8 bytes, and its kind (non-ASCII, holding _JOINT);
 * and the pair table's lookup of each two consecutive words. The same arrays as the numpy code of
 * tokmix.ngrams (_scan_numpy, _table_links_numpy), byte for byte: tests/test_ngrams_native.py compares them.
 * candidates(): run_candidates' first pass with a pair table in one loop, no array per word (the same pieces
 * as numpy's, compared by the same tests); triple_candidates(): the same with a filter of triples (a large set's).
 *
 * ABI: the version of scan's, candidates', triple_candidates' and table_links' arguments and results, which
 * tokmix.ngrams checks on import (its SCAN_ABI) before it uses this module: bump both on any change to them. An
 * editable install does not rebuild this file's .so, and a stale one is then left to numpy's first pass with a
 * one-line note, not called with arguments it does not take. (-DTOKMIX_SCAN_ABI=N overrides it:
 * tests/test_ngrams_native.py builds a stale one.)
 *
 * Plain C and the buffer protocol (no numpy C API); the loops run without the GIL (the streams stage runs its
 * check on worker threads beside the encoder); no Python object per word. */

#ifndef TOKMIX_SCAN_ABI
#define TOKMIX_SCAN_ABI 6
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)0)
#endif

typedef struct {
    int64_t *data;
    Py_ssize_t size, cap;
} Vec;

static int vec_push(Vec *v, int64_t x) {
    if (v->size == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 1024;
        int64_t *data = PyMem_RawRealloc(v->data, (size_t)cap * sizeof(int64_t));
        if (!data) return -1;
        v->data = data;
        v->cap = cap;
    }
    v->data[v->size++] = x;
    return 0;
}

/* 1: an ASCII letter or digit, or a byte >= 0x80 (a byte of a non-ASCII character) */
static unsigned char WORD_BYTE[256];

static const uint64_t KEEP[9] = {0, 0xFFull, 0xFFFFull, 0xFFFFFFull, 0xFFFFFFFFull, 0xFFFFFFFFFFull,
                                 0xFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFFFull};
static const uint64_t LOWER = 0x2020202020202020ull;
static const uint64_t MIX1 = 0xBF58476D1CE4E5B9ull;
static const uint64_t MIX_GOLDEN = 0x9E3779B97F4A7C15ull;
static const uint64_t MIX2 = 0x94D049BB133111EBull;
static const uint64_t HASH_STEP = 0x100000001B3ull;

/* splitmix64's finalizer (ngrams._mix) */
static inline uint64_t mix64(uint64_t x) {
    x += MIX_GOLDEN;
    x = (x ^ (x >> 30)) * MIX1;
    x = (x ^ (x >> 27)) * MIX2;
    return x ^ (x >> 31);
}

/* up to 8 bytes from p as a little-endian uint64 (the first n, n <= 8; the rest zero) */
static inline uint64_t load_le(const unsigned char *p, Py_ssize_t n) {
    uint64_t x = 0;
    if (n >= 8) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(&x, p, 8);
        return x;
#else
        n = 8;
#endif
    }
    for (Py_ssize_t k = 0; k < n; k++) x |= (uint64_t)p[k] << (8 * k);
    return x;
}

typedef struct {
    int kind;                 /* PyUnicode_KIND */
    const void *chars;
    Py_ssize_t length;        /* characters */
    int ascii;
    const char *utf8;         /* its UTF-8 where CPython's cache holds it (NULL: encode() it), read there */
    Py_ssize_t utf8_length;
} Text;

/* A str's UTF-8 cache (PyCompactUnicodeObject.utf8, its zero byte after it) read in place on CPython 3.10-3.13
 * (their headers' layout, as arrow_texts fills it) instead of encode()'s copy (0.035 CPU-s of candidates' 0.26
 * over the bench corpus): the streams stage's texts hold it (tokmix.sources.parquet's keep_utf8). */
#if !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030A0000 && \
    PY_VERSION_HEX < 0x030E0000
#define TOKMIX_UTF8_CACHE 1
#else
#define TOKMIX_UTF8_CACHE 0
#endif

/* A text's UTF-8 bytes at out (room enough): their count, or -1 for a surrogate (str.encode() refuses it) */
static Py_ssize_t encode(const Text *t, unsigned char *out) {
    Py_ssize_t n = t->length, o = 0;
    if (t->kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = t->chars;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t eight;
            while (i + 8 <= n && (memcpy(&eight, s + i, 8), !(eight & 0x8080808080808080ull))) {  /* ASCII */
                memcpy(out + o, s + i, 8);
                o += 8;
                i += 8;
            }
            if (i >= n) break;
            Py_UCS1 c = s[i];
            if (c < 0x80) {
                out[o++] = c;
            } else {
                out[o++] = 0xC0 | (c >> 6);
                out[o++] = 0x80 | (c & 0x3F);
            }
        }
        return o;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (t->kind == PyUnicode_2BYTE_KIND) {  /* sixteen, then four ASCII characters at a time */
            const Py_UCS2 *s = t->chars;
            uint64_t four;
#ifdef __SSE2__
            const __m128i high = _mm_set1_epi16((short)0xFF80);
            while (i + 16 <= n) {
                __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
                __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 8));
                __m128i any = _mm_and_si128(_mm_or_si128(a, b), high);
                if (_mm_movemask_epi8(_mm_cmpeq_epi16(any, _mm_setzero_si128())) != 0xFFFF) break;
                _mm_storeu_si128((__m128i *)(out + o), _mm_packus_epi16(a, b));
                o += 16;
                i += 16;
            }
#endif
            while (i + 4 <= n && (memcpy(&four, s + i, 8), !(four & 0xFF80FF80FF80FF80ull))) {
                out[o] = (unsigned char)s[i];
                out[o + 1] = (unsigned char)s[i + 1];
                out[o + 2] = (unsigned char)s[i + 2];
                out[o + 3] = (unsigned char)s[i + 3];
                o += 4;
                i += 4;
            }
            if (i >= n) break;
        }
        Py_UCS4 c = t->kind == PyUnicode_2BYTE_KIND ? ((const Py_UCS2 *)t->chars)[i] : ((const Py_UCS4 *)t->chars)[i];
        if (c < 0x80) {
            out[o++] = (unsigned char)c;
        } else if (c < 0x800) {
            out[o++] = 0xC0 | (c >> 6);
            out[o++] = 0x80 | (c & 0x3F);
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF) return -1;
            out[o++] = 0xE0 | (c >> 12);
            out[o++] = 0x80 | ((c >> 6) & 0x3F);
            out[o++] = 0x80 | (c & 0x3F);
        } else {
            out[o++] = 0xF0 | (c >> 18);
            out[o++] = 0x80 | ((c >> 12) & 0x3F);
            out[o++] = 0x80 | ((c >> 6) & 0x3F);
            out[o++] = 0x80 | (c & 0x3F);
        }
    }
    return o;
}

typedef struct {
    int64_t *starts, *ends;
    uint64_t *heads;
    Py_ssize_t size;          /* words (the three arrays have room for every word of the group) */
    Vec wild, held;
    const unsigned char *table;  /* a pair table of word classes, a bit each (NULL: none), `bits` bits a class */
    int bits;
    uint64_t last;               /* the class of the word before */
    unsigned char *link;         /* link[i]: table's bool at words i and i + 1 */
} Words;

/* bit k: whether q[k] is one of a word's bytes (an ASCII letter or digit, a byte >= 0x80, or a byte just before
 * one >= 0x80), k < 64; reads q[0..64]. *high: bit k, whether q[k] >= 0x80. `ascii` (a constant: q holds no byte
 * >= 0x80): the letters and digits alone, *high 0, q[64] not read. */
static inline __attribute__((always_inline)) uint64_t letters64(const unsigned char *q, uint64_t *high,
                                                               const int ascii) {
    uint64_t mask = 0, h = 0;
#ifdef __SSE2__
    const __m128i lower = _mm_set1_epi8(0x20), a = _mm_set1_epi8('a'), z = _mm_set1_epi8(25);
    const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9);
    for (int j = 0; j < 4; j++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * j));
        __m128i x = _mm_sub_epi8(_mm_or_si128(v, lower), a);
        __m128i y = _mm_sub_epi8(v, zero);
        __m128i alnum = _mm_or_si128(_mm_cmpeq_epi8(_mm_min_epu8(x, z), x), _mm_cmpeq_epi8(_mm_min_epu8(y, nine), y));
        mask |= (uint64_t)(unsigned)_mm_movemask_epi8(alnum) << (16 * j);
        if (!ascii) h |= (uint64_t)(unsigned)_mm_movemask_epi8(v) << (16 * j);
    }
    if (!ascii) mask |= h | (h >> 1) | ((uint64_t)(q[64] >> 7) << 63);  /* a byte >= 0x80, or just before one */
#else
    for (int k = 0; k < 64; k++) {
        mask |= (uint64_t)(WORD_BYTE[q[k]] | (ascii ? 0 : q[k + 1] >> 7)) << k;
        h |= (uint64_t)(q[k] >> 7) << k;
    }
#endif
    *high = h;
    return mask;
}

static inline int ctz64(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int n = 0;
    while (!(x & 1)) {
        x >>= 1;
        n++;
    }
    return n;
#endif
}

/* word p[s:e] of a text of p[:b] (p[b] is written): its bounds, its first 8 bytes (its own only) with each byte's
 * 0x20 bit set, and if it holds a byte >= 0x80 (`high`), whether it holds _JOINT's bytes EE 80 80 (held) or not
 * (wild) */
static inline int emit(const unsigned char *p, Py_ssize_t s, Py_ssize_t e, Py_ssize_t b, int high, Words *w) {
    Py_ssize_t n = e - s, k = n < 8 ? n : 8;
    uint64_t head = s + 8 <= b + 1 ? load_le(p + s, 8) : load_le(p + s, k);  /* (bytes past p[b]: not yet written) */
    Py_ssize_t word = w->size++;
    w->starts[word] = s;
    w->ends[word] = e;
    w->heads[word] = head = (head | LOWER) & KEEP[k];
    if (w->table) {
        uint64_t cls = (head * MIX1) >> (64 - w->bits);
        if (word) {
            uint64_t at = (w->last << w->bits) | cls;
            w->link[word - 1] = (w->table[at >> 3] >> (at & 7)) & 1;
        }
        w->last = cls;
    }
    if (!high) return 0;
    for (Py_ssize_t i = s; i + 2 < e; i++) {
        if (p[i] == 0xEE && p[i + 1] == 0x80 && p[i + 2] == 0x80) return vec_push(&w->held, word);
    }
    return vec_push(&w->wild, word);
}

/* bits from..to-1 of 64 (from <= to <= 64) */
static inline uint64_t bits(int from, int to) {
    return (to == 64 ? ~0ull : (1ull << to) - 1) & ~((1ull << from) - 1);
}

/* FOR_EACH_RUN's runs that start in a block (edges_: its edges, the first a run's start), HIGH of z_ and y_ */
#define RUNS_OF_BLOCK(RUN, HIGH)                                                                                \
    while (edges_) {                                                                                            \
        int z_ = ctz64(edges_);                                                                                 \
        edges_ &= edges_ - 1;                                                                                   \
        if (!edges_) { /* a run on into the next block */                                                       \
            s_ = k_ + z_;                                                                                       \
            in_ = 1;                                                                                            \
            high_ = (h_ & bits(z_, 64)) != 0;                                                                   \
            break;                                                                                              \
        }                                                                                                       \
        int y_ = ctz64(edges_);                                                                                 \
        edges_ &= edges_ - 1;                                                                                   \
        RUN(k_ + z_, k_ + y_, HIGH);                                                                            \
    }

/* The runs of the text p[a:b] (p[b] is the zero byte after it): the maximal runs of its bytes that letters64
 * marks, 64 bytes at a time (the edges of a block's mask: a run's start and its end, two edges an iteration),
 * its last bytes one by one; RUN(s, e, high) for each run p[s:e] in order (high: nonzero if it holds a byte
 * >= 0x80). Reads p[a..b], nothing before p[a]. ASCII (a constant): p[a:b] holds no byte >= 0x80. A macro: each
 * caller's loop keeps its state in registers. A block without a byte >= 0x80 has its runs' high a constant 0
 * (RUN's plain case alone); the text 512 bytes on is prefetched (an ASCII text is read where Python left it:
 * 0.068 -> 0.063 CPU-s for the bench corpus's ASCII texts in candidates). */
#define FOR_EACH_RUN(p, a, b, ASCII, RUN)                                                                       \
    do {                                                                                                        \
        Py_ssize_t k_ = (a), s_ = 0;                                                                           \
        int in_ = 0, high_ = 0; /* in a word (from s_); a byte >= 0x80 in it before this block */              \
        uint64_t before_ = 0;   /* the mask's bit of the byte before the block */                              \
        for (; k_ + 64 <= (b); k_ += 64) {                                                                     \
            PREFETCH((p) + k_ + 512);                                                                           \
            uint64_t h_, mask_ = letters64((p) + k_, &h_, (ASCII)), edges_ = mask_ ^ ((mask_ << 1) | before_); \
            before_ = mask_ >> 63;                                                                              \
            if (in_) { /* the run from an earlier block: its end here, or none */                              \
                if (!edges_) {                                                                                  \
                    high_ = high_ || h_;                                                                        \
                    continue;                                                                                   \
                }                                                                                               \
                int z_ = ctz64(edges_);                                                                         \
                edges_ &= edges_ - 1;                                                                           \
                in_ = 0;                                                                                        \
                RUN(s_, k_ + z_, high_ || (h_ & bits(0, z_)));                                                 \
            }                                                                                                   \
            if ((ASCII) || !h_) {                                                                               \
                RUNS_OF_BLOCK(RUN, 0);                                                                          \
            } else {                                                                                            \
                RUNS_OF_BLOCK(RUN, h_ & bits(z_, y_));                                                          \
            }                                                                                                   \
        }                                                                                                       \
        for (; k_ < (b); k_++) {                                                                               \
            int letter_ = WORD_BYTE[(p)[k_]] | ((p)[k_ + 1] >> 7);                                             \
            if (letter_ != in_) {                                                                               \
                if (in_) RUN(s_, k_, high_);                                                                    \
                s_ = k_;                                                                                        \
                in_ = letter_;                                                                                  \
                high_ = 0;                                                                                      \
            }                                                                                                   \
            high_ |= (p)[k_] >> 7;                                                                              \
        }                                                                                                       \
        if (in_) RUN(s_, (b), high_);                                                                           \
    } while (0)

/* The words of the text p[a:b] into w (scan) */
static int scan_text(const unsigned char *p, Py_ssize_t a, Py_ssize_t b, Words *w) {
#define EMIT(S, E, HIGH)                                                                                        \
    do {                                                                                                        \
        if (emit(p, (S), (E), b, (HIGH) != 0, w)) return -1;                                                   \
    } while (0)
    FOR_EACH_RUN(p, a, b, 0, EMIT);
#undef EMIT
    return 0;
}

/* candidates(): a text's runs folded into segments as they come, no array per run. A segment is a maximal
 * sequence of runs each linked to the next, where two plain runs are linked by the pair table and a wild run
 * (a byte >= 0x80, no _JOINT) to both its neighbours (what ngrams.run_candidates decides for it after NFKC is
 * never more than that). A segment without a wild run is one of run_candidates' chains, exactly (kept if it
 * has `shortest` runs); one with a wild run is left to run_candidates (its bounds are unlinked pairs of plain
 * runs there too, so its chains are the text's chains there), merged with the next one of its text within
 * MERGE_GAP bytes (the chains between them are the same from either). */
#define MERGE_GAP 512
#define FORMS_BLOCK 128  /* ngrams.FORMS_BLOCK */
#define FORMS_BLOCKS 1024 /* the most blocks of a table of normal forms (ngrams.FORMS_END / FORMS_BLOCK) */

typedef struct {
    const unsigned char *table;  /* the pair table as bits, `bits` bits a class */
    int bits;
    const unsigned char *filter; /* or a filter of triples (triple_candidates): a bit per slot, hash >> shift */
    int shift;
    Py_ssize_t shortest;
    Vec spans;                   /* (text, kind, begin, end) each: kind 0 a chain of an ASCII text (its offsets in
                                    the str), 1 a chain in joined, 2 a segment with a wild run in joined */
    int64_t text, exact;         /* the text, and the kind of its chains (0 or 1) */
    int seg_wild;                /* the segment to close (chain_text's): with a wild run, its first byte, end */
    Py_ssize_t seg_start, last_end;
    Py_ssize_t pending;          /* the index in spans of the text's last wild segment's entry, or -1 */
    Py_ssize_t merge_gap;        /* wild segments this close are merged (MERGE_GAP, TRIPLE_MERGE_GAP) */
    struct Runs *runs;           /* skips_in's scratch: a text's runs and triples */
    const uint32_t *forms;       /* candidates' wild runs normalized here (NULL: none): ngrams.normal_forms' */
    Py_ssize_t forms_end;        /* entries (code points below it) and pool */
    const unsigned char *pool;
    Py_ssize_t pool_len;
    const unsigned char *word_filter;  /* ngrams.WordFilter's bits, a word hash's slot its value >> word_shift */
    int word_shift;
    unsigned char missing[FORMS_BLOCKS / 8];  /* the blocks of FORMS_BLOCK code points met and not built, a bit each */
} Chains;

/* Whether a word of the normalized bytes is in the word filter: its first 8 bytes (`head`, little-endian), its
 * last 8 (`tail`, the last byte at the top), its length; hashed as ngrams.word_hashes */
static inline int word_member(const Chains *c, uint64_t head, uint64_t tail, Py_ssize_t length) {
    const int k = length < 8 ? (int)length : 8;
    const uint64_t hash = mix64(mix64(head ^ ((uint64_t)length * HASH_STEP)) + (tail >> (8 * (8 - k))));
    const uint64_t slot = hash >> c->word_shift;
    return (c->word_filter[slot >> 3] >> (slot & 7)) & 1;
}

/* A wild run p[s:e] (valid UTF-8, no _JOINT) as ngrams._wild_words decides it, its characters' normal forms end to
 * end (ngrams.normal_forms: they are the run's NFKC and lowercase when every character is context-free), an ASCII
 * byte as the byte map makes it: 1, with *linked (it has no words, or one is a member or it holds a small sigma)
 * and *words (its words' count if linked, else 0); 0 if a character of it has no form (not context-free, above the
 * table, or its block not built yet: noted in c->missing), the run then left to run_candidates as before. */
static __attribute__((noinline)) int normal_run(const unsigned char *p, Py_ssize_t s, Py_ssize_t e, Chains *c,
                                                int *linked, Py_ssize_t *words) {
    Py_ssize_t count = 0, length = 0;
    uint64_t head = 0, tail = 0;
    int found = 0;
    for (Py_ssize_t i = s; i < e;) {
        const unsigned x = p[i];
        unsigned char one;
        const unsigned char *form = &one;
        Py_ssize_t n = 1;
        if (x < 0x80) {
            one = WORD_BYTE[x] ? (unsigned char)(x | 0x20) : 0;  /* a letter lowercased, a digit kept */
            i++;
        } else {
            uint32_t cp;
            if (x < 0xE0) {
                cp = ((x & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
                i += 2;
            } else if (x < 0xF0) {
                cp = ((x & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
                i += 3;
            } else {
                cp = ((x & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
                i += 4;
            }
            if ((Py_ssize_t)cp >= c->forms_end) return 0;
            const uint32_t entry = c->forms[cp];
            if (entry <= 1) {
                if (!entry) c->missing[cp / FORMS_BLOCK / 8] |= (unsigned char)(1u << (cp / FORMS_BLOCK % 8));
                return 0;
            }
            n = (entry >> 1) & 63;
            if (!(entry & 1) || (Py_ssize_t)(entry >> 8) + n > c->pool_len) return 0;  /* (not ngrams.normal_forms') */
            form = c->pool + (entry >> 8);
            found |= (entry >> 7) & 1;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            const unsigned char b = form[j];
            if (b) {
                if (length < 8) head |= (uint64_t)b << (8 * length);
                tail = (tail >> 8) | ((uint64_t)b << 56);
                length++;
            } else if (length) {
                found |= word_member(c, head, tail, length);
                count++;
                length = 0;
                head = tail = 0;
            }
        }
    }
    if (length) {
        found |= word_member(c, head, tail, length);
        count++;
    }
    *linked = !(count > 0 && !found);
    *words = *linked ? count : 0;
    return 1;
}

static int push4(Vec *v, int64_t a, int64_t b, int64_t c, int64_t d) {
    return vec_push(v, a) || vec_push(v, b) || vec_push(v, c) || vec_push(v, d);
}

/* a segment kept (one with a wild run, or a chain of `shortest` runs) into c->spans */
static __attribute__((noinline)) int close_segment(Chains *c) {
    if (c->seg_wild) {
        if (c->pending >= 0 && c->seg_start - c->spans.data[c->pending + 3] <= c->merge_gap) {
            c->spans.size = c->pending + 4;  /* the chains since are inside the merged segment */
            c->spans.data[c->pending + 3] = c->last_end;
            return 0;
        }
        c->pending = c->spans.size;
        return push4(&c->spans, c->text, 2, c->seg_start, c->last_end);
    }
    return push4(&c->spans, c->text, c->exact, c->seg_start, c->last_end);
}

/* The segments of the text p[a:b] (text number t, its chains of kind `exact`) into c->spans, runs_of's loop
 * with the segment's state in locals: 0, 1 when it holds _JOINT (nothing of it kept in spans), -1 for no
 * memory */
static inline __attribute__((always_inline)) int chain_in(const unsigned char *p, Py_ssize_t a, Py_ssize_t b,
                                                         int64_t t, int64_t exact, Chains *c, const int ascii) {
    const Py_ssize_t mark = c->spans.size, shortest = c->shortest;
    const unsigned char *table = c->table;
    const int cbits = c->bits, shift = 64 - c->bits;
    int any = 0, prev_kind = 0, prev_linked = 0, seg_wild = 0;
    uint64_t prev_cls = 0;
    Py_ssize_t seg_start = 0, seg_runs = 0, last_end = 0;
    c->text = t;
    c->exact = exact;
    c->pending = -1;
/* one run p[S:E] (HIGH: it holds a byte >= 0x80). Its kind: 0 plain, 1 wild and decided here (normal_run: linked
 * or not, its words), 2 wild and left to run_candidates (linked to both neighbours: the most it may be). Two runs
 * are linked as ngrams._chained links them: a wild run's decision links it to the run before it, and to the next
 * unless that is wild too (its own decision then), two plain runs by the table. seg_runs counts words (a plain run
 * one, a decided wild run its words if linked, else none, as _chains counts them). */
#define RUN(S, E, HIGH)                                                                                         \
    do {                                                                                                        \
        const Py_ssize_t rs = (S), re = (E);                                                                   \
        const int rhigh = ascii ? 0 : (HIGH) != 0; /* (an ASCII text: none, the loop's high bits unused) */     \
        uint64_t rcls = 0;                                                                                      \
        int rkind = 0, rlinked = 0;                                                                             \
        Py_ssize_t rwords = 1;                                                                                  \
        if (rhigh) {                                                                                            \
            for (Py_ssize_t ri = rs; ri + 2 < re; ri++) {                                                      \
                if (p[ri] == 0xEE && p[ri + 1] == 0x80 && p[ri + 2] == 0x80) {                                 \
                    c->spans.size = mark;                                                                       \
                    return 1;                                                                                   \
                }                                                                                               \
            }                                                                                                   \
            rkind = c->forms && normal_run(p, rs, re, c, &rlinked, &rwords) ? 1 : 2;                            \
            if (rkind == 2) rwords = 0;                                                                         \
        } else {                                                                                                \
            const Py_ssize_t rn = re - rs, rk = rn < 8 ? rn : 8;                                               \
            const uint64_t rhead = rs + 8 <= b + 1 ? load_le(p + rs, 8) : load_le(p + rs, rk);                 \
            rcls = (((rhead | LOWER) & KEEP[rk]) * MIX1) >> shift;                                              \
        }                                                                                                       \
        int rlink = 0;                                                                                          \
        if (rkind) {                                                                                            \
            rlink = rkind == 2 || rlinked;                                                                      \
        } else if (prev_kind) {                                                                                 \
            rlink = prev_kind == 2 || prev_linked;                                                              \
        } else if (any) {                                                                                       \
            const uint64_t rat = (prev_cls << cbits) | rcls;                                                    \
            rlink = (table[rat >> 3] >> (rat & 7)) & 1;                                                         \
        }                                                                                                       \
        /* a new segment without a branch on the link (one pair of plain runs in ~9 of the bench corpus is    \
         * linked: a branch on it mispredicted, after the table's read) */                                      \
        const int rnew = !rlink | !any;                                                                         \
        if (rnew & any & (seg_wild | (seg_runs >= shortest))) {                                                 \
            c->seg_start = seg_start;                                                                           \
            c->last_end = last_end;                                                                             \
            c->seg_wild = seg_wild;                                                                             \
            if (close_segment(c)) return -1;                                                                    \
        }                                                                                                       \
        const Py_ssize_t rkeep = (Py_ssize_t)rnew - 1; /* all ones: the segment goes on */                      \
        any = 1;                                                                                                \
        seg_start = (seg_start & rkeep) | (rs & ~rkeep);                                                        \
        seg_runs = (seg_runs & rkeep) + rwords;                                                                 \
        seg_wild = (seg_wild & (int)rkeep) | (rkind == 2);                                                      \
        last_end = re;                                                                                          \
        prev_cls = rcls;                                                                                        \
        prev_kind = rkind;                                                                                      \
        prev_linked = rlinked;                                                                                  \
    } while (0)
    FOR_EACH_RUN(p, a, b, ascii, RUN);
#undef RUN
    if (any && (seg_wild || seg_runs >= shortest)) {
        c->seg_start = seg_start;
        c->last_end = last_end;
        c->seg_wild = seg_wild;
        if (close_segment(c)) return -1;
    }
    return 0;
}

/* chain_in, compiled once for ASCII texts (read in place: no byte >= 0x80) and once for the others */
static int chain_text(const unsigned char *p, Py_ssize_t a, Py_ssize_t b, int64_t t, int64_t exact, Chains *c) {
    return exact == 0 ? chain_in(p, a, b, t, 0, c, 1) : chain_in(p, a, b, t, exact, c, 0);
}

/* triple_candidates(): the same spans with a filter of triples (three consecutive words of an item) instead of a
 * pair table, as ngrams.run_candidates decides with ngrams.TripleFilter (no pair filter: two runs are linked when
 * they are two of a triple that may be an item's). A plain run's value is its prefix hash (ngrams.head_prefixes),
 * three plain runs in a row may be an item's when their hash (pair_hashes of the first two's pair hash and the
 * third's prefix) has its filter bit; a triple with a wild run always may be (the most its NFKC form may make of
 * it). Then run_candidates' chains among plain runs are the maximal blocks of consecutive triples that may be,
 * each holding the runs of its triples (two chains may share a run; a block of k triples is a chain of k + 2
 * runs), kept with shortest - 2 triples or more. A pair of plain runs in no triple that may be is linked by
 * nothing: a wild run's segment reaches back and on to the nearest such pairs, and is a piece for
 * run_candidates (its bounds are unlinked pairs for run_candidates too, so its chains are the text's chains
 * there), merged as with a pair table; a block inside it is run_candidates' too. With the normal forms and a word
 * filter, a wild run decided here (normal_run) is unlinked (a break) or linked, and a linked one of one word after
 * no unlinked one is a plain run whose triples all may be, in the blocks; the segment around the other linked ones
 * (no word, many, or after an unlinked one, which _chained links to it) has its chains found here as _chained
 * finds them (exact_chains: they never cross its bounds either), unless a wild run of it is left to
 * run_candidates.
 *
 * The filter is far larger than the caches (32 MiB for the 100k set): a read of it is a miss, so a text's runs
 * come first (bounds, wild, each triple's slot) and the bits are read only where they decide something: a block
 * needs shortest - 2 triples in a row, so the triples are probed that many apart (a probe that may not be rules
 * out every block through it; the next two probes prefetched), and only one that may be is followed back and on
 * to its block's ends. (Reading every triple's bit, prefetched 8 ahead: 0.65-0.84 CPU-s against 0.46-0.67 for the
 * bench corpus's 212M characters; not prefetched: 2.1-2.3.) */
#ifndef TRIPLE_MERGE_GAP
#define TRIPLE_MERGE_GAP MERGE_GAP
#endif

/* a text's runs and its triples (skips_in's scratch, grown as needed) */
typedef struct Runs {
    int64_t *start, *end;
    uint64_t *slot;
    signed char *may;          /* per triple: 1 may be, 0 not, -1 not read yet (its slot's bit) */
    unsigned char *wild;       /* per run: 0 plain, 1 wild (its segment run_candidates'), or decided (normal_run):
                                  2 unlinked (no word of it a member: a break, no triple with it may be), 4 linked
                                  with one word (a word whose triples all may be: a plain run's place in a block),
                                  8 linked otherwise (no word, two or more, or just after an unlinked one: its
                                  segment's chains found here as _chained finds them, exact_chains) */
    int64_t *words;            /* per run: its words as _chains counts them (plain 1, unlinked 0, linked its own) */
    Py_ssize_t cap;
} Runs;

static int runs_room(Runs *r, Py_ssize_t need) {
    if (need <= r->cap) return 0;
    Py_ssize_t cap = r->cap ? 2 * r->cap : 4096;
    while (cap < need) cap *= 2;
    int64_t *s = PyMem_RawRealloc(r->start, cap * sizeof(int64_t));
    if (s) r->start = s;
    int64_t *e = PyMem_RawRealloc(r->end, cap * sizeof(int64_t));
    if (e) r->end = e;
    uint64_t *l = PyMem_RawRealloc(r->slot, cap * sizeof(uint64_t));
    if (l) r->slot = l;
    signed char *m = PyMem_RawRealloc(r->may, cap);
    if (m) r->may = m;
    unsigned char *w = PyMem_RawRealloc(r->wild, cap);
    if (w) r->wild = w;
    int64_t *n = PyMem_RawRealloc(r->words, cap * sizeof(int64_t));
    if (n) r->words = n;
    if (!s || !e || !l || !m || !w || !n) return -1;
    r->cap = cap;
    return 0;
}

/* whether triple j (runs j to j + 2, j < m - 2) may be, as _chained's triples say: always with a linked wild run
 * (or one left to run_candidates), else its slot's bit; with an unlinked one and no linked one, not (may's 0:
 * _chained reads the bit of the wild run's raw head there, which can only link two plain runs into a chain of two
 * words, never kept) */
static inline int triple_may(Runs *r, const unsigned char *filter, Py_ssize_t j) {
    if ((r->wild[j] | r->wild[j + 1] | r->wild[j + 2]) & 13) return 1;
    if (r->may[j] < 0) r->may[j] = (filter[r->slot[j] >> 3] >> (r->slot[j] & 7)) & 1;
    return r->may[j];
}

/* whether runs i and i + 1 (i < m - 1) are linked, as _chained links them: by the second's decision if it is wild,
 * else by the first's if that is, else when they are two of a triple that may be */
static inline int runs_linked(Runs *r, const unsigned char *filter, Py_ssize_t m, Py_ssize_t i) {
    if (r->wild[i + 1]) return r->wild[i + 1] != 2;
    if (r->wild[i]) return r->wild[i] != 2;
    return (i >= 1 && triple_may(r, filter, i - 1)) || (i + 2 < m && triple_may(r, filter, i));
}

/* The chains of runs sf..sl of a text's m runs into c->spans (kind `exact`), as _chained's _chains finds them: a
 * segment whose wild runs are all decided (2, 4, 8), no chain through its bounds. A chain is a maximal sequence of
 * linked pairs, cut at the middle run of three that may not be (the run in both chains), kept with `shortest`
 * words or more (Runs' words; an unlinked run is in a chain only as its first, before a linked wild run, and adds
 * none); a linked wild run in no chain is a chain of its own words. */
static __attribute__((noinline)) int exact_chains(Runs *r, Py_ssize_t m, Py_ssize_t sf, Py_ssize_t sl, Chains *c) {
    const unsigned char *filter = c->filter;
    for (Py_ssize_t j = sf > 0 ? sf - 1 : 0; j < sl && j + 2 < m; j++) {
        if (r->may[j] < 0) PREFETCH(filter + (r->slot[j] >> 3));
    }
    Py_ssize_t i = sf;
    while (i <= sl) {
        if (i < sl && runs_linked(r, filter, m, i)) {
            Py_ssize_t last = i + 1, words = r->words[i] + r->words[i + 1];
            int on;  /* the pair after the chain's last is linked */
            while ((on = last < sl && runs_linked(r, filter, m, last)) && triple_may(r, filter, last - 1))
                words += r->words[++last];
            if (words >= c->shortest && push4(&c->spans, c->text, c->exact, r->start[i], r->end[last])) return -1;
            i = on ? last : last + 1;
        } else {
            if (r->wild[i] == 8 && r->words[i] >= c->shortest &&
                push4(&c->spans, c->text, c->exact, r->start[i], r->end[i]))
                return -1;
            i++;
        }
    }
    return 0;
}

static inline __attribute__((always_inline)) int skips_in(const unsigned char *p, Py_ssize_t a, Py_ssize_t b,
                                                         int64_t t, int64_t exact, Chains *c, const int ascii) {
    Runs *r = c->runs;
    const unsigned char *filter = c->filter;
    const int shift = c->shift;
    Py_ssize_t m = 0;
    uint64_t prev_prefix = 0, prev_pair = 0;
    c->text = t;
    c->exact = exact;
    c->pending = -1;
#define RUN(S, E, HIGH)                                                                                         \
    do {                                                                                                        \
        const Py_ssize_t rs = (S), re = (E);                                                                   \
        const int rhigh = ascii ? 0 : (HIGH) != 0;                                                             \
        uint64_t rprefix = 0;                                                                                   \
        if (m >= r->cap && runs_room(r, m + 1)) return -1;                                                      \
        unsigned rwild = (unsigned)rhigh; /* Runs' wild: 1 left to run_candidates, 2, 4 or 8 decided here */      \
        Py_ssize_t rwords = 1;                                                                                  \
        if (rhigh) {                                                                                            \
            for (Py_ssize_t ri = rs; ri + 2 < re; ri++) {                                                      \
                if (p[ri] == 0xEE && p[ri + 1] == 0x80 && p[ri + 2] == 0x80) return 1;                         \
            }                                                                                                   \
            int rlinked = 1;                                                                                    \
            if (c->forms && normal_run(p, rs, re, c, &rlinked, &rwords))                                        \
                rwild = !rlinked ? 2 : rwords == 1 && !(m && r->wild[m - 1] == 2) ? 4 : 8;                     \
        } else {                                                                                                \
            const Py_ssize_t rn = re - rs, rk = rn < 8 ? rn : 8;                                               \
            const uint64_t rhead = rs + 8 <= b + 1 ? load_le(p + rs, 8) : load_le(p + rs, rk);                 \
            rprefix = (((rhead | LOWER) & KEEP[rk]) ^ ((uint64_t)rn * HASH_STEP)) * MIX1;                       \
        }                                                                                                       \
        r->start[m] = rs;                                                                                       \
        r->end[m] = re;                                                                                         \
        r->wild[m] = (unsigned char)rwild;                                                                      \
        r->words[m] = rwords;                                                                                   \
        if (m >= 2) {                                                                                           \
            const Py_ssize_t j = m - 2;                                                                         \
            const unsigned rany = r->wild[j] | r->wild[j + 1] | rwild;                                          \
            r->may[j] = rany & 2 ? 0 : rany ? 1 : -1;                                                           \
            r->slot[j] = mix64(prev_pair * HASH_STEP ^ rprefix) >> shift;                                       \
        }                                                                                                       \
        if (m >= 1) prev_pair = mix64(prev_prefix * HASH_STEP ^ rprefix);                                       \
        prev_prefix = rprefix;                                                                                  \
        m++;                                                                                                    \
    } while (0)
    FOR_EACH_RUN(p, a, b, ascii, RUN);
#undef RUN
    const Py_ssize_t tri = m >= 2 ? m - 2 : 0, need = c->shortest - 2;
    signed char *may = r->may;
    const uint64_t *slot = r->slot;
    const unsigned char *wild = r->wild;
#define MAY(j) (may[j] >= 0 ? may[j] : (may[j] = (filter[slot[j] >> 3] >> (slot[j] & 7)) & 1))
#define MAYZ(j) ((j) < 0 || (j) >= tri ? 0 : MAY(j))
#define AHEAD(j)                                                                                                \
    do {                                                                                                        \
        const Py_ssize_t q_ = (j);                                                                              \
        if (q_ < tri && may[q_] < 0) PREFETCH(filter + (slot[q_] >> 3));                                        \
    } while (0)
/* pair i, i + 1 of plain runs in no triple that may be: a wild segment's bound */
#define CUT(i) (!(wild[i] & 9) && !(wild[(i) + 1] & 9) && !MAYZ((i) - 1) && !MAYZ(i))
    /* the chains (blocks of `need` triples or more) and the wild segments (runs first..last), in text order */
    Py_ssize_t j = 0, w = 0, sf = -1, sl = -1, k = -1, e = -1;
    int want_seg = 1, want_block = 1, seg_left = 0;
    for (;;) {
        if (want_seg) {  /* the next wild run's segment: back and on to the nearest bounds */
            want_seg = 0;
            while (w < m && !(wild[w] & 9)) w++;
            sf = sl = -1;
            if (w < m) {
                sf = sl = w;
                while (sf > 0 && !CUT(sf - 1)) sf--;
                while (sl + 1 < m && !CUT(sl)) sl++;
                w = sl + 1;
                seg_left = 0;  /* a run of it left to run_candidates: the segment is its, else its chains found here */
                for (Py_ssize_t q = sf; q <= sl && !seg_left; q++) seg_left = wild[q] & 1;
            }
        }
        if (want_block) {  /* the next block of `need` triples that may be, from triple j on (j == 0, or j - 1 not) */
            want_block = 0;
            k = e = -1;
            while (j + need <= tri) {
                const Py_ssize_t probe = j + need - 1;
                AHEAD(probe + need);
                AHEAD(probe + 2 * need);
                if (!MAY(probe)) {
                    j = probe + 1;
                    continue;
                }
                Py_ssize_t first = probe;
                while (first > j && MAY(first - 1)) first--;
                Py_ssize_t q = probe + 1;
                while (q < first + need && q < tri && MAY(q)) q++;
                if (q < first + need) {  /* shorter than need: triple q may not be (or the text ends) */
                    j = q + 1;
                    continue;
                }
                while (q < tri && MAY(q)) q++;
                k = first;
                e = q - 1;
                j = q + 1;
                break;
            }
        }
        if (k >= 0 && sf >= 0 && k >= sf && k <= sl) {  /* a block inside the wild segment: found with it */
            want_block = 1;
            continue;
        }
        if (sf >= 0 && (k < 0 || sf < k)) {
            if (seg_left) {
                c->seg_start = r->start[sf];
                c->last_end = r->end[sl];
                c->seg_wild = 1;
                if (close_segment(c)) return -1;
            } else if (exact_chains(r, m, sf, sl, c)) {
                return -1;
            }
            want_seg = 1;
            continue;
        }
        if (k < 0) break;
        if (push4(&c->spans, t, exact, r->start[k], r->end[e + 2])) return -1;
        want_block = 1;
    }
#undef CUT
#undef AHEAD
#undef MAYZ
#undef MAY
    return 0;
}

/* skips_in, compiled once for ASCII texts and once for the others */
static int triple_text(const unsigned char *p, Py_ssize_t a, Py_ssize_t b, int64_t t, int64_t exact, Chains *c) {
    return exact == 0 ? skips_in(p, a, b, t, 0, c, 1) : skips_in(p, a, b, t, exact, c, 0);
}

/* the word arrays' buffers (bytearrays; arrays[3], the links, may be None) */
static void words_at(Words *w, PyObject **arrays) {
    w->starts = (int64_t *)PyByteArray_AS_STRING(arrays[0]);
    w->ends = (int64_t *)PyByteArray_AS_STRING(arrays[1]);
    w->heads = (uint64_t *)PyByteArray_AS_STRING(arrays[2]);
    if (arrays[3] != Py_None) w->link = (unsigned char *)PyByteArray_AS_STRING(arrays[3]);
}

static PyObject *vec_bytes(Vec *v) {
    return PyByteArray_FromStringAndSize((const char *)v->data, v->size * (Py_ssize_t)sizeof(int64_t));
}

PyDoc_STRVAR(scan_doc,
"scan(texts, bits_table=None, bits=0) -> (joined, offsets, starts, ends, heads, wild, held, forced, link)\n\n"
"The texts (a list of str) as UTF-8 end to end with a zero byte before and between them and 9 after them (a\n"
"text with a lone surrogate as no bytes, its index in `forced`), each text's first byte in them (one more\n"
"entry: the end), the words of run_candidates' letter mask (first byte, end), each word's first 8 bytes\n"
"lowercased as ngrams._first_bytes(lower=True), the words with a byte >= 0x80 and no _JOINT (`wild`) and\n"
"those with _JOINT (`held`): each a bytearray of int64 (heads: uint64) but `forced`, a list; with a pair\n"
"table as bits (numpy.packbits(table, bitorder='little'): 1 << 2 * bits of them, 1/8 of the bool table's\n"
"bytes, which stay in cache beside the encoder's), `link` as table_links gives it (a bytearray of bools), else\n"
"None.");

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *arg, *table_arg = Py_None;
    int bits = 0;
    Py_buffer table = {0};
    if (!PyArg_ParseTuple(args, "O|Oi", &arg, &table_arg, &bits)) return NULL;
    if (table_arg != Py_None) {
        if (PyObject_GetBuffer(table_arg, &table, PyBUF_SIMPLE) < 0) return NULL;
        if (bits < 1 || bits > 31 || table.len != (((Py_ssize_t)1 << (2 * bits)) + 7) / 8) {
            PyBuffer_Release(&table);
            PyErr_SetString(PyExc_ValueError, "scan(): the table's size is not 1 << (2 * bits) bits");
            return NULL;
        }
    }
    if (!PyList_Check(arg)) {
        PyBuffer_Release(&table);
        PyErr_SetString(PyExc_TypeError, "scan() takes a list of str");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(arg);
    PyObject **held_refs = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    Text *texts = PyMem_Calloc(count ? count : 1, sizeof(Text));
    int64_t *offsets = PyMem_Malloc((count + 1) * sizeof(int64_t));
    char *forced = PyMem_Calloc(count ? count : 1, 1);
    PyObject *joined = NULL, *result = NULL, *arrays[4] = {NULL, NULL, NULL, NULL};
    PyObject *offsets_bytes = NULL, *wild = NULL, *held = NULL, *forced_list = NULL;
    Words w;
    memset(&w, 0, sizeof w);
    if (!held_refs || !texts || !offsets || !forced) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t room = 1 + count + (count ? 8 : 9);
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *s = PyList_GET_ITEM(arg, t);
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "scan() takes a list of str, item %zd is %.80s", t, Py_TYPE(s)->tp_name);
            goto done;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(s) < 0) goto done;
#endif
        Py_INCREF(s);  /* held while the loop reads it without the GIL (the list may change meanwhile) */
        held_refs[t] = s;
        texts[t].kind = PyUnicode_KIND(s);
        texts[t].chars = PyUnicode_DATA(s);
        texts[t].length = PyUnicode_GET_LENGTH(s);
        texts[t].ascii = PyUnicode_IS_ASCII(s);
        Py_ssize_t most = texts[t].ascii ? 1 : texts[t].kind == PyUnicode_1BYTE_KIND ? 2 :
                          texts[t].kind == PyUnicode_2BYTE_KIND ? 3 : 4;
        if (texts[t].length > (PY_SSIZE_T_MAX - room) / most) {
            PyErr_NoMemory();
            goto done;
        }
        room += most * texts[t].length;
    }
    /* the word arrays sized for a word every 4 bytes (text has one every ~6), grown before a text that may not
     * fit (a word takes two bytes or more, with its separator), cut after the loop */
    Py_ssize_t cap = room / 4 + 64;
    joined = PyByteArray_FromStringAndSize(NULL, room);
    for (int k = 0; k < 3; k++) arrays[k] = PyByteArray_FromStringAndSize(NULL, cap * 8);
    arrays[3] = table.buf ? PyByteArray_FromStringAndSize(NULL, cap) : Py_NewRef(Py_None);
    if (!joined || !arrays[0] || !arrays[1] || !arrays[2] || !arrays[3]) goto done;
    if (table.buf) {
        w.table = table.buf;
        w.bits = bits;
    }
    words_at(&w, arrays);
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(joined);
    Py_ssize_t at = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    p[at++] = 0;
    for (Py_ssize_t t = 0; t < count; t++) {
        offsets[t] = at;
        Py_ssize_t n;
        if (texts[t].ascii) {
            n = texts[t].length;
            memcpy(p + at, texts[t].chars, n);
        } else {
            n = encode(&texts[t], p + at);
        }
        if (n < 0) {  /* a lone surrogate: no bytes (run_candidates checks the text the slow way) */
            forced[t] = 1;
            n = 0;
        }
        p[at + n] = 0;
        if (w.size + (n + 1) / 2 + 1 > cap) {
            Py_ssize_t need = w.size + (n + 1) / 2 + 1;
            Py_BLOCK_THREADS
            cap = 2 * cap > need ? 2 * cap : need;
            for (int k = 0; k < 4 && !failed; k++) {
                if (arrays[k] != Py_None && PyByteArray_Resize(arrays[k], k < 3 ? cap * 8 : cap) < 0) failed = 1;
            }
            if (!failed) words_at(&w, arrays);
            PyErr_Clear();  /* (failed: MemoryError below) */
            Py_UNBLOCK_THREADS
            if (failed) break;
        }
        if (scan_text(p, at, at + n, &w)) {
            failed = 1;
            break;
        }
        at += n + 1;
    }
    if (!failed) {
        offsets[count] = at;
        Py_ssize_t tail = count ? 8 : 9;
        memset(p + at, 0, tail);
        at += tail;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyByteArray_Resize(joined, at) < 0) goto done;
    for (int k = 0; k < 3; k++) {
        if (PyByteArray_Resize(arrays[k], w.size * 8) < 0) goto done;
    }
    if (table.buf && PyByteArray_Resize(arrays[3], w.size ? w.size - 1 : 0) < 0) goto done;
    forced_list = PyList_New(0);
    if (!forced_list) goto done;
    for (Py_ssize_t t = 0; t < count; t++) {
        if (forced[t]) {
            PyObject *i = PyLong_FromSsize_t(t);
            if (!i || PyList_Append(forced_list, i) < 0) {
                Py_XDECREF(i);
                goto done;
            }
            Py_DECREF(i);
        }
    }
    offsets_bytes = PyByteArray_FromStringAndSize((const char *)offsets, (count + 1) * sizeof(int64_t));
    wild = vec_bytes(&w.wild);
    held = vec_bytes(&w.held);
    if (offsets_bytes && wild && held)
        result = PyTuple_Pack(9, joined, offsets_bytes, arrays[0], arrays[1], arrays[2], wild, held, forced_list,
                              arrays[3]);
done:
    if (held_refs) {
        for (Py_ssize_t t = 0; t < count; t++) Py_XDECREF(held_refs[t]);
    }
    Py_XDECREF(joined);
    for (int k = 0; k < 4; k++) Py_XDECREF(arrays[k]);
    PyBuffer_Release(&table);
    Py_XDECREF(offsets_bytes);
    Py_XDECREF(wild);
    Py_XDECREF(held);
    Py_XDECREF(forced_list);
    PyMem_Free(held_refs);
    PyMem_Free(texts);
    PyMem_Free(offsets);
    PyMem_Free(forced);
    PyMem_RawFree(w.wild.data);
    PyMem_RawFree(w.held.data);
    return result;
}

PyDoc_STRVAR(candidates_doc,
"candidates(texts, bits_table, bits, shortest) -> (joined, spans, forced)\n\n"
"ngrams.run_candidates' first pass with a pair table in one loop, no array per word: the texts' runs (as scan\n"
"splits them) folded into segments of linked runs (the pair table between plain runs; a wild run linked to both\n"
"its neighbours). `joined`: the UTF-8 of the texts that are not ASCII and have a span, each after a zero byte;\n"
"`spans`: a bytearray of int64 quadruples (text, kind, begin, end) in text order: kind 0 a chain of `shortest`\n"
"runs or more in an ASCII text (offsets in the str itself), 1 the same in joined, 2 a piece of joined holding\n"
"wild runs for run_candidates to split; `forced`: the texts with a lone surrogate or _JOINT, a list (no span of\n"
"theirs).\n\n"
"candidates(texts, bits_table, bits, shortest, forms, pool, word_filter, word_shift) -> (joined, spans, forced,\n"
"missing): the same, each wild run whose characters all have a normal form (ngrams.normal_forms: `forms`, a\n"
"uint32 per code point, and their `pool`) normalized in the loop and its words tested against the word filter\n"
"(ngrams.WordFilter: its bits, a word hash's slot its value >> word_shift), linked or not as run_candidates links\n"
"it: a piece of kind 2 only around the others. `missing`: the blocks of ngrams.FORMS_BLOCK code points met and\n"
"not built, a bit each (bytes, little-endian).");

/* candidates' and triple_candidates' loop: the texts (a list of str, checked) through `chain` with `c` */
static PyObject *chains_of(PyObject *arg, Chains *c,
                           int (*chain)(const unsigned char *, Py_ssize_t, Py_ssize_t, int64_t, int64_t, Chains *)) {
    Py_ssize_t count = PyList_GET_SIZE(arg);
    PyObject **held_refs = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    Text *texts = PyMem_Calloc(count ? count : 1, sizeof(Text));
    char *forced = PyMem_Calloc(count ? count : 1, 1);
    PyObject *joined = NULL, *result = NULL, *spans = NULL, *forced_list = NULL;
    if (!held_refs || !texts || !forced) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t room = 9;
    for (Py_ssize_t t = 0; t < count; t++) {
        PyObject *s = PyList_GET_ITEM(arg, t);
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "candidates() takes a list of str, item %zd is %.80s", t,
                         Py_TYPE(s)->tp_name);
            goto done;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(s) < 0) goto done;
#endif
        Py_INCREF(s);  /* held while the loop reads it without the GIL */
        held_refs[t] = s;
        texts[t].kind = PyUnicode_KIND(s);
        texts[t].chars = PyUnicode_DATA(s);
        texts[t].length = PyUnicode_GET_LENGTH(s);
        texts[t].ascii = PyUnicode_IS_ASCII(s);
        if (texts[t].ascii) continue;  /* read where it is (its data ends with a zero, as a compact str's does) */
#if TOKMIX_UTF8_CACHE
        if (PyUnicode_IS_COMPACT(s) && ((PyCompactUnicodeObject *)s)->utf8) {
            texts[t].utf8 = ((PyCompactUnicodeObject *)s)->utf8;
            texts[t].utf8_length = ((PyCompactUnicodeObject *)s)->utf8_length;
        }
#endif
        Py_ssize_t most = texts[t].kind == PyUnicode_1BYTE_KIND ? 2 : texts[t].kind == PyUnicode_2BYTE_KIND ? 3 : 4;
        if (texts[t].length > (PY_SSIZE_T_MAX - room - 1) / most) {
            PyErr_NoMemory();
            goto done;
        }
        room += 1 + most * texts[t].length;
    }
    joined = PyByteArray_FromStringAndSize(NULL, room);
    if (!joined) goto done;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(joined);
    Py_ssize_t at = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    p[at++] = 0;
    for (Py_ssize_t t = 0; t < count && !failed; t++) {
        int r;
        if (texts[t].ascii) {
            r = chain(texts[t].chars, 0, texts[t].length, t, 0, c);
        } else {
            /* a text in joined only if a span is of it: the others' bytes written over by the next one's (most
             * texts: joined's bytes stay in cache), a cached UTF-8 read in place and copied only then */
            const Py_ssize_t mark = c->spans.size;
            Py_ssize_t n = texts[t].utf8_length;
            if (texts[t].utf8) {  /* (valid UTF-8, its zero byte after it: no lone surrogate) */
                r = chain((const unsigned char *)texts[t].utf8, 0, n, t, 1, c);
                if (r == 0 && c->spans.size > mark) {
                    memcpy(p + at, texts[t].utf8, (size_t)n);
                    for (Py_ssize_t i = mark; i < c->spans.size; i += 4) {
                        c->spans.data[i + 2] += at;
                        c->spans.data[i + 3] += at;
                    }
                }
            } else {
                n = encode(&texts[t], p + at);
                if (n < 0) {  /* a lone surrogate: checked whole (run_candidates' forced) */
                    forced[t] = 1;
                    continue;
                }
                p[at + n] = 0;
                r = chain(p, at, at + n, t, 1, c);
            }
            if (r == 0 && c->spans.size > mark) {
                p[at + n] = 0;
                at += n + 1;
            }
        }
        if (r < 0) failed = 1;
        else if (r == 1) forced[t] = 1;
    }
    if (!failed) {
        memset(p + at, 0, 8);
        at += 8;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyByteArray_Resize(joined, at) < 0) goto done;
    forced_list = PyList_New(0);
    if (!forced_list) goto done;
    for (Py_ssize_t t = 0; t < count; t++) {
        if (forced[t]) {
            PyObject *i = PyLong_FromSsize_t(t);
            if (!i || PyList_Append(forced_list, i) < 0) {
                Py_XDECREF(i);
                goto done;
            }
            Py_DECREF(i);
        }
    }
    spans = vec_bytes(&c->spans);
    if (spans) result = PyTuple_Pack(3, joined, spans, forced_list);
done:
    if (held_refs) {
        for (Py_ssize_t t = 0; t < count; t++) Py_XDECREF(held_refs[t]);
    }
    Py_XDECREF(joined);
    Py_XDECREF(spans);
    Py_XDECREF(forced_list);
    PyMem_Free(held_refs);
    PyMem_Free(texts);
    PyMem_Free(forced);
    PyMem_RawFree(c->spans.data);
    return result;
}

/* candidates() / triple_candidates() (`name`) given the normal forms, their pool and a word filter: each buffer
 * taken (the caller releases them, taken or not) and set in `c`; 0, or -1 with the exception set. */
static int take_forms(Chains *c, const char *name, PyObject *forms_arg, PyObject *pool_arg, PyObject *words_arg,
                      int word_shift, Py_buffer *forms, Py_buffer *pool, Py_buffer *words) {
    if (!pool_arg || !words_arg) {
        PyErr_Format(PyExc_TypeError, "%s() takes the normal forms, their pool and a word filter together", name);
        return -1;
    }
    if (PyObject_GetBuffer(forms_arg, forms, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(pool_arg, pool, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(words_arg, words, PyBUF_SIMPLE) < 0)
        return -1;
    if (forms->len % 4 || forms->len / 4 > (Py_ssize_t)FORMS_BLOCKS * FORMS_BLOCK ||
        word_shift < 4 || word_shift > 61 || words->len != ((Py_ssize_t)1 << (61 - word_shift))) {
        PyErr_Format(PyExc_ValueError, "%s(): the normal forms or the word filter's size do not agree", name);
        return -1;
    }
    c->forms = forms->buf;
    c->forms_end = forms->len / 4;
    c->pool = pool->buf;
    c->pool_len = pool->len;
    c->word_filter = words->buf;
    c->word_shift = word_shift;
    return 0;
}

/* chains_of's (joined, spans, forced) with the blocks the loop met and not built (a bit each) as a fourth: a new
 * reference for `result`, which it takes; NULL with the exception set. */
static PyObject *with_missing(PyObject *result, const Chains *c) {
    if (!result) return NULL;
    PyObject *missing = PyBytes_FromStringAndSize((const char *)c->missing, sizeof c->missing);
    PyObject *four = missing ? PyTuple_Pack(4, PyTuple_GET_ITEM(result, 0), PyTuple_GET_ITEM(result, 1),
                                            PyTuple_GET_ITEM(result, 2), missing) : NULL;
    Py_XDECREF(missing);
    Py_DECREF(result);
    return four;
}

static PyObject *candidates(PyObject *self, PyObject *args) {
    PyObject *arg, *table_arg, *forms_arg = NULL, *pool_arg = NULL, *filter_arg = NULL;
    int bits, word_shift = 0;
    Py_ssize_t shortest;
    Py_buffer table = {0}, forms = {0}, pool = {0}, filter = {0};
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "OOin|OOOi", &arg, &table_arg, &bits, &shortest, &forms_arg, &pool_arg,
                          &filter_arg, &word_shift))
        return NULL;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "candidates() takes a list of str");
        return NULL;
    }
    if (PyObject_GetBuffer(table_arg, &table, PyBUF_SIMPLE) < 0) return NULL;
    if (bits < 1 || bits > 31 || table.len != (((Py_ssize_t)1 << (2 * bits)) + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "candidates(): the table's size is not 1 << (2 * bits) bits");
        goto done;
    }
    Chains c;
    memset(&c, 0, sizeof c);
    c.table = table.buf;
    c.bits = bits;
    c.shortest = shortest;
    c.merge_gap = MERGE_GAP;
    if (forms_arg && take_forms(&c, "candidates", forms_arg, pool_arg, filter_arg, word_shift, &forms, &pool, &filter))
        goto done;
    result = chains_of(arg, &c, chain_text);
    if (forms_arg) result = with_missing(result, &c);
done:
    PyBuffer_Release(&table);
    PyBuffer_Release(&forms);
    PyBuffer_Release(&pool);
    PyBuffer_Release(&filter);
    return result;
}

PyDoc_STRVAR(triple_candidates_doc,
"triple_candidates(texts, filter, shift, shortest) -> (joined, spans, forced)\n\n"
"candidates() with a filter of triples instead of a pair table (ngrams.TripleFilter: `filter` a bit per slot,\n"
"1 << (64 - shift) of them, little-endian in each byte; a triple's slot its hash >> shift), `shortest` >= 3:\n"
"the spans of its chains of plain runs and of its pieces with wild runs, as candidates() gives them.\n\n"
"triple_candidates(texts, filter, shift, shortest, forms, pool, word_filter, word_shift) -> (joined, spans,\n"
"forced, missing): the same, each wild run whose characters all have a normal form decided in the loop as\n"
"candidates() decides it (its words tested against the word filter) and its chains found as run_candidates\n"
"finds them: a piece of kind 2 only around the others. `missing` as candidates() gives it.");

static PyObject *triple_candidates(PyObject *self, PyObject *args) {
    PyObject *arg, *filter_arg;
    int shift;
    Py_ssize_t shortest;
    PyObject *forms_arg = NULL, *pool_arg = NULL, *words_arg = NULL, *result = NULL;
    int word_shift = 0;
    Py_buffer filter = {0}, forms = {0}, pool = {0}, words = {0};
    Chains c;
    Runs runs;
    memset(&c, 0, sizeof c);
    memset(&runs, 0, sizeof runs);
    if (!PyArg_ParseTuple(args, "OOin|OOOi", &arg, &filter_arg, &shift, &shortest, &forms_arg, &pool_arg,
                          &words_arg, &word_shift))
        return NULL;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "triple_candidates() takes a list of str");
        return NULL;
    }
    if (shortest < 3) {
        PyErr_SetString(PyExc_ValueError, "triple_candidates(): shortest is less than 3");
        return NULL;
    }
    if (PyObject_GetBuffer(filter_arg, &filter, PyBUF_SIMPLE) < 0) return NULL;
    if (shift < 4 || shift > 61 || filter.len != ((Py_ssize_t)1 << (61 - shift))) {
        PyErr_SetString(PyExc_ValueError, "triple_candidates(): the filter's size is not 1 << (64 - shift) bits");
        goto done;
    }
    c.filter = filter.buf;
    c.shift = shift;
    c.shortest = shortest;
    c.merge_gap = TRIPLE_MERGE_GAP;
    c.runs = &runs;
    if (forms_arg && take_forms(&c, "triple_candidates", forms_arg, pool_arg, words_arg, word_shift, &forms, &pool,
                                &words))
        goto done;
    result = chains_of(arg, &c, triple_text);
    if (forms_arg) result = with_missing(result, &c);
done:
    PyMem_RawFree(runs.start);
    PyMem_RawFree(runs.end);
    PyMem_RawFree(runs.slot);
    PyMem_RawFree(runs.may);
    PyMem_RawFree(runs.wild);
    PyMem_RawFree(runs.words);
    PyBuffer_Release(&filter);
    PyBuffer_Release(&forms);
    PyBuffer_Release(&pool);
    PyBuffer_Release(&words);
    return result;
}

PyDoc_STRVAR(table_links_doc,
"table_links(heads, table, bits, out)\n\n"
"For each two consecutive words (heads: their first 8 bytes, uint64), out[i] = table[class(i) << bits |\n"
"class(i + 1)], a word's class the top `bits` bits of its head times ngrams._MIX1 (ngrams.word_classes).\n"
"`table` and `out` are bool (one byte each); out holds len(heads) - 1.");

static PyObject *table_links(PyObject *self, PyObject *args) {
    Py_buffer heads, table, out;
    int bits;
    if (!PyArg_ParseTuple(args, "y*y*iw*", &heads, &table, &bits, &out)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = heads.len / (Py_ssize_t)sizeof(uint64_t);
    if (bits < 1 || bits > 31 || table.len != ((Py_ssize_t)1 << (2 * bits)) || heads.len % 8 ||
        out.len != (n ? n - 1 : 0)) {
        PyErr_SetString(PyExc_ValueError, "table_links(): sizes of heads, table and out do not agree with bits");
        goto done;
    }
    if (n > 1) {
        const unsigned char *h = heads.buf, *tab = table.buf;
        unsigned char *o = out.buf;
        int shift = 64 - bits;
        Py_BEGIN_ALLOW_THREADS
        uint64_t x;
        memcpy(&x, h, 8);
        uint64_t prev = (x * MIX1) >> shift;
        for (Py_ssize_t i = 1; i < n; i++) {
            memcpy(&x, h + 8 * i, 8);
            uint64_t cls = (x * MIX1) >> shift;
            o[i - 1] = tab[(prev << bits) | cls];
            prev = cls;
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&heads);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    return result;
}

static int add_arrow_functions(PyObject *m);  /* gamma's section, at the end */

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"table_links", table_links, METH_VARARGS, table_links_doc},
    {"candidates", candidates, METH_VARARGS, candidates_doc},
    {"triple_candidates", triple_candidates, METH_VARARGS, triple_candidates_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "tokmix.ngrams' first pass, compiled.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__scan(void) {
    for (int c = 0; c < 256; c++)
        WORD_BYTE[c] = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "ABI", TOKMIX_SCAN_ABI) < 0 || add_arrow_functions(m) < 0))
        Py_CLEAR(m);
    return m;
}

/* ---- gamma's section: an Arrow string batch to its texts (tokmix.sources.parquet) --------------------------
 * arrow_texts(): one pass from an Arrow string / large_string batch's value offsets and data buffer to the batch's
 * list[str] (the str values of pyarrow's to_pylist: each one CPython's own UTF-8 decode of the value's bytes, so an
 * invalid value raises the UnicodeDecodeError to_pylist raises) and, when asked, each value's CRC-32 (zlib's: the
 * provenance checksums tokmix.text.crc32 gives); and each non-ASCII str made with its UTF-8 kept in CPython's own
 * cache (PyCompactUnicodeObject.utf8, allocated as PyUnicode_AsUTF8AndSize's unicode_fill_utf8 allocates it, so
 * unicode_dealloc frees it: PyObject_Malloc up to 3.12, PyMem_Malloc in 3.13; PYTHONMALLOC=debug checks the pair on
 * each version, by hand: docs/benchmarks.md), which the encoder then reads instead of encoding the str again (fastokens
 * asks each str for its UTF-8 with the GIL held: docs/benchmarks.md). The cache is filled only on CPython 3.10-3.13
 * (their headers' layout, checked) with the GIL, not with the limited API, and only in a str this call alone holds
 * (a fresh object, refcount 1: never a shared singleton); elsewhere the strs are the same, their cache left empty.
 * TEXTS_ABI: this section's arguments and results, which tokmix.sources.parquet checks before it uses them. */

#define TOKMIX_TEXTS_ABI 1

#if !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030A0000 && \
    PY_VERSION_HEX < 0x030E0000
#define TOKMIX_UTF8_PREFILL 1
#else
#define TOKMIX_UTF8_PREFILL 0
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TOKMIX_CRC_CLMUL 1
#include <immintrin.h>
#else
#define TOKMIX_CRC_CLMUL 0
#endif

static uint32_t CRC_TABLE[8][256];  /* zlib's CRC-32 (reflected 0xEDB88320), slice by 8 */
static int crc_clmul;               /* the CPU has PCLMULQDQ and SSE4.1 */

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        CRC_TABLE[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++) CRC_TABLE[k][n] = CRC_TABLE[0][CRC_TABLE[k - 1][n] & 0xFF] ^ (CRC_TABLE[k - 1][n] >> 8);
#if TOKMIX_CRC_CLMUL
    __builtin_cpu_init();
    crc_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* the register form (pre- and post-inverted by the caller), by table */
static uint32_t crc_table(uint32_t c, const unsigned char *p, Py_ssize_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = CRC_TABLE[7][lo & 0xFF] ^ CRC_TABLE[6][(lo >> 8) & 0xFF] ^ CRC_TABLE[5][(lo >> 16) & 0xFF] ^
            CRC_TABLE[4][lo >> 24] ^ CRC_TABLE[3][hi & 0xFF] ^ CRC_TABLE[2][(hi >> 8) & 0xFF] ^
            CRC_TABLE[1][(hi >> 16) & 0xFF] ^ CRC_TABLE[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n-- > 0) c = CRC_TABLE[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if TOKMIX_CRC_CLMUL
/* the register form over n bytes, n >= 64 and a multiple of 16: folding by carry-less multiplication (Gopal et al.,
 * "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009; the bit-reflected
 * constants of its appendix for zlib's polynomial) */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    while (n >= 64) {
        __m128i x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00), x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        __m128i x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00), x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        n -= 64;
    }
    /* four lanes into one */
    __m128i x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
    while (n >= 16) {
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11),
                                         _mm_loadu_si128((const __m128i *)p)), x5);
        p += 16;
        n -= 16;
    }
    /* 128 bits to 64, then to 32, then Barrett's reduction */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5k0, 0x00), x2);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

/* zlib.crc32(bytes) of n bytes at p */
static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
#if TOKMIX_CRC_CLMUL
    if (crc_clmul && n >= 64) {
        Py_ssize_t whole = n & ~(Py_ssize_t)15;
        c = crc_fold(c, p, whole);
        p += whole;
        n -= whole;
    }
#endif
    return ~crc_table(c, p, n);
}

/* the value offsets (count + 1, 4 or 8 bytes each) as int64, checked: ascending, within the data's size */
static int read_offsets(const Py_buffer *offsets, int width, Py_ssize_t data_len, Py_ssize_t *count,
                        int64_t **out) {
    if ((width != 4 && width != 8) || offsets->len % width || offsets->len < width) {
        PyErr_SetString(PyExc_ValueError, "arrow_texts(): offsets must hold count + 1 values of `width` bytes");
        return -1;
    }
    Py_ssize_t n = offsets->len / width;
    int64_t *o = PyMem_Malloc((size_t)n * sizeof(int64_t));
    if (!o) {
        PyErr_NoMemory();
        return -1;
    }
    const unsigned char *b = offsets->buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (width == 4) {
            int32_t v;
            memcpy(&v, b + 4 * i, 4);
            o[i] = v;
        } else {
            memcpy(&o[i], b + 8 * i, 8);
        }
        if (o[i] < 0 || o[i] > data_len || (i && o[i] < o[i - 1])) {
            PyMem_Free(o);
            PyErr_SetString(PyExc_ValueError, "arrow_texts(): offsets out of order or past the data buffer");
            return -1;
        }
    }
    *count = n - 1;
    *out = o;
    return 0;
}

/* keep the n bytes at p (the str's UTF-8) as s's UTF-8 cache: -1 (MemoryError) or 0 */
static int keep_utf8(PyObject *s, const char *p, Py_ssize_t n) {
#if TOKMIX_UTF8_PREFILL
    if (Py_REFCNT(s) != 1 || !PyUnicode_IS_COMPACT(s) || PyUnicode_IS_ASCII(s))
        return 0;
    PyCompactUnicodeObject *c = (PyCompactUnicodeObject *)s;
    if (c->utf8 != NULL)
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    char *cache = PyMem_Malloc((size_t)n + 1);  /* 3.13's unicode_dealloc frees it by PyMem_Free */
#else
    char *cache = PyObject_Malloc((size_t)n + 1);
#endif
    if (!cache) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(cache, p, (size_t)n);
    cache[n] = '\0';
    c->utf8 = cache;
    c->utf8_length = n;
#else
    (void)s, (void)p, (void)n;
#endif
    return 0;
}

/* each value's CRC-32 as a list of ints; the checksums computed without the GIL */
static PyObject *checksums_of(const int64_t *o, Py_ssize_t count, const unsigned char *bytes) {
    uint32_t *sums = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(uint32_t));
    if (!sums) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) sums[i] = crc32_of(bytes + o[i], (Py_ssize_t)(o[i + 1] - o[i]));
    Py_END_ALLOW_THREADS
    PyObject *crcs = PyList_New(count);
    for (Py_ssize_t i = 0; crcs && i < count; i++) {
        PyObject *v = PyLong_FromUnsignedLong(sums[i]);
        if (!v) Py_CLEAR(crcs);
        else PyList_SET_ITEM(crcs, i, v);
    }
    PyMem_Free(sums);
    return crcs;
}

PyDoc_STRVAR(arrow_texts_doc,
"arrow_texts(offsets, data, width, checksums, keep_utf8) -> (list[str], list[int] | None)\n\n"
"The strs of an Arrow string batch's values (pyarrow's to_pylist, without nulls: the caller refuses a batch that\n"
"has any): `offsets` its count + 1 value offsets (`width` 4 or 8 bytes each, the batch's own slice of them),\n"
"`data` its data buffer (None: empty). With `checksums`, each value's CRC-32 (zlib's), else None. With\n"
"`keep_utf8`, each non-ASCII str holds its UTF-8 in CPython's cache (UTF8_PREFILL: where it can).\n"
"An invalid value raises CPython's UnicodeDecodeError for its bytes.");

static PyObject *arrow_texts(PyObject *self, PyObject *args) {
    Py_buffer offsets, data = {0};
    PyObject *data_obj;
    int width, checksums, keep;
    if (!PyArg_ParseTuple(args, "y*Oipp", &offsets, &data_obj, &width, &checksums, &keep)) return NULL;
    if (data_obj != Py_None && PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&offsets);
        return NULL;
    }
    PyObject *texts = NULL, *crcs = NULL, *result = NULL;
    int64_t *o = NULL;
    Py_ssize_t count;
    const unsigned char *bytes = data.buf ? data.buf : (const unsigned char *)"";
    if (read_offsets(&offsets, width, data.buf ? data.len : 0, &count, &o) < 0) goto done;
    if (checksums && !(crcs = checksums_of(o, count, bytes))) goto done;
    if (!(texts = PyList_New(count))) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *p = (const char *)bytes + o[i];
        Py_ssize_t n = (Py_ssize_t)(o[i + 1] - o[i]);
        PyObject *s = PyUnicode_DecodeUTF8(p, n, NULL);
        if (!s) goto done;
        PyList_SET_ITEM(texts, i, s);
        if (keep && keep_utf8(s, p, n) < 0) goto done;
    }
    result = PyTuple_Pack(2, texts, crcs ? crcs : Py_None);
done:
    Py_XDECREF(texts);
    Py_XDECREF(crcs);
    PyMem_Free(o);
    PyBuffer_Release(&offsets);
    if (data_obj != Py_None) PyBuffer_Release(&data);
    return result;
}

PyDoc_STRVAR(crc32s_doc,
"crc32s(offsets, data, width) -> list[int]\n\n"
"Each value's CRC-32 (zlib's) of an Arrow batch's offsets and data buffer, as arrow_texts gives them.");

static PyObject *crc32s(PyObject *self, PyObject *args) {
    Py_buffer offsets, data = {0};
    PyObject *data_obj, *result = NULL;
    int width;
    if (!PyArg_ParseTuple(args, "y*Oi", &offsets, &data_obj, &width)) return NULL;
    if (data_obj != Py_None && PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&offsets);
        return NULL;
    }
    int64_t *o = NULL;
    Py_ssize_t count;
    if (read_offsets(&offsets, width, data.buf ? data.len : 0, &count, &o) == 0)
        result = checksums_of(o, count, data.buf ? data.buf : (const unsigned char *)"");
    PyMem_Free(o);
    PyBuffer_Release(&offsets);
    if (data_obj != Py_None) PyBuffer_Release(&data);
    return result;
}

static PyMethodDef arrow_methods[] = {
    {"arrow_texts", arrow_texts, METH_VARARGS, arrow_texts_doc},
    {"crc32s", crc32s, METH_VARARGS, crc32s_doc},
    {NULL, NULL, 0, NULL},
};

static int add_arrow_functions(PyObject *m) {
    crc_init();
    if (PyModule_AddFunctions(m, arrow_methods) < 0) return -1;
    if (PyModule_AddIntConstant(m, "TEXTS_ABI", TOKMIX_TEXTS_ABI) < 0) return -1;
    return PyModule_AddIntConstant(m, "UTF8_PREFILL", TOKMIX_UTF8_PREFILL);
}
