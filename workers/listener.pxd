# C declarations for the compiled build's accept (Cython pure-Python mode; listener.py stays the source): one
# accept4(2) per connection, the socket non-blocking from birth, and an empty queue a return value, not an
# exception (listener.py, "if cython.compiled").
cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    struct sockaddr:
        unsigned short sa_family
    int accept4(int, sockaddr *, socklen_t *, int)
    int c_SOCK_NONBLOCK "SOCK_NONBLOCK"
    int c_SOCK_CLOEXEC "SOCK_CLOEXEC"
    int c_AF_INET "AF_INET"
    int c_AF_INET6 "AF_INET6"

cdef extern from "<netinet/in.h>" nogil:
    struct in_addr:
        pass
    struct in6_addr:
        pass
    struct sockaddr_in:
        unsigned short sin_port
        in_addr sin_addr
    struct sockaddr_in6:
        unsigned short sin6_port
        unsigned int sin6_flowinfo
        in6_addr sin6_addr
        unsigned int sin6_scope_id
    unsigned short ntohs(unsigned short)
    unsigned int ntohl(unsigned int)

cdef extern from "<arpa/inet.h>" nogil:
    const char *inet_ntop(int, const void *, char *, socklen_t)

cdef extern from "<errno.h>" nogil:
    int c_errno "errno"
    int c_EAGAIN "EAGAIN"
    int c_EINTR "EINTR"

from sentin8.holds cimport OpenConnections
from sentin8.shm.counters cimport WorkerCounters

# The accept loop's fields typed: per connection its count and its hold are C calls, not methods found by name.
cdef class Acceptor:
    cdef public object loop, enter, serve_http
    cdef public WorkerCounters counters
    cdef public OpenConnections connections
    cdef public Py_ssize_t worker
    cdef public double _last_warning

cdef object _accept4(int listener_fd)
cdef str _ipv4_text(const unsigned char *octets)
