/*
 * A delay line between pairs of Ethernet (TAP) devices, for scripts/cluster:
 * the latency that this kernel's missing netem would add.
 *
 *   delayline MICROSECONDS LOSS_PPM MTU TAP_A TAP_B [TAP_A TAP_B ...]
 *
 * Makes each named TAP device (they vanish when this process ends, so a
 * killed delay line leaves none behind), writes "ready" on standard output
 * once all exist, and from then on carries every frame read from TAP_A out
 * of TAP_B and the other way, MICROSECONDS after it arrived, in arrival
 * order; LOSS_PPM frames in a million are dropped (a fixed sequence, the
 * same every run). The caller sets the devices' MTU (frames larger than
 * MTU and its Ethernet header are dropped), moves them into namespaces and
 * bridges and shapes their egress (tc tbf): a frame is shaped, then delayed.
 *
 * Why frames wait in rings of fixed slots: nothing is allocated per frame,
 * and a full ring drops, as a router's queue would (TCP sees a loss). A ring
 * holds 3 MB whatever the MTU (2048 frames of 1500 bytes, 341 of 9000): 24 ms
 * of a 1 Gbit link.
 *
 * Why an MTU above Ethernet's 1500: every frame costs this process two
 * system calls and a wake-up, and its write carries the frame through the
 * receiving side's network stack on this process's time. At 100 Mbit and
 * 1500 bytes that took half a core; frames of 9000 bytes (a jumbo-frame
 * link, common between servers) take a sixth as many.
 *
 * Why ppoll: poll's timeout is whole milliseconds, a delay line's is not;
 * the timer slack is set to 1 ns so that a wake-up comes when asked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define RING_BYTES (3u << 20)
#define MTU_MAX 65521 /* with its 14-byte header, what a frame's length holds */
#define MAX_TAPS 64

typedef struct {
    uint64_t due_ns;
    uint32_t len;
    unsigned char data[]; /* frame_max bytes */
} slot;

/* One direction: frames read from fd in, waiting to go out of fd out. */
typedef struct {
    int in, out;
    unsigned char *ring; /* slots of slot_bytes each */
    unsigned head, count;
} line;

static size_t frame_max, slot_bytes;
static unsigned slots;

static slot *slot_at(line *l, unsigned i) { return (slot *)(l->ring + (size_t)(i % slots) * slot_bytes); }

