# C layout of a connection's unread-bytes watch (Cython pure-Python mode; unread.py stays the source).
cdef class UnreadWatch:
    cdef public object _poller
    cpdef bint spoke(self)
