# C layout of the L4 sockets' epoll set (Cython pure-Python mode; poll_set.py stays the source): a pipe's and
# a connect's watch and drop are C calls.
from workers.timer_queue cimport TimerQueue

cdef class PollSet:
    cdef public object loop, _epoll
    cdef public TimerQueue timers
    cdef public dict _watched, _events
    cpdef watch(self, int fd, long events, handler)
    cpdef drop(self, int fd)
    cpdef forget(self, int fd)
