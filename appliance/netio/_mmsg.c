/* appliance.netio._mmsg: batched UDP receive/send (recvmmsg(2) / sendmmsg(2)), shared by the
 * relay and the transceiver.
 *
 * Only the syscall batching lives here, the way Python's socket module is C: every routing
 * decision (flow table, ufrag checks, counters) stays in appliance/relay/fastpath.py. Linux
 * only; the relay falls back to its pure-Python loop when this module is not built.
 *
 *   recv_batch(fd, buf, slot, headroom, capacity, max_msgs) -> list[(n, (host, port))]
 *       One recvmmsg(MSG_DONTWAIT | MSG_TRUNC): message i lands at buf[i*slot + headroom:]
 *       (at most `capacity` bytes). n is the datagram's real length (MSG_TRUNC), so n >
 *       capacity means it was truncated. An empty list means nothing to read (EAGAIN).
 *       Source addresses are (host, port) like socket.recvfrom's first two items.
 *
 *   send_batch(fd, buf, msgs) -> (sent, bytes, failed)
 *       msgs: list of (header: bytes, offset, length, (host, port)). Each datagram is
 *       header + buf[offset:offset+length], gathered from two iovecs (no concatenation),
 *       sent with sendmmsg(MSG_DONTWAIT). A message the kernel refuses (EAGAIN with a full
 *       buffer, an ICMP error queued on the socket, a bad address) is counted in `failed`
 *       and skipped; the rest are still sent. Nothing is raised for per-message errors.
 *       Runs of same-size datagrams to one address go out as one UDP GSO send (UDP_SEGMENT)
 *       when the kernel takes it (set_gso(False) turns that off).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#define MAX_MSGS 256

/* Source addresses as (host, port) tuples, cached: a flow's datagrams keep coming from the
 * same address, and handing back the *same* tuple each time saves building a str, an int and
 * a tuple per datagram and lets the flow-table lookup reuse the str's cached hash. The cache
 * is direct-mapped and fixed-size (ADDR_CACHE entries, a colliding address replaces the old
 * one), so it never grows. Keys are the raw address bytes, port and family. */
#define ADDR_CACHE 8192

typedef struct {
    unsigned char key[20]; /* family (1), port (2), address (4 or 16), pad */
    PyObject *addr;
} addr_entry;

static addr_entry addr_cache[ADDR_CACHE];

static PyObject *
build_addr(const struct sockaddr_storage *ss)
{
    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    int port, len;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        const unsigned char *b = (const unsigned char *)&a->sin_addr;
        len = snprintf(host, sizeof host, "%u.%u.%u.%u", b[0], b[1], b[2], b[3]);
        port = ntohs(a->sin_port);
    }
    else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        port = ntohs(a->sin6_port);
        if (a->sin6_scope_id != 0) {
            /* Same text as the socket module (getnameinfo appends "%scope"). */
            if (getnameinfo((const struct sockaddr *)a, sizeof *a, host, sizeof host, NULL, 0,
                            NI_NUMERICHOST) != 0)
                return Py_BuildValue("(si)", "", 0);
        }
        else if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host) == NULL) {
            return Py_BuildValue("(si)", "", 0);
        }
        len = (int)strlen(host);
    }
    else {
        return Py_BuildValue("(si)", "", 0); /* unknown family: never a flow */
    }
    PyObject *h = PyUnicode_DecodeASCII(host, len, NULL);
    if (h == NULL)
        return NULL;
    PyObject *p = PyLong_FromLong(port);
    if (p == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(h);
        Py_DECREF(p);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, h);
    PyTuple_SET_ITEM(t, 1, p);
    return t;
}

/* A new reference to the (host, port) of a source address. */
static PyObject *
make_addr(const struct sockaddr_storage *ss)
{
    unsigned char key[20];
    uint32_t h;
    memset(key, 0, sizeof key);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        key[0] = 4;
        memcpy(key + 1, &a->sin_port, 2);
        memcpy(key + 3, &a->sin_addr, 4);
        uint32_t ip;
        memcpy(&ip, &a->sin_addr, 4);
        h = ip * 2654435761u ^ (uint32_t)a->sin_port * 40503u;
    }
    else if (ss->ss_family == AF_INET6 &&
             ((const struct sockaddr_in6 *)ss)->sin6_scope_id == 0) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        key[0] = 6;
        memcpy(key + 1, &a->sin6_port, 2);
        memcpy(key + 3, &a->sin6_addr, 16);
        uint32_t w[4];
        memcpy(w, &a->sin6_addr, 16);
        h = (w[0] ^ w[1] * 31u ^ w[2] * 961u ^ w[3]) * 2654435761u ^
            (uint32_t)a->sin6_port * 40503u;
    }
    else {
        return build_addr(ss);
    }
    addr_entry *e = &addr_cache[(h ^ (h >> 15)) & (ADDR_CACHE - 1)];
    if (e->addr != NULL && memcmp(e->key, key, sizeof key) == 0) {
        Py_INCREF(e->addr);
        return e->addr;
    }
    PyObject *addr = build_addr(ss);
    if (addr == NULL)
        return NULL;
    Py_XSETREF(e->addr, Py_NewRef(addr));
    memcpy(e->key, key, sizeof key);
    return addr;
}