static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int open_tap(const char *name)
{
    struct ifreq ifr;
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "delayline: /dev/net/tun: %s\n", strerror(errno));
        return -1;
    }
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (strlen(name) >= IFNAMSIZ) {
        fprintf(stderr, "delayline: device name '%s' is longer than %d characters\n", name,
                IFNAMSIZ - 1);
        close(fd);
        return -1;
    }
    memcpy(ifr.ifr_name, name, strlen(name) + 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "delayline: cannot make TAP device '%s': %s\n", name, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* xorshift64: the losses, the same every run */
static uint64_t rng = 0x9e3779b97f4a7c15u;

static int lost(unsigned ppm)
{
    if (ppm == 0)
        return 0;
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % 1000000u < ppm;
}

/* Reads what fd in holds into the ring, each frame due delay_ns from now. */
static void take(line *l, uint64_t delay_ns, unsigned loss_ppm)
{
    unsigned char spill[65536];
    for (;;) {
        slot *s = l->count < slots ? slot_at(l, l->head + l->count) : NULL;
        ssize_t n = s ? read(l->in, s->data, frame_max + 1) : read(l->in, spill, sizeof spill);
        if (n <= 0)
            return; /* EAGAIN: drained (an error here ends nothing: the device may be going) */
        if (!s || (size_t)n > frame_max || lost(loss_ppm))
            continue;
        s->len = (uint32_t)n;
        s->due_ns = now_ns() + delay_ns;
        l->count++;
    }
}

/* Sends every frame whose time has come; returns the next one's due time. */
static uint64_t give(line *l, uint64_t now)
{
    while (l->count > 0) {
        slot *s = slot_at(l, l->head);
        if (s->due_ns > now)
            return s->due_ns;
        if (write(l->out, s->data, s->len) < 0 && errno == EAGAIN)
            return now + 10000; /* the device's queue is full: try again in 10 us */
        l->head = (l->head + 1) % slots;
        l->count--;
    }
    return UINT64_MAX;
}

int main(int argc, char **argv)
{
    if (argc < 6 || argc % 2 == 1 || (argc - 4) > MAX_TAPS) {
        fprintf(stderr, "usage: delayline MICROSECONDS LOSS_PPM MTU TAP_A TAP_B [TAP_A TAP_B ...]"
                        " (at most %d devices)\n", MAX_TAPS);
        return 2;
    }
    char *end;
    unsigned long us = strtoul(argv[1], &end, 10);
    if (*end || end == argv[1] || us > 10000000) {
        fprintf(stderr, "delayline: MICROSECONDS is a whole number up to 10 s, not '%s'\n", argv[1]);
        return 2;
    }
    unsigned long ppm = strtoul(argv[2], &end, 10);
    if (*end || end == argv[2] || ppm > 1000000) {
        fprintf(stderr, "delayline: LOSS_PPM is a whole number up to 1000000, not '%s'\n", argv[2]);
        return 2;
    }
    unsigned long mtu = strtoul(argv[3], &end, 10);
    if (*end || end == argv[3] || mtu < 68 || mtu > MTU_MAX) {
        fprintf(stderr, "delayline: MTU is a whole number 68 to %d, not '%s'\n", MTU_MAX, argv[3]);
        return 2;
    }
    frame_max = mtu + 14;
    slot_bytes = (sizeof(slot) + frame_max + 1 + 7) / 8 * 8; /* a byte more: a longer frame shows */
    slots = (unsigned)(RING_BYTES / slot_bytes);
    if (slots < 32)
        slots = 32;
    int ntaps = argc - 4, fds[MAX_TAPS];
    line lines[MAX_TAPS];
    struct pollfd pfd[MAX_TAPS];
    for (int i = 0; i < ntaps; i++) {
        fds[i] = open_tap(argv[4 + i]);
        if (fds[i] < 0)
            return 1;
    }
    for (int i = 0; i < ntaps; i++) {
        lines[i].in = fds[i];
        lines[i].out = fds[i ^ 1];
        lines[i].head = lines[i].count = 0;
        lines[i].ring = malloc(slot_bytes * slots);
        if (!lines[i].ring) {
            fprintf(stderr, "delayline: out of memory\n");
            return 1;
        }
        pfd[i].fd = fds[i];
        pfd[i].events = POLLIN;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    printf("ready\n");
    fflush(stdout);

    uint64_t delay_ns = (uint64_t)us * 1000u;
    while (!stop) {
        uint64_t now = now_ns(), next = UINT64_MAX;
        for (int i = 0; i < ntaps; i++) {
            uint64_t t = give(&lines[i], now);
            if (t < next)
                next = t;
        }
        struct timespec wait, *timeout = NULL;
        if (next != UINT64_MAX) {
            uint64_t d = next > now ? next - now : 0;
            wait.tv_sec = (time_t)(d / 1000000000u);
            wait.tv_nsec = (long)(d % 1000000000u);
            timeout = &wait;
        }
        int n = ppoll(pfd, (nfds_t)ntaps, timeout, NULL);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "delayline: ppoll: %s\n", strerror(errno));
            return 1;
        }
        for (int i = 0; n > 0 && i < ntaps; i++)
            if (pfd[i].revents & POLLIN)
                take(&lines[i], delay_ns, (unsigned)ppm);
    }
    for (int i = 0; i < ntaps; i++) {
        free(lines[i].ring);
        close(fds[i]);
    }
    return 0;
}
