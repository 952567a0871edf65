# C layout of the one-timer deadline queue (Cython pure-Python mode; timer_queue.py stays the source): a
# connect's deadline and its cancel are C calls.
cdef class TimerEntry:
    cdef public object callback
    cdef public double when
    cpdef cancel(self)

cdef class TimerQueue:
    cdef public object loop, _timer, _queue
    cpdef at(self, double when, callback)