/* (host, port) -> sockaddr; 0 on failure (not an IP literal, bad port). No resolution: the
 * relay resolves every name before it reaches the hot path. */
static socklen_t
parse_addr(PyObject *addr, struct sockaddr_storage *ss)
{
    if (!PyTuple_Check(addr) || PyTuple_GET_SIZE(addr) < 2)
        return 0;
    PyObject *h = PyTuple_GET_ITEM(addr, 0);
    PyObject *p = PyTuple_GET_ITEM(addr, 1);
    if (!PyUnicode_Check(h) || !PyLong_Check(p))
        return 0;
    long port = PyLong_AsLong(p);
    if (port < 0 || port > 65535) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t hlen;
    const char *host = PyUnicode_AsUTF8AndSize(h, &hlen);
    if (host == NULL) {
        PyErr_Clear();
        return 0;
    }
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((unsigned short)port);
        return sizeof *a4;
    }
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    const char *pct = memchr(host, '%', (size_t)hlen);
    if (pct != NULL) { /* fe80::1%eth0 */
        size_t n = (size_t)(pct - host);
        if (n >= INET6_ADDRSTRLEN)
            return 0;
        memcpy(buf, host, n);
        buf[n] = 0;
        a6->sin6_scope_id = if_nametoindex(pct + 1);
        if (a6->sin6_scope_id == 0)
            a6->sin6_scope_id = (uint32_t)strtoul(pct + 1, NULL, 10);
        host = buf;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((unsigned short)port);
        return sizeof *a6;
    }
    return 0;
}

/* METH_FASTCALL argument helpers: these functions run once or twice per hot-loop wake-up,
 * where PyArg_ParseTuple's format parsing is measurable. */
