# C layout of a connection's stream budget (Cython pure-Python mode; h2_budget.py stays the source): the
# counts are C integers, all public; what the h2 shell calls per stream is cpdef.
cdef class StreamBudget:
    cdef public dict _opened_at
    cdef public Py_ssize_t active, closed, control_base, control_per_work, max_concurrent, max_per_read
    cdef public Py_ssize_t max_streams, new_in_read, premature, reset_min_streams, total, traffic_allowance
    cdef public double reset_window_s
    cpdef begin_read(self)
    cpdef opened(self, stream_id, now)
    cpdef done(self, stream_id)
    cpdef _judge(self)
    cpdef after_read(self, received, payload, control)
