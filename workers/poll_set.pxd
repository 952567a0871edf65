# C layout of the L4 sockets' epoll set (Cython pure-Python mode; poll_set.py stays the source): a pipe's and
# a connect's watch and drop are C calls.
from workers.timer_queue cimport TimerQueue

# epoll_ctl and epoll_wait as C calls in the compiled build (poll_set.py, "if cython.compiled")
cdef extern from "<sys/epoll.h>" nogil:
    ctypedef union epoll_data_t:
        int fd
    struct epoll_event:
        unsigned int events
        epoll_data_t data
    int epoll_ctl(int, int, int, epoll_event *)
    int epoll_wait(int, epoll_event *, int, int)

cdef extern from "<errno.h>" nogil:
    int c_errno "errno"
    int c_EINTR "EINTR"

cdef class PollSet:
    cdef public object loop, _epoll
    cdef public int _epfd
    cdef public TimerQueue timers
    cdef public dict _watched, _events
    cpdef watch(self, int fd, long events, handler)
    cpdef drop(self, int fd)
    cpdef forget(self, int fd)
    cpdef _ctl(self, int op, int fd, unsigned int events)