static int
int_arg(PyObject *o, const char *what, Py_ssize_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    *out = PyLong_AsSsize_t(o);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *
recv_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buf;
    Py_ssize_t fd_, slot, headroom, capacity, max_;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "recv_batch(fd, buf, slot, headroom, capacity, max_msgs)");
        return NULL;
    }
    if (int_arg(args[0], "fd", &fd_) < 0 || int_arg(args[2], "slot", &slot) < 0 ||
        int_arg(args[3], "headroom", &headroom) < 0 ||
        int_arg(args[4], "capacity", &capacity) < 0 || int_arg(args[5], "max_msgs", &max_) < 0)
        return NULL;
    if (fd_ < 0 || fd_ > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "recv_batch: bad fd");
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &buf, PyBUF_WRITABLE) < 0)
        return NULL;
    int fd = (int)fd_;
    int max_msgs = max_ > MAX_MSGS ? MAX_MSGS : (int)(max_ < 0 ? 0 : max_);
    if (slot <= 0 || headroom < 0 || capacity <= 0 || headroom + capacity > slot ||
        max_msgs < 1 || (Py_ssize_t)max_msgs * slot > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError,
                        "recv_batch: need headroom + capacity <= slot and max_msgs * slot <= len(buf)");
        return NULL;
    }
    struct mmsghdr msgs[MAX_MSGS];
    struct iovec iov[MAX_MSGS];
    struct sockaddr_storage names[MAX_MSGS];
    char *base = (char *)buf.buf;
    for (int i = 0; i < max_msgs; i++) {
        iov[i].iov_base = base + (Py_ssize_t)i * slot + headroom;
        iov[i].iov_len = (size_t)capacity;
        memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
        msgs[i].msg_hdr.msg_name = &names[i];
        msgs[i].msg_hdr.msg_namelen = sizeof names[i];
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_len = 0;
    }
    int got;
    /* An error queued on the socket (an ICMP error after an earlier send, with IP_RECVERR) is
     * reported by the next receive and then cleared: skip those, as the Python loop does, and
     * after a few in a row report "nothing to read" (epoll says when to try again). Only a
     * bad descriptor or buffer raises. */
    for (int tries = 0;; tries++) {
        got = recvmmsg(fd, msgs, (unsigned int)max_msgs, MSG_DONTWAIT | MSG_TRUNC, NULL);
        if (got >= 0)
            break;
        if (errno == EBADF || errno == ENOTSOCK || errno == EFAULT || errno == EINVAL) {
            PyBuffer_Release(&buf);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK || tries >= 8) {
            got = 0;
            break;
        }
    }
    PyBuffer_Release(&buf);
    PyObject *out = PyList_New(got);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < got; i++) {
        PyObject *addr = make_addr(&names[i]);
        if (addr == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *item = PyTuple_New(2);
        PyObject *n = PyLong_FromUnsignedLong(msgs[i].msg_len);
        if (item == NULL || n == NULL) {
            Py_XDECREF(item);
            Py_XDECREF(n);
            Py_DECREF(addr);
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(item, 0, n);
        PyTuple_SET_ITEM(item, 1, addr);
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* sendmmsg of msgs[from:to]. It stops at the first message that fails: count that one and
 * go on after it. */
static void
send_range(int fd, struct mmsghdr *msgs, int from, int to, unsigned long long *sent,
           unsigned long long *nbytes, unsigned long long *failed)
{
    int done = from;
    while (done < to) {
        int r = sendmmsg(fd, msgs + done, (unsigned int)(to - done), MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            (*failed)++;
            done++;
            continue;
        }
        for (int j = done; j < done + r; j++)
            *nbytes += msgs[j].msg_len;
        *sent += (unsigned long long)r;
        done += r;
    }
}

/* UDP GSO (UDP_SEGMENT, Linux >= 4.18): consecutive datagrams of the same length to the same
 * address (the forward direction: many flows, one transceiver) are handed to the kernel as
 * one send, which the stack splits back into the same datagrams; the receiver sees exactly
 * what separate sends would give it, and the per-send cost of the stack (route, skb, device,
 * softirq) is paid once per run. */
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define GSO_MAX_SEGS 64      /* UDP_MAX_SEGMENTS on older kernels */
#define GSO_MAX_BYTES 60000  /* stay under the 64 kB limit of one UDP send */

static int gso_enabled = 1;

static size_t
msg_size(const struct iovec *v)
{
    return v[0].iov_len + v[1].iov_len;
}

/* Length of the run of GSO-able datagrams starting at msgs[j]. */
static int
gso_run(struct mmsghdr *msgs, struct iovec (*iov)[2], int j, int k)
{
    size_t size = msg_size(iov[j]);
    if (size == 0 || size > 1472) /* keep each datagram within one Ethernet MTU */
        return 1;
    const struct msghdr *h = &msgs[j].msg_hdr;
    int r = 1;
    while (j + r < k && r < GSO_MAX_SEGS && (size_t)(r + 1) * size <= GSO_MAX_BYTES) {
        const struct msghdr *n = &msgs[j + r].msg_hdr;
        if (msg_size(iov[j + r]) != size || n->msg_namelen != h->msg_namelen ||
            memcmp(n->msg_name, h->msg_name, h->msg_namelen) != 0)
            break;
        r++;
    }
    return r;
}

/* One UDP_SEGMENT send of msgs[j:j+r] (their iovecs are contiguous); 0 if the kernel refused
 * it, and the caller sends them one by one instead. */
static int
send_gso(int fd, struct mmsghdr *msgs, struct iovec (*iov)[2], int j, int r,
         unsigned long long *sent, unsigned long long *nbytes)
{
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    memset(&ctl, 0, sizeof ctl);
    mh.msg_name = msgs[j].msg_hdr.msg_name;
    mh.msg_namelen = msgs[j].msg_hdr.msg_namelen;
    mh.msg_iov = iov[j];
    mh.msg_iovlen = (size_t)(2 * r);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t seg = (uint16_t)msg_size(iov[j]);
    memcpy(CMSG_DATA(cm), &seg, sizeof seg);
    ssize_t n;
    do {
        n = sendmsg(fd, &mh, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == ENOPROTOOPT || errno == EOPNOTSUPP)
            gso_enabled = 0; /* a kernel without UDP GSO: never try again */
        return 0;
    }
    for (int i = j; i < j + r; i++)
        msgs[i].msg_len = (unsigned int)seg;
    *sent += (unsigned long long)r;
    *nbytes += (unsigned long long)n;
    return 1;
}

static PyObject *
send_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buf;
    Py_ssize_t fd_;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "send_batch(fd, buf, msgs)");
        return NULL;
    }
    if (int_arg(args[0], "fd", &fd_) < 0)
        return NULL;
    if (fd_ < 0 || fd_ > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "send_batch: bad fd");
        return NULL;
    }
    PyObject *list = args[2];
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "send_batch: msgs must be a list");
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    int fd = (int)fd_;
    struct mmsghdr msgs[MAX_MSGS];
    struct iovec iov[MAX_MSGS][2];
    struct sockaddr_storage names[MAX_MSGS];
    unsigned long long sent = 0, nbytes = 0, failed = 0;
    Py_ssize_t total = PyList_GET_SIZE(list);
    Py_ssize_t i = 0;
    while (i < total) {
        /* Build up to MAX_MSGS messages; entries that cannot be sent count as failed. */
        int k = 0;
        PyObject *last_addr = NULL;
        socklen_t last_len = 0;
        for (; i < total && k < MAX_MSGS; i++) {
            PyObject *t = PyList_GET_ITEM(list, i);
            if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4 ||
                !PyBytes_Check(PyTuple_GET_ITEM(t, 0))) {
                PyBuffer_Release(&buf);
                PyErr_SetString(PyExc_TypeError,
                                "send_batch: items are (header: bytes, offset, length, addr)");
                return NULL;
            }
            PyObject *hdr = PyTuple_GET_ITEM(t, 0);
            Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 1));
            Py_ssize_t len = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 2));
            if ((off == -1 || len == -1) && PyErr_Occurred()) {
                PyBuffer_Release(&buf);
                return NULL;
            }
            if (off < 0 || len < 0 || off > buf.len || len > buf.len - off) {
                PyBuffer_Release(&buf);
                PyErr_SetString(PyExc_ValueError, "send_batch: payload outside the buffer");
                return NULL;
            }
            PyObject *addr = PyTuple_GET_ITEM(t, 3);
            socklen_t alen;
            if (addr == last_addr && k > 0) { /* most datagrams of a round share a next hop */
                memcpy(&names[k], &names[k - 1], last_len);
                alen = last_len;
            }
            else {
                alen = parse_addr(addr, &names[k]);
                if (alen == 0) {
                    failed++;
                    last_addr = NULL;
                    continue;
                }
                last_addr = addr;
                last_len = alen;
            }
            iov[k][0].iov_base = PyBytes_AS_STRING(hdr);
            iov[k][0].iov_len = (size_t)PyBytes_GET_SIZE(hdr);
            iov[k][1].iov_base = (char *)buf.buf + off;
            iov[k][1].iov_len = (size_t)len;
            memset(&msgs[k].msg_hdr, 0, sizeof msgs[k].msg_hdr);
            msgs[k].msg_hdr.msg_name = &names[k];
            msgs[k].msg_hdr.msg_namelen = alen;
            msgs[k].msg_hdr.msg_iov = iov[k];
            msgs[k].msg_hdr.msg_iovlen = 2;
            msgs[k].msg_len = 0;
            k++;
        }
        /* Runs of datagrams to one destination with one length go out as one UDP GSO
         * send (see send_gso); the rest, and any run the kernel refuses that way, through
         * sendmmsg. */
        int start = 0, j = 0;
        while (j < k) {
            int r = gso_enabled ? gso_run(msgs, iov, j, k) : 1;
            if (r < 2) {
                j++;
                continue;
            }
            send_range(fd, msgs, start, j, &sent, &nbytes, &failed);
            if (!send_gso(fd, msgs, iov, j, r, &sent, &nbytes))
                send_range(fd, msgs, j, j + r, &sent, &nbytes, &failed);
            j += r;
            start = j;
        }
        send_range(fd, msgs, start, k, &sent, &nbytes, &failed);
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(KKK)", sent, nbytes, failed);
}

static PyObject *
set_gso(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = gso_enabled;
    gso_enabled = on;
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"set_gso", set_gso, METH_O,
     "set_gso(on) -> bool: use UDP GSO for runs of same-size datagrams to one address "
     "(default on); returns the previous setting"},
    {"recv_batch", (PyCFunction)(void (*)(void))recv_batch, METH_FASTCALL,
     "recv_batch(fd, buf, slot, headroom, capacity, max_msgs) -> list[(n, (host, port))]"},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL,
     "send_batch(fd, buf, [(header, offset, length, (host, port)), ...]) -> (sent, bytes, failed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "appliance.netio._mmsg",
    "Batched UDP receive/send (recvmmsg/sendmmsg) for the relay and the transceiver.", -1, methods,
};

PyMODINIT_FUNC
PyInit__mmsg(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "MAX_MSGS", MAX_MSGS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
